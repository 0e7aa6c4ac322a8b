//! The cluster ledger (`--ledger cluster`): one ConfigMap per node identity, shared by every
//! join-service instance.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::file::parse_record;
use super::{now, stamp, Asking, Claim, Held, Keep};
use crate::activation::nodelock::Role;
use crate::error::{Error, Result};
use crate::net::fetch::FetchError;
use crate::net::kube::{Kube, Reply};
use crate::net::kubeconfig;
use crate::node::root::Root;

/// The label every ticket record carries, so that `kubectl get -l` finds them all.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "nodestrap-join-service");
/// The object the start-up checks ask about (never a ticket record: not `ticket-<hex>`).
const PROBE: &str = "ticket-permission-check";
/// After the API server failed a ledger call, nodes are told "try later" at once for this
/// long, without asking it again: a node queued behind others must not wait out a timeout
/// for each of them while the API server is down.
const HOLD_OFF: Duration = Duration::from_secs(3);
/// A claim is in flight this long beyond --token-timeout: the answer's own deadline (10 s),
/// two ledger calls and a margin for the clocks of two control-plane nodes.
pub(crate) const LEASE_MARGIN: u64 = 30;

/// Where a ticket record stands.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum State {
    /// Claimed by `instance` at `claimed-at`; its ticket is being made or sent.
    Issuing,
    /// The ticket was written to the node, which has not yet said it keeps it: the same
    /// identity may ask again until `issued-at` + --retry-window (a node killed before its node
    /// lock was durable lost it).
    Issued,
    /// The node said it keeps its ticket (its node lock is durable): refused for good.
    Kept,
    /// The issuing instance failed to make or send it (`reason`): the same identity may ask
    /// again until `failed-at` + --retry-window.
    Failed,
}

/// A ticket record: the ConfigMap's `data` (every value a string, as ConfigMaps hold them).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct Entry {
    /// `sha256:<hex>` of the node's public key.
    pub(crate) identity: String,
    /// The node certificate's common name.
    node: String,
    role: Role,
    state: State,
    /// The join-service instance that holds (or held) the claim.
    instance: String,
    /// RFC 3339 times.
    claimed_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    issued_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kept_at: Option<String>,
    /// The session of the run that asked for this claim's ticket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Claims of this identity so far ("1" at first; a retry after a failure adds one).
    attempt: String,
    /// The file record it came from, when it was carried into the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    carried_from: Option<String>,
}

impl Entry {
    pub(super) fn attempt(&self) -> u32 {
        self.attempt.parse().unwrap_or(1)
    }
}

/// What a record already there means for a node that asks now.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Refuse(&'static str, String),
    /// A failed issuance within its window: claim it again.
    Retry,
}

/// The rule, on the record's own times: kept or in flight is refused; a failure (or a claim
/// whose lease ran out: its instance died), or a ticket the node never said it kept, may be
/// claimed again until the window closes.
/// `mine`: the claim is this instance's own, made by a call that failed (the API server
/// acted on a request whose answer never came back) or before a restart: an instance issues
/// one ticket at a time, so it is in flight nowhere and failed when it was made.
pub(crate) fn judge(
    e: &Entry,
    asking: &Asking,
    now: u64,
    lease: u64,
    window: u64,
    mine: bool,
) -> Verdict {
    let at = |s: &Option<String>| {
        s.as_deref()
            .and_then(kubeconfig::rfc3339)
            .map(|t| t.max(0) as u64)
    };
    let claimed = at(&Some(e.claimed_at.clone())).unwrap_or(0);
    let refused = |t: u64, how: &str| {
        Verdict::Refuse(
            "already_issued",
            format!(
                "this node identity already got a ticket (as {:?}, from {} at {}{how}); refused",
                e.node,
                e.instance,
                stamp(t)
            ),
        )
    };
    let failed_at = match e.state {
        State::Kept => return refused(at(&e.issued_at).unwrap_or(claimed), ", kept"),
        State::Issued => {
            let t = at(&e.issued_at).unwrap_or(claimed);
            let again = asking.another_run_than(e.session.as_deref());
            return match again && now < t.saturating_add(window) {
                true => Verdict::Retry,
                false => refused(t, ""),
            };
        }
        State::Issuing if mine => claimed,
        State::Issuing if now < claimed.saturating_add(lease) => {
            return Verdict::Refuse(
                "already_issued",
                format!(
                    "a ticket for this node identity is being issued (by {} since {}); refused",
                    e.instance, e.claimed_at
                ),
            )
        }
        // Its instance stopped before it said how it went: failed when the lease ran out.
        State::Issuing => claimed.saturating_add(lease),
        State::Failed => at(&e.failed_at).unwrap_or(claimed),
    };
    if now < failed_at.saturating_add(window) {
        return Verdict::Retry;
    }
    Verdict::Refuse(
        "retry_window_closed",
        format!(
            "the ticket for this node identity failed at {} ({}) and the {window} s to ask \
             again have passed; refused (an administrator deletes its record to allow one more)",
            stamp(failed_at),
            e.reason.as_deref().unwrap_or("its join service stopped")
        ),
    )
}

