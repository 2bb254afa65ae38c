//! A record fitted beside the model's text within a summary's budget: the model writes at most
//! its allowance, the constraints take what they need up to their most, and the rest of the
//! record is rendered in what is left.

use crate::dialect::{MessageView, Role};
use crate::tokenizer::Encoding;

use super::{split, Record, CONSTRAINTS_MOST, FLOOR, HEADING, MODEL_LEAST, SHARE};

/// The longest answer the model may write within a summary budget of `budget` tokens.
pub fn model_allowance(budget: u64) -> u64 {
    budget * (100 - FLOOR) / 100
}

/// The summary to store: the model's text, then the record of `span` followed by the record of
/// the previous summary, in what the model's text left of `budget`.
pub fn attach(
    model_text: &str,
    span: &[(Role, MessageView)],
    previous: Option<&str>,
    encoding: Encoding,
    budget: u64,
) -> String {
    let room = RecordRoom {
        encoding,
        budget,
        share: SHARE,
    };
    attach_share(model_text, span, previous, room)
}

/// A stored summary fitted again into `budget` tokens, for a request with less room than it
/// was written for: the model's text cut at a line end to its part ([`model_allowance`]), the
/// record rendered again in what that leaves, its sections by their shares as always.
pub fn refit(summary: &str, encoding: Encoding, budget: u64) -> String {
    if encoding.count(summary) <= budget {
        return summary.to_string();
    }
    let (model_text, _) = split(summary);
    let allowance = model_allowance(budget);
    let mut model_text = cut_to(model_text, encoding, allowance);
    // A first line longer than the model's part (cut_to keeps it whole) goes: the record is
    // what no model may lose.
    if encoding.count(&model_text) > allowance {
        model_text = "".into();
    }
    let room = RecordRoom {
        encoding,
        budget,
        share: SHARE,
    };
    attach_share(&model_text, &[], Some(summary), room)
        .trim_start()
        .to_string()
}

/// How much of a summary's budget the record may take.
#[derive(Debug, Clone, Copy)]
pub struct RecordRoom {
    pub encoding: Encoding,
    /// The whole summary's budget, in tokens.
    pub budget: u64,
    /// The record's largest share of it, in percent.
    pub share: u64,
}

/// [`attach`] with the record taking at most `room.share` percent of the budget.
pub fn attach_share(
    model_text: &str,
    span: &[(Role, MessageView)],
    previous: Option<&str>,
    room: RecordRoom,
) -> String {
    let RecordRoom {
        encoding,
        budget,
        share,
    } = room;
    let older = previous
        .and_then(|p| split(p).1)
        .map(Record::parse)
        .unwrap_or_default();
    let record = Record::collect(span).then(older);
    let most = budget * share.min(100) / 100;
    // The model's prose yields first: where what it leaves cannot hold the constraints whole,
    // its text is cut from the end, down to its least.
    let constraints = record.constraints_cost(encoding);
    let model_text = if constraints == 0 {
        model_text.into()
    } else {
        let heading = encoding.count(HEADING) + 2;
        let needed = (heading + constraints * 100 / CONSTRAINTS_MOST).min(most);
        let model_room = budget
            .saturating_sub(needed)
            .max(budget * MODEL_LEAST / 100);
        cut_to(model_text, encoding, model_room)
    };
    let room = most.min(budget.saturating_sub(encoding.count(&model_text)));
    let record = record.render(encoding, room);
    if record.is_empty() {
        model_text.into_owned()
    } else {
        format!("{}\n\n{record}", model_text.trim_end())
    }
}

/// `text` in at most `tokens`: whole lines from its start, as many as fit, and at least the
/// first (a model's answer of one line is all it said).
fn cut_to(text: &str, encoding: Encoding, tokens: u64) -> std::borrow::Cow<'_, str> {
    if encoding.count(text) <= tokens {
        return text.into();
    }
    let ends: Vec<usize> = text.match_indices('\n').map(|(at, _)| at).collect();
    // The lines' token counts only grow with their number: the last end that fits, by halves.
    let fitting = ends.partition_point(|&at| encoding.count(&text[..at]) <= tokens);
    match fitting.checked_sub(1).or((!ends.is_empty()).then_some(0)) {
        Some(line) => text[..ends[line]].trim_end().to_string().into(),
        None => text.into(),
    }
}
