//! When to try a request again: one rule for every retrying client, the fetcher and the API
//! client alike (docs/bootstrap.md, "Retries"). The rule is a state machine over explicit time
//! and jitter ([`Attempts::next`]): `fetch::Http` drives it with the real clock, and
//! bench/herd's simulator (bench/herd_sim.rs) with a virtual one, so that the simulator runs
//! this code rather than a model of it.

use std::time::{Duration, Instant, SystemTime};

/// How much the spread window grows with each busy answer that says nothing new (the same
/// `Retry-After` again, or none). Twofold: a server that turns away a share of requests at
/// random, full or not, gives streaks whose odds fall slower than a fourfold window grows
/// (30 % at random: 0.3 × 4 > 1), and its unlucky nodes waited minutes (docs/bootstrap.md has
/// the figures of both).
const SPREAD_GROWTH: u32 = 2;

/// The spread window's ceiling is the run's deadline over this (docs/bootstrap.md has the
/// trade-off it sets between requests and time).
const SPREAD_OF_DEADLINE: u32 = 6;

/// An appointment (a `Retry-After` that is an HTTP-date, or delay-seconds that differ from the
/// answer before) is kept within this: the server sized it for this node, and more spread
/// would only miss the slot it holds.
const APPOINTMENT_JITTER: Duration = Duration::from_secs(1);

/// No retry starts with less than this left of the request's budget or the run (nor with less
/// than a tenth of the budget): an attempt that short can only time out, and its timeout would
/// hide the answer the server last gave.
const LEAST_ATTEMPT: Duration = Duration::from_secs(1);

/// When to try again, built one way for every retrying client: `Retry::exponential`, adjusted
/// with `capped_at`, `within` and `until`. Attempts bound only the failures that
/// got no answer; busy answers (408, 429, 5xx) are bounded by time alone, so that a healthy
/// server that sheds load cannot make a node give up after a fixed number of tries.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts that failed without a busy answer, at most (at least 1).
    pub(crate) attempts: u32,
    /// Busy answers, at most: unbounded but for time, except for best-effort clients.
    pub(crate) busy_attempts: u32,
    /// The first pause is at most this long; each failure without an answer doubles it, up
    /// to `cap`.
    pub(crate) initial: Duration,
    pub(crate) cap: Duration,
    /// The longest pause a best-effort client takes: a `Retry-After` above it ends the request
    /// (never sooner than the server asked). `Duration::MAX` for every other client.
    pub(crate) longest: Duration,
    /// The spread window after busy answers grows up to this (a sixth of `--deadline`).
    pub spread: Duration,
    /// No new attempt of one request starts once this much time has gone by.
    pub(crate) budget: Duration,
    /// Nor after this moment: the run's deadline.
    pub until: Option<Instant>,
    /// The name under which what the client learned is handed to the next run
    /// (`net::handover`), if it is.
    pub(crate) handover: Option<&'static str>,
}

impl Retry {
    /// `attempts` (at least 1), pauses with full jitter below `initial`, doubling up to 60 s;
    /// busy answers spread over at most 300 s; no new attempt of a request after 600 s
    /// (`--fetch-attempts`, `--fetch-backoff-ms`; `--api-tries`, `--api-retry-delay`).
    pub(crate) fn exponential(attempts: u32, initial: Duration) -> Retry {
        Retry {
            attempts: attempts.max(1),
            busy_attempts: u32::MAX,
            initial,
            cap: Duration::from_secs(60),
            longest: Duration::MAX,
            spread: Duration::from_secs(300),
            budget: Duration::from_secs(600),
            until: None,
            handover: None,
        }
    }

    /// What the client learns is handed to the next run as `key` (`net::handover`): a run that
    /// ends while its server sheds load leaves the next one its streak and the server's last
    /// `Retry-After`, which the next run waits out before its first attempt.
    pub(crate) fn handed_over_as(mut self, key: &'static str) -> Retry {
        self.handover = Some(key);
        self
    }

    /// At most `n` busy answers too: for reports that must not hold the node up.
    pub(crate) fn busy_attempts(mut self, n: u32) -> Retry {
        self.busy_attempts = n.max(1);
        self
    }

    /// Pauses of at most `cap`, for best-effort clients: a `Retry-After` above it ends the
    /// request as busy instead of being waited out.
    pub(crate) fn capped_at(mut self, cap: Duration) -> Retry {
        self.cap = cap;
        self.longest = cap;
        self
    }

