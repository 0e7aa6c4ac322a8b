//! join-service's appointment book. Only the service knows how many nodes wait for it: when
//! they come faster than it makes tickets (a request would be served more than `BACKLOG` after
//! it arrived: its wait in line, then the time the book already holds), each node it turns away
//! gets its own slot, the next free moment of the service's time (one visit's measured length
//! after the slot before: its ticket and the ticket's keeping), as a `Retry-After` date, and a
//! node that comes back on time is served ahead of newcomers. A herd is then served in about the
//! time the service needs, each node asking twice (docs/join-service.md, "Appointments").
//!
//! A server whose nodes make several requests in a row (a session) books the whole session: a
//! slot holds the time of all of them, and a node served at its slot (or at once) is served
//! through to the session's end, each request within `LATE` of the one before, so that each node
//! is turned away at most once (bench/herd_sim.rs models a bootstrap's five requests so).

use std::collections::HashMap;
use std::time::Duration;

/// A request that would be served longer than this after it arrived (its wait behind others
/// that arrived with it, and the service's time already booked) shows a backlog: it gets a slot
/// rather than a wait its client may not survive.
pub(crate) const BACKLOG: Duration = Duration::from_secs(1);
/// A node may come back this much before its slot (the date's whole seconds, clocks) ...
const EARLY: f64 = 1.0;
/// ... or this much after it and still be served as booked; later, it is a newcomer again.
pub(crate) const LATE: f64 = 5.0;
/// Bookings and sessions held at most, about 150 bytes each (15 MB): beyond it a node is told
/// when the book ends, unbooked, and books when it comes back.
pub(crate) const MAX_BOOKINGS: usize = 100_000;
/// What a ticket is taken to cost before one was measured (`kubeadm token create` and two
/// ledger calls take about 0.1 s on an idle control plane).
const FIRST_GUESS: Duration = Duration::from_millis(250);
/// The measured cost follows each ticket by this much (an exponential average).
const FOLLOW: f64 = 0.2;

/// What a node that asks for a ticket is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Turn {
    /// Its turn: served now.
    Now,
    /// Come back at this moment (Unix seconds): its slot (`booked`), or, with the book full, the
    /// end of the book.
    At { at: f64, booked: bool },
}

pub struct Book {
    /// Node identity → its slot (Unix seconds).
    booked: HashMap<String, f64>,
    /// Node identity → the requests its session has left and when it was last served.
    serving: HashMap<String, (u32, f64)>,
    /// Requests one node makes in a session (join-service: 1, its ticket).
    session: u32,
    /// When the service is free of every node booked so far.
    next_free: f64,
    /// Seconds one ticket takes, measured.
    ticket: f64,
    /// Seconds the service spends, per ticket, on the node's later word that it keeps it.
    keep: f64,
    /// Seconds turning a node away takes the service, measured (for its log).
    refusal: f64,
}

impl Default for Book {
    fn default() -> Self {
        Book::for_sessions(1, FIRST_GUESS)
    }
}

impl Book {
    /// A book for nodes that make `requests` requests in a row (at least 1), each taken to cost
    /// `guess` of the service's time until one is measured. A guess too high leaves the service
    /// idle for the first slots it gives, which it holds to.
    pub fn for_sessions(requests: u32, guess: Duration) -> Book {
        Book {
            booked: HashMap::new(),
            serving: HashMap::new(),
            session: requests.max(1),
            next_free: 0.0,
            ticket: guess.as_secs_f64(),
            keep: 0.0,
            refusal: 0.0,
        }
    }

    /// The turn of `identity`, asking at `now` (Unix seconds), after waiting `waited` behind the
    /// requests before it.
    pub fn turn(&mut self, identity: &str, now: f64, waited: Duration) -> Turn {
        // The rest of a session was booked with its slot.
        if let Some((left, last)) = self.serving.remove(identity) {
            if now <= last + LATE {
                self.begin(identity, left, now);
                return Turn::Now;
            }
        }
        match self.booked.get(identity).copied() {
            Some(slot) if now < slot - EARLY => {
                return Turn::At {
                    at: slot,
                    booked: true,
                }
            }
            Some(slot) if now <= slot + LATE => {
                self.booked.remove(identity);
                self.begin(identity, self.session, now);
                return Turn::Now;
            }
            // Missed: its slot went unused; it queues again as a newcomer.
            Some(_) => {
                self.booked.remove(identity);
            }
            None => {}
        }
        // Served at once if the service is free within BACKLOG of the request's arrival (what
        // it waited in line included), its session's time added to the book. Otherwise booked
        // at the next free moment, which is within a second or two for the first of a backlog.
        let slot = self.next_free.max(now);
        if slot - now + waited.as_secs_f64() < BACKLOG.as_secs_f64() {
            self.next_free = slot + self.visit();
            self.begin(identity, self.session, now);
            return Turn::Now;
        }
        if self.held() >= MAX_BOOKINGS {
            self.forget_missed(now);
        }
        if self.held() >= MAX_BOOKINGS {
            return Turn::At {
                at: slot,
                booked: false,
            };
        }
        self.next_free = slot + self.visit();
        self.booked.insert(identity.to_string(), slot);
        Turn::At {
            at: slot,
            booked: true,
        }
    }

