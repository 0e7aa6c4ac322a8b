//! What a boot check tells the cluster about its own node, with the node's own credentials (the
//! kubelet's kubeconfig): a condition on its Node (`NodestrapVerified`, through the status
//! subresource), labels naming what it runs, and events, deduplicated as the kubelet's are. All
//! of it is what the Node authorizer's rules allow a node (`nodes/status` and `nodes` patch,
//! `events` create and patch) and what NodeRestriction lets it label (no `kubernetes.io` or
//! `k8s.io` prefix). Best effort: a call that fails is named in the outcome, never an error of
//! the check, and the whole report is bounded in time (`DEADLINE`).

use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError};
use crate::net::kube::{Kube, Reply};
use crate::net::retry::Retry;
use crate::node::root::Root;

pub(crate) const CONDITION: &str = "NodestrapVerified";
pub(crate) const LABEL_KUBERNETES: &str = "nodestrap.io/kubernetes";
pub(crate) const LABEL_RUNTIME: &str = "nodestrap.io/runtime";
pub(crate) const LABEL_TRUST: &str = "nodestrap.io/trust";
/// The whole report, every call included: a boot check never waits longer for the cluster.
const DEADLINE: Duration = Duration::from_secs(20);
/// Events one report sends at most.
pub(crate) const MAX_EVENTS: usize = 8;
/// The namespace a Node's events live in (the kubelet's).
const EVENTS_NS: &str = "default";

/// The condition's status: verified, not, or being checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    True,
    False,
    Unknown,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::True => "True",
            Verdict::False => "False",
            Verdict::Unknown => "Unknown",
        }
    }
}

/// One event on the Node: `Normal` or `Warning`, a CamelCase reason, a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) warning: bool,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// What a boot check reports.
pub(crate) struct Report {
    pub(crate) verdict: Verdict,
    /// CamelCase, as conditions' reasons are (`Verified`, `Mismatch`, `ReturnedToKnownGood`).
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// Label key and value (already a valid label value: `label_value`).
    pub(crate) labels: Vec<(&'static str, String)>,
    pub(crate) events: Vec<Event>,
}

/// A label value from free text: at most 63 characters of `[A-Za-z0-9._-]`, beginning and
/// ending with an alphanumeric (`containerd://1.7.24` becomes `containerd-1.7.24`).
pub(crate) fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut v = mapped.replace("---", "-");
    v.truncate(63);
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Sends `report` for Node `node` through the kubeconfig at `kubeconfig` (a node path); what
/// was done or why not, one line for the status record and the log.
pub(crate) fn send(root: &Root, kubeconfig: &str, node: &str, report: &Report) -> String {
    let until = Instant::now() + DEADLINE;
    // Every call, and an attempt in flight, ends at the report's deadline.
    let retry = Retry::exponential(2, Duration::from_millis(500)).until(until);
    let kube = match Kube::from_kubeconfig(root, kubeconfig, retry) {
        Ok(Some(k)) => k,
        Ok(None) => return format!("not sent: {} does not exist", root.show(kubeconfig)),
        Err(e) => return format!("not sent: {e}"),
    };
    let mut done = Vec::new();
    let mut failed = Vec::new();
    match condition(&kube, node, report) {
        Ok(()) => done.push(format!("condition {CONDITION}={}", report.verdict.word())),
        // The API server did not answer: nothing else is tried.
        Err(e) if matches!(e.class, Failure::Unreachable | Failure::Busy) => {
            return format!("not sent: the API server did not answer: {}", e.error)
        }
        Err(e) => failed.push(format!("condition: {}", e.error)),
    }
    if !report.labels.is_empty() && Instant::now() < until {
        match labels(&kube, node, &report.labels) {
            Ok(()) => done.push(format!("{} labels", report.labels.len())),
            Err(e) => failed.push(format!("labels: {e}")),
        }
    }
    let mut sent = 0;
    for ev in report.events.iter().take(MAX_EVENTS) {
        if Instant::now() >= until {
            failed.push(format!(
                "events: the report's {} s passed",
                DEADLINE.as_secs()
            ));
            break;
        }
        match event(&kube, node, ev) {
            Ok(()) => sent += 1,
            Err(e) => {
                failed.push(format!("event {}: {e}", ev.reason));
                break;
            }
        }
    }
    if sent > 0 {
        done.push(format!("{sent} events"));
    }
    let mut line = format!(
        "to Node {node} ({}): {}",
        kube.source,
        if done.is_empty() {
            "nothing".to_string()
        } else {
            done.join(", ")
        }
    );
    if !failed.is_empty() {
        line.push_str(&format!("; not sent: {}", failed.join("; ")));
    }
    line
}

fn now() -> String {
    crate::node::run::rfc3339(SystemTime::now())
}

fn ask(
    kube: &Kube,
    method: &'static str,
    path: &str,
    content_type: &'static str,
    body: &serde_json::Value,
    pass: &[u16],
) -> Result<Reply> {
    kube.call_as(method, path, content_type, Some(body), pass)
        .map_err(Error::from)
}

/// An answer that is not a 2xx, as the fetcher classes one that gives up.
fn refused(e: Error) -> FetchError {
    FetchError {
        class: Failure::Final,
        error: e,
    }
}

/// The condition through the status subresource, merged by its type (a strategic merge patch
/// of `status.conditions`): the kubelet's own conditions stay as they are. Its transition time
/// moves only when its status changes.
fn condition(kube: &Kube, node: &str, r: &Report) -> std::result::Result<(), FetchError> {
    let current = match kube.call("GET", &format!("/api/v1/nodes/{node}"), None, &[])? {
        Reply::Ok(v) => v,
        Reply::Status(_, e) => return Err(refused(e)),
    };
    let was = current
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(CONDITION))
        });
    let now = now();
    let since = was
        .filter(|c| c.get("status").and_then(|s| s.as_str()) == Some(r.verdict.word()))
        .and_then(|c| c.get("lastTransitionTime").and_then(|t| t.as_str()))
        .map_or(now.clone(), str::to_string);
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": CONDITION,
        "status": r.verdict.word(),
        "reason": r.reason,
        "message": r.message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": since,
    }]}});
    // `node` is a checked DNS subdomain (nodeinfo::node_name): nothing to escape.
    let path = format!("/api/v1/nodes/{node}/status");
    let body = Some(&patch);
    match kube.call_as(
        "PATCH",
        &path,
        "application/strategic-merge-patch+json",
        body,
        &[],
    )? {
        Reply::Ok(_) => Ok(()),
        Reply::Status(_, e) => Err(refused(e)),
    }
}

