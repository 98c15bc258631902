//! [`RedisStore`] and its [`Store`] implementation: each step one script call on the
//! scope's shard (plus `WAIT` on reservation and completion writes when configured).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tower_idempotency_core::approval::ApprovalCursor;
use tower_idempotency_core::error::Result;
use tower_idempotency_core::quota::quota_retry_after;
use tower_idempotency_core::{
    Approval, ApprovalDecision, ApprovalId, ApprovalState, ApprovalStore, DecisionOutcome,
    DerivedMatching, DispatchStore, IdempotencyKey, Lease, LeaseId, Operation, OperationId,
    OperationState, Reservation, ReserveRequest, Scope, ScopeQuota, Store, StoreError,
    StoredResponse,
};

use crate::config::{RedisStoreConfig, ServerSettings};
use crate::conn::Conn;
use crate::error::RedisStoreError;
use crate::keys::{self, ScopeKeys};
use crate::record::{
    Stored, duration_arg, encode_headers, micros, pack_entries, record_bytes, response_bytes,
    strings,
};
use crate::replays::ReplayCounts;
use crate::scripts;
use tower_idempotency_core::replay_cache::ReplayCache;

/// The Redis store: cheap to clone (one connection manager, or one cluster connection,
/// shared by the clones; no connection is opened per request).
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    settings: ServerSettings,
    pub(crate) prefix: String,
    quota: ScopeQuota,
    wait_replicas: u32,
    wait_timeout: Duration,
    purge_deleted: metrics::Counter,
    /// Replays counted off the request path (`replays.rs`).
    replays: ReplayCounts,
    /// Completed operations replayed moments ago (core's `replay_cache`).
    replayed: ReplayCache,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("wait_replicas", &self.inner.wait_replicas)
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// The first poll of [`Store::wait`], and the longest pause between two polls.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(200);

/// How many expired records of a scope a purge deletes per script call.
const SWEEP_BATCH: usize = 256;

impl RedisStore {
    /// Connects (one connection manager, or one cluster connection), reads every primary's
    /// `maxmemory-policy`, `appendonly`, `appendfsync` and connected replicas
    /// ([`server_settings`](Self::server_settings)), and refuses a `maxmemory-policy` other
    /// than `noeviction` unless [`RedisStoreConfig::allow_eviction`]
    /// ([`RedisStoreError::Eviction`]).
    pub async fn connect(config: &RedisStoreConfig) -> Result<RedisStore, RedisStoreError> {
        if config.key_prefix.is_empty() || config.key_prefix.contains(['{', '}']) {
            return Err(RedisStoreError::Config(format!(
                "the key prefix `{}` must be non-empty and without `{{` or `}}`",
                config.key_prefix
            )));
        }
        let conn = Conn::connect(config).await?;
        let settings = conn.settings().await?;
        if !config.allow_eviction {
            if let Some(node) = settings
                .nodes
                .iter()
                .find(|node| node.maxmemory_policy != "noeviction")
            {
                return Err(RedisStoreError::Eviction {
                    address: node.address.clone(),
                    policy: node.maxmemory_policy.clone(),
                });
            }
        }
        Ok(RedisStore {
            inner: Arc::new(Inner {
                settings,
                prefix: config.key_prefix.clone(),
                quota: config.scope_quota,
                wait_replicas: config.wait_replicas,
                wait_timeout: config.wait_timeout,
                purge_deleted: tower_idempotency_core::metrics::register_purge_counter("redis"),
                replays: ReplayCounts::new(conn.clone(), config.key_prefix.clone()),
                replayed: ReplayCache::new(config.replay_cache),
                conn,
            }),
        })
    }

    /// What the store read of the servers at connect.
    pub fn server_settings(&self) -> &ServerSettings {
        &self.inner.settings
    }

    pub(crate) fn keys(&self, scope: &Scope) -> ScopeKeys {
        ScopeKeys::new(&self.inner.prefix, scope)
    }

