//! Bytes per record in the memory store, measured as what the process pays: the growth of
//! its resident set (`VmRSS`) while `records` completed operations are stored, divided by
//! `records`. Each record looks like one of the demo's: scope `acme`, a 40-character key,
//! `POST /v1/payments`, a SHA-256 fingerprint, one stored header (`content-type`) and a
//! response body of `body_bytes` bytes in an allocation of its own (as the layer's buffered
//! response body is). As in a server, every request brings its own scope, key and
//! fingerprint allocations (the demo's authentication makes a new scope per request).

use std::time::Duration;

use bytes::Bytes;
use tower_idempotency::{
    Fingerprint, IdempotencyKey, MemoryStore, MemoryStoreConfig, Reservation, ReserveRequest,
    Scope, Store, StoredResponse,
};

/// What was measured.
#[derive(Debug, Clone, Copy)]
pub struct RecordSize {
    /// Resident bytes per stored record, body included.
    pub bytes_per_record: f64,
    /// The same, less the body.
    pub overhead: f64,
}

fn resident_bytes() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_owned())
}

/// Stores `records` completed operations with bodies of `body_bytes` and measures.
pub async fn measure(records: usize, body_bytes: usize) -> Result<RecordSize, String> {
    let store = MemoryStore::new(MemoryStoreConfig {
        capacity: records + 1,
        shards: 16,
        max_bytes: u64::MAX,
        scope_quota: tower_idempotency::ScopeQuota::UNLIMITED,
    });
    let template = vec![b'x'; body_bytes];
    let before = resident_bytes()?;
    for i in 0..records {
        let key = IdempotencyKey::new(&format!("6f1c0a4e-2b7d-4d0e-9c1a-{i:012x}-k"))
            .map_err(|e| e.to_string())?;
        let request = ReserveRequest {
            scope: Scope::new("acme"),
            key,
            fingerprint: Fingerprint::from_stored(format!("sha256:{i:064x}")),
            method: "POST".to_owned(),
            route: "/v1/payments".to_owned(),
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            unknown_retention: Duration::from_secs(7 * 24 * 3600),
            take_over_unknown: false,
            marks_dispatch: false,
            approval: None,
            replace_delivered: None,
        };
        let Ok(Reservation::Acquired { lease, .. }) = store.reserve(request).await else {
            return Err(format!("record {i} was not acquired"));
        };
        let response = StoredResponse {
            status: 201,
            headers: StoredResponse::header_map([(
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            )]),
            body: Some(Bytes::from(template.clone())),
        };
        // As the layer stores a result: the record is not read back.
        store
            .complete_delivered(&lease, response, false)
            .await
            .map_err(|e| e.to_string())?;
    }
    let after = resident_bytes()?;
    if store.len() != records {
        return Err(format!("the store holds {} records", store.len()));
    }
    let per = after.saturating_sub(before) as f64 / records as f64;
    drop(store);
    Ok(RecordSize {
        bytes_per_record: per,
        overhead: per - body_bytes as f64,
    })
}
