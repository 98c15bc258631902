//! The layer's journal on a real PostgreSQL: a call, a retry with a new JSON-RPC id that
//! attaches to it, and the key reused with other arguments leave, in the database's
//! journal (exported as the operator CLI exports it), the store's events of the execution
//! and the layer's decisions with their MCP correlation, in order; the export verifies.

use crate::support;

use std::convert::Infallible;
use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use test_harness::pg;
use tower::{Layer, Service, ServiceExt};
use tower_idempotency_audit::{
    Correlation, JournalLine, JournalReader, NoteSigningKey, SealedEvent, Verifier,
};
use tower_idempotency_core::{OperationId, Scope};
use tower_idempotency_mcp::{McpBody, McpIdempotencyLayer, ToolPolicy};
use tower_idempotency_postgres::{
    PostgresJournal, PostgresJournalConfig, PostgresStore, PostgresStoreConfig,
};

const EXECUTION: &str = "dev.tower-idempotency/execution";

fn post(id: Value, arguments: Value, session: Option<&str>) -> Request<Full<Bytes>> {
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "deploy",
        "arguments": arguments,
        "_meta": {"dev.tower-idempotency/idempotency-key": "pg-key-1"},
    }});
    let mut builder = Request::post("/mcp")
        .header("content-type", "application/json")
        .header("x-principal", "agent-9");
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    let mut request = builder
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    request.extensions_mut().insert(Scope::new("acct_pg"));
    request
}

async fn send<S>(service: &S, request: Request<Full<Bytes>>) -> Value
where
    S: Service<Request<Full<Bytes>>, Response = Response<McpBody>, Error = Infallible> + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// The events of `operation` in the exported journal.
fn events_of(export: &[u8], operation: OperationId) -> Vec<SealedEvent> {
    let mut reader = JournalReader::new(Cursor::new(export));
    let mut events = Vec::new();
    while let Some(line) = reader.next_line() {
        if let (_, Ok(JournalLine::Event { event, .. })) = line.unwrap() {
            if event.event.operation_id == Some(operation) {
                events.push(*event);
            }
        }
    }
    events
}

fn timeline(events: &[SealedEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|sealed| {
            let id = match sealed.event.kind.correlation() {
                Some(Correlation::Mcp { jsonrpc_id, .. }) => jsonrpc_id.clone(),
                Some(Correlation::Http { method, route }) => format!("http {method} {route}"),
                _ => "-".to_owned(),
            };
            (sealed.event.kind.name().to_owned(), id)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_decisions_come_out_of_the_database_journal_in_order() {
    let database = pg::test_database().await;
    let store = PostgresStore::from_config(&PostgresStoreConfig {
        audit: true,
        ..PostgresStoreConfig::new(database.url())
    })
    .unwrap();
    store.migrate().await.unwrap();
    let key = NoteSigningKey::generate("mcp.test/postgres-journal").unwrap();
    let journal = PostgresJournal::new(
        &store,
        key.clone(),
        PostgresJournalConfig {
            checkpoint_every: 4,
            ..PostgresJournalConfig::default()
        },
    )
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let service = McpIdempotencyLayer::new(store.clone())
        .with_principal(|parts| {
            parts
                .headers
                .get("x-principal")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        })
        .with_tool(
            "deploy",
            ToolPolicy::guarded().with_wait(Duration::from_secs(10)),
        )
        .layer(support::server(Arc::clone(&runs), Duration::from_secs(2)));
    let arguments = json!({"service": "api", "version": "v-pg-secret-7"});

    let first = tokio::spawn({
        let service = service.clone();
        let request = post(json!(1), arguments.clone(), Some("s-pg"));
        async move { send(&service, request).await }
    });
    // The tool runs only after the call's reservation: from then on a retry attaches.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first call never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retry = send(&service, post(json!("retry-2"), arguments.clone(), None)).await;
    let first = first.await.unwrap();
    assert_eq!(retry["id"], "retry-2");
    assert_eq!(retry["result"]["_meta"][EXECUTION]["attached"], true);
    let conflict = send(
        &service,
        post(json!(3), json!({"service": "api", "version": "v2"}), None),
    )
    .await;
    assert!(conflict["error"].is_object(), "{conflict}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let operation: OperationId = first["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // Decisions reach the pending table in the background, the delivery mark after the
    // answer's last byte: seal and export until all of them are in.
    let mut export = Vec::new();
    let mut events = Vec::new();
    for _ in 0..150 {
        journal.seal().await.unwrap();
        export.clear();
        store.export_journal(0, &mut export).await.unwrap();
        events = events_of(&export, operation);
        let names: Vec<_> = events.iter().map(|e| e.event.kind.name()).collect();
        if names.contains(&"conflict") && names.contains(&"delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut timeline = timeline(&events);
    let delivered = timeline
        .iter()
        .position(|(kind, _)| kind == "delivered")
        .unwrap_or_else(|| panic!("no delivery: {timeline:?}"));
    let completed = timeline
        .iter()
        .position(|(kind, _)| kind == "completed")
        .unwrap();
    assert!(delivered > completed, "{timeline:?}");
    timeline.remove(delivered);
    let expected: Vec<(String, String)> = [
        ("accepted", "http tools/call deploy"),
        ("correlated", "1"),
        ("attached", r#""retry-2""#),
        ("completed", "-"),
        ("replayed", r#""retry-2""#),
        ("conflict", "3"),
    ]
    .iter()
    .map(|(kind, id)| ((*kind).to_owned(), (*id).to_owned()))
    .collect();
    assert_eq!(timeline, expected);
    for sealed in &events {
        assert_eq!(sealed.event.key.as_ref().unwrap().as_str(), "pg-key-1");
        if let Some(Correlation::Mcp { tool, session, .. }) = sealed.event.kind.correlation() {
            assert_eq!(tool, "deploy");
            assert_eq!(sealed.event.principal.as_deref(), Some("agent-9"));
            let expected = (sealed.event.kind.name() == "correlated").then(|| "s-pg".to_owned());
            assert_eq!(session, &expected);
        }
    }

    let verified = Verifier::new(key.verifying_key())
        .verify(Cursor::new(&export))
        .unwrap();
    assert!(verified.events >= events.len() as u64);
    let text = String::from_utf8(export).unwrap();
    assert!(!text.contains("v-pg-secret-7"));
    assert!(!text.contains("_meta"));
}
