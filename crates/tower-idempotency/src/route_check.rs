//! The probe of a route check (feature `axum`): the request extension that
//! [`IdempotencyLayer::verify_routes`](crate::IdempotencyLayer::verify_routes) sends through
//! the router and the layer answers, without running a handler or touching the store, with
//! the route template axum matched. No client can set it.

use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Shared;

/// What a probe saw in the layer: which layer answered it, and the route it matched.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) layer: usize,
    pub(crate) matched: Option<String>,
}

/// The probe a [`verify_routes`](crate::IdempotencyLayer::verify_routes) request carries.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteProbe(Arc<Mutex<Option<Seen>>>);

impl RouteProbe {
    /// Records what the layer `shared` saw: the route template axum matched, if any.
    pub(crate) fn answer(&self, shared: &Arc<Shared>, matched: Option<String>) {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *seen = Some(Seen {
            layer: layer_id(shared),
            matched,
        });
    }

    /// What the layer saw, once.
    pub(crate) fn seen(&self) -> Option<Seen> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Which layer (configuration) answered a probe.
pub(crate) fn layer_id(shared: &Arc<Shared>) -> usize {
    Arc::as_ptr(shared) as usize
}
