//! The cluster's Kubernetes version, from the same sources for every payload family: a forced
//! version, else the API server's `/version` through the kubeconfig, else `KUBELET_IMAGE_TAG` in
//! the installer's kubelet.env (docs/bootstrap.md, step 2).

use crate::error::{Error, Result};
use crate::net::kube::Kube;
use crate::node::envfile::EnvFile;
use crate::node::root::Root;

/// Where the version may come from, in order.
pub struct Sources<'a> {
    /// `--force-kube-version`.
    pub forced: Option<&'a str>,
    /// The API server, when a kubeconfig exists.
    pub kube: Option<&'a Kube>,
    /// `--kubeconfig`, named when it does not exist.
    pub kubeconfig: &'a str,
    /// `--installer-kubelet-env`.
    pub installer_env: &'a str,
}

/// The cluster's version, with one log line saying where it came from.
pub fn version(root: &Root, s: &Sources) -> Result<String> {
    if let Some(v) = s.forced {
        log::info!("Kubernetes version {v} (from --force-kube-version)");
        return Ok(v.to_string());
    }
    match s.kube {
        Some(k) => match k.server_version() {
            Ok(v) => {
                let from = format!(
                    "the API server, GET /version, credentials from {}",
                    k.source
                );
                log::info!("Kubernetes version {v} (from {from})");
                return checked_version(v, &from);
            }
            Err(e) => log::warn!("API server version unavailable: {e}"),
        },
        None => log::info!(
            "no kubeconfig at {}: not asking the API server",
            root.show(s.kubeconfig)
        ),
    }
    kubelet_env_version(root, s.installer_env)?.ok_or_else(|| {
        Error::failed(format!(
            "unable to determine the cluster version: API server unavailable and {} does not exist",
            root.show(s.installer_env)
        ))
    })
}

/// The Kubernetes version a kubelet.env names (`KUBELET_IMAGE_TAG`); `None` if it does not exist.
pub fn kubelet_env_version(root: &Root, node_path: &str) -> Result<Option<String>> {
    let name = root.show(node_path);
    let Some(text) = root.read_text(node_path)? else {
        return Ok(None);
    };
    let env = EnvFile::parse(&text, &name)?;
    let tag = env
        .get("KUBELET_IMAGE_TAG")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Error::failed(format!(
                "unable to determine the cluster version: {name} has no KUBELET_IMAGE_TAG"
            ))
        })?;
    // Docker tags cannot hold '+', so the installer wrote '_'.
    let v = tag.replace('_', "+");
    log::info!("Kubernetes version {v} (from KUBELET_IMAGE_TAG in {name})");
    checked_version(v, &format!("KUBELET_IMAGE_TAG in {name}")).map(Some)
}

/// A version the mappings can be looked up by (`v1.10.2+coreos.0`), or an error naming its source.
pub fn checked_version(v: String, from: &str) -> Result<String> {
    match crate::node::mappings::major_minor(&v) {
        Some(_) => Ok(v),
        None => Err(Error::failed(format!(
            "Kubernetes version {v:?} from {from} is not a version like v1.10.2"
        ))),
    }
}
