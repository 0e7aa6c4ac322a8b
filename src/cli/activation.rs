//! `nodestrap activate`, `join-service` and `init-cluster`: the init/join race's options.

use std::path::PathBuf;

use argh::FromArgs;

use super::*;

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "activate", help_triggers("-h", "--help", "help"))]
/// Activate a fresh node: initialize a cluster when an admin asks (init server) or join one
/// (join client), whichever is authenticated first, under a one-way node lock.
pub struct Activate {
    /// the node's root; every node path resolves under it (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub root: PathBuf,
    /// init server address (default 0.0.0.0:9000)
    #[argh(option, default = "\"0.0.0.0:9000\".into()")]
    pub(crate) listen: String,
    /// node identity certificate (node path): init server and join client present it
    #[argh(option, default = "\"/etc/nodestrap/activate/node.crt\".into()")]
    pub(crate) identity_cert: String,
    /// node identity key (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/node.key\".into()")]
    pub(crate) identity_key: String,
    /// CA whose client certificates may send an init request (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/admin-ca.crt\".into()")]
    pub(crate) admin_ca: String,
    /// pinned cluster CA: the join service must present a certificate from it (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/cluster-ca.crt\".into()")]
    pub(crate) cluster_ca: String,
    /// PBKDF2 hash of the init secret, pbkdf2_sha256$ROUNDS$SALT$BASE64 (node path)
    #[argh(
        option,
        default = "\"/etc/nodestrap/activate/init-secret.hash\".into()"
    )]
    pub(crate) init_secret_hash: String,
    /// join services to ask for a ticket, comma-separated https://HOST:PORT (default: none)
    #[argh(option, default = "String::new()")]
    pub(crate) join_endpoints: String,
    /// seconds between join rounds (default 30)
    #[argh(option, default = "30")]
    pub(crate) join_interval: u64,
    /// seconds each ticket call may take (default 30)
    #[argh(option, default = "30")]
    pub(crate) join_timeout: u64,
    /// kubeadm join attempts after a ticket (default 3)
    #[argh(option, default = "3")]
    pub(crate) join_attempts: u32,
    /// seconds all kubeadm join attempts may take together (default 900)
    #[argh(option, default = "900")]
    pub(crate) join_budget: u64,
    /// kubeadm program (default kubeadm, from PATH)
    #[argh(option, default = "\"kubeadm\".into()")]
    pub(crate) kubeadm: String,
    /// seconds kubeadm init may take (default 600)
    #[argh(option, default = "600")]
    pub(crate) kubeadm_timeout: u64,
    /// folder of image archives (*.tar, node path) imported into containerd's k8s.io namespace
    /// before kubeadm runs; with it, an image kubeadm init needs that containerd lacks is
    /// refused before the node lock, never pulled (default: none, kubeadm pulls)
    #[argh(option)]
    pub(crate) images: Option<String>,
    /// ctr program and its global options, for --images (default ctr, from PATH)
    #[argh(option, default = "\"ctr\".into()")]
    pub(crate) ctr: String,
    /// registry kubeadm names the control plane's images under: kubeadm's imageRepository
    /// (default: kubeadm's, registry.k8s.io)
    #[argh(option)]
    pub(crate) image_repository: Option<String>,
    /// tag of the etcd image: kubeadm's etcd.local.imageTag (default: the one kubeadm pins for
    /// the version)
    #[argh(option)]
    pub(crate) etcd_image_tag: Option<String>,
    /// addons kubeadm init leaves out, comma-separated: coredns, kube-proxy (Kubernetes 1.31
    /// and later; default: none)
    #[argh(option, default = "Addons::default()")]
    pub(crate) skip_addons: Addons,
    /// command that starts the kubelet on an activated node (default: kubelet.service via systemd)
    #[argh(option)]
    pub(crate) kubelet_command: Option<String>,
    /// reboot after a failure past the node lock, only if --root is /; false: never (default
    /// true)
    #[argh(option, default = "RebootMode::Auto")]
    pub(crate) reboot: RebootMode,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub(crate) events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub(crate) events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub(crate) events_ca_file: Option<Input>,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "join-service",
    help_triggers("-h", "--help", "help")
)]
/// Hand out join tickets to nodes that present a certificate from the node-provisioning CA, at
/// most one per node identity.
pub struct JoinService {
    /// root for every path below (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub root: PathBuf,
    /// address to serve on (default 0.0.0.0:9090)
    #[argh(option, default = "\"0.0.0.0:9090\".into()")]
    pub(crate) listen: String,
    /// serving certificate, issued by the cluster CA nodes pin
    #[argh(option, default = "\"/etc/nodestrap/join-service/tls.crt\".into()")]
    pub(crate) cert: String,
    /// serving key
    #[argh(option, default = "\"/etc/nodestrap/join-service/tls.key\".into()")]
    pub(crate) key: String,
    /// node-provisioning CA: nodes must present a certificate from it
    #[argh(option, default = "\"/etc/nodestrap/join-service/node-ca.crt\".into()")]
    pub(crate) node_ca: String,
    /// the cluster CA kubeadm discovery pins (its public key hash goes into tickets)
    #[argh(option, default = "\"/etc/kubernetes/pki/ca.crt\".into()")]
    pub(crate) cluster_ca: String,
    /// where the control-plane files of control-plane tickets are read from
    #[argh(option, default = "\"/etc/kubernetes/pki\".into()")]
    pub(crate) pki_dir: String,
    /// API server HOST:PORT written into tickets
    #[argh(option)]
    pub(crate) api_server_endpoint: String,
    /// cluster name written into tickets
    #[argh(option)]
    pub(crate) cluster_name: String,
    /// the Kubernetes version written into tickets (picks the kubeadm config API on the node)
    #[argh(option)]
    pub(crate) kubernetes_version: Option<String>,
    /// command printing a new bootstrap token (no shell; default kubeadm token create --ttl 15m0s)
    #[argh(option, default = "\"kubeadm token create --ttl 15m0s\".into()")]
    pub(crate) token_command: String,
    /// seconds the token command may take (default 60)
    #[argh(option, default = "60")]
    pub(crate) token_timeout: u64,
    /// where the record of issued tickets lives: cluster (one ConfigMap per node identity,
    /// shared by every instance; default) or file (--state, for a join service that runs
    /// alone, without a cluster)
    #[argh(option, default = "Ledger::Cluster")]
    pub(crate) ledger: Ledger,
    /// namespace of the cluster's ticket records (default nodestrap-join)
    #[argh(option, default = "\"nodestrap-join\".into()")]
    pub(crate) ledger_namespace: String,
    /// kubeconfig for the cluster's ticket records (pod path); default: the pod's service
    /// account
    #[argh(option)]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// this instance's name in the ticket records (default: $NODE_NAME, else the host name)
    #[argh(option)]
    pub(crate) instance: Option<String>,
    /// seconds after a failed issuance, or after a ticket the node has not said it keeps, in
    /// which the same node may ask again (default 900)
    #[argh(option, default = "900")]
    pub(crate) retry_window: u64,
    /// the file record of issued tickets (--ledger file); with --ledger cluster, an existing
    /// one is carried into the cluster once
    #[argh(
        option,
        default = "\"/var/lib/nodestrap/join-service/issued.json\".into()"
    )]
    pub(crate) state: String,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub(crate) events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub(crate) events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub(crate) events_ca_file: Option<Input>,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "init-cluster",
    help_triggers("-h", "--help", "help")
)]
/// Ask a fresh node's init server to initialize a cluster; write the admin kubeconfig it returns.
pub struct InitCluster {
    /// the node's init server, https://HOST:PORT
    #[argh(option)]
    pub(crate) endpoint: String,
    /// name the node's certificate must carry (default: the endpoint's host)
    #[argh(option)]
    pub(crate) server_name: Option<String>,
    /// admin client certificate (PEM), issued by the node's admin CA
    #[argh(option)]
    pub(crate) cert: PathBuf,
    /// admin client key (PEM)
    #[argh(option)]
    pub(crate) key: PathBuf,
    /// CA that issued the node identity certificates (PEM)
    #[argh(option)]
    pub(crate) ca: PathBuf,
    /// file holding the init secret
    #[argh(option)]
    pub(crate) secret_file: PathBuf,
    /// cluster name
    #[argh(option)]
    pub(crate) cluster_name: String,
    /// the Kubernetes version, vMAJOR.MINOR.PATCH
    #[argh(option)]
    pub(crate) kubernetes_version: String,
    /// pod network CIDR (default 10.244.0.0/16)
    #[argh(option, default = "\"10.244.0.0/16\".into()")]
    pub(crate) pod_cidr: String,
    /// service CIDR (default 10.96.0.0/12)
    #[argh(option, default = "\"10.96.0.0/12\".into()")]
    pub(crate) service_cidr: String,
    /// extra API server certificate names, comma-separated
    #[argh(option, default = "String::new()")]
    pub(crate) apiserver_sans: String,
    /// HOST[:PORT] every node reaches the API server at: kubeadm's controlPlaneEndpoint
    /// (default: the first node's own address)
    #[argh(option)]
    pub(crate) control_plane_endpoint: Option<String>,
    /// where to write the admin kubeconfig (mode 0600)
    #[argh(option)]
    pub(crate) out: PathBuf,
    /// seconds to keep trying while the node cannot be reached (default 300)
    #[argh(option, default = "300")]
    pub(crate) wait: u64,
    /// seconds to wait for the answer once sent: kubeadm init runs meanwhile (default 900)
    #[argh(option, default = "900")]
    pub(crate) timeout: u64,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
}
