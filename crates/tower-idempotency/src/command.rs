//! One parse per request: the command a route's normalizer validated, handed to the
//! handler.
//!
//! A route with a command type ([`RoutePolicy::with_command`](crate::RoutePolicy::with_command))
//! parses its JSON body into a [`serde_json::Value`] in the layer, normalizes it,
//! fingerprints what the normalizer left and builds the command type from it, all before
//! anything is reserved. The layer then puts that typed command in the request extensions,
//! and the [`ValidatedJson`] extractor (feature `axum`) takes it from there instead of
//! parsing the body a second time (a route with only a normalizer hands over the
//! normalized JSON, which the extractor deserializes). The layer's parse is the
//! fingerprint's: one [`JsonDocument`](tower_idempotency_core::canonical::JsonDocument)
//! validates the body, becomes the `Value` the normalizer edits, and nothing reads the bytes
//! again. A route with neither keeps no `Value` at all (its fingerprint is streamed from the
//! parsed tree), so there, and wherever the layer parsed nothing (no key on an optional
//! route, no layer at all), the extractor parses the body itself, with the same rules: JSON
//! only, I-JSON ([`parse_json`](tower_idempotency_core::canonical::parse_json)), then the
//! command's own [`JsonCommand::normalize`].
//!
//! Invariant: on a route with a normalizer the handler executes exactly the command that
//! was fingerprinted: the extractor never normalizes the layer's value again.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::built_command::CommandRejection;

/// A JSON command type: what a handler executes, with the normalization that defines it.
///
/// `normalize` applies defaults, drops server-assigned fields and refuses invalid or
/// unknown fields (see [`RoutePolicy::with_normalizer`](crate::RoutePolicy::with_normalizer));
/// [`RoutePolicy::with_command`](crate::RoutePolicy::with_command) makes it the route's
/// normalizer, so that the layer and the `ValidatedJson` extractor's fallback run the same
/// validation. The default normalizes nothing.
///
/// ```
/// use serde::Deserialize;
/// use tower_idempotency::{CommandRejection, JsonCommand};
///
/// #[derive(Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct NewTicket {
///     title: String,
///     priority: String,
/// }
///
/// impl JsonCommand for NewTicket {
///     fn normalize(command: &mut serde_json::Value) -> Result<(), CommandRejection> {
///         let object = command
///             .as_object_mut()
///             .ok_or_else(|| CommandRejection::new("the command must be a JSON object"))?;
///         object.entry("priority").or_insert("normal".into());
///         Ok(())
///     }
/// }
///
/// let mut command = serde_json::json!({"title": "Disk full"});
/// NewTicket::normalize(&mut command).unwrap();
/// assert_eq!(command["priority"], "normal");
/// ```
pub trait JsonCommand: DeserializeOwned {
    /// Validates `command` and brings it to its normal form, in place.
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        let _ = command;
        Ok(())
    }
}

/// The normalized command of a guarded request, as the layer fingerprinted it; taken out
/// of the extensions by the `ValidatedJson` extractor (feature `axum`; without it nothing
/// reads it back).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) struct ParsedCommand(pub(crate) Value);

/// The typed command of a guarded request on a route with a command type, built by the
/// layer; taken out of the extensions (once) by the [`ValidatedJson`] extractor.
///
/// Extensions must be `Clone + Sync`; a command type need be neither, so the command sits
/// in a shared slot that the extractor empties.
#[derive(Clone)]
pub(crate) struct TypedCommand(
    std::sync::Arc<std::sync::Mutex<Option<crate::policy::BuiltCommand>>>,
);

impl TypedCommand {
    pub(crate) fn new(command: crate::policy::BuiltCommand) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Some(command))))
    }

    /// The command, if it is a `T` and was not taken yet.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn take<T: 'static>(&self) -> Option<T> {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let command = slot.take()?;
        match command.downcast::<T>() {
            Ok(command) => Some(*command),
            Err(other) => {
                *slot = Some(other);
                None
            }
        }
    }
}

impl std::fmt::Debug for TypedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TypedCommand").finish_non_exhaustive()
    }
}
