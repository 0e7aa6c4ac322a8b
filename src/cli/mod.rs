//! Command line. argh does not take `--flag=value` or bare boolean flags the way Go's flag
//! package does, and the original units pass them that way, so argv is normalised first.

use std::path::{Path, PathBuf};

use argh::FromArgs;

use std::time::Duration;

use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Kind, Result};
use crate::net::cluster::Fallback;
use crate::net::fetch::{AttemptLimits, Http, Tls};
use crate::net::retry::Retry;
use crate::node::root::{read_host_file, Root};

pub mod check;
pub mod help;
pub mod settings;

pub const DEFAULT_MANIFEST_URL: &str =
    "https://tectonic-torcx.release.core-os.net/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json";

#[derive(FromArgs, Debug)]
#[argh(help_triggers("-h", "--help", "help"))]
/// Prepare this machine to join a Kubernetes cluster before anything else runs.
pub struct Cli {
    #[argh(subcommand)]
    pub cmd: Cmd,
}

/// The subcommands' names, for a did-you-mean.
pub const COMMANDS: &[&str] = &[
    "bootstrap",
    "hook",
    "preflight",
    "reprovision",
    "activate",
    "join-service",
    "init-cluster",
    "status",
    "verify",
];

// One per process, parsed once: its size does not matter, and argh takes no boxed variant.
#[allow(clippy::large_enum_variant)]
#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Cmd {
    Bootstrap(Bootstrap),
    Hook(Hook),
    Preflight(Preflight),
    Reprovision(Reprovision),
    Activate(Activate),
    JoinService(JoinService),
    InitCluster(InitCluster),
    Status(Status),
    Verify(Verify),
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "bootstrap",
    help_triggers("-h", "--help", "help"),
    usage = "[--payload torcx|sysext] [options]",
    example = "A sysext node, its cluster's version from the API server:\n  nodestrap bootstrap --payload sysext \\\n    --sysext-url 'https://mirror.example.com/extensions/${{NAME}}/' \\\n    --keyring /etc/nodestrap/bakery.asc\nA Container Linux node in the initramfs, settings from the node's files:\n  nodestrap bootstrap --root /sysroot --upgrade-os=false --cmdline",
    note = "Node paths are read and written under --root (the node's files: kubeconfig,\nkubelet.env, runtime mappings, and --keyring or --ca-file when set in a config\nfile or on the kernel command line). Host paths are this machine's, as given\n(--root, and --keyring and --ca-file on the command line).\nSettings come from the command line, then the kernel command line (--cmdline),\nthen the config file and its drop-ins, then the defaults.\nAn option of the other payload is refused (exit 2), unless it only turns off\nwhat this payload never does (--upgrade-os=false, --reboot=false with sysext).",
    error_code(0, "done: staged, kubelet.env written (or nothing to do)"),
    error_code(
        1,
        "failed: nothing of this run is left, kubelet.env not written; the unit retries"
    ),
    error_code(
        2,
        "wrong options or settings, named with where they were set; the node is unchanged"
    )
)]
/// Stage what the cluster needs on this node (a torcx runtime image for this OS and a pending OS
/// update, or systemd-sysext images), write kubelet.env, and reboot only if that is needed.
pub struct Bootstrap {
    /// the node's root; every node path resolves under it (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub root: PathBuf,
    /// key=value settings file (node path, default /etc/nodestrap/bootstrap.conf; empty: none)
    #[argh(option)]
    pub config: Option<String>,
    /// also take nodestrap.<key>=<value> settings from the kernel command line (/proc/cmdline)
    #[argh(switch)]
    pub cmdline: bool,
    /// payload family: torcx (runtime image under a torcx profile) or sysext (default torcx)
    #[argh(option, default = "Payload::Torcx")]
    pub payload: Payload,
    /// URL of the directory holding SHA256SUMS, its signature and the images; ${NAME} or
    /// {{.Name}} is the extension's name (required with --payload sysext)
    #[argh(option, default = "String::new()")]
    pub sysext_url: String,
    /// let these exact versions through the version floor, NAME=VERSION, comma-separated
    /// (kubernetes=v1.37.1 for an extension, docker=17.03 for a torcx image): an explicit
    /// downgrade, recorded, which lowers the floor (default: none)
    #[argh(option, default = "String::new()")]
    pub allow_downgrade: String,
    /// who vouches for a sysext image on the disk: plain (its SHA-256 in the signed
    /// SHA256SUMS, as fetched; signed DDIs taken too) or signed (signed DDIs only, merged under
    /// the strict image policy) (default plain)
    #[argh(option, default = "SysextTrust::Plain")]
    pub sysext_trust: SysextTrust,
    /// PEM file of the certificates whose signatures over verity root hashes are trusted,
    /// installed in /etc/verity.d (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub sysext_verity_certs: Option<Input>,
    /// kubeconfig for the API server (node path, default /etc/kubernetes/kubeconfig)
    #[argh(option, default = "\"/etc/kubernetes/kubeconfig\".into()")]
    pub kubeconfig: String,
    /// when --kubeconfig does not exist: the kubelet's bootstrap kubeconfig, asked for the
    /// version only (node path; empty: none; default /etc/kubernetes/bootstrap-kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/bootstrap-kubelet.conf\".into()")]
    pub bootstrap_kubeconfig: String,
    /// when neither kubeconfig exists: kubeadm's JoinConfiguration (the file `kubeadm join
    /// --config` takes), its discovery asked for the version only (node path; default: none)
    #[argh(option, default = "String::new()")]
    pub join_config: String,
    /// when no kubeconfig nor join configuration exists: the API server's URL, its /version read without
    /// credentials, trusted through the system roots and --ca-file (default: none)
    #[argh(option, default = "String::new()")]
    pub api_server: String,
    /// use this Kubernetes version instead of asking the API server: v1.31.7 that exact patch,
    /// v1.31 the newest patch of the minor (sysext only) (default: ask)
    #[argh(option)]
    pub force_kube_version: Option<String>,
    /// runtime mappings file (node path, default /etc/kubernetes/installer/runtime-mappings.yaml)
    #[argh(
        option,
        default = "\"/etc/kubernetes/installer/runtime-mappings.yaml\".into()"
    )]
    pub version_manifest: String,
    /// installer kubelet.env: fallback version source and template (node path, default
    /// /etc/kubernetes/installer/kubelet.env)
    #[argh(option, default = "\"/etc/kubernetes/installer/kubelet.env\".into()")]
    pub installer_kubelet_env: String,
    /// torcx manifest URL template: {{.Board}} {{.OSVersion}} ${COREOS_BOARD} ${VERSION_ID}
    /// (default Tectonic's, tectonic-torcx.release.core-os.net)
    #[argh(option, default = "DEFAULT_MANIFEST_URL.into()")]
    pub torcx_manifest_url: String,
    /// armored OpenPGP keyring that signs manifests and SHA256SUMS (host path; a node path when
    /// set on the node; default /usr/share/nodestrap/keyring.asc)
    #[argh(
        option,
        default = "Input::Host(PathBuf::from(\"/usr/share/nodestrap/keyring.asc\"))"
    )]
    pub keyring: Input,
    /// extra PEM trust anchors beside the system roots (host path; a node path when set on the
    /// node; default: the system roots only)
    #[argh(option)]
    pub ca_file: Option<Input>,
    /// skip the signature check of manifests and SHA256SUMS (and do not fetch them): dangerous
    /// (default false)
    #[argh(option, default = "false")]
    pub no_verify_signatures: bool,
    /// ask update_engine to update and wait; false: only read its status (default true)
    #[argh(option, default = "true")]
    pub upgrade_os: bool,
    /// skip all torcx steps, still write kubelet.env (default false)
    #[argh(option, default = "false")]
    pub torcx_skip_setup: bool,
    /// profile to create when no user next-profile exists (default tectonic)
    #[argh(option, default = "\"tectonic\".into()")]
    pub torcx_profile: String,
    /// where to write kubelet.env (node path; empty: do not write it; default
    /// /etc/kubernetes/kubelet.env)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.env\".into()")]
    pub kubelet_env_path: String,
    /// reboot when the OS update or the runtime needs it, only if --root is /; false: report
    /// only (default true)
    #[argh(option, default = "RebootMode::Auto")]
    pub reboot: RebootMode,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub events_ca_file: Option<Input>,
    /// print the plan; write nothing, update nothing, reboot nothing
    #[argh(switch)]
    pub dry_run: bool,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
    /// API server attempts without an answer before it is unreachable (default 3)
    #[argh(option, default = "3")]
    pub api_tries: u32,
    /// first API retry delay in seconds; doubles per retry with full jitter, capped at 60 s (default 10)
    #[argh(option, default = "10")]
    pub api_retry_delay: u64,
    /// when the installer files may give the version: unreachable, never, always-after-deadline (default unreachable)
    #[argh(option, default = "Fallback::Unreachable")]
    pub version_fallback: Fallback,
    /// seconds the run's network attempts may take in all (default 1800)
    #[argh(option, default = "DEFAULT_DEADLINE_SECS")]
    pub deadline: u64,
    /// seconds to wait for time synchronisation when the clock is behind its floor (default 60)
    #[argh(option, default = "60")]
    pub clock_wait: u64,
    /// attempts per manifest, signature or image download (default 6)
    #[argh(option, default = "6")]
    pub fetch_attempts: u32,
    /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
    /// (default 1000)
    #[argh(option, default = "1000")]
    pub fetch_backoff_ms: u64,
    /// seconds one download attempt may take, from connecting to the last byte (default 300)
    #[argh(option, default = "crate::net::fetch::DEFAULT_ATTEMPT_SECS")]
    pub fetch_timeout: u64,
    /// bytes per second each --fetch-min-rate-window of a transfer must average (default 1024; 0: no floor)
    #[argh(option, default = "crate::net::fetch::DEFAULT_MIN_RATE")]
    pub fetch_min_rate: u64,
    /// seconds over which --fetch-min-rate is averaged (default 30)
    #[argh(option, default = "crate::net::fetch::DEFAULT_RATE_WINDOW_SECS")]
    pub fetch_min_rate_window: u64,
    /// seconds to wait for update_engine to settle (default 1800)
    #[argh(option, default = "1800")]
    pub update_timeout: u64,
    /// largest image taken, in MiB (default 512 for torcx, 1024 for sysext)
    #[argh(option)]
    pub image_max_mib: Option<u64>,
}

