//! The executions this instance is driving, by session and normalised JSON-RPC id, so that
//! the transport's cancellation signals stop only what they may stop: a
//! `notifications/cancelled` for a call whose policy is `complete` is answered `202`
//! without reaching the server, one from another caller than the call's own is refused,
//! and a session `DELETE` is answered at once but forwarded only when the session's
//! `complete` calls have settled (the server would otherwise cancel them).
//!
//! Calls are found by the session and the id in its normal form, never by the actor: the
//! server's own cancellation matches that way, so this registry must too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CallKey {
    session: String,
    /// The normalised id as JSON text (`5`, `"5"`).
    id: String,
}

/// Who runs a registered call, and whether it runs to completion.
#[derive(Debug)]
pub(crate) struct Caller {
    /// The actor (scope) of the call.
    pub(crate) actor: String,
    /// The principal of the call, when the layer reads one.
    pub(crate) principal: Option<String>,
    /// Whether the call's policy is `complete` (a cancellation never stops it).
    pub(crate) complete: bool,
}

/// What the layer does with a `notifications/cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancellation {
    /// No call of this instance answers to it, or only cancellable calls of the same
    /// caller: the server gets it.
    Forward,
    /// A call of the same caller that runs to completion: answered `202`, not forwarded.
    Hold,
    /// A call of another caller: refused, not forwarded.
    Forbidden,
}

/// The registry.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    calls: Mutex<HashMap<CallKey, Vec<Arc<Caller>>>>,
    settled: Notify,
}

/// Removes its call from the registry when dropped.
#[derive(Debug)]
pub(crate) struct InflightGuard {
    registry: Arc<Inflight>,
    key: CallKey,
    caller: Arc<Caller>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut calls = self.registry.lock();
        if let Some(callers) = calls.get_mut(&self.key) {
            callers.retain(|caller| !Arc::ptr_eq(caller, &self.caller));
            if callers.is_empty() {
                calls.remove(&self.key);
            }
        }
        drop(calls);
        self.registry.settled.notify_waiters();
    }
}

fn key(session: Option<&str>, id: &Value) -> CallKey {
    CallKey {
        session: session.unwrap_or("").to_owned(),
        id: id.to_string(),
    }
}

/// The id a server with looser matching might also take `id` for: a string that is the
/// decimal text of an integer id, and that integer's text as a string.
fn other_spelling(id: &Value) -> Option<Value> {
    match id {
        Value::String(text) => text
            .parse::<i64>()
            .ok()
            .filter(|number| number.to_string() == *text)
            .map(Value::from),
        Value::Number(number) => Some(Value::String(number.to_string())),
        _ => None,
    }
}

impl Inflight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CallKey, Vec<Arc<Caller>>>> {
        self.calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a running guarded call under its session and normalised id.
    pub(crate) fn enter(
        self: &Arc<Self>,
        session: Option<&str>,
        id: &Value,
        caller: Caller,
    ) -> InflightGuard {
        let key = key(session, id);
        let caller = Arc::new(caller);
        self.lock()
            .entry(key.clone())
            .or_default()
            .push(Arc::clone(&caller));
        InflightGuard {
            registry: Arc::clone(self),
            key,
            caller,
        }
    }

    /// What a cancellation of the normalised `id` in `session`, sent by `actor` (and
    /// `principal`), may do. A string id and an integer with the same digits are taken for
    /// one id here: when in doubt, a cancellation is not forwarded.
    pub(crate) fn cancellation(
        &self,
        session: Option<&str>,
        id: &Value,
        actor: Option<&str>,
        principal: Option<&str>,
    ) -> Cancellation {
        let calls = self.lock();
        let callers: Vec<&Arc<Caller>> = std::iter::once(id.clone())
            .chain(other_spelling(id))
            .filter_map(|id| calls.get(&key(session, &id)))
            .flatten()
            .collect();
        if callers.is_empty() {
            return Cancellation::Forward;
        }
        let own = |caller: &Caller| {
            Some(caller.actor.as_str()) == actor
                && caller
                    .principal
                    .as_deref()
                    .is_none_or(|expected| Some(expected) == principal)
        };
        if !callers.iter().all(|caller| own(caller)) {
            Cancellation::Forbidden
        } else if callers.iter().any(|caller| caller.complete) {
            Cancellation::Hold
        } else {
            Cancellation::Forward
        }
    }

    fn session_busy(&self, session: &str) -> bool {
        self.lock().iter().any(|(key, callers)| {
            key.session == session && callers.iter().any(|caller| caller.complete)
        })
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

    use serde_json::json;

    use super::*;

    fn caller(actor: &str, complete: bool) -> Caller {
        Caller {
            actor: actor.to_owned(),
            principal: None,
            complete,
        }
    }

    #[tokio::test]
    async fn a_session_settles_when_its_calls_end() {
        let registry = Arc::new(Inflight::default());
        let guard = registry.enter(Some("s1"), &json!(7), caller("alice", true));
        let cancellable = registry.enter(Some("s1"), &json!(8), caller("alice", false));
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
        // A cancellable call does not hold the session's close back.
        assert!(!registry.has_session("s1"));
        drop(cancellable);
    }

    #[test]
    fn cancellations_match_by_session_and_id_and_only_the_caller_may_cancel() {
        let registry = Arc::new(Inflight::default());
        let _complete = registry.enter(Some("s1"), &json!(7), caller("alice", true));
        let _cancellable = registry.enter(Some("s1"), &json!(8), caller("alice", false));
        let _keyed = registry.enter(
            Some("s1"),
            &json!(9),
            Caller {
                principal: Some("dana".to_owned()),
                ..caller("alice", false)
            },
        );
        let verdict = |id: Value, actor: Option<&str>, principal: Option<&str>| {
            registry.cancellation(Some("s1"), &id, actor, principal)
        };
        assert_eq!(verdict(json!(7), Some("alice"), None), Cancellation::Hold);
        assert_eq!(verdict(json!("7"), Some("alice"), None), Cancellation::Hold);
        assert_eq!(
            verdict(json!(7), Some("bob"), None),
            Cancellation::Forbidden
        );
        assert_eq!(verdict(json!(7), None, None), Cancellation::Forbidden);
        assert_eq!(
            verdict(json!(8), Some("alice"), None),
            Cancellation::Forward
        );
        assert_eq!(
            verdict(json!(8), Some("bob"), None),
            Cancellation::Forbidden
        );
        assert_eq!(
            verdict(json!(9), Some("alice"), Some("dana")),
            Cancellation::Forward
        );
        assert_eq!(
            verdict(json!(9), Some("alice"), Some("eve")),
            Cancellation::Forbidden
        );
        // Another session, or an id nothing runs under: the server decides.
        assert_eq!(
            registry.cancellation(Some("s2"), &json!(7), Some("bob"), None),
            Cancellation::Forward
        );
        assert_eq!(verdict(json!(70), Some("bob"), None), Cancellation::Forward);
        assert_eq!(
            verdict(json!("07"), Some("bob"), None),
            Cancellation::Forward
        );
    }
}
