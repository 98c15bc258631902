//! The transactional outbox: side effects enqueued in the operation's transaction and
//! delivered afterwards by [`OutboxDispatcher`]s, each with a stable effect id as the
//! downstream idempotency key.
//!
//! Invariants: an effect exists exactly when its operation committed (it is written in the
//! same transaction); its id is [`OperationId::derived_key`] of its name, so a re-execution
//! of the operation cannot add a second one; a dispatcher claims due effects with
//! `FOR UPDATE SKIP LOCKED`, so any number of dispatchers, in any number of processes, never
//! claim the same effect at once; a claim that outlives its dispatcher expires and the effect
//! is claimed again (delivery is at least once — the downstream deduplicates by effect id).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio_postgres::types::ToSql;
use tower_idempotency_core::OperationId;
use tower_idempotency_core::error::{BoxError, Result};
use tower_idempotency_core::metrics as names;
use uuid::Uuid;

use crate::executor::micros;
use crate::row;
use crate::store::PostgresStore;

/// One side effect as the delivery function receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// Stable id of the effect: send it as the downstream idempotency key.
    pub effect_id: Uuid,
    /// The operation that enqueued it.
    pub operation_id: OperationId,
    /// The scope (account, tenant) of that operation.
    pub scope: String,
    /// The name it was enqueued under (`"notify"`, `"charge"`).
    pub name: String,
    /// The payload it was enqueued with.
    pub payload: serde_json::Value,
    /// This delivery attempt's number, from 1.
    pub attempt: u32,
}

/// Why a delivery failed, and whether to try again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// Worth retrying (a timeout, a `5xx`, a refused connection): the effect is due again
    /// after the back-off, until the attempts run out.
    #[error("delivery failed; it will be retried")]
    Retry(#[source] BoxError),
    /// Retrying cannot help (the downstream refused the request as invalid): the effect is
    /// marked `failed` at once.
    #[error("delivery failed permanently")]
    Permanent(#[source] BoxError),
}

impl DeliveryError {
    /// A failure worth retrying.
    pub fn retry(error: impl Into<BoxError>) -> Self {
        Self::Retry(error.into())
    }

    /// A failure retrying cannot fix.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        Self::Permanent(error.into())
    }
}

/// How a dispatcher claims, retries and gives up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// Most effects claimed (and delivered concurrently) per round. Default 32.
    pub batch: usize,
    /// Pause after a round that found fewer than `batch` due effects. Default 500 ms.
    pub poll_interval: Duration,
    /// How long a claim lasts: an effect whose dispatcher has not reported back by then is
    /// due again. Must exceed the slowest delivery. Default 60 s.
    pub claim_timeout: Duration,
    /// Attempts before an effect is marked `failed`. Default 10.
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled for each further attempt. Default 1 s.
    pub backoff_initial: Duration,
    /// Longest wait between attempts. Default 10 min.
    pub backoff_max: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            batch: 32,
            poll_interval: Duration::from_millis(500),
            claim_timeout: Duration::from_secs(60),
            max_attempts: 10,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(600),
        }
    }
}

impl DispatcherConfig {
    /// The wait after failed attempt number `attempt` (from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        self.backoff_initial
            .saturating_mul(1 << doublings)
            .min(self.backoff_max)
    }
}

/// What one dispatch round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchReport {
    /// Effects claimed.
    pub claimed: usize,
    /// Delivered and marked so.
    pub delivered: usize,
    /// Failed and due again later.
    pub retried: usize,
    /// Failed for good (attempts exhausted, or a permanent failure).
    pub failed: usize,
    /// Finished by this dispatcher after its claim had expired and been taken by another
    /// (the outcome was not recorded by this one).
    pub lost_claims: usize,
}

type Deliver = Arc<
    dyn Fn(Effect) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send>> + Send + Sync,
>;

/// Delivers the outbox's due effects through a user-supplied async function.
///
/// Run one per app instance (or several): they share the work through
/// `FOR UPDATE SKIP LOCKED`.
///
/// ```no_run
/// use tower_idempotency_postgres::{DeliveryError, OutboxDispatcher, PostgresStore};
///
/// # async fn run(store: PostgresStore) {
/// let dispatcher = OutboxDispatcher::new(store, |effect| async move {
///     // e.g. POST the payload to a webhook with `Idempotency-Key: <effect_id>`
///     println!("{} {} {}", effect.effect_id, effect.name, effect.payload);
///     Ok::<(), DeliveryError>(())
/// });
/// let _task = dispatcher.spawn();
/// # }
/// ```
#[derive(Clone)]
pub struct OutboxDispatcher {
    store: PostgresStore,
    config: DispatcherConfig,
    deliver: Deliver,
    /// [`OUTBOX_DELIVERED`](names::OUTBOX_DELIVERED), resolved when the dispatcher was made.
    delivered: metrics::Counter,
    /// [`OUTBOX_RETRIES`](names::OUTBOX_RETRIES), resolved when the dispatcher was made.
    retries: metrics::Counter,
}

