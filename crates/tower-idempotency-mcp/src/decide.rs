//! The decision for one guarded `tools/call`: a new execution, the stored result, an
//! attach to the running execution (bounded wait), a take-over of one that lapsed before
//! dispatch, or a refusal — and running the accepted execution.
//!
//! Every decision is made from the execution record; the JSON-RPC id only addresses the
//! answer.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::time::Instant;
use tower::Service;
use tower_idempotency_core::{
    IdempotencyKey, Lease, Operation, OperationState, Reservation, ReserveRequest, StoreError,
};

use crate::answer::{self, Uncertain};
use crate::attach;
use crate::drive::{Run, drive};
use crate::execution::{DispatchError, Execution, dispatched_at};
use crate::intent::Intent;
use crate::jsonrpc::ToolCall;
use crate::layer::Config;
use crate::policy::{OnDisconnect, ToolPolicy};
use crate::service::SESSION_HEADER;
use crate::{BoxError, McpBody};

/// Rounds of the decision loop before a call is answered `request-in-progress`: each
/// round is one reservation, so this bounds the work one call can cause.
const MAX_ROUNDS: usize = 64;

/// How many generations past a free one are looked at for a later execution of the same
/// intent (the free one and those before it were purged at the end of their retention):
/// a keyless call attaches to an open execution whose intent was repeated and purged up
/// to this many times in a row before it. Each look is one `get`, made only when a call
/// is about to start a new execution.
pub(crate) const PURGE_LOOKAHEAD: u32 = 8;

/// Where the key of a call came from, or that there is none.
#[derive(Debug)]
pub(crate) enum Carrier {
    Explicit(IdempotencyKey),
    Derived,
}

pub(crate) fn store_unavailable(error: &StoreError) -> Response<McpBody> {
    tracing::error!(%error, "idempotency store failed on a tool call");
    answer::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "the idempotency store is unavailable; the tool was not run",
    )
}

pub(crate) struct CallContext {
    pub(crate) config: Arc<Config>,
    pub(crate) policy: ToolPolicy,
    pub(crate) call: ToolCall,
    pub(crate) intent: Intent,
    pub(crate) carrier: Carrier,
}

pub(crate) enum Decision {
    /// The layer answers itself; the decision label of the metrics.
    Answer(Response<McpBody>, &'static str),
    Execute {
        operation: Box<Operation>,
        lease: Lease,
    },
}

impl CallContext {
    fn reserve_request(&self, key: IdempotencyKey, take_over: bool) -> ReserveRequest {
        ReserveRequest {
            scope: self.intent.actor.clone(),
            key,
            fingerprint: self.intent.fingerprint.clone(),
            method: "tools/call".to_owned(),
            route: self.intent.tool.clone(),
            lease: self.policy.lease,
            retention: self.policy.retention,
            unknown_retention: self.policy.unknown_retention,
            take_over_unknown: take_over,
            marks_dispatch: false,
            approval: None,
        }
    }

    fn key(&self, generation: u32) -> IdempotencyKey {
        match &self.carrier {
            Carrier::Explicit(key) => key.clone(),
            Carrier::Derived => self.intent.derived_key(generation),
        }
    }

    /// A delivered execution still attaches identical calls inside the attach window.
    fn closed(&self, operation: &Operation) -> bool {
        if matches!(self.carrier, Carrier::Explicit(_)) || !operation.delivered {
            return false;
        }
        let window_end = operation
            .completed_at
            .map(|at| at + self.policy.attach_window);
        window_end.is_none_or(|end| SystemTime::now() >= end)
    }

