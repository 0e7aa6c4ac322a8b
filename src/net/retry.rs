//! When to try a request again: one rule for every retrying client, the fetcher and the API
//! client alike (docs/bootstrap.md, "Retries"). The rule is a state machine over explicit time
//! and jitter ([`Attempts::next`]): `fetch::Http` drives it with the real clock, and
//! bench/herd's simulator (bench/herd_sim.rs) with a virtual one, so that the simulator runs
//! this code rather than a model of it.

use std::time::{Duration, Instant};

/// When to try again, built one way for every retrying client: `Retry::exponential`, adjusted
/// with `capped_at`, `within` and `until`. Attempts bound only the failures that got no
/// answer; busy answers (408, 429, 5xx) are bounded by time alone, so that a healthy server
/// that sheds load cannot make a node give up after a fixed number of tries.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts that failed without a busy answer, at most (at least 1).
    pub attempts: u32,
    /// Busy answers, at most: unbounded but for time, except for best-effort clients.
    pub busy_attempts: u32,
    /// The first pause is at most this long; each failure doubles it, up to `cap`.
    pub initial: Duration,
    pub cap: Duration,
    /// No new attempt of one request starts once this much time has gone by.
    pub budget: Duration,
    /// Nor after this moment: the run's deadline.
    pub until: Option<Instant>,
}

impl Retry {
    /// `attempts` (at least 1), pauses with full jitter below `initial`, doubling up to 60 s;
    /// no new attempt of a request after 600 s (`--fetch-attempts`, `--fetch-backoff-ms`;
    /// `--api-tries`, `--api-retry-delay`).
    pub fn exponential(attempts: u32, initial: Duration) -> Retry {
        Retry {
            attempts: attempts.max(1),
            busy_attempts: u32::MAX,
            initial,
            cap: Duration::from_secs(60),
            budget: Duration::from_secs(600),
            until: None,
        }
    }

    /// At most `n` busy answers too: for reports that must not hold the node up.
    pub fn busy_attempts(mut self, n: u32) -> Retry {
        self.busy_attempts = n.max(1);
        self
    }

    /// Pauses of at most `cap` (a `Retry-After` above it is cut to it).
    pub fn capped_at(mut self, cap: Duration) -> Retry {
        self.cap = cap;
        self
    }

    /// No new attempt of one request after `budget`.
    pub fn within(mut self, budget: Duration) -> Retry {
        self.budget = budget;
        self
    }

    /// No new attempt after `deadline`, and none running past it (`--deadline`): the run's
    /// deadline replaces the budget of each request.
    pub fn until(mut self, deadline: Instant) -> Retry {
        self.until = Some(deadline);
        self.budget = Duration::MAX;
        self
    }
}

/// What one failed attempt said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// No answer, or a broken one: counts against the attempts.
    Nothing,
    /// 408, 429 or 5xx, with the server's `Retry-After` if it sent one.
    Busy(Option<Duration>),
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again after this pause.
    Pause(Duration),
    /// The attempts without an answer (or a best-effort client's busy answers) are used up.
    OutOfAttempts,
    /// The next attempt could not start before the deadline (or the request's budget).
    OutOfTime,
}

/// One request's attempts: the counts, with the decisions taken from them. Made at the first
/// attempt, told each failure with the time it happened.
#[derive(Debug, Clone)]
pub struct Attempts {
    retry: Retry,
    start: Instant,
    made: u32,
    failed: u32,
    busy: u32,
}

impl Attempts {
    pub fn new(retry: Retry, now: Instant) -> Attempts {
        Attempts {
            retry,
            start: now,
            made: 0,
            failed: 0,
            busy: 0,
        }
    }

    /// Attempts made so far, and how many of them got no answer.
    pub fn made(&self) -> (u32, u32) {
        (self.made, self.failed)
    }

    /// Time the next attempt may take: the smaller of the request's budget and what is left
    /// of the run's deadline; zero means no attempt may start.
    pub fn left(&self, now: Instant) -> Duration {
        let own = self
            .retry
            .budget
            .saturating_sub(now.saturating_duration_since(self.start));
        match self.retry.until {
            Some(u) => own.min(u.saturating_duration_since(now)),
            None => own,
        }
    }

    /// The decision after an attempt that failed at `now`. `jitter` is a uniform draw from
    /// [0, 1): the random part of the pause.
    ///
    /// Without word from the server: full jitter, random below `initial × 2^(attempts so
    /// far)` (at most the cap). With a `Retry-After` (cut to the cap): that wait, plus a random
    /// part below the smaller of it (at least 1 s) and the exponential ceiling, so that nodes
    /// told the same `Retry-After` come back spread over one more such interval, not in one
    /// wave, and a server that names its time is not made to wait for a ceiling grown by
    /// earlier refusals.
    pub fn next(&mut self, answer: Answer, now: Instant, jitter: f64) -> Next {
        let jitter = jitter.clamp(0.0, 1.0);
        self.made += 1;
        let ceil = self
            .retry
            .initial
            .saturating_mul(1u32 << (self.made - 1).min(20))
            .min(self.retry.cap);
        let pause = match answer {
            Answer::Nothing => {
                self.failed += 1;
                ceil.mul_f64(jitter)
            }
            Answer::Busy(None) => {
                self.busy += 1;
                ceil.mul_f64(jitter)
            }
            Answer::Busy(Some(after)) => {
                self.busy += 1;
                let after = after.min(self.retry.cap);
                let spread = ceil.min(after.max(Duration::from_secs(1)));
                after + spread.mul_f64(jitter)
            }
        };
        if self.failed >= self.retry.attempts || self.busy >= self.retry.busy_attempts {
            return Next::OutOfAttempts;
        }
        if pause >= self.left(now) {
            return Next::OutOfTime;
        }
        Next::Pause(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn pause(a: &mut Attempts, ans: Answer, jitter: f64) -> Duration {
        match a.next(ans, Instant::now(), jitter) {
            Next::Pause(d) => d,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn full_jitter_stays_under_the_cap() {
        let r = Retry::exponential(30, S(1));
        let mut a = Attempts::new(r, Instant::now());
        for n in 0..14u32 {
            let ceil = S(60).min(S(1 << n));
            let d = pause(&mut a, Answer::Nothing, 0.999);
            assert!(d < ceil && d > ceil.mul_f64(0.99), "{n}: {d:?}");
        }
    }

    #[test]
    fn retry_after_is_waited_out_and_spread_above_it() {
        let r = Retry::exponential(3, S(2));
        let mut a = Attempts::new(r, Instant::now());
        // Never before the server asked, never more than the jitter's ceiling (2 s) past it.
        assert_eq!(pause(&mut a, Answer::Busy(Some(S(5))), 0.0), S(5));
        let d = pause(&mut a, Answer::Busy(Some(S(5))), 0.999);
        assert!(d >= S(8) && d < S(9), "{d:?}");
        // A Retry-After past the cap is cut to it.
        let mut a = Attempts::new(r.capped_at(S(3)), Instant::now());
        assert!(pause(&mut a, Answer::Busy(Some(S(3600))), 0.5) < S(6));
    }
}
