//! The demo's write commands and their validation, as plain functions over JSON.
//!
//! The same `normalize_*` functions serve two places, through each command type's
//! [`JsonCommand`] implementation: inside the idempotency layer as the route's normalizer
//! (so the fingerprint describes the command the handler will execute, defaults applied,
//! and invalid commands are refused with `422` before anything is stored), and in the
//! handlers' [`ValidatedJson`](tower_idempotency::ValidatedJson) extractor when no layer
//! parsed the body (so `--no-idempotency` refuses exactly the same requests). Behind the
//! layer the handler deserializes the command the layer already normalized: the body is
//! parsed once per request. Normalizing is idempotent: a normalized command normalizes to
//! itself.
//! Unknown fields are refused, never ignored, so that a typo cannot pass as a different
//! command with the same fingerprint.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tower_idempotency::{CommandRejection, JsonCommand};

use crate::problem::Problem;

/// Largest `amount_minor` accepted: the largest integer a double holds exactly, so that the
/// amount means the same to every JSON reader.
pub const MAX_AMOUNT_MINOR: u64 = (1 << 53) - 1;

/// A validated `POST /v1/tickets` command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTicket {
    /// Project the ticket belongs to.
    pub project: String,
    /// One-line summary.
    pub title: String,
    /// `low`, `normal` or `high`.
    pub priority: String,
    /// Free text.
    pub description: Option<String>,
    /// Id of the upstream event that caused the ticket; one ticket per event per account.
    pub source_event_id: Option<String>,
}

/// A validated `POST /v1/payments` command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPayment {
    /// Amount in the currency's minor unit (cents), at least 1.
    pub amount_minor: u64,
    /// ISO 4217 code: three uppercase letters.
    pub currency: String,
    /// The invoice being paid; each invoice is paid at most once per account.
    pub invoice_ref: String,
    /// Who is paid.
    pub payee: String,
}

/// A deploy's target environment. Accepted case-insensitively and trimmed of ASCII
/// whitespace (`"Production "` is production), refused with `422 invalid-command` when it
/// is none of these or carries anything but ASCII letters (`"production\u{200b}"`, a
/// fullwidth spelling): a spelling can never make production look like something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    /// `development`.
    Development,
    /// `staging`.
    Staging,
    /// `production`: deploys need a person's approval.
    Production,
}

impl Environment {
    /// Every environment, in its normal spelling.
    pub const ALL: [Environment; 3] = [
        Environment::Development,
        Environment::Staging,
        Environment::Production,
    ];

    /// The normal spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Environment::Development => "development",
            Environment::Staging => "staging",
            Environment::Production => "production",
        }
    }

    /// The environment `text` names: trimmed of ASCII whitespace, ASCII case-insensitive;
    /// `None` for anything else (other characters are never folded).
    ///
    /// ```
    /// use demo::commands::Environment;
    /// assert_eq!(Environment::parse(" PRODUCTION "), Some(Environment::Production));
    /// assert_eq!(Environment::parse("production\u{200b}"), None);
    /// assert_eq!(Environment::parse("\u{ff50}roduction"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim_ascii();
        Self::ALL
            .into_iter()
            .find(|environment| environment.as_str().eq_ignore_ascii_case(text))
    }
}

/// A validated `POST /v1/deploys` command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewDeploy {
    /// Service to deploy.
    pub service: String,
    /// Target environment.
    pub environment: Environment,
    /// Immutable artifact digest, `sha256:<64 lowercase hex>`.
    pub artifact: String,
}

/// The layer's form of a demo normalizer: every refusal is a `422 invalid-command`, whose
/// detail is the problem's.
fn layer_normalizer(
    normalize: fn(&mut Value) -> Result<(), Problem>,
    command: &mut Value,
) -> Result<(), CommandRejection> {
    normalize(command).map_err(|problem| CommandRejection::new(problem.detail()))
}

impl JsonCommand for NewTicket {
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        layer_normalizer(normalize_ticket, command)
    }
}

impl JsonCommand for NewPayment {
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        layer_normalizer(normalize_payment, command)
    }
}

