//! `nodestrap bootstrap`: tectonic-torcx's node bootstrap, step by step (docs/bootstrap.md), with
//! the fixes its reference lists: atomic writes, stable kubelet.env, a deadline on the update
//! wait, retries on 5xx, and a reboot only when one is really needed.
//! The steps the pre-reboot hook shares are in `runtime`, `store` and `layout`.

use std::time::Duration;

use crate::cli::check::check_options;
use crate::cli::{Bootstrap, RebootMode};
use crate::error::{Error, Result};
use crate::net::cluster;
use crate::net::fetch::{Failure, FetchError, Http};
use crate::net::kube::Kube;
use crate::net::retry::Retry;
use crate::node::clock;
use crate::node::dbus::{self, Update};
use crate::node::mappings::Mappings;
use crate::node::marker;
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;
use crate::torcx::layout::Layout;
use crate::torcx::runtime::{self, Manifests, OsInfo, Stage, Wanted, OS_RELEASE, RUNTIME};
use crate::torcx::store::{self};

const MAPPINGS_NS: &str = "tectonic-system";
const MAPPINGS_CM: &str = "tectonic-torcx-runtime-mappings";
const MAPPINGS_KEY: &str = "runtime-mappings.yaml";
/// `--dry-run` prints its plan on stdout, one `plan:` line per change it would make; the log on
/// stderr still carries the decisions.
pub fn run(a: &Bootstrap) -> Result<()> {
    // 0. Everything that can be checked without the node or the network: exit 2 if wrong.
    let root = Root::open(&a.root)?;
    let template = check_options(a)?;
    if !a.dry_run {
        crate::node::temps::sweep(&root);
    }
    let torcx_on = !a.torcx_skip_setup;
    let (keyring, http) = clients(&root, a, torcx_on)?;
    let registry = match &http {
        Some(h) => Some(a.common().registry(&root, h)?),
        None => None,
    };
    let api_retry = a.common().api_retry();
    let rebooter = crate::node::reboot::for_run(&root, a.reboot == RebootMode::Auto, a.dry_run);
    // Before anything checks a certificate or a signature.
    clock::check(&root, Duration::from_secs(a.clock_wait))?;
    // 1. OS version and board; where torcx looks (its config.json), before anything is
    //    fetched for it.
    let os = read_os(&root)?;
    let layout = read_layout(&root, torcx_on)?;
    // 2-3. Kubernetes version and the runtime mappings.
    let (k8s, wanted) = cluster_inputs(&root, a, torcx_on, api_retry)?;
    // 4. update_engine.
    let update = os_update(a, &root)?;
    let next = match &update {
        Update::Pending(v) => Some(v.clone()),
        _ => None,
    };
    if update == Update::PendingUnknown {
        return defer(&k8s, &*rebooter);
    }
    // 5-11 change the node: every change goes through the undo log, so that a failure puts
    //    the node back as it was (the images added, the profile, next-profile, the cleanup
    //    unit and kubelet.env), and a success deletes only what it set aside.
    let mut undo = Undo::new(&root);
    let staged = Staging {
        root: &root,
        a,
        os: &os,
        layout: &layout,
        registry: registry.as_ref(),
        wanted: wanted.as_ref(),
        template: &template,
        keyring: keyring.as_ref(),
        next: next.as_deref(),
        update: &update,
        k8s: &k8s,
    }
    .run(&mut undo, &*rebooter);
    match staged {
        Ok(()) => {
            undo.commit();
            Ok(())
        }
        Err(e) => Err(undo.undo(e)),
    }
}

/// Step 0's clients: the keyring and the HTTP client, for torcx only.
fn clients(
    root: &Root,
    a: &Bootstrap,
    torcx_on: bool,
) -> Result<(Option<crate::crypto::openpgp::Keyring>, Option<Http>)> {
    let keyring = if torcx_on {
        a.common().keyring(root)?
    } else {
        None
    };
    let http = if torcx_on {
        Some(a.common().http(root)?)
    } else {
        None
    };
    Ok((keyring, http))
}

