//! `nodestrap preflight` and `nodestrap reprovision`: the in-place reprovision's options,
//! one field list for both.

use std::path::PathBuf;

use argh::FromArgs;

use super::*;

pub(crate) const DEFAULT_IPB_LABEL: &str = "ibm-cloud.kubernetes.io/ipb-schedule";
/// `oc image extract` as IBM's in-place bootstrapper outline does it; `{image}`, `{dir}` and
/// `{root}` are replaced in each argument (no shell).
pub(crate) const DEFAULT_MCD_EXTRACT: &str = "oc image extract --registry-config={root}/var/lib/kubelet/config.json --confirm --path /usr/bin/machine-config-daemon:{dir} {image}";

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
        pub(crate) secret_dir: PathBuf,
        /// auto (from the node's os-release ID), rhcos or rhel (default auto)
        #[argh(option, default = "Pick::Auto")]
        pub(crate) flow: Pick<Flow>,
        /// this Node's name (default: env NODE)
        #[argh(option)]
        pub(crate) node_name: Option<String>,
        /// kubeconfig (pod path); default: the pod's service account
        #[argh(option)]
        pub(crate) kubeconfig: Option<PathBuf>,
        /// label removed from the Node before it reboots
        #[argh(option, default = "DEFAULT_IPB_LABEL.into()")]
        pub(crate) label: String,
        /// RHCOS: machine-config-daemon binary (pod path); default: extract it from the
        /// machine-config-operator image the Ignition config names
        #[argh(option)]
        pub(crate) mcd_binary: Option<PathBuf>,
        /// RHCOS: command that extracts machine-config-daemon into {dir} from {image}
        #[argh(option, default = "DEFAULT_MCD_EXTRACT.into()")]
        pub(crate) mcd_extract_command: String,
        /// RHEL: the payload's entry script, relative to its top (default bootstrap.sh)
        #[argh(option, default = "\"bootstrap.sh\".into()")]
        pub(crate) payload_entry: String,
        /// RHEL: seconds the entry script may run (default 3600)
        #[argh(option, default = "3600")]
        pub(crate) entry_timeout: u64,
        /// RHEL: true (reboot only if --root is /), host (--root is the host's root
        /// mounted in this pod: reboot the host through the system bus) or false (default true)
        #[argh(option, default = "HostReboot::Auto")]
        pub(crate) reboot: HostReboot,
        /// check and fetch, change nothing on the node or the Node, reboot nothing
        #[argh(switch)]
        pub dry_run: bool,
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
        /// attempts per download or check (default 6)
        #[argh(option, default = "6")]
        pub(crate) fetch_attempts: u32,
        /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
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
        /// seconds the run's network attempts may take in all (default 60 for preflight, 1800
        /// for reprovision)
        #[argh(option)]
        pub(crate) deadline: Option<u64>,
} [root, secret_dir, flow, node_name, kubeconfig, label, mcd_binary, mcd_extract_command,
    payload_entry, entry_timeout, reboot, dry_run, events_url, events_token_file,
    events_ca_file, verbose, api_tries, api_retry_delay,
    fetch_attempts, fetch_backoff_ms, fetch_timeout, fetch_min_rate, fetch_min_rate_window,
    deadline]}

/// `--deadline`'s defaults of the in-place commands. preflight is a check a person or a
/// pipeline waits for: its table prints within this. reprovision is bootstrap's work (the same
/// downloads) in a DaemonSet pod that the kubelet restarts after a failure: bootstrap's default.
pub(crate) const PREFLIGHT_DEADLINE_SECS: u64 = 60;
pub(crate) const REPROVISION_DEADLINE_SECS: u64 = DEFAULT_DEADLINE_SECS;
