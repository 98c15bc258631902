//! Actions: what a caller intends to do once, under a name it chooses, and the record the
//! journal keeps of it.
//!
//! An action's identity is its name; its key is minted once, when the action is first
//! recorded, and never changes. The command fingerprint binds the name to one command, so
//! that a changed command under the same name is seen before anything is sent.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The caller's name for one intended action: a task id, a workflow step, an agent's
/// tool-call id. The same name, in the same journal, always means the same action and so the
/// same `Idempotency-Key`.
///
/// Put it in the request's extensions (`http::Request::extensions_mut().insert(…)`, or
/// `reqwest_middleware::RequestBuilder::with_extension`) for the layer or the middleware to
/// find it. A request without one is a fresh action of its own: its key is kept for its
/// retries, but a later call cannot resume it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActionName(String);

impl ActionName {
    /// Names an action. Any non-empty string; it is stored in the journal as is.
    ///
    /// # Panics
    ///
    /// When `name` is empty: an empty name would make every unnamed call one action.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        assert!(!name.is_empty(), "an action name cannot be empty");
        Self(name)
    }

    /// The name as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an action stands, as last recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ActionState {
    /// Recorded with its key; nothing sent yet.
    Pending,
    /// An attempt is about to be sent or on the wire; its answer is not recorded.
    Sent,
    /// The server said the operation is still running (`409 request-in-progress`).
    InProgress,
    /// The server answered with a success (`2xx`), first or replayed.
    Succeeded,
    /// The server refused the command (a business failure, or retries ran out on
    /// `503`/`429`: then [`ActionRecord::retryable`] is set).
    Failed,
    /// The key was already used for a different command (`fingerprint-mismatch`).
    Conflict,
    /// Whether the action took effect is not known (`outcome-unknown`, or the attempts or
    /// the budget ran out without an answer); the key stays and a resume asks again.
    Unknown,
}

impl ActionState {
    /// Whether a resume answers from the journal instead of sending again.
    #[must_use]
    pub fn is_final(self, retryable: bool) -> bool {
        match self {
            Self::Succeeded | Self::Conflict => true,
            Self::Failed => !retryable,
            Self::Pending | Self::Sent | Self::InProgress | Self::Unknown => false,
        }
    }

    /// The journal's spelling (`pending`, `sent`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::InProgress => "in_progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Conflict => "conflict",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ActionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A digest of the command an action sends: method, URL and body, the JSON body in the
/// same RFC 8785 canonical form the server fingerprints (`canonicalize_json`), so member
/// order and whitespace do not make a different command.
///
/// It only has to tell, locally, whether a resumed action still sends the same command; it
/// is not the server's fingerprint (which also covers the matched route and the scope).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommandFingerprint(String);

impl CommandFingerprint {
    /// Fingerprints a command. A body that is I-JSON is digested in canonical form; any
    /// other body (not JSON, or JSON the server would refuse) by its bytes.
    #[must_use]
    pub fn of(method: &http::Method, url: &str, body: &[u8]) -> Self {
        let mut digest = Sha256::new();
        // Each field length-prefixed, so no two commands share an encoding.
        let mut field = |tag: u8, bytes: &[u8]| {
            digest.update([tag]);
            digest.update((bytes.len() as u64).to_be_bytes());
            digest.update(bytes);
        };
        field(b'V', b"tower-idempotency-client/command/v1");
        field(b'M', method.as_str().as_bytes());
        field(b'U', url.as_bytes());
        if body.is_empty() {
            field(b'E', b"");
        } else {
            match tower_idempotency_core::canonicalize_json(body) {
                Ok(canonical) => field(b'J', &canonical),
                Err(_) => field(b'B', body),
            }
        }
        Self(sha256_ref(&digest.finalize()))
    }

    /// `sha256:<64 hex>`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CommandFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The last answer the server gave an action, kept so that a resume of a finished action
/// can answer without sending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RecordedAnswer {
    /// The HTTP status.
    pub status: u16,
    /// Whether the server said it was a replay (`Idempotent-Replayed: true`).
    #[serde(default)]
    pub replayed: bool,
    /// The `Content-Type` of the body, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `sha256:<hex>` of the body: the reference to it even when it is not kept inline.
    pub body_sha256: String,
    /// The body itself, when it is UTF-8 and at most [`RecordedAnswer::INLINE_LIMIT`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl RecordedAnswer {
    /// Largest body kept inline in the journal, in bytes (64 KiB).
    pub const INLINE_LIMIT: usize = 64 * 1024;