/// Step 1: OS version and board.
fn read_os(root: &Root) -> Result<OsInfo> {
    let os = OsInfo::read(root)?;
    let by_arch = if os.board_from_arch {
        ", board by architecture"
    } else {
        ""
    };
    crate::info!(
        "OS version {} board {} (from {}{by_arch})",
        os.version,
        os.board,
        root.show(OS_RELEASE)
    );
    status::decide(
        "os",
        format_args!("{} board {}", os.version, os.board),
        format_args!("{}{by_arch}", root.show(OS_RELEASE)),
    );
    Ok(os)
}

/// Where torcx looks (its config.json); the default when torcx is skipped.
fn read_layout(root: &Root, torcx_on: bool) -> Result<Layout> {
    if !torcx_on {
        return Ok(Layout::default());
    }
    let l = Layout::read(root)?;
    crate::info!(
        "torcx stores under {}, profiles in {}, applied profile {} (from {})",
        l.store_root(),
        l.profiles_dir(),
        l.applied_profile(),
        l.source
    );
    Ok(l)
}

/// Steps 2 and 3: the Kubernetes version (forced, API server, or the installer's kubelet.env)
/// and, for torcx, the runtime versions its mappings give.
fn cluster_inputs(
    root: &Root,
    a: &Bootstrap,
    torcx_on: bool,
    api_retry: Retry,
) -> Result<(String, Option<Wanted>)> {
    let kube = if a.force_kube_version.is_none() || torcx_on {
        cluster::joined(root, a.joined_kubeconfigs(), api_retry)?
    } else {
        None
    };
    // Not joined yet: the cluster's version from the kubelet's bootstrap kubeconfig or
    // --api-server (the runtime mappings then come from the node's file).
    let before_join = a.before_join();
    let joining = if kube.is_none() && a.force_kube_version.is_none() {
        cluster::before_join(root, &before_join, api_retry, || a.common().tls(root))?
    } else {
        None
    };
    let version = cluster::version(
        root,
        &a.version_sources(kube.as_ref(), joining.as_ref(), &before_join),
    )?;
    let k8s = version.value.clone();

    // 3. Runtime mappings: the ConfigMap, else the node's file.
    let wanted = if torcx_on {
        Some(runtime_versions(root, a, kube.as_ref(), &k8s)?)
    } else {
        None
    };
    // The API server is not asked again: its idle connection goes now, not at exit, so that a
    // herd of nodes downloading holds one connection each at the servers.
    drop((kube, joining));
    Ok((k8s, wanted))
}

/// Step 4's end when an OS update of unknown version is pending: nothing can be staged for
/// it, so boot into it first and bootstrap there. kubelet.env is not written, so the unit runs
/// again after the reboot.
fn defer(k8s: &str, rebooter: &dyn crate::node::reboot::Rebooter) -> Result<()> {
    let why = "an OS update of unknown version is pending; bootstrapping after the reboot";
    status::reboot(status::Reboot::Needed { reason: why.into() });
    crate::outln!("nodestrap: bootstrap deferred k8s={k8s} reboot=needed ({why})")?;
    rebooter.reboot(why)
}

/// Steps 5 to 11, with what they need.
struct Staging<'a> {
    root: &'a Root,
    a: &'a Bootstrap,
    os: &'a OsInfo,
    layout: &'a Layout,
    registry: Option<&'a crate::net::oci::Client<'a>>,
    wanted: Option<&'a Wanted>,
    template: &'a crate::cli::check::ManifestUrl,
    keyring: Option<&'a crate::crypto::openpgp::Keyring>,
    next: Option<&'a str>,
    update: &'a Update,
    k8s: &'a str,
}

