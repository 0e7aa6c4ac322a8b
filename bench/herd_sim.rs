//! bench/herd's simulator (a benchmark, not a test): NODES nodes booting at once against one
//! server, in virtual time, each running nodestrap's own request loop.
//!
//!   cargo run --release --example herd-sim -- [OPTIONS]      (bench/herd runs it too)
//!
//! (With `--join`, `activate` nodes against join services instead: bench/herd_sim_join.rs.)
//!
//! **The nodes.** Each makes the five requests of a torcx bootstrap (docs/bootstrap.md): the API
//! server's `/version` and the runtime mappings ConfigMap with the API client's retry rule,
//! then the manifest, its signature and the image with the fetcher's. Every request is
//! `net::fetch::Retrying`, the loop `fetch::Http` drives with the real clock and network: here
//! the clock is virtual and each attempt's outcome comes from the server model, so a busy
//! answer, a reset or a timeout reaches the same decisions (and the same `Attempts::next`) as in
//! the binary. The rules come from the options parser and builders the binary uses
//! (`cli::Bootstrap`, `Common::api_retry`, `Common::fetch_retry`, `Common::limits`); an API
//! request that fails goes through `--version-fallback`'s own decision (`Fallback::allows`).
//!
//! **The whole boot.** A node's first run is the initramfs unit's, with the options of its
//! shipped `ExecStart=` (dracut/50nodestrap/nodestrap-initrd.service: `--deadline=840`). A run
//! that ends without its five answers hands over: SWITCH seconds later the real root's
//! k8s-node-bootstrap.service runs `nodestrap bootstrap` with its shipped options (the default
//! `--deadline`), and systemd starts it again RestartSec (its shipped 10 s) after each failed
//! run, each a new process that starts over and has learned nothing. A node gives up only when
//! HORIZON passes.
//!
//! **The server.** At most SLOTS requests in service, each SERVICE_MS long plus TLS_MS of
//! handshake: its capacity is SLOTS / (SERVICE_MS + TLS_MS). Every attempt is a new connection
//! (the client drops its pool after a failure), so a refused one costs the server a handshake
//! too: the refusals' handshakes of the second before take their share of the slots' time, and
//! service slows by it. Connections beyond what the server can handshake in one second
//! (SLOTS / TLS_MS) overflow, as `--overflow` says:
//!   drop          (the default) Linux's listen queue (`tcp_abort_on_overflow` 0, its default):
//!                 the SYN is dropped and the client's kernel sends it again 1, 3, 7 and 15 s
//!                 after the first (`tcp_syn_retries`' schedule); a connection not accepted
//!                 within the binary's connect time-out (`net::fetch::CONNECT_TIMEOUT`) is an
//!                 attempt without an answer. A dropped SYN costs the server nothing.
//!   reset         the connection is reset (a proxy or a server that sheds at accept): an
//!                 attempt without an answer at once, its handshake paid.
//! A request that finds every slot taken is answered at once, as `--retry-after` says:
//!   fixed:N       503 with `Retry-After: N`, whatever the load (a proxy's constant);
//!   none          503 with no `Retry-After`;
//!   backlog       503 with the time the server needs to serve every node it turned away and has
//!                 not served since, at capacity (at least 1 s);
//!   appointments  nodestrap's own server rule, `activation::appointments::Book` as join-service
//!                 runs it: a node turned away gets its own slot as a `Retry-After` date (whole
//!                 seconds, as `httpdate` writes it), and a node that comes back on time is queued
//!                 for the next free slot ahead of newcomers (a queued request still times out
//!                 at its attempt's deadline);
//!   apf           kube-apiserver's API Priority and Fairness, one priority level with SLOTS
//!                 seats and no queue: 429 with delay-seconds from its dropped-requests tracker
//!                 (k8s.io/apiserver v0.37.2, `Apf` below: between 1 and 32, changed only at the
//!                 first drop of a second, from the seconds before);
//!   random:P      P % of the requests turned away at random with `Retry-After: 1`, the server
//!                 never full (bench/herd's `random-503`: load shed by chance, not by a herd).
//! RTT_MS is each attempt's round trip. Nodes start at random within START seconds. With
//! `--api-only` the server takes only the two API requests of each node (its minimum is 2).
//!
//! Prints one line per run, or with `--table` the matrix of docs/bootstrap.md ("Retries at
//! scale"): nodes done; initramfs runs that handed over; real-root runs that failed; nodes that
//! gave up (not done at HORIZON); runs that took the fallback version (and the nodes done on it:
//! the others' runs failed after it, and a later run asked again); the time the last node
//! finished against the minimum (requests ÷ capacity); requests per node against the minimum (5);
//! p50/p99 seconds; resets, SYNs dropped and time-outs (an attempt's own, or the connect
//! time-out); the peak offered load over capacity once every node has started and the seconds
//! it was over twice the capacity; and the pauses shorter than the server's Retry-After (0: the
//! rule's floor, checked here).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use argh::FromArgs;

use nodestrap::activation::appointments::{Book, Turn};
use nodestrap::cli::Bootstrap;
use nodestrap::error::Error;
use nodestrap::net::cluster::Fallback;
use nodestrap::net::fetch::{Attempt, FetchError, Retrying, Start, CONNECT_TIMEOUT};
use nodestrap::net::retry::{After, Load, Retry};

