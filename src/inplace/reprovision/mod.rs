//! `nodestrap reprovision` and `nodestrap preflight`: IBM's in-place bootstrapper
//! (docs/reprovision.md). An operator cordons a node and labels it; a DaemonSet pod with the host's root and a
//! Secret mounted re-bootstraps the node in place and reboots it into its new configuration.
//!
//! RHCOS: the machine-config-server's Ignition config, completed with the kubeconfig and the
//! node annotations, is handed to `machine-config-daemon firstboot-complete-machineconfig`
//! which writes it out and reboots. RHEL: a bootstrap payload is unpacked and
//! its entry script run, then the node reboots. A state file under the root makes a re-run
//! after a crash converge and a run on a finished node do nothing.

mod preflight;
mod rhcos;
mod rhel;
mod setup;
mod state;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::cli::{HostReboot, Reprovision};
use crate::error::{Error, Result};
use crate::inplace::progress::Reporter;
use crate::net::kube::Kube;
use crate::net::names::NodeName;
use crate::node::reboot::{self, Rebooter, Requested};
use crate::node::root::Root;
use crate::node::seams::boot_id;

pub use preflight::preflight;
use preflight::*;
use rhcos::*;
use rhel::*;
use setup::*;
use state::*;

/// `nodestrap reprovision`: its numbered steps (docs/reprovision.md), one function each.
pub fn run(a: &Reprovision) -> Result<()> {
    // 0. Options, Secret, flow and clients (exit 2 on any configuration error).
    let r = Run::setup(a)?;
    // 1. Where a previous run got to: a finished run, or a hand-off in this boot, ends here;
    //    a payload an earlier run could not remove goes first.
    if !a.dry_run {
        rhel::sweep_payload(&r.s.root)?;
    }
    let Next::Go(prev) = r.previous()? else {
        return Ok(());
    };
    // 2, 3 and 4. Preflight, fetch, configure; RHEL resumes after an entry script that
    //    succeeded. A dry run ends here.
    let Next::Go(configured) = r.configure(prev)? else {
        return Ok(());
    };
    // 5. The label goes before the reboot, so the kubelet never comes back with it and the
    //    DaemonSet does not schedule here again. Its removal makes the DaemonSet delete this
    //    pod: from here on SIGTERM is held off until the hand-off is complete.
    hold_sigterm();
    remove_label(&r.api.kube, &r.node, &a.label)?;
    // 6. Hand off to the MCD or the reboot.
    r.hand_off(configured)
}

/// Whether a step lets the run go on.
enum Next<T> {
    Go(T),
    /// Nothing more to do; the step said why.
    Stop,
}

/// What step 4 leaves for the hand-off.
enum Configured {
    /// The MachineConfig is persisted for the MCD to apply.
    Rhcos { rendered: String, mcd: PathBuf },
    /// The payload's entry script succeeded (`rendered` is a previous run's, if it had one).
    Rhel { rendered: Option<String> },
}

impl Configured {
    fn rendered(&self) -> Option<&str> {
        match self {
            Configured::Rhcos { rendered, .. } => Some(rendered),
            Configured::Rhel { rendered } => rendered.as_deref(),
        }
    }
}

/// One run's inputs, read once in step 0.
struct Run<'a> {
    a: &'a Reprovision,
    s: Setup,
    api: Api,
    node: NodeName,
    flow: Flow,
    target: String,
    boot: String,
    progress: Reporter,
}

impl<'a> Run<'a> {
    fn setup(a: &'a Reprovision) -> Result<Self> {
        let (s, api) = setup::<ForReprovision>(a)?;
        let node = api.node.clone();
        let flow = s.secrets.flow;
        let target = s.secrets.target();
        let boot = boot_id()?;
        crate::node::status::decide("node", &node, "the Node this pod runs on");
        crate::node::status::decide("flow", flow.name(), "the Secret's keys");
        let progress = if a.dry_run {
            Reporter::silent(&node, flow.name())
        } else {
            Reporter::new(
                &s.open_tls,
                s.secrets.progress_url.as_deref(),
                s.secrets.progress_token.as_deref(),
                &node,
                flow.name(),
            )
        };
        Ok(Run {
            a,
            s,
            api,
            node,
            flow,
            target,
            boot,
            progress,
        })
    }

