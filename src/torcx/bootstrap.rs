//! `nodestrap bootstrap`: tectonic-torcx's node bootstrap, step by step (docs/bootstrap.md), with
//! the fixes its reference lists: atomic writes, stable kubelet.env, a deadline on the update
//! wait, retries on 5xx, and a reboot only when one is really needed.
//! The steps the pre-reboot hook shares are in `options` and `runtime`.

use std::io::Write as _;
use std::time::Duration;

use crate::cli::{self, Bootstrap, RebootMode};
use crate::error::{Error, Result};
use crate::net::kube::Kube;
use crate::node::dbus::{self, Update};
use crate::node::envfile::EnvFile;
use crate::node::root::{Persist, Root};
use crate::torcx::mappings::Mappings;
use crate::torcx::options::{self, check_options};
use crate::torcx::runtime::{self, Manifests, OsInfo, Wanted, OS_RELEASE, RUNTIME};
use crate::torcx::store::{self};

/// `nodestrap bootstrap` from the command line `args` (normalised) it was parsed from:
/// settings from the node's config file and kernel command line are merged under the
/// command line (--root, --config and --cmdline say where they are), then the run.
pub fn main(b: &Bootstrap, args: &[String]) -> i32 {
    let merged = match crate::torcx::config::merge(b, args) {
        Ok(m) => m,
        Err(e) => {
            crate::logger::init(log::LevelFilter::Info);
            log::error!("{e}");
            return e.exit_code();
        }
    };
    let cli = match cli::parse(&merged.args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let cli::Cmd::Bootstrap(b) = &cli.cmd else {
        unreachable!("merged arguments keep the subcommand")
    };
    cli::logged(&b.verbose, || {
        for n in &merged.notes {
            log::info!("{n}");
        }
        run(b)
    })
}

const MAPPINGS_NS: &str = "tectonic-system";
const MAPPINGS_CM: &str = "tectonic-torcx-runtime-mappings";
const MAPPINGS_KEY: &str = "runtime-mappings.yaml";
/// `--dry-run` prints its plan on stdout, one `plan:` line per change it would make; the log on
/// stderr still carries the decisions.
pub fn run(a: &Bootstrap) -> Result<()> {
    // 0. Everything that can be checked without the node or the network: exit 2 if wrong.
    let root = Root::open(&a.root)?;
    let template = check_options(a)?;
    let torcx_on = !a.torcx_skip_setup;
    let keyring = if torcx_on {
        options::read_keyring(&a.common(), &root)?
    } else {
        None
    };
    let http = if torcx_on {
        Some(options::manifest_client(&a.common(), &root)?)
    } else {
        None
    };
    let api_retry = options::api_retry(&a.common());
    let rebooter = crate::node::reboot::for_run(&root, a.reboot == RebootMode::Auto, a.dry_run);

    // 1. OS version and board.
    let os = OsInfo::read(&root)?;
    let by_arch = if os.board_from_arch {
        ", board by architecture"
    } else {
        ""
    };
    log::info!(
        "OS version {} board {} (from {}{by_arch})",
        os.version,
        os.board,
        root.show(OS_RELEASE)
    );

    // 2. Kubernetes version: forced, API server, or the installer's kubelet.env.
    let kube = if a.kubeconfig.is_empty() {
        None
    } else if a.force_kube_version.is_none() || torcx_on {
        Kube::from_kubeconfig(&root, &a.kubeconfig, api_retry)?
    } else {
        None
    };
    let k8s = kube_version(&root, a, kube.as_ref())?;

    // 3. Runtime mappings: the ConfigMap, else the node's file.
    let wanted = if torcx_on {
        Some(runtime_versions(&root, a, kube.as_ref(), &k8s)?)
    } else {
        None
    };

    // 4. update_engine.
    let update = os_update(a, &root)?;
    let next = match &update {
        Update::Pending(v) => Some(v.clone()),
        _ => None,
    };
    if update == Update::PendingUnknown {
        // Nothing can be staged for an OS whose version is unknown: boot into it first and
        // bootstrap there. kubelet.env is not written, so the unit runs again after the reboot.
        let why = "an OS update of unknown version is pending; bootstrapping after the reboot";
        crate::outln!("nodestrap: bootstrap deferred k8s={k8s} reboot=needed ({why})")?;
        return rebooter.reboot(why);
    }

    // 5-8. torcx: choose, fetch and verify, stage, profile.
    let chosen = match (&http, &wanted) {
        (Some(http), Some(wanted)) => {
            let m = Manifests {
                http,
                template: &template,
                board: &os.board,
                keyring: keyring.as_ref(),
            };
            runtime::stage_runtime(
                &root,
                &m,
                &os.version,
                next.as_deref(),
                wanted,
                &a.torcx_profile,
                a.dry_run,
            )?
        }
        _ => {
            log::info!("torcx setup skipped (--torcx-skip-setup)");
            None
        }
    };

    // 9. Decide the reboot and prepare for it before the done marker exists: once kubelet.env
    //    is written this unit never runs again, so nothing that can fail may come after it.
    let applied = match chosen {
        Some(_) => store::applied_reference(&root, RUNTIME)?,
        None => None,
    };
    let reasons = reboot_reasons(&update, applied.as_ref(), chosen.as_deref());
    if !reasons.is_empty() && runtime_changes(applied.as_ref(), chosen.as_deref()) {
        install_cleanup(&root, a.dry_run)?;
    }

    // 10. kubelet.env: the done marker.
    let marker = write_kubelet_env(&root, a, &k8s)?;

    // 11. Report, and reboot only when needed. From here on the marker exists: whatever fails
    //     (stdout gone, the reboot refused) takes it back, so the unit runs again rather than
    //     starting the kubelet on a half-done node.
    let finish = || -> Result<()> {
        let reboot = if reasons.is_empty() {
            "no".to_string()
        } else {
            format!("needed ({})", reasons.join("; "))
        };
        crate::outln!(
            "nodestrap: bootstrap {} k8s={k8s} {RUNTIME}={} next-os={} reboot={reboot}",
            if a.dry_run { "planned" } else { "done" },
            chosen.as_deref().unwrap_or("unchanged"),
            next.as_deref().unwrap_or("none"),
        )?;
        if reasons.is_empty() {
            log::info!("no reboot needed");
            return Ok(());
        }
        rebooter.reboot(&reasons.join("; "))
    };
    finish().map_err(|e| match marker {
        Some(m) => m.take_back(e),
        None => e,
    })
}

/// kubelet.env written by this run, taken back when the run fails after writing it.
struct Marker<'a> {
    root: &'a Root,
    path: &'a str,
}

