//! Approvals in the layer over the memory store, driven with `tower::ServiceExt::oneshot`:
//! a command that needs approval is refused until a person approved its exact fingerprint,
//! then runs once; denials and expiry are answered from the record; the approvals routes
//! decide atomically, for their own scope only. (The same walk over real HTTP against the
//! demo, on both stores, is in the workspace `tests` package.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::routing::post;
use http::{Request, Response, StatusCode};
use serde_json::{Value, json};
use test_harness::stores::HookedStore;
use tower::ServiceExt;
use tower_idempotency::{
    ApprovalPolicy, Capability, ConfigError, IdempotencyLayer, MemoryStore, RoutePolicy, Scope,
    Store, StoreError,
};

const PRODUCTION: &str = r#"{"service":"api","environment":"production","version":"1.4.2"}"#;
const STAGING: &str = r#"{"service":"api","environment":"staging","version":"1.4.2"}"#;

fn deploy_approval() -> ApprovalPolicy {
    ApprovalPolicy::when(|command| command["environment"] == "production").with_summary(|command| {
        json!({
            "operation": "deploy",
            "service": command["service"],
            "environment": command["environment"],
            "version": command["version"],
            "reversible": true,
        })
    })
}

/// `/v1/deploys` behind the layer with `approval`, the status and approvals routes; the
/// account is `x-account`, the requester `x-user`, and the approver `x-approver`.
fn app(store: impl Store, approval: ApprovalPolicy) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let header = |name: &'static str| {
        move |parts: &http::request::Parts| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        }
    };
    let layer = IdempotencyLayer::new(store)
        .with_scope(move |parts| header("x-account")(parts).map(Scope::new))
        .with_principal(header("x-user"))
        .with_approver(header("x-approver"))
        .with_default_policy(RoutePolicy::required().with_approval(approval))
        .expect("the store has what the policy needs");
    let router = Router::new()
        .route(
            "/v1/deploys",
            post(move |body: String| {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("deploy {n}: {body}")) }
            }),
        )
        .route_layer(layer.clone())
        .merge(layer.status_router())
        .merge(layer.approvals_router());
    (router, runs)
}

