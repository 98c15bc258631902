//! A future that finishes even when its caller stops waiting: polled in place while the
//! caller waits, moved into a task of its own when the caller drops it.
//!
//! This is what keeps a reservation, its handler and the storing of its result together
//! when a client disconnects (the server drops the request's future), without paying for
//! a task spawn and a cross-thread wake-up on every request whose client stays. Only that
//! work is wrapped: waiting for, replaying or refusing a duplicate protects no effect and
//! is cancelled with its client.
//!
//! Every detached task is counted in a [`Detached`] (one per layer), under its scope, and
//! in the [`DETACHED`](tower_idempotency_core::metrics::DETACHED) gauge while it runs; the
//! layer refuses to reserve while the count is at its bound, or the scope's at its share.

use std::collections::HashMap;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use metrics::Gauge;
use tokio::runtime::Handle;
use tower_idempotency_core::Scope;
use tower_idempotency_core::metrics as names;

/// The number of tasks detached by one layer and still running.
#[derive(Debug, Clone, Default)]
pub(crate) struct Detached(Arc<Counted>);

/// The tasks running now, in all and by scope, and the gauge handle they are counted in.
#[derive(Debug, Default)]
struct Counted {
    running: AtomicUsize,
    /// Written only when a task detaches or ends (a client that left), read only when the
    /// total is past a scope's share: a request whose client stays never takes the lock.
    by_scope: Mutex<HashMap<Scope, usize>>,
    gauge: OnceLock<Gauge>,
}

impl Detached {
    /// Tasks running now.
    pub(crate) fn count(&self) -> usize {
        self.0.running.load(Ordering::Acquire)
    }

    /// Tasks of `scope` running now.
    pub(crate) fn count_of(&self, scope: &Scope) -> usize {
        self.by_scope().get(scope).copied().unwrap_or(0)
    }

