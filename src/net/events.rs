//! The HTTPS sender of a run's events (`--events-url`): one thread POSTs them in order, one
//! JSON object per request, while the run goes on. It never blocks the run: events wait in
//! memory while the receiver cannot be reached (bounded in count and age), and at the run's end
//! it waits for the last ones only while the receiver answers, and only briefly; the rest go to
//! the spool for the next run of the boot (`node::events`).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::net::fetch::{AttemptLimits, Failure, FetchError, Http, Request};
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::events::{Delivery, Sink, MAX_EVENTS};

/// One POST's bound, connection and answer included.
const ATTEMPT: Duration = Duration::from_secs(5);
/// Pauses between attempts while the receiver cannot be reached: doubling, up to the cap.
const PAUSE_FIRST: Duration = Duration::from_millis(250);
const PAUSE_CAP: Duration = Duration::from_secs(8);
/// An event not delivered within this is dropped (it says little any more).
pub(crate) const MAX_AGE: Duration = Duration::from_secs(600);
/// At the run's end, how long it waits for the queue to drain while the receiver answers.
pub(crate) const FLUSH: Duration = Duration::from_secs(2);
/// ... and, when no attempt has been answered yet, how long from the first attempt's start it
/// waits for that answer (a receiver that is down answers nothing and costs nothing).
pub(crate) const FIRST_ANSWER: Duration = Duration::from_secs(1);

/// Where events go and as whom.
pub(crate) struct Target {
    /// Checked: https, a host.
    pub(crate) url: String,
    /// The URL as logged and recorded (no user information, query or fragment).
    pub(crate) shown: String,
    /// Trust for the receiver, and the node's client certificate when it has one.
    pub(crate) tls: Tls,
    /// The bearer token, when there is no client certificate. Never logged.
    pub(crate) token: Option<String>,
    /// As whom events are sent, for the log and the record (no secret).
    pub(crate) who: String,
}

/// `url` checked as an events receiver: https only (a token may travel with it).
pub(crate) fn check_url(url: &str, flag: &str) -> crate::error::Result<String> {
    let rest = url.strip_prefix("https://").ok_or_else(|| {
        crate::error::Error::config(format!(
            "{flag} {url:?}: not an https URL (events may carry a token and the node's names)"
        ))
    })?;
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..host_end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || url.contains(char::is_whitespace) {
        return Err(crate::error::Error::config(format!(
            "{flag} {url:?}: no host"
        )));
    }
    let path = rest[host_end..]
        .split(['?', '#'])
        .next()
        .unwrap_or_default();
    Ok(format!("https://{host}{path}"))
}

struct Queue {
    /// (number, when it was pushed, the event), oldest first.
    waiting: VecDeque<(u64, Instant, Vec<u8>)>,
    next: u64,
    sent: u64,
    dropped: u64,
    /// Whether the last attempt was answered (`None`: none finished yet).
    answering: Option<bool>,
    /// When the first attempt started.
    first_try: Option<Instant>,
    closing: bool,
}

struct Shared {
    q: Mutex<Queue>,
    wake: Condvar,
}

pub(crate) struct Sender {
    shared: Arc<Shared>,
    shown: String,
}

impl Sender {
    /// Start the sending thread.
    pub(crate) fn start(t: Target) -> Box<dyn Sink> {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                waiting: VecDeque::new(),
                next: 0,
                sent: 0,
                dropped: 0,
                answering: None,
                first_try: None,
                closing: false,
            }),
            wake: Condvar::new(),
        });
        let shown = t.shown.clone();
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || send_loop(&s, &t));
        if let Err(e) = spawned {
            crate::warn!("events to {shown}: no sender thread ({e}); events are spooled");
        }
        Box::new(Sender { shared, shown })
    }
}

impl Sink for Sender {
    fn push(&mut self, event: Vec<u8>) {
        let Ok(mut q) = self.shared.q.lock() else {
            return;
        };
        if q.waiting.len() >= MAX_EVENTS {
            q.waiting.pop_front();
            q.dropped += 1;
        }
        let n = q.next;
        q.next += 1;
        q.waiting.push_back((n, Instant::now(), event));
        self.shared.wake.notify_all();
    }

    fn close(self: Box<Self>) -> (Delivery, Vec<Vec<u8>>) {
        let give_up = Instant::now() + FLUSH;
        let mut q = match self.shared.q.lock() {
            Ok(q) => q,
            Err(e) => e.into_inner(),
        };
        q.closing = true;
        self.shared.wake.notify_all();
        // Wait only for a receiver that answers: one that does not costs the run nothing, one
        // not heard from yet at most its first answer's bound.
        while !q.waiting.is_empty() {
            let until = match q.answering {
                Some(true) => give_up,
                Some(false) => break,
                None => give_up.min(q.first_try.unwrap_or_else(Instant::now) + FIRST_ANSWER),
            };
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = match self.shared.wake.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(e) => e.into_inner().0,
            };
        }
        // An event on its way now may arrive and be spooled too: receivers tell repeats by
        // `run` and `seq`.
        let left: Vec<Vec<u8>> = q.waiting.drain(..).map(|(_, _, e)| e).collect();
        let d = Delivery {
            url: self.shown.clone(),
            sent: q.sent,
            dropped: q.dropped,
            from_spool: 0,
            spooled: 0,
        };
        (d, left)
    }
}

