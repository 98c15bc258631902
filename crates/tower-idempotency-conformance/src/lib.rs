//! The conformance suite of `tower-idempotency`: the behaviour every [`Store`] must show, as
//! one set of checks.
//!
//! Each check is a `pub async fn` that panics with a message naming itself when the store
//! misbehaves; [`run_all`] runs them in turn. Checks use fresh random scopes and keys, so
//! they can run repeatedly against a shared database, and real (short) durations rather
//! than paused time, because a durable store decides leases and retention by its own clock.
//!
//! # Running it against your store
//!
//! Add this crate to your dev-dependencies (beside `tower-idempotency-core`, which your
//! store implements) and one test:
//!
//! ```toml
//! [dev-dependencies]
//! tower-idempotency-conformance = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! ```no_run
//! # use tower_idempotency_core::MemoryStore as MyStore;
//! # fn new_store() -> MyStore { MyStore::default() }
//! #[tokio::test(flavor = "multi_thread")]
//! async fn conformance() {
//!     tower_idempotency_conformance::run_all(&new_store()).await;
//! }
//! ```
//!
//! The suite needs `S: Store + Clone` because the concurrency checks run reservations on
//! separate Tokio tasks; a store that is not `Clone` runs as `Arc::new(store)` (an
//! `Arc<S>` is a [`Store`]). Use the multi-thread runtime so that concurrent reservations
//! really overlap. A full run takes a few seconds: lease and retention checks wait for
//! leases of a few hundred milliseconds to run out.
//!
//! # The contract in brief
//!
//! - Of concurrent reservations for one `(scope, key)`, exactly one acquires.
//! - A completed record returned for the same fingerprint counts one replay per call,
//!   exactly once: in the same step, or shortly after in the background (once the store has
//!   caught up, the count equals the replays; a reservation never reports more).
//! - An `in_progress` record whose lease ran out after its dispatch reads as `unknown`; only
//!   a reservation with `take_over_unknown` and the same fingerprint takes it over.
//! - A reservation is dispatched at once unless its request says the handler marks the
//!   dispatch ([`DispatchStore::mark_dispatched`](tower_idempotency_core::DispatchStore::mark_dispatched): fenced, the first time kept, the lease renewed). A
//!   lease that lapses before the mark reads `in_progress` (lease in the past), wakes its
//!   waiters, and is taken over by the next reservation of the same command, exactly once,
//!   whatever `take_over_unknown` says. [`DispatchStore::cancel`](tower_idempotency_core::DispatchStore::cancel) before the mark leaves a
//!   `cancelled` record a retry takes over; after it, `unknown`.
//! - A new key that needs approval is created `awaiting_approval` with a pending approval
//!   bound to its fingerprint; [`ApprovalStore::decide_approval`](tower_idempotency_core::ApprovalStore::decide_approval) decides exactly once (approving
//!   needs the bound fingerprint; a repeat of the winning decision reports it, the opposite
//!   is refused); an authorized operation is acquired by exactly one reservation; pending
//!   requests and unused approvals expire; approvals are seen by their own scope only.
//! - A reservation with [`ReserveRequest::replace_delivered`](tower_idempotency_core::ReserveRequest::replace_delivered)
//!   replaces a completed record of its fingerprint delivered at least the window ago with a
//!   new operation, exactly once under concurrency; a running, undelivered, recently
//!   delivered or other-fingerprint record answers as usual.
//! - A lease stops being current once its operation is taken over, completed, abandoned or
//!   released. A lease that merely ran out is still current: its late result is accepted.
//! - Waiters return when the record leaves `in_progress` (including by its lease running
//!   out), or at their timeout, never earlier.
//! - Purging removes only records whose retention ended, never `in_progress` ones.
//! - A transactional reservation ([`TransactionStore::reserve_transaction`](tower_idempotency_core::TransactionStore::reserve_transaction)) acquires like a plain one,
//!   with the operation's transaction open; the reservation is visible while it is, a
//!   commit completes the operation, an abort releases it, and a lease taken over fences
//!   the commit (checked on a store that declares transactions).
//! - The single-commit path ([`TransactionStore::reserve_single_commit`](tower_idempotency_core::TransactionStore::reserve_single_commit))
//!   acquires once; a concurrent reservation answers the running operation `in_progress`
//!   (at the latest at the end of its wait) or, waiting past the commit, replays it; a read
//!   of the key finds it running; an abort keeps nothing.
//! - A completion that reads nothing back ([`Store::complete_delivered`]) is fenced like
//!   `complete` and records the delivery with the completion when asked to.
//! - Scopes are isolated, by key and by operation id.
//! - A scope at its [`ScopeQuota`](tower_idempotency_core::ScopeQuota) is refused new keys
//!   (and only new keys) with `ScopeQuotaExceeded`; other scopes are unaffected; stored bytes count from
//!   completion; released and expired records free the quota; records awaiting approval
//!   count ([`run_quota`], against a store configured with [`QUOTA`]).
//!
//! # Module stack
//!
//! [`run_all`] and [`run_lifecycle`] (this file) on top; then one module per part of the
//! contract, each a list of checks (`reserve`, `wait`, `lease`, `recovery`, `records`,
//! `transaction`, `completion`, `dispatch`, `approval`, `derived`, and `quota` with its own
//! [`run_quota`]), reading the durations they wait out from this file; at the bottom
//! `fixture`, the fresh scopes, keys, requests and panicking helpers every check shares.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod approval;
mod completion;
mod derived;
mod dispatch;
mod fixture;
mod lease;
mod quota;
mod records;
mod recovery;
mod reserve;
mod transaction;
mod wait;

