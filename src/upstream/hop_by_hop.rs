//! Which of a message's headers belong to one connection and never travel on, and which carry
//! a client's credentials.

use http::{HeaderMap, HeaderName};

/// Headers that describe one connection, not the message; never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// Headers that carry the client's credentials.
pub static CREDENTIAL_HEADERS: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-api-key"),
];

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The map's names are read once and only those present are removed: a removal hashes and
    // probes the map even for an absent name. What `Connection` lists is kept as text and
    // matched ignoring case (a map's names are lowercase), not parsed into header names, which
    // copies each; names removed anyway (the usual `keep-alive`) need no matching at all.
    let mut listed: Vec<&str> = Vec::new();
    for value in headers.get_all(http::header::CONNECTION) {
        let Ok(value) = value.to_str() else { continue };
        for name in value.split(',').map(str::trim) {
            if !HOP_BY_HOP
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h.as_str()))
            {
                listed.push(name);
            }
        }
    }
    let present: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            HOP_BY_HOP.contains(name)
                || listed.iter().any(|l| l.eq_ignore_ascii_case(name.as_str()))
        })
        .cloned()
        .collect();
    for name in present {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.insert("x-request-id", HeaderValue::from_static("abc"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("x-request-id"));

        // Names listed in any of several `Connection` headers, in any case and spacing.
        let mut headers = HeaderMap::new();
        headers.append("connection", HeaderValue::from_static("X-Private ,close"));
        headers.append("connection", HeaderValue::from_static(" x-Other"));
        headers.append("x-private", HeaderValue::from_static("1"));
        headers.append("x-private", HeaderValue::from_static("2"));
        headers.insert("x-other", HeaderValue::from_static("1"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        // `close` is an option, and a field of that name goes too (RFC 9110, 7.6.1).
        headers.insert("close", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn every_hop_by_hop_header_is_removed_with_its_repeats() {
        let mut headers = HeaderMap::new();
        for name in &HOP_BY_HOP {
            headers.append(name, HeaderValue::from_static("1"));
            headers.append(name, HeaderValue::from_static("2"));
        }
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-request-id", HeaderValue::from_static("abc"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("x-request-id"));

        let mut none = HeaderMap::new();
        none.insert("content-type", HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut none);
        assert_eq!(none.len(), 1);
    }
}
