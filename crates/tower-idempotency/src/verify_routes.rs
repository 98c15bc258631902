//! Route policies checked against the router they guard (feature `axum`): a policy keyed by
//! a route that the router never registered would silently match nothing (`"/v1/refund"`
//! beside a `"/v1/refunds"` route), and its route would run under the default policy —
//! without the approval or the stricter settings it was meant to have.
//!
//! [`IdempotencyLayer::verify_routes`] sends one probe ([`RouteProbe`]) per route policy
//! through the router: axum's own routing matches it, and the layer, recognising the probe,
//! answers it with the route template it matched, without running a handler or touching the
//! store. Until the routes are verified, the layer warns once, at its first guarded
//! request, that its route policies are unchecked ([`RouteCheck`](crate::config::RouteCheck)).

use std::future::Future;
use std::task::{Context, Poll, Waker};

use http::{Method, Request};

use crate::error::ConfigError;
use crate::layer::IdempotencyLayer;
use crate::route_check::{RouteProbe, layer_id};

/// A request path that the route template `route` matches: each `{param}` and `{*rest}`
/// filled with a placeholder, `{{` and `}}` unescaped.
fn probe_path(route: &str) -> String {
    let mut path = String::with_capacity(route.len());
    let mut chars = route.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                path.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                path.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                path.push_str("probe");
            }
            c => path.push(c),
        }
    }
    path
}

impl IdempotencyLayer {
    /// Checks, at start, that every route policy
    /// ([`with_route_policy`](IdempotencyLayer::with_route_policy)) names a route of
    /// `router` that this layer guards: fail closed on a mistyped route string, which would
    /// otherwise match nothing and leave its route under the default policy (without its
    /// approval, for example).
    ///
    /// Call it with the router the layer was applied to (`Router::route_layer`), after
    /// `with_state` and before outer middleware (authentication) that would answer the
    /// probes itself. Each policy is probed once through the router's own routing (an
    /// empty request of the policy's method, path parameters filled with `probe`); the
    /// layer answers the probe with the route template axum matched, without running a
    /// handler or touching the store. A route the layer does not wrap would receive the
    /// probe like any request: pass the router the layer was applied to, with every guarded
    /// route registered before `route_layer`. The check is by route template: a route's
    /// method fallback (`405`) runs inside the layer too, so a policy for a method the
    /// route has no handler for is not detected (it guards nothing that could run). Errors
    /// name the route:
    /// [`ConfigError::UnregisteredRoute`] (no route, or another template, matches it),
    /// [`ConfigError::UnguardedRoutePolicy`] (its method is not guarded) and
    /// [`ConfigError::RouteNotReached`] (the probe did not reach this layer).
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use http::Method;
    /// use tower_idempotency::{ConfigError, IdempotencyLayer, MemoryStore, RoutePolicy};
    ///
    /// let idempotency = IdempotencyLayer::new(MemoryStore::default()).with_route_policy(
    ///     Method::POST,
    ///     "/v1/refund", // the router has `/v1/refunds`
    ///     RoutePolicy::required(),
    /// ).expect("the store has what the policy needs");
    /// let router = Router::new()
    ///     .route("/v1/refunds", post(|| async { "refunded" }))
    ///     .route_layer(idempotency.clone());
    /// assert!(matches!(
    ///     idempotency.verify_routes(&router),
    ///     Err(ConfigError::UnregisteredRoute { route, .. }) if route == "/v1/refund"
    /// ));
    /// ```
    pub fn verify_routes(&self, router: &axum::Router) -> Result<(), ConfigError> {
        let shared = self.shared();
        let mut policies: Vec<(&String, &Method)> = shared
            .routes
            .iter()
            .flat_map(|(route, policies)| policies.iter().map(move |(method, _)| (route, method)))
            .collect();
        policies.sort();
        for (route, method) in policies {
            let refused =
                |what: fn(Method, String) -> ConfigError| what(method.clone(), route.clone());
            if !shared.guards(method) {
                return Err(refused(|method, route| ConfigError::UnguardedRoutePolicy {
                    method,
                    route,
                }));
            }
            let probe = RouteProbe::default();
            let Ok(mut request) = Request::builder()
                .method(method.clone())
                .uri(probe_path(route))
                .body(axum::body::Body::empty())
            else {
                return Err(refused(|method, route| ConfigError::UnregisteredRoute {
                    method,
                    route,
                }));
            };
            request.extensions_mut().insert(probe.clone());
            let mut router = router.clone();
            let answer = {
                let future = tower::Service::call(&mut router, request);
                let mut future = std::pin::pin!(future);
                // The layer answers a probe at once; anything still pending did not reach it.
                future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
            };
            let status = match answer {
                Poll::Ready(Ok(response)) => Some(response.status().as_u16()),
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => None,
            };
            match probe.seen() {
                Some(seen) if seen.layer == layer_id(shared) => {
                    if seen.matched.as_deref() != Some(route.as_str()) {
                        return Err(refused(|method, route| ConfigError::UnregisteredRoute {
                            method,
                            route,
                        }));
                    }
                }
                // The router's own `404`: no route matches the path.
                _ if status == Some(404) => {
                    return Err(refused(|method, route| ConfigError::UnregisteredRoute {
                        method,
                        route,
                    }));
                }
                _ => {
                    return Err(ConfigError::RouteNotReached {
                        method: method.clone(),
                        route: route.clone(),
                        status,
                    });
                }
            }
        }
        shared.route_check.mark_verified();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::probe_path;

    #[test]
    fn probe_paths_fill_parameters() {
        assert_eq!(probe_path("/v1/tickets"), "/v1/tickets");
        assert_eq!(probe_path("/v1/tickets/{id}"), "/v1/tickets/probe");
        assert_eq!(probe_path("/files/{*rest}"), "/files/probe");
        assert_eq!(probe_path("/a/{{literal}}/{x}"), "/a/{literal}/probe");
    }
}
