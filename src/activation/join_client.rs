//! activate's join client: rounds of ticket requests to the join services, a ticket checked in
//! every part against the pinned cluster CA, then the control-plane files and `kubeadm join`
//! under the node lock (docs/activate.md).

use std::time::{Duration, Instant};

use crate::activation::exchange::{self, Endpoint};
use crate::activation::kubeadm::{self, JoinSpec};
use crate::activation::racers::{remove_or_warn, reset_manifests, Ctx, Side, PKI};
use crate::activation::wire::{Ticket, TicketRequest, KEPT_PATH, TICKET_PATH};
use crate::error::{Error, Result};
use crate::net::retry::After;

/// It holds the token: in /run (tmpfs), mode 0600, only while kubeadm join runs.
const JOIN_CONFIG: &str = "/run/nodestrap/kubeadm-join.yaml";

pub(super) fn join_client(ctx: &Ctx) -> Result<Side> {
    let interval = Duration::from_secs(ctx.a.join_interval);
    if ctx.endpoints.is_empty() {
        crate::info!("join client off: no --join-endpoints");
    }
    let mut rounds = Rounds::new(ctx.endpoints.len(), interval);
    // This run's session: a run that starts after a kill asks again as another run, and the
    // join services give it a new ticket if the one before was never kept.
    let body = serde_json::to_vec(&TicketRequest {
        session: Some(crate::crypto::random::run_id()),
    })?;
    loop {
        if ctx.lock.is_taken() {
            crate::info!("join client: init has the node lock; not joining");
            return Ok(Side::Lost);
        }
        if ctx.stop.requested() {
            return Ok(Side::Stopped);
        }
        let pause = rounds.spread(crate::crypto::random::fraction());
        for i in rounds.order(Instant::now()) {
            let ep = &ctx.endpoints[i];
            if !rounds.may_ask(i, Instant::now()) {
                continue;
            }
            match request_ticket(ctx, ep, &body) {
                Ok(t) => return join_with(ctx, ep, t),
                Err((e, None)) => crate::warn!(
                    "join client: {e}; asking again in {:.1} s",
                    pause.as_secs_f64()
                ),
                Err((e, Some(after))) => {
                    let later = rounds.refused(i, after, Instant::now());
                    let again = match later.appointment {
                        true => "its slot: asking it again then".to_string(),
                        false => format!(
                            "asking it again in {:.1} s",
                            pause.max(after.wait()).as_secs_f64()
                        ),
                    };
                    crate::warn!(
                        "join client: {e}; {} asks to wait {} s (Retry-After): {again}",
                        ep.url,
                        later.wait.as_secs(),
                    );
                    // One slot at a time: the others are not asked while it holds one.
                    if later.appointment {
                        break;
                    }
                }
            }
            if ctx.lock.is_taken() || ctx.stop.requested() {
                break;
            }
        }
        if ctx.endpoints.is_empty() {
            ctx.stop.sleep(Duration::from_secs(3600));
        } else {
            let jitter = crate::crypto::random::fraction();
            ctx.stop.sleep(rounds.pause(Instant::now(), pause, jitter));
        }
    }
}

/// The join client's rule for whom a round asks and how long it pauses after, from what each
/// join service answered (docs/activate.md). The clock and the draws are given, so that
/// bench/herd_sim.rs drives this same rule in virtual time.
pub struct Rounds {
    later: Vec<Option<Later>>,
    interval: Duration,
}

impl Rounds {
    pub fn new(services: usize, interval: Duration) -> Rounds {
        Rounds {
            later: vec![None; services],
            interval,
        }
    }

    /// A round's pause, from a draw in [0, 1): between half and one and a half intervals, so
    /// that a fleet that boots together does not come back to the join services in waves.
    pub fn spread(&self, fraction: f64) -> Duration {
        self.interval.mul_f64(0.5 + fraction)
    }

    /// The join services in the order a round asks them: one whose slot for this node has come
    /// first, then the others in their order.
    pub fn order(&self, now: Instant) -> Vec<usize> {
        let due = |i: &usize| self.later[*i].is_some_and(|l| l.appointment && l.at <= now);
        let (mut first, rest): (Vec<usize>, Vec<usize>) = (0..self.later.len()).partition(due);
        first.extend(rest);
        first
    }

    /// A join service that said when to ask again (Retry-After) is not asked sooner.
    pub fn may_ask(&self, i: usize, now: Instant) -> bool {
        self.later[i].is_none_or(|l| now >= l.at)
    }

    /// Service `i` turned the node away with `after`; an appointment ends the round.
    pub fn refused(&mut self, i: usize, after: After, now: Instant) -> Later {
        let later = Later::new(after, now);
        self.later[i] = Some(later);
        later
    }