use std::time::Duration;

use tower_idempotency_core::Store;

pub use approval::{
    approval_authorizes_its_fingerprint_only, approval_is_requested_for_a_new_key,
    approvals_are_scoped, authorized_operation_is_acquired_once, concurrent_decisions_decide_once,
    denied_approval_answers_with_the_denial, list_approvals_filters_orders_and_limits,
    pending_approval_expires, purge_keeps_approvals_until_they_expire, unused_approval_expires,
};
pub use completion::{
    complete_delivered_records_the_delivery, transaction_complete_delivered_says_what_it_recorded,
};
pub use derived::{
    replace_delivered_is_atomic_under_concurrency, replace_delivered_keeps_open_records,
    replace_delivered_starts_a_new_operation,
};
pub use dispatch::{
    cancel_after_dispatch_is_unknown, cancel_before_dispatch_is_cancelled,
    lapse_after_dispatch_is_unknown, lapse_before_dispatch_is_taken_over,
    lapsed_before_dispatch_is_taken_over_once, mark_delivered_records_its_time_once,
    mark_dispatched_sets_the_time_once_and_renews, mark_dispatched_with_a_stale_lease_is_lost,
    reserve_without_mark_is_dispatched, wait_returns_when_an_undispatched_lease_lapses,
};
pub use fixture::reserve_request;
pub use lease::{
    extend_lease_keeps_in_progress, late_completion_after_expiry_is_accepted,
    lease_expiry_reads_unknown, stale_lease_is_fenced,
};
pub use quota::{
    QUOTA, quota_counts_awaiting_approval_records, quota_counts_stored_bytes,
    quota_refuses_new_keys_of_that_scope_only, released_and_expired_records_free_the_quota,
    run_quota,
};
pub use records::{
    get_by_id_finds_operation, mark_delivered_sets_flag, purge_removes_only_expired,
    scopes_are_isolated,
};
pub use recovery::{
    abandon_marks_unknown, release_allows_reexecution, take_over_unknown_same_fingerprint_only,
};
pub use reserve::{
    fingerprint_mismatch_is_reported, records_carry_request_and_timestamps, replay_counts,
    reserve_is_atomic_under_concurrency,
};
pub use transaction::{
    reserve_single_commit_acquires_once_waits_and_replays, reserve_transaction_abort_releases,
    reserve_transaction_acquires_once_and_commits, reserve_transaction_commit_is_fenced,
};
pub use wait::{in_progress_then_wait_wakes_on_complete, wait_times_out};

