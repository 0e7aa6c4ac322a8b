//! `nodestrap hook`: tectonic-torcx's pre-reboot hook for the update operator (docs/hook.md),
//! run in the cluster as a DaemonSet on nodes about to reboot into a new OS version. It
//! stages the runtime for that version with bootstrap's own code, drops stores of older OS
//! versions, and annotates the Node. It never updates the OS, writes kubelet.env, reboots,
//! or wipes the runtime's data; any failure means exit 1 and no annotation, which stalls the
//! operator at this node (the intended way to halt a rollout).

use std::path::Path;
use std::time::Duration;

use crate::cli::check::check_common;
use crate::cli::Hook;
use crate::error::{Error, Result};
use crate::net::cluster;
use crate::net::kube::api_client;
use crate::net::names::{check_key, node_name};
use crate::node::dbus::{self, Update};
use crate::node::mappings::Mappings;
use crate::node::root::Root;
use crate::node::signals;
use crate::node::undo::Undo;
use crate::torcx::layout::Layout;
use crate::torcx::runtime::{self, Manifests, OsInfo, Stage, OS_RELEASE, RUNTIME};
use crate::torcx::store;

/// The node's own kubelet.env: the only source of the Kubernetes version here (asking the API
/// server raced the version operator, tectonic-torcx commit 8530cae).
const KUBELET_ENV: &str = "/etc/kubernetes/kubelet.env";

pub fn run(a: &Hook) -> Result<()> {
    // 0. Options (exit 2), then keyring, HTTP client and API client.
    let n = open(a)?;
    // 1. OS version and board.
    let os = os_info(&n.root)?;
    // 2. Kubernetes version: the node's kubelet.env only.
    let k8s = kube_version(&n.root)?;
    // 3. Runtime mappings: the mounted ConfigMap only.
    let wanted = wanted(a, &n.pod, &k8s)?;
    // 4. Next OS version: GetStatus only, never AttemptUpdate.
    let next = next_os()?;
    // 5. Stage into the next version's store (and the current one's), point the profile at it,
    //    where torcx will look; 6. annotate the Node. Every change goes through the undo log: a
    //    hook that fails (the annotation refused, say) leaves the node as it was.
    let layout = layout(&n.root)?;
    let chosen = stage_and_annotate(a, &n, &layout, &os, next.as_deref(), &wanted)?;
    // 7. GC, only once the node is annotated and the next version is known: stores older than
    //    the current OS. Nothing reads them any more, so a store that cannot go is a warning.
    gc(&n.root, &layout, &os, next.as_deref());
    // 8. Summary. The annotation is set: a stdout that went away is logged, not a failure.
    summary(a, &k8s, chosen.as_deref(), next.as_deref());
    // 9. Stay up so the DaemonSet does not restart us; the operator removes its label (and
    //    so this pod) once the node may reboot.
    idle(a);
    Ok(())
}

/// Step 0's result: what the hook works with.
struct Opened {
    node: crate::net::names::NodeName,
    template: crate::cli::check::ManifestUrl,
    /// The pod's own root: kubeconfig and mappings are read through it.
    pod: Root,
    /// The node's root.
    root: Root,
    keyring: Option<crate::crypto::openpgp::Keyring>,
    http: crate::net::fetch::Http,
    kube: crate::net::kube::Kube,
}

/// Step 0: the options (exit 2), then keyring, HTTP client and API client.
fn open(a: &Hook) -> Result<Opened> {
    let node = node_name(
        a.node_name.as_deref(),
        std::env::var("NODE").ok().as_deref(),
    )?;
    check_key("--node-annotation", &a.node_annotation)?;
    let template = check_common(&a.common())?;
    crate::cli::check_image_max(a.image_max_mib)?;
    for (flag, p) in [
        ("--kubeconfig", a.kubeconfig.as_deref()),
        ("--version-manifest", Some(a.version_manifest.as_path())),
    ] {
        if let Some(p) = p.filter(|p| !p.is_absolute()) {
            return Err(Error::config(format!(
                "{flag} {}: expected an absolute path",
                p.display()
            )));
        }
    }
    // Pod paths (kubeconfig, mappings) are read through the pod's own root, with the same
    // no-escape resolution as node paths.
    let pod = Root::open(Path::new("/"))?;
    let root = Root::open(&a.root)?;
    crate::node::temps::sweep(&root);
    let keyring = a.common().keyring(&pod)?;
    let http = a.common().http(&root)?;
    let kube = api_client(a.kubeconfig.as_deref(), &pod, a.common().api_retry())?;

    Ok(Opened {
        node,
        template,
        pod,
        root,
        keyring,
        http,
        kube,
    })
}

/// Step 1: the node's OS version and board.
fn os_info(root: &Root) -> Result<OsInfo> {
    let os = OsInfo::read(root)?;
    crate::info!(
        "OS version {} board {} (from {})",
        os.version,
        os.board,
        root.show(OS_RELEASE)
    );

    Ok(os)
}

/// Step 2: the Kubernetes version, from the node's kubelet.env only.
fn kube_version(root: &Root) -> Result<String> {
    let k8s = cluster::kubelet_env_version(root, KUBELET_ENV)?.ok_or_else(|| {
        Error::failed(format!(
            "unable to determine the cluster version: {} does not exist (the hook reads it only from there)",
            root.show(KUBELET_ENV)
        ))
    })?;
    crate::info!(
        "Kubernetes version {k8s} (from KUBELET_IMAGE_TAG in {})",
        root.show(KUBELET_ENV)
    );

    Ok(k8s)
}

