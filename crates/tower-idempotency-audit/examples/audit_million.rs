//! Writes a journal of 1,000,000 events through the file sink (a checkpoint every 1,000
//! events, an fsync every 10,000), then verifies it offline and prints both times.
//!
//! ```sh
//! cargo run --release -p tower-idempotency-core --example audit_million [EVENTS]
//! ```

use std::time::{Duration, Instant, SystemTime};

use tower_idempotency_audit::{
    AuditEvent, AuditEventKind, Correlation, Journal, JournalConfig, NoteSigningKey, Verifier,
};
use tower_idempotency_core::{Fingerprint, IdempotencyKey, OperationId, Scope};

/// Event `i`: operations of four events each — accepted, dispatched, completed, delivered.
fn event(i: u64, operation: OperationId) -> AuditEvent {
    let kind = match i % 4 {
        0 => AuditEventKind::Accepted {
            correlation: Correlation::Http {
                method: "POST".into(),
                route: "/orders".into(),
            },
        },
        1 => AuditEventKind::Dispatched,
        2 => AuditEventKind::Completed { status: 201 },
        _ => AuditEventKind::Delivered,
    };
    let key = IdempotencyKey::new(&format!("order-{}", i / 4)).expect("a valid key");
    AuditEvent::new(
        SystemTime::now(),
        Scope::new(format!("acct_{}", i % 1000)),
        Some(operation),
        kind,
    )
    .with_key(key)
    .with_fingerprint(Fingerprint::from_stored(format!("sha256:{:064x}", i / 4)))
    .with_principal(format!("agent-{}", i % 17))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 1_000_000,
    };
    let dir = std::env::temp_dir().join(format!("audit-million-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = NoteSigningKey::generate("audit.example/million")?;
    let verifying_key = key.verifying_key();
    let config = JournalConfig {
        checkpoint_every: 1000,
        checkpoint_interval: Duration::from_secs(3600),
        file_sink: Some(dir.join("journal.jsonl")),
        anchor_dir: Some(dir.join("anchor")),
        retain_events: false,
        ..JournalConfig::default()
    };
    let journal = Journal::open(key, config)?;
    let started = Instant::now();
    let (mut appending, mut sealing) = (Duration::ZERO, Duration::ZERO);
    let mut operation = OperationId::new();
    for i in 0..events {
        if i % 4 == 0 {
            operation = OperationId::new();
        }
        let event = event(i, operation);
        let append = Instant::now();
        journal.append(event);
        appending += append.elapsed();
        if (i + 1) % 10_000 == 0 {
            let seal = Instant::now();
            journal.seal()?;
            sealing += seal.elapsed();
        }
    }
    let seal = Instant::now();
    journal.seal()?;
    sealing += seal.elapsed();
    let written = started.elapsed();
    let bytes = std::fs::metadata(dir.join("journal.jsonl"))?.len();
    println!(
        "wrote {events} events ({:.1} MB, {} checkpoints) in {:.2?}: appending {:.2?} \
         ({:.0} ns/event), sealing with fsync {:.2?} ({:.2} µs/event)",
        bytes as f64 / 1e6,
        journal.checkpoints().len(),
        written,
        appending,
        appending.as_nanos() as f64 / events as f64,
        sealing,
        sealing.as_secs_f64() * 1e6 / events as f64,
    );
    drop(journal);
    let started = Instant::now();
    let verified = Verifier::new(verifying_key)
        .with_anchor(&dir.join("anchor"))?
        .verify_path(&dir.join("journal.jsonl"))?;
    let took = started.elapsed();
    println!(
        "verified {} events and {} checkpoints in {:.2?} ({:.0} events/s)",
        verified.events,
        verified.checkpoints,
        took,
        verified.events as f64 / took.as_secs_f64()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