impl JsonCommand for NewDeploy {
    fn normalize(command: &mut Value) -> Result<(), CommandRejection> {
        layer_normalizer(normalize_deploy, command)
    }
}

/// Validates a ticket command and applies its defaults (`priority: "normal"`; `null`
/// optional fields are dropped).
///
/// ```
/// let mut command = serde_json::json!({"project": "ops", "title": "Disk full"});
/// demo::commands::normalize_ticket(&mut command).unwrap();
/// assert_eq!(command["priority"], "normal");
///
/// let mut bad = serde_json::json!({"project": "ops", "title": "x", "priority": "urgent"});
/// let problem = demo::commands::normalize_ticket(&mut bad).unwrap_err();
/// assert_eq!(problem.status(), 422);
/// ```
pub fn normalize_ticket(command: &mut Value) -> Result<(), Problem> {
    let object = as_object(
        command,
        &[
            "project",
            "title",
            "priority",
            "description",
            "source_event_id",
        ],
    )?;
    required_text(object, "project")?;
    required_text(object, "title")?;
    drop_null(object, "priority");
    match object.get("priority") {
        None => {
            object.insert("priority".to_owned(), Value::from("normal"));
        }
        Some(Value::String(p)) if matches!(p.as_str(), "low" | "normal" | "high") => {}
        Some(_) => {
            return Err(Problem::invalid_command(
                "priority must be one of \"low\", \"normal\", \"high\"",
            ));
        }
    }
    drop_null(object, "description");
    if let Some(description) = object.get("description")
        && !description.is_string()
    {
        return Err(Problem::invalid_command("description must be a string"));
    }
    drop_null(object, "source_event_id");
    if object.contains_key("source_event_id") {
        required_text(object, "source_event_id")?;
    }
    Ok(())
}

/// Validates a payment command: `amount_minor` a JSON integer in
/// `1..=`[`MAX_AMOUNT_MINOR`] (`1.5` and `"100"` are refused), `currency` three uppercase
/// ASCII letters, `invoice_ref` and `payee` non-blank strings.
///
/// ```
/// let mut ok = serde_json::json!(
///     {"amount_minor": 1250, "currency": "EUR", "invoice_ref": "INV-1", "payee": "ACME"});
/// assert!(demo::commands::normalize_payment(&mut ok).is_ok());
///
/// let mut fractional = serde_json::json!(
///     {"amount_minor": 1.5, "currency": "EUR", "invoice_ref": "INV-1", "payee": "ACME"});
/// assert!(demo::commands::normalize_payment(&mut fractional).is_err());
/// ```
pub fn normalize_payment(command: &mut Value) -> Result<(), Problem> {
    let object = as_object(
        command,
        &["amount_minor", "currency", "invoice_ref", "payee"],
    )?;
    match object.get("amount_minor") {
        Some(Value::Number(n))
            if n.as_u64()
                .is_some_and(|a| (1..=MAX_AMOUNT_MINOR).contains(&a)) => {}
        Some(Value::Number(_)) => {
            return Err(Problem::invalid_command(format!(
                "amount_minor must be an integer between 1 and {MAX_AMOUNT_MINOR} (minor units, e.g. cents)"
            )));
        }
        Some(_) => {
            return Err(Problem::invalid_command(
                "amount_minor must be a JSON integer, not a string or other value",
            ));
        }
        None => return Err(Problem::invalid_command("amount_minor is required")),
    }
    match object.get("currency") {
        Some(Value::String(c)) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()) => {}
        Some(_) => {
            return Err(Problem::invalid_command(
                "currency must be three uppercase letters (ISO 4217), e.g. \"EUR\"",
            ));
        }
        None => return Err(Problem::invalid_command("currency is required")),
    }
    required_text(object, "invoice_ref")?;
    required_text(object, "payee")?;
    Ok(())
}