    /// No new attempt of one request after `budget`.
    pub(crate) fn within(mut self, budget: Duration) -> Retry {
        self.budget = budget;
        self
    }

    /// No new attempt after `deadline`, and none running past it (`--deadline`): the run's
    /// deadline replaces the budget of each request, and the spread window after busy
    /// answers grows up to a sixth of the run's length (300 s of the default 1800): the
    /// deadline is the operator's word on how long a boot may wait, and so on how large a
    /// herd one server may have to serve.
    pub(crate) fn until(mut self, deadline: Instant) -> Retry {
        self.until = Some(deadline);
        self.budget = Duration::MAX;
        let run = deadline.saturating_duration_since(crate::node::status::started());
        self.spread = run / SPREAD_OF_DEADLINE;
        self
    }
}

/// What one failed attempt said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// No answer, or a broken one: counts against the attempts.
    Nothing,
    /// 408, 429 or 5xx, with the server's `Retry-After` if it sent one.
    Busy(Option<After>),
}

/// A server's `Retry-After`, in the form it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Delay-seconds: an appointment only when it differs from the answer before.
    Delay(Duration),
    /// An HTTP-date, as the wait until it (on the server's clock where it sent its `Date`): a
    /// moment the server named, always an appointment.
    Date(Duration),
}

impl After {
    /// How long the server asked to wait.
    pub fn wait(self) -> Duration {
        match self {
            After::Delay(d) | After::Date(d) => d,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again after this pause.
    Pause(Duration),
    /// The attempts without an answer (or a best-effort client's busy answers) are used up.
    OutOfAttempts,
    /// The next attempt could not start before the deadline (or the request's budget).
    OutOfTime,
    /// The server asked for a wait longer than a best-effort client takes.
    AskedTooLong(Duration),
}

/// What one client's requests learned of their server's load, carried from each request to
/// the next: a node whose first request met a herd does not learn the herd's size again on
/// each of its next ones (three downloads in a row would each take as many refusals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Busy answers in a row that said nothing new: the same `Retry-After` as the one
    /// before (or none again); the spread window grows with it.
    streak: u32,
    /// The last busy answer's `Retry-After` (`None`: no busy answer yet).
    last_after: Option<Option<After>>,
    /// The moment that `Retry-After` named: no attempt of the client's next request starts
    /// before it, even in the next run. Cleared once an answer came through.
    not_before: Option<Instant>,
}

impl Load {
    /// Whether there is anything to hand to the next run: a streak, or a moment to wait for.
    pub(crate) fn is_learned(&self) -> bool {
        self.streak > 0 || self.not_before.is_some()
    }

    /// As JSON for the next run, its moment on the wall clock (`now` is the same moment on both).
    pub(crate) fn to_json(self, now: (Instant, SystemTime)) -> serde_json::Value {
        let after = |a: Option<After>| match a {
            None => serde_json::json!("none"),
            Some(After::Delay(d)) => serde_json::json!({ "delay": d.as_secs_f64() }),
            Some(After::Date(d)) => serde_json::json!({ "date": d.as_secs_f64() }),
        };
        let not_before = self.not_before.map(|t| {
            let at = now.1 + t.saturating_duration_since(now.0);
            at.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        });
        serde_json::json!({
            "streak": self.streak,
            "last": self.last_after.map(after),
            "not-before": not_before,
        })
    }

    /// What `to_json` wrote; `None` for anything else.
    pub(crate) fn from_json(v: &serde_json::Value, now: (Instant, SystemTime)) -> Option<Load> {
        let secs = |v: &serde_json::Value| {
            v.as_f64()
                .filter(|s| s.is_finite() && (0.0..=1e7).contains(s))
                .map(Duration::from_secs_f64)
        };
        let last_after = match v.get("last")? {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) if s == "none" => Some(None),
            l => Some(Some(match (l.get("delay"), l.get("date")) {
                (Some(d), None) => After::Delay(secs(d)?),
                (None, Some(d)) => After::Date(secs(d)?),
                _ => return None,
            })),
        };
        let not_before = match v.get("not-before")? {
            serde_json::Value::Null => None,
            t => {
                let s = t
                    .as_f64()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e11)?;
                let at = std::time::UNIX_EPOCH + Duration::from_secs_f64(s);
                // Already past: nothing to wait for.
                at.duration_since(now.1).ok().map(|d| now.0 + d)
            }
        };
        Some(Load {
            streak: u32::try_from(v.get("streak")?.as_u64()?).ok()?.min(64),
            last_after,
            not_before,
        })
    }
}

