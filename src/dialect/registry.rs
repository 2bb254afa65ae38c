//! The dialects this proxy serves, one line each. The dialect battery (`tests/dialects.rs`) runs
//! over this list and fails for a dialect without its fixture; the HTTP routes
//! (`http/routes.rs`) still name each dialect they serve.

use super::anthropic::Messages;
use super::chat::Chat;
use super::responses::Responses;
use super::seen::SeenCounts;
use super::Dialect;

/// Every registered dialect.
pub const DIALECTS: [&dyn Dialect; 3] = [&Chat, &Messages, &Responses];

/// Each registered dialect's elements seen before ([`super::seen`]), by the dialect's name.
pub fn seen_counts() -> [(&'static str, SeenCounts); 3] {
    [
        (Chat.name(), super::chat::request::seen_counts()),
        (Messages.name(), super::anthropic::parse::seen_counts()),
        (Responses.name(), super::responses::request::seen_counts()),
    ]
}