    fn delivering(&self, message: &Value, operation: &Operation) -> Response<McpBody> {
        let bytes = Bytes::from(serde_json::to_vec(message).unwrap_or_default());
        let body = crate::body::ChannelBody::delivering(
            bytes,
            Arc::clone(&self.config.store),
            operation.scope.clone(),
            operation.id,
        );
        let mut response = Response::new(body.map_err(|never| match never {}).boxed_unsync());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    fn answer(&self, message: &Value, decision: &'static str) -> Result<Decision, StoreError> {
        Ok(Decision::Answer(answer::json_response(message), decision))
    }

    async fn state_name(
        &self,
        operation: &Operation,
    ) -> Result<(&'static str, Option<SystemTime>), StoreError> {
        let dispatched = dispatched_at(&*self.config.store, operation).await?;
        let name = match operation.state {
            OperationState::Completed => "completed",
            OperationState::InProgress if dispatched.is_some() => "dispatched",
            OperationState::InProgress => "accepted",
            _ if dispatched.is_some() => "unknown",
            _ => "accepted",
        };
        Ok((name, dispatched))
    }

    /// The first generation after `generation` that is still held, looking
    /// [`PURGE_LOOKAHEAD`] generations ahead.
    async fn later_generation(&self, generation: u32) -> Result<Option<u32>, StoreError> {
        for later in generation + 1..=generation + PURGE_LOOKAHEAD {
            let key = self.intent.derived_key(later);
            if self
                .config
                .store
                .get(&self.intent.actor, &key)
                .await?
                .is_some()
            {
                return Ok(Some(later));
            }
        }
        Ok(None)
    }

    /// Records this call among the ones attached to `operation`, for the status tool. A
    /// failure costs the status record one entry, never the answer.
    async fn note_attached(&self, operation: &Operation) {
        let retention = self.policy.retention.max(self.policy.unknown_retention);
        if let Err(error) =
            attach::note(&*self.config.store, operation, &self.call.id, retention).await
        {
            tracing::warn!(%error, execution_id = %operation.id, "could not record an attached call");
        }
    }

    pub(crate) async fn decide(&self) -> Result<Decision, StoreError> {
        let store = &*self.config.store;
        let deadline = Instant::now() + self.policy.wait;
        let mut attached = false;
        let mut generation = 0u32;
        let mut last_seen: Option<Operation> = None;
        for _ in 0..MAX_ROUNDS {
            let key = self.key(generation);
            match store
                .reserve(self.reserve_request(key.clone(), false))
                .await?
            {
                Reservation::Acquired {
                    operation, lease, ..
                } => {
                    if let Carrier::Derived = self.carrier {
                        // This generation's slot was free. If a later generation exists,
                        // this one was purged after it was closed: the later one is the
                        // current intent. Older generations are purged first, so the
                        // records still held are a run of consecutive generations; up to
                        // PURGE_LOOKAHEAD purged ones are skipped.
                        if let Some(later) = self.later_generation(generation).await? {
                            store.release(&lease).await?;
                            generation = later;
                            continue;
                        }
                    }
                    return Ok(Decision::Execute {
                        operation: Box::new(operation),
                        lease,
                    });
                }
                Reservation::Existing(operation) | Reservation::ApprovalRequested(operation) => {
                    if operation.fingerprint != self.intent.fingerprint
                        || operation.method != "tools/call"
                    {
                        if let Carrier::Explicit(_) = self.carrier {
                            let (state, _) = self.state_name(&operation).await?;
                            return self.answer(
                                &answer::mismatch(&self.call.id, &operation, state),
                                "conflict",
                            );
                        }
                        generation += 1;
                        continue;
                    }
                    match operation.state {
                        // A call that waited on this execution gets its result, delivered
                        // to another caller or not.
                        OperationState::Completed
                            if self.closed(&operation)
                                && last_seen.as_ref().map(|seen| seen.id) != Some(operation.id) =>
                        {
                            generation += 1;
                        }
                        OperationState::Completed => {
                            tracing::info!(
                                execution_id = %operation.id,
                                jsonrpc_id = %self.call.id,
                                tool = %self.intent.tool,
                                attached,
                                "tool call answered with the stored result"
                            );
                            self.note_attached(&operation).await;
                            return match answer::replay(&operation, &self.call.id, attached) {
                                Some(message) => Ok(Decision::Answer(
                                    self.delivering(&message, &operation),
                                    if attached { "waited" } else { "replayed" },
                                )),
                                None => self.uncertain(Uncertain::OutcomeUnknown, &operation).await,
                            };
                        }
                        OperationState::InProgress => {
                            let now = Instant::now();
                            if now >= deadline {
                                return self.uncertain(Uncertain::InProgress, &operation).await;
                            }
                            attached = true;
                            last_seen = Some(operation.clone());
                            store.wait(&self.intent.actor, &key, deadline - now).await?;
                        }
                        _ => {
                            let dispatched = dispatched_at(store, &operation).await?;
                            if dispatched.is_some() && !self.policy.reexecute_safe {
                                return self.uncertain(Uncertain::OutcomeUnknown, &operation).await;
                            }
                            // Lapsed before dispatch (or re-execution is safe): take over.
                            if let Reservation::Acquired {
                                operation, lease, ..
                            } = store.reserve(self.reserve_request(key, true)).await?
                            {
                                tracing::info!(
                                    execution_id = %operation.id,
                                    attempt = operation.attempts,
                                    "taking over an execution whose lease lapsed before dispatch"
                                );
                                return Ok(Decision::Execute {
                                    operation: Box::new(operation),
                                    lease,
                                });
                            }
                        }
                    }
                }
            }
        }
        match last_seen {
            Some(operation) => self.uncertain(Uncertain::InProgress, &operation).await,
            None => Err(StoreError::Backend(
                "the tool call found no reservable execution record".into(),
            )),
        }
    }

    async fn uncertain(
        &self,
        kind: Uncertain,
        operation: &Operation,
    ) -> Result<Decision, StoreError> {
        self.note_attached(operation).await;
        let (state, dispatched) = self.state_name(operation).await?;
        let decision = match kind {
            Uncertain::InProgress => "in_progress",
            Uncertain::OutcomeUnknown => "unknown",
        };
        self.answer(
            &answer::uncertain(
                &self.call.id,
                kind,
                operation,
                state,
                dispatched,
                self.config.status_tool.as_deref(),
            ),
            decision,
        )
    }

    pub(crate) async fn execute<S, ResBody>(
        &self,
        inner: S,
        mut parts: http::request::Parts,
        bytes: Bytes,
        operation: Operation,
        lease: Lease,
    ) -> Result<(Response<McpBody>, &'static str), S::Error>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResBody: Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        let store = Arc::clone(&self.config.store);
        let execution = Execution::new(
            Arc::clone(&store),
            lease,
            &operation,
            &self.call.id,
            self.policy.lease,
            self.policy.unknown_retention,
        );
        tracing::info!(
            execution_id = %operation.id,
            jsonrpc_id = %self.call.id,
            tool = %self.intent.tool,
            attempt = operation.attempts,
            "tool call accepted as a new execution"
        );
        if !self.policy.marks_dispatch {
            if let Err(error) = execution.dispatched_at_handoff().await {
                return Ok(match error {
                    DispatchError::Superseded(_) => (
                        answer::json_response(&answer::uncertain(
                            &self.call.id,
                            Uncertain::InProgress,
                            &operation,
                            "accepted",
                            None,
                            self.config.status_tool.as_deref(),
                        )),
                        "in_progress",
                    ),
                    DispatchError::Store(error) => {
                        let _ = store.release(execution.lease()).await;
                        (store_unavailable(&error), "store_unavailable")
                    }
                });
            }
        }
        let inflight = (self.policy.on_disconnect == OnDisconnect::Complete).then(|| {
            let session = parts
                .headers
                .get(SESSION_HEADER)
                .and_then(|value| value.to_str().ok());
            self.config.inflight.enter(
                session,
                self.intent.actor.as_str(),
                &self.call.id.to_string(),
            )
        });
        parts.extensions.insert(execution.clone());
        let request = Request::from_parts(parts, Full::new(bytes));
        let run = Run {
            id: self.call.id.clone(),
            execution,
            store,
            on_disconnect: self.policy.on_disconnect,
            response_limit: self.config.response_limit,
            inflight,
        };
        let decision = if operation.attempts > 1 {
            "re_executed"
        } else {
            "executed"
        };
        Ok((drive(inner, request, run).await?, decision))
    }
}
