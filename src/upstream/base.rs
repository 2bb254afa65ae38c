//! A provider's base URL and the request URIs built on it: `{base}{path_and_query}`, never
//! outside the base's path.

use std::sync::Arc;

use http::{HeaderValue, Uri};
use url::Url;

use super::UpstreamError;

/// A base URL, parsed once.
#[derive(Clone)]
pub(super) struct Base {
    /// Without its trailing slash: paths are appended to it.
    url: Url,
    /// The same as text, when it has no query or fragment: plain paths are joined onto it
    /// without the URL library ([`Base::uri_for`]).
    text: Option<Arc<str>>,
    /// The `Host` header of every request to a plain-HTTP base ([`Base::host_header`]).
    host_header: Option<HeaderValue>,
}

impl Base {
    pub(super) fn parse(base: &str) -> Result<Base, UpstreamError> {
        let mut url = Url::parse(base)
            .map_err(|e| UpstreamError::Unreachable(format!("invalid upstream URL: {e}")))?;
        let trimmed = url.path().trim_end_matches('/').to_string();
        url.set_path(&trimmed);
        // Joining a path onto the text would put it after a query or fragment.
        let text = (url.query().is_none() && url.fragment().is_none())
            .then(|| url.as_str().trim_end_matches('/').into());
        let host_header = plain_http_host(&url);
        Ok(Base {
            url,
            text,
            host_header,
        })
    }

    /// The `Host` header a request to this base carries, made once, when the base is plain
    /// HTTP: the host, and the port unless it is the scheme's, as a client library writes it.
    /// Such a request goes out on the base's own HTTP/1.1 connections (`super::plain`), which
    /// write no `Host` of their own. Over TLS the header is left to the general client
    /// (`super::http_client`): an HTTP/2 connection carries the authority in `:authority`
    /// instead.
    pub(super) fn host_header(&self) -> Option<&HeaderValue> {
        self.host_header.as_ref()
    }

    /// `http://host:port` when the base is plain HTTP: where its connections go
    /// (`super::plain`).
    pub(super) fn plain_target(&self) -> Option<Uri> {
        self.host_header.as_ref()?;
        // An IPv6 host comes in brackets, as a URI writes it.
        let host = self.url.host_str()?;
        let port = self.url.port_or_known_default()?;
        Uri::try_from(format!("http://{host}:{port}")).ok()
    }

    /// The host the base URL names.
    pub(super) fn host(&self) -> &str {
        self.url.host_str().unwrap_or("")
    }

    /// The base URL's port, stated or the scheme's.
    pub(super) fn port(&self) -> Option<u16> {
        self.url.port_or_known_default()
    }

    /// The path `path_and_query` reaches on the provider (its base path joined on), without
    /// the query.
    pub(super) fn path_of(&self, path_and_query: &str) -> String {
        let path = path_and_query.split('?').next().unwrap_or("");
        format!("{}{path}", self.url.path().trim_end_matches('/'))
    }

    /// The request URI of `{base}{path_and_query}`. A path and query made only of letters,
    /// digits and `/-_~?=&` (every compacting route's) cannot leave the base path and reads
    /// the same before and after the URL library's normalisation: it is joined as text, which
    /// costs a fraction of a parse. Anything else goes through [`Base::url_for`].
    pub(super) fn uri_for(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        let plain = |b: &u8| {
            b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'~' | b'?' | b'=' | b'&')
        };
        if let Some(base) = &self.text {
            if path_and_query.starts_with('/') && path_and_query.as_bytes().iter().all(plain) {
                // Joined by hand: `format!` costs several times what the copy does.
                let mut joined = String::with_capacity(base.len() + path_and_query.len());
                joined.push_str(base);
                joined.push_str(path_and_query);
                if let Ok(uri) = Uri::try_from(joined) {
                    return Ok(uri);
                }
            }
        }
        let url = self.url_for(path_and_query)?;
        Uri::try_from(url.as_str())
            .map_err(|e| UpstreamError::Refused(format!("not a request URI: {e}")))
    }

    /// `{base}{path_and_query}`, e.g. `https://api.openai.com/v1` + `/models?x=1`; refused when
    /// the URL library's resolution of dot segments would take it out of the base path.
    fn url_for(&self, path_and_query: &str) -> Result<Url, UpstreamError> {
        let mut url = self.url.clone();
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        url.set_path(&format!(
            "{}{}",
            self.url.path().trim_end_matches('/'),
            path
        ));
        url.set_query(query);
        let base = self.url.path().trim_end_matches('/');
        let inside = url
            .path()
            .strip_prefix(base)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if !inside {
            return Err(UpstreamError::Refused(
                "the path leaves the upstream's base path".into(),
            ));
        }
        Ok(url)
    }
}

