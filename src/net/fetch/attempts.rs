//! The attempts of one request and the rule that decides whether to try again: [`Retrying`],
//! the request loop without its I/O. `Http` drives it with the real clock and network;
//! bench/herd's simulator (bench/herd_sim.rs) with a virtual clock and a server model, so that
//! a busy answer, a reset or a timeout there reaches the same decisions as in the binary.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::{Attempt, Failure, FetchError, Http};
use crate::error::Error;
use crate::net::handover;
use crate::net::retry::{Answer, Attempts, Load, Next, Retry};

impl Http {
    /// Run `op` until it is done, fails for good, or attempts or time run out. `op` gets the
    /// time its attempt may take: the per-attempt deadline or what is left of the budget.
    pub(super) fn retrying<T>(
        &self,
        what: &str,
        url: &str,
        mut op: impl FnMut(Duration) -> Attempt<T>,
    ) -> std::result::Result<T, FetchError> {
        // One copy of the retry loop per result type, not per caller (the size budget).
        self.retrying_dyn(what, &handover::server_of(url), &mut op)
    }

    /// What this client knows of `server`'s load: its own, or at its first request to that
    /// server, what the run before left of it (`net::handover`).
    fn learned(&self, server: &str) -> Load {
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = self.retry.handover {
            let mut seen = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            if seen.as_deref() != Some(server) {
                *seen = Some(server.to_string());
                let left = handover::take(key, server);
                if left.is_learned() {
                    *load = left;
                }
            }
        }
        *load
    }

    fn retrying_dyn<T>(
        &self,
        what: &str,
        server: &str,
        op: &mut dyn FnMut(Duration) -> Attempt<T>,
    ) -> std::result::Result<T, FetchError> {
        let learned = self.learned(server);
        let mut req = Retrying::new(
            what,
            self.retry,
            self.limits.deadline,
            learned,
            Instant::now(),
        );
        let out = loop {
            let given = match req.begin(Instant::now()) {
                Ok(Start::Attempt(given)) => given,
                Ok(Start::Wait(d)) => {
                    crate::info!(
                        "{what}: waiting {:.1}s first: the server's last Retry-After named that moment",
                        d.as_secs_f64()
                    );
                    std::thread::sleep(d);
                    continue;
                }
                Err(e) => break Err(e),
            };
            crate::node::metrics::request();
            match req.end(op(given), Instant::now(), crate::crypto::random::fraction()) {
                ControlFlow::Break(out) => break out,
                ControlFlow::Continue(pause) => {
                    self.renew();
                    std::thread::sleep(pause);
                }
            }
        };
        let load = req.learned(&out);
        let before = self
            .load
            .lock()
            .map(|mut l| std::mem::replace(&mut *l, load));
        if let (Some(key), Ok(before)) = (self.retry.handover, before) {
            if before != load && (before.is_learned() || load.is_learned()) {
                handover::keep(key, server, &load);
            }
        }
        out
    }
}

/// How an attempt may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Now, taking at most this long.
    Attempt(Duration),
    /// Not before this wait: the moment the server named in its last busy answer.
    Wait(Duration),
}

/// One request's loop without its I/O: asked when an attempt may start and told how it ended
/// and when, it says how long to pause before the next, or how the request ended.
pub struct Retrying<'w> {
    what: &'w str,
    tries: Attempts,
    /// The per-attempt deadline (`--fetch-timeout`).
    per_attempt: Duration,
    /// The current attempt's start and the time it was given.
    began: Instant,
    given: Duration,
    left: Duration,
    tally: Tally,
}