/// One request's attempts: the counts and the last busy answer, with the decisions taken
/// from them. Made at the first attempt, told each failure with the time it happened.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    retry: Retry,
    start: Instant,
    made: u32,
    failed: u32,
    busy: u32,
    /// What the client knew before this request, and has learned in it since.
    learned: Load,
}

impl Attempts {
    /// A request's attempts, starting from what the client's earlier requests learned.
    pub(crate) fn new(retry: Retry, now: Instant, load: Load) -> Attempts {
        Attempts {
            retry,
            start: now,
            made: 0,
            failed: 0,
            busy: 0,
            learned: load,
        }
    }

    /// What the client's next request starts from. An answer came through at last: the
    /// window steps back once (a half), so that the next request of a node the server just
    /// served is not held back as long as one still waiting for its first answer.
    pub(crate) fn load(&self, answered: bool) -> Load {
        let l = self.learned;
        match answered {
            true => Load {
                streak: l.streak.saturating_sub(1),
                not_before: None,
                ..l
            },
            false => l,
        }
    }

    /// How long the request's first attempt must still wait at `now`: the moment the server
    /// named in the client's last busy answer (of an earlier request, or of the run before).
    pub(crate) fn held_back(&self, now: Instant) -> Option<Duration> {
        match self.learned.not_before {
            // Under a millisecond is no wait (and a clock's rounding cannot make one for ever).
            Some(t) if self.made == 0 && t > now + Duration::from_millis(1) => Some(t - now),
            _ => None,
        }
    }

    /// Attempts made so far, and how many of them got no answer.
    pub(crate) fn made(&self) -> (u32, u32) {
        (self.made, self.failed)
    }