pub const DEFAULT_HOOK_ANNOTATION: &str =
    "container-linux-update.v1.coreos.com/tectonic-torcx-pre-hook-ok";

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "hook", help_triggers("-h", "--help", "help"))]
/// Pre-reboot hook of the update operator: stage the runtime for the pending OS version, drop
/// stores of older versions, and annotate the Node. Never updates, reboots or writes kubelet.env.
pub struct Hook {
    /// the host's root as mounted in this pod; node paths resolve under it (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub root: PathBuf,
    /// kubeconfig (pod path); default: the pod's service account
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
    /// this Node's name (default: env NODE)
    #[argh(option)]
    pub node_name: Option<String>,
    /// annotation set to "true" on the Node once done
    #[argh(option, default = "DEFAULT_HOOK_ANNOTATION.into()")]
    pub node_annotation: String,
    /// runtime mappings file (pod path, default /etc/runtime-mappings.yaml)
    #[argh(option, default = "PathBuf::from(\"/etc/runtime-mappings.yaml\")")]
    pub version_manifest: PathBuf,
    /// once done, stay up idle (sleeping this many seconds at a time) until SIGTERM; 0: exit
    #[argh(option, default = "0")]
    pub sleep: u64,
    /// torcx manifest URL template: {{.Board}} {{.OSVersion}} ${COREOS_BOARD} ${VERSION_ID}
    #[argh(option, default = "DEFAULT_MANIFEST_URL.into()")]
    pub torcx_manifest_url: String,
    /// armored OpenPGP keyring that signs manifests (pod path)
    #[argh(
        option,
        default = "Input::Host(PathBuf::from(\"/usr/share/nodestrap/keyring.asc\"))"
    )]
    pub keyring: Input,
    /// extra PEM trust anchors for the system roots (pod path)
    #[argh(option)]
    pub ca_file: Option<Input>,
    /// skip the manifest signature check (and do not fetch .asc): dangerous
    #[argh(option, default = "false")]
    pub no_verify_signatures: bool,
    /// profile to create when no user next-profile exists (default tectonic)
    #[argh(option, default = "\"tectonic\".into()")]
    pub torcx_profile: String,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub events_ca_file: Option<Input>,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
    /// API server attempts without an answer per request (default 3)
    #[argh(option, default = "3")]
    pub api_tries: u32,
    /// first API retry delay in seconds; doubles per retry with full jitter, capped at 60 s (default 10)
    #[argh(option, default = "10")]
    pub api_retry_delay: u64,
    /// seconds the run's network attempts may take in all (default 600)
    #[argh(option, default = "HOOK_DEADLINE_SECS")]
    pub deadline: u64,
    /// attempts per manifest, signature or image download (default 6)
    #[argh(option, default = "6")]
    pub fetch_attempts: u32,
    /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
    /// (default 1000)
    #[argh(option, default = "1000")]
    pub fetch_backoff_ms: u64,
    /// seconds one download attempt may take, from connecting to the last byte (default 300)
    #[argh(option, default = "crate::net::fetch::DEFAULT_ATTEMPT_SECS")]
    pub fetch_timeout: u64,
    /// bytes per second each --fetch-min-rate-window of a transfer must average (default 1024; 0: no floor)
    #[argh(option, default = "crate::net::fetch::DEFAULT_MIN_RATE")]
    pub fetch_min_rate: u64,
    /// seconds over which --fetch-min-rate is averaged (default 30)
    #[argh(option, default = "crate::net::fetch::DEFAULT_RATE_WINDOW_SECS")]
    pub fetch_min_rate_window: u64,
    /// largest image taken, in MiB (default 512)
    #[argh(option, default = "TORCX_IMAGE_MAX_MIB")]
    pub image_max_mib: u64,
}

/// `--image-max-mib`'s defaults: Container Linux's docker torcx images are 50 to 100 MB, a
/// Kubernetes sysext image (kubelet, kubeadm, kubectl) about 100 MB.
pub const TORCX_IMAGE_MAX_MIB: u64 = 512;
pub const SYSEXT_IMAGE_MAX_MIB: u64 = 1024;
/// Its bound: no image is larger than this.
const IMAGE_MAX_MIB_LIMIT: u64 = 64 << 10;

impl Bootstrap {
    /// The largest image this payload family takes, in bytes.
    pub fn image_max_bytes(&self) -> u64 {
        let mib = self.image_max_mib.unwrap_or(match self.payload {
            Payload::Torcx => TORCX_IMAGE_MAX_MIB,
            Payload::Sysext => SYSEXT_IMAGE_MAX_MIB,
        });
        mib << 20
    }