impl<'a> Staging<'a> {
    fn run(&self, undo: &mut Undo<'a>, rebooter: &dyn crate::node::reboot::Rebooter) -> Result<()> {
        // 5-8. torcx: choose, fetch and verify, stage, profile.
        let chosen = self.stage(undo)?;
        status::phase(status::Phase::Staged);
        // 9. Decide the reboot and prepare for it before the done marker exists: once
        //    kubelet.env is written this unit never runs again, so nothing that can fail may
        //    come after it but the reboot request.
        let reasons = self.decide_reboot(chosen.as_deref(), undo)?;
        // 10. kubelet.env: the done marker.
        self.write_marker(undo)?;
        // 11. Report, and reboot only when needed. Whatever fails here (stdout gone, the
        //     reboot refused) undoes the run, so the unit runs again rather than starting the
        //     kubelet on a half-done node.
        let reboot = if reasons.is_empty() {
            "no".to_string()
        } else {
            format!("needed ({})", reasons.join("; "))
        };
        crate::outln!(
            "nodestrap: bootstrap {} k8s={} {RUNTIME}={} next-os={} reboot={reboot}",
            if self.a.dry_run { "planned" } else { "done" },
            self.k8s,
            chosen.as_deref().unwrap_or("unchanged"),
            self.next.unwrap_or("none"),
        )?;
        if reasons.is_empty() {
            crate::info!("no reboot needed");
            return Ok(());
        }
        rebooter.reboot(&reasons.join("; "))
    }

    /// Steps 5 to 8: the runtime chosen, fetched and verified, staged and profiled; `None`
    /// when torcx is skipped.
    fn stage(&self, undo: &mut Undo<'a>) -> Result<Option<String>> {
        let (Some(registry), Some(wanted)) = (self.registry, self.wanted) else {
            crate::info!("torcx setup skipped (--torcx-skip-setup)");
            return Ok(None);
        };
        let a = self.a;
        let downgrades = crate::cli::check::downgrades(&a.allow_downgrade)?;
        let m = Manifests {
            registry,
            template: self.template,
            board: &self.os.board,
            keyring: self.keyring,
        };
        let st = Stage {
            layout: self.layout,
            current: &self.os.version,
            next: self.next,
            profile_default: &a.torcx_profile,
            cap: a.image_max_bytes(),
            downgrades: &downgrades,
            dry_run: a.dry_run,
        };
        runtime::stage_runtime(self.root, &m, &st, wanted, undo)
    }

    /// Step 9: why the node reboots (none: it does not), recorded; the cleanup unit installed
    /// when the reboot changes the runtime.
    fn decide_reboot(&self, chosen: Option<&str>, undo: &mut Undo<'a>) -> Result<Vec<String>> {
        let applied = match chosen {
            Some(_) => store::applied_reference(self.root, self.layout, RUNTIME)?,
            None => None,
        };
        let reasons = reboot_reasons(self.update, applied.as_ref(), chosen);
        status::reboot(if reasons.is_empty() {
            status::Reboot::No
        } else {
            status::Reboot::Needed {
                reason: reasons.join("; "),
            }
        });
        if !reasons.is_empty() && runtime_changes(applied.as_ref(), chosen) {
            install_cleanup(self.root, self.a.dry_run, undo)?;
        }
        Ok(reasons)
    }

    /// Step 10: kubelet.env, the done marker.
    fn write_marker(&self, undo: &mut Undo<'a>) -> Result<()> {
        let a = self.a;
        let tag = self.k8s.replace('+', "_");
        let set = [("KUBELET_IMAGE_TAG", tag.as_str())];
        marker::write(
            self.root,
            &marker::Plan {
                path: &a.kubelet_env_path,
                template: &a.installer_kubelet_env,
                need: marker::Template::Required,
                set: &set,
            },
            a.dry_run,
            undo,
        )
    }
}

