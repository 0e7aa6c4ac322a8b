//! A boot check's part of the record: the chosen set it judges, each check, the verdict, the
//! return to the known-good set, and the verdict as events.

use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::SystemTime;

use super::{rfc3339, Phase};
use crate::node::events::emit;

/// One extension of the chosen set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Chosen {
    /// The extension's name (`kubernetes`, `containerd`).
    pub(crate) name: String,
    /// Its version as the image's file name spells it (`v1.32.4`, `1.7.24`).
    pub(crate) version: String,
    /// The image, a node path under the root (`/opt/extensions/NAME/FILE`).
    pub(crate) image: String,
    /// `sha256-<hex>`, as the signed list named it.
    pub(crate) digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Outcome {
    /// Every check passed: the set is the node's known-good set.
    Verified,
    /// Something else runs than the record says.
    Mismatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ApiCheck {
    /// The Node's nodeInfo says the same as the node.
    Confirmed,
    /// The API server could not be asked (no kubeconfig yet, no answer within the bound):
    /// never a pass, never a failure.
    Unreached,
    /// The Node reports another kubelet or runtime version.
    Mismatch,
    /// `--api-wait 0`.
    Skipped,
}

/// One comparison: what the record expects, what runs, and whether they agree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Check {
    pub(crate) what: String,
    pub(crate) expected: String,
    pub(crate) running: String,
    pub(crate) ok: bool,
}

impl Check {
    /// `expected` against `running`, logged as the check's line (an error when they differ).
    pub(crate) fn compare(
        what: String,
        expected: impl Into<String>,
        running: impl Into<String>,
    ) -> Check {
        let (expected, running) = (expected.into(), running.into());
        let ok = expected == running;
        Check::judged(what, expected, running, ok)
    }

    /// A comparison whose verdict the caller made (a version named inside a longer line).
    pub(crate) fn judged(what: String, expected: String, running: String, ok: bool) -> Check {
        // What a probe prints is bounded before it goes into the record.
        let (expected, running) = (bounded(expected), bounded(running));
        let line = format!("check {what}: expected {expected}, found {running}");
        if ok {
            crate::info!("{line}");
        } else {
            crate::error!("{line}");
        }
        let c = Check {
            what,
            expected,
            running,
            ok,
        };
        // As it is made, not at the verdict: a receiver hears the check go on.
        emit("check", json!(c));
        c
    }
}

/// A boot check's verdict as events (the `verified` phase on a match; the verification; the
/// end; each check went as it was made), then what became of them: the record is amended
/// after the last.
pub(crate) fn verdict_events(
    v: &Verification,
    exit_code: i32,
) -> Option<crate::node::events::Delivery> {
    if !crate::node::events::is_open() {
        return None;
    }
    if v.outcome == Outcome::Verified {
        emit("phase", json!({ "phase": Phase::Verified }));
    }
    emit("verification", json!(v));
    emit(
        "finished",
        json!({ "exit_code": exit_code, "duration_s": v.duration_s }),
    );
    crate::node::events::close()
}

/// At most 200 characters of `s`.
fn bounded(s: String) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Verification {
    /// RFC 3339, UTC.
    pub(crate) at: String,
    /// The boot it checked (/proc/sys/kernel/random/boot_id).
    pub(crate) boot_id: String,
    pub(crate) duration_s: f64,
    /// The checks on the node itself: the check's cost without the wait for the API server.
    #[serde(default)]
    pub(crate) local_s: Option<f64>,
    pub(crate) outcome: Outcome,
    pub(crate) checks: Vec<Check>,
    pub(crate) api: ApiCheck,
    /// Why the API server was not asked or did not answer.
    pub(crate) api_note: Option<String>,
    /// After a mismatch: the known-good set put back (this boot, once), and how that went.
    pub(crate) returned: Option<Returned>,
    /// What became of the check's own events (`--events-url`).
    #[serde(default)]
    pub(crate) events: Option<crate::node::events::Delivery>,
    /// Which merge made /usr at this boot (sysext): `initramfs`, `real-root`, or unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) merged_by: Option<String>,
    /// What the check told the cluster on the Node (condition, labels, events), or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reported: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Returned {
    pub(crate) to: Vec<Chosen>,
    pub(crate) boot_id: String,
    /// `merged` (the known-good set runs again), or the error that stopped the return.
    pub(crate) result: String,
}

impl Verification {
    /// The first check that failed, as `what: expected X, found Y` (empty when none did).
    pub(crate) fn first_mismatch(&self) -> String {
        self.checks
            .iter()
            .find(|c| !c.ok)
            .map(|c| format!("{}: expected {}, found {}", c.what, c.expected, c.running))
            .unwrap_or_default()
    }

    /// A boot check's verdict, taken now on boot `boot_id`: `verified` when `ok`. Its own time
    /// is set by `timed` at the end.
    pub(crate) fn taken(
        boot_id: &str,
        checks: Vec<Check>,
        ok: bool,
        api: ApiCheck,
        api_note: Option<String>,
        returned: Option<Returned>,
    ) -> Verification {
        Verification {
            at: rfc3339(SystemTime::now()),
            boot_id: boot_id.to_string(),
            duration_s: 0.0,
            local_s: None,
            outcome: if ok {
                Outcome::Verified
            } else {
                Outcome::Mismatch
            },
            checks,
            api,
            api_note,
            returned,
            events: None,
            merged_by: None,
            reported: None,
        }
    }

    /// The check's own time, from `since`, to the millisecond.
    pub(crate) fn timed(&mut self, since: std::time::Instant) {
        self.duration_s = millis(since.elapsed());
    }
}

/// Seconds, to the millisecond, as the record writes durations.
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}
