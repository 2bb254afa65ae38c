//! The dialects this proxy serves, one line each. The HTTP layer builds its measured routes from
//! this list, and the dialect battery (`tests/dialects.rs`) runs over it.

use super::anthropic::Messages;
use super::chat::Chat;
use super::responses::Responses;
use super::Dialect;

/// Every registered dialect.
pub const DIALECTS: [&dyn Dialect; 3] = [&Chat, &Messages, &Responses];