    /// Where this node finds its cluster before it has joined.
    pub fn before_join(&self) -> crate::net::cluster::BeforeJoin<'_> {
        crate::net::cluster::BeforeJoin {
            bootstrap_kubeconfig: &self.bootstrap_kubeconfig,
            join_config: &self.join_config,
            api_server: &self.api_server,
        }
    }
}

impl Hook {
    pub fn image_max_bytes(&self) -> u64 {
        self.image_max_mib << 20
    }
}

/// `--image-max-mib`'s own check.
pub fn check_image_max(mib: u64) -> Result<()> {
    if mib == 0 {
        return Err(Error::config("--image-max-mib 0: at least 1"));
    }
    at_most("--image-max-mib", mib, IMAGE_MAX_MIB_LIMIT)
}

pub const DEFAULT_IPB_LABEL: &str = "ibm-cloud.kubernetes.io/ipb-schedule";
/// `oc image extract` as IBM's in-place bootstrapper outline does it; `{image}`, `{dir}` and
/// `{root}` are replaced in each argument (no shell).
pub const DEFAULT_MCD_EXTRACT: &str = "oc image extract --registry-config={root}/var/lib/kubelet/config.json --confirm --path /usr/bin/machine-config-daemon:{dir} {image}";

/// `preflight` and `reprovision` take the same options (argh cannot share one struct between
/// two subcommands): one field list makes both, and a preflight converts into a reprovision.
macro_rules! reprovision_args {
    ({ $($body:tt)* } [$($f:ident),*]) => {
        #[derive(FromArgs, Debug)]
        #[argh(subcommand, name = "preflight", help_triggers("-h", "--help", "help"))]
        /// Check every dependency of an in-place re-bootstrap (Ignition or payload endpoint,
        /// registry, mirrors, progress endpoint) and print a table; exit 0 only if all pass.
        pub struct Preflight { $($body)* }

        #[derive(FromArgs, Debug)]
        #[argh(subcommand, name = "reprovision", help_triggers("-h", "--help", "help"))]
        /// Re-bootstrap this RHCOS or RHEL node in place from a mounted Secret and reboot it
        /// into its new configuration (IBM's in-place bootstrapper flow).
        pub struct Reprovision { $($body)* }

        impl From<Preflight> for Reprovision {
            fn from(p: Preflight) -> Reprovision {
                Reprovision { $($f: p.$f,)* }
            }
        }
    };
}
// Tokens pass through unchanged (argh reads the field types as written); the name list makes
// the conversion, and the compiler checks it names every field.
reprovision_args! {{
        /// the host's root as mounted in this pod; node paths resolve under it (default /)
        #[argh(option, default = "PathBuf::from(\"/\")")]
        pub root: PathBuf,
        /// the mounted Secret: one file per key (ignition-url, payload-url, ca.crt, ...)
        #[argh(option)]
        pub secret_dir: PathBuf,
        /// auto (from the node's os-release ID), rhcos or rhel (default auto)
        #[argh(option, default = "Pick::Auto")]
        pub flow: Pick<Flow>,
        /// this Node's name (default: env NODE)
        #[argh(option)]
        pub node_name: Option<String>,
        /// kubeconfig (pod path); default: the pod's service account
        #[argh(option)]
        pub kubeconfig: Option<PathBuf>,
        /// label removed from the Node before it reboots
        #[argh(option, default = "DEFAULT_IPB_LABEL.into()")]
        pub label: String,
        /// RHCOS: machine-config-daemon binary (pod path); default: extract it from the
        /// machine-config-operator image the Ignition config names
        #[argh(option)]
        pub mcd_binary: Option<PathBuf>,
        /// RHCOS: command that extracts machine-config-daemon into {dir} from {image}
        #[argh(option, default = "DEFAULT_MCD_EXTRACT.into()")]
        pub mcd_extract_command: String,
        /// RHEL: the payload's entry script, relative to its top (default bootstrap.sh)
        #[argh(option, default = "\"bootstrap.sh\".into()")]
        pub payload_entry: String,
        /// RHEL: seconds the entry script may run (default 3600)
        #[argh(option, default = "3600")]
        pub entry_timeout: u64,
        /// RHEL: true (reboot only if --root is /), host (--root is the host's root
        /// mounted in this pod: reboot the host through the system bus) or false (default true)
        #[argh(option, default = "HostReboot::Auto")]
        pub reboot: HostReboot,
        /// check and fetch, change nothing on the node or the Node, reboot nothing
        #[argh(switch)]
        pub dry_run: bool,
        /// send each decision and phase as it happens, one JSON event per POST, to this https URL
        /// (docs/status.md, "Events"; default: none)
        #[argh(option)]
        pub events_url: Option<String>,
        /// bearer token for --events-url, used when the node has no kubelet client certificate
        /// (host path; a node path when set on the node; default: none)
        #[argh(option)]
        pub events_token_file: Option<Input>,
        /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
        /// when set on the node; default: the system roots only)
        #[argh(option)]
        pub events_ca_file: Option<Input>,
        /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
        #[argh(option, default = "\"info\".into()")]
        pub verbose: String,
        /// API server attempts without an answer per request (default 3)
        #[argh(option, default = "3")]
        pub api_tries: u32,
        /// first API retry delay in seconds; doubles per retry with full jitter, capped at 60 s (default 10)
        #[argh(option, default = "10")]
        pub api_retry_delay: u64,
        /// attempts per download or check (default 6)
        #[argh(option, default = "6")]
        pub fetch_attempts: u32,
        /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
        #[argh(option, default = "1000")]
        pub fetch_backoff_ms: u64,
        /// seconds one download attempt may take, from connecting to the last byte (default 300)
        #[argh(option, default = "crate::net::fetch::DEFAULT_ATTEMPT_SECS")]
        pub fetch_timeout: u64,
        /// bytes per second each --fetch-min-rate-window of a transfer must average (default 1024; 0: no floor)
        #[argh(option, default = "crate::net::fetch::DEFAULT_MIN_RATE")]
        pub fetch_min_rate: u64,
        /// seconds over which --fetch-min-rate is averaged (default 30)
        #[argh(option, default = "crate::net::fetch::DEFAULT_RATE_WINDOW_SECS")]
        pub fetch_min_rate_window: u64,
        /// seconds the run's network attempts may take in all (default 60 for preflight, 1800
        /// for reprovision)
        #[argh(option)]
        pub deadline: Option<u64>,
} [root, secret_dir, flow, node_name, kubeconfig, label, mcd_binary, mcd_extract_command,
    payload_entry, entry_timeout, reboot, dry_run, events_url, events_token_file,
    events_ca_file, verbose, api_tries, api_retry_delay,
    fetch_attempts, fetch_backoff_ms, fetch_timeout, fetch_min_rate, fetch_min_rate_window,
    deadline]}