    /// Time the next attempt may take: the smaller of the request's budget and what is left
    /// of the run's deadline; zero means no attempt may start.
    pub(crate) fn left(&self, now: Instant) -> Duration {
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
    /// Without word from the server: full jitter, below `initial × 2^(attempts so far)`, at
    /// most `cap`. A busy answer with a `Retry-After` is waited out in full (never sooner),
    /// plus a spread. An appointment (an HTTP-date, or delay-seconds that differ from the
    /// answer before: the server sizing its queue) is kept: the spread is under
    /// [`APPOINTMENT_JITTER`]. A first delay-seconds is spread over one more such interval
    /// (at least 1 s): it may be the same for the whole herd. The same `Retry-After` again, or
    /// none at all (then `initial` stands for it), says nothing of how many nodes are waiting:
    /// the window doubles with each such answer in a row, up to `spread`, so a herd larger than
    /// the server's capacity comes back over a window that grows to its size rather than in
    /// waves. A pause that would end past the deadline, or leave the next attempt under
    /// [`LEAST_ATTEMPT`], ends the request instead.
    pub(crate) fn next(&mut self, answer: Answer, now: Instant, jitter: f64) -> Next {
        let jitter = jitter.clamp(0.0, 1.0);
        self.made += 1;
        let pause = match answer {
            Answer::Nothing => {
                // What the busy answers before it taught stays: a reset or a time-out from a
                // server that sheds load says nothing of how many nodes wait for it, and a
                // node that forgot would come back with the herd's first wave.
                self.failed += 1;
                if self.failed >= self.retry.attempts {
                    return Next::OutOfAttempts;
                }
                let ceil = self
                    .retry
                    .initial
                    .saturating_mul(1u32 << (self.made - 1).min(20))
                    .min(self.retry.cap);
                ceil.mul_f64(jitter)
            }
            Answer::Busy(after) => {
                self.busy += 1;
                let before = self.learned.last_after;
                let streak = match before {
                    Some(b) if b == after => self.learned.streak + 1,
                    _ => 0,
                };
                self.learned = Load {
                    streak,
                    last_after: Some(after),
                    not_before: after.map(|a| now + a.wait()),
                };
                if self.busy >= self.retry.busy_attempts {
                    return Next::OutOfAttempts;
                }
                let floor = after.map(After::wait).unwrap_or_default();
                if floor > self.retry.longest {
                    return Next::AskedTooLong(floor);
                }
                let appointment = match after {
                    Some(After::Date(_)) => true,
                    Some(After::Delay(_)) => {
                        matches!(before, Some(Some(After::Delay(_)))) && streak == 0
                    }
                    None => false,
                };
                // The server's own scale where it gave one, else the client's; an appointment
                // is kept within a second.
                let base = match after {
                    _ if appointment => APPOINTMENT_JITTER,
                    Some(a) => a.wait().max(Duration::from_secs(1)),
                    None => self.retry.initial,
                };
                let window = base.saturating_mul(SPREAD_GROWTH.saturating_pow(streak.min(20)));
                // Never past the ceiling, nor past a best-effort client's longest pause; and none
                // for a client told not to back off at all (an initial pause of 0).
                let window = if self.retry.initial.is_zero() {
                    Duration::ZERO
                } else {
                    window
                        .min(self.retry.spread)
                        .min(self.retry.longest - floor)
                };
                floor.saturating_add(window.mul_f64(jitter))
            }
        };
        let least = LEAST_ATTEMPT.min(self.retry.budget / 10);
        if pause.saturating_add(least) >= self.left(now) {
            return Next::OutOfTime;
        }
        Next::Pause(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A busy answer with delay-seconds.
    fn delay(d: Duration) -> Answer {
        Answer::Busy(Some(After::Delay(d)))
    }

    fn draws(r: Retry, answers: &[Answer], n: usize) -> Vec<Duration> {
        let now = Instant::now();
        (0..n)
            .map(|i| {
                let mut a = Attempts::new(r, now, Load::default());
                let mut last = Next::OutOfTime;
                for ans in answers {
                    last = a.next(*ans, now, i as f64 / n as f64);
                }
                match last {
                    Next::Pause(d) => d,
                    other => panic!("{other:?}"),
                }
            })
            .collect()
    }

    #[test]
    fn full_jitter_stays_under_the_cap() {
        let r = Retry::exponential(30, S(1));
        for n in 1..14 {
            let d = draws(r, &vec![Answer::Nothing; n], 50);
            let ceil = S(60).min(S(1 << (n - 1)));
            assert!(d.iter().all(|d| *d < ceil), "{n}: {d:?}");
            // Spread over the whole window, not one wave.
            assert!(*d.iter().max().unwrap() > ceil.mul_f64(0.9), "{n}");
        }
    }

    #[test]
    fn retry_after_is_a_floor_never_cut() {
        let r = Retry::exponential(3, S(2)).within(S(7200));
        for after in [S(5), S(90), S(3600)] {
            let d = draws(r, &[delay(after)], 100);
            assert!(d.iter().all(|d| *d >= after), "{after:?}");
            // A first Retry-After is spread over one more such interval, up to the window.
            let spread = after.min(S(300));
            assert!(d.iter().all(|d| *d < after + spread), "{after:?}");
            assert!(*d.iter().max().unwrap() > after + spread.mul_f64(0.9));
        }
    }

    #[test]
    fn the_same_retry_after_again_doubles_the_spread_up_to_the_window() {
        // A 600 s deadline: the window's ceiling is 100 s.
        let r = Retry::exponential(3, S(2)).until(crate::node::status::started() + S(600));
        let same = |n| vec![delay(S(5)); n];
        let width = |v: Vec<Duration>| *v.iter().max().unwrap() - *v.iter().min().unwrap();
        // 5 s (the Retry-After), then 10, 20, 40, 80, 100 (the ceiling).
        for (n, w) in [
            (1, 5),
            (2, 10),
            (3, 20),
            (4, 40),
            (5, 80),
            (6, 100),
            (12, 100),
        ] {
            let d = draws(r, &same(n), 200);
            assert!(d.iter().all(|d| *d >= S(5) && *d < S(5 + w)), "{n}");
            assert!(width(d) > S(w).mul_f64(0.9), "{n}");
        }
        // A Retry-After that changes is the server's estimate, an appointment: the streak
        // starts again, and the client comes back within a second of it.
        let mut changing = same(3);
        changing.push(delay(S(40)));
        let d = draws(r, &changing, 200);
        assert!(d.iter().all(|d| *d >= S(40) && *d < S(41)));
        assert!(width(d) > Duration::from_millis(900));
        // ... and the same one again after it is a fixed one again: spread, then doubling.
        changing.push(delay(S(40)));
        let d = draws(r, &changing, 200);
        assert!(d.iter().all(|d| *d >= S(40) && *d < S(120)) && width(d) > S(70));
        // No Retry-After at all says as little as the same one again, from `initial`: 2, 4, 8 s.
        let d = draws(r, &[Answer::Busy(None); 3], 200);
        assert!(d.iter().all(|d| *d < S(8)) && width(d) > S(7));
    }

    #[test]
    fn an_http_date_is_an_appointment_kept_within_a_second_never_before_it() {
        let r = Retry::exponential(3, S(2)).within(S(7200));
        let date = |d| Answer::Busy(Some(After::Date(d)));
        for after in [S(0), S(7), S(3000)] {
            // The first answer, and after others of any kind: never sooner, at most 1 s later.
            for answers in [
                vec![date(after)],
                vec![delay(S(5)), delay(S(5)), date(after)],
                vec![date(after + S(3)), date(after)],
            ] {
                let d = draws(r, &answers, 100);
                assert!(
                    d.iter().all(|d| *d >= after && *d < after + S(1)),
                    "{answers:?}: {d:?}"
                );
            }
        }
        // A date past the deadline ends the request, as any Retry-After.
        let now = Instant::now();
        let mut a = Attempts::new(r.within(S(60)), now, Load::default());
        assert_eq!(a.next(date(S(61)), now, 0.0), Next::OutOfTime);
    }

    #[test]
    fn a_retry_after_past_the_deadline_ends_the_request_at_once() {
        let start = crate::node::status::started();
        let r = Retry::exponential(3, S(2)).until(start + S(6000));
        let late = start + S(5900);
        let mut a = Attempts::new(r, late, Load::default());
        assert_eq!(a.next(delay(S(100)), late, 0.0), Next::OutOfTime);
        let mut a = Attempts::new(r, late, Load::default());
        assert_eq!(a.next(delay(S(20)), late, 0.5), Next::Pause(S(30)));
    }

    #[test]
    fn no_retry_starts_too_late_to_finish() {
        // 10 s left: a pause of 9.5 s would leave the attempt half a second, which can only
        // time out and hide the server's busy answer; a pause of 8.5 s leaves it 1.5 s.
        let now = Instant::now();
        let r = Retry::exponential(3, S(2)).within(S(10));
        let busy = delay(S(5));
        let mut a = Attempts::new(r, now, Load::default());
        assert_eq!(a.next(busy, now, 0.9), Next::OutOfTime);
        let mut a = Attempts::new(r, now, Load::default());
        assert_eq!(
            a.next(busy, now, 0.7),
            Next::Pause(S(5) + S(5).mul_f64(0.7))
        );
        // A short budget keeps its retries: the floor is at most a tenth of it.
        let r = Retry::exponential(3, Duration::from_millis(100)).within(S(1));
        let mut a = Attempts::new(r, now, Load::default());
        assert!(matches!(a.next(Answer::Nothing, now, 0.5), Next::Pause(_)));
    }

    #[test]
    fn a_client_that_does_not_back_off_waits_the_retry_after_exactly() {
        let r = Retry::exponential(3, Duration::ZERO).within(S(600));
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        for _ in 0..5 {
            assert_eq!(a.next(delay(S(1)), now, 0.9), Next::Pause(S(1)));
        }
        assert_eq!(
            a.next(Answer::Busy(None), now, 0.9),
            Next::Pause(Duration::ZERO)
        );
    }

    #[test]
    fn a_client_carries_what_it_learned_to_its_next_request() {
        let r = Retry::exponential(3, S(1)).within(S(7200));
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        for _ in 0..4 {
            a.next(delay(S(5)), now, 0.5);
        }
        // Four of the same: the window was 5 × 2³ = 40 s. Answered at last: the next request
        // of this client starts a step lower, and its first refusal (the same Retry-After
        // again) widens it back to 40 s, not to the Retry-After.
        let mut b = Attempts::new(r, now, a.load(true));
        assert_eq!(
            b.next(delay(S(5)), now, 0.999),
            Next::Pause(S(5) + S(40).mul_f64(0.999))
        );
        // Not answered: the same step.
        let mut c = Attempts::new(r, now, a.load(false));
        assert_eq!(
            c.next(delay(S(5)), now, 0.999),
            Next::Pause(S(5) + S(80).mul_f64(0.999))
        );
    }

    #[test]
    fn an_attempt_without_an_answer_keeps_what_the_busy_ones_taught() {
        let r = Retry::exponential(5, S(1)).within(S(7200));
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        for _ in 0..4 {
            a.next(delay(S(5)), now, 0.5);
        }
        assert!(matches!(a.next(Answer::Nothing, now, 0.5), Next::Pause(_)));
        // The same Retry-After after the reset: a window of 5 × 2⁴ = 80 s, not 5 s again.
        assert_eq!(
            a.next(delay(S(5)), now, 0.999),
            Next::Pause(S(5) + S(80).mul_f64(0.999))
        );
    }

    #[test]
    fn the_moment_a_server_named_holds_the_next_request_back_until_an_answer_comes() {
        let r = Retry::exponential(3, S(1)).within(S(7200));
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        assert_eq!(a.held_back(now), None);
        a.next(delay(S(30)), now, 0.5);
        // The request ended there (a deadline): the client's next one waits for the moment.
        let b = Attempts::new(r, now + S(10), a.load(false));
        assert_eq!(b.held_back(now + S(10)), Some(S(20)));
        assert_eq!(b.held_back(now + S(31)), None);
        // Answered: nothing holds it.
        let c = Attempts::new(r, now + S(10), a.load(true));
        assert_eq!(c.held_back(now + S(10)), None);
    }

    #[test]
    fn what_a_client_learned_survives_its_json_for_the_next_run() {
        let now = (Instant::now(), SystemTime::now());
        let r = Retry::exponential(3, S(1)).within(S(7200));
        for answers in [
            vec![delay(S(5)), delay(S(5)), delay(S(5))],
            vec![Answer::Busy(Some(After::Date(S(40))))],
            vec![Answer::Busy(None), Answer::Busy(None)],
        ] {
            let mut a = Attempts::new(r, now.0, Load::default());
            for ans in &answers {
                a.next(*ans, now.0, 0.5);
            }
            let load = a.load(false);
            let json = load.to_json(now);
            let back = Load::from_json(&json, now).unwrap();
            assert_eq!(back.streak, load.streak, "{json}");
            assert_eq!(back.last_after, load.last_after, "{json}");
            let (x, y) = (back.not_before, load.not_before);
            assert_eq!(x.is_some(), y.is_some(), "{json}");
            if let (Some(x), Some(y)) = (x, y) {
                let d = if x > y { x - y } else { y - x };
                assert!(d < Duration::from_millis(1), "{json}");
            }
        }
        // A moment already past waits for nothing; anything not ours is refused.
        let past = serde_json::json!({"streak": 2, "last": "none", "not-before": 1.0});
        assert_eq!(Load::from_json(&past, now).unwrap().not_before, None);
        for bad in [
            serde_json::json!({"streak": -1, "last": null, "not-before": null}),
            serde_json::json!({"streak": 1, "last": {"delay": "5"}, "not-before": null}),
            serde_json::json!({"streak": 1, "last": {"delay": 5, "date": 5}, "not-before": null}),
            serde_json::json!({"streak": 1, "last": null, "not-before": 1e300}),
            serde_json::json!({"streak": 1}),
        ] {
            assert_eq!(Load::from_json(&bad, now), None, "{bad}");
        }
    }

    #[test]
    fn busy_answers_do_not_use_up_the_attempts_but_time_does() {
        let r = Retry::exponential(2, S(1)).within(S(50));
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        for _ in 0..100 {
            assert!(matches!(a.next(delay(S(0)), now, 0.0), Next::Pause(_)));
        }
        assert_eq!(
            a.next(Answer::Nothing, now, 0.0),
            Next::Pause(Duration::ZERO)
        );
        // The second attempt without an answer is the last.
        assert_eq!(a.next(Answer::Nothing, now, 0.5), Next::OutOfAttempts);
        // A Retry-After past the budget ends the request now, not at the budget.
        let mut a = Attempts::new(r, now, Load::default());
        assert_eq!(a.next(delay(S(60)), now, 0.0), Next::OutOfTime);
        assert!(a.left(now + S(50)).is_zero());
        let at = Attempts::new(
            Retry::exponential(2, S(1)).until(now + S(10)),
            now,
            Load::default(),
        );
        assert_eq!(at.left(now + S(4)), S(6));
    }

    #[test]
    fn a_best_effort_client_never_waits_less_than_asked_and_stops_instead() {
        let r = Retry::exponential(3, S(1)).capped_at(S(3)).busy_attempts(2);
        let now = Instant::now();
        let mut a = Attempts::new(r, now, Load::default());
        assert_eq!(a.next(delay(S(30)), now, 0.5), Next::AskedTooLong(S(30)));
        let mut a = Attempts::new(r, now, Load::default());
        let Next::Pause(d) = a.next(delay(S(2)), now, 0.99) else {
            panic!()
        };
        assert!(d >= S(2) && d < S(3));
        assert_eq!(a.next(delay(S(2)), now, 0.5), Next::OutOfAttempts);
    }
}
