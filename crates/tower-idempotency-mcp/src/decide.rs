//! The decision for one guarded `tools/call`: a new execution, the stored result, an
//! attach to the running execution (bounded wait), a take-over of one that lapsed before
//! dispatch, or a refusal — and running the accepted execution.
//!
//! Every decision is made from the execution record; the JSON-RPC id only addresses the
//! answer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::time::Instant;
use tower::Service;
use tower_idempotency_core::{
    ApprovalPolicy, ApprovalRequest, ApprovalState, Execution, IdempotencyKey, Lease, Operation,
    OperationState, Reservation, ReserveRequest, StoreError, problem_types,
};

use crate::answer::{self, ApprovalRefusal, Uncertain};
use crate::drive::{Run, drive};
use crate::inflight::Caller;
use crate::intent::Intent;
use crate::journal::Decided;
use crate::jsonrpc::ToolCall;
use crate::layer::Config;
use crate::metrics::DecisionLabel;
use crate::policy::{OnDisconnect, ToolPolicy};
use crate::{BoxError, McpBody};
use crate::{attach, attempt};
use tower_idempotency_core::metrics::StoreOp;

/// Rounds of the decision loop before a call is answered `request-in-progress`: each
/// round is one reservation, so this bounds the work one call can cause.
const MAX_ROUNDS: usize = 64;

/// The `replace_delivered` window of a derived-key call that must not replace the
/// execution it already waited on: longer than any retention.
const NEVER_REPLACE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How far this host's clock may be ahead of the store's before a delivered execution that
/// was not replaced is taken for a store that ignores `replace_delivered`.
const CLOCK_MARGIN: Duration = Duration::from_secs(60);

/// How often a re-call that waits for an approval decision (the tool's approval `wait`)
/// looks at the record again.
const APPROVAL_POLL: Duration = Duration::from_millis(200);

/// Where the key of a call came from, or that there is none.
#[derive(Debug)]
pub(crate) enum Carrier {
    Explicit(IdempotencyKey),
    Derived,
}

/// The answer to a store failure on a tool call, and its decision label: `500
/// approvals-unsupported` (the HTTP layer's problem) for a tool that requires approval on a
/// store that predates approvals, `500 store-unsupported` for another capability the store
/// lacks, `429 scope-quota-exceeded` with `Retry-After` for an actor at its quota (as the
/// HTTP layer answers), `503 store-unavailable` otherwise. The tool is not run.
pub(crate) fn store_failed(error: &StoreError) -> (Response<McpBody>, DecisionLabel) {
    match error {
        StoreError::Unsupported { feature } => {
            tracing::error!(%error, "the idempotency store lacks a capability this tool needs");
            let slug = if *feature == "approvals" {
                problem_types::APPROVALS_UNSUPPORTED
            } else {
                "store-unsupported"
            };
            let response = answer::problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                slug,
                &format!("the idempotency store does not support {feature}; the tool was not run"),
            );
            (response, DecisionLabel::StoreUnavailable)
        }
        StoreError::ScopeQuotaExceeded { retry_after } => {
            // The HTTP layer's answer to the same refusal: this actor only, nothing stored.
            let mut response = answer::problem(
                StatusCode::TOO_MANY_REQUESTS,
                "scope-quota-exceeded",
                "this actor's idempotency quota is exhausted; the tool was not run",
            );
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from(retry_after.as_secs().max(1)),
            );
            (response, DecisionLabel::QuotaExceeded)
        }
        _ => (store_unavailable(error), DecisionLabel::StoreUnavailable),
    }
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
    /// The approval this call asks for should its key have no record: the tool's approval
    /// rule holds for its validated arguments.
    pub(crate) approval: Option<ApprovalRequest>,
    /// The Streamable HTTP session the call came in, when there is one (correlation only).
    pub(crate) session: Option<String>,
    /// The principal, when the layer is told how to read it (journaled, never the key).
    pub(crate) principal: Option<String>,
}

pub(crate) enum Decision {
    /// The layer answers itself; the decision label of the metrics.
    Answer(Response<McpBody>, DecisionLabel),
    Execute {
        operation: Box<Operation>,
        lease: Lease,
    },
}

