//! The layer's metric handles ([`LayerMetrics`]), resolved once per configuration: the
//! gauges, the store-call histograms, and the decision series of each route. Below the
//! configuration, which keeps them; the telemetry module above both emits through them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use http::Method;
use metrics::Gauge;
use tower_idempotency_core::metrics::{
    self as names, Decision, DecisionMetrics, GaugeGuard, StoreMetrics,
};

/// Most routes a layer keeps series for. Routes are templates (a handful per service);
/// past this many (a service labelled by raw paths) every new route is counted under
/// [`OTHER_ROUTE`].
const CACHED_ROUTES: usize = 1024;

/// The `http.route` label of every route met after the first [`CACHED_ROUTES`].
pub(crate) const OTHER_ROUTE: &str = "_other";

/// Route → the series of each of its methods.
type RouteMap = HashMap<Box<str>, Vec<(&'static str, Arc<DecisionMetrics>)>>;

/// The layer's metric handles, resolved once: the gauges and the routes with a policy of
/// their own when the layer wraps a service, a route under the default policy the first
/// time it is seen (then kept in a map that requests only read), the store-call
/// histograms on their first sample.
pub(crate) struct LayerMetrics {
    pub(crate) store: StoreMetrics,
    in_flight: Gauge,
    records_pending: Gauge,
    routes: RwLock<RouteMap>,
}

impl fmt::Debug for LayerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerMetrics").finish_non_exhaustive()
    }
}

/// The decisions a route registers at zero: all of them, the `approval_*` ones only when
/// its policy requires approvals.
fn reachable(approvals: bool) -> impl Iterator<Item = Decision> {
    Decision::ALL
        .into_iter()
        .filter(move |decision| approvals || !decision.needs_approval())
}

fn route_series(method: &'static str, route: &str) -> DecisionMetrics {
    DecisionMetrics::new(
        (names::METHOD, method),
        (names::ROUTE, Arc::<str>::from(route)),
    )
}

impl LayerMetrics {
    /// Resolves a layer's handles and registers its series at zero: its gauges, and the
    /// decision counters of each guarded `(route, method)` that has a policy of its own
    /// (`approvals`: whether that policy requires approvals).
    pub(crate) fn new<'a>(guarded: impl IntoIterator<Item = (&'a str, &'a Method, bool)>) -> Self {
        let mut routes = RouteMap::new();
        for (route, method, approvals) in guarded {
            let series = route_series(method_label(method), route);
            series.register(reachable(approvals));
            routes
                .entry(Box::from(route))
                .or_default()
                .push((method_label(method), Arc::new(series)));
        }
        Self {
            store: StoreMetrics::new(),
            in_flight: names::gauge(names::OPERATIONS_IN_FLIGHT),
            records_pending: names::gauge(names::RECORDS_PENDING),
            routes: RwLock::new(routes),
        }
    }

    /// The series of `(method, route)`. A route seen for the first time gets its series
    /// made, its decision counters registered at zero (`approvals`: whether its policy
    /// requires approvals) and kept, so that it is exported in full from then on.
    pub(crate) fn route(
        &self,
        method: &Method,
        route: &str,
        approvals: impl FnOnce() -> bool,
    ) -> Arc<DecisionMetrics> {
        let method = method_label(method);
        let find = |routes: &RouteMap, route: &str| {
            routes
                .get(route)
                .and_then(|methods| methods.iter().find(|(m, _)| *m == method))
                .map(|(_, series)| Arc::clone(series))
        };
        {
            let routes = self.routes.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = find(&routes, route) {
                return series;
            }
            // Past the cap a new route is `OTHER_ROUTE`'s, found without the write lock.
            if routes.len() >= CACHED_ROUTES
                && let Some(series) = find(&routes, OTHER_ROUTE)
            {
                return series;
            }
        }
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        // Past the cap, a new route is counted under `OTHER_ROUTE`: a service that labels by
        // raw paths (no `MatchedPath`) cannot grow the label set, or the map, per request.
        let route = if routes.len() < CACHED_ROUTES || routes.contains_key(route) {
            route
        } else {
            OTHER_ROUTE
        };
        if let Some(series) = find(&routes, route) {
            return series;
        }
        let series = Arc::new(route_series(method, route));
        series.register(reachable(approvals()));
        routes
            .entry(Box::from(route))
            .or_default()
            .push((method, Arc::clone(&series)));
        series
    }

    /// Counts a handler in [`OPERATIONS_IN_FLIGHT`](names::OPERATIONS_IN_FLIGHT) while the
    /// guard lives, however it ends (returns, panics, is dropped).
    pub(crate) fn in_flight(&self) -> GaugeGuard {
        GaugeGuard::up(&self.in_flight)
    }

    /// Moves [`RECORDS_PENDING`](names::RECORDS_PENDING) by `delta`.
    pub(crate) fn pending_records(&self, delta: f64) {
        self.records_pending.increment(delta);
    }
}

/// The layer's [`LayerMetrics`], made the first time they are asked for (when the layer
/// wraps a service). A builder method that changes the configuration works on a clone,
/// which starts without them (it may add routes).
#[derive(Default)]
pub(crate) struct MetricsCell(pub(crate) OnceLock<Arc<LayerMetrics>>);

impl Clone for MetricsCell {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// The method label: the method for the standard ones, `_OTHER` for extension methods
/// (which are the client's choice: one label for all of them).
pub(crate) fn method_label(method: &Method) -> &'static str {
    match method.as_str() {
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "GET" => "GET",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "_OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_past_the_cap_share_one_series() {
        let metrics = LayerMetrics::new([]);
        let first = metrics.route(&Method::POST, "/v1/route-0", || false);
        for n in 1..CACHED_ROUTES {
            metrics.route(&Method::POST, &format!("/v1/route-{n}"), || false);
        }
        let again = metrics.route(&Method::POST, "/v1/route-0", || false);
        assert!(
            Arc::ptr_eq(&first, &again),
            "a cached route keeps its series"
        );
        let past = metrics.route(&Method::POST, "/v1/past-1", || false);
        let other = metrics.route(&Method::POST, "/v1/past-2", || false);
        assert!(Arc::ptr_eq(&past, &other), "both are `_other`");
        let routes = metrics.routes.read().unwrap();
        assert_eq!(routes.len(), CACHED_ROUTES + 1);
        assert!(routes.contains_key(OTHER_ROUTE));
    }
}
