//! Which response headers are stored for replay.
//!
//! An allow-list, not a deny-list: a header nobody thought about is not replayed. Some
//! headers can never be allowed: `Set-Cookie` (a replay must not mint a session) and the
//! hop-by-hop headers, which describe one connection, not the response.

use bytes::Bytes;
use http::{HeaderMap, HeaderName};

pub(crate) const DEFAULT_STORED_HEADERS: &[&str] = &[
    "content-type",
    "content-language",
    "content-location",
    "content-disposition",
    "location",
    "etag",
    "last-modified",
    "cache-control",
    "expires",
    "vary",
    "link",
    "retry-after",
];

pub(crate) const NEVER_STORED: &[&str] = &[
    "set-cookie",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "operation-id",
    "idempotent-replayed",
];

pub(crate) fn select(headers: &HeaderMap, allowed: &[HeaderName]) -> Vec<(String, Bytes)> {
    let mut kept = Vec::new();
    for name in allowed {
        for value in headers.get_all(name) {
            kept.push((
                name.as_str().to_owned(),
                Bytes::copy_from_slice(value.as_bytes()),
            ));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn only_allowed_headers_are_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("set-cookie", HeaderValue::from_static("s=1"));
        headers.insert("connection", HeaderValue::from_static("close"));
        headers.append("link", HeaderValue::from_static("<a>"));
        headers.append("link", HeaderValue::from_static("<b>"));
        let allowed: Vec<HeaderName> = DEFAULT_STORED_HEADERS
            .iter()
            .map(|h| HeaderName::from_static(h))
            .collect();
        let kept = select(&headers, &allowed);
        let names: Vec<_> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "link", "link"]);
        for never in NEVER_STORED {
            assert!(!DEFAULT_STORED_HEADERS.contains(never));
        }
    }
}
