//! Command line. argh does not take `--flag=value` or bare boolean flags the way Go's flag
//! package does, and the original units pass them that way, so argv is normalised first.

use std::path::PathBuf;

use argh::FromArgs;

use std::time::Duration;

use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Kind, Result};
use crate::net::cluster::Fallback;
use crate::net::fetch::{AttemptLimits, Http};
use crate::net::oci;
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::root::Root;

mod argv;
pub mod check;
pub mod help;
mod run;
pub mod settings;
mod types;

pub use argv::*;
pub use run::*;
pub use types::*;

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
    /// URL of the directory holding SHA256SUMS, its signature and the images, or
    /// oci://HOST[:PORT]/REPOSITORY of a registry holding them; ${NAME} or {{.Name}} is the
    /// extension's name (required with --payload sysext)
    #[argh(option, default = "String::new()")]
    pub sysext_url: String,
    /// the Kubernetes minor this node runs once bootstrapped, v1.33: a run takes patches of it
    /// only; set the next minor (after draining the node) to move it there (default: the minor
    /// of kubelet.env's KUBELET_VERSION, else the cluster's)
    #[argh(option)]
    pub kube_minor: Option<String>,
    /// also move nodestrap itself forward: /opt/bin/nodestrap, where Ignition installs it, to
    /// the newest release in the source's nodestrap folder, verified and proven to run
    /// (default false)
    #[argh(option, default = "false")]
    pub self_update: bool,
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
    /// credentials for OCI registries (an oci:// --sysext-url, a torcx manifest's oci://
    /// locations): a Docker config.json, as the kubelet reads /var/lib/kubelet/config.json
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub registry_auth: Option<Input>,
    /// containerd's config_path: OCI registries' mirrors come from
    /// <config_path>/<host>/hosts.toml as containerd reads them (node folders separated by
    /// ':', searched in turn; empty: none; default /etc/containerd/certs.d)
    #[argh(option, default = "crate::net::mirrors::DEFAULT_CONFIG_PATH.into()")]
    pub registry_config_path: String,
    /// kubeconfig for the API server (node path, default /etc/kubernetes/kubeconfig)
    #[argh(option, default = "\"/etc/kubernetes/kubeconfig\".into()")]
    pub kubeconfig: String,
    /// when --kubeconfig does not exist: the kubelet's own kubeconfig once it has joined, with
    /// its rotating client certificate (node path; empty: none; default
    /// /etc/kubernetes/kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.conf\".into()")]
    pub kubelet_kubeconfig: String,
    /// when neither kubeconfig exists: the kubelet's bootstrap kubeconfig, asked for the
    /// version only (node path; empty: none; default /etc/kubernetes/bootstrap-kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/bootstrap-kubelet.conf\".into()")]
    pub bootstrap_kubeconfig: String,
    /// when no kubeconfig exists: kubeadm's JoinConfiguration (the file `kubeadm join
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
    /// credentials for a torcx manifest's oci:// locations: a Docker config.json (pod path;
    /// default: none)
    #[argh(option)]
    pub registry_auth: Option<Input>,
    /// containerd's config_path: OCI registries' mirrors come from
    /// <config_path>/<host>/hosts.toml (node folders separated by ':', searched in turn;
    /// empty: none; default /etc/containerd/certs.d)
    #[argh(option, default = "crate::net::mirrors::DEFAULT_CONFIG_PATH.into()")]
    pub registry_config_path: String,
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

    /// A joined node's kubeconfigs, in the order they are tried: `--kubeconfig`, then the
    /// kubelet's own (`--kubelet-kubeconfig`), whose client certificate the kubelet renews for
    /// the node's life (a bootstrap token expires after a day).
    pub fn joined_kubeconfigs(&self) -> [&str; 2] {
        [&self.kubeconfig, &self.kubelet_kubeconfig]
    }

    /// Where this node finds its cluster before it has joined.
    pub fn before_join(&self) -> crate::net::cluster::BeforeJoin<'_> {
        crate::net::cluster::BeforeJoin {
            bootstrap_kubeconfig: &self.bootstrap_kubeconfig,
            join_config: &self.join_config,
            api_server: &self.api_server,
        }
    }

    /// Where the cluster's version comes from, given what this run reached (both payloads).
    pub fn version_sources<'a>(
        &'a self,
        kube: Option<&'a crate::net::kube::Kube>,
        joining: Option<&'a crate::net::cluster::Joining>,
        before_join: &'a crate::net::cluster::BeforeJoin<'a>,
    ) -> crate::net::cluster::Sources<'a> {
        crate::net::cluster::Sources {
            forced: self.force_kube_version.as_deref(),
            kube,
            joining,
            kubeconfigs: self.joined_kubeconfigs(),
            before_join,
            installer_env: &self.installer_kubelet_env,
            fallback: self.version_fallback,
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

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status", help_triggers("-h", "--help", "help"))]
/// Show what the last bootstrap decided and did (its status record); exit 0 done, 1 failed
/// with nothing in place, 3 still running, 4 no record, 5 done but the boot check found a
/// mismatch, 6 failed while an earlier run's set still runs.
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
    pub registry_auth: Option<&'a Input>,
    pub registry_config_path: &'a str,
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
                    registry_auth: self.registry_auth.as_ref(),
                    registry_config_path: &self.registry_config_path,
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

impl Common<'_> {
    /// The keyring that signs manifests, or `None` (with a warning) under --no-verify-signatures.
    pub fn keyring(&self, root: &Root) -> Result<Option<Keyring>> {
        if self.no_verify_signatures {
            log::warn!("--no-verify-signatures: manifests will NOT be authenticated; anyone on the path can choose what runs on this node");
            crate::node::status::signatures(false, "--no-verify-signatures");
            return Ok(None);
        }
        let data = self.keyring.read(root, 16 << 20, "keyring")?;
        let name = self.keyring.label(root);
        let k = Keyring::parse(&data, &name).map_err(|e| e.with_kind(Kind::Config))?;
        crate::debug!("keyring {name}: {}", k.fingerprints().join(", "));
        crate::node::status::signatures(true, format_args!("keyring {name}"));
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

    /// The OCI registry client over `http`: `--registry-auth`'s credentials (none without it:
    /// a registry that asks for some is refused, naming the option) and the mirrors of
    /// `--registry-config-path` on the node.
    pub fn registry<'h>(&self, root: &'h Root, http: &'h Http) -> Result<oci::Client<'h>> {
        let auths = match self.registry_auth {
            Some(input) => {
                let data = input.read(root, oci::AUTH_FILE_CAP, "registry-auth")?;
                oci::Auths::parse(&data, &input.name(root, "registry-auth"))?
            }
            None => oci::Auths::default(),
        };
        let mirrors = oci::Mirrors {
            root,
            config_path: self.registry_config_path.to_string(),
        };
        Ok(oci::Client::new(http, auths, mirrors))
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

pub fn at_most(flag: &str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(Error::config(format!("{flag} {value}: at most {max}")));
    }
    Ok(())
}

/// argh over normalised arguments; `Err` is the exit code once its output is printed.
pub fn parse(args: &[String]) -> std::result::Result<Cli, i32> {
    use std::io::Write as _;
    if matches!(args.first().map(String::as_str), Some("--version" | "-V")) {
        let line = format!("nodestrap {}\n", crate::VERSION);
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
