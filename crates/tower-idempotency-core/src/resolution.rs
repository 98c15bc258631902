//! An operator's decision about an operation whose outcome is unknown ([`Resolution`]):
//! the same two choices for every store that offers it (the PostgreSQL and Redis stores'
//! `resolve`, and their command-line tools' `resolve --as failed|completed`).

use std::fmt;
use std::str::FromStr;

/// An operator's decision about an operation whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// The operation had no effect. Its record is removed so that the client's retry
    /// executes it again.
    Failed,
    /// The operation took effect. Its record becomes `completed` with no stored response:
    /// a retry is not executed again (the layer cannot replay a body it never got and
    /// answers accordingly).
    Completed,
}

impl Resolution {
    /// The stored name: `failed` or `completed`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Completed => "completed",
        }
    }
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is neither `failed` nor `completed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resolution `{0}`: expected `failed` or `completed`")]
pub struct UnknownResolution(pub String);

impl FromStr for Resolution {
    type Err = UnknownResolution;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "failed" => Ok(Self::Failed),
            "completed" => Ok(Self::Completed),
            other => Err(UnknownResolution(other.to_owned())),
        }
    }
}
