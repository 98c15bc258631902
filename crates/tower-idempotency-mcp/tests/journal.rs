//! What the layer leaves in a journaled memory store's audit journal: the store's own
//! events of each execution, and the layer's — the MCP correlation of every accepted
//! attempt (`correlated`), retries attached and replayed, a key reused with another intent
//! (`conflict`), the wait bound passing (`refused_in_progress`) — each with the tool, the
//! exact JSON-RPC id and the session, never the arguments or `_meta`; and the sealed
//! journal verifies.

use crate::support::server;
use std::convert::Infallible;
use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency_audit::{
    AuditEventKind, Correlation, Journal, JournalConfig, NoteSigningKey, SealedEvent, Verifier,
};
use tower_idempotency_core::{MemoryStore, MemoryStoreConfig, OperationId, Scope};
use tower_idempotency_mcp::{McpBody, McpIdempotencyLayer, ToolPolicy};

const EXECUTION: &str = "dev.tower-idempotency/execution";
const KEY: &str = "dev.tower-idempotency/idempotency-key";

fn journaled() -> (MemoryStore, Journal, NoteSigningKey) {
    let key = NoteSigningKey::generate("mcp.test/journal").unwrap();
    let journal = Journal::open(
        key.clone(),
        JournalConfig {
            checkpoint_every: 4,
            ..JournalConfig::default()
        },
    )
    .unwrap();
    let store = MemoryStore::with_journal(MemoryStoreConfig::default(), journal.clone());
    (store, journal, key)
}

fn layer(store: MemoryStore) -> McpIdempotencyLayer {
    McpIdempotencyLayer::new(store)
        .with_principal(|parts| {
            parts
                .headers
                .get("x-principal")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        })
        .with_tool(
            "deploy",
            ToolPolicy::guarded().with_wait(Duration::from_secs(5)),
        )
        .with_tool(
            "charge",
            ToolPolicy::guarded().with_wait(Duration::from_millis(100)),
        )
}

fn post(message: &Value, session: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("x-principal", "agent-7");
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    let mut request = builder
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    request.extensions_mut().insert(Scope::new("acct_1"));
    request
}

/// A call of `tool` with the explicit key `key` in `_meta` (and a progress token, which
/// must never reach the journal).
fn call(id: Value, tool: &str, arguments: Value, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool,
        "arguments": arguments,
        "_meta": {KEY: key, "progressToken": "progress-token-that-stays-out"},
    }})
}

async fn send<S>(service: &S, request: Request<Full<Bytes>>) -> Value
where
    S: Service<Request<Full<Bytes>>, Response = Response<McpBody>, Error = Infallible> + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// The events of `operation`, sealed, in journal order.
fn events(journal: &Journal, operation: OperationId) -> Vec<SealedEvent> {
    journal.seal().unwrap();
    journal.events_of(operation)
}

