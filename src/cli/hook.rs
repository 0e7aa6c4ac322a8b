//! `nodestrap hook`'s options (the update operator's pre-reboot hook).

use std::path::PathBuf;

use argh::FromArgs;

use super::*;

pub(crate) const DEFAULT_HOOK_ANNOTATION: &str =
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
    pub(crate) kubeconfig: Option<PathBuf>,
    /// this Node's name (default: env NODE)
    #[argh(option)]
    pub(crate) node_name: Option<String>,
    /// annotation set to "true" on the Node once done
    #[argh(option, default = "DEFAULT_HOOK_ANNOTATION.into()")]
    pub(crate) node_annotation: String,
    /// runtime mappings file (pod path, default /etc/runtime-mappings.yaml)
    #[argh(option, default = "PathBuf::from(\"/etc/runtime-mappings.yaml\")")]
    pub(crate) version_manifest: PathBuf,
    /// once done, stay up idle (sleeping this many seconds at a time) until SIGTERM; 0: exit
    #[argh(option, default = "0")]
    pub(crate) sleep: u64,
    /// torcx manifest URL template: {{.Board}} {{.OSVersion}} ${COREOS_BOARD} ${VERSION_ID}
    #[argh(option, default = "DEFAULT_MANIFEST_URL.into()")]
    pub(crate) torcx_manifest_url: String,
    /// armored OpenPGP keyring that signs manifests (pod path)
    #[argh(
        option,
        default = "Input::Host(PathBuf::from(\"/usr/share/nodestrap/keyring.asc\"))"
    )]
    pub(crate) keyring: Input,
    /// extra PEM trust anchors for the system roots (pod path)
    #[argh(option)]
    pub(crate) ca_file: Option<Input>,
    /// credentials for a torcx manifest's oci:// locations: a Docker config.json (pod path;
    /// default: none)
    #[argh(option)]
    pub(crate) registry_auth: Option<Input>,
    /// containerd's config_path: OCI registries' mirrors come from
    /// <config_path>/<host>/hosts.toml (node folders separated by ':', searched in turn;
    /// empty: none; default /etc/containerd/certs.d)
    #[argh(option, default = "crate::net::mirrors::DEFAULT_CONFIG_PATH.into()")]
    pub(crate) registry_config_path: String,
    /// skip the manifest signature check (and do not fetch .asc): dangerous
    #[argh(option, default = "false")]
    pub(crate) no_verify_signatures: bool,
    /// profile to create when no user next-profile exists (default tectonic)
    #[argh(option, default = "\"tectonic\".into()")]
    pub(crate) torcx_profile: String,
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
    /// API server attempts without an answer per request (default 3)
    #[argh(option, default = "3")]
    pub(crate) api_tries: u32,
    /// first API retry delay in seconds; doubles per retry with full jitter, capped at 60 s (default 10)
    #[argh(option, default = "10")]
    pub(crate) api_retry_delay: u64,
    /// seconds the run's network attempts may take in all (default 600)
    #[argh(option, default = "HOOK_DEADLINE_SECS")]
    pub(crate) deadline: u64,
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
    /// largest image taken, in MiB (default 512)
    #[argh(option, default = "TORCX_IMAGE_MAX_MIB")]
    pub(crate) image_max_mib: u64,
}

impl Hook {
    pub(crate) fn image_max_bytes(&self) -> u64 {
        self.image_max_mib << 20
    }
}
