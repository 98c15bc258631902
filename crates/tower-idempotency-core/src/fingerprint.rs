//! Request fingerprints: a digest of what a request *means*.
//!
//! Algorithm `v1` digests, in this order and each length-prefixed (so no two inputs share
//! an encoding): the version tag, the method, the route template, the scope, the canonical
//! query, every allow-listed header (lowercase name, trimmed value, sorted), and the body
//! (empty; JSON in RFC 8785 canonical form; or raw bytes with their content type). The
//! digest is SHA-256 (`sha256:<hex>`) or, with a server secret, HMAC-SHA256
//! (`hmac-sha256:<hex>`). `docs/fingerprint.md` documents the algorithm for clients.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::canonical::JsonDocument;

/// The digest of a request's meaning, `sha256:<hex>` or `hmac-sha256:<hex>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(Arc<str>);

impl Fingerprint {
    /// `prefix` then the lowercase hex of `digest` (a SHA-256 digest: 32 bytes), written
    /// into its shared string with one allocation.
    pub(crate) fn of_digest(prefix: &str, digest: &[u8]) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        // The longest prefix is `hmac-sha256:` (12 bytes); the digest takes 64.
        let mut text = [0u8; 96];
        let hex_len = digest.len() * 2;
        let len = prefix.len() + hex_len;
        if len > text.len() {
            return Self(format!("{prefix}{}", hex(digest)).into());
        }
        text[..prefix.len()].copy_from_slice(prefix.as_bytes());
        for (i, b) in digest.iter().enumerate() {
            text[prefix.len() + 2 * i] = DIGITS[usize::from(b >> 4)];
            text[prefix.len() + 2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
        match std::str::from_utf8(&text[..len]) {
            Ok(text) => Self(Arc::from(text)),
            // ASCII prefix and digits only.
            Err(_) => Self(format!("{prefix}{}", hex(digest)).into()),
        }
    }

    /// Wraps a stored fingerprint string (for stores reading records back).
    pub fn from_stored(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The fingerprint as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Fingerprint").field(&&*self.0).finish()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A server secret for HMAC-SHA256 fingerprints. Its `Debug` output hides the bytes.
#[derive(Clone)]
pub struct FingerprintKey(Arc<[u8]>);

impl FingerprintKey {
    /// Wraps the secret. Use at least 32 random bytes.
    pub fn new(secret: impl AsRef<[u8]>) -> Self {
        Self(Arc::from(secret.as_ref()))
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(..)")
    }
}

/// The body part of a fingerprint input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FingerprintBody<'a> {
    /// No body.
    Empty,
    /// A JSON body in RFC 8785 canonical form (see [`canonicalize_json`](crate::canonicalize_json)).
    CanonicalJson(&'a [u8]),
    /// A parsed JSON body: its canonical form is written straight into the digest as it is
    /// produced, with no canonical text in between. The fingerprint is the one
    /// [`FingerprintBody::CanonicalJson`] gives for the document's
    /// [canonical form](JsonDocument::to_canonical).
    Json(&'a JsonDocument<'a>),
    /// Any other body: its content type (empty when absent) and raw bytes.
    Raw {
        /// The `Content-Type` value, lowercased, without parameters.
        content_type: &'a str,
        /// The body bytes.
        bytes: &'a [u8],
    },
}

/// Everything a fingerprint covers. Build one per request and pass it to
/// [`Fingerprinter::fingerprint`].
#[derive(Debug, Clone)]
pub struct FingerprintInput<'a> {
    /// HTTP method, uppercase.
    pub method: &'a str,
    /// Matched route template (`/v1/tickets/{id}`), or the path.
    pub route: &'a str,
    /// The scope.
    pub scope: &'a str,
    /// The query in canonical form (see [`canonical_query`]).
    pub query: &'a str,
    /// Allow-listed headers as (lowercase name, trimmed value), sorted.
    pub headers: &'a [(String, Vec<u8>)],
    /// The body.
    pub body: FingerprintBody<'a>,
}

/// Computes fingerprints: SHA-256, or HMAC-SHA256 when given a key.
///
/// A JSON body is best given parsed ([`FingerprintBody::Json`]): one parse validates it,
/// and its canonical form goes into the digest as it is written.
///
/// ```
/// use tower_idempotency_core::canonical::JsonDocument;
/// use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput, Fingerprinter};
///
/// let input = FingerprintInput {
///     method: "POST",
///     route: "/v1/tickets",
///     scope: "acct_1",
///     query: "",
///     headers: &[],
///     body: FingerprintBody::CanonicalJson(br#"{"title":"x"}"#),
/// };
/// let fp = Fingerprinter::sha256().fingerprint(&input);
/// assert!(fp.as_str().starts_with("sha256:"));
/// assert_eq!(fp, Fingerprinter::sha256().fingerprint(&input));
///
/// let document = JsonDocument::parse(br#"{ "title" : "x" }"#).unwrap();
/// let streamed = FingerprintInput { body: FingerprintBody::Json(&document), ..input };
/// assert_eq!(Fingerprinter::sha256().fingerprint(&streamed), fp);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Fingerprinter {
    key: Option<FingerprintKey>,
}

const VERSION: &[u8] = b"tower-idempotency/fingerprint/v1";

impl Fingerprinter {
    /// Plain SHA-256 fingerprints.
    pub fn sha256() -> Self {
        Self { key: None }
    }

