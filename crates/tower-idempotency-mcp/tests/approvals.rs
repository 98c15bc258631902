//! Tool approvals through the layer in front of a scripted server, on the memory store:
//! the first call asks for an approval and runs nothing; re-calls of the same intent get
//! the same request until a person decides; after approval the call runs once; a denial
//! and an expiry are replayed; a changed call under the key is a mismatch. Decisions are
//! made through the store, as the approval routes do.

use tower_idempotency_core::ApprovalStore;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency_core::{
    ApprovalDecision, ApprovalId, ApprovalState, DecisionOutcome, Fingerprint, MemoryStore, Scope,
};
use tower_idempotency_mcp::{
    ApprovalPolicy, FINGERPRINT_MISMATCH_CODE, McpBody, McpIdempotencyLayer, ToolPolicy,
};

const EXECUTION: &str = "dev.tower-idempotency/execution";

/// A server whose tool runs take `delay`, counted when they start.
fn server(
    runs: Arc<AtomicUsize>,
    delay: Duration,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |request: Request<Full<Bytes>>| {
        let runs = Arc::clone(&runs);
        async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap();
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            let reply = json!({"jsonrpc": "2.0", "id": message["id"],
                "result": {"content": [{"type": "text", "text": "deployed"}],
                           "structuredContent": {"run": run}}});
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(reply.to_string())))
                    .unwrap(),
            )
        }
    })
}

fn layer(store: &MemoryStore, ttl: Duration) -> McpIdempotencyLayer {
    let approval = ApprovalPolicy::when(|arguments| arguments["environment"] == "production")
        .with_summary(|arguments| {
            json!({"operation": "deploy", "service": arguments["service"],
                   "environment": arguments["environment"], "version": arguments["version"]})
        })
        .with_ttl(ttl);
    McpIdempotencyLayer::new(store.clone())
        .with_principal(|parts| parts.extensions.get::<String>().cloned())
        .with_approvals_url("/approvals/")
        .with_tool("deploy", ToolPolicy::guarded().with_approval(approval))
}

fn deploy(version: &str, environment: &str) -> Value {
    json!({"service": "api", "version": version, "environment": environment})
}

/// One `tools/call` from `actor` (principal `user`), with an explicit key in `_meta` when
/// given; the JSON-RPC answer.
async fn call<S>(
    service: &S,
    actor: &str,
    id: u64,
    tool: &str,
    arguments: Value,
    key: Option<&str>,
) -> Value
where
    S: Service<Request<Full<Bytes>>, Response = Response<McpBody>, Error = Infallible> + Clone,
{
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(key) = key {
        params["_meta"] = json!({"dev.tower-idempotency/idempotency-key": key});
    }
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let mut request = Request::post("/mcp")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    request.extensions_mut().insert(Scope::new(actor));
    request.extensions_mut().insert("dana".to_owned());
    let response = service.clone().oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// The `structuredContent` of an `approval-*` tool error, asserting its kind.
#[track_caller]
fn refusal<'a>(answer: &'a Value, slug: &str) -> &'a Value {
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    let content = &result["structuredContent"];
    assert_eq!(
        content["type"],
        format!("https://tower-idempotency.dev/problems/{slug}"),
        "{answer}"
    );
    assert_eq!(
        result["_meta"][EXECUTION]["execution_id"], content["execution_id"],
        "{answer}"
    );
    content
}

fn approval_id(content: &Value) -> ApprovalId {
    content["approval_id"].as_str().unwrap().parse().unwrap()
}

async fn approve(store: &MemoryStore, actor: &str, content: &Value) -> DecisionOutcome {
    let fingerprint = Fingerprint::from_stored(content["fingerprint"].as_str().unwrap());
    store
        .decide_approval(
            &Scope::new(actor),
            approval_id(content),
            ApprovalDecision::Approve { fingerprint },
            "approver",
        )
        .await
        .unwrap()
        .expect("the approval is in the actor's scope")
}

async fn status<S>(service: &S, actor: &str, execution_id: &Value) -> Value
where
    S: Service<Request<Full<Bytes>>, Response = Response<McpBody>, Error = Infallible> + Clone,
{
    let answer = call(
        service,
        actor,
        900,
        "execution_status",
        json!({"execution_id": execution_id}),
        None,
    )
    .await;
    answer["result"]["structuredContent"].clone()
}

