//! The metrics the layer emits, seen by a `DebuggingRecorder` installed for this thread
//! (a current-thread runtime, so the layer's own tasks run on it too).

use tower_idempotency_core::ApprovalStore;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::{Value, json};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency_core::metrics as names;
use tower_idempotency_core::{MemoryStore, Scope};
use tower_idempotency_mcp::metrics::{MCP_METHOD, OTHER_TOOL, TOOL_NAME};
use tower_idempotency_mcp::{McpIdempotencyLayer, ToolPolicy};

/// `(tool, decision) → count` of `idempotency.decisions`, and whether every such series
/// carries exactly the three labels.
fn decisions(snapshotter: &Snapshotter) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.kind() != MetricKind::Counter || key.key().name() != names::DECISIONS {
            continue;
        }
        let labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let names_only: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names_only,
            [MCP_METHOD, TOOL_NAME, names::DECISION],
            "low-cardinality labels only"
        );
        assert_eq!(labels[0].1, "tools/call");
        let DebugValue::Counter(n) = value else {
            panic!("a counter")
        };
        // Series registered at zero when the layer was built (see
        // `every_series_exists_at_zero_once_the_layer_is_built`) counted nothing.
        if n > 0 {
            out.push((labels[1].1.clone(), labels[2].1.clone(), n));
        }
    }
    out.sort();
    out
}

fn call(id: u64, tool: &str, arguments: Value) -> Request<Full<Bytes>> {
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": tool, "arguments": arguments}});
    let mut request = Request::post("/mcp")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    request.extensions_mut().insert(Scope::new("alice"));
    request
}

/// Alerts work before the first call: building the layer registers the in-flight gauge and
/// each configured tool's decision counters at zero (the approval decisions on tools with
/// approvals only).
#[test]
fn every_series_exists_at_zero_once_the_layer_is_built() {
    use tower_idempotency_core::ApprovalPolicy;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = service_fn(|_request: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let _service = McpIdempotencyLayer::new(MemoryStore::default())
        .with_tool("charge", ToolPolicy::guarded())
        .with_tool(
            "deploy",
            ToolPolicy::guarded().with_approval(ApprovalPolicy::always()),
        )
        .layer(server);
    let snapshot = snapshotter.snapshot().into_vec();
    assert!(
        snapshot.iter().any(
            |(key, _, _, value)| key.key().name() == names::OPERATIONS_IN_FLIGHT
                && *value == DebugValue::Gauge(0.0.into())
        ),
        "{snapshot:?}"
    );
    let registered = |tool: &str, decision: &str| {
        snapshot.iter().any(|(key, _, _, value)| {
            let labelled = |name: &str, wanted: &str| {
                key.key()
                    .labels()
                    .any(|l| l.key() == name && l.value() == wanted)
            };
            key.key().name() == names::DECISIONS
                && labelled(TOOL_NAME, tool)
                && labelled(names::DECISION, decision)
                && labelled(MCP_METHOD, "tools/call")
                && *value == DebugValue::Counter(0)
        })
    };
    let every = [
        "executed",
        "re_executed",
        "replayed",
        "waited",
        "conflict",
        "in_progress",
        "unknown",
        "rejected",
        "store_unavailable",
        "quota_exceeded",
        "passthrough",
    ];
    let approvals = ["approval_required", "approval_denied", "approval_expired"];
    for decision in every {
        assert!(registered("charge", decision), "{decision}: {snapshot:?}");
        assert!(registered("deploy", decision), "{decision}");
    }
    for decision in approvals {
        assert!(registered("deploy", decision), "{decision}");
        assert!(!registered("charge", decision), "{decision}");
    }
}

#[test]
fn a_fresh_call_counts_executed_and_its_retries_replayed_and_waited() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let runs = Arc::new(AtomicUsize::new(0));
        let server = {
            let runs = Arc::clone(&runs);
            service_fn(move |request: Request<Full<Bytes>>| {
                let runs = Arc::clone(&runs);
                async move {
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    let message: Value = serde_json::from_slice(&body).unwrap();
                    if message["params"]["name"] == "slow" {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let reply = json!({"jsonrpc": "2.0", "id": message["id"],
                                       "result": {"content": [], "structuredContent": {"run": run}}});
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(reply.to_string())))
                            .unwrap(),
                    )
                }
            })
        };
        let service = McpIdempotencyLayer::new(MemoryStore::default())
            .with_tool("charge", ToolPolicy::guarded())
            .with_tool("slow", ToolPolicy::guarded())
            .with_tool("list", ToolPolicy::read_only())
            .layer(server);
        let answer = |request| {
            let service = service.clone();
            async move {
                let response = service.oneshot(request).await.unwrap();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&body).unwrap()
            }
        };
        // A fresh call, then its retry under a new id while the answer was not delivered:
        // the stored result, counted `replayed`. The HTTP body is dropped unread, so the
        // first answer is never delivered.
        let first = service
            .clone()
            .oneshot(call(1, "charge", json!({"amount": 5})))
            .await
            .unwrap();
        drop(first);
        let retry = answer(call(2, "charge", json!({"amount": 5}))).await;
        assert_eq!(retry["result"]["_meta"]["dev.tower-idempotency/execution"]["replayed"], true);
        // A running call and a retry that attaches and waits for it: `waited`.
        let running = tokio::spawn(answer(call(3, "slow", json!({}))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let attached = answer(call(4, "slow", json!({}))).await;
        let running = running.await.unwrap();
        assert_eq!(
            attached["result"]["structuredContent"],
            running["result"]["structuredContent"]
        );
        // A read-only tool and an unconfigured one.
        answer(call(5, "list", json!({}))).await;
        answer(call(6, "made-up-name-1", json!({}))).await;
        answer(call(7, "made-up-name-2", json!({}))).await;
        assert_eq!(runs.load(Ordering::SeqCst), 5);
    });
    assert_eq!(
        decisions(&snapshotter),
        [
            (OTHER_TOOL.to_owned(), "executed".to_owned(), 2),
            ("charge".to_owned(), "executed".to_owned(), 1),
            ("charge".to_owned(), "replayed".to_owned(), 1),
            ("list".to_owned(), "passthrough".to_owned(), 1),
            ("slow".to_owned(), "executed".to_owned(), 1),
            ("slow".to_owned(), "waited".to_owned(), 1),
        ]
    );
    let snapshot = snapshotter.snapshot().into_vec();
    let durations = snapshot
        .iter()
        .filter(|(key, ..)| {
            key.kind() == MetricKind::Histogram && key.key().name() == names::REQUEST_DURATION
        })
        .count();
    assert_eq!(durations, 6, "one duration series per decision series");
    let in_flight = snapshot
        .iter()
        .find(|(key, ..)| key.key().name() == names::OPERATIONS_IN_FLIGHT)
        .map(|(.., value)| value);
    assert!(
        matches!(in_flight, Some(DebugValue::Gauge(n)) if n.into_inner() == 0.0),
        "every execution task ended"
    );
    // The layer's store calls are timed as the HTTP layer's are: the fresh calls reserved
    // and completed their executions, the attached one waited on one, the replay marked
    // its delivery. (The first snapshot drained the samples; the series stay.)
    for operation in ["reserve", "complete", "wait", "mark_delivered"] {
        assert!(
            snapshot.iter().any(|(key, ..)| {
                key.kind() == MetricKind::Histogram
                    && key.key().name() == names::STORE_DURATION
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == names::OPERATION && l.value() == operation)
            }),
            "{operation}: {snapshot:?}"
        );
    }
}