    /// HMAC-SHA256 fingerprints under a server secret, for bodies that may carry
    /// low-entropy secrets (a digest of a PIN can be brute-forced; an HMAC cannot without
    /// the key).
    pub fn hmac_sha256(key: FingerprintKey) -> Self {
        Self { key: Some(key) }
    }

    /// Digests `input`.
    pub fn fingerprint(&self, input: &FingerprintInput<'_>) -> Fingerprint {
        match &self.key {
            None => {
                let mut hasher = Sha256::new();
                feed(&mut |bytes: &[u8]| hasher.update(bytes), input);
                Fingerprint::of_digest("sha256:", &hasher.finalize())
            }
            Some(key) => {
                // HMAC accepts keys of any length; new_from_slice cannot fail for it.
                let mut mac = match Hmac::<Sha256>::new_from_slice(&key.0) {
                    Ok(mac) => mac,
                    Err(_) => unreachable!("HMAC takes keys of any length"),
                };
                feed(&mut |bytes: &[u8]| mac.update(bytes), input);
                Fingerprint::of_digest("hmac-sha256:", &mac.finalize().into_bytes())
            }
        }
    }
}

fn feed<U: FnMut(&[u8])>(update: &mut U, input: &FingerprintInput<'_>) {
    let mut field = |tag: u8, bytes: &[u8]| {
        update(&[tag]);
        update(&(bytes.len() as u64).to_be_bytes());
        update(bytes);
    };
    field(b'V', VERSION);
    field(b'M', input.method.as_bytes());
    field(b'R', input.route.as_bytes());
    field(b'S', input.scope.as_bytes());
    field(b'Q', input.query.as_bytes());
    for (name, value) in input.headers {
        field(b'H', name.as_bytes());
        field(b'h', value);
    }
    match input.body {
        FingerprintBody::Empty => field(b'E', b""),
        FingerprintBody::CanonicalJson(bytes) => field(b'J', bytes),
        FingerprintBody::Json(document) => {
            // The field's encoding, with the canonical bytes produced into the digest.
            update(b"J");
            update(&(document.canonical_len() as u64).to_be_bytes());
            document.write_canonical(|bytes| update(bytes));
        }
        FingerprintBody::Raw {
            content_type,
            bytes,
        } => {
            field(b'C', content_type.as_bytes());
            field(b'B', bytes);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// The canonical form of a query string, as `application/x-www-form-urlencoded` pairs (what
/// axum's `Query` and `serde_urlencoded` hand a handler): pairs split on `&`, each on its
/// first `=`, `+` read as a space and `%XX` decoded **to bytes** (invalid UTF-8 is kept
/// exactly, never replaced); then ordered by name (bytes), keeping the request's order of
/// the values of one name, and re-encoded.
///
/// Two queries share a canonical form exactly when they give a handler the same list of
/// decoded pairs up to the order of *different* names: `%41` and `A`, `+` and `%20`, `a` and
/// `a=`, `%7e` and `%7E` are the same; `%FF` and `%FE`, `+` and `%2B`, `a=1&a=2` and
/// `a=2&a=1` (a map keeps the last value), `a=1&=` and `a=1`, `;` and `&` are not. Empty
/// pieces between `&`s are not pairs and are dropped.
///
/// ```
/// use tower_idempotency_core::fingerprint::canonical_query;
///
/// assert_eq!(canonical_query("b=2&a=%41&a=1"), canonical_query("a=A&a=1&b=2"));
/// assert_ne!(canonical_query("a=1&a=2"), canonical_query("a=2&a=1"));
/// assert_ne!(canonical_query("x=%FF"), canonical_query("x=%FE"));
/// assert_eq!(canonical_query(""), "");
/// ```
pub fn canonical_query(query: &str) -> String {
    let mut pairs = decoded_pairs(query);
    // Stable: the values of one name keep their order (a handler can see it).
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(query.len());
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.extend(form_urlencoded::byte_serialize(name));
        out.push('=');
        out.extend(form_urlencoded::byte_serialize(value));
    }
    out
}

/// A query's `application/x-www-form-urlencoded` pairs, decoded to their exact bytes: split
/// on `&` (empty pieces are not pairs), each on its first `=` (none: an empty value).
fn decoded_pairs(query: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    query
        .as_bytes()
        .split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| match piece.iter().position(|&b| b == b'=') {
            Some(at) => (form_decode(&piece[..at]), form_decode(&piece[at + 1..])),
            None => (form_decode(piece), Vec::new()),
        })
        .collect()
}

/// One name or value decoded to bytes: `+` is a space, `%XX` (either case) is that byte,
/// and a `%` not followed by two hex digits stays literal (as `form_urlencoded::parse`
/// does, without its lossy step to text).
fn form_decode(input: &[u8]) -> Vec<u8> {
    let spaced: Vec<u8> = input
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_text_is_the_prefix_then_lowercase_hex() {
        let digest: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37)).collect();
        for prefix in ["sha256:", "hmac-sha256:"] {
            let text = Fingerprint::of_digest(prefix, &digest);
            assert_eq!(text.as_str(), format!("{prefix}{}", hex(&digest)));
        }
        // Longer than the buffer: still right.
        let long = [0xabu8; 64];
        let text = Fingerprint::of_digest("sha512:", &long);
        assert_eq!(text.as_str(), format!("sha512:{}", "ab".repeat(64)));
    }