#[tokio::test]
async fn the_walk_with_a_key_required_then_approved_then_executed_once_then_replayed() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let service =
        layer(&store, ApprovalPolicy::DEFAULT_TTL).layer(server(Arc::clone(&runs), Duration::ZERO));
    let production = deploy("1.4.2", "production");

    let first = call(
        &service,
        "alice",
        1,
        "deploy",
        production.clone(),
        Some("d-1"),
    )
    .await;
    assert_eq!(first["id"], 1);
    let required = refusal(&first, "approval-required").clone();
    assert_eq!(required["state"], "awaiting_approval");
    assert_eq!(required["summary"]["version"], "1.4.2");
    assert!(required["expires_at"].is_string());
    assert_eq!(
        required["approval_url"],
        format!("/approvals/{}", required["approval_id"].as_str().unwrap())
    );
    assert!(
        required["fingerprint"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let text = first["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("approv") && text.contains("same arguments"),
        "{text}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool does not run");

    // The approval names the requesting principal and the summary.
    let approval = store
        .get_approval(&Scope::new("alice"), approval_id(&required))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approval.requested_by, "dana");
    assert_eq!(approval.state, ApprovalState::Pending);
    assert_eq!(approval.summary, required["summary"]);
    let record = status(&service, "alice", &required["execution_id"]).await;
    assert_eq!(record["state"], "awaiting_approval", "{record}");
    assert_eq!(record["approval"]["state"], "pending", "{record}");
    assert_eq!(record["attempts"], 0);

    // A re-call while undecided: the same request, nothing runs.
    let again = call(
        &service,
        "alice",
        2,
        "deploy",
        production.clone(),
        Some("d-1"),
    )
    .await;
    assert_eq!(again["id"], 2);
    assert_eq!(
        refusal(&again, "approval-required")["approval_id"],
        required["approval_id"]
    );
    // Changed arguments under the key: a mismatch, never the original arguments.
    let changed = call(
        &service,
        "alice",
        3,
        "deploy",
        deploy("6.6.6", "production"),
        Some("d-1"),
    )
    .await;
    assert_eq!(
        changed["error"]["code"], FINGERPRINT_MISMATCH_CODE,
        "{changed}"
    );
    assert_eq!(changed["error"]["data"]["state"], "awaiting_approval");
    assert!(!changed.to_string().contains("1.4.2"));
    // Another actor cannot decide it.
    assert!(
        store
            .decide_approval(
                &Scope::new("mallory"),
                approval_id(&required),
                ApprovalDecision::Deny {
                    reason: "no".into()
                },
                "mallory",
            )
            .await
            .unwrap()
            .is_none()
    );

    assert!(matches!(
        approve(&store, "alice", &required).await,
        DecisionOutcome::Decided(_)
    ));
    assert_eq!(
        status(&service, "alice", &required["execution_id"]).await["state"],
        "authorized"
    );
    let executed = call(
        &service,
        "alice",
        4,
        "deploy",
        production.clone(),
        Some("d-1"),
    )
    .await;
    assert_eq!(executed["id"], 4);
    assert_eq!(executed["result"]["isError"], Value::Null, "{executed}");
    assert_eq!(executed["result"]["structuredContent"]["run"], 1);
    let member = &executed["result"]["_meta"][EXECUTION];
    assert_eq!(member["execution_id"], required["execution_id"]);
    assert_eq!(member["replayed"], false);
    // Later retries replay without asking again.
    let replay = call(&service, "alice", 5, "deploy", production, Some("d-1")).await;
    assert_eq!(
        replay["result"]["_meta"][EXECUTION]["replayed"], true,
        "{replay}"
    );
    assert_eq!(replay["result"]["structuredContent"]["run"], 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = status(&service, "alice", &required["execution_id"]).await;
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["approval"]["state"], "approved", "{record}");
    assert_eq!(record["attempts"], 1);
}

