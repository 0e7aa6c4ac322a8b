//! `herd-sim --join`: NODES `activate` nodes asking SERVICES join services for a ticket at once,
//! as bench/herd's `join3` runs them for real. Each node runs activate's own round rule
//! (`activation::join_client::Rounds`: whom to ask, in what order, how long to pause), each join
//! service its own `activation::appointments::Book` in join-service's order: handshakes in
//! parallel, then one node at a time in the order they were read; a ticket takes TICKET_MS (the
//! token command and the ledger's calls), a node's word that it keeps its ticket KEPT_MS (a
//! ledger call), a refusal REFUSE_MS (its answer); with `--ticket-times`, each service's tickets
//! take, in turn, the times a real service logged (its book measures them as they come, so the
//! slots it gives follow them as the real book's did). A call not answered within `--join-timeout`
//! is given up and the round goes on to the next service. Counted as bench/herd counts at its
//! relays: every call, tickets and kept ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use nodestrap::activation::appointments::{Book, Turn};
use nodestrap::activation::join_client::Rounds;
use nodestrap::net::retry::After;

use crate::Rng;

/// The call number of a node's word that it keeps its ticket.
const KEPT: u32 = u32::MAX;

#[derive(Clone, Copy)]
pub struct JoinModel {
    pub nodes: usize,
    pub services: usize,
    pub ticket: f64,
    pub kept: f64,
    pub refuse: f64,
    pub rtt: f64,
    pub start: f64,
    pub interval: Duration,
    pub timeout: f64,
    pub seed: u64,
}

pub struct JoinRow {
    pub joined: usize,
    pub calls_per_node: f64,
    pub p50: f64,
    pub p99: f64,
    pub last: f64,
    /// Seconds the services need at least: every ticket and kept call, spread over them.
    pub minimum: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A node starts a round.
    Round(u32),
    /// A call `.2` of node `.0` reaches service `.1`.
    Arrives(u32, u32, u32),
    /// Service `.0` is done with what it was doing.
    Free(u32),
    /// The answer to call `.1` reaches node `.0`: a ticket (`.2`), or a slot as a date.
    Answer(u32, u32, bool),
    /// Call `.1`'s `--join-timeout`.
    Expires(u32, u32),
}

struct Node {
    rounds: Rounds,
    /// This round's services still to ask, and its pause.
    left: VecDeque<usize>,
    pause: Duration,
    /// The call in flight (numbered); an answer to another is late.
    call: u32,
    asking: usize,
    /// The slot's wait the last refusal named, whole seconds.
    told: f64,
    joined: Option<f64>,
}

struct Service {
    book: Book,
    /// What its next tickets take (`--ticket-times`), before TICKET_MS.
    times: VecDeque<f64>,
    line: VecDeque<(u32, u32, f64, bool)>,
    busy: bool,
}

struct JoinSim {
    m: JoinModel,
    base: Instant,
    rng: Rng,
    heap: BinaryHeap<Reverse<(u64, Ev)>>,
    nodes: Vec<Node>,
    ids: Vec<String>,
    services: Vec<Service>,
    calls: u64,
}

