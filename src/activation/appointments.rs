//! join-service's appointment book. Only the service knows how many nodes wait for it: when
//! they come faster than it makes tickets (a request waited its turn behind others for over
//! `BACKLOG`), each node it turns away gets its own slot, the next free moment of the service's
//! time (one ticket's measured length after the slot before), as a `Retry-After` date, and a
//! node that comes back on time is served ahead of newcomers. A herd is then served in about the
//! time the service needs, each node asking twice (docs/join-service.md, "Appointments").

use std::collections::HashMap;
use std::time::Duration;

/// A request that waited longer than this for its turn (behind others that arrived with it)
/// shows a backlog: it gets a slot rather than a wait its client may not survive.
pub const BACKLOG: Duration = Duration::from_secs(1);
/// A node may come back this much before its slot (the date's whole seconds, clocks) ...
const EARLY: f64 = 1.0;
/// ... or this much after it and still be served as booked; later, it is a newcomer again.
pub const LATE: f64 = 5.0;
/// Bookings held at most, about 150 bytes each (15 MB): beyond it a node is told when the book
/// ends, unbooked, and books when it comes back.
pub const MAX_BOOKINGS: usize = 100_000;
/// What a ticket is taken to cost before one was measured (`kubeadm token create` and two
/// ledger calls take about 0.1 s on an idle control plane).
const FIRST_GUESS: f64 = 0.25;
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
    /// When the service is free of every node booked so far.
    next_free: f64,
    /// Seconds one ticket takes, measured.
    ticket: f64,
}

impl Default for Book {
    fn default() -> Self {
        Book {
            booked: HashMap::new(),
            next_free: 0.0,
            ticket: FIRST_GUESS,
        }
    }
}

impl Book {
    /// The turn of `identity`, asking at `now` (Unix seconds), after waiting `waited` behind the
    /// requests before it.
    pub fn turn(&mut self, identity: &str, now: f64, waited: Duration) -> Turn {
        match self.booked.get(identity).copied() {
            Some(slot) if now < slot - EARLY => {
                return Turn::At {
                    at: slot,
                    booked: true,
                }
            }
            Some(slot) if now <= slot + LATE => {
                self.booked.remove(identity);
                return Turn::Now;
            }
            // Missed: its slot went unused; it queues again as a newcomer.
            Some(_) => {
                self.booked.remove(identity);
            }
            None => {}
        }
        // Nobody booked ahead and no queue: served (the time it takes passes on the clock of
        // the requests behind it). Otherwise the next free moment, which is now itself for the
        // first of a backlog (it comes back within a second or two).
        let slot = self.next_free.max(now);
        if slot <= now && waited < BACKLOG {
            return Turn::Now;
        }
        if self.booked.len() >= MAX_BOOKINGS {
            self.forget_missed(now);
        }
        if self.booked.len() >= MAX_BOOKINGS {
            return Turn::At {
                at: slot,
                booked: false,
            };
        }
        self.next_free = slot + self.ticket;
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

    /// Nodes booked and not yet come or missed.
    pub fn waiting(&self) -> usize {
        self.booked.len()
    }

    /// Seconds a ticket takes, as measured.
    pub fn ticket_secs(&self) -> f64 {
        self.ticket
    }

    fn forget_missed(&mut self, now: f64) {
        self.booked.retain(|_, slot| *slot + LATE >= now);
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
        // Nodes one after the other, none waiting behind another: each served at once.
        for i in 0..5 {
            assert_eq!(b.turn(&id(i), 100.0 + i as f64 * 0.1, FRESH), Turn::Now);
        }
        // A backlog: the first to have waited gets the next free moment (now), the next ones a
        // slot each, one ticket apart, in the order they are seen.
        assert_eq!(b.turn(&id(10), 101.0, QUEUED), booked(101.0));
        assert_eq!(b.turn(&id(11), 101.0, QUEUED), booked(102.0));
        assert_eq!(b.turn(&id(12), 101.1, QUEUED), booked(103.0));
        assert_eq!(b.waiting(), 3);
        // A newcomer that did not wait is booked too while others hold slots ahead of it.
        assert_eq!(b.turn(&id(13), 101.2, FRESH), booked(104.0));
        // Early: told the same slot again. On time, or up to LATE after: served.
        assert_eq!(b.turn(&id(12), 101.5, FRESH), booked(103.0));
        assert_eq!(b.turn(&id(11), 102.0 - EARLY, FRESH), Turn::Now);
        assert_eq!(b.turn(&id(12), 103.0 + LATE, FRESH), Turn::Now);
        assert_eq!(b.waiting(), 2);
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
