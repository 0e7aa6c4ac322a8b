//! One error type for the whole binary: a message chain plus the exit code it maps to.
//!
//! Exit codes follow tectonic-torcx: 0 done, 1 failed (systemd retries the unit), 2 usage or
//! configuration error (retrying cannot help).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Something went wrong that a later attempt may fix: exit 1.
    Failed,
    /// The invocation or its configuration is wrong: exit 2.
    Config,
}

#[derive(Debug)]
pub struct Error {
    kind: Kind,
    msg: String,
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn failed(msg: impl Into<String>) -> Self {
        Error {
            kind: Kind::Failed,
            msg: msg.into(),
        }
    }
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        Error {
            kind: Kind::Config,
            msg: msg.into(),
        }
    }
    pub(crate) fn exit_code(&self) -> i32 {
        match self.kind {
            Kind::Failed => 1,
            Kind::Config => 2,
        }
    }
    /// Same message, other exit code: a node file that is broken is a failure, the same
    /// content given on the command line is a configuration error.
    pub(crate) fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }
    /// The setting or step that fixes it, after the reason.
    pub(crate) fn hint(mut self, fix: impl fmt::Display) -> Self {
        self.msg = format!("{}: {fix}", self.msg);
        self
    }
    pub(crate) fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

/// At most `max` characters of untrusted input for an error message, control characters
/// escaped, with the length of what was left out.
pub(crate) fn excerpt(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
    let n = s.chars().count();
    if n > max {
        out.push_str(&format!("… ({} more characters)", n - max));
    }
    out
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

/// `.with_ctx(|| path)` on any fallible call: the message names the input first.
pub(crate) trait Context<T> {
    fn with_ctx<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn with_ctx<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::failed(e.to_string())
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::failed(std::io::Error::from(e).to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::failed(e.to_string())
    }
}
