//! What an approver is shown: [`ApprovalSummary`], a small set of typed fields, and the
//! bounds every summary keeps, whoever built it.
//!
//! The values in a summary come from the command, so from the requester — very often an
//! agent that can be steered by what it read. A summary therefore never carries a sentence
//! built by interpolating the command's text, and every string in it is checked by class:
//!
//! - **text** ([`ApprovalSummary::text`], and every string of a summary given as plain
//!   JSON) is *neutralised*: a control, format (`Cf`, the bidi controls U+202A–U+202E and
//!   U+2066–U+2069, the zero-width characters U+200B–U+200F, U+FEFF, …), default-ignorable,
//!   private-use or noncharacter code point is replaced by a visible `[U+XXXX]`, so the
//!   approver sees that it is there and where; every run of whitespace (new lines, tabs,
//!   Unicode spaces, line and paragraph separators) becomes one space and the ends are
//!   trimmed. Text longer than [`SummaryLimits::max_text_chars`] after that is *refused*:
//!   a summary is never cut, because the part cut off is the part the approver would not
//!   see.
//! - **labels** ([`ApprovalSummary::label`], enum-like values such as an environment) and
//!   **identifiers** ([`ApprovalSummary::identifier`]: references, artifacts, accounts)
//!   are *refused* unless they are within their narrow ASCII alphabet: they are compared by
//!   eye, so nothing invisible or look-alike may pass.
//! - **amounts** ([`ApprovalSummary::amount`]) are an integer of minor units and an ISO
//!   4217 currency code (three uppercase ASCII letters, else refused); **flags** are
//!   booleans.
//! - the whole summary is *refused* past [`SummaryLimits::max_fields`] fields or
//!   [`SummaryLimits::max_bytes`] bytes of JSON.
//!
//! A refusal is a [`SummaryError`]: the layers answer it as `422 invalid-command` (an MCP
//! tool call: an `invalid-command` error) before anything is stored.

use serde_json::{Map, Value};

/// Bounds on what an approver is shown ([`ApprovalPolicy::with_summary_limits`]).
///
/// [`ApprovalPolicy::with_summary_limits`]: super::ApprovalPolicy::with_summary_limits
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SummaryLimits {
    /// Longest text value, in characters, after neutralisation (default 200).
    pub max_text_chars: usize,
    /// Most fields in one summary (default 32; for a JSON summary, members and array
    /// items counted at every level).
    pub max_fields: usize,
    /// Largest summary, in bytes of its JSON text (default 4096).
    pub max_bytes: usize,
}

impl SummaryLimits {
    /// The defaults: 200 characters of text per field, 32 fields, 4096 bytes.
    pub const DEFAULT: Self = Self {
        max_text_chars: 200,
        max_fields: 32,
        max_bytes: 4096,
    };

    /// These limits with `max_text_chars` characters per text value.
    #[must_use]
    pub const fn with_max_text_chars(mut self, max_text_chars: usize) -> Self {
        self.max_text_chars = max_text_chars;
        self
    }

    /// These limits with at most `max_fields` fields.
    #[must_use]
    pub const fn with_max_fields(mut self, max_fields: usize) -> Self {
        self.max_fields = max_fields;
        self
    }

    /// These limits with at most `max_bytes` bytes of JSON.
    #[must_use]
    pub const fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl Default for SummaryLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 64;

/// Longest identifier, in characters.
pub const MAX_IDENTIFIER_CHARS: usize = 128;

/// Deepest nesting of a summary given as plain JSON.
const MAX_DEPTH: usize = 4;

/// Why a summary cannot be shown to an approver. The message names the field, never its
/// value (which may be hostile, or large).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SummaryError {
    /// A field name that is not 1–64 of `a-z`, `0-9`, `_` starting with a letter.
    #[error("approval summary field name `{name}` is not 1-64 of a-z, 0-9, _")]
    InvalidName {
        /// The name (neutralised, shortened).
        name: String,
    },
    /// The same field twice.
    #[error("approval summary field `{name}` is given twice")]
    DuplicateField {
        /// The field.
        name: String,
    },
    /// More fields than the limit.
    #[error("the approval summary has more than {max} fields")]
    TooManyFields {
        /// The limit.
        max: usize,
    },
    /// A text value longer than the limit after neutralisation.
    #[error("`{field}` is longer than {max_chars} characters, the most an approver is shown")]
    TextTooLong {
        /// The field.
        field: String,
        /// The limit.
        max_chars: usize,
    },
    /// A label outside its alphabet.
    #[error(
        "`{field}` must be 1-64 of A-Z, a-z, 0-9 and `_ - . : /`, words separated by single spaces"
    )]
    InvalidLabel {
        /// The field.
        field: String,
    },
    /// An identifier outside its alphabet.
    #[error("`{field}` must be 1-128 visible ASCII characters (no spaces)")]
    InvalidIdentifier {
        /// The field.
        field: String,
    },
    /// The command is not of the type its summary is built from
    /// ([`ApprovalPolicy::with_command_summary`](super::ApprovalPolicy::with_command_summary)).
    #[error("the command is not a `{command_type}`, the type its approval summary is built from")]
    NotTheCommandType {
        /// The command type's Rust name.
        command_type: &'static str,
    },
    /// A currency that is not three uppercase ASCII letters.
    #[error("the currency of `{field}` must be three uppercase letters (ISO 4217)")]
    InvalidCurrency {
        /// The field.
        field: String,
    },
    /// A JSON summary nested deeper than the limit, or a non-finite number.
    #[error("the approval summary nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// The summary's JSON text is larger than the limit.
    #[error(
        "the approval summary would be {bytes} bytes, more than the {max_bytes} an approver is shown"
    )]
    TooLarge {
        /// The summary's size (as far as it was counted).
        bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
}