/// `host[:port]` of a plain-HTTP `url`, the port written only when it is not 80.
fn plain_http_host(url: &Url) -> Option<HeaderValue> {
    if url.scheme() != "http" {
        return None;
    }
    let host = url.host_str()?;
    let text = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    HeaderValue::try_from(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(base: &str, path: &str) -> String {
        Base::parse(base)
            .unwrap()
            .uri_for(path)
            .map(|u| u.to_string())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn a_plain_http_base_names_its_host_as_the_client_library_would() {
        let host = |base: &str| {
            Base::parse(base)
                .unwrap()
                .host_header()
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            host("http://127.0.0.1:8080/v1").as_deref(),
            Some("127.0.0.1:8080")
        );
        // The scheme's own port is left out, stated or not.
        assert_eq!(
            host("http://llm.internal/v1").as_deref(),
            Some("llm.internal")
        );
        assert_eq!(
            host("http://llm.internal:80/v1").as_deref(),
            Some("llm.internal")
        );
        assert_eq!(host("http://[::1]:9000").as_deref(), Some("[::1]:9000"));
        assert_eq!(host("http://user:pw@h:1/openai/").as_deref(), Some("h:1"));
        // Over TLS the connection may be HTTP/2, which names the host in `:authority`.
        assert_eq!(host("https://api.openai.com/v1"), None);
        assert_eq!(host("https://127.0.0.1:8443"), None);
    }

    #[test]
    fn a_plain_http_base_is_reached_at_its_host_and_port() {
        let target = |base: &str| {
            Base::parse(base)
                .unwrap()
                .plain_target()
                .map(|u| u.to_string())
        };
        assert_eq!(
            target("http://127.0.0.1:8080/v1").as_deref(),
            Some("http://127.0.0.1:8080/")
        );
        assert_eq!(
            target("http://llm.internal/v1").as_deref(),
            Some("http://llm.internal:80/")
        );
        assert_eq!(
            target("http://[::1]:9000").as_deref(),
            Some("http://[::1]:9000/")
        );
        assert_eq!(
            target("http://user:pw@h:1/openai/").as_deref(),
            Some("http://h:1/")
        );
        assert_eq!(target("https://api.openai.com/v1"), None);
    }

    #[test]
    fn a_path_joined_as_text_is_the_one_the_url_library_makes() {
        let paths = [
            "/chat/completions",
            "/v1/messages?beta=true",
            "/v1/messages/count_tokens",
            "/responses/input_tokens",
            "/models?limit=2&after=x-1",
        ];
        let bases = [
            "https://api.openai.com/v1",
            "https://api.anthropic.com/",
            "http://127.0.0.1:8080",
            "http://user@h:1/openai/deployments/x/",
        ];
        for base in bases {
            let upstream = Base::parse(base).unwrap();
            assert!(upstream.text.is_some(), "{base}");
            for path in paths {
                let library = upstream.url_for(path).unwrap();
                assert_eq!(
                    upstream.uri_for(path).unwrap().to_string(),
                    library.as_str(),
                    "{base} {path}"
                );
            }
        }
        // A base with a query is never joined as text: the request's query replaces it.
        let azure = Base::parse("https://h/openai?api-version=1").unwrap();
        assert!(azure.text.is_none());
        assert_eq!(
            azure.uri_for("/chat/completions").unwrap().to_string(),
            "https://h/openai/chat/completions"
        );
    }

    #[test]
    fn paths_are_appended_to_the_base() {
        assert_eq!(
            url("https://api.openai.com/v1", "/chat/completions"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            url("https://api.openai.com/v1/", "/models?limit=2"),
            "https://api.openai.com/v1/models?limit=2"
        );
        assert_eq!(
            url("http://127.0.0.1:8080", "/embeddings"),
            "http://127.0.0.1:8080/embeddings"
        );
        assert_eq!(
            url(
                "http://h/openai/deployments/x",
                "/chat/completions?api-version=1"
            ),
            "http://h/openai/deployments/x/chat/completions?api-version=1"
        );
    }

    #[test]
    fn urls_outside_the_base_path_are_refused() {
        for path in ["/../x", "/%2e%2e/x", "/a/../../x"] {
            assert!(
                url("http://h/v1/deployments/mine", path).starts_with("request refused"),
                "{path}"
            );
        }
        assert_eq!(url("http://h/v1", "/a/../models"), "http://h/v1/models");
    }
}