#[path = "herd_sim_join.rs"]
mod join;

/// The five requests, as the binary names them in its errors.
const REQUESTS: [&str; 5] = [
    "GET /version",
    "GET configmap runtime-mappings",
    "GET manifest",
    "GET manifest signature",
    "GET image",
];
/// The first two requests go to the API server.
const API_REQUESTS: usize = 2;

/// The shipped units whose options and restart the whole boot takes.
const INITRD_UNIT: &str = include_str!("../dracut/50nodestrap/nodestrap-initrd.service");
const REAL_ROOT_UNIT: &str = include_str!("../ignition/units/k8s-node-bootstrap.service");

#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    Fixed(u64),
    None,
    Backlog,
    Appointments,
    Apf,
    /// A share of the requests (per cent) turned away at random with `Retry-After: 1`,
    /// whatever the load (bench/herd's `random-503`): the server is not full.
    Random(u32),
}

impl Server {
    fn parse(s: &str) -> Result<Server, String> {
        let bad = || {
            format!(
                "--retry-after: fixed:N, none, backlog, appointments, apf or random:P, not {s:?}"
            )
        };
        match s {
            "backlog" => Ok(Server::Backlog),
            "none" => Ok(Server::None),
            "appointments" => Ok(Server::Appointments),
            "apf" => Ok(Server::Apf),
            _ if s.starts_with("random:") => s[7..]
                .parse()
                .ok()
                .filter(|p| *p < 100)
                .map(Server::Random)
                .ok_or_else(bad),
            _ => s
                .strip_prefix("fixed:")
                .and_then(|n| n.parse().ok())
                .map(Server::Fixed)
                .ok_or_else(bad),
        }
    }

    fn word(self) -> String {
        match self {
            Server::Fixed(n) => format!("fixed {n} s"),
            Server::None => "none".into(),
            Server::Backlog => "backlog".into(),
            Server::Appointments => "appointments".into(),
            Server::Apf => "APF".into(),
            Server::Random(p) => format!("{p} % at random, 1 s"),
        }
    }
}

struct Model {
    nodes: usize,
    slots: usize,
    service: f64,
    tls: f64,
    server: Server,
    rtt: f64,
    start: f64,
    switch: f64,
    restart: f64,
    horizon: f64,
    seed: u64,
    /// Only the API requests are the server's (`--api-only`).
    api_only: bool,
    overflow: Overflow,
}

/// What the server does with a connection beyond what it can handshake in a second.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overflow {
    /// Linux's listen queue: the SYN is dropped, the client's kernel sends it again.
    Drop,
    /// Reset: an attempt without an answer.
    Reset,
}

impl Overflow {
    fn parse(s: &str) -> Result<Overflow, String> {
        match s {
            "drop" => Ok(Overflow::Drop),
            "reset" => Ok(Overflow::Reset),
            _ => Err(format!("--overflow: drop or reset, not {s:?}")),
        }
    }
}

/// When the client's kernel sends a dropped SYN again, from the first (Linux's
/// `tcp_syn_retries` schedule: an initial 1 s, doubled each time).
fn syn_resend(drops: u32) -> f64 {
    f64::from((1u32 << drops.min(20)) - 1)
}

impl Model {
    /// Requests per second the server completes at most: each holds a slot for its service
    /// and its handshake.
    fn capacity(&self) -> f64 {
        self.slots as f64 / (self.service + self.tls)
    }

    /// The requests of one node the server takes.
    fn per_node(&self) -> usize {
        if self.api_only {
            API_REQUESTS
        } else {
            REQUESTS.len()
        }
    }
}

/// xorshift64*, seeded through splitmix64 so that every seed is a run of its own: reproducible
/// draws for start times and jitter (the binary draws its jitter from the kernel; the rule takes
/// it as an argument).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)).max(1))
    }

    fn fraction(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The options of a shipped unit's `nodestrap bootstrap` command line.
fn unit_options(unit: &str) -> Vec<&str> {
    unit.lines()
        .filter_map(|l| l.split_once('=').filter(|(k, _)| k.starts_with("Exec")))
        .filter_map(|(_, cmd)| cmd.split_once("nodestrap bootstrap"))
        .flat_map(|(_, opts)| opts.split_whitespace())
        .collect()
}

/// A shipped unit's `key=` seconds.
fn unit_seconds(unit: &str, key: &str) -> Option<f64> {
    unit.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok())
}

/// The retry rules of one kind of run: its API client's, its fetcher's, each attempt's limit,
/// its deadline and its fallback.
#[derive(Clone, Copy)]
struct Rules {
    api: Retry,
    fetch: Retry,
    per_attempt: Duration,
    deadline: Duration,
    fallback: Fallback,
}