/// What an approver is shown, as typed fields: built from the validated command, checked
/// field by field (see the module docs of `approval::summary` for what is neutralised and what is
/// refused), rendered as a flat JSON object.
///
/// The builder records the first refusal and keeps going, so a summary is one expression;
/// [`ApprovalSummary::into_json`] (called by the layers) returns it.
///
/// ```
/// use serde_json::json;
/// use tower_idempotency_core::approval::{ApprovalSummary, SummaryLimits};
///
/// let summary = ApprovalSummary::new("payment")
///     .text("payee", "ACME\u{202E} GmbH\n\n\n   pre-approved")
///     .amount("amount", 250_000, "EUR")
///     .identifier("invoice_ref", "INV-9")
///     .flag("reversible", false)
///     .into_json(&SummaryLimits::default())
///     .unwrap();
/// assert_eq!(summary["operation"], "payment");
/// assert_eq!(summary["payee"], "ACME[U+202E] GmbH pre-approved");
/// assert_eq!(summary["amount"], json!({"minor_units": 250000, "currency": "EUR"}));
///
/// let refused = ApprovalSummary::new("deploy")
///     .identifier("artifact", "registry/api:1.4\u{200B}")
///     .into_json(&SummaryLimits::default());
/// assert!(refused.is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct ApprovalSummary {
    fields: Vec<(String, Field)>,
    error: Option<SummaryError>,
}

/// One field, checked when the summary is rendered (the limits are the policy's).
#[derive(Debug, Clone, PartialEq)]
enum Field {
    Text(String),
    Label(String),
    Identifier(String),
    Amount { minor_units: i64, currency: String },
    Integer(i64),
    Flag(bool),
}

impl ApprovalSummary {
    /// A summary of the operation named `operation`, a [label](Self::label) (`deploy`,
    /// `payment`, `refund`), shown as the field `operation`.
    pub fn new(operation: &str) -> Self {
        Self {
            fields: Vec::new(),
            error: None,
        }
        .label("operation", operation)
    }

    fn with(mut self, name: &str, field: Field) -> Self {
        if self.error.is_some() {
            return self;
        }
        if !valid_name(name) {
            self.error = Some(SummaryError::InvalidName {
                name: shorten(&neutralise(name)),
            });
        } else if self.fields.iter().any(|(existing, _)| existing == name) {
            self.error = Some(SummaryError::DuplicateField {
                name: name.to_owned(),
            });
        } else {
            self.fields.push((name.to_owned(), field));
        }
        self
    }

    /// Free text (a payee's name, a title): neutralised — control, format, bidi,
    /// zero-width and other invisible code points shown as `[U+XXXX]`, whitespace runs
    /// collapsed to one space, ends trimmed — and refused past
    /// [`SummaryLimits::max_text_chars`].
    pub fn text(self, name: &str, value: &str) -> Self {
        self.with(name, Field::Text(value.to_owned()))
    }

    /// An enum-like value (an environment, a tier, a kind): 1–64 ASCII letters, digits and
    /// `_ - . : /`, words separated by single spaces; anything else is refused.
    pub fn label(self, name: &str, value: &str) -> Self {
        self.with(name, Field::Label(value.to_owned()))
    }

