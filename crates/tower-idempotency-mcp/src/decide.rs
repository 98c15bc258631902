//! The MCP adapter of the protocol engine (`tower_idempotency_core::protocol`) for one
//! guarded `tools/call`: the call becomes an [`Attempt`], the engine's decision a tool
//! result — a new execution, the stored result, an attach to the running execution
//! (bounded wait), a take-over of one nobody drives, or a refusal — and the accepted
//! execution runs.
//!
//! Every decision is made from the execution record; the JSON-RPC id only addresses the
//! answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tower::Service;
use tower_idempotency_core::audit::{AuditEventKind, Correlation};
use tower_idempotency_core::protocol::{
    Acquired, ApprovalRefusal, Attempt, Next, NotReserved, Refusal, ReserveMode, Reserved, Waits,
};
use tower_idempotency_core::{
    ApprovalPolicy, ApprovalRequest, Execution, IdempotencyKey, Lease, Operation, ReserveRequest,
    problem_types,
};

use crate::answer::{self, Uncertain};
use crate::drive::{Run, drive};
use crate::inflight::Caller;
use crate::intent::Intent;
use crate::jsonrpc::ToolCall;
use crate::layer::Config;
use crate::metrics::DecisionLabel;
use crate::policy::{OnDisconnect, ToolPolicy};
use crate::{BoxError, McpBody};
use crate::{attach, attempt};

/// Where the key of a call came from, or that there is none.
#[derive(Debug)]
pub(crate) enum Carrier {
    Explicit(IdempotencyKey),
    Derived,
}

