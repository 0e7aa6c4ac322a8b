//! The Node's own word on what runs: `status.nodeInfo` as the kubelet reports it to the API
//! server (its kubelet version from its build, its runtime's from the CRI). Both payloads' boot
//! checks ask it the same way (docs/verify.md, "What it checks").

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::kube::Kube;
use crate::net::retry::Retry;
use crate::node::root::Root;
use crate::node::status::{ApiCheck, Check};

/// Between two questions while the Node catches up with a kubelet that just (re)started.
const PAUSE: Duration = Duration::from_secs(2);

/// Whether a `containerRuntimeVersion` the Node reports is the expected runtime.
pub(crate) type Judge<'a> = &'a dyn Fn(&str) -> bool;

/// What the Node should report.
pub(crate) struct Want<'a> {
    /// `nodeInfo.kubeletVersion`, compared by `same_version`.
    pub(crate) kubelet: Option<String>,
    /// `nodeInfo.containerRuntimeVersion`: how the check names it, and the judge of an answer.
    pub(crate) runtime: Option<(String, Judge<'a>)>,
}

/// The API server's verdict, its note (why not asked, or from where), and its checks.
pub(crate) struct Answer {
    pub(crate) api: ApiCheck,
    pub(crate) note: Option<String>,
    pub(crate) checks: Vec<Check>,
}

/// Asks for Node `name` through `kubeconfig` (node path) until it agrees with `want` or `wait`
/// has passed (a restarted kubelet updates its Node within seconds). Only a Node whose kubelet
/// reported in this boot is judged: its `Ready` condition's `lastHeartbeatTime` (the node's own
/// clock) not before the boot began; a kubelet posts its status as it starts. A Node that has
/// not reported since, or no answer in that time, is `unreached`, never a pass or a mismatch.
pub(crate) fn ask(
    root: &Root,
    kubeconfig: &str,
    wait: Duration,
    name: &str,
    want: &Want,
) -> Answer {
    let until = Instant::now() + wait;
    let mut asking = Asking {
        last: None,
        why: String::new(),
    };
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let retry = Retry::exponential(1, Duration::from_millis(500))
            .within(left.max(Duration::from_secs(1)));
        match get_node(root, kubeconfig, name, retry) {
            Ok(node) => {
                if asking.agrees(&node, name, want) {
                    break;
                }
            }
            Err(e) => asking.why = e.to_string(),
        }
        if Instant::now() + PAUSE >= until {
            break;
        }
        std::thread::sleep(PAUSE);
    }
    asking.answer(root, kubeconfig, wait, name, want)
}

/// Node `name` as the API server behind `kubeconfig` has it.
fn get_node(root: &Root, kubeconfig: &str, name: &str, retry: Retry) -> Result<serde_json::Value> {
    Kube::from_kubeconfig(root, kubeconfig, retry)
        .and_then(|k| {
            k.ok_or_else(|| Error::failed(format!("{} does not exist yet", root.show(kubeconfig))))
        })
        .and_then(|k| k.get_node(name))
}

/// The boot's start in the node's wall clock, to the second the API stores; taken at each
/// answer, as the clock may be set meanwhile (a node that booted with its clock behind).
fn booted() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        - crate::node::run::since_boot().as_secs() as i64
        - 1
}

/// What the questions so far learned: the last versions a Node of this boot reported, and why
/// there is none yet.
struct Asking {
    last: Option<(String, String)>,
    why: String,
}

impl Asking {
    /// Whether `node` reported in this boot and agrees with `want`.
    fn agrees(&mut self, node: &serde_json::Value, name: &str, want: &Want) -> bool {
        let beat = heartbeat(node);
        if beat
            .as_ref()
            .and_then(|b| crate::net::kubeconfig::rfc3339(b))
            < Some(booted())
        {
            self.why = format!(
                "Node {name} has not reported since this boot began (its Ready heartbeat: {})",
                beat.as_deref().unwrap_or("none")
            );
            return false;
        }
        let info = |k: &str| {
            node.pointer(&format!("/status/nodeInfo/{k}"))
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string()
        };
        let got = (info("kubeletVersion"), info("containerRuntimeVersion"));
        let done = want
            .kubelet
            .as_ref()
            .is_none_or(|w| same_version(w, &got.0))
            && want.runtime.as_ref().is_none_or(|(_, judge)| judge(&got.1));
        self.last = Some(got);
        done
    }

    /// The verdict on the last versions reported, or `unreached` without any.
    fn answer(
        self,
        root: &Root,
        kubeconfig: &str,
        wait: Duration,
        name: &str,
        want: &Want,
    ) -> Answer {
        let why = self.why;
        let Some((kubelet, runtime)) = self.last else {
            crate::warn!("API server not asked in time: {why}: recorded as unreached");
            return Answer {
                api: ApiCheck::Unreached,
                note: Some(format!(
                    "no answer within --api-wait {} s: {why}",
                    wait.as_secs()
                )),
                checks: Vec::new(),
            };
        };
        let mut checks = Vec::new();
        if let Some(w) = &want.kubelet {
            let ok = same_version(w, &kubelet);
            checks.push(Check::judged(
                format!("Node {name} nodeInfo.kubeletVersion"),
                w.clone(),
                kubelet,
                ok,
            ));
        }
        if let Some((w, judge)) = &want.runtime {
            let ok = judge(&runtime);
            checks.push(Check::judged(
                format!("Node {name} nodeInfo.containerRuntimeVersion"),
                w.clone(),
                runtime,
                ok,
            ));
        }
        Answer {
            api: if checks.iter().all(|c| c.ok) {
                ApiCheck::Confirmed
            } else {
                ApiCheck::Mismatch
            },
            note: Some(format!("from {}", root.show(kubeconfig))),
            checks,
        }
    }
}

/// The Node's `Ready` condition's `lastHeartbeatTime`, as the kubelet wrote it.
fn heartbeat(node: &serde_json::Value) -> Option<String> {
    node.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some("Ready"))?
        .get("lastHeartbeatTime")?
        .as_str()
        .map(str::to_string)
}

/// Whether two versions as the Node reports them are the same: `containerd://v1.7.24` (an
/// upstream build says its tag) is `containerd://1.7.24`, `v1.32.3` is `1.32.3`.
pub(crate) fn same_version(a: &str, b: &str) -> bool {
    let bare = |s: &str| -> (String, String) {
        let (scheme, v) = s.split_once("://").unwrap_or(("", s));
        (scheme.to_string(), v.trim_start_matches('v').to_string())
    };
    bare(a) == bare(b)
}

/// `given` (`--node-name`), else the host name as the kubelet registers it (lower case). Not a
/// DNS subdomain: a configuration error.
pub(crate) fn node_name(given: Option<&str>) -> Result<String> {
    let n = match given {
        Some(n) => n.to_string(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_ascii_lowercase())
            .map_err(|e| Error::failed(format!("/proc/sys/kernel/hostname: {e}")))?,
    };
    crate::net::names::NodeName::parse(&n)
        .map(|n| n.to_string())
        .ok_or_else(|| Error::config(format!("node name {n:?}: not a DNS subdomain")))
}