/// `--deadline`'s defaults of the in-place commands. preflight is a check a person or a
/// pipeline waits for: its table prints within this. reprovision is bootstrap's work (the same
/// downloads) in a DaemonSet pod that the kubelet restarts after a failure: bootstrap's default.
pub const PREFLIGHT_DEADLINE_SECS: u64 = 60;
pub const REPROVISION_DEADLINE_SECS: u64 = DEFAULT_DEADLINE_SECS;

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
    pub listen: String,
    /// node identity certificate (node path): init server and join client present it
    #[argh(option, default = "\"/etc/nodestrap/activate/node.crt\".into()")]
    pub identity_cert: String,
    /// node identity key (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/node.key\".into()")]
    pub identity_key: String,
    /// CA whose client certificates may send an init request (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/admin-ca.crt\".into()")]
    pub admin_ca: String,
    /// pinned cluster CA: the join service must present a certificate from it (node path)
    #[argh(option, default = "\"/etc/nodestrap/activate/cluster-ca.crt\".into()")]
    pub cluster_ca: String,
    /// PBKDF2 hash of the init secret, pbkdf2_sha256$ROUNDS$SALT$BASE64 (node path)
    #[argh(
        option,
        default = "\"/etc/nodestrap/activate/init-secret.hash\".into()"
    )]
    pub init_secret_hash: String,
    /// join services to ask for a ticket, comma-separated https://HOST:PORT (default: none)
    #[argh(option, default = "String::new()")]
    pub join_endpoints: String,
    /// seconds between join rounds (default 30)
    #[argh(option, default = "30")]
    pub join_interval: u64,
    /// seconds each ticket call may take (default 30)
    #[argh(option, default = "30")]
    pub join_timeout: u64,
    /// kubeadm join attempts after a ticket (default 3)
    #[argh(option, default = "3")]
    pub join_attempts: u32,
    /// seconds all kubeadm join attempts may take together (default 300)
    #[argh(option, default = "300")]
    pub join_budget: u64,
    /// kubeadm program (default kubeadm, from PATH)
    #[argh(option, default = "\"kubeadm\".into()")]
    pub kubeadm: String,
    /// seconds kubeadm init may take (default 600)
    #[argh(option, default = "600")]
    pub kubeadm_timeout: u64,
    /// command that starts the kubelet on an activated node (default: kubelet.service via systemd)
    #[argh(option)]
    pub kubelet_command: Option<String>,
    /// reboot after a failure past the node lock, only if --root is /; false: never (default
    /// true)
    #[argh(option, default = "RebootMode::Auto")]
    pub reboot: RebootMode,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub events_ca_file: Option<Input>,
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
    pub listen: String,
    /// serving certificate, issued by the cluster CA nodes pin
    #[argh(option, default = "\"/etc/nodestrap/join-service/tls.crt\".into()")]
    pub cert: String,
    /// serving key
    #[argh(option, default = "\"/etc/nodestrap/join-service/tls.key\".into()")]
    pub key: String,
    /// node-provisioning CA: nodes must present a certificate from it
    #[argh(option, default = "\"/etc/nodestrap/join-service/node-ca.crt\".into()")]
    pub node_ca: String,
    /// the cluster CA kubeadm discovery pins (its public key hash goes into tickets)
    #[argh(option, default = "\"/etc/kubernetes/pki/ca.crt\".into()")]
    pub cluster_ca: String,
    /// where the control-plane files of control-plane tickets are read from
    #[argh(option, default = "\"/etc/kubernetes/pki\".into()")]
    pub pki_dir: String,
    /// API server HOST:PORT written into tickets
    #[argh(option)]
    pub api_server_endpoint: String,
    /// cluster name written into tickets
    #[argh(option)]
    pub cluster_name: String,
    /// the Kubernetes version written into tickets (picks the kubeadm config API on the node)
    #[argh(option)]
    pub kubernetes_version: Option<String>,
    /// command printing a new bootstrap token (no shell; default kubeadm token create --ttl 15m0s)
    #[argh(option, default = "\"kubeadm token create --ttl 15m0s\".into()")]
    pub token_command: String,
    /// seconds the token command may take (default 60)
    #[argh(option, default = "60")]
    pub token_timeout: u64,
    /// where the record of issued tickets lives: cluster (one ConfigMap per node identity,
    /// shared by every instance; default) or file (--state, for a join service that runs
    /// alone, without a cluster)
    #[argh(option, default = "Ledger::Cluster")]
    pub ledger: Ledger,
    /// namespace of the cluster's ticket records (default nodestrap-join)
    #[argh(option, default = "\"nodestrap-join\".into()")]
    pub ledger_namespace: String,
    /// kubeconfig for the cluster's ticket records (pod path); default: the pod's service
    /// account
    #[argh(option)]
    pub kubeconfig: Option<PathBuf>,
    /// this instance's name in the ticket records (default: $NODE_NAME, else the host name)
    #[argh(option)]
    pub instance: Option<String>,
    /// seconds after a failed issuance in which the same node may ask again (default 900)
    #[argh(option, default = "900")]
    pub retry_window: u64,
    /// the file record of issued tickets (--ledger file); with --ledger cluster, an existing
    /// one is carried into the cluster once
    #[argh(
        option,
        default = "\"/var/lib/nodestrap/join-service/issued.json\".into()"
    )]
    pub state: String,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub events_ca_file: Option<Input>,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
}

/// Where join-service records the tickets it issued (`--ledger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ledger {
    Cluster,
    File,
}

impl argh::FromArgValue for Ledger {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "cluster" => Ok(Ledger::Cluster),
            "file" => Ok(Ledger::File),
            _ => Err(format!("expected cluster or file, got {v:?}")),
        }
    }
}

/// `status --command`: one command's record, or every command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOf {
    One(&'static str),
    All,
}

impl argh::FromArgValue for RecordOf {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        if v == "all" {
            return Ok(RecordOf::All);
        }
        crate::node::status::COMMANDS
            .iter()
            .find(|c| **c == v)
            .map(|c| RecordOf::One(c))
            .ok_or_else(|| {
                format!(
                    "expected {} or all, got {v:?}",
                    crate::node::status::COMMANDS.join(", ")
                )
            })
    }
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status", help_triggers("-h", "--help", "help"))]
/// Show what the last bootstrap decided and did (its status record); exit 0 done, 1 failed,
/// 3 still running, 4 no record, 5 done but the boot check found a mismatch.
pub struct Status {
    /// the node's root, for the record kept under /var/lib when /run has none (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub root: PathBuf,
    /// whose record: bootstrap, hook, preflight, reprovision, activate, join-service, or all
    /// (each one found; the exit code is bootstrap's) (default bootstrap)
    #[argh(option, default = "RecordOf::One(\"bootstrap\")")]
    pub command: RecordOf,
    /// print the record as JSON (schema: docs/status.md)
    #[argh(switch)]
    pub json: bool,
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "verify",
    help_triggers("-h", "--help", "help"),
    note = "Runs on the running system after a boot (nodestrap-verify.service, before\nboot-complete.target). Reads the last bootstrap's status record; writes what it\nfound into it, and the known-good set to /var/lib/nodestrap/known-good.json\n(sysext) or the known-good torcx profile nodestrap-known-good (torcx).",
    error_code(0, "verified: the node runs what the last bootstrap chose; now known-good"),
    error_code(
        1,
        "mismatch (recorded; the known-good set put back, or the known-good torcx profile selected for the next boot, once per boot), or no completed bootstrap to verify"
    ),
    error_code(2, "wrong options")
)]
/// After a boot: check that the extensions (sysext) or the torcx profile, kubelet and runtime
/// running are the ones the last bootstrap chose, and go back to the known-good ones if not.
pub struct Verify {
    /// the kubelet's kubeconfig, to ask the API server for this Node (node path, default
    /// /etc/kubernetes/kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.conf\".into()")]
    pub kubeconfig: String,
    /// the Node's name (default: the host name in lower case, as the kubelet registers)
    #[argh(option)]
    pub node_name: Option<String>,
    /// seconds to wait for the API server to confirm the Node's versions; 0: do not ask
    /// (default 60)
    #[argh(option, default = "60")]
    pub api_wait: u64,
    /// send each decision and phase as it happens, one JSON event per POST, to this https URL
    /// (docs/status.md, "Events"; default: none)
    #[argh(option)]
    pub events_url: Option<String>,
    /// bearer token for --events-url, used when the node has no kubelet client certificate
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub events_token_file: Option<Input>,
    /// extra PEM trust anchors for --events-url beside the system roots (host path; a node path
    /// when set on the node; default: the system roots only)
    #[argh(option)]
    pub events_ca_file: Option<Input>,
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
    pub endpoint: String,
    /// name the node's certificate must carry (default: the endpoint's host)
    #[argh(option)]
    pub server_name: Option<String>,
    /// admin client certificate (PEM), issued by the node's admin CA
    #[argh(option)]
    pub cert: PathBuf,
    /// admin client key (PEM)
    #[argh(option)]
    pub key: PathBuf,
    /// CA that issued the node identity certificates (PEM)
    #[argh(option)]
    pub ca: PathBuf,
    /// file holding the init secret
    #[argh(option)]
    pub secret_file: PathBuf,
    /// cluster name
    #[argh(option)]
    pub cluster_name: String,
    /// the Kubernetes version, vMAJOR.MINOR.PATCH
    #[argh(option)]
    pub kubernetes_version: String,
    /// pod network CIDR (default 10.244.0.0/16)
    #[argh(option, default = "\"10.244.0.0/16\".into()")]
    pub pod_cidr: String,
    /// service CIDR (default 10.96.0.0/12)
    #[argh(option, default = "\"10.96.0.0/12\".into()")]
    pub service_cidr: String,
    /// extra API server certificate names, comma-separated
    #[argh(option, default = "String::new()")]
    pub apiserver_sans: String,
    /// where to write the admin kubeconfig (mode 0600)
    #[argh(option)]
    pub out: PathBuf,
    /// seconds to keep trying while the node cannot be reached (default 300)
    #[argh(option, default = "300")]
    pub wait: u64,
    /// seconds to wait for the answer once sent: kubeadm init runs meanwhile (default 900)
    #[argh(option, default = "900")]
    pub timeout: u64,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
}

