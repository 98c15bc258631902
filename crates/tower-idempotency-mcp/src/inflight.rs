//! The executions this instance is driving, by session and JSON-RPC id, so that the
//! transport's cancellation signals do not stop a tool whose policy says `complete`:
//! a `notifications/cancelled` for such a call is answered `202` without reaching the
//! server, and a session `DELETE` is answered at once but forwarded only when the
//! session's running calls have settled (the server would otherwise cancel them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CallKey {
    session: String,
    actor: String,
    id: String,
}

/// The registry.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    calls: Mutex<HashMap<CallKey, usize>>,
    settled: Notify,
}

/// Removes its call from the registry when dropped.
#[derive(Debug)]
pub(crate) struct InflightGuard {
    registry: Arc<Inflight>,
    key: CallKey,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut calls = self.registry.lock();
        if let Some(count) = calls.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                calls.remove(&self.key);
            }
        }
        drop(calls);
        self.registry.settled.notify_waiters();
    }
}

impl Inflight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CallKey, usize>> {
        self.calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a running call whose policy is `complete`.
    pub(crate) fn enter(
        self: &Arc<Self>,
        session: Option<&str>,
        actor: &str,
        id: &str,
    ) -> InflightGuard {
        let key = CallKey {
            session: session.unwrap_or("").to_owned(),
            actor: actor.to_owned(),
            id: id.to_owned(),
        };
        *self.lock().entry(key.clone()).or_default() += 1;
        InflightGuard {
            registry: Arc::clone(self),
            key,
        }
    }

    /// Whether `id` names a running `complete` call of this actor in this session.
    pub(crate) fn is_running(&self, session: Option<&str>, actor: &str, id: &str) -> bool {
        self.lock().contains_key(&CallKey {
            session: session.unwrap_or("").to_owned(),
            actor: actor.to_owned(),
            id: id.to_owned(),
        })
    }

    fn session_busy(&self, session: &str) -> bool {
        self.lock().keys().any(|key| key.session == session)
    }

    /// Whether the session has running `complete` calls.
    pub(crate) fn has_session(&self, session: &str) -> bool {
        self.session_busy(session)
    }

    /// Waits until the session has no running `complete` call.
    pub(crate) async fn session_settled(&self, session: &str) {
        loop {
            let notified = self.settled.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if !self.session_busy(session) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_session_settles_when_its_calls_end() {
        let registry = Arc::new(Inflight::default());
        let guard = registry.enter(Some("s1"), "alice", "7");
        assert!(registry.is_running(Some("s1"), "alice", "7"));
        assert!(!registry.is_running(Some("s1"), "bob", "7"));
        assert!(registry.has_session("s1"));
        let waiter = tokio::spawn({
            let registry = Arc::clone(&registry);
            async move { registry.session_settled("s1").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(!registry.has_session("s1"));
    }
}
