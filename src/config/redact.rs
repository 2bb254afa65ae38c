//! URLs as they may be shown or logged: credentials and secret query values hidden.

/// Query parameters whose values are shown: they choose an API version, they grant nothing.
const HARMLESS_QUERY_PARAMETERS: &[&str] = &["api-version"];

/// A URL (an upstream, a store) as it may be shown or logged: user and password hidden
/// (`redis://user:pw@host` becomes `redis://redacted@host`), and every query value but an
/// API version (`?api-key=…`, `?key=…`, a signature) replaced by `redacted`. Anything that is
/// not a URL with a host (a file path, `memory`) is returned unchanged.
pub fn redact_url(spec: &str) -> String {
    let Ok(mut url) = url::Url::parse(spec) else {
        return spec.to_string();
    };
    // Nothing to hide: shown as written (a parsed URL would gain a `/` after a bare host).
    if !url.has_host()
        || (url.username().is_empty() && url.password().is_none() && url.query().is_none())
    {
        return spec.to_string();
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Setting user info fails only for URLs that cannot have it; those have none to hide.
        let _ = url.set_password(None);
        let _ = url.set_username("redacted");
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let shown = if HARMLESS_QUERY_PARAMETERS.contains(&name.as_ref()) {
                    value.into_owned()
                } else {
                    "redacted".to_string()
                };
                (name.into_owned(), shown)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}