pub(crate) struct ClusterLedger {
    kube: Kube,
    ns: String,
    instance: String,
    lease: u64,
    window: u64,
    /// Records to write when the API server is back: (name, record, its resourceVersion).
    pending: Vec<(String, Entry, String)>,
    /// When a ledger call last failed for want of an answer, and why.
    down: Option<(std::time::Instant, String)>,
}

/// The ConfigMap that records `identity` (`sha256:<64 hex>` → `ticket-<64 hex>`).
fn object_name(identity: &str) -> String {
    format!(
        "ticket-{}",
        identity.strip_prefix("sha256:").unwrap_or(identity)
    )
}

impl ClusterLedger {
    /// The ledger in namespace `ns`, checked before anything is served: the namespace exists
    /// and this instance may create, get and update ConfigMaps in it (dry-run calls of each:
    /// the API server authorizes them as the real ones). `startup` may wait for an API server
    /// that is starting; `kube` (short deadlines) serves the nodes.
    pub(crate) fn open(
        startup: &Kube,
        kube: Kube,
        ns: &str,
        instance: &str,
        lease: u64,
        window: u64,
    ) -> Result<ClusterLedger> {
        if !crate::net::names::dns_label(ns) {
            return Err(Error::config(format!(
                "--ledger-namespace {ns:?}: not a namespace name (RFC 1123 label)"
            )));
        }
        let base = format!("/api/v1/namespaces/{ns}/configmaps");
        let probe = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PROBE, "namespace": ns},
        });
        let denied = |verb: &str, e: Error| {
            Error::config(format!(
                "{}: may not {verb} ConfigMaps in namespace {ns} ({e}); the Role of \
                 deploy/join-service.yaml grants get, create and update there",
                startup.source
            ))
        };
        let failed = |verb: &str, e: FetchError| {
            Error::failed(format!(
                "checking that this instance may {verb} ticket records: {e}"
            ))
        };
        match startup
            .call(
                "POST",
                &format!("{base}?dryRun=All"),
                Some(&probe),
                &[403, 404, 409],
            )
            .map_err(|e| failed("create", e))?
        {
            Reply::Ok(_) | Reply::Status(409, _) => {}
            Reply::Status(403, e) => return Err(denied("create", e)),
            Reply::Status(_, e) => {
                return Err(Error::config(format!(
                    "namespace {ns} of the ticket records does not exist ({e}); \
                     deploy/join-service.yaml creates it"
                )))
            }
        }
        for (verb, method, body) in [("get", "GET", None), ("update", "PUT", Some(&probe))] {
            let path = match method {
                "PUT" => format!("{base}/{PROBE}?dryRun=All"),
                _ => format!("{base}/{PROBE}"),
            };
            match startup
                .call(method, &path, body, &[403, 404, 409])
                .map_err(|e| failed(verb, e))?
            {
                Reply::Status(403, e) => return Err(denied(verb, e)),
                // 404: allowed, nothing there (authorization comes first).
                Reply::Ok(_) | Reply::Status(_, _) => {}
            }
        }
        crate::info!(
            "ticket records: ConfigMaps in namespace {ns}, which this instance ({instance}) may \
             create, get and update ({})",
            startup.source
        );
        Ok(ClusterLedger {
            kube,
            ns: ns.to_string(),
            instance: instance.to_string(),
            lease,
            window,
            pending: Vec::new(),
            down: None,
        })
    }

    /// Where the records are, for the log.
    pub(super) fn describe(&self) -> String {
        format!(
            "ConfigMaps ticket-<identity> in namespace {} ({})",
            self.ns, self.kube.source
        )
    }

    fn path(&self, name: Option<&str>) -> String {
        match name {
            Some(n) => format!("/api/v1/namespaces/{}/configmaps/{n}", self.ns),
            None => format!("/api/v1/namespaces/{}/configmaps", self.ns),
        }
    }

    fn object(&self, name: &str, e: &Entry, rv: Option<&str>) -> serde_json::Value {
        let mut meta = serde_json::json!({
            "name": name,
            "namespace": self.ns,
            "labels": {MANAGED_BY.0: MANAGED_BY.1, "nodestrap.io/role": e.role.as_str()},
        });
        if let Some(rv) = rv {
            meta["resourceVersion"] = rv.into();
        }
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": e})
    }

    /// `(record, resourceVersion)` of a ConfigMap as the API server returned it.
    pub(crate) fn read(
        cm: &serde_json::Value,
        name: &str,
    ) -> std::result::Result<(Entry, String), String> {
        let rv = cm["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        serde_json::from_value::<Entry>(cm["data"].clone())
            .map(|e| (e, rv))
            .map_err(|e| format!("ConfigMap {name}: not a ticket record: {e}"))
    }

    fn create(&self, name: &str, e: &Entry) -> std::result::Result<Option<String>, String> {
        match self.kube.call(
            "POST",
            &self.path(None),
            Some(&self.object(name, e, None)),
            &[409],
        ) {
            Ok(Reply::Ok(cm)) => Self::read(&cm, name).map(|(_, rv)| Some(rv)),
            Ok(Reply::Status(_, _)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Replace the record if it is still at `rv`: `Ok(Some(new rv))`, `Ok(None)` when another
    /// instance changed it first (or it is gone).
    fn replace(
        &self,
        name: &str,
        e: &Entry,
        rv: &str,
    ) -> std::result::Result<Option<String>, String> {
        match self.kube.call(
            "PUT",
            &self.path(Some(name)),
            Some(&self.object(name, e, Some(rv))),
            &[404, 409],
        ) {
            Ok(Reply::Ok(cm)) => Self::read(&cm, name).map(|(_, rv)| Some(rv)),
            Ok(Reply::Status(_, _)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub(super) fn claim(&mut self, asking: &Asking) -> Claim {
        if let Some((at, why)) = self.down.as_ref().filter(|_| self.held_off()) {
            return Claim::Unavailable(format!(
                "the ticket ledger did not answer {:.1} s ago ({why})",
                at.elapsed().as_secs_f64()
            ));
        }
        let c = self.claim_now(asking);
        self.down = match &c {
            Claim::Unavailable(m) => Some((std::time::Instant::now(), m.clone())),
            _ => None,
        };
        c
    }

    fn claim_now(&mut self, asking: &Asking) -> Claim {
        let (identity, name) = (asking.identity, object_name(asking.identity));
        let t = now();
        let mut entry = Entry {
            identity: identity.to_string(),
            node: asking.node.to_string(),
            role: asking.role,
            state: State::Issuing,
            instance: self.instance.clone(),
            claimed_at: stamp(t),
            issued_at: None,
            kept_at: None,
            session: asking.session.map(str::to_string),
            failed_at: None,
            reason: None,
            attempt: "1".into(),
            carried_from: None,
        };
        let unavailable = |e: String| Claim::Unavailable(format!("the ticket ledger: {e}"));
        match self.create(&name, &entry) {
            Ok(Some(rv)) => return self.granted(entry, rv),
            Ok(None) => {}
            Err(e) => return unavailable(e),
        }
        // It exists: what does it say?
        let (old, rv) = match self.kube.call("GET", &self.path(Some(&name)), None, &[404]) {
            Ok(Reply::Ok(cm)) => match Self::read(&cm, &name) {
                Ok(x) => x,
                // Fail closed: a record nobody can read never hands out a second ticket.
                Err(e) => return Claim::Refused("already_issued", format!("{e}; refused")),
            },
            Ok(Reply::Status(_, _)) => {
                return unavailable(format!("{name} was deleted while being read; ask again"))
            }
            Err(e) => return unavailable(e.to_string()),
        };
        // Our own claim, unless a record of it waits to be written.
        let mine =
            old.instance == self.instance && !self.pending.iter().any(|(n, _, _)| *n == name);
        match judge(&old, asking, t, self.lease, self.window, mine) {
            Verdict::Refuse(code, m) => Claim::Refused(code, m),
            Verdict::Retry => {
                entry.attempt = (old.attempt() + 1).to_string();
                match self.replace(&name, &entry, &rv) {
                    Ok(Some(rv)) => {
                        let after = match old.state {
                            State::Issued => " after a ticket it never said it kept".to_string(),
                            _ => format!(
                                " after a failed issuance{}",
                                old.reason
                                    .as_deref()
                                    .map(|r| format!(" ({r})"))
                                    .unwrap_or_default()
                            ),
                        };
                        crate::info!(
                            "{name}: {} ({identity}) asks again{after}; claimed again (attempt {})",
                            old.node,
                            entry.attempt
                        );
                        self.granted(entry, rv)
                    }
                    // Another instance claimed it between our read and our write.
                    Ok(None) => Claim::Refused(
                        "already_issued",
                        "a ticket for this node identity is being issued by another instance; \
                         refused"
                            .into(),
                    ),
                    Err(e) => unavailable(e),
                }
            }
        }
    }

    fn granted(&self, entry: Entry, rv: String) -> Claim {
        Claim::Granted(Held {
            identity: entry.identity.clone(),
            node: entry.node.clone(),
            role: entry.role,
            session: entry.session.clone(),
            record: Some(Box::new((entry, rv))),
        })
    }

    pub(super) fn settle(&mut self, held: Held, outcome: std::result::Result<(), String>) {
        let Some((mut e, rv)) = held.record.map(|b| *b) else {
            return;
        };
        let t = stamp(now());
        match outcome {
            Ok(()) => {
                e.state = State::Issued;
                e.issued_at = Some(t);
            }
            Err(reason) => {
                e.state = State::Failed;
                e.failed_at = Some(t);
                e.reason = Some(reason);
            }
        }
        let name = object_name(&e.identity);
        self.write(name, e, rv);
    }

    /// The node says it keeps the ticket it got: its record (in any state: the node's word is
    /// the proof the ticket reached it) becomes `kept`, and the identity is refused for good.
    pub(super) fn keep(&mut self, identity: &str) -> Keep {
        let name = object_name(identity);
        // An update that lost a race with another instance reads the record again.
        for _ in 0..3 {
            let (mut e, rv) = match self.kube.call("GET", &self.path(Some(&name)), None, &[404]) {
                Ok(Reply::Ok(cm)) => match Self::read(&cm, &name) {
                    Ok(x) => x,
                    Err(m) => return Keep::Refused("not_issued", m),
                },
                Ok(Reply::Status(_, _)) => {
                    return Keep::Refused(
                        "not_issued",
                        format!("{name}: no ticket record for this node identity"),
                    )
                }
                Err(e) => return Keep::Unavailable(format!("the ticket ledger: {e}")),
            };
            if e.state == State::Kept {
                return Keep::Kept;
            }
            e.state = State::Kept;
            e.kept_at = Some(stamp(now()));
            match self.replace(&name, &e, &rv) {
                Ok(Some(_)) => return Keep::Kept,
                Ok(None) => continue,
                Err(m) => return Keep::Unavailable(format!("the ticket ledger: {m}")),
            }
        }
        Keep::Unavailable(format!("{name} kept changing while being updated"))
    }

    /// Whether the API server failed a ledger call less than `HOLD_OFF` ago.
    fn held_off(&self) -> bool {
        self.down
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < HOLD_OFF)
    }

    /// Write a settled record, or keep it for `flush` (at once while the API server is held
    /// off).
    fn write(&mut self, name: String, e: Entry, rv: String) {
        if self.held_off() {
            self.pending.push((name, e, rv));
            return;
        }
        match self.replace(&name, &e, &rv) {
            Ok(Some(_)) => {}
            Ok(None) => match self.current(&name) {
                // An earlier attempt whose answer never came landed: it is written.
                Some(now) if now == e => crate::info!(
                    "{name}: the {:?} record was written by an earlier attempt",
                    e.state
                ),
                // The node got its ticket and said so before this instance recorded it.
                Some(now) if now.state == State::Kept && now.attempt == e.attempt => {
                    crate::info!("{name}: the node said it kept its ticket first")
                }
                // A failure that landed late, and the node has been claimed again since (or
                // this claim's lease ran out first): no ticket of this claim left, nothing lost.
                _ if e.state == State::Failed => crate::info!(
                    "{name}: claimed again since this instance's failed attempt {}; nothing to \
                     record",
                    e.attempt
                ),
                _ => crate::error!(
                    "{name}: the record was changed by another instance while this one held the \
                     claim (its lease of {} s ran out); the ticket this instance wrote is not \
                     recorded as issued",
                    self.lease
                ),
            },
            Err(err) => {
                crate::warn!(
                    "{name}: recording {:?} failed ({err}); kept to write when the API server \
                     answers",
                    e.state
                );
                self.down = Some((std::time::Instant::now(), err));
                self.pending.push((name, e, rv));
            }
        }
    }

    /// The record `name` as it is now, if it reads.
    fn current(&self, name: &str) -> Option<Entry> {
        match self.kube.call("GET", &self.path(Some(name)), None, &[404]) {
            Ok(Reply::Ok(cm)) => Self::read(&cm, name).ok().map(|(e, _)| e),
            _ => None,
        }
    }

    pub(super) fn flush(&mut self) {
        if self.held_off() {
            return;
        }
        for (name, e, rv) in std::mem::take(&mut self.pending) {
            if !self.held_off() {
                crate::info!("{name}: writing the {:?} record kept before", e.state);
            }
            self.write(name, e, rv);
        }
    }

    /// An existing file record (`--state`) carried into the cluster: each identity in it gets
    /// an `issued` record (one already there says issued too, or is made to), then the file is
    /// renamed `<file>.carried` so that this happens once.
    pub(crate) fn carry(&self, root: &Root, path: &str) -> Result<()> {
        let Some(text) = root.read_text(path)? else {
            return Ok(());
        };
        let from = root.show(path);
        let issued = parse_record(&text, &from)?;
        let fail = |m: String| Error::failed(format!("carrying {from} into the cluster: {m}"));
        for (identity, r) in &issued {
            let name = object_name(identity);
            let e = Entry {
                identity: identity.clone(),
                node: r.node.clone(),
                role: r.role,
                state: State::Kept,
                instance: self.instance.clone(),
                claimed_at: stamp(r.at),
                issued_at: Some(stamp(r.at)),
                kept_at: None,
                session: None,
                failed_at: None,
                reason: None,
                attempt: "1".into(),
                carried_from: Some(from.clone()),
            };
            if self.create(&name, &e).map_err(&fail)?.is_some() {
                continue;
            }
            let got = self
                .kube
                .call("GET", &self.path(Some(&name)), None, &[])
                .map_err(|e| fail(e.to_string()))?;
            let Reply::Ok(cm) = got else { continue };
            let (old, rv) = Self::read(&cm, &name).map_err(&fail)?;
            if old.state != State::Kept && self.replace(&name, &e, &rv).map_err(&fail)?.is_none() {
                return Err(fail(format!(
                    "{name} changed while being carried; start again"
                )));
            }
        }
        let carried = format!("{path}.carried");
        let (dir, file) = root.parent_of(path)?;
        let (_, to) = root.parent_of(&carried)?;
        dir.rename(&file, &to)?;
        dir.fsync()?;
        crate::info!(
            "{} identities of the file record {from} carried into namespace {}; the file is now {}",
            issued.len(),
            self.ns,
            root.show(&carried)
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(state: State, claimed: u64, failed: Option<u64>) -> Entry {
        Entry {
            identity: "sha256:ab".into(),
            node: "n1".into(),
            role: Role::Worker,
            state,
            instance: "cp-1".into(),
            claimed_at: stamp(claimed),
            issued_at: matches!(state, State::Issued | State::Kept).then(|| stamp(claimed + 1)),
            kept_at: (state == State::Kept).then(|| stamp(claimed + 2)),
            session: Some("a".repeat(32)),
            failed_at: failed.map(stamp),
            reason: failed.map(|_| "--token-command exit status: 1".into()),
            attempt: "1".into(),
            carried_from: None,
        }
    }

    #[test]
    fn kept_and_in_flight_are_refused_failures_and_lost_tickets_retried_within_the_window() {
        let t0 = 1_790_000_000;
        let asking = |session| Asking {
            identity: "sha256:ab",
            node: "n1",
            role: Role::Worker,
            session,
        };
        // Another run than the one the records' tickets went to.
        let b = "b".repeat(32);
        let other = asking(Some(&b));
        let (lease, window) = (90, 900);
        let code = |v: Verdict| match v {
            Verdict::Refuse(c, _) => c,
            Verdict::Retry => "retry",
        };
        // Kept: refused, however long ago.
        for now in [t0, t0 + 10, t0 + 100_000] {
            let e = entry(State::Kept, t0, None);
            assert_eq!(
                code(judge(&e, &other, now, lease, window, false)),
                "already_issued"
            );
        }
        // Issued and never said kept (a node killed before its lock): asked again within the
        // window from the issuance, refused after it.
        let e = entry(State::Issued, t0, None);
        assert_eq!(
            code(judge(&e, &other, t0 + 2, lease, window, false)),
            "retry"
        );
        // ... but never to the run it went to, nor to one that does not say which it is:
        // asks of one run (at several instances at once) get one ticket.
        let a = "a".repeat(32);
        for same in [asking(Some(&a)), asking(None)] {
            assert_eq!(
                code(judge(&e, &same, t0 + 2, lease, window, false)),
                "already_issued"
            );
        }
        assert_eq!(
            code(judge(&e, &other, t0 + 900, lease, window, false)),
            "retry"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 901, lease, window, false)),
            "already_issued"
        );
        // In flight at another instance: refused until its lease runs out; then it counts as
        // failed then, and may be retried for the window after that.
        let e = entry(State::Issuing, t0, None);
        assert_eq!(
            code(judge(&e, &other, t0 + 89, lease, window, false)),
            "already_issued"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 90, lease, window, false)),
            "retry"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 90 + 899, lease, window, false)),
            "retry"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 90 + 900, lease, window, false)),
            "retry_window_closed"
        );
        // This instance's own claim, which it no longer holds: failed when it was made.
        assert_eq!(
            code(judge(&e, &other, t0 + 1, lease, window, true)),
            "retry"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 900, lease, window, true)),
            "retry_window_closed"
        );
        // Failed: retried from the failure on, for the window.
        let e = entry(State::Failed, t0, Some(t0 + 5));
        assert_eq!(
            code(judge(&e, &other, t0 + 6, lease, window, false)),
            "retry"
        );
        assert_eq!(
            code(judge(&e, &other, t0 + 904, lease, window, false)),
            "retry"
        );
        match judge(&e, &other, t0 + 905, lease, window, false) {
            Verdict::Refuse("retry_window_closed", m) => assert!(
                m.contains("--token-command exit status: 1") && m.contains("deletes its record"),
                "{m}"
            ),
            v => panic!("{v:?}"),
        }
        // A time that does not parse is the epoch: its window closed long ago (fail closed).
        let mut e = entry(State::Failed, t0, Some(t0));
        e.failed_at = Some("yesterday".into());
        e.claimed_at = "yesterday".into();
        assert_eq!(
            code(judge(&e, &other, t0, lease, window, false)),
            "retry_window_closed"
        );
    }

    #[test]
    fn records_are_configmap_data_and_read_strictly() {
        let e = entry(State::Failed, 1_790_000_000, Some(1_790_000_005));
        let v = serde_json::to_value(&e).unwrap();
        // ConfigMap data: a map of strings only.
        for (k, x) in v.as_object().unwrap() {
            assert!(x.is_string(), "{k}: {x}");
        }
        assert_eq!(v["state"], "failed");
        assert_eq!(v["claimed-at"], "2026-09-21T14:13:20Z");
        let cm = serde_json::json!({"metadata": {"resourceVersion": "42"}, "data": v});
        assert_eq!(ClusterLedger::read(&cm, "x").unwrap(), (e, "42".into()));
        let mut bad = cm.clone();
        bad["data"]["state"] = "maybe".into();
        assert!(ClusterLedger::read(&bad, "ticket-ab")
            .unwrap_err()
            .starts_with("ConfigMap ticket-ab: not a ticket record: unknown variant `maybe`"));
        assert_eq!(
            object_name("sha256:0123abcd"),
            "ticket-0123abcd".to_string()
        );
    }
}