fn labels(kube: &Kube, node: &str, labels: &[(&'static str, String)]) -> Result<()> {
    let map: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone())))
        .collect();
    let patch = serde_json::json!({"metadata": {"labels": map}});
    let path = format!("/api/v1/nodes/{node}");
    match ask(
        kube,
        "PATCH",
        &path,
        "application/merge-patch+json",
        &patch,
        &[],
    )? {
        Reply::Ok(_) => Ok(()),
        Reply::Status(_, e) => Err(e),
    }
}

/// The event's name: the Node's, then a hash of what it says, so that the same event again is
/// the same object (the kubelet's correlator keys on the same fields).
fn event_name(node: &str, ev: &Event) -> String {
    let d = crate::crypto::digest::sha256(
        format!("{}\n{}\n{}", ev.warning, ev.reason, ev.message).as_bytes(),
    );
    format!("{node}.nodestrap.{}", &crate::crypto::digest::hex(&d)[..16])
}

/// Creates the event, or, when it exists (409), counts it once more and moves its last time: a
/// node may create and patch events but not read them, so the patch's answer gives the count.
fn event(kube: &Kube, node: &str, ev: &Event) -> Result<()> {
    let name = event_name(node, ev);
    let now = now();
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": EVENTS_NS},
        // The kubelet names a Node by its name as its UID too; kubectl describe node looks
        // events up that way.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": ev.reason,
        "message": ev.message,
        "type": if ev.warning { "Warning" } else { "Normal" },
        "source": {"component": "nodestrap", "host": node},
        "reportingComponent": "nodestrap",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let events = format!("/api/v1/namespaces/{EVENTS_NS}/events");
    match ask(kube, "POST", &events, "application/json", &body, &[409])? {
        Reply::Ok(_) => return Ok(()),
        Reply::Status(_, _) => {}
    }
    let path = format!("{events}/{name}");
    let seen = serde_json::json!({"lastTimestamp": now});
    let count = match ask(
        kube,
        "PATCH",
        &path,
        "application/merge-patch+json",
        &seen,
        &[],
    )? {
        Reply::Ok(v) => v.get("count").and_then(|c| c.as_u64()).unwrap_or(1),
        Reply::Status(_, e) => return Err(e),
    };
    let counted = serde_json::json!({"count": count + 1});
    match ask(
        kube,
        "PATCH",
        &path,
        "application/merge-patch+json",
        &counted,
        &[],
    )? {
        Reply::Ok(_) => Ok(()),
        Reply::Status(_, e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("v1.37.2"), "v1.37.2");
        assert_eq!(label_value("containerd://1.7.24"), "containerd-1.7.24");
        assert_eq!(label_value("-a b-"), "a-b");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn the_same_event_has_the_same_name() {
        let e = |m: &str| Event {
            warning: false,
            reason: "Verified",
            message: m.into(),
        };
        assert_eq!(event_name("n", &e("a")), event_name("n", &e("a")));
        assert_ne!(event_name("n", &e("a")), event_name("n", &e("b")));
        assert!(event_name("n", &e("a")).starts_with("n.nodestrap."));
    }
}