impl fmt::Debug for OutboxDispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxDispatcher")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OutboxDispatcher {
    /// A dispatcher over `store`'s outbox with the default [`DispatcherConfig`].
    /// `deliver` gets each claimed effect; `Ok` marks it delivered.
    pub fn new<F, Fut>(store: PostgresStore, deliver: F) -> Self
    where
        F: Fn(Effect) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), DeliveryError>> + Send + 'static,
    {
        // Exported from the first scrape, at zero.
        let delivered = metrics::counter!(names::OUTBOX_DELIVERED);
        let retries = metrics::counter!(names::OUTBOX_RETRIES);
        delivered.increment(0);
        retries.increment(0);
        Self {
            delivered,
            retries,
            store,
            config: DispatcherConfig::default(),
            deliver: Arc::new(move |effect| Box::pin(deliver(effect))),
        }
    }

    /// Replaces the configuration.
    #[must_use]
    pub fn with_config(mut self, config: DispatcherConfig) -> Self {
        self.config = config;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    /// Claims up to `batch` due effects, delivers them concurrently and records each
    /// outcome. Returns what happened; an error means the claim itself failed.
    pub async fn run_once(&self) -> Result<DispatchReport> {
        let claim_id = Uuid::new_v4();
        let batch = i64::try_from(self.config.batch.max(1)).unwrap_or(i64::MAX);
        let claim = micros(self.config.claim_timeout);
        let rows = (self.store.inner.executor)
            .query(
                "outbox_claim",
                &self.store.inner.queries.outbox.claim,
                &[&claim_id, &batch, &claim],
            )
            .await?;
        let mut report = DispatchReport {
            claimed: rows.len(),
            ..DispatchReport::default()
        };
        let mut deliveries = JoinSet::new();
        for row in &rows {
            let effect = effect(row)?;
            let deliver = Arc::clone(&self.deliver);
            deliveries.spawn(async move {
                let id = effect.effect_id;
                let attempt = effect.attempt;
                (id, attempt, deliver(effect).await)
            });
        }
        while let Some(joined) = deliveries.join_next().await {
            let (effect_id, attempt, outcome) = match joined {
                Ok(done) => done,
                Err(error) => {
                    // A panicking delivery: its effect stays claimed until the claim runs
                    // out, then is retried.
                    tracing::error!(error = %error, "an outbox delivery panicked");
                    continue;
                }
            };
            match self.record(claim_id, effect_id, attempt, outcome).await {
                Ok(Recorded::Delivered) => report.delivered += 1,
                Ok(Recorded::Retried) => report.retried += 1,
                Ok(Recorded::Failed) => report.failed += 1,
                Ok(Recorded::LostClaim) => report.lost_claims += 1,
                Err(error) => {
                    tracing::warn!(%effect_id, error = %error, "could not record an outbox delivery; the effect is due again when its claim runs out");
                }
            }
        }
        Ok(report)
    }

    async fn record(
        &self,
        claim_id: Uuid,
        effect_id: Uuid,
        attempt: u32,
        outcome: Result<(), DeliveryError>,
    ) -> Result<Recorded> {
        let (executor, queries) = (&self.store.inner.executor, &self.store.inner.queries.outbox);
        let (max_attempts, error) = match outcome {
            Ok(()) => {
                let updated = executor
                    .execute(
                        "outbox_delivered",
                        &queries.delivered,
                        &[&effect_id, &claim_id],
                    )
                    .await?;
                return Ok(if updated == 0 {
                    tracing::warn!(%effect_id, "delivered after the claim expired; another dispatcher owns the effect now");
                    Recorded::LostClaim
                } else {
                    tracing::debug!(%effect_id, attempt, "outbox effect delivered");
                    self.delivered.increment(1);
                    Recorded::Delivered
                });
            }
            Err(DeliveryError::Permanent(error)) => (0, error),
            Err(DeliveryError::Retry(error)) => (
                i32::try_from(self.config.max_attempts).unwrap_or(i32::MAX),
                error,
            ),
        };
        let backoff = micros(self.config.backoff(attempt));
        let message = error_chain(&*error);
        let params: [&(dyn ToSql + Sync); 5] =
            [&effect_id, &claim_id, &max_attempts, &backoff, &message];
        let rows = executor
            .query("outbox_retry", &queries.retry, &params)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Recorded::LostClaim);
        };
        let state: String = row::get(row, "state")?;
        if state == "failed" {
            tracing::error!(%effect_id, attempt, error = %message, "outbox effect failed for good");
            Ok(Recorded::Failed)
        } else {
            tracing::warn!(%effect_id, attempt, error = %message, "outbox delivery failed; will retry");
            self.retries.increment(1);
            Ok(Recorded::Retried)
        }
    }

    /// Runs rounds until the task is aborted: at once again after a full batch, after
    /// `poll_interval` otherwise, and after `poll_interval` when the database fails.
    /// Must be called inside a Tokio runtime.
    pub fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                match self.run_once().await {
                    Ok(report) if report.claimed >= self.config.batch.max(1) => continue,
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(error = %error, "outbox dispatch round failed; retrying")
                    }
                }
                tokio::time::sleep(self.config.poll_interval).await;
            }
        })
    }

    /// Deletes at most `batch` effects delivered more than `age` ago; returns how many
    /// went. Failed effects are kept for an operator.
    pub async fn purge_delivered(&self, age: Duration, batch: usize) -> Result<usize> {
        let age = micros(age);
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let deleted = (self.store.inner.executor)
            .execute(
                "outbox_purge",
                &self.store.inner.queries.outbox.purge,
                &[&age, &limit],
            )
            .await?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }
}

enum Recorded {
    Delivered,
    Retried,
    Failed,
    LostClaim,
}

fn effect(row: &tokio_postgres::Row) -> Result<Effect> {
    let attempts: i32 = row::get(row, "attempts")?;
    Ok(Effect {
        effect_id: row::get(row, "effect_id")?,
        operation_id: OperationId::from_uuid(row::get(row, "operation_id")?),
        scope: row::get(row, "scope")?,
        name: row::get(row, "name")?,
        payload: row::get(row, "payload")?,
        attempt: u32::try_from(attempts).unwrap_or(0),
    })
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