    /// A ticket was made in `took`: the slots given from now on follow what tickets cost (at
    /// least 0.1 ms: a server of several slots books at its throughput, one slot's time over
    /// their number).
    pub fn served(&mut self, took: Duration) {
        let t = took.as_secs_f64().clamp(0.000_1, 600.0);
        self.ticket += FOLLOW * (t - self.ticket);
    }

    /// The node's word that it keeps its ticket took the service `took`: slots given from now
    /// on leave room for it, since every ticket brings one.
    pub fn kept(&mut self, took: Duration) {
        let t = took.as_secs_f64().clamp(0.0, 600.0);
        self.keep += FOLLOW * (t - self.keep);
    }

    /// Turning a node away took the service `took` at `now`: every slot still to give is that
    /// much later (those given stand, and their nodes wait their turn in line).
    pub fn refused(&mut self, took: Duration, now: f64) {
        let t = took.as_secs_f64().clamp(0.0, 600.0);
        if self.next_free > now {
            self.next_free += t;
        }
        self.refusal += FOLLOW * (t - self.refusal);
    }

    /// Seconds turning a node away takes, as measured.
    pub(crate) fn refusal_secs(&self) -> f64 {
        self.refusal
    }

    /// Seconds a node's visit takes the service: its session's requests, and its keeping.
    fn visit(&self) -> f64 {
        f64::from(self.session) * self.ticket + self.keep
    }

    /// Seconds a node's word that it keeps its ticket takes, as measured.
    pub(crate) fn keep_secs(&self) -> f64 {
        self.keep
    }

    /// Nodes booked and not yet come or missed.
    pub(crate) fn waiting(&self) -> usize {
        self.booked.len()
    }

    /// Seconds a ticket takes, as measured.
    pub(crate) fn ticket_secs(&self) -> f64 {
        self.ticket
    }

    /// `identity` is served now, with `left` requests of its session to go, this one included.
    fn begin(&mut self, identity: &str, left: u32, now: f64) {
        if left > 1 {
            self.serving.insert(identity.to_string(), (left - 1, now));
        }
    }

    fn held(&self) -> usize {
        self.booked.len() + self.serving.len()
    }