/// A lease that outlives any check.
const LONG: Duration = Duration::from_secs(60);
/// How long records made by the suite stay around when a check does not care.
const KEEP: Duration = Duration::from_secs(600);
/// A lease or retention a check waits out.
const SHORT: Duration = Duration::from_millis(300);
/// How long a check sleeps to be sure a [`SHORT`] duration ran out, with margin for a
/// database round trip and a little clock skew.
const PAST_SHORT: Duration = Duration::from_millis(700);
/// How long a waiter may take to notice a change before the check calls it stuck.
const WAKE_BOUND: Duration = Duration::from_secs(10);
/// The timeout given to waiters that are expected to be woken long before it.
const WAIT_LONG: Duration = Duration::from_secs(60);
/// Tolerance when comparing timestamps a store derived from durations.
const SLACK: Duration = Duration::from_secs(1);

/// Runs every check in this module against `store`, one after the other.
pub async fn run_all<S: Store + Clone>(store: &S) {
    reserve_is_atomic_under_concurrency(store).await;
    records_carry_request_and_timestamps(store).await;
    replay_counts(store).await;
    fingerprint_mismatch_is_reported(store).await;
    in_progress_then_wait_wakes_on_complete(store).await;
    wait_times_out(store).await;
    lease_expiry_reads_unknown(store).await;
    take_over_unknown_same_fingerprint_only(store).await;
    stale_lease_is_fenced(store).await;
    late_completion_after_expiry_is_accepted(store).await;
    release_allows_reexecution(store).await;
    abandon_marks_unknown(store).await;
    extend_lease_keeps_in_progress(store).await;
    purge_removes_only_expired(store).await;
    scopes_are_isolated(store).await;
    mark_delivered_sets_flag(store).await;
    get_by_id_finds_operation(store).await;
    complete_delivered_records_the_delivery(store).await;
    mark_delivered_records_its_time_once(store).await;
    if store.transactions().is_some() {
        reserve_transaction_acquires_once_and_commits(store).await;
        reserve_transaction_abort_releases(store).await;
        reserve_transaction_commit_is_fenced(store).await;
        transaction_complete_delivered_says_what_it_recorded(store).await;
        reserve_single_commit_acquires_once_waits_and_replays(store).await;
    }
    run_lifecycle(store).await;
}

/// Runs the checks of the capabilities `store` declares — dispatch marks and cancellation,
/// approvals, derived matching's replacement of delivered records — one after the other
/// (part of [`run_all`]). A capability the store does not declare is not checked: the
/// layers refuse the policies that need it when they are built.
pub async fn run_lifecycle<S: Store + Clone>(store: &S) {
    reserve_without_mark_is_dispatched(store).await;
    if store.dispatch().is_some() {
        mark_dispatched_sets_the_time_once_and_renews(store).await;
        mark_dispatched_with_a_stale_lease_is_lost(store).await;
        lapse_before_dispatch_is_taken_over(store).await;
        lapse_after_dispatch_is_unknown(store).await;
        lapsed_before_dispatch_is_taken_over_once(store).await;
        wait_returns_when_an_undispatched_lease_lapses(store).await;
        cancel_before_dispatch_is_cancelled(store).await;
        cancel_after_dispatch_is_unknown(store).await;
    }
    if store.approvals().is_some() {
        run_approvals(store).await;
    }
    if store.derived_matching() {
        replace_delivered_starts_a_new_operation(store).await;
        replace_delivered_keeps_open_records(store).await;
        replace_delivered_is_atomic_under_concurrency(store).await;
    }
}

/// The approval checks (part of [`run_lifecycle`], for a store that declares approvals).
async fn run_approvals<S: Store + Clone>(store: &S) {
    approval_is_requested_for_a_new_key(store).await;
    approval_authorizes_its_fingerprint_only(store).await;
    denied_approval_answers_with_the_denial(store).await;
    concurrent_decisions_decide_once(store).await;
    authorized_operation_is_acquired_once(store).await;
    pending_approval_expires(store).await;
    unused_approval_expires(store).await;
    approvals_are_scoped(store).await;
    list_approvals_filters_orders_and_limits(store).await;
    purge_keeps_approvals_until_they_expire(store).await;
}