/// The answer to a refusal of the protocol that is not about an execution, and its decision
/// label: `500 approvals-unsupported` for a store that ignored an approval, `429
/// scope-quota-exceeded` with `Retry-After` for an actor at its quota (as the HTTP layer
/// answers), `503 store-unavailable` otherwise. The tool is not run.
pub(crate) fn store_refusal(refusal: &Refusal) -> (Response<McpBody>, DecisionLabel) {
    let (status, detail) = match refusal {
        Refusal::ApprovalsUnsupported => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the idempotency store does not support approvals; the tool was not run",
        ),
        Refusal::QuotaExceeded { .. } => (
            StatusCode::TOO_MANY_REQUESTS,
            "this actor's idempotency quota is exhausted; the tool was not run",
        ),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the idempotency store is unavailable; the tool was not run",
        ),
    };
    // A full store answers as an unavailable one, as it always has on tool calls.
    let slug = match refusal {
        Refusal::StoreFull => problem_types::STORE_UNAVAILABLE,
        refusal => refusal.slug(),
    };
    let mut response = answer::problem(status, slug, detail);
    if let Refusal::QuotaExceeded { retry_after } = refusal {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(*retry_after),
        );
    }
    (response, refusal.label())
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
    /// The protocol attempt of this call: its key (explicit or derived from the intent), a
    /// derived key's replacement of a delivered execution past the tool's attach window, its
    /// waits and its MCP correlation.
    pub(crate) fn attempt(&self) -> Attempt {
        let request = ReserveRequest {
            scope: self.intent.actor.clone(),
            key: self.key(),
            fingerprint: self.intent.fingerprint.clone(),
            method: "tools/call".to_owned(),
            route: self.intent.tool.clone(),
            lease: self.policy.lease,
            retention: self.policy.retention,
            unknown_retention: self.policy.unknown_retention,
            take_over_unknown: false,
            marks_dispatch: self.policy.marks_dispatch,
            approval: self.approval.clone(),
            // Derived matching always says so: a store may answer other requests from what
            // it remembers of completed records, which cannot tell one execution of an
            // intent from the next.
            replace_delivered: matches!(self.carrier, Carrier::Derived)
                .then_some(self.policy.attach_window),
        };
        let waits = Waits {
            in_progress: self.policy.wait,
            decision: self
                .policy
                .approval
                .as_ref()
                .map_or(Duration::ZERO, ApprovalPolicy::wait),
            lease: self.policy.lease,
        };
        Attempt::new(request, waits, self.policy.reexecute_safe)
            .with_correlation(Correlation::Mcp {
                tool: self.call.name.clone(),
                jsonrpc_id: self.call.id.to_string(),
                session: self.session.clone(),
            })
            .with_principal(self.principal.clone())
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

    /// The protocol's rounds for this call, each one reservation: a new execution, the
    /// stored result, an attach to the running execution, or a refusal.
    pub(crate) async fn decide(&self, attempt: &mut Attempt) -> Decision {
        let engine = &self.config.engine;
        loop {
            let operation = match engine
                .reserve(attempt, ReserveMode::default(), &self.config.metrics.store)
                .await
            {
                Ok(Reserved::Acquired(Acquired {
                    operation,
                    lease,
                    takeover,
                    ..
                })) => {
                    if takeover {
                        tracing::info!(execution_id = %operation.id, attempt = operation.attempts, "taking over an execution nobody drives");
                    }
                    return Decision::Execute { operation, lease };
                }
                Ok(Reserved::ApprovalRequested(operation)) => {
                    tracing::info!(
                        execution_id = %operation.id,
                        jsonrpc_id = %self.call.id,
                        tool = %self.intent.tool,
                        "tool call awaits a person's approval"
                    );
                    return self
                        .approval_refusal(attempt, ApprovalRefusal::Required, &operation, false)
                        .await;
                }
                Ok(Reserved::Existing(operation)) => operation,
                // Tool calls never fail open.
                Err(NotReserved::FailOpen) => {
                    return self.refused(Refusal::StoreUnavailable, attempt).await;
                }
                Err(NotReserved::Refused(refusal)) => return self.refused(refusal, attempt).await,
            };
            match engine
                .settle(attempt, *operation, &self.config.metrics.store)
                .await
            {
                Next::Replay { operation, waited } => {
                    tracing::info!(
                        execution_id = %operation.id,
                        jsonrpc_id = %self.call.id,
                        tool = %self.intent.tool,
                        attached = waited,
                        "tool call answered with the stored result"
                    );
                    self.note_attached(&operation).await;
                    return match answer::replay(&operation, &self.call.id, waited) {
                        Some(message) => {
                            engine.replayed(attempt, operation.id);
                            Decision::Answer(
                                self.delivering(&message, &operation),
                                if waited {
                                    DecisionLabel::Waited
                                } else {
                                    DecisionLabel::Replayed
                                },
                            )
                        }
                        None => self.uncertain(Uncertain::OutcomeUnknown, &operation).await,
                    };
                }
                Next::Again => {}
                Next::Refuse(refusal) => return self.refused(refusal, attempt).await,
            }
        }
    }

    async fn refused(&self, refusal: Refusal, attempt: &Attempt) -> Decision {
        match refusal {
            Refusal::Conflict(operation) => Decision::Answer(
                answer::json_response(&answer::mismatch(&self.call.id, &operation)),
                DecisionLabel::Conflict,
            ),
            Refusal::InProgress { operation, .. } => {
                self.uncertain(Uncertain::InProgress, &operation).await
            }
            Refusal::OutcomeUnknown(operation) => {
                self.uncertain(Uncertain::OutcomeUnknown, &operation).await
            }
            Refusal::Approval {
                kind,
                operation,
                attached,
            } => {
                self.approval_refusal(attempt, kind, &operation, attached)
                    .await
            }
            refusal => {
                let (response, label) = store_refusal(&refusal);
                Decision::Answer(response, label)
            }
        }
    }

    async fn approval_refusal(
        &self,
        attempt: &Attempt,
        kind: ApprovalRefusal,
        operation: &Operation,
        attached: bool,
    ) -> Decision {
        let Some(approval) = operation.approval.as_deref() else {
            let (response, label) = store_refusal(&Refusal::ApprovalsUnsupported);
            return Decision::Answer(response, label);
        };
        if attached {
            self.config
                .engine
                .journal(attempt, Some(operation.id), |correlation| {
                    AuditEventKind::Attached {
                        correlation: Some(correlation),
                    }
                });
            self.note_attached(operation).await;
        }
        let decision = match kind {
            ApprovalRefusal::Required => DecisionLabel::ApprovalRequired,
            ApprovalRefusal::Denied => DecisionLabel::ApprovalDenied,
            ApprovalRefusal::Expired => DecisionLabel::ApprovalExpired,
        };
        let message = answer::approval(
            &self.call.id,
            kind,
            operation,
            approval,
            attached,
            self.config.status_tool.as_deref(),
            self.config.approvals_url.as_deref(),
        );
        Decision::Answer(answer::json_response(&message), decision)
    }

    /// An answer about an execution that is still running or whose outcome is unknown (the
    /// engine journaled the in-progress refusal; an outcome-unknown refusal is not an event:
    /// the store's `unknown` is).
    async fn uncertain(&self, kind: Uncertain, operation: &Operation) -> Decision {
        self.note_attached(operation).await;
        let decision = match kind {
            Uncertain::InProgress => DecisionLabel::InProgress,
            Uncertain::OutcomeUnknown => DecisionLabel::Unknown,
        };
        let message = answer::uncertain(
            &self.call.id,
            kind,
            operation,
            self.config.status_tool.as_deref(),
        );
        Decision::Answer(answer::json_response(&message), decision)
    }

    pub(crate) async fn execute<S, ResBody>(
        &self,
        attempt: &Attempt,
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
        self.config.engine.correlated(attempt, &operation);
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