/// The options bootstrap and hook share, checked and used by the same code.
pub struct Common<'a> {
    pub torcx_manifest_url: &'a str,
    pub keyring: &'a Input,
    pub ca_file: Option<&'a Input>,
    pub no_verify_signatures: bool,
    pub torcx_profile: &'a str,
    pub api_tries: u32,
    pub api_retry_delay: u64,
    pub deadline: u64,
    pub fetch_attempts: u32,
    pub fetch_backoff_ms: u64,
    pub fetch_timeout: u64,
    pub fetch_min_rate: u64,
    pub fetch_min_rate_window: u64,
}

/// `--deadline`'s default: half of k8s-node-bootstrap.service's TimeoutStartSec=1h, so that the
/// unit's own retry gets a full run before systemd gives up on it.
pub const DEFAULT_DEADLINE_SECS: u64 = 1800;

/// The hook's `--deadline` default. The update operator waits for the hook's annotation with
/// no time limit of its own, and a hook that exits 1 is started again by the kubelet (its
/// restart back-off grows to 5 minutes): a shorter run that fails and is restarted beats one
/// that holds on for half an hour, and the node is asked again about every 15 minutes.
pub const HOOK_DEADLINE_SECS: u64 = 600;

/// When this process started (`args()` reads it first): `--deadline` counts from here.
pub use crate::node::status::started;

macro_rules! common {
    ($t:ty) => {
        impl $t {
            pub fn common(&self) -> Common<'_> {
                Common {
                    torcx_manifest_url: &self.torcx_manifest_url,
                    keyring: &self.keyring,
                    ca_file: self.ca_file.as_ref(),
                    no_verify_signatures: self.no_verify_signatures,
                    torcx_profile: &self.torcx_profile,
                    api_tries: self.api_tries,
                    api_retry_delay: self.api_retry_delay,
                    deadline: self.deadline,
                    fetch_attempts: self.fetch_attempts,
                    fetch_backoff_ms: self.fetch_backoff_ms,
                    fetch_timeout: self.fetch_timeout,
                    fetch_min_rate: self.fetch_min_rate,
                    fetch_min_rate_window: self.fetch_min_rate_window,
                }
            }
        }
    };
}
common!(Bootstrap);
common!(Hook);

/// What `bootstrap` stages (docs/bootstrap.md, "Payload").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Payload {
    /// A Docker torcx image under a torcx profile (CoreOS Container Linux, Tectonic).
    Torcx,
    /// systemd-sysext images for Kubernetes and a container runtime (today's Flatcar).
    Sysext,
}

impl argh::FromArgValue for Payload {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "torcx" => Ok(Payload::Torcx),
            "sysext" => Ok(Payload::Sysext),
            _ => Err(format!("expected torcx or sysext, got {v:?}")),
        }
    }
}

/// Who vouches for a sysext image on the disk (docs/bootstrap.md, "Signed images").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysextTrust {
    /// Its SHA-256 in the signed SHA256SUMS, checked as it is fetched; signed DDIs taken too.
    Plain,
    /// Signed DDIs only, merged under the strict image policy.
    Signed,
}

impl argh::FromArgValue for SysextTrust {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "plain" => Ok(SysextTrust::Plain),
            "signed" => Ok(SysextTrust::Signed),
            _ => Err(format!("expected plain or signed, got {v:?}")),
        }
    }
}

impl std::fmt::Display for SysextTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SysextTrust::Plain => "plain",
            SysextTrust::Signed => "signed",
        })
    }
}

impl Common<'_> {
    /// The keyring that signs manifests, or `None` (with a warning) under --no-verify-signatures.
    pub fn keyring(&self, root: &Root) -> Result<Option<Keyring>> {
        if self.no_verify_signatures {
            log::warn!("--no-verify-signatures: manifests will NOT be authenticated; anyone on the path can choose what runs on this node");
            return Ok(None);
        }
        let data = self.keyring.read(root, 16 << 20, "keyring")?;
        let name = self.keyring.label(root);
        let k = Keyring::parse(&data, &name).map_err(|e| e.with_kind(Kind::Config))?;
        crate::debug!("keyring {name}: {}", k.fingerprints().join(", "));
        Ok(Some(k))
    }

    /// The API server's retry rule: attempts without an answer up to `--api-tries`, busy
    /// answers until the run's deadline.
    pub fn api_retry(&self) -> Retry {
        Retry::exponential(self.api_tries, Duration::from_secs(self.api_retry_delay))
            .until(self.run_deadline())
    }

    /// The moment `--deadline` ends the run's network attempts.
    pub fn run_deadline(&self) -> std::time::Instant {
        started() + Duration::from_secs(self.deadline)
    }

    /// The HTTPS client for manifests and images: system roots plus `--ca-file`.
    pub fn http(&self, root: &Root) -> Result<Http> {
        let tls = self.tls(root)?;
        let limits = self.limits()?;
        Ok(Http::new(&tls, self.fetch_retry()).with_limits(limits))
    }

    /// The system roots plus `--ca-file`: the downloads' trust, and `--api-server`'s.
    pub fn tls(&self, root: &Root) -> Result<Tls> {
        let mut tls = Tls::system(root)?;
        tls.fix = Some("--ca-file (a PEM file)".into());
        match self.ca_file {
            Some(Input::Host(p)) => tls.add_file(p, "--ca-file")?,
            Some(ca) => {
                let pem = ca.read(root, 16 << 20, "ca-file")?;
                tls.add_pem(&pem, &ca.name(root, "ca-file"))?;
            }
            None => {}
        }
        if tls.sources.is_empty() {
            log::warn!(
                "no trust anchors: no system CA bundle found and no --ca-file; HTTPS will fail"
            );
        } else {
            crate::debug!("trust anchors: {}", tls.sources.join(", "));
        }
        Ok(tls)
    }

    /// The downloads' retry rule: attempts without an answer up to `--fetch-attempts`, busy
    /// answers until the run's deadline.
    pub fn fetch_retry(&self) -> Retry {
        Retry::exponential(
            self.fetch_attempts,
            Duration::from_millis(self.fetch_backoff_ms),
        )
        .until(self.run_deadline())
    }

    /// The fetch options' own checks (exit 2), shared by every payload family.
    pub fn check_fetch(&self) -> Result<()> {
        at_most("--api-tries", self.api_tries as u64, 100)?;
        at_most("--api-retry-delay", self.api_retry_delay, 3600)?;
        deadline(self.deadline)?;
        at_most("--fetch-attempts", self.fetch_attempts as u64, 100)?;
        at_most("--fetch-backoff-ms", self.fetch_backoff_ms, 60_000)?;
        self.limits().map(|_| ())
    }

    fn limits(&self) -> Result<AttemptLimits> {
        AttemptLimits::from_options(
            self.fetch_timeout,
            self.fetch_min_rate,
            self.fetch_min_rate_window,
        )
    }
}

