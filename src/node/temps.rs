//! Every folder nodestrap writes its temp files into (`.NAME.nodestrap-<hex>`, dir.rs's
//! `temp_name`), in one list, and the one rule for them: a run of any command that writes to a
//! node sweeps, at its start, the temp files nobody holds in each of these folders that exists
//! and is writable (a live writer holds the lock of its temp file, so only a killed run's go).
//! Temp links cannot be locked: they go only where the caller holds that folder's lock
//! (`/etc/extensions`: the sysext runs and the boot check; a torcx cleanup link: `Undo::link`).
//! Where a folder comes from an option (`--kubelet-env-path`, a torcx config's store), the
//! default is listed; the command that writes elsewhere sweeps that folder itself.

use rustix::fs::FileType;

use crate::node::root::Root;

/// A folder of the node (a node path); with a trailing `/*`, each folder inside it.
pub const FOLDERS: &[&str] = &[
    // kubelet.env, kubeadm's configuration (activate), the kubelet's kubeconfig (reprovision).
    "/etc/kubernetes",
    "/etc/kubernetes/manifests",
    // The status records, known-good.json, the floors, the node lock and the ledger's files.
    "/var/lib/nodestrap",
    "/var/lib/nodestrap/reprovision",
    // This boot's status records; activate's kubeadm configurations, which hold the bootstrap
    // token: a killed write must not leave one behind.
    "/run/nodestrap",
    // sysext: the links (temp files only here), the images, nodestrap itself, trust.
    "/etc/extensions",
    "/opt/extensions/*",
    "/opt/bin",
    "/etc/verity.d",
    "/etc/systemd/sysext.conf.d",
    "/etc/systemd/system/systemd-sysext.service.d",
    // torcx: the stores of each OS version, the profiles, the next profile.
    "/var/lib/torcx/store/*",
    "/etc/torcx",
    "/etc/torcx/profiles",
    // The machine-config-daemon's files (reprovision).
    "/etc/machine-config-daemon",
];

/// Sweeps the temp files killed runs left in every folder of `FOLDERS` under `root` (never a
/// read-only one: a merged /opt, a vendor's /usr). Best effort: a folder that cannot be read is
/// logged and left for the next run.
pub(crate) fn sweep(root: &Root) {
    for f in FOLDERS {
        match f.strip_suffix("/*") {
            Some(parent) => each_inside(root, parent),
            None => one(root, f),
        }
    }
}

fn one(root: &Root, node_path: &str) {
    match root.dir(node_path) {
        Ok(Some(d)) if !d.read_only() => d.sweep_leftovers(false),
        Ok(_) => {}
        Err(e) => crate::warn!("not sweeping {}: {e}", root.show(node_path)),
    }
}

fn each_inside(root: &Root, parent: &str) {
    let dir = match root.dir(parent) {
        Ok(Some(d)) => d,
        Ok(None) => return,
        Err(e) => return crate::warn!("not sweeping {}: {e}", root.show(parent)),
    };
    let names = match dir.entries() {
        Ok(n) => n,
        Err(e) => return crate::warn!("not sweeping {}: {e}", root.show(parent)),
    };
    for n in names {
        if dir.kind_of(&n) == Some(FileType::Directory) {
            one(root, &format!("{parent}/{n}"));
        }
    }
}