fn deploy(key: &str, body: &str) -> Request<Body> {
    Request::post("/v1/deploys")
        .header("content-type", "application/json")
        .header("x-account", "acme")
        .header("x-user", "agent")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn get(path: &str, account: &str) -> Request<Body> {
    Request::get(path)
        .header("x-account", account)
        .body(Body::empty())
        .unwrap()
}

fn decide(path: &str, account: &str, approver: Option<&str>, body: Value) -> Request<Body> {
    let mut builder = Request::post(path)
        .header("content-type", "application/json")
        .header("x-account", account);
    if let Some(approver) = approver {
        builder = builder.header("x-approver", approver);
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value, Response<()>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, usize::MAX).await.unwrap();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (parts.status, json, Response::from_parts(parts, ()))
}

fn slug(problem: &Value) -> &str {
    problem["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_command_that_needs_approval_runs_once_after_its_exact_fingerprint_is_approved() {
    let (app, runs) = app(MemoryStore::default(), deploy_approval());

    // Another command on the route does not need approval.
    let (status, _, _) = send(&app, deploy("k-staging", STAGING)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let (status, required, response) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{required}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(slug(&required), "approval-required");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler did not run");
    let approval_id = required["approval_id"].as_str().unwrap().to_owned();
    let operation_id = required["operation_id"].as_str().unwrap().to_owned();
    let fingerprint = required["fingerprint"].as_str().unwrap().to_owned();
    assert!(fingerprint.starts_with("sha256:"), "{fingerprint}");
    assert_eq!(
        required["approval_url"],
        format!("/approvals/{approval_id}")
    );
    assert_eq!(
        required["status_url"],
        format!("/operations/{operation_id}")
    );
    assert_eq!(required["summary"]["environment"], "production");
    assert_eq!(required["summary"]["reversible"], true);
    assert!(required["expires_at"].as_str().unwrap().ends_with('Z'));

    // Undecided: the retry gets the same approval, not a new one.
    let (status, again, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(
        (status, slug(&again)),
        (StatusCode::FORBIDDEN, "approval-required")
    );
    assert_eq!(again["approval_id"], approval_id.as_str());

    let (status, record, _) = send(&app, get("/operations?idempotency_key=k-1", "acme")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(record["state"], "awaiting_approval");
    assert_eq!(record["approval"]["approval_id"], approval_id.as_str());
    assert_eq!(record["approval"]["state"], "pending");

    let (status, listed, _) = send(&app, get("/approvals?state=pending", "acme")).await;
    assert_eq!(status, StatusCode::OK);
    let listed = listed["approvals"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1);
    let shown = &listed[0];
    assert_eq!(shown["approval_id"], approval_id.as_str());
    assert_eq!(shown["operation_id"], operation_id.as_str());
    assert_eq!(shown["state"], "pending");
    assert_eq!(shown["fingerprint"], fingerprint.as_str());
    assert_eq!(shown["requested_by"], "agent");
    assert_eq!(shown["summary"], required["summary"]);
    assert_eq!(shown["decided_by"], Value::Null);

    let path = format!("/approvals/{approval_id}");
    let approve = format!("{path}/approve");
    // A stale fingerprint (of another command) does not approve this one.
    let stale = json!({"fingerprint": format!("sha256:{}", "0".repeat(64))});
    let (status, problem, _) = send(&app, decide(&approve, "acme", Some("alice"), stale)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "approval-fingerprint-mismatch")
    );
    // The requester cannot approve their own request.
    let exact = json!({"fingerprint": fingerprint});
    let (status, problem, _) =
        send(&app, decide(&approve, "acme", Some("agent"), exact.clone())).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::FORBIDDEN, "self-approval-forbidden")
    );
    // Nobody else but an approver.
    let (status, problem, _) = send(&app, decide(&approve, "acme", None, exact.clone())).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::FORBIDDEN, "not-an-approver")
    );

    let (status, approved, _) =
        send(&app, decide(&approve, "acme", Some("alice"), exact.clone())).await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["state"], "approved");
    assert_eq!(approved["decided_by"], "alice");
    assert!(approved["decided_at"].is_string());
    // Repeating the decision that won answers it again; the opposite one is refused.
    let (status, repeated, _) = send(&app, decide(&approve, "acme", Some("bob"), exact)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(repeated["decided_by"], "alice", "the first decision stands");
    let (status, problem, _) = send(
        &app,
        decide(
            &format!("{path}/deny"),
            "acme",
            Some("bob"),
            json!({"reason": "no"}),
        ),
    )
    .await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "approval-decided")
    );
    assert_eq!(problem["state"], "approved");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "deciding runs nothing");

    // A changed command under the key is a conflict as always.
    let changed = PRODUCTION.replace("1.4.2", "1.4.3");
    let (status, problem, _) = send(&app, deploy("k-1", &changed)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "fingerprint-mismatch")
    );

    // The retry of the approved command runs the handler, once; then it replays.
    let (status, body, response) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(response.headers()["operation-id"], operation_id.as_str());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let (status, replay, response) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(replay, body);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let (_, record, _) = send(&app, get(&format!("/operations/{operation_id}"), "acme")).await;
    assert_eq!(record["state"], "completed");
    assert_eq!(record["approval"]["state"], "approved");
    let (_, pending, _) = send(&app, get("/approvals?state=pending", "acme")).await;
    assert_eq!(pending["approvals"], json!([]));

    // The same command under a new key needs a new approval.
    let (status, fresh, _) = send(&app, deploy("k-2", PRODUCTION)).await;
    assert_eq!(
        (status, slug(&fresh)),
        (StatusCode::FORBIDDEN, "approval-required")
    );
    assert_ne!(fresh["approval_id"], approval_id.as_str());
    assert_eq!(
        fresh["fingerprint"],
        fingerprint.as_str(),
        "same command, same fingerprint"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_denial_is_the_answer_to_every_retry() {
    let (app, runs) = app(MemoryStore::default(), deploy_approval());
    let (_, required, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    let deny = format!(
        "/approvals/{}/deny",
        required["approval_id"].as_str().unwrap()
    );
    let (status, problem, _) = send(&app, decide(&deny, "acme", Some("alice"), json!({}))).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-command"),
        "a denial needs a reason"
    );
    let reason = json!({"reason": "  not during the freeze "});
    let (status, denied, _) = send(&app, decide(&deny, "acme", Some("alice"), reason)).await;
    assert_eq!(status, StatusCode::OK, "{denied}");
    assert_eq!(denied["state"], "denied");
    assert_eq!(denied["reason"], "not during the freeze");

    for _ in 0..2 {
        let (status, problem, _) = send(&app, deploy("k-1", PRODUCTION)).await;
        assert_eq!(
            (status, slug(&problem)),
            (StatusCode::FORBIDDEN, "approval-denied")
        );
        assert_eq!(problem["reason"], "not during the freeze");
        assert_eq!(problem["approval_id"], required["approval_id"]);
    }
    let (_, record, _) = send(&app, get("/operations?idempotency_key=k-1", "acme")).await;
    assert_eq!(record["state"], "denied");
    let approve = deny.replace("/deny", "/approve");
    let exact = json!({"fingerprint": required["fingerprint"]});
    let (status, problem, _) = send(&app, decide(&approve, "acme", Some("bob"), exact)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "approval-decided")
    );
    assert_eq!(problem["state"], "denied");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_approval_expires_undecided_and_unused() {
    let ttl = Duration::from_millis(150);
    let (app, runs) = app(MemoryStore::default(), deploy_approval().with_ttl(ttl));

    // Not decided in time.
    let (_, undecided, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    tokio::time::sleep(ttl * 2).await;
    let (status, problem, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::FORBIDDEN, "approval-expired")
    );
    let approve = format!(
        "/approvals/{}/approve",
        undecided["approval_id"].as_str().unwrap()
    );
    let exact = json!({"fingerprint": undecided["fingerprint"]});
    let (status, problem, _) = send(&app, decide(&approve, "acme", Some("alice"), exact)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::FORBIDDEN, "approval-expired")
    );
    let (_, expired, _) = send(&app, get("/approvals?state=expired", "acme")).await;
    assert_eq!(expired["approvals"].as_array().unwrap().len(), 1);

    // Approved in time, not used in time.
    let (_, unused, _) = send(&app, deploy("k-2", PRODUCTION)).await;
    let approve = format!(
        "/approvals/{}/approve",
        unused["approval_id"].as_str().unwrap()
    );
    let exact = json!({"fingerprint": unused["fingerprint"]});
    let (status, _, _) = send(&app, decide(&approve, "acme", Some("alice"), exact)).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(ttl * 2).await;
    let (status, problem, _) = send(&app, deploy("k-2", PRODUCTION)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::FORBIDDEN, "approval-expired")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_retry_waits_for_the_decision_within_the_policy_s_bound() {
    let policy = deploy_approval().with_wait(Duration::from_secs(20));
    let (app, runs) = app(MemoryStore::default(), policy);
    let (_, required, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { send(&app, deploy("k-1", PRODUCTION)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the retry waits for a decision");
    let approve = format!(
        "/approvals/{}/approve",
        required["approval_id"].as_str().unwrap()
    );
    let exact = json!({"fingerprint": required["fingerprint"]});
    let (status, _, _) = send(&app, decide(&approve, "acme", Some("alice"), exact)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body, _) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn self_approval_is_allowed_where_the_policy_says_so() {
    let (app, runs) = app(
        MemoryStore::default(),
        deploy_approval().with_self_approval(true),
    );
    let (_, required, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    let approve = format!(
        "/approvals/{}/approve",
        required["approval_id"].as_str().unwrap()
    );
    let exact = json!({"fingerprint": required["fingerprint"]});
    let (status, approved, _) = send(&app, decide(&approve, "acme", Some("agent"), exact)).await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["decided_by"], "agent");
    let (status, _, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn another_scope_sees_no_approval_and_bad_requests_are_precise() {
    let (app, _) = app(MemoryStore::default(), deploy_approval());
    let (_, required, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    let path = format!("/approvals/{}", required["approval_id"].as_str().unwrap());
    let exact = json!({"fingerprint": required["fingerprint"]});

    let (status, listed, _) = send(&app, get("/approvals", "globex")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["approvals"], json!([]));
    let (status, problem, _) = send(&app, get(&path, "globex")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::NOT_FOUND, "approval-not-found")
    );
    for verb in ["approve", "deny"] {
        let body = if verb == "approve" {
            exact.clone()
        } else {
            json!({"reason": "r"})
        };
        let request = decide(&format!("{path}/{verb}"), "globex", Some("alice"), body);
        let (status, problem, _) = send(&app, request).await;
        assert_eq!(
            (status, slug(&problem)),
            (StatusCode::NOT_FOUND, "approval-not-found"),
            "{verb}"
        );
    }
    // Not an approval id at all.
    let (status, problem, _) = send(&app, get("/approvals/not-a-uuid", "acme")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::NOT_FOUND, "approval-not-found")
    );
    // No scope.
    let anonymous = Request::get("/approvals").body(Body::empty()).unwrap();
    let (status, problem, _) = send(&app, anonymous).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNAUTHORIZED, "missing-scope")
    );
    // Bad queries and bodies.
    let (status, problem, _) = send(&app, get("/approvals?state=maybe", "acme")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::BAD_REQUEST, "invalid-query")
    );
    let (status, problem, _) = send(&app, get("/approvals?limit=0", "acme")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::BAD_REQUEST, "invalid-query")
    );
    let approve = format!("{path}/approve");
    for (body, want) in [
        (json!({"fingerprint": 7}), "invalid-command"),
        (json!({"fingerprint": " "}), "invalid-command"),
        (
            json!({"fingerprint": "sha256:x", "reason": "ok"}),
            "invalid-command",
        ),
        (json!(["sha256:x"]), "invalid-command"),
    ] {
        let (status, problem, _) = send(&app, decide(&approve, "acme", Some("alice"), body)).await;
        assert_eq!(
            (status, slug(&problem)),
            (StatusCode::UNPROCESSABLE_ENTITY, want)
        );
    }
    let broken = Request::post(&approve)
        .header("content-type", "application/json")
        .header("x-account", "acme")
        .header("x-approver", "alice")
        .body(Body::from(r#"{"fingerprint": "a", "fingerprint": "b"}"#))
        .unwrap();
    let (status, problem, _) = send(&app, broken).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-json")
    );
    let form = Request::post(&approve)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-account", "acme")
        .header("x-approver", "alice")
        .body(Body::from("fingerprint=x"))
        .unwrap();
    let (status, problem, _) = send(&app, form).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type")
    );
    // Still pending after all that.
    let (_, shown, _) = send(&app, get(&path, "acme")).await;
    assert_eq!(shown["state"], "pending");
}

/// A store without approvals (a base store: it declares no capability) is refused when a
/// policy that requires approval is set — no request ever meets it — while policies that need
/// nothing are taken; its approvals routes answer `500 approvals-unsupported`.
#[tokio::test]
async fn a_policy_that_needs_approvals_is_refused_over_a_store_without_them() {
    let policy = RoutePolicy::required().with_approval(deploy_approval());
    let refused = IdempotencyLayer::new(HookedStore::default()).with_route_policy(
        http::Method::POST,
        "/v1/deploys",
        policy.clone(),
    );
    match refused {
        Err(ConfigError::MissingCapability { route, capability }) => {
            assert_eq!(route.as_deref(), Some("POST /v1/deploys"));
            assert_eq!(capability, Capability::Approvals);
        }
        other => panic!(
            "a policy that needs approvals was taken: {:?}",
            other.map(|_| ())
        ),
    }
    assert!(matches!(
        IdempotencyLayer::new(HookedStore::default()).with_default_policy(policy.clone()),
        Err(ConfigError::MissingCapability {
            route: None,
            capability: Capability::Approvals
        })
    ));
    // Transactions, likewise: the memory store has none.
    assert!(matches!(
        IdempotencyLayer::new(MemoryStore::default()).with_route_policy(
            http::Method::POST,
            "/v1/deploys",
            RoutePolicy::transactional()
        ),
        Err(ConfigError::MissingCapability {
            capability: Capability::Transactions,
            ..
        })
    ));
    // The memory store keeps approvals; a policy that needs nothing is taken by any store.
    assert!(
        IdempotencyLayer::new(MemoryStore::default())
            .with_route_policy(http::Method::POST, "/v1/deploys", policy)
            .is_ok()
    );
    let layer = IdempotencyLayer::new(HookedStore::default())
        .with_scope(|parts| {
            let account = parts.headers.get("x-account")?.to_str().ok()?;
            Some(Scope::new(account))
        })
        .with_route_policy(http::Method::POST, "/v1/deploys", RoutePolicy::required())
        .expect("a plain policy needs nothing");
    let app: Router = layer.approvals_router();
    let (status, problem, _) = send(&app, get("/approvals", "acme")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::INTERNAL_SERVER_ERROR, "approvals-unsupported")
    );
}

/// A store that is down: every reservation fails as if the database were unreachable.
fn down() -> HookedStore {
    HookedStore::default()
        .with_approvals()
        .on_reserve(|_| Err(StoreError::Unavailable("connection refused".into())))
}

#[tokio::test]
async fn neither_a_missing_key_nor_a_store_outage_skips_an_approval() {
    use tower_idempotency::StoreFailurePolicy;

    let runs = Arc::new(AtomicUsize::new(0));
    let build = |store: HookedStore, policy: RoutePolicy| {
        let counter = runs.clone();
        Router::new()
            .route(
                "/v1/deploys",
                post(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { StatusCode::CREATED }
                }),
            )
            .route_layer(
                IdempotencyLayer::new(store)
                    .with_scope(|_| Some(Scope::new("acme")))
                    .with_default_policy(policy)
                    .expect("the store has what the policy needs"),
            )
    };
    // An optional key on a route with approvals is still required.
    let optional = RoutePolicy::optional().with_approval(deploy_approval());
    let app = build(down(), optional);
    let keyless = Request::post("/v1/deploys")
        .header("content-type", "application/json")
        .body(Body::from(PRODUCTION))
        .unwrap();
    let (status, problem, _) = send(&app, keyless).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::BAD_REQUEST, "missing-idempotency-key")
    );

    // A fail-open route with the store down runs what needs no approval, never what does.
    let open = RoutePolicy::required()
        .with_store_failure(StoreFailurePolicy::FailOpen)
        .with_approval(deploy_approval());
    let app = build(down(), open);
    let (status, problem, _) = send(&app, deploy("k-1", PRODUCTION)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::SERVICE_UNAVAILABLE, "store-unavailable")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (status, _, _) = send(&app, deploy("k-2", STAGING)).await;
    assert_eq!(status, StatusCode::CREATED, "fails open as configured");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