#[tokio::test]
async fn keyless_recalls_attach_to_the_approval_and_then_to_the_authorized_execution() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let service =
        layer(&store, ApprovalPolicy::DEFAULT_TTL).layer(server(Arc::clone(&runs), Duration::ZERO));
    let production = deploy("2.0.0", "production");
    let first = call(&service, "alice", 1, "deploy", production.clone(), None).await;
    let required = refusal(&first, "approval-required").clone();
    // A re-call of the same intent is the same request, not a new prompt.
    let again = call(&service, "alice", 2, "deploy", production.clone(), None).await;
    assert_eq!(
        refusal(&again, "approval-required")["approval_id"],
        required["approval_id"]
    );
    assert_eq!(again["result"]["_meta"][EXECUTION]["attached"], true);
    assert_eq!(
        store
            .list_approvals(&Scope::new("alice"), Some(ApprovalState::Pending), None, 10)
            .await
            .unwrap()
            .len(),
        1,
        "one approval request for one intent"
    );
    assert!(matches!(
        approve(&store, "alice", &required).await,
        DecisionOutcome::Decided(_)
    ));
    let executed = call(&service, "alice", 3, "deploy", production.clone(), None).await;
    assert_eq!(
        executed["result"]["structuredContent"]["run"], 1,
        "{executed}"
    );
    assert_eq!(
        executed["result"]["_meta"][EXECUTION]["execution_id"], required["execution_id"],
        "the authorized execution, not a new one"
    );
    // Once delivered, an identical call is a new intent: it needs its own approval.
    let id = required["execution_id"].clone();
    for _ in 0..1000 {
        if status(&service, "alice", &id).await["delivered"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let repeat = call(&service, "alice", 4, "deploy", production, None).await;
    let second = refusal(&repeat, "approval-required");
    assert_ne!(second["approval_id"], required["approval_id"]);
    assert_ne!(second["execution_id"], required["execution_id"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Staging needs no approval.
    let staging = call(
        &service,
        "alice",
        5,
        "deploy",
        deploy("2.0.0", "staging"),
        None,
    )
    .await;
    assert_eq!(
        staging["result"]["structuredContent"]["run"], 2,
        "{staging}"
    );
}

#[tokio::test]
async fn a_denial_is_replayed_never_a_new_prompt() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let service =
        layer(&store, ApprovalPolicy::DEFAULT_TTL).layer(server(Arc::clone(&runs), Duration::ZERO));
    let production = deploy("3.0.0", "production");
    for key in [Some("deny-1"), None] {
        let first = call(&service, "alice", 1, "deploy", production.clone(), key).await;
        let required = refusal(&first, "approval-required").clone();
        let denied = store
            .decide_approval(
                &Scope::new("alice"),
                approval_id(&required),
                ApprovalDecision::Deny {
                    reason: "freeze until Monday".into(),
                },
                "approver",
            )
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(denied, DecisionOutcome::Decided(_)));
        for id in [2, 3] {
            let answer = call(&service, "alice", id, "deploy", production.clone(), key).await;
            let content = refusal(&answer, "approval-denied");
            assert_eq!(content["approval_id"], required["approval_id"]);
            assert_eq!(content["reason"], "freeze until Monday");
            assert_eq!(content["state"], "denied");
            let text = answer["result"]["content"][0]["text"].as_str().unwrap();
            assert!(text.contains("freeze until Monday"), "{text}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_expired_request_and_an_approval_not_used_in_time_are_expired() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let ttl = Duration::from_millis(300);
    let service = layer(&store, ttl).layer(server(Arc::clone(&runs), Duration::ZERO));
    // Undecided past its expiry.
    let production = deploy("4.0.0", "production");
    let first = call(
        &service,
        "alice",
        1,
        "deploy",
        production.clone(),
        Some("exp-1"),
    )
    .await;
    let required = refusal(&first, "approval-required").clone();
    tokio::time::sleep(ttl * 2).await;
    let late = call(
        &service,
        "alice",
        2,
        "deploy",
        production.clone(),
        Some("exp-1"),
    )
    .await;
    assert_eq!(
        refusal(&late, "approval-expired")["approval_id"],
        required["approval_id"]
    );
    assert!(matches!(
        approve(&store, "alice", &required).await,
        DecisionOutcome::Expired(_)
    ));
    // Approved, then not used before its expiry.
    let production = deploy("4.0.1", "production");
    let first = call(
        &service,
        "alice",
        3,
        "deploy",
        production.clone(),
        Some("exp-2"),
    )
    .await;
    let required = refusal(&first, "approval-required").clone();
    assert!(matches!(
        approve(&store, "alice", &required).await,
        DecisionOutcome::Decided(_)
    ));
    tokio::time::sleep(ttl * 2).await;
    let late = call(&service, "alice", 4, "deploy", production, Some("exp-2")).await;
    refusal(&late, "approval-expired");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_recalls_after_approval_execute_once() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer(&store, ApprovalPolicy::DEFAULT_TTL)
        .layer(server(Arc::clone(&runs), Duration::from_millis(300)));
    let production = deploy("5.0.0", "production");
    for key in [Some("race-1"), None] {
        let before = runs.load(Ordering::SeqCst);
        let first = call(&service, "alice", 1, "deploy", production.clone(), key).await;
        let required = refusal(&first, "approval-required").clone();
        assert!(matches!(
            approve(&store, "alice", &required).await,
            DecisionOutcome::Decided(_)
        ));
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut calls = tokio::task::JoinSet::new();
        for id in 0..8u64 {
            let (service, barrier, production) =
                (service.clone(), Arc::clone(&barrier), production.clone());
            let key = key.map(str::to_owned);
            calls.spawn(async move {
                barrier.wait().await;
                call(
                    &service,
                    "alice",
                    100 + id,
                    "deploy",
                    production,
                    key.as_deref(),
                )
                .await
            });
        }
        while let Some(answer) = calls.join_next().await {
            let answer = answer.unwrap();
            assert_eq!(answer["result"]["isError"], Value::Null, "{answer}");
            assert_eq!(
                answer["result"]["_meta"][EXECUTION]["execution_id"],
                required["execution_id"]
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), before + 1, "one execution");
    }
}

#[tokio::test]
async fn the_requester_defaults_to_the_actor() {
    let store = MemoryStore::default();
    let service = McpIdempotencyLayer::new(store.clone())
        .with_tool(
            "deploy",
            ToolPolicy::guarded().with_approval(ApprovalPolicy::always()),
        )
        .layer(server(Arc::default(), Duration::ZERO));
    let answer = call(&service, "alice", 1, "deploy", json!({"v": 1}), None).await;
    let content = refusal(&answer, "approval-required");
    // The default summary is the validated arguments; no approvals URL is configured.
    assert_eq!(content["summary"], json!({"v": 1}));
    assert!(content.get("approval_url").is_none(), "{content}");
    let approval = store
        .get_approval(&Scope::new("alice"), approval_id(content))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approval.requested_by, "alice");
}

/// A store that keeps no approvals (a base store: no capabilities declared) is refused when
/// the layer is built, so no tool call can ever run a command that needs approval
/// unapproved; over a store chosen by type the compiler refuses it.
#[test]
fn a_store_without_approvals_is_refused_when_the_layer_is_built() {
    let store: Arc<dyn tower_idempotency_core::Store> =
        Arc::new(test_harness::stores::HookedStore::default());
    let Err(missing) = McpIdempotencyLayer::from_arc(store) else {
        panic!("a base store served the MCP layer");
    };
    assert!(
        matches!(
            missing.capability,
            tower_idempotency_core::Capability::DerivedMatching
                | tower_idempotency_core::Capability::Dispatch
                | tower_idempotency_core::Capability::Approvals
        ),
        "{missing}"
    );
    // The memory store declares all three.
    let memory: Arc<dyn tower_idempotency_core::Store> = Arc::new(MemoryStore::default());
    assert!(McpIdempotencyLayer::from_arc(memory).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_waits_for_the_decision_within_the_approval_wait() {
    let store = MemoryStore::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = McpIdempotencyLayer::new(store.clone())
        .with_tool(
            "deploy",
            ToolPolicy::guarded()
                .with_approval(ApprovalPolicy::always().with_wait(Duration::from_secs(20))),
        )
        .layer(server(Arc::clone(&runs), Duration::ZERO));
    let arguments = deploy("6.0.0", "production");
    // The first call asks, and does not wait.
    let first = call(
        &service,
        "alice",
        1,
        "deploy",
        arguments.clone(),
        Some("w-1"),
    )
    .await;
    let required = refusal(&first, "approval-required").clone();
    // The re-call waits; a person approves meanwhile; the re-call runs the tool.
    let approver = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            approve(&store, "alice", &required).await
        })
    };
    let started = std::time::Instant::now();
    let executed = call(&service, "alice", 2, "deploy", arguments, Some("w-1")).await;
    assert!(matches!(
        approver.await.unwrap(),
        DecisionOutcome::Decided(_)
    ));
    assert_eq!(
        executed["result"]["structuredContent"]["run"], 1,
        "{executed}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