    /// An identifier (a reference, an artifact, an account): 1–128 visible ASCII
    /// characters, no spaces; anything else is refused.
    pub fn identifier(self, name: &str, value: &str) -> Self {
        self.with(name, Field::Identifier(value.to_owned()))
    }

    /// An amount: `minor_units` of `currency` (three uppercase ASCII letters, else
    /// refused), shown as `{"minor_units": …, "currency": "…"}`.
    pub fn amount(self, name: &str, minor_units: i64, currency: &str) -> Self {
        self.with(
            name,
            Field::Amount {
                minor_units,
                currency: currency.to_owned(),
            },
        )
    }

    /// A whole number (a count, a replica number).
    pub fn integer(self, name: &str, value: i64) -> Self {
        self.with(name, Field::Integer(value))
    }

    /// A yes/no fact (`reversible`).
    pub fn flag(self, name: &str, value: bool) -> Self {
        self.with(name, Field::Flag(value))
    }

    /// The summary as the JSON object the approver is shown, or why it cannot be shown.
    pub fn into_json(self, limits: &SummaryLimits) -> Result<Value, SummaryError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if self.fields.len() > limits.max_fields {
            return Err(SummaryError::TooManyFields {
                max: limits.max_fields,
            });
        }
        let mut object = Map::new();
        for (name, field) in self.fields {
            let value = match field {
                Field::Text(text) => Value::String(text_value(&name, &text, limits)?),
                Field::Label(label) if valid_label(&label) => Value::String(label),
                Field::Label(_) => return Err(SummaryError::InvalidLabel { field: name }),
                Field::Identifier(id) if valid_identifier(&id) => Value::String(id),
                Field::Identifier(_) => {
                    return Err(SummaryError::InvalidIdentifier { field: name });
                }
                Field::Amount {
                    minor_units,
                    currency,
                } if valid_currency(&currency) => serde_json::json!({
                    "minor_units": minor_units,
                    "currency": currency,
                }),
                Field::Amount { .. } => return Err(SummaryError::InvalidCurrency { field: name }),
                Field::Integer(value) => Value::from(value),
                Field::Flag(value) => Value::Bool(value),
            };
            object.insert(name, value);
        }
        let summary = Value::Object(object);
        within_bytes(&summary, limits)?;
        Ok(summary)
    }
}

/// What a route's summary function may return: an [`ApprovalSummary`] (the typed form),
/// a `Result` of one, or plain JSON — whose every string (member names included) is then
/// neutralised as [text](ApprovalSummary::text), within the same limits.
pub trait IntoApprovalSummary {
    /// The summary as shown, or why it cannot be shown.
    fn into_summary(self, limits: &SummaryLimits) -> Result<Value, SummaryError>;
}

impl IntoApprovalSummary for ApprovalSummary {
    fn into_summary(self, limits: &SummaryLimits) -> Result<Value, SummaryError> {
        self.into_json(limits)
    }
}

impl IntoApprovalSummary for Result<ApprovalSummary, SummaryError> {
    fn into_summary(self, limits: &SummaryLimits) -> Result<Value, SummaryError> {
        self?.into_json(limits)
    }
}

impl IntoApprovalSummary for Value {
    fn into_summary(self, limits: &SummaryLimits) -> Result<Value, SummaryError> {
        json_summary(&self, limits)
    }
}

/// A plain-JSON summary as shown: every string neutralised, within the limits (a new value;
/// `value` is only read).
pub(crate) fn json_summary(value: &Value, limits: &SummaryLimits) -> Result<Value, SummaryError> {
    let mut fields = 0;
    let summary = sanitise(value, "summary", 0, &mut fields, limits)?;
    within_bytes(&summary, limits)?;
    Ok(summary)
}