/// `nodestrap bootstrap` from the command line `args` (normalised) it was parsed from:
/// settings from the node's config file and kernel command line are merged under the command
/// line (--root, --config and --cmdline say where they are); each value is checked as it is
/// read, so an error names the file line or kernel argument; then `run`.
pub fn bootstrap(b: &Bootstrap, args: &[String], run: &dyn Fn(&Bootstrap) -> Result<()>) -> i32 {
    let merged = match settings::merge(b, args) {
        Ok(m) => m,
        Err(e) => {
            crate::logger::init(log::LevelFilter::Info);
            log::error!("{e}");
            crate::net::cluster::report_unknown(&e);
            // A node whose settings are wrong is one an operator asks about too.
            if !b.dry_run {
                crate::node::status::begin("bootstrap", &b.root);
                crate::node::status::finish(e.exit_code(), Some(&e));
            }
            last_line(e.exit_code());
            return e.exit_code();
        }
    };
    let cli = match parse(&merged.args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Cmd::Bootstrap(b) = &cli.cmd else {
        unreachable!("merged arguments keep the subcommand")
    };
    logged(&b.verbose, || {
        for n in &merged.notes {
            log::info!("{n}");
        }
        // A dry run writes nothing, not even its record, and sends no events.
        if !b.dry_run {
            begin("bootstrap", &b.root, b.events_to())?;
        }
        settings::payload_options(b, &merged)?;
        // Every run prints its plan line, a failed one too.
        run(b).inspect_err(|e| crate::net::cluster::report_unknown(e))
    })
}

/// The node's client certificate for events: the kubelet's, once it has joined.
const KUBELET_CLIENT_CERT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";

/// Where `--events-url` sends (docs/status.md, "Events"): the receiver trusted through the
/// system roots and `ca`; the node's kubelet client certificate as its identity where it has
/// one, else the bearer token in `token`.
pub fn events_target(
    root: &Root,
    url: &str,
    token: Option<&Input>,
    ca: Option<&Input>,
) -> Result<crate::net::events::Target> {
    let shown = crate::net::events::check_url(url, "--events-url")?;
    let mut tls = Tls::system(root)?;
    tls.fix = Some("--events-ca-file (a PEM file)".into());
    if let Some(ca) = ca {
        let pem = ca.read(root, 16 << 20, "events-ca-file")?;
        tls.add_pem(&pem, &ca.name(root, "events-ca-file"))?;
    }
    let cert = match root.read(KUBELET_CLIENT_CERT, 64 << 10) {
        Ok(Some(pem)) => {
            let name = root.show(KUBELET_CLIENT_CERT);
            match crate::net::kube::client_cert(&pem, &pem, &name) {
                Ok(c) => Some((c, name)),
                Err(e) => {
                    log::warn!("events: not the node's identity: {e}");
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => {
            log::warn!("events: {e}");
            None
        }
    };
    let (token, who) = match (cert, token) {
        (Some((c, name)), _) => {
            tls.client = Some(c);
            (None, format!("the kubelet's client certificate {name}"))
        }
        (None, Some(t)) => {
            let bytes = t.read(root, 4 << 10, "events-token-file")?;
            let tok = String::from_utf8(bytes)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    Error::config(format!(
                        "{}: not a bearer token (one line of printable ASCII)",
                        t.name(root, "events-token-file")
                    ))
                })?;
            (Some(tok), format!("the bearer token in {}", t.label(root)))
        }
        (None, None) => (None, "no credentials".to_string()),
    };
    log::info!("events: sending each decision and phase to {shown}, as {who}");
    Ok(crate::net::events::Target {
        url: url.to_string(),
        shown,
        tls,
        token,
        who,
    })
}

/// `nodestrap verify`, its events sent where the command line or else the node's settings
/// (config file, kernel command line) say; a wrong events setting is a warning, never the boot
/// check's failure.
pub fn verify(v: &Verify, run: &dyn Fn(&Verify) -> Result<()>) -> i32 {
    logged(&v.verbose, || {
        if let Some(t) = verify_events(v) {
            crate::node::events::open("verify", crate::net::events::Sender::start(t));
            crate::node::events::emit(
                "started",
                serde_json::json!({ "version": env!("CARGO_PKG_VERSION"), "root": "/" }),
            );
        }
        let r = run(v);
        // A check that ended before its verdict (an error) says so here.
        if crate::node::events::is_open() {
            crate::node::events::emit(
                "finished",
                serde_json::json!({
                    "exit_code": r.as_ref().map_or_else(|e| e.exit_code(), |_| 0),
                    "error": r.as_ref().err().map(|e| e.to_string()),
                }),
            );
            crate::node::events::close();
        }
        r
    })
}

fn verify_events(v: &Verify) -> Option<crate::net::events::Target> {
    let root = Root::open(Path::new("/"))
        .inspect_err(|e| log::warn!("events: {e}"))
        .ok()?;
    let node = settings::events(&root).unwrap_or_else(|e| {
        log::warn!("events: the node's settings: {e}");
        Vec::new()
    });
    let from_node = |key: &str| node.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
    let input = |given: &Option<Input>, key: &str| {
        given.clone().or_else(|| {
            from_node(key).and_then(|v| <Input as argh::FromArgValue>::from_arg_value(&v).ok())
        })
    };
    let url = v.events_url.clone().or_else(|| from_node("events-url"))?;
    if url.is_empty() {
        return None;
    }
    let token = input(&v.events_token_file, "events-token-file");
    let ca = input(&v.events_ca_file, "events-ca-file");
    events_target(&root, &url, token.as_ref(), ca.as_ref())
        .inspect_err(|e| log::warn!("events: none sent: {e}"))
        .ok()
}

/// What an in-place reprovision installs (`--flow`): it decides which Secret keys are read
/// and how the node takes its new configuration. Persisted in the state file by these names.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    Rhcos,
    Rhel,
}

impl Flow {
    pub fn name(self) -> &'static str {
        match self {
            Flow::Rhcos => "rhcos",
            Flow::Rhel => "rhel",
        }
    }
}