impl JoinSim {
    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t)
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.heap.push(Reverse(((t * 1e9) as u64, ev)));
    }

    /// Each node lists the services in its own order (bench/herd: node i from service i mod
    /// SERVICES on): the service its `--join-endpoints` names at `k`.
    fn service_of(&self, i: u32, k: usize) -> u32 {
        ((k + i as usize) % self.m.services) as u32
    }

    /// As the join client's loop: a round's pause drawn, then the services in its order.
    fn round(&mut self, i: u32, t: f64) {
        let now = self.at(t);
        let f = self.rng.fraction();
        let n = &mut self.nodes[i as usize];
        n.pause = n.rounds.spread(f);
        n.left = n.rounds.order(now).into();
        self.next_call(i, t);
    }

    fn next_call(&mut self, i: u32, t: f64) {
        let now = self.at(t);
        let n = &mut self.nodes[i as usize];
        while let Some(s) = n.left.pop_front() {
            if !n.rounds.may_ask(s, now) {
                continue;
            }
            n.call += 1;
            n.asking = s;
            let c = n.call;
            self.calls += 1;
            let svc = self.service_of(i, s);
            self.push(t + self.m.rtt / 2.0, Ev::Arrives(i, svc, c));
            self.push(t + self.m.timeout, Ev::Expires(i, c));
            return;
        }
        // The round is over: its pause, or up to the slot a service holds.
        let jitter = self.rng.fraction();
        let n = &self.nodes[i as usize];
        let p = n.rounds.pause(now, n.pause, jitter);
        self.push(t + p.as_secs_f64(), Ev::Round(i));
    }

    fn arrives(&mut self, i: u32, s: u32, c: u32, t: f64, kept: bool) {
        self.services[s as usize].line.push_back((i, c, t, kept));
        self.serve(s, t);
    }

    /// join-service's serialized part: one node at a time, in the order they were read.
    fn serve(&mut self, s: u32, t: f64) {
        let m = self.m;
        let svc = &mut self.services[s as usize];
        if svc.busy {
            return;
        }
        let Some((i, c, arrived, kept)) = svc.line.pop_front() else {
            return;
        };
        svc.busy = true;
        if kept {
            svc.book.kept(Duration::from_secs_f64(m.kept));
            self.push(t + m.kept, Ev::Free(s));
            return self.push(t + m.kept + m.rtt / 2.0, Ev::Answer(i, KEPT, true));
        }
        let waited = Duration::from_secs_f64(t - arrived);
        let unix = 1.8e9 + t;
        match svc.book.turn(&self.ids[i as usize], unix, waited) {
            Turn::Now => {
                let took = svc.times.pop_front().unwrap_or(m.ticket);
                svc.book.served(Duration::from_secs_f64(took));
                self.push(t + took, Ev::Free(s));
                self.push(t + took + m.rtt / 2.0, Ev::Answer(i, c, true));
            }
            Turn::At { at, .. } => {
                // The date and the service's `Date` in whole seconds, as `httpdate` writes them.
                let wait = (at.floor() - unix.floor()).max(0.0);
                svc.book.refused(Duration::from_secs_f64(m.refuse), unix);
                self.nodes[i as usize].told = wait;
                self.push(t + m.refuse, Ev::Free(s));
                self.push(t + m.refuse + m.rtt / 2.0, Ev::Answer(i, c, false));
            }
        }
    }

    fn answer(&mut self, i: u32, c: u32, ticket: bool, t: f64) {
        let svc = self.service_of(i, self.nodes[i as usize].asking);
        let now = self.at(t);
        let n = &mut self.nodes[i as usize];
        if c == KEPT {
            // Joined: activate ends once its word is taken (bench/herd times the process).
            n.joined = Some(t);
            return;
        }
        if n.call != c {
            return;
        }
        n.call += 1;
        if ticket {
            // Its word that it keeps the ticket goes to the same service.
            self.calls += 1;
            return self.push(t + self.m.rtt / 2.0, Ev::Arrives(i, svc, KEPT));
        }
        let after = After::Date(Duration::from_secs_f64(n.told));
        let later = n.rounds.refused(n.asking, after, now);
        if later.appointment {
            n.left.clear();
        }
        self.next_call(i, t);
    }

    fn expires(&mut self, i: u32, c: u32, t: f64) {
        let n = &mut self.nodes[i as usize];
        if n.call != c {
            return;
        }
        n.call += 1;
        self.next_call(i, t);
    }
}

/// `m`, its services' tickets taking `times[k]` in turn (then `m.ticket`).
pub fn run(m: JoinModel, times: &[Vec<f64>]) -> JoinRow {
    let mut sim = JoinSim {
        m,
        base: nodestrap::node::status::started(),
        rng: Rng::new(m.seed),
        heap: BinaryHeap::new(),
        nodes: Vec::with_capacity(m.nodes),
        ids: (0..m.nodes).map(|i| format!("sha256:{i:064x}")).collect(),
        services: (0..m.services)
            .map(|k| Service {
                book: Book::default(),
                times: times.get(k).cloned().unwrap_or_default().into(),
                line: VecDeque::new(),
                busy: false,
            })
            .collect(),
        calls: 0,
    };
    for i in 0..m.nodes {
        let t = sim.rng.fraction() * m.start;
        sim.nodes.push(Node {
            rounds: Rounds::new(m.services, m.interval),
            left: VecDeque::new(),
            pause: Duration::ZERO,
            call: 0,
            asking: 0,
            told: 0.0,
            joined: None,
        });
        sim.push(t, Ev::Round(i as u32));
    }
    while let Some(Reverse((ns, ev))) = sim.heap.pop() {
        let t = ns as f64 / 1e9;
        match ev {
            Ev::Round(i) => {
                if sim.nodes[i as usize].joined.is_none() {
                    sim.round(i, t)
                }
            }
            Ev::Arrives(i, s, c) => sim.arrives(i, s, c, t, c == KEPT),
            Ev::Free(s) => {
                sim.services[s as usize].busy = false;
                sim.serve(s, t);
            }
            Ev::Answer(i, c, ticket) => sim.answer(i, c, ticket, t),
            Ev::Expires(i, c) => sim.expires(i, c, t),
        }
    }
    let mut done: Vec<f64> = sim.nodes.iter().filter_map(|n| n.joined).collect();
    done.sort_by(f64::total_cmp);
    JoinRow {
        joined: done.len(),
        calls_per_node: sim.calls as f64 / m.nodes as f64,
        p50: crate::pct(&done, 0.5),
        p99: crate::pct(&done, 0.99),
        last: done.last().copied().unwrap_or(f64::NAN),
        minimum: m.nodes as f64 * (m.ticket + m.kept) / m.services as f64,
    }
}