impl Marker<'_> {
    /// Remove the marker (and fsync its directory); the run's error says so.
    fn take_back(&self, e: Error) -> Error {
        match self.root.remove(self.path) {
            Ok(()) => e.context(format!(
                "removed {} again so bootstrap runs again",
                self.root.show(self.path)
            )),
            Err(r) => {
                log::error!("{r}");
                e.context(format!(
                    "could NOT remove {}; remove it before kubelet starts",
                    self.root.show(self.path)
                ))
            }
        }
    }
}

fn kube_version(root: &Root, a: &Bootstrap, kube: Option<&Kube>) -> Result<String> {
    if let Some(v) = &a.force_kube_version {
        log::info!("Kubernetes version {v} (from --force-kube-version)");
        return Ok(v.clone());
    }
    match kube {
        Some(k) => match k.server_version() {
            Ok(v) => {
                let from = format!(
                    "the API server, GET /version, credentials from {}",
                    k.source
                );
                log::info!("Kubernetes version {v} (from {from})");
                return runtime::checked_version(v, &from);
            }
            Err(e) => log::warn!("API server version unavailable: {e}"),
        },
        None => log::info!(
            "no kubeconfig at {}: not asking the API server",
            root.show(&a.kubeconfig)
        ),
    }
    runtime::kubelet_env_version(root, &a.installer_kubelet_env)?.ok_or_else(|| {
        Error::failed(format!(
            "unable to determine the cluster version: API server unavailable and {} does not exist",
            root.show(&a.installer_kubelet_env)
        ))
    })
}