    /// The pause before the next round: up to the slot a join service holds for this node,
    /// plus under a second of jitter (docs/join-service.md, "Appointments"), else the round's.
    pub fn pause(&self, now: Instant, round: Duration, jitter: f64) -> Duration {
        let slot = self
            .later
            .iter()
            .flatten()
            .filter(|l| l.appointment && l.at > now)
            .map(|l| l.at - now)
            .min();
        match slot {
            Some(s) => s + Duration::from_secs(1).mul_f64(jitter),
            None => round,
        }
    }
}

/// When a join service said to ask again.
#[derive(Debug, Clone, Copy)]
pub struct Later {
    at: Instant,
    wait: Duration,
    /// A slot it holds for this node (a `Retry-After` date): kept to the second.
    pub appointment: bool,
}

impl Later {
    fn new(after: After, now: Instant) -> Later {
        let wait = after.wait().min(LONGEST_RETRY_AFTER);
        Later {
            at: now + wait,
            wait,
            appointment: matches!(after, After::Date(_)),
        }
    }
}

/// A join service's `Retry-After` is honoured up to this: a value beyond it (a misconfigured
/// service) must not keep a node from asking it for days.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// One ticket call, bounded by --join-timeout; the ticket only if it is valid in every part.
/// No ticket: why, and how long the service asked to be left alone (its `Retry-After`).
fn request_ticket(
    ctx: &Ctx,
    ep: &Endpoint,
    body: &[u8],
) -> std::result::Result<Ticket, (Error, Option<After>)> {
    let t = Duration::from_secs(ctx.a.join_timeout);
    let a = exchange::post(&ctx.client, ep, None, TICKET_PATH, body, t, t)
        .map_err(|e| (e.into_error(), None))?;
    if a.status != 200 {
        let (_, msg) = exchange::answer_error(a.status, &a.body);
        return Err((
            Error::failed(format!("ticket from {}: {msg}", ep.url)),
            a.retry_after,
        ));
    }
    let failed = |m: String| (Error::failed(format!("ticket from {}: {m}", ep.url)), None);
    let ticket: Ticket =
        serde_json::from_slice(&a.body).map_err(|e| failed(format!("does not parse: {e}")))?;
    ticket
        .validate(&ctx.pinned)
        .map_err(|m| failed(format!("{m}; refused")))?;
    crate::info!(
        "join client: ticket from {}: {} of cluster {} via API server {}",
        ep.url,
        ticket.role.as_str(),
        ticket.cluster_name,
        ticket.api_server_endpoint
    );
    Ok(ticket)
}

fn join_with(ctx: &Ctx, ep: &Endpoint, t: Ticket) -> Result<Side> {
    // 1. The node lock.
    let source = format!("ticket from {}", ep.url);
    match ctx.lock.try_lock(
        t.role,
        &t.cluster_name,
        Some(&t.discovery_token_ca_cert_hash),
        &source,
    ) {
        Ok(true) => {}
        Ok(false) => {
            crate::info!("join client: a ticket arrived but init has the node lock; not joining");
            return Ok(Side::Lost);
        }
        Err(e) => return Err(ctx.fatal(e)),
    }
    // 2. The join service's record made final.
    tell_kept(ctx, ep);
    match join_cluster(ctx, &t).and_then(|()| ctx.lock.done(None)) {
        Ok(()) => {
            ctx.stop.request();
            Ok(Side::Won {
                role: t.role,
                via: "join",
                cluster: t.cluster_name,
            })
        }
        Err(e) => Err(ctx.fatal(e)),
    }
}

/// The node lock is durable: the join service is told that this node keeps its ticket, so that
/// its identity is refused from now on. Until then it may ask again (a node killed before its
/// lock holds no ticket). A service busy with a herd may turn the call away (its handshakes
/// full, or `503`): it is tried up to `KEPT_TRIES` times within --join-timeout, a second or so
/// apart. Not told (the service gone): the join goes on; the record stays open to this
/// identity for the service's --retry-window, and the log says so.
fn tell_kept(ctx: &Ctx, ep: &Endpoint) {
    let end = Instant::now() + Duration::from_secs(ctx.a.join_timeout);
    let mut last = String::new();
    for n in 1..=KEPT_TRIES {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let after = match exchange::post(&ctx.client, ep, None, KEPT_PATH, b"{}", left, left) {
            Ok(a) if a.status == 200 => {
                return crate::info!(
                    "join client: told {} that this node keeps its ticket",
                    ep.url
                )
            }
            Ok(a) => {
                last = exchange::answer_error(a.status, &a.body).1;
                a.retry_after.map(After::wait).unwrap_or_default()
            }
            Err(e) => {
                last = e.into_error().to_string();
                Duration::ZERO
            }
        };
        // Its Retry-After is honoured, as every other answer's.
        if n < KEPT_TRIES {
            let pause = Duration::from_millis(500)
                .mul_f64(1.0 + 2.0 * crate::crypto::random::fraction())
                .max(after);
            ctx.stop
                .sleep(pause.min(end.saturating_duration_since(Instant::now())));
        }
    }
    crate::warn!(
        "join client: could not tell {} that this node keeps its ticket ({last}); joining \
         anyway: until its retry window closes, the service would give this identity another \
         ticket",
        ep.url
    )
}