impl Rules {
    fn of(b: &Bootstrap, ceiling: Option<Duration>) -> Rules {
        let c = b.common();
        let (mut api, mut fetch) = (c.api_retry(), c.fetch_retry());
        if let Some(w) = ceiling {
            api.spread = w;
            fetch.spread = w;
        }
        let per_attempt = match c.limits() {
            Ok(l) => l.deadline,
            Err(e) => fail(format_args!("--bootstrap: {e}")),
        };
        Rules {
            api,
            fetch,
            per_attempt,
            deadline: Duration::from_secs(b.deadline),
            fallback: b.version_fallback,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A node's next attempt starts (its first, or after a pause), or its next run does.
    Begin(u32),
    /// Its attempt `.1` reaches the server.
    Arrives(u32, u32),
    /// The client's kernel sends attempt `.1`'s dropped SYN again.
    Resend(u32, u32),
    /// The server ends its service of attempt `.1`: a slot is free.
    Served(u32, u32),
    /// The server's answer (`Node::answer`) to attempt `.1` reaches the node.
    Reply(u32, u32),
    /// Attempt `.1`'s deadline: unanswered by now, the node gives it up.
    Expires(u32, u32),
}

#[derive(Clone, Copy)]
enum Heard {
    Done,
    Busy(u16, Option<After>),
    Reset,
    /// No SYN of the attempt was accepted within the connect time-out.
    ConnectTimeout,
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Initramfs,
    RealRoot,
}

struct Node {
    phase: Phase,
    /// A new run starts at the next `Begin`.
    fresh: bool,
    run_start: f64,
    step: usize,
    req: Option<Retrying<'static>>,
    /// What each of the node's two clients learned in this run (the API client's, the
    /// fetcher's): the binary keeps it in each `fetch::Http`.
    learned: [Load; 2],
    /// The attempt in flight (attempts of the node are numbered); the ones before are over.
    attempt: u32,
    answer: Heard,
    /// Turned away and not served since (the backlog server's count).
    waiting: bool,
    /// Each client's last busy answer: when it came and the wait it asked for (in the binary,
    /// the API server and the mirror are two servers; here one server plays both).
    told: [Option<(f64, f64)>; 2],
    /// This run took the fallback version.
    fell_back: bool,
    /// SYNs of the attempt in flight the server dropped, and when its first was sent (the
    /// client's connect time-out counts from there).
    syn: (u32, f64),
}

#[derive(Default)]
struct Outcome {
    done: Vec<f64>,
    handed_over: usize,
    failed_runs: usize,
    fallback: usize,
    /// Nodes whose run that finished had taken the fallback version.
    done_on_fallback: usize,
    requests: u64,
    resets: u64,
    /// SYNs dropped (`--overflow drop`).
    dropped: u64,
    timeouts: u64,
    sooner: u64,
    per_second: Vec<u64>,
}

/// kube-apiserver's dropped-requests tracker for one priority level (k8s.io/apiserver
/// util/flowcontrol/dropped_requests_tracker.go): the `Retry-After` of its 429s. It changes only
/// at the first drop of a new second, from the drops of the seconds before: doubled (at most 32)
/// when the last `Retry-After` seconds dropped 3 × `Retry-After` or more and that long has passed
/// since it last doubled, one less when they dropped fewer than `Retry-After`.
struct Apf {
    retry_after: i64,
    doubled_at: i64,
    /// The second being counted and its drops.
    current: (i64, i64),
    /// Earlier seconds with drops: (second, drops), oldest first.
    history: Vec<(i64, i64)>,
}

impl Apf {
    const MAX: i64 = 32;

    fn new() -> Apf {
        Apf {
            retry_after: 1,
            // It may double at any time after the first drop.
            doubled_at: i64::MIN / 2,
            current: (-1, 0),
            history: Vec::new(),
        }
    }

    /// A request dropped in second `sec`: the `Retry-After` it is answered with.
    fn dropped(&mut self, sec: u64) -> u64 {
        let sec = sec as i64;
        if self.current.0 == sec {
            self.current.1 += 1;
        } else {
            let (t, n) = self.current;
            self.history.push((t, n));
            let keep = (2 * self.retry_after).min(Apf::MAX);
            self.history.retain(|(s, _)| t - s <= keep);
            self.current = (sec, 1);
            self.update(sec);
        }
        self.retry_after as u64
    }

    fn update(&mut self, now: i64) {
        let ra = self.retry_after;
        let dropped: i64 = self
            .history
            .iter()
            .rev()
            .take_while(|(t, _)| now - t <= ra)
            .filter(|(t, _)| *t < now)
            .map(|(_, n)| n)
            .sum();
        if now - self.doubled_at >= ra && dropped >= 3 * ra {
            self.retry_after = (2 * ra).min(Apf::MAX);
            self.doubled_at = now;
        } else if dropped < ra && ra > 1 {
            self.retry_after = ra - 1;
        }
    }
}

struct Sim<'m> {
    m: &'m Model,
    initrd: Rules,
    real: Rules,
    base: Instant,
    rng: Rng,
    heap: BinaryHeap<Reverse<(u64, Event)>>,
    nodes: Vec<Node>,
    ids: Vec<String>,
    out: Outcome,
    in_service: usize,
    /// Requests waiting their turn (appointments: join-service's line), with their arrival.
    queue: VecDeque<(u32, u32, f64)>,
    waiting: usize,
    book: Book,
    apf: Apf,
    /// Handshake seconds spent on refused and reset connections, per second.
    refused_cpu: Vec<f64>,
    /// Connections accepted, per second.
    accepted: Vec<u64>,
}

impl<'m> Sim<'m> {
    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t)
    }

    fn push(&mut self, t: f64, ev: Event) {
        self.heap.push(Reverse(((t * 1e9) as u64, ev)));
    }

    fn rules(&self, i: usize) -> Rules {
        match self.nodes[i].phase {
            Phase::Initramfs => self.initrd,
            Phase::RealRoot => self.real,
        }
    }

    /// Node `i`'s request `step` starts at `t`, from what its client learned.
    fn request(&mut self, i: usize, t: f64) {
        let r = self.rules(i);
        let n = &self.nodes[i];
        let client = usize::from(n.step >= API_REQUESTS);
        let mut retry = if client == 0 { r.api } else { r.fetch };
        // The run's deadline counts from its own start, as `--deadline` does in each process.
        retry.until = Some(self.at(n.run_start) + r.deadline);
        let req = Retrying::new(
            REQUESTS[n.step],
            retry,
            r.per_attempt,
            n.learned[client],
            self.at(t),
        );
        self.nodes[i].req = Some(req);
        self.begin(i, t);
    }

    fn begin(&mut self, i: usize, t: f64) {
        if self.nodes[i].fresh {
            let n = &mut self.nodes[i];
            n.fresh = false;
            n.fell_back = false;
            n.run_start = t;
            n.step = 0;
            return self.request(i, t);
        }
        let now = self.at(t);
        let Some(req) = self.nodes[i].req.as_mut() else {
            return;
        };
        match req.begin(now) {
            Ok(Start::Wait(d)) => self.push(t + d.as_secs_f64(), Event::Begin(i as u32)),
            Ok(Start::Attempt(given)) => {
                let n = &mut self.nodes[i];
                let client = usize::from(n.step >= API_REQUESTS);
                if let Some((when, wait)) = n.told[client].take() {
                    if t + 1e-6 < when + wait {
                        self.out.sooner += 1;
                    }
                }
                n.attempt += 1;
                n.syn = (0, t);
                let a = n.attempt;
                self.push(t + self.m.rtt / 2.0, Event::Arrives(i as u32, a));
                self.push(t + given.as_secs_f64(), Event::Expires(i as u32, a));
            }
            Err(e) => self.request_failed(i, t, e),
        }
    }

    fn arrives(&mut self, i: u32, a: u32, t: f64) {
        // A download from the other server, never full: answered in its round trip.
        if self.m.api_only && self.nodes[i as usize].step >= API_REQUESTS {
            return self.reply(i, a, t + self.m.rtt / 2.0, Heard::Done);
        }
        let resent = self.nodes[i as usize].syn.0 > 0;
        let sec = t as usize;
        if self.out.per_second.len() <= sec {
            self.out.per_second.resize(sec + 1, 0);
            self.refused_cpu.resize(sec + 1, 0.0);
            self.accepted.resize(sec + 1, 0);
        }
        // A request is offered once, however many SYNs it takes.
        if !resent {
            self.out.per_second[sec] += 1;
            self.out.requests += 1;
        }
        let m = self.m;
        // More connections than the server can handshake in a second overflow.
        if (self.accepted[sec] + 1) as f64 * m.tls > m.slots as f64 {
            return self.overflowed(i, a, t);
        }
        self.accepted[sec] += 1;
        if m.server == Server::Appointments {
            self.queue.push_back((i, a, t));
            return self.next_in_line(t);
        }
        let full = self.in_service >= m.slots;
        let turned_away = match m.server {
            Server::Random(p) => self.rng.fraction() * 100.0 < p as f64,
            _ => full,
        };
        if turned_away {
            let after = self.retry_after(t);
            self.refused_cpu[t as usize] += m.tls;
            return self.refuse(i, a, t + m.tls, after);
        }
        self.admitted(i);
        self.serve(i, a, t);
    }

    /// Node `i`'s connection for attempt `a` finds the server's handshakes taken at `t`.
    fn overflowed(&mut self, i: u32, a: u32, t: f64) {
        let m = self.m;
        match m.overflow {
            Overflow::Reset => {
                self.refused_cpu[t as usize] += m.tls;
                self.out.resets += 1;
                self.reply(i, a, t + m.rtt / 2.0, Heard::Reset)
            }
            Overflow::Drop => {
                self.out.dropped += 1;
                let n = &mut self.nodes[i as usize];
                n.syn.0 += 1;
                // Sent again on the client's schedule, it reaches the server half a round trip on.
                let next = n.syn.1 + syn_resend(n.syn.0) + m.rtt / 2.0;
                let gives_up = n.syn.1 + CONNECT_TIMEOUT.as_secs_f64();
                match next < gives_up {
                    true => self.push(next, Event::Resend(i, a)),
                    // The client's connect time-out: its attempt's own deadline may come first.
                    false => self.reply(i, a, gives_up, Heard::ConnectTimeout),
                }
            }
        }
    }

    fn admitted(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        if n.waiting {
            n.waiting = false;
            self.waiting -= 1;
        }
    }

    /// join-service's order: requests wait their turn in line; at its turn, one whose node is
    /// gone is skipped, and the book decides for the others by how long they waited. A refusal
    /// holds the slot for its handshake.
    fn next_in_line(&mut self, t: f64) {
        while self.in_service < self.m.slots {
            let Some((i, a, arrived)) = self.queue.pop_front() else {
                return;
            };
            if self.nodes[i as usize].attempt != a {
                continue;
            }
            let waited = Duration::from_secs_f64(t - arrived);
            match self.book.turn(&self.ids[i as usize], t, waited) {
                Turn::Now => {
                    self.admitted(i);
                    self.serve(i, a, t);
                }
                Turn::At { at, .. } => {
                    // The date and the server's `Date` in whole seconds, as `httpdate` writes them.
                    let wait = (at.floor() - t.floor()).max(0.0);
                    let after = After::Date(Duration::from_secs_f64(wait));
                    self.book
                        .refused(Duration::from_secs_f64(self.m.tls / self.m.slots as f64), t);
                    self.in_service += 1;
                    self.push(t + self.m.tls, Event::Served(i, 0));
                    self.refuse(i, a, t + self.m.tls, Some(after));
                }
            }
        }
    }

    fn retry_after(&mut self, t: f64) -> Option<After> {
        let m = self.m;
        let secs = |s: u64| Some(After::Delay(Duration::from_secs(s)));
        match m.server {
            Server::Fixed(s) => secs(s),
            Server::None => None,
            Server::Backlog => secs(((self.waiting as f64 / m.capacity()).ceil() as u64).max(1)),
            Server::Apf => secs(self.apf.dropped(t as u64)),
            Server::Random(_) | Server::Appointments => secs(1),
        }
    }

    /// Node `i`'s attempt `a` is turned away; the answer leaves the server at `t`.
    fn refuse(&mut self, i: u32, a: u32, t: f64, after: Option<After>) {
        let m = self.m;
        let n = &mut self.nodes[i as usize];
        if !n.waiting {
            n.waiting = true;
            self.waiting += 1;
        }
        let status = if m.server == Server::Apf { 429 } else { 503 };
        self.reply(i, a, t + m.rtt / 2.0, Heard::Busy(status, after));
    }

    /// A slot takes the request: its handshake and service, slowed by the share of the
    /// server's time the refused connections' handshakes took in the second before.
    fn serve(&mut self, i: u32, a: u32, t: f64) {
        let m = self.m;
        self.in_service += 1;
        let before = (t as usize)
            .checked_sub(1)
            .map_or(0.0, |s| self.refused_cpu[s]);
        let share = (before / m.slots as f64).min(0.95);
        let took = (m.service + m.tls) / (1.0 - share);
        // The book measures the request's own time (join-service times the making of a ticket,
        // not the handshakes of the connections it turned away meanwhile), over the slots.
        if m.server == Server::Appointments {
            self.book.served(Duration::from_secs_f64(
                (m.service + m.tls) / m.slots as f64,
            ));
        }
        self.push(t + took, Event::Served(i, a));
    }

    /// A slot is free at `t`: attempt `a` (0: a refusal's handshake) was served.
    fn served(&mut self, i: u32, a: u32, t: f64) {
        self.in_service -= 1;
        if a != 0 {
            self.reply(i, a, t + self.m.rtt / 2.0, Heard::Done);
        }
        if self.m.server == Server::Appointments {
            self.next_in_line(t);
        }
    }

    fn reply(&mut self, i: u32, a: u32, t: f64, heard: Heard) {
        let n = &mut self.nodes[i as usize];
        if n.attempt == a {
            n.answer = heard;
            self.push(t, Event::Reply(i, a));
        }
    }

    /// Attempt `a` of node `i` ended at `t` (answered, or its deadline came): the product's
    /// loop decides.
    fn ended(&mut self, i: usize, a: u32, t: f64, timed_out: bool) {
        if self.nodes[i].attempt != a {
            return;
        }
        self.nodes[i].attempt += 1;
        let attempt = if timed_out {
            self.out.timeouts += 1;
            Attempt::Retry(Error::failed("timed out"))
        } else {
            match self.nodes[i].answer {
                Heard::Done => Attempt::Done(()),
                Heard::Busy(status, after) => {
                    if let Some(after) = after {
                        let n = &mut self.nodes[i];
                        n.told[usize::from(n.step >= API_REQUESTS)] =
                            Some((t, after.wait().as_secs_f64()));
                    }
                    Attempt::Busy(Error::failed("busy"), status, after)
                }
                Heard::Reset => Attempt::Retry(Error::failed("connection reset")),
                Heard::ConnectTimeout => {
                    self.out.timeouts += 1;
                    Attempt::Retry(Error::failed("connect timed out"))
                }
            }
        };
        let jitter = self.rng.fraction();
        let now = self.at(t);
        let Some(req) = self.nodes[i].req.as_mut() else {
            return;
        };
        match req.end(attempt, now, jitter) {
            ControlFlow::Continue(pause) => {
                self.push(t + pause.as_secs_f64(), Event::Begin(i as u32))
            }
            ControlFlow::Break(Ok(())) => {
                let n = &mut self.nodes[i];
                let client = usize::from(n.step >= API_REQUESTS);
                n.learned[client] = req_learned(n, &Ok(()));
                n.step += 1;
                if n.step == REQUESTS.len() {
                    n.req = None;
                    self.out.done_on_fallback += usize::from(n.fell_back);
                    self.out.done.push(t);
                } else {
                    self.request(i, t);
                }
            }
            ControlFlow::Break(Err(e)) => self.request_failed(i, t, e),
        }
    }

    /// Node `i`'s request ended without its answer at `t`: the version's fallback, or the run
    /// ends and the next one takes over, from what this one learned (`net::handover`: the
    /// binary leaves it in the run folder, which switch-root keeps).
    fn request_failed(&mut self, i: usize, t: f64, e: FetchError) {
        let r = self.rules(i);
        let m = self.m;
        let n = &mut self.nodes[i];
        let client = usize::from(n.step >= API_REQUESTS);
        let class = e.class;
        n.learned[client] = req_learned(n, &Err(e));
        if n.waiting {
            n.waiting = false;
            self.waiting -= 1;
        }
        if n.step < API_REQUESTS && r.fallback.allows(class) {
            self.out.fallback += 1;
            n.fell_back = true;
            n.step = API_REQUESTS;
            return self.request(i, t);
        }
        n.req = None;
        n.fresh = true;
        let next = match n.phase {
            Phase::Initramfs => {
                self.out.handed_over += 1;
                n.phase = Phase::RealRoot;
                t + m.switch
            }
            Phase::RealRoot => {
                self.out.failed_runs += 1;
                t + m.restart
            }
        };
        if next < m.horizon {
            self.push(next, Event::Begin(i as u32));
        }
    }
}