fn runtime_versions(root: &Root, a: &Bootstrap, kube: Option<&Kube>, k8s: &str) -> Result<Wanted> {
    let from_api = kube.map(|k| k.configmap_key(MAPPINGS_NS, MAPPINGS_CM, MAPPINGS_KEY));
    let mappings = match from_api {
        // Data the API gave us that does not parse is an error, not a reason to use older data.
        Some(Ok(text)) => Mappings::parse(
            &text,
            &format!("ConfigMap {MAPPINGS_NS}/{MAPPINGS_CM} key {MAPPINGS_KEY}"),
        )?,
        other => {
            if let Some(Err(e)) = other {
                log::warn!("runtime mappings from the API unavailable: {e}");
            }
            let name = root.show(&a.version_manifest);
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
            log::warn!("--upgrade-os with --root {}: the update_engine asked is the one on this system bus", root.show("/"));
        }
        log::info!(
            "asking update_engine for an OS update (AttemptUpdate), waiting up to {}s",
            a.update_timeout
        );
        dbus::attempt_update(
            Duration::from_secs(a.update_timeout),
            Duration::from_secs(5),
        )?
    } else {
        dbus::update_status()?
    };
    match &u {
        Update::Unavailable(why) => {
            log::info!("no pending OS update: update_engine is not on the system bus ({why})")
        }
        Update::Pending(v) => log::info!("OS update to {v} pending a reboot (from update_engine)"),
        Update::PendingUnknown => log::warn!(
            "OS update pending a reboot, but update_engine does not say to which version"
        ),
        Update::None(op) => log::info!("no pending OS update (update_engine status {op})"),
    }
    Ok(u)
}

/// Write kubelet.env last; `Some` once it is in place (not in a dry run or without a path).
fn write_kubelet_env<'a>(
    root: &'a Root,
    a: &'a Bootstrap,
    k8s: &str,
) -> Result<Option<Marker<'a>>> {
    if a.kubelet_env_path.is_empty() {
        log::info!("--kubelet-env-path is empty: not writing kubelet.env");
        return Ok(None);
    }
    let name = root.show(&a.installer_kubelet_env);
    let text = root.read_text(&a.installer_kubelet_env)?.ok_or_else(|| {
        Error::failed(format!(
            "{name} does not exist: it is the template for kubelet.env"
        ))
    })?;
    let mut env = EnvFile::parse(&text, &name)?;
    env.set("KUBELET_IMAGE_TAG", &k8s.replace('+', "_"));
    let out = root.show(&a.kubelet_env_path);
    if a.dry_run {
        crate::outln!("plan: write {out}:\n{}", env.render().trim_end())?;
        return Ok(None);
    }
    let marker = Marker {
        root,
        path: &a.kubelet_env_path,
    };
    let (dir, file) = root.parent_of(&a.kubelet_env_path)?;
    let mut t = dir.create_temp(&file, 0o644)?;
    t.write_all(env.render().as_bytes())
        .map_err(|e| Error::failed(format!("writing {out}: {e}")))?;
    match t.persist_steps() {
        Ok(()) => {}
        Err((Persist::NotRenamed, e)) => return Err(e),
        // Visible but perhaps not durable: a done marker that may vanish or survive a crash
        // at random is no marker at all.
        Err((Persist::Renamed, e)) => return Err(marker.take_back(e)),
    }
    log::info!("wrote {out} (from {name}, KUBELET_IMAGE_TAG for {k8s})");
    Ok(Some(marker))
}

pub fn reboot_reasons(
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
pub fn runtime_changes(applied: Option<&Option<String>>, chosen: Option<&str>) -> bool {
    matches!((applied, chosen), (Some(a), Some(c)) if a.as_deref() != Some(c))
}

/// Install the docker cleanup unit in /run and make systemd load it (only on the system we run
/// on: another root's systemd is not ours to reload).
fn install_cleanup(root: &Root, dry_run: bool) -> Result<()> {
    if dry_run {
        crate::outln!(
            "plan: install {} to wipe /var/lib/docker at shutdown",
            store::CLEANUP_UNIT
        )?;
        return Ok(());
    }
    store::install_cleanup_unit(root)?;
    log::info!(
        "installed {} in {}: /var/lib/docker is wiped at shutdown (docker cannot downgrade its data)",
        store::CLEANUP_UNIT,
        root.show("/run/systemd/system")
    );
    if root.is_host() {
        dbus::systemd_reload()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::DEFAULT_MANIFEST_URL;

    #[test]
    fn url_templates() {
        assert_eq!(
            options::ManifestUrl::parse(DEFAULT_MANIFEST_URL).unwrap().render("amd64-usr", "1632.3.0").unwrap(),
            "https://tectonic-torcx.release.core-os.net/manifests/amd64-usr/1632.3.0/torcx_manifest.json"
        );
        assert_eq!(
            options::ManifestUrl::parse("https://h/${COREOS_BOARD}/${VERSION_ID}/m.json")
                .unwrap()
                .render("arm64-usr", "1.2.3")
                .unwrap(),
            "https://h/arm64-usr/1.2.3/m.json"
        );
        assert!(options::ManifestUrl::parse("https://h/{{.Channel}}/m.json").is_err());
        assert!(options::ManifestUrl::parse("file:///m.json").is_err());
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
