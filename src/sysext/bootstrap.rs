//! `nodestrap bootstrap --payload sysext`: the Kubernetes image for the cluster's version and a
//! container runtime image, verified, staged in Flatcar's layout, and merged (on the running
//! system) or left for the real root's systemd-sysext to merge at boot (from the initramfs).
//! kubelet.env, the done marker, comes last (docs/bootstrap.md, "sysext"). Steps 3 to 5 and 11
//! are sysext::plan's, steps 6 to 10 sysext::apply's.

use crate::cli::check::{check_options, SysextUrl};
use crate::cli::Bootstrap;
use crate::crypto::pkcs7::Cert;
use crate::error::{Error, Result};
use crate::net::cluster;
use crate::node::root::Root;
use crate::node::state_file::StateFile;
use crate::node::status;
use crate::node::undo::Undo;
use crate::sysext::apply::Apply;
use crate::sysext::choose;
use crate::sysext::host::Host;
use crate::sysext::known_good::KnownGood;
use crate::sysext::lists::Lists;
use crate::sysext::merge;
use crate::sysext::plan::Plan;
use crate::sysext::rollout::Rollout;
use crate::sysext::source::Source;
use crate::sysext::sums::Version;
use crate::sysext::trust::Trust;

/// `nodestrap bootstrap` with `--sysext-url`: its numbered steps (docs/bootstrap.md), one function
/// each.
pub fn run(a: &Bootstrap) -> Result<()> {
    // 0. Everything that can be checked without the node or the network: exit 2 if wrong.
    let root = Root::open(&a.root)?;
    check_options(a)?;
    let url = SysextUrl::parse(&a.sysext_url)?;
    // Before anything is read: a run that cannot mount says so first (a dry run mounts nothing).
    if !a.dry_run {
        crate::node::privilege::require(
            crate::node::privilege::Cap::SysAdmin,
            "bootstrap --payload sysext",
            "to mount each image read-only and check it as systemd-sysext will",
        )?;
    }
    let common = a.common();
    let keyring = common.keyring(&root)?;
    let http = common.http(&root)?;
    let source = Source::new(&http, common.registry(&root, &http)?);
    // Before anything checks a certificate or a signature.
    crate::node::clock::check(&root, std::time::Duration::from_secs(a.clock_wait))?;
    // 1. The node as systemd-sysext sees it, what earlier boots proved, and who vouches.
    let node = NodeFacts::read(&root, a)?;
    // 2. The cluster's version, from the same sources as the torcx payload.
    let (version, want, rollout) = cluster_version(&root, a)?;
    //    The minor this node may take: the one it runs, unless --kube-minor moves it.
    let (k8s, want) = node_minor(&root, a, &version, want)?;
    // 3-4. Choose: Kubernetes by that version, the runtime by the mappings.
    let downgrades = crate::cli::check::downgrades(&a.allow_downgrade)?;
    let lists = Lists {
        source: &source,
        url: &url,
        keyring: keyring.as_ref(),
        arch: node.host.arch,
        known: &node.known,
        downgrades: &downgrades,
        read: Default::default(),
        seen: Default::default(),
    };
    let plan = Plan::choose(&root, a, &k8s, want, &lists)?;
    //    The fleet's rollout setting, before anything changes.
    if let Some(why) = plan.held(&root, &rollout)? {
        return plan.hold(&root, &version, &why);
    }
    plan.record();
    // 5. The plan, for --dry-run.
    if a.dry_run {
        return plan.print(&root, a, &version);
    }
    // 6-11 change the node: every change goes through the undo log, so that a failure puts the
    //    node back as it was (links, images added, old sysupdate files, versions pruned,
    //    kubelet.env, and the merge), and a success deletes only what it set aside.
    let mut undo = Undo::new(&root);
    let run = Apply {
        root: &root,
        a,
        source: &source,
        host: &node.host,
        steps: &plan.steps,
        itself: plan.itself.as_ref(),
        known: &node.known,
        trust: &node.trust,
        live: root.is_host(),
    };
    let applied = run.apply(&mut undo).and_then(|applied| {
        lists
            .remember(&root, &plan.staged(), &mut undo)
            .map(|()| applied)
    });
    let restart =
        match applied.and_then(|applied| plan.finish(&root, a, &version, applied, &mut undo)) {
            Ok(restart) => restart,
            Err(e) => return Err(undo.undo(e)),
        };
    undo.commit();
    merge::restart_changed(&restart)
}

/// Step 1: what the run knows of the node before it asks anyone.
struct NodeFacts {
    host: Host,
    /// What earlier boots proved: images never to stage again, and the set to keep.
    known: KnownGood,
    trust: Trust,
}

impl NodeFacts {
    fn read(root: &Root, a: &Bootstrap) -> Result<Self> {
        let host = Host::read(root)?;
        crate::info!(
            "node ID={} VERSION_ID={} SYSEXT_LEVEL={} architecture {} (from {})",
            host.id,
            host.version_id.as_deref().unwrap_or("(none)"),
            host.sysext_level.as_deref().unwrap_or("(none)"),
            host.arch,
            host.source
        );
        let known = KnownGood::load(root)?;
        // Who vouches for the images on the disk; a node that cannot merge signed images is
        // refused here, before anything is staged.
        let trust = load_trust(root, a)?;
        trust.check_node(root)?;
        Ok(NodeFacts { host, known, trust })
    }
}