fn req_learned(n: &Node, out: &Result<(), FetchError>) -> Load {
    n.req.as_ref().map(|r| r.learned(out)).unwrap_or_default()
}

fn simulate(m: &Model, initrd: Rules, real: Rules) -> Outcome {
    let mut sim = Sim {
        m,
        initrd,
        real,
        // The virtual clock: runs start where the binary's does, so `--deadline` (an `Instant`
        // built from `started()`) means the same here.
        base: nodestrap::node::status::started(),
        rng: Rng::new(m.seed),
        heap: BinaryHeap::new(),
        nodes: Vec::with_capacity(m.nodes),
        ids: (0..m.nodes).map(|i| format!("node-{i}")).collect(),
        out: Outcome::default(),
        in_service: 0,
        queue: VecDeque::new(),
        waiting: 0,
        // A bootstrap's requests to this server are one session; the server knows its
        // throughput before it measures it.
        book: Book::for_sessions(
            m.per_node() as u32,
            Duration::from_secs_f64(1.0 / m.capacity()),
        ),
        apf: Apf::new(),
        refused_cpu: Vec::new(),
        accepted: Vec::new(),
    };
    for i in 0..m.nodes {
        let t = sim.rng.fraction() * m.start;
        sim.nodes.push(Node {
            phase: Phase::Initramfs,
            fresh: true,
            run_start: t,
            step: 0,
            req: None,
            learned: [Load::default(); 2],
            attempt: 0,
            answer: Heard::Reset,
            waiting: false,
            told: [None; 2],
            fell_back: false,
            syn: (0, 0.0),
        });
        sim.push(t, Event::Begin(i as u32));
    }
    while let Some(Reverse((t, ev))) = sim.heap.pop() {
        let t = t as f64 / 1e9;
        if t > m.horizon {
            break;
        }
        match ev {
            Event::Begin(i) => sim.begin(i as usize, t),
            Event::Arrives(i, a) => sim.arrives(i, a, t),
            // Not once the client gave the attempt up.
            Event::Resend(i, a) if sim.nodes[i as usize].attempt == a => sim.arrives(i, a, t),
            Event::Resend(..) => {}
            Event::Served(i, a) => sim.served(i, a, t),
            Event::Reply(i, a) => sim.ended(i as usize, a, t, false),
            Event::Expires(i, a) => sim.ended(i as usize, a, t, true),
        }
    }
    sim.out.done.sort_by(f64::total_cmp);
    sim.out
}

