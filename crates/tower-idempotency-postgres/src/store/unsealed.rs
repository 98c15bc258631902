//! A journaled store watches what waits to be sealed (a part of the store: it reads the
//! pending table through the store's own pool). The triggers write every state change to the
//! pending table; only a sealer chains and signs them. When the oldest pending event
//! has waited past [`UNSEALED_WARNING_AGE`], nothing seals this journal — no sealer runs, or
//! it keeps failing — and the store says so in its log, once and then every
//! [`REPEAT_EVERY`] while it lasts, instead of letting the table grow in silence.

use std::sync::Weak;
use std::time::Duration;

use super::Inner;

/// How long the oldest pending audit event may wait to be sealed before a journaled store
/// warns that nothing seals its journal (2 minutes: a sealer runs every few seconds).
pub const UNSEALED_WARNING_AGE: Duration = Duration::from_secs(120);

/// How often the store looks (one read of the pending table's primary key). The first look
/// is this long after the store is built, so a sealer started with it has had its turn.
const CHECK_EVERY: Duration = Duration::from_secs(60);

/// How often the warning repeats while nothing seals.
const REPEAT_EVERY: Duration = Duration::from_secs(600);

/// Starts the watch when a Tokio runtime is at hand; it ends with the store.
/// `journaled`: whether the store was configured to journal (`PostgresStoreConfig::audit`);
/// when it was not (a pooler mode, which cannot switch its sessions off), the advice is the
/// role setting.
pub(crate) fn spawn(store: Weak<Inner>, journaled: bool) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut warned: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let Some(inner) = store.upgrade() else {
                return;
            };
            // A database that cannot be read is reported by the requests themselves.
            let Ok(Some(age)) = inner.oldest_pending_age().await else {
                warned = None;
                continue;
            };
            drop(inner);
            if age < UNSEALED_WARNING_AGE {
                warned = None;
                continue;
            }
            if warned.is_some_and(|at| at.elapsed() < REPEAT_EVERY) {
                continue;
            }
            warned = Some(tokio::time::Instant::now());
            let advice = if journaled {
                "Run a sealer (PostgresJournal::spawn_sealer in one process, or \
                 `tower-idempotency audit seal`), or set PostgresStoreConfig::audit = false"
            } else {
                "The store is not to be journaled, but behind a transaction pooler it cannot \
                 switch its sessions off: set it on the role (ALTER ROLE … SET \
                 tower_idempotency.audit = off), or run a sealer"
            };
            tracing::warn!(
                waited_secs = age.as_secs(),
                "audit events are journaled and nothing seals them: the oldest has waited {}s. \
                 {advice}",
                age.as_secs()
            );
        }
    });
}