    fn state(&self, phase: Phase, config: Option<String>) -> State {
        State {
            flow: self.flow,
            target: self.target.clone(),
            phase,
            boot_id: self.boot.clone(),
            config,
        }
    }

    /// Step 1: the state file of a previous run for this same target, if it leaves work.
    fn previous(&self) -> Result<Next<Option<State>>> {
        let (node, flow) = (&self.node, self.flow);
        let prev = read_state(&self.s.root)?.filter(|st| {
            let same = st.target == self.target && st.flow == flow;
            if !same {
                crate::info!("state file is for another reprovision target; starting afresh");
            }
            same
        });
        let Some(st) = &prev else {
            return Ok(Next::Go(None));
        };
        if st.phase == Phase::Done {
            crate::info!(
                "node {node} was already reprovisioned for this target ({}); nothing to do",
                st.config.as_deref().unwrap_or(flow.name())
            );
            summary(format_args!(
                "nodestrap: reprovision already done node={node} flow={}",
                flow.name()
            ));
            return Ok(Next::Stop);
        }
        // A hand-off the MCD already took (it renamed the config away) counts even when this
        // process was killed before it could record `reboot-pending`.
        let taken = st.phase == Phase::HandedOff
            && flow == Flow::Rhcos
            && finished_on_disk(&self.s.root, flow);
        if (st.phase == Phase::RebootPending || taken) && st.boot_id == self.boot {
            // The MCD applied the config (or systemd accepted the reboot) in this boot: the
            // node is going down. Fetching, patching and running the MCD again would only
            // race it.
            crate::info!(
                "node {node} was handed off in this boot and is rebooting into its new configuration; nothing to do"
            );
            summary(format_args!(
                "nodestrap: reprovision handed off node={node} flow={} (reboot pending)",
                flow.name()
            ));
            return Ok(Next::Stop);
        }
        let after_hand_off = st.phase == Phase::HandedOff || st.phase == Phase::RebootPending;
        if after_hand_off && st.boot_id != self.boot && finished_on_disk(&self.s.root, flow) {
            let work = work_dir(&self.s.root)?;
            let done = State {
                phase: Phase::Done,
                boot_id: self.boot.clone(),
                ..st.clone()
            };
            if !self.a.dry_run {
                write_state(&work, &done)?;
            }
            crate::info!(
                "node {node} rebooted into its new configuration since the hand-off; reprovision done"
            );
            summary(format_args!(
                "nodestrap: reprovision done node={node} flow={}",
                flow.name()
            ));
            return Ok(Next::Stop);
        }
        Ok(Next::Go(prev))
    }