impl argh::FromArgValue for Flow {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "rhcos" => Ok(Flow::Rhcos),
            "rhel" => Ok(Flow::Rhel),
            _ => Err(format!("expected auto, rhcos or rhel, got {v:?}")),
        }
    }
}

/// An option that is `auto` (the command works it out) or a value given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pick<T> {
    Auto,
    Given(T),
}

impl<T: argh::FromArgValue> argh::FromArgValue for Pick<T> {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "auto" => Ok(Pick::Auto),
            _ => T::from_arg_value(v).map(Pick::Given),
        }
    }
}

/// How reprovision's RHEL flow reboots (`--reboot`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HostReboot {
    /// Only if --root is / (this system).
    Auto,
    /// --root is the host's root mounted in this pod: through the host's system bus.
    Host,
    Never,
}

impl argh::FromArgValue for HostReboot {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            // auto and never: the spellings before one vocabulary, still read.
            "true" | "auto" => Ok(HostReboot::Auto),
            "host" => Ok(HostReboot::Host),
            "false" | "never" => Ok(HostReboot::Never),
            _ => Err(format!("expected true, host or false, got {v:?}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RebootMode {
    Auto,
    Never,
}

impl argh::FromArgValue for RebootMode {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            // auto and never: the spellings before one vocabulary, still read.
            "true" | "auto" => Ok(RebootMode::Auto),
            "false" | "never" => Ok(RebootMode::Never),
            _ => Err(format!("expected true or false, got {v:?}")),
        }
    }
}

/// Options that take true/false and may be given bare (`--upgrade-os` means true).
const BOOL_OPTIONS: &[&str] = &[
    "--no-verify-signatures",
    "--upgrade-os",
    "--torcx-skip-setup",
    "--reboot",
];
/// Switches that may be written `--dry-run=true` / `--dry-run=false`.
const SWITCHES: &[&str] = &["--dry-run", "--cmdline"];

/// Rewrite Go-style arguments into what argh parses.
pub fn normalize(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a.clone());
            out.extend(it.cloned());
            break;
        }
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if SWITCHES.contains(&flag.as_str()) {
            match value.as_deref() {
                None | Some("true") | Some("1") => out.push(flag),
                Some("false") | Some("0") => {}
                Some(v) => out.extend([flag, v.to_string()]), // let argh report it
            }
            continue;
        }
        if BOOL_OPTIONS.contains(&flag.as_str()) && value.is_none() {
            let next_is_value = it.peek().is_some_and(|n| !n.starts_with("--"));
            out.push(flag);
            if !next_is_value {
                out.push("true".into());
            }
            continue;
        }
        out.push(flag);
        if let Some(v) = value {
            out.push(v);
        }
    }
    last_wins(out)
}

/// Whether `flag` (normalised) takes no value.
pub fn is_switch(flag: &str) -> bool {
    SWITCHES.contains(&flag) || flag == "--help"
}

/// Go's flag package lets a later `--flag v` override an earlier one; argh refuses duplicates.
/// Also how settings from the config file and the kernel command line, put first, give way.
pub fn last_wins(args: Vec<String>) -> Vec<String> {
    let takes_value =
        |a: &str| a.starts_with("--") && a != "--" && a != "--help" && !SWITCHES.contains(&a);
    let mut items: Vec<Vec<String>> = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--" {
            items.push(std::iter::once(a).chain(it.by_ref()).collect());
            break;
        }
        let mut item = vec![a];
        if takes_value(&item[0]) {
            item.extend(it.next());
        }
        items.push(item);
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let overridden = item.len() == 2
            && takes_value(&item[0])
            && items[i + 1..].iter().any(|l| l[0] == item[0]);
        if !overridden {
            out.extend(item.iter().cloned());
        }
    }
    out
}

pub fn at_most(flag: &str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(Error::config(format!("{flag} {value}: at most {max}")));
    }
    Ok(())
}

/// A file named by `--keyring` or `--ca-file`, and where that name came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Given on the command line: read as given.
    Host(PathBuf),
    /// Set in the config file or on the kernel command line (`from`): read under `--root`.
    Node { path: String, from: String },
}

/// A node setting reaches argh as `\0<from>\0<path>`: no argument from argv can hold a NUL
/// byte, so only ours are read as node paths, and whichever one `last_wins` keeps says so.
impl argh::FromArgValue for Input {
    fn from_arg_value(v: &str) -> std::result::Result<Self, String> {
        match v.strip_prefix('\0').and_then(|r| r.split_once('\0')) {
            Some((from, path)) => Ok(Input::Node {
                path: path.to_string(),
                from: from.to_string(),
            }),
            None => Ok(Input::Host(PathBuf::from(v))),
        }
    }
}

impl Input {
    pub(crate) fn marker(path: &str, from: &str) -> String {
        format!("\0{from}\0{path}")
    }

    /// How messages name it: `/etc/k.asc`, or `/sysroot/etc/k.asc (from /sysroot/etc/...conf)`.
    pub fn label(&self, root: &Root) -> String {
        match self {
            Input::Host(p) => p.display().to_string(),
            Input::Node { path, from } => format!("{} (from {from})", root.show(path)),
        }
    }

    /// `--keyring /etc/k.asc` or `keyring /sysroot/etc/k.asc (from ...)`.
    pub fn name(&self, root: &Root, key: &str) -> String {
        match self {
            Input::Host(_) => format!("--{key} {}", self.label(root)),
            Input::Node { .. } => format!("{key} {}", self.label(root)),
        }
    }

    /// The setting to change when the file is wrong: the option, or the line or kernel
    /// argument that set it.
    fn fix(&self, key: &str) -> String {
        match self {
            Input::Host(_) => format!("give --{key} an existing file"),
            Input::Node { from, .. } => format!("put it there, or change {key}= in {from}"),
        }
    }

    /// The whole file, at most `cap` bytes; a node path never resolves outside `root`.
    pub fn read(&self, root: &Root, cap: u64, key: &str) -> Result<Vec<u8>> {
        match self {
            Input::Host(p) => read_host_file(p, cap, &format!("--{key}")),
            // A file a setting names that is not there is the setting's error (exit 2), wherever
            // the setting was made.
            Input::Node { path, from } => match root.read(path, cap) {
                Ok(Some(b)) => Ok(b),
                Ok(None) => Err(Error::config(format!(
                    "{}: does not exist: {}",
                    self.name(root, key),
                    self.fix(key)
                ))),
                Err(e) => Err(e.context(format!("{key} (from {from})"))),
            },
        }
    }
}

/// The command line, with tectonic-torcx's multicall names (`tectonic-torcx-bootstrap`,
/// `tectonic-torcx-hook-pre`) turned into their subcommands, normalised.
pub fn args() -> Vec<String> {
    started();
    let mut argv: Vec<String> = std::env::args().collect();
    let prog = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    match prog.as_str() {
        "tectonic-torcx-bootstrap" => argv.insert(1, "bootstrap".into()),
        "tectonic-torcx-hook-pre" => argv.insert(1, "hook".into()),
        _ => {}
    }
    normalize(argv.get(1..).unwrap_or_default())
}

