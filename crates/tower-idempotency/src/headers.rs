//! Which response headers are stored for replay.
//!
//! An allow-list, not a deny-list: a header nobody thought about is not replayed. Some
//! headers can never be allowed: `Set-Cookie` (a replay must not mint a session) and the
//! hop-by-hop headers, which describe one connection, not the response.

use http::{HeaderMap, HeaderName, HeaderValue};

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
    "idempotency-sealed-with",
];

/// The allowed headers of a response, in allow-list order (values of one name in their
/// order).
pub(crate) fn select(headers: &HeaderMap, allowed: &[HeaderName]) -> HeaderMap {
    // A response carries a handful of headers and the allow-list about a dozen names:
    // comparing each of the response's names with the list is cheaper than hashing every
    // allowed name for a lookup, and the sort is stable, so the values of one name keep
    // their order.
    let mut kept: Vec<(usize, &HeaderName, &HeaderValue)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let rank = allowed.iter().position(|a| a == name)?;
            Some((rank, name, value))
        })
        .collect();
    kept.sort_by_key(|(rank, _, _)| *rank);
    // The values are shared, not copied: a `HeaderValue` is `Bytes`.
    let mut map = HeaderMap::with_capacity(kept.len());
    for (_, name, value) in kept {
        map.append(name.clone(), value.clone());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_headers_are_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("set-cookie", HeaderValue::from_static("s=1"));
        headers.insert("connection", HeaderValue::from_static("close"));
        headers.append("link", HeaderValue::from_static("<a>"));
        headers.append("link", HeaderValue::from_static("<b>"));
        headers.insert("etag", HeaderValue::from_static("\"v1\""));
        let allowed: Vec<HeaderName> = DEFAULT_STORED_HEADERS
            .iter()
            .map(|h| HeaderName::from_static(h))
            .collect();
        let kept = select(&headers, &allowed);
        let names: Vec<_> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "etag", "link", "link"]);
        let links: Vec<_> = kept
            .iter()
            .filter(|(n, _)| *n == "link")
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        assert_eq!(links, ["<a>", "<b>"]);
        for never in NEVER_STORED {
            assert!(!DEFAULT_STORED_HEADERS.contains(never));
        }
    }
}