impl CallContext {
    /// The reservation of this call under `key`. `replace`: a derived key's execution that
    /// was delivered (and is past the tool's attach window) is closed, and the reservation
    /// starts a new one in its place; a call that has already waited on an execution asks
    /// without it, so that it receives the result it waited for.
    fn reserve_request(
        &self,
        key: IdempotencyKey,
        take_over: bool,
        replace: bool,
    ) -> ReserveRequest {
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
            marks_dispatch: self.policy.marks_dispatch,
            approval: self.approval.clone(),
            // Derived matching always says so, replacing or not: a store may answer other
            // requests from what it remembers of completed records, which cannot tell one
            // execution of an intent from the next.
            replace_delivered: matches!(self.carrier, Carrier::Derived).then_some(if replace {
                self.policy.attach_window
            } else {
                NEVER_REPLACE
            }),
        }
    }

    /// Whether a derived-key reservation that asked to replace `operation` found it
    /// delivered so long ago that the store must have ignored the request: past the
    /// window by more than [`CLOCK_MARGIN`] on this host's clock.
    fn ignored_replacement(&self, operation: &Operation) -> bool {
        matches!(self.carrier, Carrier::Derived)
            && operation
                .delivered_before(self.policy.attach_window + CLOCK_MARGIN, SystemTime::now())
    }

    pub(crate) fn key(&self) -> IdempotencyKey {
        match &self.carrier {
            Carrier::Explicit(key) => key.clone(),
            Carrier::Derived => self.intent.derived_key(),
        }
    }

    fn delivering(&self, message: &Value, operation: &Operation) -> Response<McpBody> {
        let bytes = Bytes::from(serde_json::to_vec(message).unwrap_or_default());
        let body = crate::body::ChannelBody::delivering(
            bytes,
            Arc::clone(&self.config.store),
            Arc::clone(&self.config.metrics),
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

    /// Awaits one store call, timed in the layer's store metrics.
    async fn store_call<F: std::future::Future>(&self, operation: StoreOp, call: F) -> F::Output {
        self.config.metrics.store_call(operation, call).await
    }

    fn answer(&self, message: &Value, decision: DecisionLabel) -> Result<Decision, StoreError> {
        Ok(Decision::Answer(answer::json_response(message), decision))
    }

    /// Records this call among the ones attached to `operation`, for the status tool. A
    /// failure costs the status record one entry, never the answer.
    async fn note_attached(&self, operation: &Operation) {
        let retention = self.policy.retention.max(self.policy.unknown_retention);
        if let Err(error) = attach::note(
            &*self.config.store,
            &self.config.metrics.store,
            operation,
            &self.call.id,
            retention,
        )
        .await
        {
            tracing::warn!(%error, execution_id = %operation.id, "could not record an attached call");
        }
    }

    pub(crate) async fn decide(&self) -> Result<Decision, StoreError> {
        let store = &*self.config.store;
        let started = Instant::now();
        let deadline = started + self.policy.wait;
        let approval_deadline = started
            + self
                .policy
                .approval
                .as_ref()
                .map_or(Duration::ZERO, ApprovalPolicy::wait);
        let mut attached = false;
        let mut last_seen: Option<Operation> = None;
        let key = self.key();
        for _ in 0..MAX_ROUNDS {
            let replace = last_seen.is_none();
            let reserving = store.reserve(self.reserve_request(key.clone(), false, replace));
            match self.store_call(StoreOp::Reserve, reserving).await? {
                Reservation::Acquired {
                    operation,
                    lease,
                    takeover,
                } => {
                    if self.approval.is_some() && !takeover && operation.approval.is_none() {
                        // A store that predates approvals reserved the key as if no
                        // approval were asked for: never run the tool unapproved.
                        let _ = self
                            .store_call(StoreOp::Release, store.release(&lease))
                            .await;
                        return Err(StoreError::Unsupported {
                            feature: "approvals",
                        });
                    }
                    return Ok(Decision::Execute {
                        operation: Box::new(operation),
                        lease,
                    });
                }
                Reservation::ApprovalRequested(operation) => {
                    tracing::info!(
                        execution_id = %operation.id,
                        jsonrpc_id = %self.call.id,
                        tool = %self.intent.tool,
                        "tool call awaits a person's approval"
                    );
                    return self
                        .approval_refusal(ApprovalRefusal::Required, &operation, false)
                        .await;
                }
                Reservation::Existing(operation) => {
                    // A derived key names the intent, fingerprint included, so only an
                    // explicit key can meet another command; refused either way.
                    if operation.fingerprint != self.intent.fingerprint
                        || operation.method != "tools/call"
                    {
                        self.journal(Decided::Conflict, &operation);
                        return self.answer(
                            &answer::mismatch(&self.call.id, &operation),
                            DecisionLabel::Conflict,
                        );
                    }
                    let approval_expired = operation
                        .approval
                        .as_ref()
                        .is_some_and(|approval| approval.state == ApprovalState::Expired);
                    match operation.state {
                        // Not delivered, inside the attach window, or the execution this
                        // call waited on (delivered to another caller or not): its result.
                        // (A delivered one past the window was replaced by the store.)
                        OperationState::Completed
                            if replace && self.ignored_replacement(&operation) =>
                        {
                            // A store that predates `replace_delivered` would replay this
                            // execution to every deliberate repeat until its retention ends.
                            return Err(StoreError::Unsupported {
                                feature: "replace_delivered",
                            });
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
                                Some(message) => {
                                    self.journal(Decided::Replayed, &operation);
                                    Ok(Decision::Answer(
                                        self.delivering(&message, &operation),
                                        if attached {
                                            DecisionLabel::Waited
                                        } else {
                                            DecisionLabel::Replayed
                                        },
                                    ))
                                }
                                None => self.uncertain(Uncertain::OutcomeUnknown, &operation).await,
                            };
                        }
                        OperationState::InProgress => {
                            let now = Instant::now();
                            if now >= deadline {
                                if !attached {
                                    self.journal(Decided::Attached, &operation);
                                }
                                return self.uncertain(Uncertain::InProgress, &operation).await;
                            }
                            if !attached {
                                self.journal(Decided::Attached, &operation);
                            }
                            attached = true;
                            last_seen = Some(operation.clone());
                            // Returns when the execution settles, or when its lease lapses
                            // (before dispatch, the next reservation takes it over).
                            let waiting = store.wait(&self.intent.actor, &key, deadline - now);
                            self.store_call(StoreOp::Wait, waiting).await?;
                        }
                        OperationState::AwaitingApproval if !approval_expired => {
                            let decided = Instant::now() < approval_deadline
                                && self.wait_for_decision(&key, approval_deadline).await?;
                            if !decided {
                                return self
                                    .approval_refusal(ApprovalRefusal::Required, &operation, true)
                                    .await;
                            }
                        }
                        OperationState::AwaitingApproval | OperationState::Authorized
                            if approval_expired =>
                        {
                            return self
                                .approval_refusal(ApprovalRefusal::Expired, &operation, true)
                                .await;
                        }
                        OperationState::Denied => {
                            return self
                                .approval_refusal(ApprovalRefusal::Denied, &operation, true)
                                .await;
                        }
                        OperationState::Unknown
                            if operation.dispatched_at.is_some() && !self.policy.reexecute_safe =>
                        {
                            return self.uncertain(Uncertain::OutcomeUnknown, &operation).await;
                        }
                        OperationState::Unknown => {
                            // Never dispatched, or re-execution is safe: take over.
                            if let Reservation::Acquired {
                                operation, lease, ..
                            } = self
                                .store_call(
                                    StoreOp::Reserve,
                                    store.reserve(self.reserve_request(key.clone(), true, false)),
                                )
                                .await?
                            {
                                tracing::info!(
                                    execution_id = %operation.id,
                                    attempt = operation.attempts,
                                    "taking over an execution whose outcome is unknown (re-execution is safe)"
                                );
                                return Ok(Decision::Execute {
                                    operation: Box::new(operation),
                                    lease,
                                });
                            }
                        }
                        // `authorized` (another call is taking it right now) or `cancelled`
                        // (the next reservation takes it over): ask again.
                        _ => {}
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

    /// Waits until `deadline` for the undecided approval of the record under `key` to be
    /// decided (or to expire, or the record to change); `true` when it was. The store has
    /// no signal for a decision, so the record is looked at every [`APPROVAL_POLL`].
    async fn wait_for_decision(
        &self,
        key: &IdempotencyKey,
        deadline: Instant,
    ) -> Result<bool, StoreError> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep((deadline - now).min(APPROVAL_POLL)).await;
            let reading = self.config.store.get(&self.intent.actor, key);
            let current = self.store_call(StoreOp::Get, reading).await?;
            let undecided = current.is_some_and(|operation| {
                operation.state == OperationState::AwaitingApproval
                    && operation
                        .approval
                        .is_some_and(|approval| approval.state == ApprovalState::Pending)
            });
            if !undecided {
                return Ok(true);
            }
        }
    }

    async fn approval_refusal(
        &self,
        kind: ApprovalRefusal,
        operation: &Operation,
        attached: bool,
    ) -> Result<Decision, StoreError> {
        let Some(approval) = operation.approval.as_deref() else {
            return Err(StoreError::Backend(
                "an execution in an approval state has no approval".into(),
            ));
        };
        if attached {
            self.journal(Decided::Attached, operation);
            self.note_attached(operation).await;
        }
        let decision = match kind {
            ApprovalRefusal::Required => DecisionLabel::ApprovalRequired,
            ApprovalRefusal::Denied => DecisionLabel::ApprovalDenied,
            ApprovalRefusal::Expired => DecisionLabel::ApprovalExpired,
        };
        self.answer(
            &answer::approval(
                &self.call.id,
                kind,
                operation,
                approval,
                attached,
                self.config.status_tool.as_deref(),
                self.config.approvals_url.as_deref(),
            ),
            decision,
        )
    }

    async fn uncertain(
        &self,
        kind: Uncertain,
        operation: &Operation,
    ) -> Result<Decision, StoreError> {
        if let Uncertain::InProgress = kind {
            // An outcome-unknown refusal is not an event: the store's `unknown` is.
            self.journal(Decided::RefusedInProgress, operation);
        }
        self.note_attached(operation).await;
        let decision = match kind {
            Uncertain::InProgress => DecisionLabel::InProgress,
            Uncertain::OutcomeUnknown => DecisionLabel::Unknown,
        };
        self.answer(
            &answer::uncertain(
                &self.call.id,
                kind,
                operation,
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
    ) -> Result<(Response<McpBody>, DecisionLabel), S::Error>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResBody: Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        // The store journaled the attempt as `accepted` with the record's method and route;
        // the call's MCP correlation follows it.
        self.journal(Decided::Correlated, &operation);
        let store = Arc::clone(&self.config.store);
        let retention = self.policy.retention.max(self.policy.unknown_retention);
        if let Err(error) = attempt::note(
            &*store,
            &self.config.metrics.store,
            &operation,
            &self.call.id,
            retention,
        )
        .await
        {
            tracing::warn!(%error, execution_id = %operation.id, "could not record the attempt's JSON-RPC id");
        }
        let execution = Execution::new(
            Arc::clone(&store),
            lease,
            operation.attempts,
            self.policy.marks_dispatch,
            self.policy.lease,
        );
        tracing::info!(
            execution_id = %operation.id,
            jsonrpc_id = %self.call.id,
            tool = %self.intent.tool,
            attempt = operation.attempts,
            "tool call accepted as a new execution"
        );
        // Registered whatever the policy: a cancellation is matched to its call by session
        // and normalised id, then allowed by the call's caller and policy.
        let inflight = Some(self.config.inflight.enter(
            self.session.as_deref(),
            &self.call.id,
            Caller {
                actor: self.intent.actor.as_str().to_owned(),
                principal: self.principal.clone(),
                complete: self.policy.on_disconnect == OnDisconnect::Complete,
            },
        ));
        parts.extensions.insert(execution.clone());
        let request = Request::from_parts(parts, Full::new(bytes));
        let run = Run {
            id: self.call.id.clone(),
            execution,
            store,
            metrics: Arc::clone(&self.config.metrics),
            on_disconnect: self.policy.on_disconnect,
            response_limit: self.config.response_limit,
            inflight,
        };
        let decision = if operation.attempts > 1 {
            DecisionLabel::ReExecuted
        } else {
            DecisionLabel::Executed
        };
        Ok((drive(inner, request, run).await?, decision))
    }
}
