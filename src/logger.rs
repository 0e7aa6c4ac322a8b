//! `log` backend: one line per record on stderr. Under systemd (stderr is the journal stream
//! named by `JOURNAL_STREAM`) each line carries a `<N>` syslog priority prefix so journald
//! files it at the right level; elsewhere it is `level: message`.

use std::io::Write;
use std::os::fd::AsFd;

/// nodestrap's own records: `crate::error!`, `crate::warn!`, `crate::info!` and `crate::debug!`,
/// filtered at run time only. Release builds compile every `log` record of other crates out
/// (`release_max_level_off`: the logger never prints them, see `Logger::enabled`), so nodestrap's
/// own go to the logger without the `log` macros' static level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => {
        $crate::logger::emit(log::Level::Debug, module_path!(), format_args!($($arg)+))
    };
}

/// See `crate::debug!`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        $crate::logger::emit(log::Level::Info, module_path!(), format_args!($($arg)+))
    };
}

/// See `crate::debug!`.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        $crate::logger::emit(log::Level::Warn, module_path!(), format_args!($($arg)+))
    };
}

/// See `crate::debug!`.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        $crate::logger::emit(log::Level::Error, module_path!(), format_args!($($arg)+))
    };
}

/// One record of nodestrap's own, when its level is on (`crate::info!` and the others).
pub(crate) fn emit(level: log::Level, target: &str, args: std::fmt::Arguments) {
    if level <= log::max_level() {
        log::logger().log(
            &log::Record::builder()
                .args(args)
                .level(level)
                .target(target)
                .build(),
        );
    }
}

struct Logger {
    journal: bool,
}

impl log::Log for Logger {
    /// Only our own records: ureq, rustls and zbus log wire details (request headers with
    /// credentials among them) at debug and trace.
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level() && m.target().starts_with("nodestrap")
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        let msg = one_line(&msg);
        let line = if self.journal {
            let prio = match r.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            format!("<{prio}>{msg}\n")
        } else {
            format!("{}: {msg}\n", r.level().as_str().to_ascii_lowercase())
        };
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// One record, one line: control characters (a newline, a carriage return, NUL, an escape
/// sequence's ESC, C1 controls) and Unicode's line and paragraph separators are written as
/// escapes (`\n`, `\u{1b}`), so that text from outside (a certificate's subject, a server's
/// body, a file) can never start a line of its own in the log, the journal or a terminal.
pub(crate) fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// True when stderr is the journal stream systemd gave us.
fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

pub(crate) fn init(level: log::LevelFilter) {
    let _ = log::set_boxed_logger(Box::new(Logger {
        journal: stderr_is_journal(),
    }));
    log::set_max_level(level);
}

/// `--verbose` as logrus's `ParseLevel` (the original Go tool's) reads it: any case; `panic` and
/// `fatal` are quieter than `error`, and nodestrap has nothing quieter than its errors.
pub(crate) fn parse_level(s: &str) -> Option<log::LevelFilter> {
    Some(match s.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => log::LevelFilter::Error,
        "warn" | "warning" => log::LevelFilter::Warn,
        "info" => log::LevelFilter::Info,
        "debug" => log::LevelFilter::Debug,
        "trace" => log::LevelFilter::Trace,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::{one_line, parse_level};
    use log::LevelFilter::*;

    #[test]
    fn a_record_is_one_line_whatever_it_carries() {
        assert_eq!(
            one_line("plain text, quotes \" and \\ kept"),
            "plain text, quotes \" and \\ kept"
        );
        assert_eq!(
            one_line("node evil\ninfo: node forged ticket issued\r\0\u{1b}[31m"),
            "node evil\\ninfo: node forged ticket issued\\r\\u{0}\\u{1b}[31m"
        );
        assert_eq!(one_line("a\u{2028}b\u{85}c\tz"), "a\\u{2028}b\\u{85}c\\tz");
    }

    #[test]
    fn levels_as_logrus_reads_them() {
        for (s, l) in [
            ("panic", Error),
            ("FATAL", Error),
            ("Error", Error),
            ("WARNING", Warn),
            ("warn", Warn),
            ("Info", Info),
            ("DEBUG", Debug),
            ("trace", Trace),
        ] {
            assert_eq!(parse_level(s), Some(l), "{s}");
        }
        assert_eq!(parse_level("verbose"), None);
        assert_eq!(parse_level(""), None);
    }
}