/// Step 2: the cluster's version, and how exactly the Kubernetes image must match it.
fn cluster_version(
    root: &Root,
    a: &Bootstrap,
) -> Result<(cluster::Version, choose::Want, Rollout)> {
    let common = a.common();
    let kube = if a.force_kube_version.is_some() {
        None
    } else {
        cluster::joined(root, a.joined_kubeconfigs(), common.api_retry())?
    };
    let before_join = a.before_join();
    let joining = if kube.is_none() && a.force_kube_version.is_none() {
        cluster::before_join(root, &before_join, common.api_retry(), || common.tls(root))?
    } else {
        None
    };
    let version = cluster::version(
        root,
        &a.version_sources(kube.as_ref(), joining.as_ref(), &before_join),
    )?;
    let want = match version.source {
        cluster::Source::Forced if crate::node::mappings::is_minor_only(&version.value) => {
            choose::Want::Minor
        }
        cluster::Source::Forced => choose::Want::Patch,
        _ => choose::Want::Cluster,
    };
    // A node already bootstrapped reads the fleet's rollout setting with the same client; the
    // API server is not asked again: its idle connection goes as this returns (see the torcx
    // payload).
    let bootstrapped = !a.kubelet_env_path.is_empty() && root.exists(&a.kubelet_env_path);
    let rollout = match &kube {
        Some(k) if bootstrapped => Rollout::read(k)?,
        Some(_) => Rollout::Open("a first bootstrap".into()),
        None => Rollout::Open(format!(
            "not asked: the version came from {}",
            version.source.word()
        )),
    };
    if let Rollout::Unread(why) = &rollout {
        crate::warn!(
            "rollout setting unread, going on without it: {why} (apply deploy/rollout.yaml so that nodes may read it)"
        );
    }
    Ok((version, want, rollout))
}

/// Step 2, its end: a node that has been bootstrapped (kubelet.env names its kubelet) stays at
/// its minor, taking patches only, when the cluster has moved on: a new minor is the operator's
/// act, after draining the node, as kubeadm's own upgrade order has it (`--kube-minor`).
/// Returns the version to choose by and how exactly.
fn node_minor(
    root: &Root,
    a: &Bootstrap,
    version: &cluster::Version,
    want: choose::Want,
) -> Result<(String, choose::Want)> {
    let minor = |v: &str| crate::node::mappings::minor_of(v).and_then(|m| Version::parse(&m));
    if version.source == cluster::Source::Forced {
        return Ok((version.value.clone(), want));
    }
    let Some(cluster_minor) = minor(&version.value) else {
        return Ok((version.value.clone(), want));
    };
    let env = root.show(&a.kubelet_env_path);
    let running = match a.kubelet_env_path.is_empty() {
        true => None,
        false => match root.read_text(&a.kubelet_env_path)? {
            Some(text) => crate::node::envfile::EnvFile::parse(&text, &env)?
                .get("KUBELET_VERSION")
                .and_then(minor),
            None => None,
        },
    };
    // --kube-minor's form was checked with the other options (cli::check).
    let (target, from) = match (a.kube_minor.as_deref().and_then(minor), running.clone()) {
        (Some(m), _) => (m, "--kube-minor".to_string()),
        (None, Some(r)) => (r, format!("the minor it runs, KUBELET_VERSION in {env}")),
        // A first bootstrap joins at the cluster's minor.
        (None, None) => return Ok((version.value.clone(), want)),
    };
    if target > cluster_minor {
        if a.kube_minor.is_some() {
            return Err(Error::config(format!(
                "--kube-minor v{target} is newer than the cluster's {}: a kubelet is never newer than its API server",
                version.value
            )));
        }
        return Ok((version.value.clone(), want));
    }
    if let Some(r) = running.filter(|r| *r != target) {
        crate::info!("moving this node from v{r} to v{target} ({from})");
    }
    status::decide("kube-minor", format_args!("v{target}"), &from);
    if target == cluster_minor {
        return Ok((version.value.clone(), want));
    }
    // Minors of one major: how many the node is behind.
    let behind = cluster_minor.0[1].saturating_sub(target.0[1]);
    let line = format!(
        "staying at v{target} ({from}) while the cluster is at {}: patches of v{target} only; to move this node, drain it, then run with --kube-minor v{cluster_minor} (kubeadm's order: control plane first, then each node drained)",
        version.value
    );
    if behind > 3 {
        crate::warn!(
            "{line}; v{target} is {behind} minors behind, outside the version-skew policy (3)"
        );
    } else {
        crate::info!("{line}");
    }
    Ok((format!("v{target}"), choose::Want::Minor))
}

/// `--sysext-trust` and `--sysext-verity-certs`, recorded as the `sysext-trust` decision.
fn load_trust(root: &Root, a: &Bootstrap) -> Result<Trust> {
    let (certs, from) = match &a.sysext_verity_certs {
        Some(input) => {
            let pem = input.read(root, 1 << 20, "sysext-verity-certs")?;
            let label = input.label(root);
            (
                Cert::from_pem(&pem, &label).map_err(Error::config)?,
                input.name(root, "sysext-verity-certs"),
            )
        }
        None => (Vec::new(), "no --sysext-verity-certs".to_string()),
    };
    let t = Trust {
        mode: a.sysext_trust,
        certs,
        from,
        systemd: crate::sysext::trust::systemd_version(root),
    };
    crate::info!(
        "sysext trust {}: {} certificate(s) from {}{}",
        t.mode,
        t.certs.len(),
        t.from,
        t.policy()
            .map(|p| format!(", image policy {p}"))
            .unwrap_or_default()
    );
    status::decide(
        "sysext-trust",
        format_args!("{} ({} certificate(s))", t.mode, t.certs.len()),
        &t.from,
    );
    Ok(t)
}
