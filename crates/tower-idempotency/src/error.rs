//! [`ConfigError`]: a layer, policy or storage setting refused when it is built.

/// Invalid layer or policy configuration, refused when it is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A header that must never enter a fingerprint (credentials, cookies, tracing,
    /// idempotency headers).
    #[error("header `{0}` must not be part of a fingerprint")]
    ForbiddenFingerprintHeader(String),
    /// A header that must never be stored and replayed (`Set-Cookie`, hop-by-hop headers).
    #[error("header `{0}` must not be stored for replay")]
    ForbiddenStoredHeader(String),
    /// A redaction pointer that is not an RFC 6901 JSON pointer to a member.
    #[error("`{0}` is not a JSON pointer to a member (RFC 6901: `/a/b`, escapes `~0` `~1`)")]
    InvalidJsonPointer(String),
    /// An encryption key name that is empty, too long, has characters other than
    /// `A–Z a–z 0–9 . _ -`, or is listed twice.
    #[error("`{0}` is not a usable encryption key id (1–64 of A–Z a–z 0–9 . _ -, each once)")]
    InvalidKeyId(String),
    /// A string that is not a valid header name.
    #[error("`{0}` is not a valid header name")]
    InvalidHeaderName(String),
    /// A route policy whose route the router does not register
    /// ([`IdempotencyLayer::verify_routes`](crate::IdempotencyLayer::verify_routes)): it
    /// would match nothing, and its route would run under the default policy.
    #[error("the route policy for {method} {route} names no route of the router")]
    UnregisteredRoute {
        /// The policy's method.
        method: http::Method,
        /// The policy's route, as given.
        route: String,
    },
    /// A route policy for a method the layer does not guard: it would never apply.
    #[error("the route policy for {method} {route} is for a method the layer does not guard")]
    UnguardedRoutePolicy {
        /// The policy's method.
        method: http::Method,
        /// The policy's route.
        route: String,
    },
    /// The probe for a route policy did not reach the layer: the router is not the one the
    /// layer was applied to, or middleware outside the layer answered it (`status`).
    #[error(
        "the route check for {method} {route} did not reach the idempotency layer (answered {status:?}): verify the router the layer was applied to, before outer middleware"
    )]
    RouteNotReached {
        /// The policy's method.
        method: http::Method,
        /// The policy's route.
        route: String,
        /// The status the probe was answered with, if it was answered at once.
        status: Option<u16>,
    },
    /// A policy needs a capability the store does not declare (approvals, transactions,
    /// dispatch marks): refused when it is set, so that no request ever meets it.
    #[error("{} needs {capability}, which the idempotency store does not support", route.as_deref().unwrap_or("the default policy"))]
    MissingCapability {
        /// `METHOD /route` of the policy; `None` for the default policy.
        route: Option<String>,
        /// What the store lacks.
        capability: tower_idempotency_core::Capability,
    },
    /// A policy whose settings cannot work together (the single-commit path with handlers
    /// that mark their own dispatch): refused when it is set.
    #[error("{}: {reason}", route.as_deref().unwrap_or("the default policy"))]
    IncompatiblePolicy {
        /// `METHOD /route` of the policy; `None` for the default policy.
        route: Option<String>,
        /// Which settings conflict, and why.
        reason: &'static str,
    },
}