    fn by_scope(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, usize>> {
        self.0
            .by_scope
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the tasks in `gauge` (the layer's resolved handle) from now on.
    pub(crate) fn use_gauge(&self, gauge: Gauge) {
        let _ = self.0.gauge.set(gauge);
    }

    fn gauge(&self) -> &Gauge {
        // Resolved here only for a service made without its layer's handles.
        self.0
            .gauge
            .get_or_init(|| metrics::gauge!(names::DETACHED))
    }

    fn start(&self, scope: Option<Scope>) -> DetachedTask {
        if let Some(scope) = &scope {
            *self.by_scope().entry(scope.clone()).or_default() += 1;
        }
        self.0.running.fetch_add(1, Ordering::AcqRel);
        self.gauge().increment(1.0);
        DetachedTask(self.clone(), scope)
    }
}

/// Counts one detached task while it lives, however it ends (finishes, panics, or is
/// dropped unrun by a runtime shutting down).
struct DetachedTask(Detached, Option<Scope>);

impl Drop for DetachedTask {
    fn drop(&mut self) {
        if let Some(scope) = &self.1 {
            let mut by_scope = self.0.by_scope();
            if let Some(count) = by_scope.get_mut(scope) {
                *count -= 1;
                if *count == 0 {
                    by_scope.remove(scope);
                }
            }
        }
        (self.0).0.running.fetch_sub(1, Ordering::AcqRel);
        self.0.gauge().decrement(1.0);
    }
}

/// Set once the caller of a [`DetachOnDrop`] dropped it unfinished (the client left) and the
/// work went on in a task of its own: the work reads it to know that nobody will receive
/// its answer. Cheap to clone: clones share the flag.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientLeft(Arc<AtomicBool>);

impl ClientLeft {
    /// Whether the caller has gone.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The wrapped future panicked; it was dropped and its work did not finish.
#[derive(Debug)]
pub(crate) struct Panicked;

/// See the [module documentation](self).
pub(crate) struct DetachOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `None` once the future finished (or panicked): nothing is left to detach.
    inner: Option<Pin<Box<F>>>,
    /// The runtime the future was created in, read then rather than at drop: a future may
    /// be dropped on a thread outside any runtime.
    runtime: Option<Handle>,
    /// Where a detached task is counted, and under which scope.
    detached: Detached,
    scope: Option<Scope>,
    /// Set when the future is detached.
    left: Option<ClientLeft>,
}

impl<F> DetachOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// Boxed once here, so that neither polling nor detaching ever moves the (large)
    /// future itself.
    pub(crate) fn new(future: F, detached: &Detached) -> Self {
        Self {
            inner: Some(Box::pin(future)),
            runtime: Handle::try_current().ok(),
            detached: detached.clone(),
            scope: None,
            left: None,
        }
    }

    /// Counts the task, if it is ever detached, under `scope` too.
    pub(crate) fn in_scope(mut self, scope: &Scope) -> Self {
        self.scope = Some(scope.clone());
        self
    }

    /// Sets `left` if the future is ever detached.
    pub(crate) fn watched_by(mut self, left: &ClientLeft) -> Self {
        self.left = Some(left.clone());
        self
    }
}

impl<F> Future for DetachOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            // Polled after it returned `Ready`: a caller bug, but not worth a panic.
            return Poll::Pending;
        };
        // A panic must not leave a half-run future behind for `Drop` to detach and poll
        // again: it is dropped here and reported as `Panicked`, as a task's `JoinError`
        // would have been.
        match catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.inner = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                self.inner = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F> Drop for DetachOnDrop<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(unfinished) = self.inner.take() else {
            return;
        };
        if let Some(left) = &self.left {
            left.set();
        }
        match &self.runtime {
            // On a runtime that is shutting down the task is dropped unrun, as a spawned
            // task would have been.
            Some(runtime) => {
                let task = self.detached.start(self.scope.take());
                drop(runtime.spawn(async move {
                    let _task = task;
                    unfinished.await
                }));
            }
            None => tracing::error!(
                "an idempotent request was abandoned outside a Tokio runtime; its reservation reads unknown once its lease runs out"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_in_place_while_awaited() {
        let detached = Detached::default();
        let left = ClientLeft::default();
        let answer = DetachOnDrop::new(async { 42 }, &detached)
            .watched_by(&left)
            .await;
        assert_eq!(answer.unwrap(), 42);
        assert!(!left.is_set(), "its caller stayed");
        assert_eq!(detached.count(), 0, "nothing was detached");
    }

    #[tokio::test]
    async fn a_dropped_future_still_finishes() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let detached = Detached::default();
        let work = DetachOnDrop::new(
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                flag.store(true, Ordering::SeqCst);
            },
            &detached,
        );
        // The caller gives up after one poll, as a server does when the client leaves.
        let left = ClientLeft::default();
        let abandoned =
            tokio::time::timeout(Duration::from_millis(1), work.watched_by(&left)).await;
        assert!(abandoned.is_err());
        assert!(left.is_set(), "the work can tell its caller has gone");
        assert_eq!(detached.count(), 1, "counted while it runs");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            finished.load(Ordering::SeqCst),
            "the detached work ran to the end"
        );
        assert_eq!(detached.count(), 0, "and no longer once it ended");
    }

    #[tokio::test]
    async fn a_panic_is_reported_and_nothing_is_left_to_detach() {
        let mut work = DetachOnDrop::new(
            async {
                if true {
                    panic!("boom");
                }
            },
            &Detached::default(),
        );
        let answer = (&mut work).await;
        assert!(answer.is_err());
        assert!(
            work.inner.is_none(),
            "the panicked future was dropped, not kept"
        );
    }

    #[test]
    fn a_future_dropped_on_another_thread_still_runs_on_its_runtime() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let work = {
            let _in_runtime = runtime.enter();
            DetachOnDrop::new(
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    flag.store(true, Ordering::SeqCst);
                },
                &Detached::default(),
            )
        };
        // Dropped unpolled, on a thread with no runtime.
        std::thread::spawn(move || drop(work)).join().unwrap();
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        assert!(finished.load(Ordering::SeqCst));
    }
}
