//! Turning a buffered request into a [`Fingerprint`]: method, route template, scope,
//! canonical query, allow-listed headers and the body in canonical form (RFC 8785 for
//! JSON, raw bytes plus content type otherwise). See `docs/fingerprint.md`.
//!
//! A JSON body is parsed once ([`JsonDocument`]): that parse validates it, its canonical
//! form is written straight into the digest, and a route that keeps the command (an
//! approval policy) converts the same tree into a `Value`. A route with a normalizer
//! normalizes that `Value` and fingerprints what the normalizer left.

use bytes::Bytes;
use http::{HeaderName, header, request::Parts};
use tower_idempotency_core::canonical::{JsonDocument, canonicalize_value};
use tower_idempotency_core::fingerprint::{FingerprintBody, FingerprintInput, canonical_query};
use tower_idempotency_core::{Fingerprint, Fingerprinter, Scope};

use crate::policy::{BuiltCommand, CommandSource, RoutePolicy};
use crate::problem::Rejection;

/// Whether a media type is JSON: `application/json` or any `+json` suffix.
pub(crate) fn is_json(essence: &str) -> bool {
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .len()
            .checked_sub(5)
            .and_then(|at| essence.get(at..))
            .is_some_and(|suffix| suffix.eq_ignore_ascii_case("+json"))
}

/// The media type without parameters, as sent (JSON bodies, the common case, never need
/// it lowercased; raw bodies lowercase it for the fingerprint).
pub(crate) fn content_type_essence(parts: &Parts) -> &str {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map_or("", |v| v.split(';').next().unwrap_or("").trim())
}

/// A request's fingerprint and the validated command it was taken of: on a route with a
/// normalizer, the normalized JSON body (handed to the handler, see
/// [`command`](crate::command)); on a route with an approval policy, the command the policy
/// decides on (`null` for a body that is not JSON); on a route with a command type, the
/// typed command built from it.
pub(crate) struct Fingerprinted {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) command: Option<serde_json::Value>,
    pub(crate) typed: Option<BuiltCommand>,
}