/// Calls saying the node keeps its ticket, at most.
const KEPT_TRIES: u32 = 5;

/// Join steps 3 to 5: control-plane keys into place; the JoinConfiguration; `kubeadm join`, up to
/// `--join-attempts` times within `--join-budget`, from a fresh manifests folder each time. A
/// join that fails for good takes the ticket's files away again: the cluster CA keys must not
/// stay on a node that is being given up.
fn join_cluster(ctx: &Ctx, t: &Ticket) -> Result<()> {
    let mut written = Vec::new();
    let r = place_and_join(ctx, t, &mut written);
    if r.is_err() && !written.is_empty() {
        for p in &written {
            remove_or_warn(ctx.root, p, "a cluster key or certificate from the ticket");
        }
        crate::info!(
            "join failed: removed the {} control-plane files of the ticket from {}",
            written.len(),
            ctx.root.show(PKI)
        );
    }
    r
}

fn place_and_join(ctx: &Ctx, t: &Ticket, written: &mut Vec<String>) -> Result<()> {
    for f in &t.control_plane_files {
        let mode = if f.name.ends_with(".key") {
            0o600
        } else {
            0o644
        };
        let p = format!("{PKI}/{}", f.name);
        // Listed before the write, which can fail after its rename (syncing the folder).
        written.push(p.clone());
        ctx.root.write_atomic(&p, f.data.as_bytes(), mode)?;
    }
    if !t.control_plane_files.is_empty() {
        crate::info!(
            "wrote {} control-plane files from the ticket into {}",
            t.control_plane_files.len(),
            ctx.root.show(PKI)
        );
    }
    let config = kubeadm::join_config(&JoinSpec {
        api_server_endpoint: &t.api_server_endpoint,
        token: &t.token,
        ca_cert_hash: &t.discovery_token_ca_cert_hash,
        role: t.role,
        kubernetes_version: t.kubernetes_version.as_deref(),
    });
    ctx.root
        .write_atomic(JOIN_CONFIG, config.as_bytes(), 0o600)?;
    let r = join_attempts(ctx, t);
    remove_or_warn(ctx.root, JOIN_CONFIG, "the bootstrap token");
    r
}

fn join_attempts(ctx: &Ctx, t: &Ticket) -> Result<()> {
    let budget = Duration::from_secs(ctx.a.join_budget);
    let start = Instant::now();
    let argv = vec![
        ctx.a.kubeadm.clone(),
        "join".into(),
        "--config".into(),
        ctx.root.show(JOIN_CONFIG),
    ];
    let mut last = String::new();
    let mut n = 0;
    while n < ctx.a.join_attempts {
        let left = budget.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        n += 1;
        reset_manifests(ctx.root)?;
        crate::info!(
            "running kubeadm join as {} via {} (attempt {n}/{}, {} s of the budget left)",
            t.role.as_str(),
            t.api_server_endpoint,
            ctx.a.join_attempts,
            left.as_secs()
        );
        last = match kubeadm::run(&argv, left.min(Duration::from_secs(ctx.a.kubeadm_timeout))) {
            Ok(r) if r.ok => {
                crate::info!("kubeadm join succeeded");
                return Ok(());
            }
            Ok(r) => format!("{}: {}", r.status, kubeadm::last_lines(&r.tail, 3)),
            Err(e) => e.to_string(),
        };
        crate::warn!(
            "kubeadm join attempt {n}/{} failed: {last}",
            ctx.a.join_attempts
        );
    }
    Err(Error::failed(format!(
        "kubeadm join failed {n} times within {} s: {last}",
        budget.as_secs()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_round_asks_a_due_slot_first_and_pauses_until_the_next_slot() {
        let now = Instant::now();
        let mut r = Rounds::new(3, S(10));
        assert_eq!(r.order(now), vec![0, 1, 2]);
        assert_eq!(r.spread(0.0), S(5));
        assert_eq!(r.pause(now, S(7), 0.5), S(7));
        // Service 0 asks to be left alone for 30 s; service 2 gives a slot in 20 s.
        assert!(!r.refused(0, After::Delay(S(30)), now).appointment);
        assert!(r.refused(2, After::Date(S(20)), now).appointment);
        assert!(!r.may_ask(0, now + S(29)) && r.may_ask(0, now + S(30)));
        assert!(r.may_ask(1, now));
        // Until the slot: its wait and under a second of jitter, whatever the round's pause.
        assert_eq!(r.pause(now, S(7), 0.5), S(20) + Duration::from_millis(500));
        // At the slot, its service is asked first.
        assert_eq!(r.order(now + S(20)), vec![2, 0, 1]);
        // A Retry-After beyond an hour is held to an hour.
        assert!(!r.refused(1, After::Delay(S(86_400)), now).appointment);
        assert!(!r.may_ask(1, now + S(3599)) && r.may_ask(1, now + S(3600)));
    }
}