fn pct(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

struct Row {
    nodes: usize,
    server: String,
    o: Outcome,
    last: f64,
    minimum: f64,
    per_node: f64,
    /// The requests of one node the server takes: the minimum per node.
    least: usize,
    peak: f64,
    over: usize,
}

fn run(m: &Model, initrd: Rules, real: Rules) -> Row {
    let o = simulate(m, initrd, real);
    let minimum = (m.nodes * m.per_node()) as f64 / m.capacity();
    // After the start: every node's first request lands within `start`, whatever the rule.
    let after_start = o.per_second.iter().skip(m.start.ceil() as usize + 1);
    let peak = after_start.clone().copied().max().unwrap_or(0) as f64 / m.capacity();
    let over = after_start
        .filter(|r| **r as f64 > 2.0 * m.capacity())
        .count();
    Row {
        nodes: m.nodes,
        server: m.server.word(),
        last: o.done.last().copied().unwrap_or(f64::NAN),
        minimum,
        per_node: o.requests as f64 / m.nodes as f64,
        least: m.per_node(),
        peak,
        over,
        o,
    }
}

const HEAD: &str = "| nodes | server | done | initramfs handed over | real-root runs failed | gave up | fallback runs (done on it) | all done s (minimum) | time/min | requests/min | p50 s | p99 s | resets | SYNs dropped | timeouts | peak offered/capacity | s over 2× capacity | sooner than Retry-After |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

fn line(r: &Row) -> String {
    let o = &r.o;
    format!(
        "| {} | {} | {} | {} | {} | {} | {} ({}) | {:.0} ({:.0}) | {:.2} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {:.1} | {} | {} |",
        r.nodes,
        r.server,
        o.done.len(),
        o.handed_over,
        o.failed_runs,
        r.nodes - o.done.len(),
        o.fallback,
        o.done_on_fallback,
        r.last,
        r.minimum,
        r.last / r.minimum,
        r.per_node / r.least as f64,
        pct(&o.done, 0.5),
        pct(&o.done, 0.99),
        o.resets,
        o.dropped,
        o.timeouts,
        r.peak,
        r.over,
        o.sooner
    )
}

#[derive(FromArgs)]
/// Simulate a herd of nodes booting against one server with nodestrap's own request loop.
struct Args {
    /// nodes (default 10000)
    #[argh(option, default = "10000")]
    nodes: usize,
    /// requests the server serves at once (default 10)
    #[argh(option, default = "10")]
    slots: usize,
    /// milliseconds each request takes in service (default 19: with the handshake, 10 slots
    /// serve 500 per second)
    #[argh(option, default = "19.0")]
    service_ms: f64,
    /// milliseconds of the server's time each new connection's TLS handshake takes (default 1)
    #[argh(option, default = "1.0")]
    tls_ms: f64,
    /// the server when full: fixed:N, none, backlog, appointments, apf or random:P (default
    /// fixed:5)
    #[argh(option, default = "String::from(\"fixed:5\")")]
    retry_after: String,
    /// milliseconds of each attempt's round trip (default 5)
    #[argh(option, default = "5.0")]
    rtt_ms: f64,
    /// seconds over which the nodes start (default 2)
    #[argh(option, default = "2.0")]
    start: f64,
    /// seconds from the initramfs run's end to the real root's unit (default 15)
    #[argh(option, default = "15.0")]
    switch: f64,
    /// seconds after which a node not done has given up (default 14400)
    #[argh(option, default = "14400.0")]
    horizon: f64,
    /// seed of the draws (default 1)
    #[argh(option, default = "1")]
    seed: u64,
    /// only the API server's requests (/version, the ConfigMap) are the server's; the manifest,
    /// its signature and the image come from another that is never full, in one round trip
    /// each (bench/herd's `apf-N`: a real API server, a release server beside it)
    #[argh(switch)]
    api_only: bool,
    /// what the server does with connections beyond what it can handshake in a second: drop
    /// (Linux's listen queue; the client's kernel sends the SYN again) or reset (default drop)
    #[argh(option, default = "String::from(\"drop\")")]
    overflow: String,
    /// activate's join client against join services instead (bench/herd's join3):
    /// herd_sim_join.rs
    #[argh(switch)]
    join: bool,
    /// with --join: the join services (default 3)
    #[argh(option, default = "3")]
    services: usize,
    /// with --join: milliseconds a ticket takes a join service (default 100)
    #[argh(option, default = "100.0")]
    ticket_ms: f64,
    /// with --join: a file of the tickets' times a real herd's services logged, one line per
    /// ticket in the order made: the service's number (from 0) and the seconds (default: each
    /// takes --ticket-ms)
    #[argh(option)]
    ticket_times: Option<String>,
    /// with --join: milliseconds a node's word that it keeps its ticket takes (default 20)
    #[argh(option, default = "20.0")]
    kept_ms: f64,
    /// with --join: milliseconds a refusal takes a join service (default 1)
    #[argh(option, default = "1.0")]
    refuse_ms: f64,
    /// with --join: activate's --join-interval (default 5)
    #[argh(option, default = "5")]
    join_interval: u64,
    /// with --join: activate's --join-timeout (default 30)
    #[argh(option, default = "30.0")]
    join_timeout: f64,
    /// the matrix: 500, 10,000 and 100,000 nodes, each server (the other options apply)
    #[argh(switch)]
    table: bool,
    /// the trade-off curve: 10,000 and 100,000 nodes against a fixed Retry-After and none, for
    /// each spread window's ceiling (seconds, comma-separated) in place of the one the
    /// deadline gives
    #[argh(option)]
    curve: Option<String>,
    /// a bootstrap option the retry rules read (--deadline, --api-retry-delay,
    /// --fetch-backoff-ms, --version-fallback, ...), as NAME=VALUE, for both units' runs;
    /// repeatable
    #[argh(option)]
    bootstrap: Vec<String>,
}

fn fail(what: std::fmt::Arguments) -> ! {
    eprintln!("herd-sim: {what}");
    std::process::exit(2);
}

/// A unit's runs: its own options, then the ones given here.
fn bootstrap(unit: &[&str], extra: &[String]) -> Bootstrap {
    let mut opts: Vec<String> = unit.iter().map(|s| s.to_string()).collect();
    for o in extra {
        match o.split_once('=') {
            Some((k, v)) => {
                opts.push(format!("--{}", k.trim_start_matches('-')));
                opts.push(v.to_string());
            }
            None => opts.push(format!("--{}", o.trim_start_matches('-'))),
        }
    }
    // As the binary reads its argv: Go-style `--flag=value` first rewritten.
    let opts = nodestrap::cli::argv::normalize(&opts);
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    match Bootstrap::from_args(&["bootstrap"], &opts) {
        Ok(b) => b,
        Err(e) => fail(format_args!("--bootstrap: {}", e.output)),
    }
}

/// `--ticket-times`: each service's tickets' seconds, in the order made.
fn ticket_times(path: &str) -> Vec<Vec<f64>> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| fail(format_args!("--ticket-times {path}: {e}")));
    let mut times: Vec<Vec<f64>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let parsed = line.split_once(' ').and_then(|(k, s)| {
            let s = s
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)?;
            Some((k.parse::<usize>().ok().filter(|k| *k < 64)?, s))
        });
        let Some((k, secs)) = parsed else {
            fail(format_args!(
                "--ticket-times {path}:{}: a service number and seconds, not {line:?}",
                n + 1
            ));
        };
        if times.len() <= k {
            times.resize(k + 1, Vec::new());
        }
        times[k].push(secs);
    }
    times
}

