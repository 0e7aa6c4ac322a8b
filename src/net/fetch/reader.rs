//! Readers a body goes through: the rate floor and the progress lines.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use super::AttemptLimits;

/// Fails a transfer whose average rate over a whole window falls below the floor: one byte
/// every few seconds keeps each read alive, so the per-read timeout alone cannot catch it.
pub(crate) struct RateFloor<R> {
    inner: R,
    limits: AttemptLimits,
    window_start: Instant,
    in_window: u64,
}

impl<R> RateFloor<R> {
    pub(crate) fn new(inner: R, limits: AttemptLimits) -> Self {
        RateFloor {
            inner,
            limits,
            window_start: Instant::now(),
            in_window: 0,
        }
    }
}

impl<R: Read> Read for RateFloor<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        crate::node::metrics::fetched(n as u64);
        self.in_window += n as u64;
        let w = self.limits.window;
        let elapsed = self.window_start.elapsed();
        if n > 0 && self.limits.min_rate > 0 && elapsed >= w {
            let need = (self.limits.min_rate as f64 * elapsed.as_secs_f64()) as u64;
            if self.in_window < need {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "transfer slower than {} bytes/s ({} bytes in {:.0} s)",
                        self.limits.min_rate,
                        self.in_window,
                        elapsed.as_secs_f64()
                    ),
                ));
            }
            self.window_start = Instant::now();
            self.in_window = 0;
        }
        Ok(n)
    }
}

/// Logs a progress line every few seconds on long downloads, and a summary when one was shown.
pub(crate) struct Progress<R> {
    inner: R,
    label: String,
    total: Option<u64>,
    done: u64,
    /// Bytes an earlier attempt brought (a resumed download): counted, not timed.
    before: u64,
    start: Instant,
    last: Instant,
    /// Progress lines shown so far; `None` once the summary is out.
    shown: Option<u32>,
}

const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl<R> Progress<R> {
    pub(crate) fn new(inner: R, label: &str, total: Option<u64>, before: u64) -> Self {
        let now = Instant::now();
        Progress {
            inner,
            label: label.to_string(),
            total,
            done: before,
            before,
            start: now,
            last: now,
            shown: Some(0),
        }
    }

    fn line(&self, verb: &str) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let pct = match self.total {
            Some(t) if t > 0 => format!(" of {:.1} MiB ({}%)", mib(t), self.done * 100 / t),
            _ => String::new(),
        };
        crate::info!(
            "{verb} {}: {:.1} MiB{pct} at {:.1} MiB/s",
            self.label,
            mib(self.done),
            mib(self.done - self.before) / secs
        );
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        match self.shown {
            Some(k) if n == 0 => {
                if k > 0 {
                    self.line("downloaded");
                }
                self.shown = None;
            }
            Some(k) if self.last.elapsed() >= PROGRESS_EVERY => {
                self.last = Instant::now();
                self.line("downloading");
                self.shown = Some(k + 1);
            }
            _ => {}
        }
        Ok(n)
    }
}