/// `nodestrap status`: its exit code says how the last run ended.
pub fn status(s: &Status) -> i32 {
    crate::logger::init(log::LevelFilter::Info);
    match s.command {
        RecordOf::One(c) => crate::node::status::print(&s.root, c, s.json),
        RecordOf::All => crate::node::status::print_all(&s.root, s.json),
    }
    .unwrap_or_else(|e| {
        log::error!("{e}");
        e.exit_code()
    })
}

/// `logged` for a command that keeps a status record of its run under `root` (docs/status.md);
/// a dry run writes none.
pub fn recorded(
    command: &str,
    root: &Path,
    dry_run: bool,
    verbose: &str,
    events: EventsTo,
    f: impl FnOnce() -> Result<()>,
) -> i32 {
    logged(verbose, || {
        if !dry_run {
            begin(command, root, events)?;
        }
        f()
    })
}

/// Where a command's events go (`--events-url`, `--events-token-file`, `--events-ca-file`).
pub struct EventsTo<'a> {
    pub url: Option<&'a str>,
    pub token: Option<&'a Input>,
    pub ca: Option<&'a Input>,
}

/// The commands that send events.
pub trait SendsEvents {
    fn events_to(&self) -> EventsTo<'_>;
}

macro_rules! sends_events {
    ($($t:ty),*) => {$(
        impl SendsEvents for $t {
            fn events_to(&self) -> EventsTo<'_> {
                EventsTo {
                    url: self.events_url.as_deref(),
                    token: self.events_token_file.as_ref(),
                    ca: self.events_ca_file.as_ref(),
                }
            }
        }
    )*};
}
sends_events!(Bootstrap, Hook, Reprovision, Activate, JoinService, Verify);

/// Begin `command`'s status record, its events first when it sends them (so that the receiver
/// sees the run start). A wrong events setting is the run's error, after the record began.
fn begin(command: &str, root: &Path, to: EventsTo) -> Result<()> {
    let target = to
        .url
        .map(|u| Root::open(root).and_then(|r| events_target(&r, u, to.token, to.ca)));
    let said = match target {
        Some(Ok(t)) => {
            let said = (t.shown.clone(), t.who.clone());
            crate::node::events::open(command, crate::net::events::Sender::start(t));
            Ok(Some(said))
        }
        Some(Err(e)) => Err(e),
        None => Ok(None),
    };
    crate::node::status::begin(command, root);
    if let Some((url, who)) = said? {
        crate::node::status::decide("events", url, who);
    }
    Ok(())
}

/// Start the log at `--verbose`, run `f`, and turn its result into the exit code.
pub fn logged(verbose: &str, f: impl FnOnce() -> Result<()>) -> i32 {
    let Some(level) = log_level(verbose) else {
        return 2;
    };
    crate::logger::init(level);
    let r = f();
    let code = match &r {
        Ok(()) => 0,
        Err(e) => {
            log::error!("{e}");
            e.exit_code()
        }
    };
    // The status record, when the run keeps one, ends with the same outcome.
    crate::node::status::finish(code, r.as_ref().err());
    last_line(code);
    code
}

/// The last line of every run: how long it took, whatever its end.
fn last_line(code: i32) {
    log::info!(
        "run {} after {:.1} s (exit {code})",
        if code == 0 { "done" } else { "failed" },
        started().elapsed().as_secs_f64()
    );
}

fn log_level(verbose: &str) -> Option<log::LevelFilter> {
    let l = crate::logger::parse_level(verbose);
    if l.is_none() {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "error: --verbose {verbose:?}: expected panic, fatal, error, warn, info, debug or trace"
        );
    }
    l
}

/// argh over normalised arguments; `Err` is the exit code once its output is printed.
pub fn parse(args: &[String]) -> std::result::Result<Cli, i32> {
    use std::io::Write as _;
    if matches!(args.first().map(String::as_str), Some("--version" | "-V")) {
        let line = format!("nodestrap {}\n", env!("CARGO_PKG_VERSION"));
        return Err(match std::io::stdout().write_all(line.as_bytes()) {
            Ok(()) => 0,
            Err(_) => 1,
        });
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Cli::from_args(&["nodestrap"], &refs).map_err(|e| {
        // A closed stdout or stderr must not panic; the exit code still tells.
        if e.status.is_ok() {
            let text = if e.output.starts_with("Usage: nodestrap bootstrap ") {
                help::grouped(&e.output)
            } else {
                e.output
            };
            match std::io::stdout().write_all(text.as_bytes()) {
                Ok(()) => 0,
                Err(_) => 1,
            }
        } else {
            let _ = std::io::stderr().write_all(e.output.as_bytes());
            if let Some(hint) = help::did_you_mean(&e.output, args) {
                let _ = std::io::stderr().write_all(hint.as_bytes());
            }
            2
        }
    })
}

/// `--deadline SECS` checked (1 s to a week, exit 2 otherwise): the instant it ends, counted
/// from the run's start.
pub fn deadline(secs: u64) -> Result<std::time::Instant> {
    if secs == 0 {
        return Err(Error::config("--deadline 0: at least 1"));
    }
    at_most("--deadline", secs, 7 * 24 * 3600)?;
    Ok(started() + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn go_style_flags() {
        assert_eq!(
            normalize(&s(&[
                "bootstrap",
                "--upgrade-os=false",
                "--torcx-manifest-url=",
                "--verbose=debug",
                "--torcx-skip-setup",
                "--dry-run=true"
            ])),
            s(&[
                "bootstrap",
                "--upgrade-os",
                "false",
                "--torcx-manifest-url",
                "",
                "--verbose",
                "debug",
                "--torcx-skip-setup",
                "true",
                "--dry-run"
            ])
        );
        assert_eq!(
            normalize(&s(&["--upgrade-os", "false", "--dry-run=false"])),
            s(&["--upgrade-os", "false"])
        );
        // The last of repeated options wins, as with Go's flag package.
        assert_eq!(
            normalize(&s(&[
                "bootstrap",
                "--upgrade-os=false",
                "--dry-run",
                "--root",
                "/a",
                "--upgrade-os=true"
            ])),
            s(&[
                "bootstrap",
                "--dry-run",
                "--root",
                "/a",
                "--upgrade-os",
                "true"
            ])
        );
    }

    #[test]
    fn parses_bootstrap() {
        let args = normalize(&s(&[
            "bootstrap",
            "--root=/sysroot",
            "--upgrade-os=false",
            "--reboot=never",
        ]));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let cli = Cli::from_args(&["nodestrap"], &refs).unwrap();
        let Cmd::Bootstrap(b) = cli.cmd else {
            panic!("not bootstrap")
        };
        assert_eq!(b.root, PathBuf::from("/sysroot"));
        assert!(!b.upgrade_os && b.reboot == RebootMode::Never && !b.dry_run);
        assert_eq!(b.kubelet_env_path, "/etc/kubernetes/kubelet.env");
    }

    #[test]
    fn parses_hook_as_the_daemonset_runs_it() {
        let args = normalize(&s(&[
            "hook",
            "--verbose=debug",
            "--node-annotation=example.com/ok",
            "--sleep=604800",
            "--no-verify-signatures",
        ]));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let Cmd::Hook(h) = Cli::from_args(&["nodestrap"], &refs).unwrap().cmd else {
            panic!("not hook")
        };
        assert_eq!(h.sleep, 604800);
        assert!(h.no_verify_signatures && h.node_name.is_none() && h.kubeconfig.is_none());
        assert_eq!(h.node_annotation, "example.com/ok");
        assert_eq!(
            h.version_manifest,
            PathBuf::from("/etc/runtime-mappings.yaml")
        );
    }
}