/// The events of `operation` once its delivery is journaled (the mark is written when the
/// answer's last byte was handed over, which may come just after the client read it).
async fn events_delivered(journal: &Journal, operation: OperationId) -> Vec<SealedEvent> {
    for _ in 0..100 {
        let events = events(journal, operation);
        if events.iter().any(|e| e.event.kind.name() == "delivered") {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "no delivery journaled: {:?}",
        timeline(&events(journal, operation))
    );
}

/// `(type, JSON-RPC id)` of each event: the id of an MCP correlation, `-` for none.
fn timeline(events: &[SealedEvent]) -> Vec<(&'static str, String)> {
    events
        .iter()
        .map(|sealed| {
            let id = match sealed.event.kind.correlation() {
                Some(Correlation::Mcp { jsonrpc_id, .. }) => jsonrpc_id.clone(),
                Some(Correlation::Http { method, route }) => format!("http {method} {route}"),
                _ => "-".to_owned(),
            };
            (sealed.event.kind.name(), id)
        })
        .collect()
}

fn owned(expected: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    expected
        .iter()
        .map(|(kind, id)| (*kind, (*id).to_owned()))
        .collect()
}

fn verify(journal: &Journal, key: &NoteSigningKey) -> (u64, String) {
    journal.seal().unwrap();
    let mut export = Vec::new();
    journal.export(&mut export).unwrap();
    let verified = Verifier::new(key.verifying_key())
        .verify(Cursor::new(&export))
        .unwrap();
    (verified.events, String::from_utf8(export).unwrap())
}

#[tokio::test]
async fn a_call_an_attached_retry_a_replay_and_a_conflict_leave_their_events_in_order() {
    let (store, journal, key) = journaled();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer(store).layer(server(Arc::clone(&runs), Duration::from_millis(300)));
    let arguments = json!({"service": "api", "version": "v-secret-argument-42"});

    // The first call, in session s-1; a retry with a new (string) id attaches to it while
    // it runs.
    let first = tokio::spawn({
        let service = service.clone();
        let message = call(json!(1), "deploy", arguments.clone(), "deploy-key-1");
        async move { send(&service, post(&message, Some("s-1"))).await }
    });
    tokio::time::sleep(Duration::from_millis(80)).await;
    let retry = send(
        &service,
        post(
            &call(
                json!("retry-2"),
                "deploy",
                arguments.clone(),
                "deploy-key-1",
            ),
            None,
        ),
    )
    .await;
    let first = first.await.unwrap();
    assert_eq!(first["id"], 1);
    assert_eq!(retry["id"], "retry-2");
    assert_eq!(retry["result"]["_meta"][EXECUTION]["attached"], true);
    let operation: OperationId = first["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // Later: the same call again (numeric id 7, `7` and not `"7"`), then the key reused
    // with other arguments.
    let replay = send(
        &service,
        post(
            &call(json!(7), "deploy", arguments.clone(), "deploy-key-1"),
            None,
        ),
    )
    .await;
    assert_eq!(replay["result"]["_meta"][EXECUTION]["replayed"], true);
    let conflict = send(
        &service,
        post(
            &call(
                json!("8"),
                "deploy",
                json!({"service": "api", "version": "v2"}),
                "deploy-key-1",
            ),
            None,
        ),
    )
    .await;
    assert!(conflict["error"].is_object(), "{conflict}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let events = events_delivered(&journal, operation).await;
    let mut timeline = timeline(&events);
    // The first caller's delivery and the retry's replay race; everything else is ordered.
    let delivered = timeline
        .iter()
        .position(|(kind, _)| *kind == "delivered")
        .expect("the first answer was delivered");
    let completed = timeline
        .iter()
        .position(|(kind, _)| *kind == "completed")
        .unwrap();
    assert!(delivered > completed, "{timeline:?}");
    timeline.remove(delivered);
    assert_eq!(
        timeline,
        owned(&[
            ("accepted", "http tools/call deploy"),
            ("correlated", "1"),
            ("attached", r#""retry-2""#),
            ("completed", "-"),
            ("replayed", r#""retry-2""#),
            ("replayed", "7"),
            ("conflict", r#""8""#),
        ])
    );

    // Every event names the operation's scope and key and the principal the layer read;
    // the session only where the call had one; the conflict carries its own fingerprint.
    let fingerprint = events[0].event.fingerprint.clone().unwrap();
    for sealed in &events {
        let event = &sealed.event;
        assert_eq!(event.scope.as_str(), "acct_1");
        assert_eq!(event.key.as_ref().unwrap().as_str(), "deploy-key-1");
        if event.kind.name() == "conflict" {
            assert_ne!(event.fingerprint.as_ref(), Some(&fingerprint));
        } else {
            assert_eq!(event.fingerprint.as_ref(), Some(&fingerprint));
        }
        if let Some(Correlation::Mcp { tool, session, .. }) = event.kind.correlation() {
            assert_eq!(tool, "deploy");
            assert_eq!(event.principal.as_deref(), Some("agent-7"));
            let expected = (event.kind.name() == "correlated").then(|| "s-1".to_owned());
            assert_eq!(session, &expected, "{event:?}");
        }
    }
    assert_eq!(
        events[1].event.kind,
        AuditEventKind::Correlated {
            correlation: Correlation::Mcp {
                tool: "deploy".into(),
                jsonrpc_id: "1".into(),
                session: Some("s-1".into()),
            }
        }
    );

    // The sealed journal verifies, and holds neither an argument nor `_meta`.
    let (verified, export) = verify(&journal, &key);
    assert!(verified >= events.len() as u64);
    assert!(!export.contains("v-secret-argument-42"), "{export}");
    assert!(!export.contains("progress-token-that-stays-out"));
    assert!(!export.contains("_meta"));
}

#[tokio::test]
async fn a_retry_past_the_wait_bound_is_journaled_attached_then_refused() {
    let (store, journal, key) = journaled();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer(store).layer(server(Arc::clone(&runs), Duration::from_millis(600)));
    let arguments = json!({"payee": "p", "amount_minor": 100});

    let first = tokio::spawn({
        let service = service.clone();
        let message = call(json!(1), "charge", arguments.clone(), "charge-key-1");
        async move { send(&service, post(&message, None)).await }
    });
    tokio::time::sleep(Duration::from_millis(80)).await;
    let refused = send(
        &service,
        post(
            &call(json!(2), "charge", arguments.clone(), "charge-key-1"),
            None,
        ),
    )
    .await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        refused["result"]["structuredContent"]["type"]
            .as_str()
            .unwrap()
            .ends_with("request-in-progress")
    );
    let first = first.await.unwrap();
    let operation: OperationId = first["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let timeline = timeline(&events_delivered(&journal, operation).await);
    assert_eq!(
        timeline,
        owned(&[
            ("accepted", "http tools/call charge"),
            ("correlated", "1"),
            ("attached", "2"),
            ("refused_in_progress", "2"),
            ("completed", "-"),
            ("delivered", "-"),
        ])
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    verify(&journal, &key);
}

#[tokio::test]
async fn a_keyless_retry_is_journaled_under_the_derived_key() {
    let (store, journal, key) = journaled();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer(store).layer(server(Arc::clone(&runs), Duration::from_millis(300)));
    let message = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "deploy", "arguments": {"service": "api"}}})
    };
    // The first caller goes away before the answer (the call runs to completion); the
    // retry with a new id gets the stored result.
    let gone = tokio::time::timeout(
        Duration::from_millis(80),
        service.clone().oneshot(post(&message(1), None)),
    )
    .await;
    assert!(gone.is_err());
    let retry = send(&service, post(&message(2), None)).await;
    assert_eq!(retry["id"], 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let operation: OperationId = retry["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let events = events_delivered(&journal, operation).await;
    assert_eq!(
        timeline(&events),
        owned(&[
            ("accepted", "http tools/call deploy"),
            ("correlated", "1"),
            ("attached", "2"),
            ("completed", "-"),
            ("replayed", "2"),
            ("delivered", "-"),
        ])
    );
    let derived = events[0].event.key.clone().unwrap();
    assert!(derived.as_str().starts_with("mcp-intent:"), "{derived:?}");
    assert!(
        events
            .iter()
            .all(|e| e.event.key.as_ref() == Some(&derived))
    );
    verify(&journal, &key);
}
