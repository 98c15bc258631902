//! Why a body is not canonicalizable, with the offset and an excerpt of what was wrong.

/// How many characters of a member name or number literal an error message keeps.
pub(super) const ERROR_EXCERPT_CHARS: usize = 40;

/// Why a body is not canonicalizable I-JSON. Offsets are byte offsets into the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalizeError {
    /// The bytes do not follow the JSON grammar.
    #[error("invalid JSON at byte {offset}: {reason}")]
    Syntax {
        /// Where the grammar was violated.
        offset: usize,
        /// What was expected or found.
        reason: &'static str,
    },
    /// The input is not UTF-8.
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 {
        /// The first byte that is not part of a valid UTF-8 sequence.
        offset: usize,
    },
    /// An object has two members with the same name (compared after unescaping).
    #[error("duplicate member name {name:?} at byte {offset}")]
    DuplicateMember {
        /// The repeated name, cut to about 40 characters.
        name: String,
        /// Where the later occurrence starts.
        offset: usize,
    },
    /// A `\uXXXX` escape names half of a surrogate pair without the other half.
    #[error("lone surrogate escape at byte {offset}")]
    LoneSurrogate {
        /// Where the escape starts.
        offset: usize,
    },
    /// A `\u0000` escape: U+0000 (NUL) in a string or member name. Valid JSON, but no
    /// PostgreSQL `text` or `jsonb` value can hold it, nor many other stores and languages'
    /// strings, so a command carrying it could be fingerprinted and then fail wherever it is
    /// written; it is refused up front, alike on every store.
    #[error("U+0000 (NUL) in a string at byte {offset}")]
    NulCharacter {
        /// Where the escape starts.
        offset: usize,
    },
    /// A plain integer literal that a double cannot hold exactly, e.g. `9007199254740993`.
    #[error("integer {literal} at byte {offset} is not exactly representable as a double")]
    ImpreciseInteger {
        /// The literal, cut to about 40 characters.
        literal: String,
        /// Where the literal starts.
        offset: usize,
    },
    /// A number that overflows to infinity or underflows to zero as a double.
    #[error("number at byte {offset} is outside the range of a double")]
    OutOfRange {
        /// Where the literal starts.
        offset: usize,
    },
    /// Arrays and objects nested deeper than `max` levels.
    #[error("nesting deeper than {max} levels at byte {offset}")]
    TooDeep {
        /// The limit, [`MAX_DEPTH`](super::MAX_DEPTH).
        max: usize,
        /// Where the first level too deep opens.
        offset: usize,
    },
    /// Something other than whitespace follows the value.
    #[error("unexpected data after the JSON value at byte {offset}")]
    TrailingData {
        /// Where the extra data starts.
        offset: usize,
    },
}

impl CanonicalizeError {
    /// A stable kebab-case code for this kind of error, suitable for problem bodies and metrics:
    /// `syntax`, `invalid-utf8`, `duplicate-member`, `lone-surrogate`, `nul-character`,
    /// `imprecise-integer`, `out-of-range`, `too-deep` or `trailing-data`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Syntax { .. } => "syntax",
            Self::InvalidUtf8 { .. } => "invalid-utf8",
            Self::DuplicateMember { .. } => "duplicate-member",
            Self::LoneSurrogate { .. } => "lone-surrogate",
            Self::NulCharacter { .. } => "nul-character",
            Self::ImpreciseInteger { .. } => "imprecise-integer",
            Self::OutOfRange { .. } => "out-of-range",
            Self::TooDeep { .. } => "too-deep",
            Self::TrailingData { .. } => "trailing-data",
        }
    }

    /// The byte offset the error points at.
    pub fn offset(&self) -> usize {
        match self {
            Self::Syntax { offset, .. }
            | Self::InvalidUtf8 { offset }
            | Self::DuplicateMember { offset, .. }
            | Self::LoneSurrogate { offset }
            | Self::NulCharacter { offset }
            | Self::ImpreciseInteger { offset, .. }
            | Self::OutOfRange { offset }
            | Self::TooDeep { offset, .. }
            | Self::TrailingData { offset } => *offset,
        }
    }
}

pub(super) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(ERROR_EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
