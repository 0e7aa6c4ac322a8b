//! bench/herd's simulator (a benchmark, not a test): NODES nodes booting at once against one
//! server, in virtual time, each deciding when to try again with nodestrap's own retry code.
//!
//!   cargo run --release --example herd-sim -- [OPTIONS]      (bench/herd runs it too)
//!
//! Each node makes the five requests of a torcx bootstrap (docs/bootstrap.md): the API
//! server's `/version` and the runtime mappings ConfigMap with the API client's retry rule,
//! then the manifest, its signature and the image with the fetcher's. Both rules come from the
//! options parser and builders the binary uses (`cli::Bootstrap`, `Common::api_retry`,
//! `Common::fetch_retry`), and every pause is `net::retry::Attempts::next`, the state machine
//! `fetch::Http` drives with the real clock; here its clock is virtual (the run's start is
//! `node::status::started()`, as in the binary). A request that runs out of time goes through
//! `--version-fallback`'s own decision (`cli::Fallback::allows`).
//!
//! The server: at most SLOTS requests in service, each SERVICE_MS long (its capacity is
//! SLOTS / SERVICE_MS per second); a request that finds every slot taken is answered 503 at
//! once, with a `Retry-After` as `--retry-after` says:
//!   fixed:N   N seconds, whatever the load (a load balancer's or a proxy's constant);
//!   backlog   the time the server needs to serve every node it turned away and has not served
//!             since, at capacity (at least 1 s): what an API server with Priority and Fairness
//!             or a load balancer that sizes its queue may send;
//!   none      no `Retry-After`;
//!   random:P  P % of the requests turned away at random with `Retry-After: 1`, the server never
//!             full (bench/herd's `random-503`: load shed by chance, not by a herd).
//! CLIENT_MS is each request's time on the client's side (connecting, TLS), added before it
//! reaches the server. Nodes start at random within START seconds.
//!
//! Prints one line per run, or with `--table` the matrix of docs/bootstrap.md ("Retries at
//! scale"): nodes done, failed, on the fallback version, the time the last finished against the
//! minimum (requests ÷ capacity), requests per node against the minimum 5, p50/p99 seconds,
//! the peak offered load over capacity once every node has started and the seconds it was over
//! twice the capacity, and the pauses shorter than the server's Retry-After (0: the rule's
//! floor, checked here).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use argh::FromArgs;

use nodestrap::cli::Bootstrap;
use nodestrap::net::cluster::Fallback;
use nodestrap::net::fetch::Failure;
use nodestrap::net::retry::{After, Answer, Attempts, Load, Next, Retry};

const REQUESTS: u8 = 5;
/// The first two requests go to the API server.
const API_REQUESTS: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    Fixed(u64),
    Backlog,
    None,
    /// A share of the requests (per cent) turned away at random with `Retry-After: 1`,
    /// whatever the load (bench/herd's `random-503`): the server is not full.
    Random(u32),
}

impl Server {
    fn parse(s: &str) -> Result<Server, String> {
        match s {
            "backlog" => Ok(Server::Backlog),
            "none" => Ok(Server::None),
            _ if s.starts_with("random:") => s[7..]
                .parse()
                .ok()
                .filter(|p| *p < 100)
                .map(Server::Random)
                .ok_or_else(|| {
                    format!("--retry-after random:P takes a per cent under 100, not {s:?}")
                }),
            _ => s
                .strip_prefix("fixed:")
                .and_then(|n| n.parse().ok())
                .map(Server::Fixed)
                .ok_or_else(|| {
                    format!("--retry-after: fixed:N, backlog, none or random:P, not {s:?}")
                }),
        }
    }

    fn word(self) -> String {
        match self {
            Server::Fixed(n) => format!("fixed {n} s"),
            Server::Backlog => "backlog".into(),
            Server::None => "none".into(),
            Server::Random(p) => format!("{p} % at random, 1 s"),
        }
    }
}