/// The ConfigMap, else the node's file: when the API server answered without usable mappings
/// (404, no key), or when it cannot answer and `--version-fallback` allows the node's
/// files to stand in (a busy server is waited for, as for the version).
fn runtime_versions(root: &Root, a: &Bootstrap, kube: Option<&Kube>, k8s: &str) -> Result<Wanted> {
    let from_api = kube.map(|k| k.configmap_key(MAPPINGS_NS, MAPPINGS_CM, MAPPINGS_KEY));
    let name = root.show(&a.version_manifest);
    let mappings = match from_api {
        // Data the API gave us that does not parse is an error, not a reason to use older data.
        Some(Ok(text)) => Mappings::parse(
            &text,
            &format!("ConfigMap {MAPPINGS_NS}/{MAPPINGS_CM} key {MAPPINGS_KEY}"),
        )?,
        // An identity that may not read the mappings is misconfigured, and an API server that
        // cannot answer may still be right: the node's file decides only where
        // --version-fallback lets it stand in for the cluster.
        Some(Err(FetchError {
            class: failure,
            error: e,
        })) if failure != Failure::Final && !a.version_fallback.allows(failure) => {
            let why = match failure {
                Failure::Denied => "refused these credentials the ConfigMap",
                _ => "did not answer",
            };
            return Err(e.context(format!(
                "runtime mappings: the API server {why}, and --version-fallback {} does not let {name} decide",
                a.version_fallback.word()
            )));
        }
        other => {
            if let Some(Err(e)) = other {
                crate::warn!("runtime mappings from the API unavailable, using {name}: {e}");
            }
            let text = root.read_text(&a.version_manifest)?.ok_or_else(|| {
                Error::failed(format!(
                    "no runtime mappings: API unavailable and {name} does not exist"
                ))
            })?;
            Mappings::parse(&text, &name)?
        }
    };
    runtime::pick_versions(&mappings, k8s)
}

/// update_engine is asked whatever `--root` is: the hook runs with the host root mounted
/// elsewhere and its bus is the node's; in the initramfs there is no update_engine at all.
fn os_update(a: &Bootstrap, root: &Root) -> Result<Update> {
    let u = if a.upgrade_os && !a.dry_run {
        if !root.is_host() {
            crate::warn!("--upgrade-os with --root {}: the update_engine asked is the one on this system bus", root.show("/"));
        }
        // The run's deadline bounds the wait too.
        let left = a
            .common()
            .run_deadline()
            .saturating_duration_since(std::time::Instant::now());
        let wait = Duration::from_secs(a.update_timeout).min(left);
        crate::info!(
            "asking update_engine for an OS update (AttemptUpdate), waiting up to {}s (--update-timeout {}, --deadline {})",
            wait.as_secs(),
            a.update_timeout,
            a.deadline
        );
        dbus::attempt_update(wait, Duration::from_secs(5))?
    } else {
        dbus::update_status()?
    };
    // One log line and one status decision per answer.
    let (value, source) = match &u {
        Update::Unavailable(why) => {
            let source = format!("update_engine is not on the system bus ({why})");
            crate::info!("no pending OS update: {source}");
            ("none".to_string(), source)
        }
        Update::Pending(v) => {
            crate::info!("OS update to {v} pending a reboot (from update_engine)");
            (v.clone(), "update_engine: pending a reboot".to_string())
        }
        Update::PendingUnknown => {
            crate::warn!(
                "OS update pending a reboot, but update_engine does not say to which version"
            );
            (
                "unknown".to_string(),
                "update_engine: pending a reboot, version not said".to_string(),
            )
        }
        Update::None(op) => {
            crate::info!("no pending OS update (update_engine status {op})");
            ("none".to_string(), format!("update_engine status {op}"))
        }
    };
    status::decide("os-update", value, source);
    Ok(u)
}

pub(crate) fn reboot_reasons(
    update: &Update,
    applied: Option<&Option<String>>,
    chosen: Option<&str>,
) -> Vec<String> {
    let mut r = Vec::new();
    if let Update::Pending(v) = update {
        r.push(format!("OS update to {v} is pending"));
    }
    // torcx applies profiles once per boot; if it already ran with another runtime, only a
    // reboot brings ours in. In the initramfs it has not run yet, so nothing is needed.
    if let (Some(applied), Some(chosen)) = (applied, chosen) {
        if applied.as_deref() != Some(chosen) {
            r.push(format!(
                "torcx applied {RUNTIME} {} in this boot, {chosen} is staged",
                applied.as_deref().unwrap_or("(none)")
            ));
        }
    }
    r
}

/// Whether the runtime torcx applied in this boot is not the one now staged, so docker's data
/// dir (which cannot be downgraded) must be wiped at the shutdown before the reboot. In the
/// initramfs torcx has not run (`applied` is `None`): nothing to wipe.
pub(crate) fn runtime_changes(applied: Option<&Option<String>>, chosen: Option<&str>) -> bool {
    matches!((applied, chosen), (Some(a), Some(c)) if a.as_deref() != Some(c))
}

