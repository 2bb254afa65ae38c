//! The vocabulary every dialect speaks to the core: who wrote an element ([`Role`]), what it
//! says as text ([`MessageView`], [`ToolCall`]), what a provider reports it used ([`Usage`]),
//! and why a body or a summary answer cannot be used ([`RequestError`], [`AnswerError`]). Part
//! of the seam: it imports nothing of the crate but the seam's [`super::media`].

/// What a provider reports of one answer, in a whole JSON answer or in one stream event: each
/// figure only when it states it. A stream reports in parts (Messages: the prompt in
/// `message_start`, the output in `message_delta`), merged with [`Usage::merge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The whole prompt, the parts read from and written to the provider's cache included.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The part of the prompt read from the provider's cache.
    pub cache_read_tokens: Option<u64>,
    /// The part of the prompt written to the provider's cache.
    pub cache_creation_tokens: Option<u64>,
    /// The model that answered, as the provider names it.
    pub model: Option<String>,
}

impl Usage {
    /// Takes every figure `later` states over this one's (a stream's later events report
    /// running totals).
    pub fn merge(&mut self, later: Usage) {
        let Usage {
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_creation_tokens,
            model,
        } = later;
        self.input_tokens = input_tokens.or(self.input_tokens);
        self.output_tokens = output_tokens.or(self.output_tokens);
        self.cache_read_tokens = cache_read_tokens.or(self.cache_read_tokens);
        self.cache_creation_tokens = cache_creation_tokens.or(self.cache_creation_tokens);
        if model.is_some() {
            self.model = model;
        }
    }
}

/// Why a body is not a request the proxy can handle, in any dialect; each becomes a 400 in
/// the client's own error shape.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("request body is not valid JSON: {message} at line {line} column {column}")]
    Json {
        message: String,
        line: usize,
        column: usize,
    },
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("missing required parameter: '{0}'")]
    Missing(&'static str),
    #[error("invalid type for '{field}': expected {expected}")]
    Type {
        field: &'static str,
        expected: &'static str,
    },
    #[error("invalid message at messages[{index}]: {reason}")]
    Message { index: usize, reason: String },
    #[error("invalid item at input[{index}]: {reason}")]
    Item { index: usize, reason: String },
    /// A context edit the proxy cannot serve as asked (`param` names where it stands).
    #[error("{param}: {reason}")]
    ContextEdit { param: String, reason: String },
}

impl RequestError {
    /// The request parameter the error is about, for the OpenAI error's `param`.
    pub fn param(&self) -> Option<String> {
        match self {
            RequestError::Missing(f) => Some((*f).to_string()),
            RequestError::Type { field, .. } => Some((*field).to_string()),
            RequestError::Message { index, .. } => Some(format!("messages[{index}]")),
            RequestError::Item { index, .. } => Some(format!("input[{index}]")),
            RequestError::ContextEdit { param, .. } => Some(param.clone()),
            _ => None,
        }
    }
}

impl RequestError {
    /// A body that is not JSON, with where it stops being JSON.
    pub fn from_json(e: serde_json::Error) -> RequestError {
        let message = e.to_string();
        // serde_json appends " at line L column C"; the position is reported separately.
        let message = match message.rfind(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        RequestError::Json {
            message,
            line: e.line(),
            column: e.column(),
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// Legacy `function` results and anything unknown: treated like a tool result.
    Other,
}

impl Role {
    /// A chat role name; an unknown one is [`Role::Other`].
    pub fn parse(s: &str) -> Role {
        match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            _ => Role::Other,
        }
    }

    /// System and developer messages are instructions: never summarized, never moved.
    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other => "other",
        }
    }
}

/// A tool call made by an assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A message's content as compaction reads it.
#[derive(Debug, Clone, Default)]
pub struct MessageView {
    /// Text of the content (string content, or the text parts joined by newlines).
    pub text: String,
    /// The media parts (images, documents, audio, files), at any depth, in order.
    pub media: Vec<super::media::Media>,
    pub name: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

/// Why a summary answer cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AnswerError {
    #[error("the summary answer is not in the expected shape")]
    Malformed,
    #[error("summarizer returned an empty summary")]
    Empty,
    #[error("summary was cut off by the token limit")]
    Truncated,
}