struct Model {
    nodes: usize,
    slots: usize,
    service: f64,
    server: Server,
    client: f64,
    start: f64,
    seed: u64,
}

impl Model {
    fn capacity(&self) -> f64 {
        self.slots as f64 / self.service
    }
}

/// xorshift64*: reproducible draws for start times and jitter (the binary draws its jitter
/// from the kernel; the rule takes it as an argument).
struct Rng(u64);

impl Rng {
    fn fraction(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The service of a node's request ends: its slot is free and the node goes on.
    Served(u32),
    /// A node's request reaches the server.
    Arrives(u32),
}

struct Node {
    step: u8,
    tries: Attempts,
    /// What each of the node's two clients learned (the API client's, the fetcher's): the
    /// binary keeps it in each `fetch::Http`.
    learned: [Load; 2],
    waiting: bool,
    /// When the server last turned it away, and the Retry-After it gave.
    refused: Option<(f64, f64)>,
}

#[derive(Default)]
struct Outcome {
    done: Vec<f64>,
    failed: usize,
    fallback: usize,
    requests: u64,
    sooner: u64,
    per_second: Vec<u64>,
}

/// Which of a node's clients makes request `step`: 0 the API client, 1 the fetcher.
fn client(step: u8) -> usize {
    usize::from(step >= API_REQUESTS)
}

fn simulate(m: &Model, api: Retry, fetch: Retry, fallback: Fallback) -> Outcome {
    // The virtual clock: the run starts where the binary's does, so `--deadline` (an
    // `Instant` built from `started()`) means the same here.
    let base = nodestrap::node::status::started();
    let at = |t: f64| base + Duration::from_secs_f64(t);
    let ns = |t: f64| (t * 1e9) as u64;
    let mut rng = Rng(m.seed | 1);
    let mut heap = BinaryHeap::new();
    let mut nodes = Vec::with_capacity(m.nodes);
    for i in 0..m.nodes {
        let t = rng.fraction() * m.start;
        nodes.push(Node {
            step: 0,
            tries: Attempts::new(api, at(t), Load::default()),
            learned: [Load::default(); 2],
            waiting: false,
            refused: None,
        });
        heap.push(Reverse((ns(t + m.client), Event::Arrives(i as u32))));
    }
    let mut out = Outcome::default();
    let (mut busy, mut waiting) = (0usize, 0usize);
    while let Some(Reverse((t, ev))) = heap.pop() {
        let t = t as f64 / 1e9;
        match ev {
            Event::Served(i) => {
                busy -= 1;
                let n = &mut nodes[i as usize];
                n.learned[client(n.step)] = n.tries.load(true);
                n.step += 1;
                if n.step == REQUESTS {
                    out.done.push(t);
                    continue;
                }
                let rule = if n.step < API_REQUESTS { api } else { fetch };
                n.tries = Attempts::new(rule, at(t), n.learned[client(n.step)]);
                heap.push(Reverse((ns(t + m.client), Event::Arrives(i))));
            }
            Event::Arrives(i) => {
                let n = &mut nodes[i as usize];
                if let Some((when, after)) = n.refused.take() {
                    if t + 1e-6 < when + after {
                        out.sooner += 1;
                    }
                }
                let sec = t as usize;
                if out.per_second.len() <= sec {
                    out.per_second.resize(sec + 1, 0);
                }
                out.per_second[sec] += 1;
                out.requests += 1;
                let shed = match m.server {
                    Server::Random(p) => rng.fraction() * 100.0 < p as f64,
                    _ => busy >= m.slots,
                };
                if !shed {
                    busy += 1;
                    if n.waiting {
                        n.waiting = false;
                        waiting -= 1;
                    }
                    heap.push(Reverse((ns(t + m.service), Event::Served(i))));
                    continue;
                }
                if !n.waiting {
                    n.waiting = true;
                    waiting += 1;
                }
                let after = match m.server {
                    Server::Fixed(s) => Some(Duration::from_secs(s)),
                    Server::Backlog => Some(Duration::from_secs(
                        ((waiting as f64 / m.capacity()).ceil() as u64).max(1),
                    )),
                    Server::None => None,
                    Server::Random(_) => Some(Duration::from_secs(1)),
                };
                n.refused = after.map(|a| (t, a.as_secs_f64()));
                // The answer reaches the node after its half of the round trip; it decides then.
                let now = t + m.client / 2.0;
                let busy = Answer::Busy(after.map(After::Delay));
                let pause = match n.tries.next(busy, at(now), rng.fraction()) {
                    Next::Pause(d) => d.as_secs_f64(),
                    _ => {
                        // Out of time: the API server's answer may give way to the node's
                        // files; a download has no stand-in.
                        if n.waiting {
                            n.waiting = false;
                            waiting -= 1;
                        }
                        if n.step < API_REQUESTS && fallback.allows(Failure::Busy) {
                            out.fallback += 1;
                            n.learned[0] = n.tries.load(false);
                            n.step = API_REQUESTS;
                            n.tries = Attempts::new(fetch, at(now), n.learned[1]);
                            heap.push(Reverse((ns(now + m.client), Event::Arrives(i))));
                        } else {
                            out.failed += 1;
                        }
                        continue;
                    }
                };
                // `next` ends the request rather than pause past the deadline.
                heap.push(Reverse((
                    ns(now + pause + m.client / 2.0),
                    Event::Arrives(i),
                )));
            }
        }
    }
    out.done.sort_by(f64::total_cmp);
    out
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
    done: usize,
    failed: usize,
    fallback: usize,
    last: f64,
    minimum: f64,
    per_node: f64,
    p50: f64,
    p99: f64,
    peak: f64,
    over: usize,
    sooner: u64,
}

fn run(m: &Model, b: &Bootstrap, ceiling: Option<Duration>) -> Row {
    let c = b.common();
    let (mut api, mut fetch) = (c.api_retry(), c.fetch_retry());
    if let Some(w) = ceiling {
        api.spread = w;
        fetch.spread = w;
    }
    let o = simulate(m, api, fetch, b.version_fallback);
    let minimum = m.nodes as f64 * REQUESTS as f64 / m.capacity();
    // After the start: every node's first request lands within `start`, whatever the rule.
    let after_start = o.per_second.iter().skip(m.start.ceil() as usize + 1);
    let peak = after_start.clone().copied().max().unwrap_or(0) as f64 / m.capacity();
    let over = after_start
        .filter(|r| **r as f64 > 2.0 * m.capacity())
        .count();
    Row {
        nodes: m.nodes,
        server: m.server.word(),
        done: o.done.len(),
        failed: o.failed,
        fallback: o.fallback,
        last: o.done.last().copied().unwrap_or(f64::NAN),
        minimum,
        per_node: o.requests as f64 / m.nodes as f64,
        p50: pct(&o.done, 0.5),
        p99: pct(&o.done, 0.99),
        peak,
        over,
        sooner: o.sooner,
    }
}

const HEAD: &str = "| nodes | Retry-After | done | failed | fallback | all done s (minimum) | time/min | requests/node | requests/min | p50 s | p99 s | peak offered/capacity | s over 2× capacity | sooner than Retry-After |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

fn line(r: &Row) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {:.0} ({:.0}) | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.1} | {} | {} |",
        r.nodes,
        r.server,
        r.done,
        r.failed,
        r.fallback,
        r.last,
        r.minimum,
        r.last / r.minimum,
        r.per_node,
        r.per_node / REQUESTS as f64,
        r.p50,
        r.p99,
        r.peak,
        r.over,
        r.sooner
    )
}

