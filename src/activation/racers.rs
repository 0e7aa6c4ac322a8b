//! What activate's two racers share: their context (options, inputs, the node lock, the stop
//! flag), how each one ends, and the files both hand to kubeadm.

use std::sync::Arc;

use rustls::{ClientConfig, ServerConfig};

use crate::activation::exchange::Endpoint;
use crate::activation::images::Images;
use crate::activation::init_secret::SecretHash;
use crate::activation::kubeadm::{self, ImageNames};
use crate::activation::mtls;
use crate::activation::nodelock::{NodeLock, Role};
use crate::cli::Activate;
use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::signals::Stop;

const MANIFESTS: &str = "/etc/kubernetes/manifests";
pub(super) const PKI: &str = "/etc/kubernetes/pki";

/// What one racer ended with. Errors are only the fatal ones, after the node lock.
pub(super) enum Side {
    /// This side holds the node: its role, the way it got it (`init`, `join`), the cluster.
    Won {
        role: Role,
        via: &'static str,
        cluster: String,
    },
    Lost,
    Stopped,
}

/// Everything both racers share, loaded and checked before the first connection.
pub(super) struct Ctx<'a> {
    pub(super) a: &'a Activate,
    pub(super) root: &'a Root,
    pub(super) lock: NodeLock<'a>,
    pub(super) stop: Stop,
    pub(super) secret: SecretHash,
    pub(super) server: Arc<ServerConfig>,
    pub(super) client: Arc<ClientConfig>,
    /// SPKI hash of the pinned cluster CA.
    pub(super) pinned: String,
    pub(super) endpoints: Vec<Endpoint>,
    /// --images: where the images kubeadm runs come from.
    pub(super) images: Option<Images<'a>>,
    /// What kubeadm is to call those images, and the addons it leaves out.
    pub(super) names: ImageNames,
}

impl<'a> Ctx<'a> {
    pub(super) fn load(
        a: &'a Activate,
        root: &'a Root,
        endpoints: Vec<Endpoint>,
        names: ImageNames,
    ) -> Result<Ctx<'a>> {
        let show = |p: &str| root.show(p);
        let id = mtls::load_identity(
            root,
            ("--identity-cert", &a.identity_cert),
            ("--identity-key", &a.identity_key),
        )?;
        let admin_ca = mtls::load_certs(root, "--admin-ca", &a.admin_ca)?;
        let cluster_ca = mtls::load_certs(root, "--cluster-ca", &a.cluster_ca)?;
        let pinned = crate::crypto::x509::spki_sha256(&cluster_ca[0]).ok_or_else(|| {
            Error::config(format!(
                "{}: certificate does not parse",
                show(&a.cluster_ca)
            ))
        })?;
        let hash_text = mtls::read_pem(root, "--init-secret-hash", &a.init_secret_hash)?;
        let secret = SecretHash::parse(
            &String::from_utf8_lossy(&hash_text),
            &show(&a.init_secret_hash),
        )?;
        let me = mtls::peer(&id.chain[0]).ok_or_else(|| {
            Error::config(format!(
                "{}: certificate does not parse",
                show(&a.identity_cert)
            ))
        })?;
        crate::info!(
            "node identity {} ({}) from {}",
            me.cn,
            me.spki,
            show(&a.identity_cert)
        );
        crate::info!("cluster CA pinned from {}: {pinned}", show(&a.cluster_ca));
        Ok(Ctx {
            server: mtls::server_config(&id, &admin_ca, &show(&a.identity_cert))?,
            client: mtls::client_config(&cluster_ca, &id, &show(&a.identity_cert))?,
            a,
            root,
            lock: NodeLock::new(root),
            stop: Stop::default(),
            secret,
            pinned,
            endpoints,
            images: match &a.images {
                Some(dir) => Some(Images {
                    root,
                    dir,
                    ctr: kubeadm::argv(&a.ctr, "--ctr")?,
                    kubeadm: &a.kubeadm,
                }),
                None => None,
            },
            names,
        })
    }

    /// Past the lock: record `reset`, stop the other side, hand the error on.
    pub(super) fn fatal(&self, e: Error) -> Error {
        if let Err(r) = self.lock.reset(&e.to_string()) {
            crate::error!("could not record the reset: {r}");
        }
        self.stop.request();
        e
    }
}

/// Remove a file we wrote for kubeadm; failing that, say so (`what` it holds) and go on.
pub(super) fn remove_or_warn(root: &Root, node_path: &str, what: &str) {
    if let Err(e) = root.remove(node_path) {
        crate::warn!(
            "{}: could not remove it, and it holds {what}: {e}",
            root.show(node_path)
        );
    }
}

/// An empty manifests folder: what a previous attempt left must not confuse kubeadm.
pub(super) fn reset_manifests(root: &Root) -> Result<()> {
    let parent = root.make_dir("/etc/kubernetes")?;
    if parent.remove_dir_tree("manifests")? {
        crate::info!("emptied {}", root.show(MANIFESTS));
    }
    root.make_dir(MANIFESTS)?;
    Ok(())
}