impl<'w> Retrying<'w> {
    /// A request named `what` (for its errors and warnings) under `retry`, each attempt at most
    /// `per_attempt`, from what the client's earlier requests learned.
    pub fn new(
        what: &'w str,
        retry: Retry,
        per_attempt: Duration,
        learned: Load,
        now: Instant,
    ) -> Retrying<'w> {
        Retrying {
            what,
            tries: Attempts::new(retry, now, learned),
            per_attempt,
            began: now,
            given: Duration::ZERO,
            left: Duration::ZERO,
            tally: Tally {
                busy_word: String::new(),
                last: Failure::Unreachable,
            },
        }
    }

    /// An attempt would start at `now`: the time it may take, the wait before it, or the
    /// request's error when the deadline has passed or the wait would reach past it.
    pub fn begin(&mut self, now: Instant) -> std::result::Result<Start, FetchError> {
        self.left = self.tries.left(now);
        if self.left.is_zero() {
            return Err(self.tally.deadline_passed(self.what, &self.tries));
        }
        if let Some(wait) = self.tries.held_back(now) {
            if wait >= self.left {
                return Err(FetchError::new(
                    Failure::Busy,
                    Error::failed(format!(
                        "{}: the server's last Retry-After (before this request) names a moment {} s away, past the deadline",
                        self.what,
                        wait.as_secs()
                    )),
                ));
            }
            return Ok(Start::Wait(wait));
        }
        self.began = now;
        self.given = self.per_attempt.min(self.left);
        Ok(Start::Attempt(self.given))
    }

    /// The attempt ended at `now` as `attempt`: `Break` with the request's result, or
    /// `Continue` with the pause before the next attempt. `jitter` is a uniform draw from
    /// [0, 1).
    pub fn end<T>(
        &mut self,
        attempt: Attempt<T>,
        now: Instant,
        jitter: f64,
    ) -> ControlFlow<std::result::Result<T, FetchError>, Duration> {
        // An attempt the run's deadline cut short says nothing new of the server: the busy
        // answer before it stays the reason.
        let cut_short =
            self.left < self.per_attempt && now.saturating_duration_since(self.began) >= self.given;
        let (e, failure, answer) = match self.tally.failed(attempt, cut_short) {
            ControlFlow::Break(out) => return ControlFlow::Break(out),
            ControlFlow::Continue(f) => f,
        };
        let next = self.tries.next(answer, now, jitter);
        let (n, failed) = self.tries.made();
        let (pause, e) = match self.tally.pause(self.what, (n, failed), next, e, failure) {
            Ok(p) => p,
            Err(e) => return ControlFlow::Break(Err(e)),
        };
        let told = match answer {
            Answer::Busy(Some(a)) => format!(" (Retry-After {} s)", a.wait().as_secs()),
            _ => String::new(),
        };
        crate::warn!(
            "{}: attempt {n} failed: {e}; retrying in {:.1}s{told}",
            self.what,
            pause.as_secs_f64()
        );
        ControlFlow::Continue(pause)
    }

    /// What the client's next request starts from, once this one ended in `out`: a step lower
    /// if the server answered at last (a 404 or a 403 is an answer too).
    pub fn learned<T>(&self, out: &std::result::Result<T, FetchError>) -> Load {
        let answered = !matches!(
            out,
            Err(FetchError {
                class: Failure::Busy | Failure::Unreachable,
                ..
            })
        );
        self.tries.load(answered)
    }
}

/// What the attempts so far leave for the next one and for the final error.
struct Tally {
    /// The last busy answer, for the error: "busy: 503, Retry-After 30".
    busy_word: String,
    last: Failure,
}

impl Tally {
    fn deadline_passed(&self, what: &str, tries: &Attempts) -> FetchError {
        FetchError::new(
            self.last,
            Error::failed(format!(
                "{what}: {}giving up after {} attempts: the deadline passed",
                self.busy_word,
                tries.made().0
            )),
        )
    }

    /// One attempt's outcome: `Break` with the request's result, or `Continue` with why it
    /// failed, as what, and what the server said of its load.
    fn failed<T>(
        &mut self,
        attempt: Attempt<T>,
        cut_short: bool,
    ) -> ControlFlow<std::result::Result<T, FetchError>, (Error, Failure, Answer)> {
        let (e, failure, answer) = match attempt {
            Attempt::Done(t) => return ControlFlow::Break(Ok(t)),
            Attempt::Final(e) => {
                return ControlFlow::Break(Err(FetchError::new(Failure::Final, e)))
            }
            Attempt::Denied(e) => {
                return ControlFlow::Break(Err(FetchError::new(Failure::Denied, e)))
            }
            Attempt::Passed(status, e) => {
                return ControlFlow::Break(Err(FetchError::new(Failure::Passed(status), e)))
            }
            Attempt::Retry(e) if self.last == Failure::Busy && cut_short => {
                (e, Failure::Busy, Answer::Nothing)
            }
            Attempt::Retry(e) => {
                self.busy_word.clear();
                (e, Failure::Unreachable, Answer::Nothing)
            }
            Attempt::Busy(e, status, after) => {
                crate::node::metrics::busy();
                self.busy_word = match after {
                    Some(a) => format!("busy: {status}, Retry-After {}; ", a.wait().as_secs()),
                    None => format!("busy: {status}; "),
                };
                (e, Failure::Busy, Answer::Busy(after))
            }
        };
        self.last = failure;
        ControlFlow::Continue((e, failure, answer))
    }

    /// The pause before the next attempt (with the error back, for the warning), or the
    /// request's final error when there is none.
    fn pause(
        &self,
        what: &str,
        (n, failed): (u32, u32),
        next: Next,
        e: Error,
        failure: Failure,
    ) -> std::result::Result<(Duration, Error), FetchError> {
        let busy_word = &self.busy_word;
        let why = match next {
            Next::Pause(d) => {
                crate::node::metrics::waited(d);
                return Ok((d, e));
            }
            Next::OutOfAttempts => {
                format!("{what}: {busy_word}giving up after {n} attempts ({failed} without an answer)")
            }
            Next::OutOfTime => format!(
                "{what}: {busy_word}giving up after {n} attempts: the deadline comes before the next"
            ),
            Next::AskedTooLong(a) => format!(
                "{what}: {busy_word}giving up: the server asks for a wait of {} s, longer than this check waits",
                a.as_secs()
            ),
        };
        Err(FetchError::new(failure, e.context(why)))
    }
}