    /// Steps 2 to 4, or the resume of a RHEL run whose entry script succeeded (`done`, and a
    /// hand-off followed by a reboot, stopped in step 1).
    fn configure(&self, prev: Option<State>) -> Result<Next<Configured>> {
        let (node, flow) = (&self.node, self.flow);
        if flow == Flow::Rhel && prev.is_some() {
            crate::info!(
                "the payload's entry script already succeeded in this boot; resuming at the label"
            );
            if self.a.dry_run {
                summary(format_args!(
                    "nodestrap: reprovision dry run node={node} flow=rhel (nothing changed)"
                ));
                return Ok(Next::Stop);
            }
            return Ok(Next::Go(Configured::Rhel {
                rendered: prev.and_then(|p| p.config),
            }));
        }
        let Preflight {
            config,
            payload_sha256,
            ..
        } = self.preflight()?;
        // 3 and 4. Fetch, then configure (no MCD and nothing written in a dry run).
        let (a, s, progress) = (self.a, &self.s, &self.progress);
        let r = match flow {
            Flow::Rhcos => rhcos_configure(a, s, progress, config.expect("rhcos preflight"))
                .map(|(rendered, mcd)| mcd.map(|mcd| Configured::Rhcos { rendered, mcd })),
            Flow::Rhel => rhel_configure(a, s, node, progress, payload_sha256)
                .map(|()| (!a.dry_run).then_some(Configured::Rhel { rendered: None })),
        };
        let configured = r.inspect_err(|e| progress.fail_once("configure", &e.to_string()))?;
        let Some(configured) = configured else {
            summary(format_args!(
                "nodestrap: reprovision dry run node={node} flow={} (nothing changed)",
                flow.name()
            ));
            return Ok(Next::Stop);
        };
        let config = configured.rendered().map(str::to_string);
        write_state(&work_dir(&s.root)?, &self.state(Phase::Configured, config))?;
        Ok(Next::Go(configured))
    }

    /// Step 2: every dependency answers, or nothing is changed.
    fn preflight(&self) -> Result<Preflight> {
        let progress = &self.progress;
        progress.report("preflight", "started", "checking dependencies");
        let p = preflight_checks(&self.s, Some(&self.api));
        print_table(&p.checks)?;
        let failed: Vec<String> = p
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| format!("{} {}: {}", c.check, c.target, c.detail))
            .collect();
        if !failed.is_empty() {
            let msg = format!("preflight failed: {}", failed.join("; "));
            progress.report("preflight", "failed", &msg);
            return Err(Error::failed(format!("{msg}; nothing was changed")));
        }
        progress.report(
            "preflight",
            "succeeded",
            &format!("{} checks passed", p.checks.len()),
        );
        Ok(p)
    }

    /// Step 6: the state first, so a crash from here on is recognised after the reboot; then
    /// the MCD (RHCOS) or the reboot request (RHEL).
    fn hand_off(&self, c: Configured) -> Result<()> {
        let (node, flow, progress) = (&self.node, self.flow, &self.progress);
        let work = work_dir(&self.s.root)?;
        let rendered = c.rendered();
        let config = || rendered.map(str::to_string);
        write_state(&work, &self.state(Phase::HandedOff, config()))?;
        progress.report(
            "reboot",
            "started",
            "handing the node over to its new configuration",
        );
        // Recorded as soon as the hand-off is accepted, so that a run again in this boot does
        // not hand off a second time, even if this process is killed before it ends.
        let pending = || {
            if let Err(e) = write_state(&work, &self.state(Phase::RebootPending, config())) {
                crate::warn!("{e}");
            }
        };
        let r = match &c {
            Configured::Rhcos { mcd, .. } => {
                mcd_hand_off(self.a, &self.s.root, mcd).inspect(|()| pending())
            }
            Configured::Rhel { .. } => self.request_reboot(&pending),
        };
        if let Err(e) = r {
            progress.report("reboot", "failed", &e.to_string());
            return Err(e);
        }
        if let Configured::Rhcos { rendered, .. } = &c {
            progress.report(
                "reboot",
                "succeeded",
                &format!("machine-config-daemon applied {rendered} and reboots the node"),
            );
        }
        summary(format_args!(
            "nodestrap: reprovision handed off node={node} flow={} config={}",
            flow.name(),
            rendered.unwrap_or("-")
        ));
        Ok(())
    }

    /// RHEL's hand-off: "succeeded" only once systemd accepted the job; then SIGTERM (the node
    /// going down) ends the wait at once with exit 0.
    fn request_reboot(&self, pending: &dyn Fn()) -> Result<()> {
        let progress = &self.progress;
        match rebooter(self.a, &self.s.root)
            .request("reprovisioned in place (RHEL bootstrap payload applied)")?
        {
            Requested::Queued(job) => {
                pending();
                progress.report(
                    "reboot",
                    "succeeded",
                    &format!("reboot queued as systemd job {job}"),
                );
                reboot::wait_to_be_stopped(Duration::from_secs(600))
            }
            // Not accepted, so not "succeeded": the node still has to be rebooted.
            Requested::Declined(why) => {
                pending();
                progress.report(
                    "reboot",
                    "skipped",
                    &format!("not rebooting ({why}); the node must be rebooted to finish"),
                );
                Ok(())
            }
        }
    }
}