fn main() {
    let a: Args = argh::from_env();
    let initrd = bootstrap(&unit_options(INITRD_UNIT), &a.bootstrap);
    let real = bootstrap(&unit_options(REAL_ROOT_UNIT), &a.bootstrap);
    let Some(restart) = unit_seconds(REAL_ROOT_UNIT, "RestartSec") else {
        fail(format_args!(
            "k8s-node-bootstrap.service has no RestartSec="
        ));
    };
    let server = Server::parse(&a.retry_after).unwrap_or_else(|e| fail(format_args!("{e}")));
    let overflow = Overflow::parse(&a.overflow).unwrap_or_else(|e| fail(format_args!("{e}")));
    let model = |nodes, server| Model {
        nodes,
        slots: a.slots,
        service: a.service_ms / 1000.0,
        tls: a.tls_ms / 1000.0,
        server,
        rtt: a.rtt_ms / 1000.0,
        start: a.start,
        switch: a.switch,
        restart,
        horizon: a.horizon,
        seed: a.seed,
        api_only: a.api_only,
        overflow,
    };
    let started = Instant::now();
    if a.join {
        let times = a
            .ticket_times
            .as_deref()
            .map_or_else(Vec::new, ticket_times);
        if times.len() > a.services {
            fail(format_args!(
                "--ticket-times names service {}, beyond --services {}",
                times.len() - 1,
                a.services
            ));
        }
        let r = join::run(
            join::JoinModel {
                nodes: a.nodes,
                services: a.services,
                ticket: a.ticket_ms / 1000.0,
                kept: a.kept_ms / 1000.0,
                refuse: a.refuse_ms / 1000.0,
                rtt: a.rtt_ms / 1000.0,
                start: a.start,
                interval: Duration::from_secs(a.join_interval),
                timeout: a.join_timeout,
                seed: a.seed,
            },
            &times,
        );
        println!(
            "| nodes | services | joined | calls/node | p50 s | p99 s | all joined s (minimum) |"
        );
        println!("|---|---|---|---|---|---|---|");
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1} ({:.1}) |",
            a.nodes, a.services, r.joined, r.calls_per_node, r.p50, r.p99, r.last, r.minimum
        );
        return;
    }
    if a.ticket_times.is_some() {
        fail(format_args!("--ticket-times is for --join"));
    }
    let rules = |ceiling| (Rules::of(&initrd, ceiling), Rules::of(&real, ceiling));
    if let Some(c) = &a.curve {
        println!("| window's ceiling s | nodes | server | handed over | gave up | all done s (minimum) | time/min | requests/min |");
        println!("|---|---|---|---|---|---|---|---|");
        for w in c.split(',') {
            let Ok(w) = w.trim().parse::<u64>() else {
                fail(format_args!("--curve: seconds, comma-separated, not {w:?}"));
            };
            let (i, r) = rules(Some(Duration::from_secs(w)));
            for n in [10_000, 100_000] {
                for s in [Server::Fixed(5), Server::None] {
                    let row = run(&model(n, s), i, r);
                    println!(
                        "| {w} | {} | {} | {} | {} | {:.0} ({:.0}) | {:.2} | {:.2} |",
                        row.nodes,
                        row.server,
                        row.o.handed_over,
                        row.nodes - row.o.done.len(),
                        row.last,
                        row.minimum,
                        row.last / row.minimum,
                        row.per_node / row.least as f64
                    );
                }
            }
        }
        return;
    }
    let runs: Vec<Model> = if a.table {
        let servers = [
            Server::Fixed(5),
            Server::None,
            Server::Backlog,
            Server::Appointments,
            Server::Apf,
        ];
        [500, 10_000, 100_000]
            .into_iter()
            .flat_map(|n| servers.into_iter().map(move |s| (n, s)))
            .map(|(n, s)| model(n, s))
            .collect()
    } else {
        vec![model(a.nodes, server)]
    };
    println!(
        "herd-sim: capacity {:.0} requests/s ({} slots × ({} + {} TLS) ms), nodes start within {} s, round trip {} ms; initramfs run --deadline {} s, then the real root's after {} s, again {} s after each failure",
        runs[0].capacity(),
        a.slots,
        a.service_ms,
        a.tls_ms,
        a.start,
        a.rtt_ms,
        initrd.deadline,
        a.switch,
        restart,
    );
    println!("{HEAD}");
    let (i, r) = rules(None);
    for m in &runs {
        println!("{}", line(&run(m, i, r)));
    }
    eprintln!(
        "herd-sim: {} runs in {:.1} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
}
