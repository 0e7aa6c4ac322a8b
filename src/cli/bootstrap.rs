//! `nodestrap bootstrap`'s options, their defaults, and what the run derives from them.

use std::path::PathBuf;

use argh::FromArgs;

use super::*;

pub(crate) const DEFAULT_MANIFEST_URL: &str =
    "https://tectonic-torcx.release.core-os.net/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json";

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
    pub(crate) root: PathBuf,
    /// key=value settings file (node path, default /etc/nodestrap/bootstrap.conf; empty: none)
    #[argh(option)]
    pub(crate) config: Option<String>,
    /// also take nodestrap.<key>=<value> settings from the kernel command line (/proc/cmdline)
    #[argh(switch)]
    pub(crate) cmdline: bool,
    /// payload family: torcx (runtime image under a torcx profile) or sysext (default torcx)
    #[argh(option, default = "Payload::Torcx")]
    pub payload: Payload,
    /// URL of the directory holding SHA256SUMS, its signature and the images, or
    /// oci://HOST[:PORT]/REPOSITORY of a registry holding them; ${NAME} or {{.Name}} is the
    /// extension's name (required with --payload sysext)
    #[argh(option, default = "String::new()")]
    pub(crate) sysext_url: String,
    /// the Kubernetes minor this node runs once bootstrapped, v1.33: a run takes patches of it
    /// only; set the next minor (after draining the node) to move it there (default: the minor
    /// of kubelet.env's KUBELET_VERSION, else the cluster's)
    #[argh(option)]
    pub(crate) kube_minor: Option<String>,
    /// also move nodestrap itself forward: /opt/bin/nodestrap, where Ignition installs it, to
    /// the newest release in the source's nodestrap folder, verified and proven to run
    /// (default false)
    #[argh(option, default = "false")]
    pub(crate) self_update: bool,
    /// let these exact versions through the version floor, NAME=VERSION, comma-separated
    /// (kubernetes=v1.37.1 for an extension, docker=17.03 for a torcx image): an explicit
    /// downgrade, recorded, which lowers the floor (default: none)
    #[argh(option, default = "String::new()")]
    pub(crate) allow_downgrade: String,
    /// who vouches for a sysext image on the disk: plain (its SHA-256 in the signed
    /// SHA256SUMS, as fetched; signed DDIs taken too) or signed (signed DDIs only, merged under
    /// the strict image policy) (default plain)
    #[argh(option, default = "SysextTrust::Plain")]
    pub(crate) sysext_trust: SysextTrust,
    /// PEM file of the certificates whose signatures over verity root hashes are trusted,
    /// installed in /etc/verity.d (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub(crate) sysext_verity_certs: Option<Input>,
    /// credentials for OCI registries (an oci:// --sysext-url, a torcx manifest's oci://
    /// locations): a Docker config.json, as the kubelet reads /var/lib/kubelet/config.json
    /// (host path; a node path when set on the node; default: none)
    #[argh(option)]
    pub(crate) registry_auth: Option<Input>,
    /// containerd's config_path: OCI registries' mirrors come from
    /// <config_path>/<host>/hosts.toml as containerd reads them (node folders separated by
    /// ':', searched in turn; empty: none; default /etc/containerd/certs.d)
    #[argh(option, default = "crate::net::mirrors::DEFAULT_CONFIG_PATH.into()")]
    pub(crate) registry_config_path: String,
    /// kubeconfig for the API server (node path, default /etc/kubernetes/kubeconfig)
    #[argh(option, default = "\"/etc/kubernetes/kubeconfig\".into()")]
    pub(crate) kubeconfig: String,
    /// when --kubeconfig does not exist: the kubelet's own kubeconfig once it has joined, with
    /// its rotating client certificate (node path; empty: none; default
    /// /etc/kubernetes/kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.conf\".into()")]
    pub(crate) kubelet_kubeconfig: String,
    /// when neither kubeconfig exists: the kubelet's bootstrap kubeconfig, asked for the
    /// version only (node path; empty: none; default /etc/kubernetes/bootstrap-kubelet.conf)
    #[argh(option, default = "\"/etc/kubernetes/bootstrap-kubelet.conf\".into()")]
    pub(crate) bootstrap_kubeconfig: String,
    /// when no kubeconfig exists: kubeadm's JoinConfiguration (the file `kubeadm join
    /// --config` takes), its discovery asked for the version only (node path; default: none)
    #[argh(option, default = "String::new()")]
    pub(crate) join_config: String,
    /// when no kubeconfig nor join configuration exists: the API server's URL, its /version read without
    /// credentials, trusted through the system roots and --ca-file (default: none)
    #[argh(option, default = "String::new()")]
    pub(crate) api_server: String,
    /// use this Kubernetes version instead of asking the API server: v1.31.7 that exact patch,
    /// v1.31 the newest patch of the minor (sysext only) (default: ask)
    #[argh(option)]
    pub(crate) force_kube_version: Option<String>,
    /// runtime mappings file (node path, default /etc/kubernetes/installer/runtime-mappings.yaml)
    #[argh(
        option,
        default = "\"/etc/kubernetes/installer/runtime-mappings.yaml\".into()"
    )]
    pub(crate) version_manifest: String,
    /// installer kubelet.env: fallback version source and template (node path, default
    /// /etc/kubernetes/installer/kubelet.env)
    #[argh(option, default = "\"/etc/kubernetes/installer/kubelet.env\".into()")]
    pub(crate) installer_kubelet_env: String,
    /// torcx manifest URL template: {{.Board}} {{.OSVersion}} ${COREOS_BOARD} ${VERSION_ID}
    /// (default Tectonic's, tectonic-torcx.release.core-os.net)
    #[argh(option, default = "DEFAULT_MANIFEST_URL.into()")]
    pub(crate) torcx_manifest_url: String,
    /// armored OpenPGP keyring that signs manifests and SHA256SUMS (host path; a node path when
    /// set on the node; default /usr/share/nodestrap/keyring.asc)
    #[argh(
        option,
        default = "Input::Host(PathBuf::from(\"/usr/share/nodestrap/keyring.asc\"))"
    )]
    pub(crate) keyring: Input,
    /// extra PEM trust anchors beside the system roots (host path; a node path when set on the
    /// node; default: the system roots only)
    #[argh(option)]
    pub(crate) ca_file: Option<Input>,
    /// skip the signature check of manifests and SHA256SUMS (and do not fetch them): dangerous
    /// (default false)
    #[argh(option, default = "false")]
    pub(crate) no_verify_signatures: bool,
    /// ask update_engine to update and wait; false: only read its status (default true)
    #[argh(option, default = "true")]
    pub(crate) upgrade_os: bool,
    /// skip all torcx steps, still write kubelet.env (default false)
    #[argh(option, default = "false")]
    pub(crate) torcx_skip_setup: bool,
    /// profile to create when no user next-profile exists (default tectonic)
    #[argh(option, default = "\"tectonic\".into()")]
    pub(crate) torcx_profile: String,
    /// where to write kubelet.env (node path; empty: do not write it; default
    /// /etc/kubernetes/kubelet.env)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.env\".into()")]
    pub(crate) kubelet_env_path: String,
    /// reboot when the OS update or the runtime needs it, only if --root is /; false: report
    /// only (default true)
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
    /// folder of node_exporter's textfile collector: nodestrap_bootstrap.prom there holds the
    /// last run's figures (docs/status.md, "Metrics"; node path; default: none)
    #[argh(option)]
    pub(crate) metrics_dir: Option<String>,
    /// print the plan; write nothing, update nothing, reboot nothing
    #[argh(switch)]
    pub(crate) dry_run: bool,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub(crate) verbose: String,
    /// API server attempts without an answer before it is unreachable (default 3)
    #[argh(option, default = "3")]
    pub(crate) api_tries: u32,
    /// first API retry delay in seconds; doubles per retry with full jitter, capped at 60 s (default 10)
    #[argh(option, default = "10")]
    pub(crate) api_retry_delay: u64,
    /// when the installer files may give the version: unreachable, never, always-after-deadline (default unreachable)
    #[argh(option, default = "Fallback::Unreachable")]
    pub version_fallback: Fallback,
    /// seconds the run's network attempts may take in all (default 1800)
    #[argh(option, default = "DEFAULT_DEADLINE_SECS")]
    pub deadline: u64,
    /// seconds to wait for time synchronisation when the clock is behind its floor (default 60)
    #[argh(option, default = "60")]
    pub(crate) clock_wait: u64,
    /// attempts per manifest, signature or image download (default 6)
    #[argh(option, default = "6")]
    pub(crate) fetch_attempts: u32,
    /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
    /// (default 1000)
    #[argh(option, default = "1000")]
    pub(crate) fetch_backoff_ms: u64,
    /// seconds one download attempt may take, from connecting to the last byte (default 300)
    #[argh(option, default = "crate::net::fetch::DEFAULT_ATTEMPT_SECS")]
    pub(crate) fetch_timeout: u64,
    /// bytes per second each --fetch-min-rate-window of a transfer must average (default 1024; 0: no floor)
    #[argh(option, default = "crate::net::fetch::DEFAULT_MIN_RATE")]
    pub(crate) fetch_min_rate: u64,
    /// seconds over which --fetch-min-rate is averaged (default 30)
    #[argh(option, default = "crate::net::fetch::DEFAULT_RATE_WINDOW_SECS")]
    pub(crate) fetch_min_rate_window: u64,
    /// seconds to wait for update_engine to settle (default 1800)
    #[argh(option, default = "1800")]
    pub(crate) update_timeout: u64,
    /// largest image taken, in MiB (default 512 for torcx, 1024 for sysext)
    #[argh(option)]
    pub(crate) image_max_mib: Option<u64>,
}