#[derive(FromArgs)]
/// Simulate a herd of nodes against one server with nodestrap's own retry rule.
struct Args {
    /// nodes (default 10000)
    #[argh(option, default = "10000")]
    nodes: usize,
    /// requests the server serves at once (default 10)
    #[argh(option, default = "10")]
    slots: usize,
    /// milliseconds each request takes in service (default 20: 10 slots serve 500 per second)
    #[argh(option, default = "20.0")]
    service_ms: f64,
    /// the server's Retry-After when full: fixed:N, backlog, none or random:P (default fixed:5)
    #[argh(option, default = "String::from(\"fixed:5\")")]
    retry_after: String,
    /// milliseconds of each request on the client's side (connecting, TLS; default 5)
    #[argh(option, default = "5.0")]
    client_ms: f64,
    /// seconds over which the nodes start (default 2)
    #[argh(option, default = "2.0")]
    start: f64,
    /// seed of the draws (default 1)
    #[argh(option, default = "1")]
    seed: u64,
    /// the matrix: 10,000 and 100,000 nodes, each server behaviour (the other options apply)
    #[argh(switch)]
    table: bool,
    /// the trade-off curve: 10,000 and 100,000 nodes against a fixed Retry-After and none, for
    /// each spread window's ceiling (seconds, comma-separated) in place of the one the
    /// deadline gives
    #[argh(option)]
    curve: Option<String>,
    /// a bootstrap option the retry rules read (--deadline, --api-retry-delay,
    /// --fetch-backoff-ms, --version-fallback, ...), as NAME=VALUE; repeatable
    #[argh(option)]
    bootstrap: Vec<String>,
}