fn remove_label(kube: &Kube, node: &str, label: &str) -> Result<()> {
    let patch = json!({"metadata": {"labels": {label: null}}});
    let got = kube
        .patch_node(node, &patch)
        .map_err(|e| e.context(format!("removing label {label} from Node {node}")))?;
    if got
        .pointer("/metadata/labels")
        .and_then(|l| l.get(label))
        .is_some()
    {
        return Err(Error::failed(format!(
            "Node {node}: the API server's answer still has label {label}"
        )));
    }
    crate::info!(
        "Node {node}: label {label} removed (credentials from {})",
        kube.source
    );
    Ok(())
}

fn rebooter(a: &Reprovision, root: &Root) -> Box<dyn Rebooter> {
    match a.reboot {
        HostReboot::Host => reboot::for_host_mount(a.dry_run),
        HostReboot::Never => reboot::for_run(root, false, a.dry_run),
        HostReboot::Auto => reboot::for_run(root, true, a.dry_run),
    }
}

/// The DaemonSet deletes this pod as soon as the label is gone; kubelet's SIGTERM must not cut
/// the hand-off short (the pod's grace period covers it). It only sets the stop flag (a
/// handler, not SIG_IGN, so the programs we start get the default disposition back); once the
/// reboot is queued, a SIGTERM that came during the hand-off, or any later one, ends the wait
/// at once with exit 0.
fn hold_sigterm() {
    crate::node::signals::catch_sigterm();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_urls() {
        assert_eq!(v2_url("quay.io"), "https://quay.io/v2/");
        assert_eq!(
            v2_url("https://mirror.example:5000/ocp4/release"),
            "https://mirror.example:5000/v2/"
        );
        assert_eq!(v2_url("http://10.0.0.1:5000"), "http://10.0.0.1:5000/v2/");
    }

    #[test]
    fn state_files_of_earlier_releases_still_read() {
        for (text, phase) in [
            ("configured", Phase::Configured),
            ("handed-off", Phase::HandedOff),
            ("reboot-pending", Phase::RebootPending),
            ("done", Phase::Done),
        ] {
            let old = format!(
                r#"{{"flow": "rhcos", "target": "sha256:ab", "phase": "{text}", "bootId": "b1", "config": "rendered-worker-1"}}"#
            );
            let st: State = serde_json::from_str(&old).unwrap();
            assert_eq!(st.phase, phase);
            // Written back as it was read.
            let again: serde_json::Value = serde_json::to_value(&st).unwrap();
            assert_eq!(
                again,
                serde_json::from_str::<serde_json::Value>(&old).unwrap()
            );
        }
        assert!(serde_json::from_str::<State>(
            r#"{"flow": "rhcos", "target": "t", "phase": "halfway", "bootId": "b"}"#
        )
        .is_err());
    }

    #[test]
    fn sha256_forms() {
        let hex = "ab".repeat(32);
        for v in [
            hex.clone(),
            format!("sha256:{hex}"),
            format!("sha256-{hex}"),
        ] {
            assert_eq!(parse_sha256(&v).unwrap().hex, hex);
        }
        assert!(parse_sha256("sha512:ab").is_none());
        assert!(parse_sha256(&"zz".repeat(32)).is_none());
    }

    #[test]
    fn short_statuses() {
        assert_eq!(
            short_status("GET https://x: HTTP 405 Method Not Allowed: no"),
            "HTTP 405 Method Not Allowed"
        );
    }
}