#[test]
fn approvals_count_required_denied_and_executed() {
    use tower_idempotency_core::{ApprovalDecision, ApprovalId, ApprovalPolicy};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = service_fn(|request: Request<Full<Bytes>>| async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap();
            let reply = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"content": []}});
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply.to_string())))
                    .unwrap(),
            )
        });
        let store = MemoryStore::default();
        let service = McpIdempotencyLayer::new(store.clone())
            .with_tool(
                "deploy",
                ToolPolicy::guarded().with_approval(ApprovalPolicy::always()),
            )
            .layer(server);
        let answer = |request| {
            let service = service.clone();
            async move {
                let response = service.oneshot(request).await.unwrap();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&body).unwrap()
            }
        };
        let content = |answer: &Value| answer["result"]["structuredContent"].clone();
        // Approved, then run.
        let first = content(&answer(call(1, "deploy", json!({"v": 1}))).await);
        let id: ApprovalId = first["approval_id"].as_str().unwrap().parse().unwrap();
        let fingerprint = tower_idempotency_core::Fingerprint::from_stored(
            first["fingerprint"].as_str().unwrap(),
        );
        let _ = store
            .decide_approval(
                &Scope::new("alice"),
                id,
                ApprovalDecision::Approve { fingerprint },
                "a",
            )
            .await
            .unwrap();
        answer(call(2, "deploy", json!({"v": 1}))).await;
        // Denied, then asked again.
        let other = content(&answer(call(3, "deploy", json!({"v": 2}))).await);
        let id: ApprovalId = other["approval_id"].as_str().unwrap().parse().unwrap();
        let _ = store
            .decide_approval(
                &Scope::new("alice"),
                id,
                ApprovalDecision::Deny {
                    reason: "no".into(),
                },
                "a",
            )
            .await
            .unwrap();
        answer(call(4, "deploy", json!({"v": 2}))).await;
    });
    assert_eq!(
        decisions(&snapshotter),
        [
            ("deploy".to_owned(), "approval_denied".to_owned(), 1),
            ("deploy".to_owned(), "approval_required".to_owned(), 2),
            ("deploy".to_owned(), "executed".to_owned(), 1),
        ]
    );
}