/// The fingerprint of a request. `key_header` is the layer's key header: never part of
/// the fingerprint, whatever the route allows (a policy refuses the default name and
/// credentials when it is built, but cannot know a name the layer was given).
pub(crate) fn fingerprint(
    fingerprinter: &Fingerprinter,
    key_header: &HeaderName,
    policy: &RoutePolicy,
    parts: &Parts,
    route: &str,
    scope: &Scope,
    body: &Bytes,
) -> Result<Fingerprinted, Rejection> {
    let essence = content_type_essence(parts);
    let canonical;
    let lowercase;
    // The parsed body of a route without a normalizer, streamed into the digest.
    let mut document = None;
    // A route that decides on the command keeps it (and one with a normalizer, below, for
    // its handler).
    let wants_command = policy.approval.is_some();
    let mut command = wants_command.then_some(serde_json::Value::Null);
    let mut typed = None;
    // A route with a normalizer takes JSON commands only: any other body would bypass the
    // validation and be stored under the key as whatever the handler answers to it.
    if policy.normalizer.is_some() && !is_json(essence) {
        return Err(Rejection::UnsupportedMediaType);
    }
    let body = if body.is_empty() && policy.normalizer.is_none() {
        FingerprintBody::Empty
    } else if is_json(essence) {
        match &policy.normalizer {
            None => FingerprintBody::Json(
                document.insert(JsonDocument::parse(body).map_err(Rejection::InvalidJson)?),
            ),
            Some(normalize) => {
                let mut value = JsonDocument::parse(body)
                    .map_err(Rejection::InvalidJson)?
                    .into_value();
                normalize(&mut value).map_err(Rejection::InvalidCommand)?;
                canonical = canonicalize_value(&value);
                match &policy.command {
                    // The command the handler executes is built here, before anything is
                    // reserved: a body the type refuses is a 422 that stores nothing.
                    Some(command_type) if wants_command => {
                        typed = Some(
                            (command_type.build)(CommandSource::Borrowed(&value))
                                .map_err(Rejection::InvalidCommand)?,
                        );
                        command = Some(value);
                    }
                    Some(command_type) => {
                        typed = Some(
                            (command_type.build)(CommandSource::Owned(value))
                                .map_err(Rejection::InvalidCommand)?,
                        );
                    }
                    None => command = Some(value),
                }
                FingerprintBody::CanonicalJson(&canonical)
            }
        }
    } else {
        lowercase = essence.to_ascii_lowercase();
        FingerprintBody::Raw {
            content_type: &lowercase,
            bytes: body,
        }
    };
    let query = canonical_query(parts.uri.query().unwrap_or(""));
    let mut headers = Vec::new();
    for name in policy.fingerprint_headers.iter() {
        if name == key_header {
            continue;
        }
        for value in parts.headers.get_all(name) {
            headers.push((
                name.as_str().to_owned(),
                value.as_bytes().trim_ascii().to_vec(),
            ));
        }
    }
    let fingerprint = fingerprinter.fingerprint(&FingerprintInput {
        method: parts.method.as_str(),
        route,
        scope: scope.as_str(),
        query: &query,
        headers: &headers,
        body,
    });
    if let Some(document) = document.filter(|_| wants_command) {
        // The same parse, now as the command the approval policy decides on.
        command = Some(document.into_value());
    }
    Ok(Fingerprinted {
        fingerprint,
        command,
        typed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn fp(
        policy: &RoutePolicy,
        uri: &str,
        ct: Option<&str>,
        body: &'static [u8],
    ) -> Result<Fingerprint, Rejection> {
        let mut builder = Request::post(uri).header("authorization", "Bearer secret-1");
        if let Some(ct) = ct {
            builder = builder.header("content-type", ct);
        }
        let (parts, ()) = builder.body(()).unwrap().into_parts();
        fingerprint(
            &Fingerprinter::sha256(),
            &crate::IDEMPOTENCY_KEY,
            policy,
            &parts,
            "/v1/x",
            &Scope::new("a"),
            &Bytes::from_static(body),
        )
        .map(|fingerprinted| fingerprinted.fingerprint)
    }

    #[test]
    fn json_meaning_not_bytes() {
        let p = RoutePolicy::required();
        let a = fp(&p, "/v1/x", Some("application/json"), br#"{"a":1,"b":"x"}"#).unwrap();
        let b = fp(
            &p,
            "/v1/x",
            Some("application/json; charset=utf-8"),
            b"{ \"b\" : \"\\u0078\", \"a\" : 1.0 }",
        )
        .unwrap();
        assert_eq!(a, b);
        let c = fp(&p, "/v1/x", Some("application/json"), br#"{"a":2,"b":"x"}"#).unwrap();
        assert_ne!(a, c);
        let vendor = fp(
            &p,
            "/v1/x",
            Some("application/vnd.api+json"),
            br#"{"b":"x","a":1}"#,
        )
        .unwrap();
        assert_eq!(a, vendor);
        let shouted = fp(&p, "/v1/x", Some("Application/JSON"), br#"{"b":"x","a":1}"#).unwrap();
        assert_eq!(a, shouted, "media types are case-insensitive");
    }

    #[test]
    fn raw_bodies_include_content_type() {
        let p = RoutePolicy::required();
        let a = fp(&p, "/v1/x", Some("text/plain"), b"hello").unwrap();
        let b = fp(&p, "/v1/x", Some("text/csv"), b"hello").unwrap();
        assert_ne!(a, b);
        let shouted = fp(&p, "/v1/x", Some("Text/Plain; charset=utf-8"), b"hello").unwrap();
        assert_eq!(a, shouted, "media types are case-insensitive");
    }

    #[test]
    fn query_order_does_not_matter() {
        let p = RoutePolicy::required();
        let a = fp(&p, "/v1/x?a=1&b=2", None, b"").unwrap();
        let b = fp(&p, "/v1/x?b=2&a=1", None, b"").unwrap();
        assert_eq!(a, b);
        assert_ne!(a, fp(&p, "/v1/x?a=1", None, b"").unwrap());
    }

    #[test]
    fn invalid_json_is_rejected() {
        let p = RoutePolicy::required();
        assert!(matches!(
            fp(&p, "/v1/x", Some("application/json"), br#"{"a":1,"a":2}"#),
            Err(Rejection::InvalidJson(_))
        ));
    }

    #[test]
    fn routes_with_an_approval_policy_keep_the_validated_command() {
        use tower_idempotency_core::ApprovalPolicy;

        let fingerprinted = |policy: &RoutePolicy, ct: &str, body: &'static [u8]| {
            let (parts, ()) = Request::post("/v1/x")
                .header("content-type", ct)
                .body(())
                .unwrap()
                .into_parts();
            fingerprint(
                &Fingerprinter::sha256(),
                &crate::IDEMPOTENCY_KEY,
                policy,
                &parts,
                "/v1/x",
                &Scope::new("a"),
                &Bytes::from_static(body),
            )
            .unwrap()
        };
        let plain = RoutePolicy::required();
        assert_eq!(
            fingerprinted(&plain, "application/json", br#"{"a":1}"#).command,
            None,
            "a route without approvals keeps nothing"
        );
        let approved = RoutePolicy::required().with_approval(ApprovalPolicy::always());
        let json = fingerprinted(&approved, "application/json", br#"{ "a" : 1 }"#);
        assert_eq!(json.command, Some(serde_json::json!({"a": 1})));
        assert_eq!(
            json.fingerprint,
            fingerprinted(&plain, "application/json", br#"{"a":1}"#).fingerprint,
            "keeping the command does not change the fingerprint"
        );
        let raw = fingerprinted(&approved, "text/plain", b"hello");
        assert_eq!(raw.command, Some(serde_json::Value::Null));
        let normalized = approved.clone().with_normalizer(|v| {
            v["priority"] = "normal".into();
            Ok(())
        });
        let command = fingerprinted(&normalized, "application/json", br#"{"a":1}"#).command;
        assert_eq!(
            command,
            Some(serde_json::json!({"a": 1, "priority": "normal"})),
            "the policy sees the command after the normalizer"
        );
    }

    #[test]
    fn normalizer_defines_the_command() {
        let p = RoutePolicy::required().with_normalizer(|v| {
            let obj = v
                .as_object_mut()
                .ok_or_else(|| crate::policy::CommandRejection::new("expected an object"))?;
            obj.entry("priority").or_insert("normal".into());
            obj.remove("client_note");
            Ok(())
        });
        let a = fp(&p, "/v1/x", Some("application/json"), br#"{"t":"x"}"#).unwrap();
        let b = fp(
            &p,
            "/v1/x",
            Some("application/json"),
            br#"{"t":"x","priority":"normal","client_note":"hi"}"#,
        )
        .unwrap();
        assert_eq!(a, b);
        assert!(matches!(
            fp(&p, "/v1/x", Some("application/json"), b"[1]"),
            Err(Rejection::InvalidCommand(_))
        ));
        assert!(matches!(
            fp(&p, "/v1/x", Some("text/plain"), br#"{"t":"x"}"#),
            Err(Rejection::UnsupportedMediaType)
        ));
        assert!(matches!(
            fp(&p, "/v1/x", None, b""),
            Err(Rejection::UnsupportedMediaType)
        ));
        assert!(matches!(
            fp(&p, "/v1/x", Some("application/json"), b""),
            Err(Rejection::InvalidJson(_))
        ));
    }
}