/// Validates a deploy command: `service` a non-blank string, `environment` one of
/// [`Environment`] (rewritten to its normal spelling, so that every spelling of one
/// environment is one command with one fingerprint), `artifact` an immutable digest
/// `sha256:<64 lowercase hex>`. Mutable references (`latest`, a branch or tag name) are
/// refused: redeploying "the same" command must deploy the same bits.
///
/// ```
/// let mut shouted = serde_json::json!({"service": "api", "environment": "Production ",
///     "artifact": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"});
/// demo::commands::normalize_deploy(&mut shouted).unwrap();
/// assert_eq!(shouted["environment"], "production");
///
/// let mut mutable = serde_json::json!(
///     {"service": "api", "environment": "staging", "artifact": "registry/api:latest"});
/// let problem = demo::commands::normalize_deploy(&mut mutable).unwrap_err();
/// assert!(problem.detail().contains("immutable"));
/// ```
pub fn normalize_deploy(command: &mut Value) -> Result<(), Problem> {
    let object = as_object(command, &["service", "environment", "artifact"])?;
    required_text(object, "service")?;
    let environment = match object.get("environment") {
        Some(Value::String(text)) => Environment::parse(text).ok_or_else(|| {
            Problem::invalid_command(
                "environment must be one of \"development\", \"staging\", \"production\"",
            )
        })?,
        Some(_) => return Err(Problem::invalid_command("environment must be a string")),
        None => return Err(Problem::invalid_command("environment is required")),
    };
    object.insert("environment".to_owned(), Value::from(environment.as_str()));
    match object.get("artifact") {
        Some(Value::String(a)) if is_sha256_digest(a) => Ok(()),
        Some(Value::String(a)) => Err(Problem::invalid_command(format!(
            "artifact must be an immutable digest `sha256:<64 lowercase hex>`; `{}` is a mutable reference",
            truncate(a, 80)
        ))),
        Some(_) => Err(Problem::invalid_command(
            "artifact must be a string `sha256:<64 lowercase hex>`",
        )),
        None => Err(Problem::invalid_command("artifact is required")),
    }
}

/// Parses a request body into a typed command: I-JSON with the layer's own parser (else
/// `422 invalid-json`, so duplicate members or imprecise integers are refused with or without
/// the layer), then the route's normalizer, then the typed fields (else
/// `422 invalid-command`).
pub fn parse_command<T: DeserializeOwned>(
    body: &[u8],
    normalize: fn(&mut Value) -> Result<(), Problem>,
) -> Result<T, Problem> {
    let mut value = tower_idempotency::parse_json(body)
        .map_err(|e| Problem::invalid_json(format!("the body is not valid JSON: {e}")))?;
    normalize(&mut value)?;
    serde_json::from_value(value).map_err(|e| Problem::invalid_command(e.to_string()))
}

fn as_object<'a>(
    command: &'a mut Value,
    allowed: &[&str],
) -> Result<&'a mut Map<String, Value>, Problem> {
    let Value::Object(object) = command else {
        return Err(Problem::invalid_command(
            "the command must be a JSON object",
        ));
    };
    if let Some(unknown) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Problem::invalid_command(format!(
            "unknown field `{}`; allowed fields: {}",
            truncate(unknown, 80),
            allowed.join(", ")
        )));
    }
    Ok(object)
}

fn required_text(object: &Map<String, Value>, field: &str) -> Result<(), Problem> {
    match object.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(()),
        Some(Value::String(_)) => Err(Problem::invalid_command(format!(
            "{field} must not be blank"
        ))),
        Some(_) => Err(Problem::invalid_command(format!(
            "{field} must be a string"
        ))),
        None => Err(Problem::invalid_command(format!("{field} is required"))),
    }
}

fn drop_null(object: &mut Map<String, Value>, field: &str) {
    if object.get(field).is_some_and(Value::is_null) {
        object.remove(field);
    }
}

