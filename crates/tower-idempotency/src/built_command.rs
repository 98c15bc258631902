//! What a route's command is built from ([`CommandSource`]: the normalized JSON), what it
//! becomes ([`BuiltCommand`]) and how a normalizer or a command type refuses it
//! ([`CommandRejection`]). The vocabulary the policy, the command extractor, the fingerprint
//! and the problems share, so it sits below all of them.

use std::fmt;

/// A refusal from a command normalizer: the body is valid JSON but not a valid command.
/// The layer answers `422 invalid-command` with this detail; nothing is stored and the
/// handler does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRejection {
    detail: String,
}

impl CommandRejection {
    /// A rejection with a human-readable reason (sent to the client as `detail`).
    pub fn new(detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
        }
    }

    /// The reason.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for CommandRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for CommandRejection {}

/// A command built by the layer, for the handler's extractor and the approval condition.
pub(crate) type BuiltCommand = Box<dyn std::any::Any + Send>;

/// The normalized JSON a command is built from.
pub(crate) enum CommandSource<'a> {
    /// Still needed afterwards.
    Borrowed(&'a serde_json::Value),
    /// Moved into the command.
    Owned(serde_json::Value),
}