fn send_loop(s: &Shared, t: &Target) {
    let retry = Retry::exponential(1, PAUSE_FIRST)
        .busy_attempts(1)
        .within(ATTEMPT);
    let limits =
        AttemptLimits::from_options(ATTEMPT.as_secs(), 0, ATTEMPT.as_secs()).unwrap_or_default();
    let http = Http::new(&t.tls, retry).with_limits(limits);
    let mut tries = Backoff {
        pause: PAUSE_FIRST,
        warned: false,
    };
    loop {
        let Some((n, event)) = next_event(s) else {
            return;
        };
        let outcome = http.fetch(&t.request(event), 64 << 10);
        let Ok(mut q) = s.q.lock() else { return };
        if tries.settled(&mut q, outcome, t) {
            // Unless the run's end took it meanwhile.
            if q.waiting.front().is_some_and(|(m, _, _)| *m == n) {
                q.waiting.pop_front();
            }
            tries.pause = PAUSE_FIRST;
            s.wake.notify_all();
            continue;
        }
        s.wake.notify_all();
        if q.closing {
            return;
        }
        // A pause the run's end cuts short.
        let _ = s.wake.wait_timeout(q, tries.pause);
        tries.pause = (tries.pause * 2).min(PAUSE_CAP);
    }
}

/// The oldest event still waiting, with its number, once there is one; `None` when the run
/// ends with none left (or the queue's lock is poisoned).
fn next_event(s: &Shared) -> Option<(u64, Vec<u8>)> {
    let mut q = s.q.lock().ok()?;
    loop {
        // Too old to say much: dropped, and counted.
        while q
            .waiting
            .front()
            .is_some_and(|(_, at, _)| at.elapsed() > MAX_AGE)
        {
            q.waiting.pop_front();
            q.dropped += 1;
        }
        if let Some((n, _, e)) = q.waiting.front() {
            let (n, e) = (*n, e.clone());
            q.first_try.get_or_insert_with(Instant::now);
            return Some((n, e));
        }
        if q.closing {
            return None;
        }
        q = s.wake.wait(q).ok()?;
    }
}

impl Target {
    /// The POST of one event.
    fn request(&self, event: Vec<u8>) -> Request<'_> {
        let mut req = Request::get(&self.url);
        req.method = "POST";
        req.body = Some(("application/json", event));
        if let Some(tok) = &self.token {
            req.headers
                .push(("Authorization".into(), format!("Bearer {tok}")));
        }
        req
    }
}

/// The sender's state between attempts: its next pause, and whether it warned that the
/// receiver does not answer.
struct Backoff {
    pause: Duration,
    warned: bool,
}

impl Backoff {
    /// Counts the attempt's outcome in `q`; whether the event is done with (sent or refused).
    fn settled(
        &mut self,
        q: &mut Queue,
        outcome: std::result::Result<Vec<u8>, FetchError>,
        t: &Target,
    ) -> bool {
        let (done, answering) = match outcome {
            Ok(_) => {
                if self.warned {
                    crate::info!("events to {}: the receiver answers again", t.shown);
                    self.warned = false;
                }
                q.sent += 1;
                (true, true)
            }
            // The receiver refused this event: sending it again will not change that.
            Err(FetchError {
                class: Failure::Final | Failure::Denied | Failure::Passed(_),
                error: e,
            }) => {
                crate::warn!("events to {}: an event refused, dropped: {e}", t.shown);
                q.dropped += 1;
                (true, true)
            }
            Err(e) => {
                if !self.warned {
                    crate::warn!(
                        "events to {}: {e}; events wait in memory (at most {MAX_EVENTS}, {} s each) and the run goes on",
                        t.shown,
                        MAX_AGE.as_secs()
                    );
                    self.warned = true;
                }
                (false, false)
            }
        };
        q.answering = Some(answering);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_https_and_shown_without_secrets() {
        assert_eq!(
            check_url(
                "https://user:pw@events.example:8443/in?token=x#f",
                "--events-url"
            )
            .unwrap(),
            "https://events.example:8443/in"
        );
        for bad in ["http://e.example/", "https:///x", "ftp://e", "https://a b/"] {
            assert!(check_url(bad, "--events-url").is_err(), "{bad}");
        }
    }
}
