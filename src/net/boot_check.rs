//! What both boot checks (`nodestrap verify` on a sysext node and on a torcx node) do alike:
//! their opening, the Node's word through the API server next to the node's own checks, and the
//! verdict into the last bootstrap's record before the Node is told (docs/verify.md).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::nodeinfo::{self, Answer, Want};
use crate::node::root::Root;
use crate::node::status::{self, ApiCheck, Check, Phase, Record, Returned, Verification};

/// What a boot check opens with: when it started, the Node's name (empty when the API server is
/// not asked at all), the root, and how to reach the API server.
pub(crate) struct Opening {
    pub(crate) since: Instant,
    pub(crate) node: String,
    pub(crate) root: Root,
    pub(crate) kubeconfig: String,
    /// `--api-wait`, in seconds: 0 never asks.
    pub(crate) api_wait: u64,
}

impl Opening {
    pub(crate) fn new(kubeconfig: &str, api_wait: u64, node_name: Option<&str>) -> Result<Opening> {
        let since = Instant::now();
        // A name that cannot be a Node's is the operator's error: exit 2 before anything.
        let node = if api_wait > 0 || node_name.is_some() {
            nodeinfo::node_name(node_name)?
        } else {
            String::new()
        };
        let root = Root::open(Path::new("/"))?;
        Ok(Opening {
            since,
            node,
            root,
            kubeconfig: kubeconfig.to_string(),
            api_wait,
        })
    }

    /// The record of the last bootstrap, which the check judges; what killed runs left in
    /// nodestrap's temp folders is swept first.
    pub(crate) fn last_bootstrap(&self) -> Result<(Record, String)> {
        crate::node::temps::sweep(&self.root);
        status::last_bootstrap()
    }

    /// The verdict of `checks` (the node's own, just made) and of the Node's word, asked only
    /// when they all passed and `--api-wait` is not 0: a pass unless a check failed or the Node
    /// contradicts them (an API server that cannot be reached is never a failure).
    pub(crate) fn verdict(
        &self,
        boot_id: &str,
        mut checks: Vec<Check>,
        want: &Want,
        carried: Option<Returned>,
    ) -> Verification {
        let local_ok = checks.iter().all(|c| c.ok);
        let local_s = self.since.elapsed();
        let answer = if !local_ok {
            not_asked("not asked: the node itself does not run the chosen set")
        } else if self.api_wait == 0 {
            not_asked("--api-wait 0")
        } else {
            nodeinfo::ask(
                &self.root,
                &self.kubeconfig,
                Duration::from_secs(self.api_wait),
                &self.node,
                want,
            )
        };
        checks.extend(answer.checks);
        let ok = local_ok && answer.api != ApiCheck::Mismatch;
        let mut v = Verification::taken(boot_id, checks, ok, answer.api, answer.note, carried);
        v.local_s = Some(status::millis(local_s));
        v
    }

    /// The verdict into the record, as `after`: its time, its events, and the phase, `verified`
    /// on a pass, else back to `done` (the chosen set no longer holds); where it is kept.
    pub(crate) fn record(
        &self,
        record: &Record,
        after: &mut Record,
        mut verification: Verification,
    ) -> Result<String> {
        let ok = verification.outcome == status::Outcome::Verified;
        verification.timed(self.since);
        after.phase = if ok { Phase::Verified } else { Phase::Done };
        verification.events = status::verdict_events(&verification, if ok { 0 } else { 1 });
        after.verification = Some(verification);
        status::amend(&self.root, record, after)
    }

    /// What the Node was `told`, into the record `after` holds already: the Node is told once the
    /// verdict is recorded, so a kill while the cluster is slow never leaves a verdict (or a
    /// return) that the record does not hold.
    pub(crate) fn record_told(&self, record: &Record, after: &Record, told: String) {
        let mut told_after = after.clone();
        if let Some(v) = told_after.verification.as_mut() {
            v.reported = Some(told);
        }
        if let Err(e) = status::amend(&self.root, record, &told_after) {
            crate::warn!("what the Node was told is not recorded: {e}");
        }
    }
}

fn not_asked(why: &str) -> Answer {
    Answer {
        api: ApiCheck::Skipped,
        note: Some(why.to_string()),
        checks: Vec::new(),
    }
}

/// The return an earlier check of `record` made (`result`: the one that holds), which stands
/// until a bootstrap chooses again.
pub(crate) fn carried(record: &Record, result: &str) -> Option<Returned> {
    record
        .verification
        .as_ref()
        .and_then(|p| p.returned.clone())
        .filter(|r| r.result == result)
}

/// A mismatch's error: the first failed check, what became of the return (`back`), and where
/// the verdict is recorded.
pub(crate) fn mismatch(from: &str, first: &str, back: &str, at: &str) -> Error {
    Error::failed(format!(
        "the node does not run what {from} chose: {first}; {back} (recorded in {at})"
    ))
}