/// Install the docker cleanup unit in /run and make systemd load it (only on the system we run
/// on: another root's systemd is not ours to reload); taken back on undo, reloading again.
fn install_cleanup<'a>(root: &'a Root, dry_run: bool, undo: &mut Undo<'a>) -> Result<()> {
    if dry_run {
        crate::outln!(
            "plan: install {} to wipe /var/lib/docker at shutdown",
            store::CLEANUP_UNIT
        )?;
        return Ok(());
    }
    store::install_cleanup_unit(undo)?;
    crate::info!(
        "installed {} in {}: /var/lib/docker is wiped at shutdown (docker cannot downgrade its data)",
        store::CLEANUP_UNIT,
        root.show("/run/systemd/system")
    );
    if root.is_host() {
        undo.then_on_undo(
            "systemd reloaded without the cleanup unit",
            dbus::systemd_reload,
        );
        dbus::systemd_reload()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::check::ManifestUrl;
    use crate::cli::DEFAULT_MANIFEST_URL;

    #[test]
    fn url_templates() {
        assert_eq!(
            ManifestUrl::parse(DEFAULT_MANIFEST_URL).unwrap().render("amd64-usr", "1632.3.0").unwrap(),
            "https://tectonic-torcx.release.core-os.net/manifests/amd64-usr/1632.3.0/torcx_manifest.json"
        );
        assert_eq!(
            ManifestUrl::parse("https://h/${COREOS_BOARD}/${VERSION_ID}/m.json")
                .unwrap()
                .render("arm64-usr", "1.2.3")
                .unwrap(),
            "https://h/arm64-usr/1.2.3/m.json"
        );
        assert!(ManifestUrl::parse("https://h/{{.Channel}}/m.json").is_err());
        assert!(ManifestUrl::parse("file:///m.json").is_err());
    }

    #[test]
    fn reboot_only_when_needed() {
        let none = Update::None(dbus::IDLE.into());
        // initramfs: torcx has not run.
        assert!(reboot_reasons(&none, None, Some("17.06")).is_empty());
        // first boot: torcx applied the vendor runtime.
        assert_eq!(
            reboot_reasons(&none, Some(&Some("com.coreos.cl".into())), Some("17.06")).len(),
            1
        );
        assert!(reboot_reasons(&none, Some(&Some("17.06".into())), Some("17.06")).is_empty());
        assert!(reboot_reasons(&none, Some(&Some("com.coreos.cl".into())), None).is_empty());
        let pending = Update::Pending("1632.3.0".into());
        assert_eq!(
            reboot_reasons(&pending, None, None),
            vec!["OS update to 1632.3.0 is pending".to_string()]
        );
    }

    #[test]
    fn wipe_only_when_the_applied_runtime_differs() {
        let cl = Some("com.coreos.cl".to_string());
        let same = Some("17.03".to_string());
        assert!(runtime_changes(Some(&cl), Some("17.03")));
        assert!(runtime_changes(Some(&None), Some("17.03")));
        // An OS update with the same runtime: reboot, but keep /var/lib/docker.
        assert!(!runtime_changes(Some(&same), Some("17.03")));
        assert!(!runtime_changes(None, Some("17.03")));
        assert!(!runtime_changes(Some(&cl), None));
    }

    #[test]
    fn only_the_host_root_gets_the_real_rebooter() {
        let tmp = Root::open(&std::env::temp_dir()).unwrap();
        let host = Root::open(std::path::Path::new("/")).unwrap();
        // Constructing is harmless; none of these is ever asked to reboot here.
        assert!(!crate::node::reboot::for_run(&tmp, true, false).is_real());
        assert!(
            !crate::node::reboot::for_run(&host, true, true).is_real(),
            "--dry-run"
        );
        assert!(
            !crate::node::reboot::for_run(&host, false, false).is_real(),
            "--reboot=never"
        );
        assert!(crate::node::reboot::for_run(&host, true, false).is_real());
    }
}