    fn input<'a>(body: FingerprintBody<'a>) -> FingerprintInput<'a> {
        FingerprintInput {
            method: "POST",
            route: "/v1/x",
            scope: "a",
            query: "",
            headers: &[],
            body,
        }
    }

    #[test]
    fn fields_are_not_ambiguous() {
        let f = Fingerprinter::sha256();
        let a = FingerprintInput {
            route: "/v1/xa",
            scope: "",
            ..input(FingerprintBody::Empty)
        };
        let b = FingerprintInput {
            route: "/v1/x",
            scope: "aa",
            ..input(FingerprintBody::Empty)
        };
        assert_ne!(f.fingerprint(&a), f.fingerprint(&b));
        let raw = input(FingerprintBody::Raw {
            content_type: "",
            bytes: b"{}",
        });
        let json = input(FingerprintBody::CanonicalJson(b"{}"));
        assert_ne!(f.fingerprint(&raw), f.fingerprint(&json));
    }

    #[test]
    fn hmac_differs_by_key_and_from_plain() {
        let i = input(FingerprintBody::Empty);
        let plain = Fingerprinter::sha256().fingerprint(&i);
        let k1 = Fingerprinter::hmac_sha256(FingerprintKey::new("one")).fingerprint(&i);
        let k2 = Fingerprinter::hmac_sha256(FingerprintKey::new("two")).fingerprint(&i);
        assert!(k1.as_str().starts_with("hmac-sha256:"));
        assert_eq!(k1.as_str().len(), "hmac-sha256:".len() + 64);
        assert_ne!(k1, k2);
        assert_ne!(plain.as_str()[7..], k1.as_str()[12..]);
        assert!(!format!("{:?}", FingerprintKey::new("one")).contains("one"));
    }

    /// Vectors computed outside this crate (Python's `hashlib`/`hmac`, following
    /// `docs/fingerprint.md` to the letter): they pin the `v1` encoding and the document
    /// together. Changing either would turn every stored key into a mismatch.
    #[test]
    fn known_vectors_match_the_documented_encoding() {
        let json = input(FingerprintBody::CanonicalJson(b"{\"a\":1}"));
        assert_eq!(
            Fingerprinter::sha256().fingerprint(&json).as_str(),
            "sha256:669e4f4cbfeeed12d314efa72dad48c8add6640dbe22c7f440cbc8fa8ae5feb6"
        );
        assert_eq!(
            Fingerprinter::hmac_sha256(FingerprintKey::new("server-secret"))
                .fingerprint(&json)
                .as_str(),
            "hmac-sha256:463cdcd958797c50ae07ce60b06bffcf6100bec465d8835020f72761c0d3861d"
        );
        assert_eq!(
            Fingerprinter::sha256()
                .fingerprint(&input(FingerprintBody::Empty))
                .as_str(),
            "sha256:a5eb6d7eac1338f9c52d4f7a4c5f0bdce5b3feedfbb9044140c842705ec93f9f"
        );
        let headers = [("x-tenant-region".to_owned(), b"eu".to_vec())];
        let everything = FingerprintInput {
            method: "POST",
            route: "/v1/payments",
            scope: "acct_1",
            query: "a=1&b=2",
            headers: &headers,
            body: FingerprintBody::Raw {
                content_type: "text/plain",
                bytes: b"hello",
            },
        };
        assert_eq!(
            Fingerprinter::sha256().fingerprint(&everything).as_str(),
            "sha256:a4855a50f6ec4b32942b3bec17a14a691d8141350f7392518a26b0226c930df5"
        );
    }

    /// A parsed body streamed into the digest gives the pinned `v1` answers above.
    #[test]
    fn streamed_json_matches_the_known_vectors() {
        let document = JsonDocument::parse(b"{ \"a\" : 1.0 }").unwrap();
        let json = input(FingerprintBody::Json(&document));
        assert_eq!(
            Fingerprinter::sha256().fingerprint(&json).as_str(),
            "sha256:669e4f4cbfeeed12d314efa72dad48c8add6640dbe22c7f440cbc8fa8ae5feb6"
        );
        assert_eq!(
            Fingerprinter::hmac_sha256(FingerprintKey::new("server-secret"))
                .fingerprint(&json)
                .as_str(),
            "hmac-sha256:463cdcd958797c50ae07ce60b06bffcf6100bec465d8835020f72761c0d3861d"
        );
    }

    /// The query's equivalence classes, for a handler reading the query as
    /// `application/x-www-form-urlencoded` pairs (axum's `Query`, `serde_urlencoded`).
    #[test]
    fn canonical_query_cases() {
        let same = [
            ("a=1&b=2", "b=2&a=1", "the order of different names"),
            ("q=hello+world", "q=hello%20world", "`+` is a space"),
            ("a=1&&b=2", "b=2&a=1", "empty pieces are not pairs"),
            ("&a=1&", "a=1", "empty pieces at the ends"),
            ("", "&&", "no pairs"),
            ("x=%7e", "x=~", "percent-encoding an unreserved byte"),
            ("x=%7e", "x=%7E", "hex digit case"),
            ("x=%c3%a9", "x=%C3%A9", "hex digit case in UTF-8"),
            ("%61=1", "a=1", "an encoded name"),
            ("a", "a=", "a name without `=` has an empty value"),
            ("x=%zz", "x=%25zz", "an invalid escape stays literal"),
            ("x=%", "x=%25", "a trailing `%` stays literal"),
            ("x=a=b", "x=a%3Db", "only the first `=` splits"),
            (
                "b=2&a=%41&a=1",
                "a=A&a=1&b=2",
                "names sorted, values kept in order",
            ),
        ];
        for (a, b, why) in same {
            assert_eq!(canonical_query(a), canonical_query(b), "{a} vs {b}: {why}");
        }
        let different = [
            ("x=%FF", "x=%FE", "invalid UTF-8 is kept exactly"),
            ("x=%FF", "x=%EF%BF%BD", "invalid UTF-8 is not U+FFFD"),
            ("%FF=1", "%FE=1", "invalid UTF-8 in a name"),
            ("x=%C3%A9", "x=e%CC%81", "no Unicode normalization"),
            ("q=a+b", "q=a%2Bb", "`+` is a space, `%2B` a plus"),
            ("a=1&a=2", "a=2&a=1", "the order of one name's values"),
            ("a=1&a=2", "a=1", "a repeated name"),
            ("a=1&a=1", "a=1", "a repeated pair"),
            ("a=1;b=2", "a=1&b=2", "`;` does not separate pairs"),
            (
                "a=1&=",
                "a=1",
                "an empty name with an empty value is a pair",
            ),
            ("=", "", "an empty pair is a pair"),
            ("x=%00", "x=", "NUL is a byte"),
            ("x=%00", "x", "NUL is a byte"),
            ("a%3Db=c", "a=b%3Dc", "an encoded `=` in a name"),
            ("a%26b=c", "a&b=c", "an encoded `&` in a name"),
            ("x=a%26b", "x=a&b", "an encoded `&` in a value"),
            ("A=1", "a=1", "names are case-sensitive"),
            ("a=1", "a=2", "values"),
            ("a=", "a=%20", "an empty value and a space"),
        ];
        for (a, b, why) in different {
            assert_ne!(canonical_query(a), canonical_query(b), "{a} vs {b}: {why}");
        }
    }

    /// Queries the `v1` canonicalizer always told apart keep their canonical form (and so
    /// their fingerprints); only the colliding ones above changed.
    #[test]
    fn canonical_forms_of_valid_queries_are_stable() {
        for (query, canonical) in [
            ("", ""),
            ("b=2&a=1", "a=1&b=2"),
            ("q=hello%20world&z=%7e", "q=hello+world&z=%7E"),
            ("x=%C3%A9&a", "a=&x=%C3%A9"),
            ("tag=a&tag=b", "tag=a&tag=b"),
            ("a*b-c._=~!", "a*b-c._=%7E%21"),
        ] {
            assert_eq!(canonical_query(query), canonical, "{query}");
        }
    }

    /// The `v1` canonicalizer before invalid UTF-8, repeated names and empty pairs were
    /// told apart.
    fn lossy_canonical_query(query: &str) -> String {
        let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .filter(|(name, value)| !(name.is_empty() && value.is_empty()))
            .collect();
        pairs.sort();
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    }

    proptest::proptest! {
        /// Every query the earlier canonicalizer did not collapse (valid UTF-8, no empty
        /// pair, one name's values already in order) keeps its canonical form.
        #[test]
        fn only_queries_that_collided_change_their_canonical_form(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "a", "b", "=", "&", "+", "%20", "%2B", "%41", "%7e", "%C3%A9", "%FF",
                    "%", "%zz", ";", "%00", "%3D", "%26", "~", "*",
                ]),
                0..12,
            )
        ) {
            let query: String = pieces.concat();
            let new = canonical_query(&query);
            let pairs = decoded_pairs(&query);
            let valid = pairs
                .iter()
                .all(|(n, v)| std::str::from_utf8(n).is_ok() && std::str::from_utf8(v).is_ok());
            let no_empty_pair = pairs.iter().all(|(n, v)| !(n.is_empty() && v.is_empty()));
            let in_order = pairs.iter().enumerate().all(|(i, (n, v))| {
                pairs[..i].iter().all(|(m, w)| m != n || w <= v)
            });
            if valid && no_empty_pair && in_order {
                proptest::prop_assert_eq!(new, lossy_canonical_query(&query), "{}", query);
            }
        }
    }
}