    fn forget_missed(&mut self, now: f64) {
        self.booked.retain(|_, slot| *slot + LATE >= now);
        self.serving.retain(|_, (_, last)| *last + LATE >= now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUED: Duration = Duration::from_secs(2);
    const FRESH: Duration = Duration::ZERO;

    fn id(i: usize) -> String {
        format!("sha256:{i:064x}")
    }

    /// A book whose tickets take 1 s, for round figures.
    fn book() -> Book {
        Book {
            ticket: 1.0,
            ..Book::default()
        }
    }

    fn booked(at: f64) -> Turn {
        Turn::At { at, booked: true }
    }

    #[test]
    fn a_free_service_serves_at_once_and_a_backlog_is_booked_in_order() {
        let mut b = book();
        // Nodes one after the other, each as the ticket before is made: each served at once.
        for i in 0..5 {
            assert_eq!(b.turn(&id(i), 100.0 + i as f64, FRESH), Turn::Now);
        }
        // A backlog: the first to have waited gets the next free moment, the next ones a slot
        // each, one ticket apart, in the order they are seen.
        assert_eq!(b.turn(&id(10), 104.5, QUEUED), booked(105.0));
        assert_eq!(b.turn(&id(11), 104.5, QUEUED), booked(106.0));
        assert_eq!(b.turn(&id(12), 104.6, QUEUED), booked(107.0));
        assert_eq!(b.waiting(), 3);
        // A newcomer that did not wait is booked too while others hold slots ahead of it.
        assert_eq!(b.turn(&id(13), 104.7, FRESH), booked(108.0));
        // Early: told the same slot again. On time, or up to LATE after: served.
        assert_eq!(b.turn(&id(12), 105.0, FRESH), booked(107.0));
        assert_eq!(b.turn(&id(11), 106.0 - EARLY, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(12), 107.0 + LATE, FRESH), Turn::Now);
        assert_eq!(b.waiting(), 2);
        // Once the book is through, a newcomer is served at once if the service is free within
        // 1 s of its asking (waiting included), and booked otherwise.
        assert_eq!(b.turn(&id(20), 200.0, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(21), 200.5, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(22), 200.6, FRESH), booked(202.0));
        assert_eq!(
            b.turn(&id(23), 202.9, Duration::from_millis(200)),
            Turn::Now
        );
        assert_eq!(
            b.turn(&id(24), 202.9, Duration::from_millis(950)),
            booked(204.0)
        );
    }

    #[test]
    fn a_session_is_booked_whole_and_served_through() {
        // Nodes of three requests each, a request taking 1 s.
        let mut b = Book::for_sessions(3, Duration::from_secs(1));
        // Served at once: its session holds the service for 3 s, so the next node is booked
        // after it.
        assert_eq!(b.turn(&id(0), 100.0, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(1), 100.1, FRESH), booked(103.0));
        assert_eq!(b.turn(&id(2), 100.2, QUEUED), booked(106.0));
        // Node 0's later requests are served, whatever waits; a fourth is a newcomer again.
        assert_eq!(b.turn(&id(0), 101.0, QUEUED), Turn::Now);
        assert_eq!(b.turn(&id(0), 102.0, QUEUED), Turn::Now);
        assert_eq!(b.turn(&id(0), 102.5, FRESH), booked(109.0));
        // Node 1 at its slot: served through, each request within LATE of the one before.
        assert_eq!(b.turn(&id(1), 103.0, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(1), 103.0 + LATE, QUEUED), Turn::Now);
        // A session left longer than LATE is over: the node is a newcomer again.
        assert_eq!(b.turn(&id(2), 106.0, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(2), 106.1 + LATE, QUEUED), booked(112.0));
        // Held: nodes 0 and 2 booked, node 1 with one request of its session left.
        assert_eq!(b.held(), 3);
    }

    #[test]
    fn a_missed_slot_is_lost_and_its_node_queues_again() {
        let mut b = book();
        for i in 0..10 {
            assert_eq!(b.turn(&id(i), 0.0, QUEUED), booked(i as f64));
        }
        // Node 1 comes back more than LATE after its slot: booked after node 9.
        assert_eq!(b.turn(&id(1), 1.0 + LATE + 0.1, FRESH), booked(10.0));
        // Once every slot has passed, a late node finds the service free: served at once.
        assert_eq!(b.turn(&id(2), 20.0, FRESH), Turn::Now);
    }

    #[test]
    fn slots_follow_what_tickets_cost() {
        let mut b = book();
        for _ in 0..100 {
            b.served(Duration::from_millis(200));
        }
        assert!((b.ticket_secs() - 0.2).abs() < 0.001);
        // 500 nodes that queued: every one booked, one ticket apart, the last about 100 s on.
        let mut last = -1.0;
        for i in 0..500 {
            match b.turn(&id(i), 0.0, QUEUED) {
                Turn::At { at, booked: true } => {
                    assert!(at > last);
                    last = at;
                }
                t => panic!("{t:?}"),
            }
        }
        assert!((last - 99.8).abs() < 0.5, "{last}");
        // Each ticket's keeping takes 0.1 s more: the next slots are 0.3 s apart.
        for _ in 0..100 {
            b.kept(Duration::from_millis(100));
        }
        let Turn::At { at, .. } = b.turn(&id(1000), 0.0, QUEUED) else {
            panic!("not booked")
        };
        let Turn::At { at: next, .. } = b.turn(&id(1001), 0.0, QUEUED) else {
            panic!("not booked")
        };
        assert!((next - at - 0.3).abs() < 0.001, "{at} {next}");
        // Turning a node away takes 0.05 s: the next slot is that much later.
        b.refused(Duration::from_millis(50), 0.0);
        let Turn::At { at: later, .. } = b.turn(&id(1002), 0.0, QUEUED) else {
            panic!("not booked")
        };
        assert!((later - next - 0.35).abs() < 0.001, "{next} {later}");
    }

    #[test]
    fn a_full_book_names_its_end_without_booking_and_forgets_missed_slots() {
        let mut b = book();
        for i in 0..MAX_BOOKINGS {
            assert!(matches!(
                b.turn(&id(i), 0.0, QUEUED),
                Turn::At { booked: true, .. }
            ));
        }
        let end = MAX_BOOKINGS as f64;
        assert_eq!(
            b.turn(&id(MAX_BOOKINGS), 0.0, QUEUED),
            Turn::At {
                at: end,
                booked: false
            }
        );
        // Once the first slots are missed, their room goes to the next to ask.
        assert!(matches!(
            b.turn(&id(MAX_BOOKINGS), 100.0, FRESH),
            Turn::At { booked: true, .. }
        ));
        assert!(b.waiting() <= MAX_BOOKINGS);
    }
}
