//! The demo's MCP server (rmcp, over loopback) on a journaled memory store: a call, a
//! retry with a new JSON-RPC id and the key reused with another amount leave their events
//! in the journal, in order, with the tool, the exact JSON-RPC ids, the session and the
//! principal; the sealed journal verifies and holds no argument. The `mcp-demo` binary with
//! the HTTP demo's audit flags: its printed public key, `GET /audit`, and a journal file
//! and anchor that verify offline; `--no-audit` keeps no journal.

use crate::support;

use std::io::Cursor;
use std::time::Duration;

use crate::support::{Demo, DemoProcess, EXECUTION, RawSession, charge};
use mcp_demo::DemoConfig;
use serde_json::json;
use tower_idempotency_audit::{
    Correlation, Journal, JournalConfig, NoteSigningKey, SealedEvent, Verifier,
};
use tower_idempotency_core::OperationId;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_calls_history_is_journaled_with_its_jsonrpc_ids() {
    let key = NoteSigningKey::generate("mcp-demo.test/journal").unwrap();
    let journal = Journal::open(
        key.clone(),
        JournalConfig {
            checkpoint_every: 4,
            ..JournalConfig::default()
        },
    )
    .unwrap();
    let demo = Demo::start(DemoConfig {
        journal: Some(journal.clone()),
        ..DemoConfig::default()
    })
    .await;
    let base = demo.base();
    let raw = RawSession::open(&base, "alice").await;
    let meta = json!({"dev.tower-idempotency/idempotency-key": "journal-key-1"});

    let first = raw
        .call(11, "charge", charge("inv-j", 500), Some(meta.clone()), &[])
        .await;
    assert_eq!(first["result"]["isError"], false, "{first}");
    let operation: OperationId = first["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let retry = raw
        .call(12, "charge", charge("inv-j", 500), Some(meta.clone()), &[])
        .await;
    assert_eq!(retry["id"], 12);
    assert_eq!(retry["result"]["_meta"][EXECUTION]["replayed"], true);
    let changed = raw
        .call(13, "charge", charge("inv-j", 98_765), Some(meta), &[])
        .await;
    assert_eq!(
        changed["error"]["code"],
        tower_idempotency_mcp::FINGERPRINT_MISMATCH_CODE
    );
    assert_eq!(support::effects(&base, "alice").await["charge"], 1);

    // The delivery mark follows the answer's last byte, and may come after the retry.
    let mut events = Vec::new();
    for _ in 0..100 {
        journal.seal().unwrap();
        events = journal.events_of(operation);
        if events.iter().any(|e| e.event.kind.name() == "delivered") {
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
        ("accepted", "http tools/call charge"),
        ("correlated", "11"),
        ("dispatched", "-"),
        ("completed", "-"),
        ("replayed", "12"),
        ("conflict", "13"),
    ]
    .iter()
    .map(|(kind, id)| ((*kind).to_owned(), (*id).to_owned()))
    .collect();
    assert_eq!(timeline, expected);
    for sealed in &events {
        assert_eq!(sealed.event.scope.as_str(), "alice");
        assert_eq!(sealed.event.key.as_ref().unwrap().as_str(), "journal-key-1");
        if let Some(Correlation::Mcp { tool, session, .. }) = sealed.event.kind.correlation() {
            assert_eq!(tool, "charge");
            assert_eq!(session.as_deref(), Some(raw.session()));
            // A bare bearer token is the actor with the user `agent`.
            assert_eq!(sealed.event.principal.as_deref(), Some("agent"));
        }
    }

    journal.seal().unwrap();
    let mut export = Vec::new();
    journal.export(&mut export).unwrap();
    let verified = Verifier::new(key.verifying_key())
        .verify(Cursor::new(&export))
        .unwrap();
    assert!(verified.events >= events.len() as u64);
    let text = String::from_utf8(export).unwrap();
    // No argument (base64 and hex have no `-`, so this cannot match a hash).
    assert!(!text.contains("inv-j"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_journals_to_a_file_that_verifies_offline() {
    let dir = std::env::temp_dir().join(format!("mcp-demo-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = NoteSigningKey::generate("example.com/mcp-demo").unwrap();
    let key_file = dir.join("audit.key");
    std::fs::write(&key_file, key.to_text().as_str()).unwrap();
    let (file, anchor) = (dir.join("journal.jsonl"), dir.join("anchor"));
    let path = |path: &std::path::Path| path.to_str().unwrap().to_owned();
    let args = [
        "--audit-key".to_owned(),
        path(&key_file),
        "--audit-journal".to_owned(),
        path(&file),
        "--audit-anchor".to_owned(),
        path(&anchor),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut demo = DemoProcess::start(&args).await;
    assert_eq!(
        demo.next_line().await,
        format!("audit public key: {}", key.verifying_key().to_text())
    );
    support::audit_shows_a_calls_history(&demo.base).await;
    drop(demo);

    let verified = Verifier::new(key.verifying_key())
        .with_anchor(&anchor)
        .unwrap()
        .verify_path(&file)
        .unwrap();
    assert!(verified.events >= 5, "{verified:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_makes_a_key_at_start_and_no_audit_keeps_no_journal() {
    let mut demo = DemoProcess::start(&[]).await;
    let line = demo.next_line().await;
    let key = line.strip_prefix("audit public key: ").unwrap();
    let key = tower_idempotency_audit::NoteVerifyingKey::from_text(key).unwrap();
    assert_eq!(key.name(), "tower-idempotency.dev/mcp-demo");
    support::audit_shows_a_calls_history(&demo.base).await;
    drop(demo);

    let demo = DemoProcess::start(&["--no-audit"]).await;
    let raw = RawSession::open(&demo.base, "alice").await;
    let answer = raw.call(1, "charge", charge("inv-n", 5), None, &[]).await;
    let operation = answer["result"]["_meta"][EXECUTION]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = support::audit(
        &demo.base,
        Some("alice"),
        &format!("?operation_id={operation}"),
    )
    .await;
    assert_eq!(
        (status, body),
        (404, serde_json::Value::Null),
        "no such route"
    );

    // The flags are the HTTP demo's: `--no-audit` with a journal flag is a usage error.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-demo"))
        .args(["--no-audit", "--audit-key", "k"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