    /// Runs `script` and returns its answer's strings.
    pub(crate) async fn run(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, RedisStoreError> {
        let value: redis::Value = self.inner.conn.script(script, keys, args).await?;
        strings(value)
    }

    /// `WAIT` for the configured replicas on `key`'s primary, when configured.
    async fn replicate(&self, key: &str) -> Result<(), RedisStoreError> {
        let wanted = self.inner.wait_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let acked = match self
            .inner
            .conn
            .wait(key, wanted, self.inner.wait_timeout)
            .await
        {
            Ok(acked) => acked,
            // Any failure of `WAIT` itself leaves the write's replication unknown, which is
            // what `NotReplicated` says (and the caller retries it as unavailable): an error
            // reply too, as from a node that a failover turned into a replica between the
            // script and its `WAIT` ("WAIT cannot be used with replica instances").
            Err(error) => {
                tracing::warn!(%error, "WAIT failed: the write's replication is unknown");
                0
            }
        };
        if acked < wanted {
            return Err(RedisStoreError::NotReplicated { wanted, acked });
        }
        Ok(())
    }

    /// Reads the record at `key` (a record key, or with `index` an id index naming one).
    pub(crate) async fn read(
        &self,
        keys: &ScopeKeys,
        key: &str,
        index: bool,
    ) -> Result<(u64, Option<Stored>), RedisStoreError> {
        self.read_at(keys.base(), key, index).await
    }

    /// [`read`](Self::read) under the key base `base`.
    pub(crate) async fn read_at(
        &self,
        base: &str,
        key: &str,
        index: bool,
    ) -> Result<(u64, Option<Stored>), RedisStoreError> {
        let mode: &[u8] = if index { b"index" } else { b"key" };
        let answer = self
            .run(&scripts::READ, &[key], &[base.as_bytes(), mode])
            .await?;
        let (now, record) = answer
            .split_first()
            .ok_or_else(|| RedisStoreError::Corrupt("an empty answer".into()))?;
        Ok((micros(now)?, Stored::parse(record)))
    }

    /// The live record of `(scope, key)`.
    pub(crate) async fn load(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Operation>, RedisStoreError> {
        Ok(self.load_at(scope, key).await?.1)
    }

    /// [`load`](Self::load), with the server's time of the read (µs).
    async fn load_at(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<(u64, Option<Operation>), RedisStoreError> {
        let keys = self.keys(scope);
        let (now, record) = self.read(&keys, &keys.record(key.as_str()), false).await?;
        Ok((now, Self::own(scope, now, record)?))
    }

    /// The live record of operation `id` of `scope`.
    pub(crate) async fn load_by_id(
        &self,
        scope: &Scope,
        id: OperationId,
    ) -> Result<Option<Operation>, RedisStoreError> {
        let keys = self.keys(scope);
        let (now, record) = self.read(&keys, &keys.id(id), true).await?;
        Ok(Self::own(scope, now, record)?.filter(|operation| operation.id == id))
    }

    /// `record` as of `now` if it belongs to `scope` and is live.
    fn own(
        scope: &Scope,
        now: u64,
        record: Option<Stored>,
    ) -> Result<Option<Operation>, RedisStoreError> {
        match record {
            Some(record) if record.scope() == Some(scope.as_str()) => record.operation(now),
            _ => Ok(None),
        }
    }

    /// A fenced step of `lease.lua`; the record as it then stands (`None` after a release).
    async fn lease_step(
        &self,
        lease: &Lease,
        step: &str,
        duration: Option<Duration>,
    ) -> Result<Option<Operation>> {
        let keys = self.keys(&lease.scope);
        let usage = keys.usage();
        let record = keys.record(lease.key.as_str());
        let id = lease.operation_id.as_uuid().to_string();
        let lid = lease.lease_id.as_uuid().to_string();
        let duration = duration.map(duration_arg).unwrap_or_default();
        let answer = self
            .run(
                &scripts::LEASE,
                &[
                    &record,
                    &usage[0],
                    &usage[1],
                    &usage[2],
                    &keys.id(lease.operation_id),
                ],
                &[
                    keys.base().as_bytes(),
                    lease.scope.as_str().as_bytes(),
                    id.as_bytes(),
                    lid.as_bytes(),
                    step.as_bytes(),
                    duration.as_bytes(),
                ],
            )
            .await?;
        self.fenced(lease, &answer)
    }

    /// The answer of a fenced script: `LeaseLost`, or the record as it now stands.
    fn fenced(&self, lease: &Lease, answer: &[Vec<u8>]) -> Result<Option<Operation>> {
        match answer {
            [outcome, now, record @ ..] if outcome.as_slice() == b"ok" => {
                let now = micros(now)?;
                Ok(Stored::parse(record)
                    .map(|record| record.operation(now))
                    .transpose()?
                    .flatten())
            }
            [outcome, ..] if outcome.as_slice() == b"lost" => Err(StoreError::LeaseLost {
                operation_id: lease.operation_id,
            }),
            _ => Err(RedisStoreError::Corrupt("an unexpected answer".into()).into()),
        }
    }

    async fn finish(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
        read_back: bool,
    ) -> Result<Option<Operation>> {
        let keys = self.keys(&lease.scope);
        let usage = keys.usage();
        let record = keys.record(lease.key.as_str());
        let id = lease.operation_id.as_uuid().to_string();
        let lid = lease.lease_id.as_uuid().to_string();
        let added = response_bytes(&response).to_string();
        let status = response.status.to_string();
        let headers = encode_headers(&response.headers);
        let (present, body): (&[u8], &[u8]) = match &response.body {
            Some(body) => (b"1", body),
            None => (b"0", b""),
        };
        let flag = |on: bool| -> &[u8] { if on { b"1" } else { b"0" } };
        let answer = self
            .run(
                &scripts::COMPLETE,
                &[&record, &usage[0], &usage[1], &usage[2]],
                &[
                    keys.base().as_bytes(),
                    lease.scope.as_str().as_bytes(),
                    id.as_bytes(),
                    lid.as_bytes(),
                    status.as_bytes(),
                    &headers,
                    present,
                    body,
                    added.as_bytes(),
                    flag(delivered),
                    flag(read_back),
                ],
            )
            .await?;
        let operation = self.fenced(lease, &answer)?;
        self.replicate(&record).await?;
        Ok(operation)
    }

    async fn try_reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        let keys = self.keys(&request.scope);
        let usage = keys.usage();
        let record = keys.record(request.key.as_str());
        let id = OperationId::new();
        let lease_id = LeaseId::new();
        let approval_id = ApprovalId::new();
        let summary = request
            .approval
            .as_ref()
            .map(|approval| serde_json::to_vec(&approval.summary).unwrap_or_default());
        let bytes = record_bytes(request, summary.as_deref()).to_string();
        let flag = |on: bool| -> &[u8] { if on { b"1" } else { b"0" } };
        let id_text = id.as_uuid().to_string();
        let lease_text = lease_id.as_uuid().to_string();
        let approval_text = approval_id.as_uuid().to_string();
        let (lease, retention, unknown) = (
            duration_arg(request.lease),
            duration_arg(request.retention),
            duration_arg(request.unknown_retention),
        );
        let window = request
            .replace_delivered
            .map(duration_arg)
            .unwrap_or_default();
        let (max_records, max_bytes) = (
            self.inner
                .quota
                .max_records
                .min(i64::MAX as u64)
                .to_string(),
            self.inner.quota.max_bytes.min(i64::MAX as u64).to_string(),
        );
        let ttl = request
            .approval
            .as_ref()
            .map(|approval| duration_arg(approval.ttl))
            .unwrap_or_default();
        let requested_by = request
            .approval
            .as_ref()
            .map(|approval| approval.requested_by.as_str())
            .unwrap_or_default();
        // A new record in progress, packed here but for the fields of the server's clock
        // (creation, lease end, dispatch), which the script adds.
        let fresh = if request.approval.is_none() {
            pack_entries(&[
                ("sc", request.scope.as_str().as_bytes()),
                ("k", request.key.as_str().as_bytes()),
                ("id", id_text.as_bytes()),
                ("fp", request.fingerprint.as_str().as_bytes()),
                ("m", request.method.as_bytes()),
                ("rt", request.route.as_bytes()),
                ("ret", retention.as_bytes()),
                ("uret", unknown.as_bytes()),
                ("rp", b"0"),
                ("st", b"in_progress"),
                ("at", b"1"),
                ("lid", lease_text.as_bytes()),
            ])
        } else {
            Vec::new()
        };
        let answer = self
            .run(
                &scripts::RESERVE,
                // The record and the scope's quota keys: all exist for a key the scope holds,
                // so a replay or a take-over runs while its slot migrates (as long as they
                // are on one node); a new key's record does not, so a new key waits the
                // migration out (`TRYAGAIN`) instead of running on half a scope.
                &[&record, &usage[0], &usage[1], &usage[2]],
                &[
                    keys.base().as_bytes(),
                    request.scope.as_str().as_bytes(),
                    request.key.as_str().as_bytes(),
                    request.fingerprint.as_str().as_bytes(),
                    request.method.as_bytes(),
                    request.route.as_bytes(),
                    lease.as_bytes(),
                    retention.as_bytes(),
                    unknown.as_bytes(),
                    flag(request.take_over_unknown),
                    flag(request.marks_dispatch),
                    window.as_bytes(),
                    id_text.as_bytes(),
                    lease_text.as_bytes(),
                    bytes.as_bytes(),
                    max_records.as_bytes(),
                    max_bytes.as_bytes(),
                    flag(request.approval.is_some()),
                    approval_text.as_bytes(),
                    summary.as_deref().unwrap_or_default(),
                    requested_by.as_bytes(),
                    ttl.as_bytes(),
                    &fresh,
                ],
            )
            .await?;
        let [outcome, now, rest @ ..] = answer.as_slice() else {
            return Err(RedisStoreError::Corrupt("an empty answer".into()).into());
        };
        let now = micros(now)?;
        let operation = || -> Result<Operation> {
            Stored::parse(rest)
                .map(|record| record.operation(now))
                .transpose()?
                .flatten()
                .ok_or_else(|| {
                    RedisStoreError::Corrupt("a reservation without its record".into()).into()
                })
        };
        match outcome.as_slice() {
            b"acquired" | b"takeover" | b"authorized" => {
                let operation = operation()?;
                let lease = Lease {
                    scope: request.scope.clone(),
                    key: request.key.clone(),
                    operation_id: operation.id,
                    lease_id,
                };
                if let Err(error) = self.replicate(&record).await {
                    // Nothing ran under the reservation. A new record is given back, so that
                    // the client's retry (after the 503) reserves the key afresh; a record
                    // that existed before (a take-over, an authorized start) keeps its
                    // history and is left to its lease.
                    if outcome.as_slice() == b"acquired" {
                        if let Err(release) = self.lease_step(&lease, "release", None).await {
                            tracing::warn!(operation_id = %operation.id, error = %release, "could not release a reservation that was not replicated");
                        }
                    }
                    return Err(error.into());
                }
                Ok(Reservation::Acquired {
                    operation,
                    lease,
                    takeover: outcome.as_slice() == b"takeover",
                })
            }
            b"approval" => {
                let operation = operation()?;
                self.replicate(&record).await?;
                Ok(Reservation::ApprovalRequested(operation))
            }
            b"existing" => {
                let operation = operation()?;
                if operation.state == OperationState::Completed
                    && operation.fingerprint == request.fingerprint
                {
                    // A replay: counted off the request path, and kept for the next ones.
                    self.inner
                        .replays
                        .count(&request.scope, &request.key, operation.id);
                    if request.replace_delivered.is_none() {
                        let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_micros(now);
                        let cache = &self.inner.replayed;
                        let hash = cache.hash(&request.scope, &request.key);
                        cache.put(hash, &request.scope, &request.key, &operation, at);
                    }
                }
                Ok(Reservation::Existing(operation))
            }
            b"quota" => {
                let until = rest
                    .first()
                    .filter(|at| !at.is_empty())
                    .and_then(|at| std::str::from_utf8(at).ok())
                    .and_then(|at| at.parse::<f64>().ok())
                    .map(|at| Duration::from_micros((at as u64).saturating_sub(now)));
                Err(StoreError::ScopeQuotaExceeded {
                    retry_after: quota_retry_after(until),
                })
            }
            b"collision" => Err(RedisStoreError::Corrupt(format!(
                "the key of another scope holds the tag of scope {:?}",
                request.scope
            ))
            .into()),
            _ => Err(RedisStoreError::Corrupt("an unknown reservation outcome".into()).into()),
        }
    }

    /// Deletes up to `batch` records whose retention ended, scope by scope (a `SCAN` of
    /// every primary for the scopes' `live` sets).
    pub(crate) async fn sweep(&self, batch: usize) -> Result<usize, RedisStoreError> {
        if batch == 0 {
            return Ok(0);
        }
        let pattern = keys::pattern(&self.inner.prefix, "live");
        let lives = self.inner.conn.scan(&pattern, "zset", usize::MAX).await?;
        let mut purged = 0;
        for live in lives {
            let Some(base) = keys::base_of(&live) else {
                continue;
            };
            let (bytes, usage) = (format!("{base}b"), format!("{base}u"));
            while purged < batch {
                let limit = (batch - purged).min(SWEEP_BATCH);
                let n: usize = self
                    .inner
                    .conn
                    .script(
                        &scripts::SWEEP,
                        &[&live, &bytes, &usage],
                        &[base.as_bytes(), limit.to_string().as_bytes()],
                    )
                    .await?;
                purged += n;
                if n < limit {
                    break;
                }
            }
            if purged >= batch {
                break;
            }
        }
        Ok(purged)
    }
}

#[async_trait]
impl Store for RedisStore {
    /// One script: the record's decision (replay, conflict, take-over, an authorized start,
    /// a delivered record replaced) or a new record, admitted against the scope's quota in
    /// the same step (when the scope looks full, after deleting up to 32 of its expired
    /// records and checking again).
    ///
    /// A replay (completed, same fingerprint) writes nothing on its path: it is counted in
    /// the background, and kept in the replay cache, from which this process answers the
    /// next replays of the key (requests without `replace_delivered`) for up to 10 s.
    async fn reserve(&self, request: ReserveRequest) -> Result<Reservation> {
        if request.replace_delivered.is_none() {
            let cache = &self.inner.replayed;
            let hash = cache.hash(&request.scope, &request.key);
            if let Some(operation) =
                cache.get(hash, &request.scope, &request.key, &request.fingerprint)
            {
                self.inner
                    .replays
                    .count(&request.scope, &request.key, operation.id);
                return Ok(Reservation::Existing(operation));
            }
        }
        self.try_reserve(&request).await
    }

    /// Accepted while the lease is current, and after it ran out as long as nobody took
    /// the operation over.
    async fn complete(&self, lease: &Lease, response: StoredResponse) -> Result<Operation> {
        self.finish(lease, response, false, true)
            .await?
            .ok_or_else(|| {
                RedisStoreError::Corrupt("a completion without its record".into()).into()
            })
    }

    /// The completion and the delivery mark in one script, nothing read back.
    async fn complete_delivered(
        &self,
        lease: &Lease,
        response: StoredResponse,
        delivered: bool,
    ) -> Result<()> {
        self.finish(lease, response, delivered, false).await?;
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.lease_step(lease, "release", None).await?;
        Ok(())
    }

    async fn abandon(&self, lease: &Lease) -> Result<()> {
        self.lease_step(lease, "abandon", None).await?;
        Ok(())
    }

    async fn extend_lease(&self, lease: &Lease, by: Duration) -> Result<()> {
        self.lease_step(lease, "extend", Some(by)).await?;
        Ok(())
    }

    async fn mark_delivered(&self, scope: &Scope, id: OperationId) -> Result<()> {
        let keys = self.keys(scope);
        let index = keys.id(id);
        let id = id.as_uuid().to_string();
        let _marked: i64 = self
            .inner
            .conn
            .script(
                &scripts::DELIVER,
                &[&index],
                &[
                    keys.base().as_bytes(),
                    scope.as_str().as_bytes(),
                    id.as_bytes(),
                ],
            )
            .await
            .map_err(RedisStoreError::from)?;
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Operation>> {
        Ok(self.load(scope, key).await?)
    }

    async fn get_by_id(&self, scope: &Scope, id: OperationId) -> Result<Option<Operation>> {
        Ok(self.load_by_id(scope, id).await?)
    }

    /// Polls the record with backoff (5 ms, growing by half each time, at most 200 ms
    /// between reads, and never past the lease's end or the timeout): about a dozen reads
    /// for a one-second handler, each one script call on the scope's shard.
    async fn wait(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>> {
        let deadline = later(tokio::time::Instant::now(), timeout);
        let mut first = None;
        let mut pause = POLL_FIRST;
        loop {
            let (server_now, operation) = self.load_at(scope, key).await?;
            let Some(operation) = operation else {
                return Ok(None);
            };
            let id = *first.get_or_insert(operation.id);
            // Leases are the server's: compared with the server's time of this read.
            let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_micros(server_now);
            let stalled = operation.state == OperationState::InProgress
                && operation.dispatched_at.is_none()
                && operation.lease_expires_at.is_some_and(|end| end <= now);
            let clock = tokio::time::Instant::now();
            if operation.state != OperationState::InProgress
                || stalled
                || operation.id != id
                || clock >= deadline
            {
                return Ok(Some(operation));
            }
            let mut wake = later(clock, pause).min(deadline);
            if let Some(left) = operation
                .lease_expires_at
                .and_then(|end| end.duration_since(now).ok())
            {
                // Just past the lease's end, when the record reads differently.
                wake = wake.min(later(clock, left.saturating_add(Duration::from_millis(2))));
            }
            tokio::time::sleep_until(wake).await;
            pause = (pause * 3 / 2).min(POLL_MAX);
        }
    }

    /// Completed, cancelled, denied and approval records leave by their key TTL; this
    /// deletes what the TTL does not: `unknown` records (and in-progress ones whose lease
    /// lapsed) past their unknown retention, and the index entries of records Redis
    /// expired. It walks the keyspace (`SCAN` on every primary for the scopes' `live` sets),
    /// so run it rarely.
    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        let deleted = self.sweep(batch).await?;
        self.inner.purge_deleted.increment(deleted as u64);
        Ok(deleted)
    }

    fn approvals(&self) -> Option<&dyn ApprovalStore> {
        Some(self)
    }

    fn dispatch(&self) -> Option<&dyn DispatchStore> {
        Some(self)
    }

    fn derived_matching(&self) -> bool {
        true
    }
}

impl DerivedMatching for RedisStore {}

#[async_trait]
impl DispatchStore for RedisStore {
    async fn mark_dispatched(&self, lease: &Lease, renew: Duration) -> Result<Operation> {
        self.lease_step(lease, "dispatch", Some(renew))
            .await?
            .ok_or_else(|| {
                RedisStoreError::Corrupt("a dispatch mark without its record".into()).into()
            })
    }

    async fn cancel(&self, lease: &Lease) -> Result<Operation> {
        self.lease_step(lease, "cancel", None)
            .await?
            .ok_or_else(|| {
                RedisStoreError::Corrupt("a cancellation without its record".into()).into()
            })
    }
}

#[async_trait]
impl ApprovalStore for RedisStore {
    async fn decide_approval(
        &self,
        scope: &Scope,
        id: ApprovalId,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Option<DecisionOutcome>> {
        let keys = self.keys(scope);
        let usage = keys.usage();
        let index = keys.approval(id);
        let approval_id = id.as_uuid().to_string();
        let (kind, detail, reason_len): (&[u8], &str, usize) = match &decision {
            ApprovalDecision::Approve { fingerprint } => (b"approve", fingerprint.as_str(), 0),
            ApprovalDecision::Deny { reason } => (b"deny", reason.as_str(), reason.len()),
        };
        let added = (decided_by.len() + reason_len).to_string();
        let answer = self
            .run(
                &scripts::DECIDE,
                &[&index, &usage[0], &usage[1], &usage[2]],
                &[
                    keys.base().as_bytes(),
                    scope.as_str().as_bytes(),
                    approval_id.as_bytes(),
                    kind,
                    detail.as_bytes(),
                    decided_by.as_bytes(),
                    added.as_bytes(),
                ],
            )
            .await?;
        let [changed, bound, now, record @ ..] = answer.as_slice() else {
            return Ok(None);
        };
        let Some(approval) = Stored::parse(record)
            .map(|record| record.read_approval(micros(now)?))
            .transpose()?
            .flatten()
        else {
            return Ok(None);
        };
        let (changed, bound) = (changed.as_slice() == b"1", bound.as_slice() == b"1");
        let approves = matches!(decision, ApprovalDecision::Approve { .. });
        Ok(Some(match approval.state {
            _ if changed => DecisionOutcome::Decided(approval),
            ApprovalState::Expired => DecisionOutcome::Expired(approval),
            _ if !bound => DecisionOutcome::FingerprintMismatch(approval),
            ApprovalState::Approved if approves => DecisionOutcome::Decided(approval),
            ApprovalState::Denied if !approves => DecisionOutcome::Decided(approval),
            _ => DecisionOutcome::AlreadyDecided(approval),
        }))
    }

    async fn get_approval(&self, scope: &Scope, id: ApprovalId) -> Result<Option<Approval>> {
        let keys = self.keys(scope);
        let (now, record) = self.read(&keys, &keys.approval(id), true).await?;
        let Some(record) = record.filter(|record| record.scope() == Some(scope.as_str())) else {
            return Ok(None);
        };
        if record.approval_id() != Some(id) {
            return Ok(None);
        }
        Ok(record.read_approval(now)?)
    }

    /// One script reads every approval of the scope (approvals are human-rate and few);
    /// the filter, order and page are applied here.
    async fn list_approvals(
        &self,
        scope: &Scope,
        state: Option<ApprovalState>,
        after: Option<ApprovalCursor>,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        let keys = self.keys(scope);
        let set = keys.approvals();
        // Read a bounded page at a time (`approvals.lua`), in the listing's order, from the
        // cursor's time on; approvals already passed — the cursor's, and those at the
        // boundary time a page ends on, read again by the next — are skipped by `seen`.
        let mut from = after.map_or_else(
            || "-inf".to_owned(),
            |cursor| {
                cursor
                    .requested_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_micros())
                    .to_string()
            },
        );
        let mut page = APPROVALS_PAGE;
        let mut seen = after;
        let mut approvals = Vec::new();
        loop {
            let answer = self
                .run(
                    &scripts::APPROVALS,
                    &[&set],
                    &[
                        keys.base().as_bytes(),
                        from.as_bytes(),
                        page.to_string().as_bytes(),
                    ],
                )
                .await?;
            let [now, read, last, records @ ..] = &answer[..] else {
                return Err(
                    RedisStoreError::Corrupt("an approvals page without its head".into()).into(),
                );
            };
            let now = micros(now)?;
            for packed in records {
                let Some(record) = Stored::unpack(packed) else {
                    continue;
                };
                if record.scope() != Some(scope.as_str()) {
                    continue;
                }
                let Some(approval) = record.read_approval(now)? else {
                    continue;
                };
                if !seen.is_none_or(|seen| seen.precedes(&approval)) {
                    continue;
                }
                seen = Some(ApprovalCursor::after(&approval));
                if state.is_none_or(|state| approval.state == state) {
                    approvals.push(approval);
                    if approvals.len() == limit {
                        return Ok(approvals);
                    }
                }
            }
            let read: usize = std::str::from_utf8(read)
                .ok()
                .and_then(|read| read.parse().ok())
                .ok_or_else(|| RedisStoreError::Corrupt("an approvals page's count".into()))?;
            if read < page {
                return Ok(approvals);
            }
            let last = String::from_utf8_lossy(last).into_owned();
            if last == from {
                // One request time fills the page: read more of it at once.
                page = page.saturating_mul(2);
            } else {
                from = last;
                page = APPROVALS_PAGE;
            }
        }
    }
}

/// How many entries of a scope's approval set one page of `list_approvals` reads.
const APPROVALS_PAGE: usize = 256;

/// `at + by`, or about a century after `at` when that overflows (a timeout or a lease of
/// `Duration::MAX`).
fn later(at: tokio::time::Instant, by: Duration) -> tokio::time::Instant {
    at.checked_add(by)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(at)
}