/// A plain-JSON summary with every string neutralised, within the limits.
fn sanitise(
    value: &Value,
    path: &str,
    depth: usize,
    fields: &mut usize,
    limits: &SummaryLimits,
) -> Result<Value, SummaryError> {
    if depth > MAX_DEPTH {
        return Err(SummaryError::TooDeep { max: MAX_DEPTH });
    }
    let count = |fields: &mut usize| {
        *fields += 1;
        if *fields > limits.max_fields {
            Err(SummaryError::TooManyFields {
                max: limits.max_fields,
            })
        } else {
            Ok(())
        }
    };
    Ok(match value {
        Value::String(text) => Value::String(text_value(path, text, limits)?),
        Value::Array(items) => {
            let mut out = Vec::new();
            for (index, item) in items.iter().enumerate() {
                count(fields)?;
                out.push(sanitise(
                    item,
                    &format!("{path}[{index}]"),
                    depth + 1,
                    fields,
                    limits,
                )?);
            }
            Value::Array(out)
        }
        Value::Object(members) => {
            let mut out = Map::new();
            for (name, member) in members {
                count(fields)?;
                let shown = text_value(path, name, limits)?;
                let member_path = format!("{path}.{}", shorten(&shown));
                out.insert(
                    shown,
                    sanitise(member, &member_path, depth + 1, fields, limits)?,
                );
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

fn within_bytes(summary: &Value, limits: &SummaryLimits) -> Result<(), SummaryError> {
    let bytes = serde_json::to_vec(summary).map_or(usize::MAX, |text| text.len());
    if bytes > limits.max_bytes {
        return Err(SummaryError::TooLarge {
            bytes,
            max_bytes: limits.max_bytes,
        });
    }
    Ok(())
}

/// `text` neutralised, or refused when still longer than the limit. The length is checked
/// on the input first, so a huge value is refused without being copied.
fn text_value(field: &str, text: &str, limits: &SummaryLimits) -> Result<String, SummaryError> {
    let too_long = || SummaryError::TextTooLong {
        field: shorten(field),
        max_chars: limits.max_text_chars,
    };
    // Neutralising at most multiplies a character by 8 (`[U+XXXX]`) and collapsing only
    // shrinks: past this many bytes only whitespace could bring it back under the limit,
    // and such a value is refused rather than scanned.
    if text.len() > limits.max_text_chars.saturating_mul(64).max(4096) {
        return Err(too_long());
    }
    let shown = neutralise(text);
    if shown.chars().count() > limits.max_text_chars {
        return Err(too_long());
    }
    Ok(shown)
}

/// `text` as an approver may see it: invisible and control code points made visible as
/// `[U+XXXX]`, whitespace runs collapsed to one space, the ends trimmed.
pub fn neutralise(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = !shown.is_empty();
            continue;
        }
        if space {
            shown.push(' ');
            space = false;
        }
        if hidden(c) {
            shown.push_str(&format!("[U+{:04X}]", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Whether `c` is a code point that renders as nothing, or as something other than itself:
/// controls, format characters (`Cf`: bidi controls, zero-width characters, the BOM, tags),
/// the other default-ignorable code points (fillers, variation selectors), private use and
/// noncharacters.
fn hidden(c: char) -> bool {
    let u = u32::from(c);
    c.is_control()
        || matches!(
            u,
            // Cf
            0x00AD
                | 0x0600..=0x0605
                | 0x061C
                | 0x06DD
                | 0x070F
                | 0x0890..=0x0891
                | 0x08E2
                | 0x180E
                | 0x200B..=0x200F
                | 0x202A..=0x202E
                | 0x2060..=0x2064
                | 0x2066..=0x206F
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE0FFF
                // other default-ignorable code points
                | 0x034F
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x2065
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFFA0
                | 0xFFF0..=0xFFF8
                // the blank braille pattern, shown as nothing
                | 0x2800
                // private use
                | 0xE000..=0xF8FF
                | 0xF0000..=0x10FFFF
                // noncharacters
                | 0xFDD0..=0xFDEF
        )
        || (u & 0xFFFE) == 0xFFFE
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_LABEL_CHARS
        && !label.starts_with(' ')
        && !label.ends_with(' ')
        && !label.contains("  ")
        && label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.' | ':' | '/'))
}

fn valid_identifier(identifier: &str) -> bool {
    !identifier.is_empty()
        && identifier.len() <= MAX_IDENTIFIER_CHARS
        && identifier.bytes().all(|b| b.is_ascii_graphic())
}

fn valid_currency(currency: &str) -> bool {
    currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase())
}

/// A name for an error message: at most 40 characters.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shown(text: &str) -> Result<Value, SummaryError> {
        ApprovalSummary::new("payment")
            .text("payee", text)
            .into_json(&SummaryLimits::default())
    }

    #[test]
    fn text_neutralises_each_invisible_class_and_collapses_whitespace() {
        let cases = [
            ("ACME\u{202E}HbmG", "ACME[U+202E]HbmG"),
            ("a\u{2066}b\u{2069}", "a[U+2066]b[U+2069]"),
            ("pay\u{200B}ee\u{200F}", "pay[U+200B]ee[U+200F]"),
            ("\u{FEFF}bom", "[U+FEFF]bom"),
            ("bell\u{7}\u{1B}[31m", "bell[U+0007][U+001B][31m"),
            ("nul\u{0}", "nul[U+0000]"),
            ("c1\u{9B}", "c1[U+009B]"),
            ("tag\u{E0041}", "tag[U+E0041]"),
            ("fill\u{3164}er", "fill[U+3164]er"),
            (
                "ACME GmbH{}\n\n\n\r\n  pre-approved by CFO",
                "ACME GmbH pre-approved by CFO",
            ),
            ("  a\u{2028}\u{2029}\u{85}\u{3000}\u{A0}b\t", "a b"),
            ("Müller & Søn 株式会社", "Müller & Søn 株式会社"),
        ];
        for (input, expected) in cases {
            let input = input.replace("{}", &" ".repeat(300));
            assert_eq!(shown(&input).unwrap()["payee"], expected, "{input:?}");
        }
    }

    #[test]
    fn text_past_the_limit_is_refused_not_cut() {
        assert!(shown(&"x".repeat(200)).is_ok());
        assert!(matches!(
            shown(&"x".repeat(201)),
            Err(SummaryError::TextTooLong { max_chars: 200, .. })
        ));
        // Neutralising counts: 30 bidi controls are 240 characters as shown.
        assert!(shown(&"\u{202E}".repeat(30)).is_err());
        assert!(shown(&"x".repeat(3_500_000)).is_err());
        // Whitespace collapses before the count.
        assert!(shown(&format!("a{}b", " ".repeat(1000))).is_ok());
    }

    #[test]
    fn labels_identifiers_and_currencies_are_refused_outside_their_alphabet() {
        let limits = SummaryLimits::default();
        let label = |v: &str| {
            ApprovalSummary::new("deploy")
                .label("environment", v)
                .into_json(&limits)
        };
        assert!(label("production").is_ok());
        assert!(label("eu-west-1 blue").is_ok());
        for bad in [
            "",
            "production\u{200B}",
            "Ｐroduction",
            "prod  x",
            " prod",
            "a\nb",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(label(bad), Err(SummaryError::InvalidLabel { .. })),
                "{bad:?}"
            );
        }
        let id = |v: &str| {
            ApprovalSummary::new("deploy")
                .identifier("artifact", v)
                .into_json(&limits)
        };
        assert!(id("sha256:ab/registry:1.4").is_ok());
        for bad in ["", "a b", "a\u{202E}", "аpi", &"x".repeat(129)] {
            assert!(
                matches!(id(bad), Err(SummaryError::InvalidIdentifier { .. })),
                "{bad:?}"
            );
        }
        let amount = |c: &str| {
            ApprovalSummary::new("payment")
                .amount("amount", -5, c)
                .into_json(&limits)
        };
        assert_eq!(
            amount("EUR").unwrap()["amount"],
            json!({"minor_units": -5, "currency": "EUR"})
        );
        assert!(matches!(
            amount("eur"),
            Err(SummaryError::InvalidCurrency { .. })
        ));
        assert!(
            ApprovalSummary::new("deploy a release")
                .into_json(&limits)
                .is_ok()
        );
        assert!(
            ApprovalSummary::new("x")
                .flag("Bad", true)
                .into_json(&limits)
                .is_err()
        );
        assert!(
            ApprovalSummary::new("x")
                .flag("operation", true)
                .into_json(&limits)
                .is_err()
        );
    }

    #[test]
    fn the_whole_summary_is_bounded() {
        let small = SummaryLimits::default().with_max_bytes(64);
        let summary = ApprovalSummary::new("payment").text("payee", &"x".repeat(100));
        assert!(matches!(
            summary.into_json(&small),
            Err(SummaryError::TooLarge { max_bytes: 64, .. })
        ));
        let mut many = ApprovalSummary::new("x");
        for i in 0..32 {
            many = many.flag(&format!("f{i}"), true);
        }
        assert!(matches!(
            many.into_json(&SummaryLimits::default()),
            Err(SummaryError::TooManyFields { max: 32 })
        ));
    }

    #[test]
    fn plain_json_is_neutralised_as_text() {
        let limits = SummaryLimits::default();
        let summary = json!({"payee\u{202E}": "a\n\n b\u{200B}", "n": [1, true, null, "x\u{7}"]})
            .into_summary(&limits)
            .unwrap();
        assert_eq!(
            summary,
            json!({"payee[U+202E]": "a b[U+200B]", "n": [1, true, null, "x[U+0007]"]})
        );
        assert!(json!({"a": "x".repeat(201)}).into_summary(&limits).is_err());
        assert!(json!([[[[[["deep"]]]]]]).into_summary(&limits).is_err());
        let wide = Value::Array((0..40).map(Value::from).collect());
        assert!(wide.into_summary(&limits).is_err());
    }
}