fn is_sha256_digest(artifact: &str) -> bool {
    artifact.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn ticket_defaults_and_idempotence() {
        let mut command = json!({"project": "ops", "title": "t", "description": null});
        normalize_ticket(&mut command).unwrap();
        assert_eq!(
            command,
            json!({"project": "ops", "title": "t", "priority": "normal"})
        );
        let once = command.clone();
        normalize_ticket(&mut command).unwrap();
        assert_eq!(command, once, "normalizing twice changes nothing");
    }

    #[test]
    fn ticket_refusals() {
        for bad in [
            json!([]),
            json!({"title": "t"}),
            json!({"project": "", "title": "t"}),
            json!({"project": "  ", "title": "t"}),
            json!({"project": 1, "title": "t"}),
            json!({"project": "p", "title": "t", "priority": "urgent"}),
            json!({"project": "p", "title": "t", "description": 3}),
            json!({"project": "p", "title": "t", "source_event_id": ""}),
            json!({"project": "p", "title": "t", "assignee": "me"}),
        ] {
            let mut command = bad.clone();
            let problem = normalize_ticket(&mut command).unwrap_err();
            assert_eq!(problem.slug(), "invalid-command", "{bad}");
        }
    }

    #[test]
    fn payment_amounts() {
        let payment = |amount: Value| json!({"amount_minor": amount, "currency": "EUR", "invoice_ref": "I", "payee": "P"});
        for ok in [json!(1), json!(100), json!(MAX_AMOUNT_MINOR)] {
            assert!(normalize_payment(&mut payment(ok.clone())).is_ok(), "{ok}");
        }
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!(100.0),
            json!("100"),
            json!(null),
            json!(MAX_AMOUNT_MINOR + 1),
        ] {
            assert!(
                normalize_payment(&mut payment(bad.clone())).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn payment_fields() {
        for bad in [
            json!({"amount_minor": 1, "currency": "eur", "invoice_ref": "I", "payee": "P"}),
            json!({"amount_minor": 1, "currency": "EURO", "invoice_ref": "I", "payee": "P"}),
            json!({"amount_minor": 1, "currency": "EUR", "invoice_ref": "", "payee": "P"}),
            json!({"amount_minor": 1, "currency": "EUR", "invoice_ref": "I"}),
            json!({"amount_minor": 1, "currency": "EUR", "invoice_ref": "I", "payee": "P", "memo": "x"}),
        ] {
            assert!(normalize_payment(&mut bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn deploy_artifacts() {
        let deploy = |artifact: &str| json!({"service": "api", "environment": "staging", "artifact": artifact});
        assert!(normalize_deploy(&mut deploy(DIGEST)).is_ok());
        for bad in [
            "latest",
            "main",
            "registry/api:latest",
            "sha256:abc",
            &DIGEST.to_uppercase(),
            &format!("{DIGEST}0"),
        ] {
            assert!(normalize_deploy(&mut deploy(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn deploy_environments_have_one_spelling() {
        let deploy = |environment: &str| json!({"service": "api", "environment": environment, "artifact": DIGEST});
        for spelling in [
            "production",
            "Production",
            "PRODUCTION",
            "production ",
            "\tproduction\n",
        ] {
            let mut command = deploy(spelling);
            normalize_deploy(&mut command).unwrap();
            assert_eq!(command["environment"], "production", "{spelling:?}");
        }
        for refused in [
            "production\u{200b}",
            "\u{ff50}\u{ff52}\u{ff4f}\u{ff44}\u{ff55}\u{ff43}\u{ff54}\u{ff49}\u{ff4f}\u{ff4e}",
            "pro\u{200d}duction",
            "prod",
            "",
        ] {
            assert!(
                normalize_deploy(&mut deploy(refused)).is_err(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn parse_command_distinguishes_json_from_command_errors() {
        let err = parse_command::<NewTicket>(b"{not json", normalize_ticket).unwrap_err();
        assert_eq!(err.slug(), "invalid-json");
        let err = parse_command::<NewTicket>(br#"{"project": "p"}"#, normalize_ticket).unwrap_err();
        assert_eq!(err.slug(), "invalid-command");
        let ticket =
            parse_command::<NewTicket>(br#"{"project": "p", "title": "t"}"#, normalize_ticket)
                .unwrap();
        assert_eq!(ticket.priority, "normal");
    }
}
