//! The images kubeadm runs, from archives on the node (`activate --images`): imported into
//! containerd's `k8s.io` namespace, the one its CRI plugin serves to the kubelet and kubeadm,
//! and checked against the list kubeadm itself prints for the version it will set up. Nothing is
//! pulled: an image that is neither in containerd nor in an archive stops the init before
//! kubeadm runs, named, and the node stays fresh.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::activation::kubeadm;
use crate::error::{Error, Result};
use crate::node::dir::Dir;
use crate::node::root::Root;

/// containerd's namespace for Kubernetes (its CRI plugin's).
const NAMESPACE: &str = "k8s.io";
/// One archive's import: a control-plane image is tens of MB, read from the node's disk.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(300);
/// Listing images, or asking kubeadm for its list.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// Archives one folder may hold: a control plane is seven images.
const MAX_ARCHIVES: usize = 64;

/// Where the images come from and how containerd is reached.
pub(crate) struct Images<'a> {
    pub(crate) root: &'a Root,
    /// The folder of OCI or Docker image archives (`*.tar`), a node path.
    pub(crate) dir: &'a str,
    /// `ctr` and its global options (`--address …`), split on white space.
    pub(crate) ctr: Vec<String>,
    pub(crate) kubeadm: &'a str,
}

impl Images<'_> {
    /// Imports every `*.tar` of the folder, in name order; an archive containerd refuses is an
    /// error naming it. containerd keeps what it already has: importing again changes nothing.
    pub(crate) fn import(&self) -> Result<usize> {
        let (dir, names) = self.archives()?;
        for name in &names {
            let shown = dir.show(name);
            let mut argv = self.ctr.clone();
            argv.extend(["-n", NAMESPACE, "images", "import"].map(String::from));
            argv.push(dir.host_path(name)?.display().to_string());
            let what =
                format!("{shown}: `ctr images import` into containerd's {NAMESPACE} namespace");
            kubeadm::succeeded(&argv, IMPORT_TIMEOUT, &what)?;
            crate::info!("imported {shown} into containerd's {NAMESPACE} namespace");
        }
        Ok(names.len())
    }

    /// The folder and its archives' names, sorted; a folder that is not there is an error.
    fn archives(&self) -> Result<(Dir, Vec<String>)> {
        let shown = self.root.show(self.dir);
        let dir = self
            .root
            .dir(self.dir)?
            .ok_or_else(|| Error::config(format!("--images {shown}: no such folder")))?;
        let names: Vec<String> = dir
            .entries()?
            .into_iter()
            .filter(|n| n.ends_with(".tar"))
            .collect();
        if names.len() > MAX_ARCHIVES {
            return Err(Error::config(format!(
                "--images {shown}: {} archives, more than {MAX_ARCHIVES}",
                names.len()
            )));
        }
        Ok((dir, names))
    }

    /// The image names containerd holds for Kubernetes (`ctr -n k8s.io images ls -q`), without
    /// the digests it lists beside them.
    fn present(&self) -> Result<BTreeSet<String>> {
        let mut argv = self.ctr.clone();
        argv.extend(["-n", NAMESPACE, "images", "ls", "-q"].map(String::from));
        let out = kubeadm::succeeded(
            &argv,
            LIST_TIMEOUT,
            &format!("`ctr -n {NAMESPACE} images ls`"),
        )?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("sha256:"))
            .map(str::to_string)
            .collect())
    }

    /// What `kubeadm init` will run under `config` (a node path), as kubeadm says (`kubeadm
    /// config images list --config`): the version, the repository, etcd's tag and the addons
    /// are the config's.
    fn needed(&self, config: &str, version: &str) -> Result<Vec<String>> {
        // One program, as for init and join.
        let mut argv = [self.kubeadm, "config", "images", "list", "--config"]
            .map(String::from)
            .to_vec();
        argv.push(self.root.show(config));
        let what = format!("kubeadm config images list for {version}");
        let out = kubeadm::succeeded(&argv, LIST_TIMEOUT, &what)?;
        let v: Vec<String> = String::from_utf8_lossy(&out)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        if v.is_empty() {
            return Err(Error::failed(format!("{what}: no image named")));
        }
        Ok(v)
    }

    /// Every image `kubeadm init` needs under `config` (for `version`) is in containerd; when
    /// one is not, the folder is imported once more (an archive may have come since) and looked
    /// at again.
    pub(crate) fn ready_for_init(&self, config: &str, version: &str) -> Result<()> {
        let needed = self.needed(config, version)?;
        let mut lacking = missing(&needed, &self.present()?);
        if !lacking.is_empty() {
            self.import()?;
            lacking = missing(&lacking, &self.present()?);
        }
        if !lacking.is_empty() {
            return Err(Error::failed(format!(
                "kubeadm init for {version} needs {}, which neither containerd's {NAMESPACE} namespace nor --images {} holds; nodestrap pulls nothing",
                lacking.join(", "),
                self.root.show(self.dir)
            )));
        }
        crate::info!(
            "kubeadm init for {version} needs {} images (kubeadm config images list), all in containerd's {NAMESPACE} namespace",
            needed.len()
        );
        Ok(())
    }
}

fn missing(needed: &[String], present: &BTreeSet<String>) -> Vec<String> {
    needed
        .iter()
        .filter(|n| !present.contains(*n))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keeps_kubeadms_order() {
        let present: BTreeSet<String> = ["registry.k8s.io/pause:3.10.2".to_string()].into();
        let needed = vec![
            "registry.k8s.io/kube-apiserver:v1.37.2".to_string(),
            "registry.k8s.io/pause:3.10.2".to_string(),
            "registry.k8s.io/etcd:3.7.0-0".to_string(),
        ];
        assert_eq!(
            missing(&needed, &present),
            vec![
                "registry.k8s.io/kube-apiserver:v1.37.2".to_string(),
                "registry.k8s.io/etcd:3.7.0-0".to_string()
            ]
        );
    }
}
