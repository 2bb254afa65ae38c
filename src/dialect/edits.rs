//! Context edits in words every dialect shares: what a client asks the provider to clear from
//! its own history before the model reads it ([`ContextEdits`]), what an element holds that an
//! edit may clear ([`Clearable`]), what is to be cleared ([`Clearing`]) and what was
//! ([`AppliedEdit`]). A dialect reads its wire form into these (Anthropic's
//! `context_management.edits`) and writes a [`Clearing`] back into its elements; which elements
//! to clear is decided by the core (`compaction::clearing`), the same code for every dialect and
//! for the engine's own clearing. Part of the seam: it imports nothing of the crate.

use std::collections::BTreeSet;

/// When tool-use clearing starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearTrigger {
    /// When the prompt, as it would be sent, exceeds this many tokens.
    InputTokens(u64),
    /// When more than this many tool uses are left uncleared.
    ToolUses(u64),
}

/// Which tool inputs are cleared along with their results.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClearInputs {
    /// None: the call and its arguments stay.
    #[default]
    None,
    /// Every cleared tool use's input.
    All,
    /// The inputs of the tools named.
    Tools(BTreeSet<String>),
}

impl ClearInputs {
    /// Whether a cleared use of `tool` loses its input too.
    pub fn covers(&self, tool: &str) -> bool {
        match self {
            ClearInputs::None => false,
            ClearInputs::All => true,
            ClearInputs::Tools(names) => names.contains(tool),
        }
    }
}

/// Clearing old tool results (Anthropic's `clear_tool_uses_20250919`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearToolUses {
    pub trigger: ClearTrigger,
    /// The most recent tool uses never cleared.
    pub keep: u64,
    /// Clear only when at least this many tokens are freed at once.
    pub clear_at_least: u64,
    /// Tools whose uses are never cleared.
    pub exclude_tools: BTreeSet<String>,
    pub clear_inputs: ClearInputs,
}

/// Clearing the reasoning of older assistant turns (Anthropic's `clear_thinking_20251015`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearThinking {
    /// The most recent assistant turns whose thinking stays; `None`: all of them.
    pub keep_turns: Option<u64>,
}

/// The edits a request asks for, at most one of each kind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContextEdits {
    pub tool_uses: Option<ClearToolUses>,
    pub thinking: Option<ClearThinking>,
}

/// A tool call an element makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearableCall {
    pub id: String,
    pub tool: String,
    /// Tokens of its input (arguments).
    pub input_tokens: u64,
}

/// A tool result an element carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearableResult {
    /// The id of the call it answers.
    pub call_id: String,
    pub tokens: u64,
    pub is_error: bool,
}

/// What one element holds that an edit may clear.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Clearable {
    pub calls: Vec<ClearableCall>,
    pub results: Vec<ClearableResult>,
    /// Tokens of its reasoning blocks that may be removed (0 when the element is nothing but
    /// reasoning: it would be left empty).
    pub thinking_tokens: u64,
}

/// A tool result to replace by a stub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearedResult {
    pub call_id: String,
    /// The one line the model reads in its place.
    pub stub: String,
}

/// What to clear in a request, as its dialect writes it back into its elements.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Clearing {
    pub results: Vec<ClearedResult>,
    /// Calls whose input is emptied.
    pub inputs: BTreeSet<String>,
    /// Elements whose reasoning blocks are removed.
    pub thinking: BTreeSet<usize>,
}

impl Clearing {
    pub fn is_empty(&self) -> bool {
        self.results.is_empty() && self.inputs.is_empty() && self.thinking.is_empty()
    }
}

/// An edit that cleared something, as the answer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppliedEdit {
    ToolUses {
        cleared_tool_uses: u64,
        cleared_input_tokens: u64,
    },
    Thinking {
        cleared_thinking_turns: u64,
        cleared_input_tokens: u64,
    },
}

impl AppliedEdit {
    /// Tokens the edit removed from the prompt.
    pub fn cleared_input_tokens(&self) -> u64 {
        match *self {
            AppliedEdit::ToolUses {
                cleared_input_tokens,
                ..
            }
            | AppliedEdit::Thinking {
                cleared_input_tokens,
                ..
            } => cleared_input_tokens,
        }
    }
}