fn main() {
    let a: Args = argh::from_env();
    let mut opts = Vec::new();
    for o in &a.bootstrap {
        match o.split_once('=') {
            Some((k, v)) => {
                opts.push(format!("--{}", k.trim_start_matches('-')));
                opts.push(v.to_string());
            }
            None => opts.push(format!("--{}", o.trim_start_matches('-'))),
        }
    }
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let b = match Bootstrap::from_args(&["bootstrap"], &opts) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("herd-sim: --bootstrap: {}", e.output);
            std::process::exit(2);
        }
    };
    let server = match Server::parse(&a.retry_after) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("herd-sim: {e}");
            std::process::exit(2);
        }
    };
    let model = |nodes, server| Model {
        nodes,
        slots: a.slots,
        service: a.service_ms / 1000.0,
        server,
        client: a.client_ms / 1000.0,
        start: a.start,
        seed: a.seed,
    };
    let started = Instant::now();
    if let Some(c) = &a.curve {
        println!("| window's ceiling s | nodes | Retry-After | failed | all done s (minimum) | time/min | requests/min |");
        println!("|---|---|---|---|---|---|---|");
        for w in c.split(',') {
            let Ok(w) = w.trim().parse::<u64>() else {
                eprintln!("herd-sim: --curve: seconds, comma-separated, not {w:?}");
                std::process::exit(2);
            };
            for n in [10_000, 100_000] {
                for s in [Server::Fixed(5), Server::None] {
                    let r = run(&model(n, s), &b, Some(Duration::from_secs(w)));
                    println!(
                        "| {w} | {} | {} | {} | {:.0} ({:.0}) | {:.2} | {:.2} |",
                        r.nodes,
                        r.server,
                        r.failed,
                        r.last,
                        r.minimum,
                        r.last / r.minimum,
                        r.per_node / REQUESTS as f64
                    );
                }
            }
        }
        return;
    }
    let runs: Vec<Model> = if a.table {
        [10_000, 100_000]
            .into_iter()
            .flat_map(|n| {
                [Server::Fixed(5), Server::Backlog, Server::None]
                    .into_iter()
                    .map(move |s| (n, s))
            })
            .map(|(n, s)| model(n, s))
            .collect()
    } else {
        vec![model(a.nodes, server)]
    };
    println!(
        "herd-sim: capacity {:.0} requests/s ({} slots × {} ms), nodes start within {} s, client {} ms, deadline {} s",
        runs[0].capacity(),
        a.slots,
        a.service_ms,
        a.start,
        a.client_ms,
        b.deadline
    );
    println!("{HEAD}");
    for m in &runs {
        println!("{}", line(&run(m, &b, None)));
    }
    eprintln!(
        "herd-sim: {} runs in {:.1} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
}