/// `--image-max-mib`'s defaults: Container Linux's docker torcx images are 50 to 100 MB, a
/// Kubernetes sysext image (kubelet, kubeadm, kubectl) about 100 MB.
pub(crate) const TORCX_IMAGE_MAX_MIB: u64 = 512;
pub(crate) const SYSEXT_IMAGE_MAX_MIB: u64 = 1024;
/// Its bound: no image is larger than this.
const IMAGE_MAX_MIB_LIMIT: u64 = 64 << 10;

impl Bootstrap {
    /// The largest image this payload family takes, in bytes.
    pub(crate) fn image_max_bytes(&self) -> u64 {
        let mib = self.image_max_mib.unwrap_or(match self.payload {
            Payload::Torcx => TORCX_IMAGE_MAX_MIB,
            Payload::Sysext => SYSEXT_IMAGE_MAX_MIB,
        });
        mib << 20
    }

    /// A joined node's kubeconfigs, in the order they are tried: `--kubeconfig`, then the
    /// kubelet's own (`--kubelet-kubeconfig`), whose client certificate the kubelet renews for
    /// the node's life (a bootstrap token expires after a day).
    pub(crate) fn joined_kubeconfigs(&self) -> [&str; 2] {
        [&self.kubeconfig, &self.kubelet_kubeconfig]
    }

    /// Where this node finds its cluster before it has joined.
    pub(crate) fn before_join(&self) -> crate::net::cluster::BeforeJoin<'_> {
        crate::net::cluster::BeforeJoin {
            bootstrap_kubeconfig: &self.bootstrap_kubeconfig,
            join_config: &self.join_config,
            api_server: &self.api_server,
        }
    }

    /// Where the cluster's version comes from, given what this run reached (both payloads).
    pub(crate) fn version_sources<'a>(
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

/// `--image-max-mib`'s own check.
pub(crate) fn check_image_max(mib: u64) -> Result<()> {
    if mib == 0 {
        return Err(Error::config("--image-max-mib 0: at least 1"));
    }
    at_most("--image-max-mib", mib, IMAGE_MAX_MIB_LIMIT)
}