/// Step 3: the runtime versions the mounted mappings give for `k8s`.
fn wanted(a: &Hook, pod: &Root, k8s: &str) -> Result<runtime::Wanted> {
    let path = a.version_manifest.to_string_lossy();
    let text = pod
        .read_text(&path)?
        .ok_or_else(|| Error::failed(format!("runtime mappings {path} do not exist")))?;
    let wanted = runtime::pick_versions(&Mappings::parse(&text, &path)?, k8s)?;

    Ok(wanted)
}

/// Step 4: the OS version update_engine has pending, if any.
fn next_os() -> Result<Option<String>> {
    let next = match dbus::update_status()? {
        Update::Pending(v) => {
            crate::info!("OS update to {v} pending a reboot (from update_engine)");
            Some(v)
        }
        // Staging for "some version" is impossible, and annotating would let the node reboot
        // into an OS whose runtime is missing.
        Update::PendingUnknown => {
            return Err(Error::failed(
                "an OS update is pending a reboot but update_engine does not say to which version; nothing can be staged for it",
            ))
        }
        Update::None(op) => {
            crate::info!("no pending OS update (update_engine status {op})");
            None
        }
        // The operator labels a node only once its agent saw an update ready: an update_engine
        // that cannot be asked is not "no update", and annotating would let the node reboot
        // into an OS whose runtime was never staged.
        Update::Unavailable(why) => {
            return Err(Error::failed(format!(
                "update_engine cannot be asked for the pending OS version ({why}); not annotating"
            )))
        }
    };

    Ok(next)
}

/// Step 5's start: where torcx keeps stores and profiles on this node.
fn layout(root: &Root) -> Result<Layout> {
    let layout = Layout::read(root)?;
    crate::info!(
        "torcx stores under {}, profiles in {} (from {})",
        layout.store_root(),
        layout.profiles_dir(),
        layout.source
    );
    Ok(layout)
}

/// Steps 5 and 6 under one undo log: the runtime staged, then the Node annotated; the version
/// chosen, if the profile changed.
fn stage_and_annotate(
    a: &Hook,
    n: &Opened,
    layout: &Layout,
    os: &OsInfo,
    next: Option<&str>,
    wanted: &runtime::Wanted,
) -> Result<Option<String>> {
    let (root, node, kube) = (&n.root, &n.node, &n.kube);
    let (template, keyring, http) = (&n.template, &n.keyring, &n.http);
    let registry = a.common().registry(root, http)?;
    let m = Manifests {
        registry: &registry,
        template,
        board: &os.board,
        keyring: keyring.as_ref(),
    };
    let st = Stage {
        layout,
        current: &os.version,
        next,
        profile_default: &a.torcx_profile,
        cap: a.image_max_bytes(),
        downgrades: &[],
        dry_run: false,
    };
    let mut undo = Undo::new(root);
    let staged = runtime::stage_runtime(root, &m, &st, wanted, &mut undo).and_then(|chosen| {
        // 6. Annotate the Node.
        let patch = serde_json::json!({"metadata": {"annotations": {&a.node_annotation: "true"}}});
        let got = kube.patch_node(node, &patch)?;
        if got["metadata"]["annotations"][&a.node_annotation] != "true" {
            crate::warn!("the API server's answer does not show the annotation");
        }
        crate::info!(
            "Node {node}: annotation {}=true set (credentials from {})",
            a.node_annotation,
            kube.source
        );
        Ok(chosen)
    });
    match staged {
        Ok(c) => {
            undo.commit();
            Ok(c)
        }
        Err(e) => Err(undo.undo(e)),
    }
}

/// Step 7: stores older than the current OS removed, once the next version is known.
fn gc(root: &Root, layout: &Layout, os: &OsInfo, next: Option<&str>) {
    match next {
        Some(next) => match store::gc_stores(root, layout, &os.version, next) {
            Ok(done) => {
                for (store, e) in &done.skipped {
                    crate::warn!("old torcx store {store} not removed, skipped: {e}");
                }
                if done.removed.is_empty() {
                    crate::info!("no torcx store older than OS {} removed", os.version)
                } else {
                    crate::info!(
                        "removed torcx stores older than OS {}: {}",
                        os.version,
                        done.removed.join(", ")
                    )
                }
            }
            Err(e) => crate::warn!("removing old torcx stores: {e}"),
        },
        None => crate::info!("next OS version unknown: old torcx stores kept"),
    }
}

/// Step 8: the summary line.
fn summary(a: &Hook, k8s: &str, chosen: Option<&str>, next: Option<&str>) {
    if let Err(e) = crate::outln!(
        "nodestrap: hook done k8s={k8s} {RUNTIME}={} next-os={} annotated={}",
        chosen.unwrap_or("unchanged"),
        next.unwrap_or("none"),
        a.node_annotation
    ) {
        crate::warn!("{e}");
    }
}

/// Step 9: with `--sleep`, idle until SIGTERM.
fn idle(a: &Hook) {
    if a.sleep > 0 {
        // The run is done: its record says so now, not when the pod is stopped.
        crate::node::status::finish(0, None);
        signals::exit_on_sigterm();
        crate::info!("done; idle until SIGTERM");
        loop {
            std::thread::sleep(Duration::from_secs(a.sleep));
        }
    }
}
