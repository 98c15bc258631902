//! The console's pages over the memory store, driven with `oneshot`: escaping, the security
//! headers, scope, the approver rule, CSRF and origin checks, decisions, and the audit
//! events' verification.

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::routing::post;
use http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;
use tower_idempotency_audit::{Journal, JournalConfig, NoteSigningKey};
use tower_idempotency_core::ApprovalStore;
use tower_idempotency_core::{
    ApprovalPolicy, ApprovalState, MemoryStore, MemoryStoreConfig, Scope,
};

use crate::{IdempotencyLayer, RoutePolicy};

const HOSTILE: &str = r#"{"title":"<script>alert(1)</script><img src=x onerror=alert(2)>"}"#;

fn header(name: &'static str) -> impl Fn(&http::request::Parts) -> Option<String> + Clone {
    move |parts| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

fn app(journal: Option<Journal>) -> (Router, MemoryStore) {
    let store = match &journal {
        Some(journal) => MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone()),
        None => MemoryStore::default(),
    };
    let policy = ApprovalPolicy::always()
        .with_summary(|command| json!({ "operation": "open a ticket", "title": command["title"] }));
    let x_account = header("x-account");
    let layer = IdempotencyLayer::new(store.clone())
        .with_scope(move |parts| x_account(parts).map(Scope::new))
        .with_principal(header("x-user"))
        .with_approver(header("x-approver"))
        .with_default_policy(RoutePolicy::required().with_approval(policy))
        .expect("the store has what the policy needs");
    let console = match journal {
        Some(journal) => layer.console().with_journal(journal),
        None => layer.console(),
    };
    let router = Router::new()
        .route(
            "/v1/tickets",
            post(|| async { (StatusCode::CREATED, "made") }),
        )
        .route_layer(layer)
        .nest("/console/", console.router());
    (router, store)
}

async fn request(router: &Router, request: Request<Body>) -> (StatusCode, http::HeaderMap, String) {
    let response = router.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn ask(router: &Router, key: &str, body: &str) -> StatusCode {
    let ask = Request::post("/v1/tickets")
        .header("x-account", "acme")
        .header("x-user", "agent")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    request(router, ask).await.0
}

fn get(path: &str, account: &str) -> Request<Body> {
    Request::get(path)
        .header("x-account", account)
        .header("x-user", "alice")
        .header("x-approver", "alice")
        .body(Body::empty())
        .unwrap()
}

fn post_form(path: &str, origin: Option<&str>, form: &str) -> Request<Body> {
    let mut builder = Request::post(path)
        .header("host", "console.test")
        .header("x-account", "acme")
        .header("x-user", "alice")
        .header("x-approver", "alice")
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(origin) = origin {
        builder = builder.header("origin", origin);
    }
    builder.body(Body::from(form.to_owned())).unwrap()
}

/// The value of the hidden input `name` in `page`.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let start = page.find(&marker).unwrap() + marker.len();
    page[start..][..page[start..].find('"').unwrap()].to_owned()
}

async fn pending(store: &MemoryStore) -> tower_idempotency_core::Approval {
    let list = store
        .list_approvals(&Scope::new("acme"), Some(ApprovalState::Pending), None, 10)
        .await
        .unwrap();
    list.into_iter().next().expect("a pending approval")
}

