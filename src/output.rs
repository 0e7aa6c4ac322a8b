//! Lines for stdout (`plan:` lines, summaries, tables). stdout may be a closed pipe or a
//! journal stream that went away: a failed write is an error like any other, never a panic,
//! so a caller can take back what it did (bootstrap removes its done marker).

use std::io::Write;

use crate::error::{Error, Result};

/// Write one line (with its newline) and flush it.
pub(crate) fn line(args: std::fmt::Arguments) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| Error::failed(format!("writing to standard output: {e}")))
}

/// `println!` that returns `Result`: `outln!("plan: …")?`.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::output::line(format_args!($($t)*))
    };
}
