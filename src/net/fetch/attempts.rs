//! The attempts of one request and the rule that decides whether to try again.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::{Attempt, Failure, FetchError, Http};
use crate::error::Error;
use crate::net::retry::{Answer, Attempts, Next};

impl Http {
    /// Run `op` until it is done, fails for good, or attempts or time run out. `op` gets the
    /// time its attempt may take: the per-attempt deadline or what is left of the budget.
    pub(super) fn retrying<T>(
        &self,
        what: &str,
        mut op: impl FnMut(Duration) -> Attempt<T>,
    ) -> std::result::Result<T, FetchError> {
        // One copy of the retry loop per result type, not per caller (the size budget).
        self.retrying_dyn(what, &mut op)
    }

    fn retrying_dyn<T>(
        &self,
        what: &str,
        op: &mut dyn FnMut(Duration) -> Attempt<T>,
    ) -> std::result::Result<T, FetchError> {
        let learned = self.load.lock().map(|l| *l).unwrap_or_default();
        let mut tries = Attempts::new(self.retry, Instant::now(), learned);
        let out = self.attempts(what, &mut tries, op);
        // What the next request of this client starts from: a step lower if the server
        // answered at last (a 404 or a 403 is an answer too).
        let answered = !matches!(
            out,
            Err(FetchError {
                class: Failure::Busy | Failure::Unreachable,
                ..
            })
        );
        if let Ok(mut l) = self.load.lock() {
            *l = tries.load(answered);
        }
        out
    }

    /// The attempts of one request, each decided by `tries`.
    fn attempts<T>(
        &self,
        what: &str,
        tries: &mut Attempts,
        op: &mut dyn FnMut(Duration) -> Attempt<T>,
    ) -> std::result::Result<T, FetchError> {
        let mut tally = Tally {
            busy_word: String::new(),
            last: Failure::Unreachable,
        };
        loop {
            let left = tries.left(Instant::now());
            if left.is_zero() {
                return Err(tally.deadline_passed(what, tries));
            }
            // An attempt the run's deadline cuts short says nothing new of the server: the
            // busy answer before it stays the reason.
            let given = self.limits.deadline.min(left);
            let began = Instant::now();
            let cut_short = || left < self.limits.deadline && began.elapsed() >= given;
            crate::node::metrics::request();
            let (e, failure, answer) = match tally.failed(op(given), cut_short) {
                ControlFlow::Break(out) => return out,
                ControlFlow::Continue(f) => f,
            };
            let next = tries.next(answer, Instant::now(), crate::crypto::random::fraction());
            let (n, failed) = tries.made();
            let (delay, e) = tally.pause(what, (n, failed), next, e, failure)?;
            let told = match answer {
                Answer::Busy(Some(a)) => format!(" (Retry-After {} s)", a.wait().as_secs()),
                _ => String::new(),
            };
            crate::warn!(
                "{what}: attempt {n} failed: {e}; retrying in {:.1}s{told}",
                delay.as_secs_f64()
            );
            self.renew();
            std::thread::sleep(delay);
        }
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
        cut_short: impl Fn() -> bool,
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
            Attempt::Retry(e) if self.last == Failure::Busy && cut_short() => {
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