#[tokio::test]
async fn pages_escape_what_agents_send_and_forbid_framing_and_scripts() {
    let (router, store) = app(None);
    ask(&router, "k1", HOSTILE).await;
    let approval = pending(&store).await;
    for path in [
        "/console/",
        "/console/approvals",
        &format!("/console/approvals/{}", approval.id),
    ] {
        let (status, headers, page) = request(&router, get(path, "acme")).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            !page.contains("<script>") && !page.contains("<img"),
            "{page}"
        );
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'sha256-"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'self'"));
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["referrer-policy"], "same-origin");
        assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    }
    let (_, _, page) = request(&router, get("/console/approvals", "acme")).await;
    assert!(page.contains(&format!(r#"href="/console/approvals/{}""#, approval.id)));
}

#[tokio::test]
async fn another_scope_sees_nothing_and_cannot_decide() {
    let (router, store) = app(None);
    ask(&router, "k1", r#"{"title":"t"}"#).await;
    let approval = pending(&store).await;
    let path = format!("/console/approvals/{}", approval.id);
    assert_eq!(
        request(&router, get(&path, "other")).await.0,
        StatusCode::NOT_FOUND
    );
    let path = format!("/console/operations/{}", approval.operation_id);
    assert_eq!(
        request(&router, get(&path, "other")).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, _, list) = request(&router, get("/console/approvals", "other")).await;
    assert!(!list.contains(&approval.id.to_string()));
    assert_eq!(
        request(&router, get("/console/approvals/not-a-uuid", "acme"))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn forged_posts_are_refused_and_change_nothing() {
    let (router, store) = app(None);
    ask(&router, "k1", r#"{"title":"t"}"#).await;
    let approval = pending(&store).await;
    let (_, _, page) = request(
        &router,
        get(&format!("/console/approvals/{}", approval.id), "acme"),
    )
    .await;
    let token = hidden(&page, "csrf");
    let fingerprint = hidden(&page, "fingerprint");
    assert_eq!(fingerprint, approval.fingerprint.as_str());
    assert!(!page.contains("hmac"), "no key material on the page");
    let approve = format!("/console/approvals/{}/approve", approval.id);
    let form = |token: &str| {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("csrf", token)
            .append_pair("fingerprint", &fingerprint)
            .finish()
    };
    let refused = [
        post_form(&approve, Some("http://evil.example"), &form(&token)),
        post_form(&approve, Some("null"), &form(&token)),
        post_form(
            &approve,
            Some("http://console.test"),
            &format!("fingerprint={fingerprint}"),
        ),
        post_form(&approve, Some("http://console.test"), &form("AAAA")),
    ];
    for forged in refused {
        assert_eq!(request(&router, forged).await.0, StatusCode::FORBIDDEN);
    }
    // A token made for another principal.
    let mut other = post_form(&approve, None, &form(&token));
    other
        .headers_mut()
        .insert("x-approver", "bob".parse().unwrap());
    other.headers_mut().insert("x-user", "bob".parse().unwrap());
    assert_eq!(request(&router, other).await.0, StatusCode::FORBIDDEN);
    // Not an approver.
    let mut requester = post_form(&approve, None, &form(&token));
    requester.headers_mut().remove("x-approver");
    assert_eq!(request(&router, requester).await.0, StatusCode::FORBIDDEN);
    assert_eq!(pending(&store).await.state, ApprovalState::Pending);

    // A stale page: another fingerprint is never approved.
    let stale = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &token)
        .append_pair("fingerprint", "sha256:0000")
        .finish();
    let (status, _, page) = request(
        &router,
        post_form(&approve, Some("http://console.test"), &stale),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        page.contains("not the one this approval is bound to"),
        "{page}"
    );
    assert_eq!(pending(&store).await.state, ApprovalState::Pending);

    // The page's own form approves.
    let (status, headers, _) = request(
        &router,
        post_form(&approve, Some("http://console.test"), &form(&token)),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers["location"],
        format!("/console/approvals/{}", approval.id).as_str()
    );
    let decided = store
        .get_approval(&Scope::new("acme"), approval.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (decided.state, decided.decided_by.as_deref()),
        (ApprovalState::Approved, Some("alice"))
    );

    // Denying it now is refused: it was decided meanwhile.
    let deny = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &token)
        .append_pair("reason", "too late")
        .finish();
    let path = format!("/console/approvals/{}/deny", approval.id);
    let (status, _, page) = request(&router, post_form(&path, None, &deny)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(page.contains("already decided"), "{page}");
}

#[tokio::test]
async fn the_operation_page_shows_events_verified_against_the_signed_checkpoint() {
    let key = NoteSigningKey::generate("console.test/journal").unwrap();
    let config = JournalConfig {
        checkpoint_every: 1,
        ..JournalConfig::default()
    };
    let journal = Journal::open(key, config).unwrap();
    let (router, store) = app(Some(journal));
    ask(&router, "k1", r#"{"title":"t"}"#).await;
    assert_eq!(
        ask(&router, "k1", r#"{"title":"changed"}"#).await,
        StatusCode::CONFLICT
    );
    let approval = pending(&store).await;
    let (_, _, page) = request(
        &router,
        get(&format!("/console/approvals/{}", approval.id), "acme"),
    )
    .await;
    assert!(page.contains("Conflict: "), "{page}");
    let path = format!("/console/operations/{}", approval.operation_id);
    let (status, _, page) = request(&router, get(&path, "acme")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Verified"), "{page}");
    assert!(page.contains("console.test/journal"), "{page}");
    let accepted = page.find(">accepted<").unwrap();
    let requested = page.find(">approval_requested<").unwrap();
    let conflict = page.find(">conflict<").unwrap();
    assert!(accepted < requested && requested < conflict, "{page}");
    let by_key = request(
        &router,
        get("/console/operations?idempotency_key=k1", "acme"),
    )
    .await;
    assert_eq!(by_key.0, StatusCode::OK);
    assert!(by_key.2.contains(&approval.operation_id.to_string()));
}
