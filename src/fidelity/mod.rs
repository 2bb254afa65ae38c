//! Summary fidelity: how much of what the next turn needs a summary keeps.
//!
//! The `fidelity` benchmark (`scripts/fidelity`, driver in `examples/fidelity.rs`) compacts real
//! conversations with a real summarizer and scores the summary against the span it replaced,
//! and against the summary the conversation's own agent wrote at that point when there is one.
//! This module holds the pure parts, so the metric is unit-tested and stated once:
//! [`span`] chooses the messages a compaction summarizes (optionally capped to the newest
//! tokens), [`score`] extracts what a summary must keep from that span and measures how much of
//! it a summary holds. [`score::RULES`] states the extraction rules in words for the results file.

pub mod score;
pub mod span;
