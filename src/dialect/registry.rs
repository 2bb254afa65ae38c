//! The dialects this proxy serves, one line each. The dialect battery (`tests/dialects.rs`) runs
//! over this list and fails for a dialect without its fixture; the HTTP routes
//! (`http/routes.rs`) still name each dialect they serve.

use super::anthropic::Messages;
use super::chat::Chat;
use super::responses::Responses;
use super::Dialect;

/// Every registered dialect.
pub const DIALECTS: [&dyn Dialect; 3] = [&Chat, &Messages, &Responses];