    /// Records an answer.
    #[must_use]
    pub fn new(status: u16, replayed: bool, content_type: Option<String>, body: &[u8]) -> Self {
        let inline = (body.len() <= Self::INLINE_LIMIT)
            .then(|| std::str::from_utf8(body).ok().map(str::to_owned))
            .flatten();
        Self {
            status,
            replayed,
            content_type,
            body_sha256: sha256_ref(&Sha256::digest(body)),
            body: inline,
        }
    }
}

/// One action as the journal knows it. The journal keeps every version; the last one
/// recorded under a name is the action's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActionRecord {
    /// The caller's name for the action.
    pub action: String,
    /// The `Idempotency-Key`, minted when the action was first recorded.
    pub key: String,
    /// The request method.
    pub method: String,
    /// The request URL.
    pub url: String,
    /// The command's fingerprint ([`CommandFingerprint`]).
    pub fingerprint: CommandFingerprint,
    /// Where the action stands.
    pub state: ActionState,
    /// How many times the request has been sent, over every run of the action.
    pub attempts: u32,
    /// The server's `Operation-Id`, once an answer named it.
    #[serde(default)]
    pub operation_id: Option<String>,
    /// The server's status URL for the operation, once an answer gave one.
    #[serde(default)]
    pub status_url: Option<String>,
    /// With [`ActionState::Failed`]: whether sending again could still succeed (retries ran
    /// out on `503`/`429`), as opposed to a business failure.
    #[serde(default)]
    pub retryable: bool,
    /// The last answer, when there was one.
    #[serde(default)]
    pub answer: Option<RecordedAnswer>,
    /// When this version was recorded, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
}

impl ActionRecord {
    /// A new action in state [`ActionState::Pending`], with a fresh random key (UUIDv4).
    #[must_use]
    pub fn new(
        action: &ActionName,
        method: &http::Method,
        url: &str,
        fingerprint: CommandFingerprint,
    ) -> Self {
        Self {
            action: action.as_str().to_owned(),
            key: uuid::Uuid::new_v4().to_string(),
            method: method.as_str().to_owned(),
            url: url.to_owned(),
            fingerprint,
            state: ActionState::Pending,
            attempts: 0,
            operation_id: None,
            status_url: None,
            retryable: false,
            answer: None,
            recorded_at_ms: now_ms(),
        }
    }

    /// The same record moved to `state`, stamped now.
    #[must_use]
    pub fn with_state(mut self, state: ActionState) -> Self {
        self.state = state;
        self.recorded_at_ms = now_ms();
        self
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// `sha256:<64 lowercase hex>` of a digest.
fn sha256_ref(digest: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(7 + 2 * digest.len());
    text.push_str("sha256:");
    for byte in digest {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_reference_is_the_sha256_in_lowercase_hex() {
        assert_eq!(
            RecordedAnswer::new(200, false, None, b"").body_sha256,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn member_order_and_whitespace_do_not_change_the_command() {
        let a = CommandFingerprint::of(&http::Method::POST, "http://h/v1", br#"{"a":1,"b":"x"}"#);
        let b = CommandFingerprint::of(
            &http::Method::POST,
            "http://h/v1",
            br#"{ "b": "x", "a": 1.0 }"#,
        );
        assert_eq!(a, b);
        assert!(a.as_str().starts_with("sha256:") && a.as_str().len() == 7 + 64);
    }

    #[test]
    fn body_method_and_url_each_change_the_command() {
        let base = CommandFingerprint::of(&http::Method::POST, "http://h/v1", br#"{"a":1}"#);
        for other in [
            CommandFingerprint::of(&http::Method::POST, "http://h/v1", br#"{"a":2}"#),
            CommandFingerprint::of(&http::Method::PUT, "http://h/v1", br#"{"a":1}"#),
            CommandFingerprint::of(&http::Method::POST, "http://h/v2", br#"{"a":1}"#),
            CommandFingerprint::of(&http::Method::POST, "http://h/v1", b""),
            CommandFingerprint::of(&http::Method::POST, "http://h/v1", b"{\"a\":1"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn only_small_utf8_bodies_are_kept_inline() {
        let small = RecordedAnswer::new(201, false, None, b"{\"id\":1}");
        assert_eq!(small.body.as_deref(), Some("{\"id\":1}"));
        let big = RecordedAnswer::new(
            201,
            false,
            None,
            &vec![b'a'; RecordedAnswer::INLINE_LIMIT + 1],
        );
        assert_eq!(big.body, None);
        assert_ne!(big.body_sha256, small.body_sha256);
        assert_eq!(RecordedAnswer::new(200, false, None, &[0xff]).body, None);
    }

    #[test]
    fn final_states() {
        assert!(ActionState::Succeeded.is_final(false));
        assert!(ActionState::Conflict.is_final(false));
        assert!(ActionState::Failed.is_final(false));
        assert!(!ActionState::Failed.is_final(true));
        for state in [
            ActionState::Pending,
            ActionState::Sent,
            ActionState::InProgress,
            ActionState::Unknown,
        ] {
            assert!(!state.is_final(false), "{state}");
        }
    }
}
