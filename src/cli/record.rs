//! `nodestrap status` and `nodestrap verify`: reading the status record, and the boot check.

use std::path::PathBuf;

use argh::FromArgs;

use super::*;

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status", help_triggers("-h", "--help", "help"))]
/// Show what the last bootstrap decided and did (its status record); exit 0 done, 1 failed
/// with nothing in place, 3 still running, 4 no record, 5 done but the boot check found a
/// mismatch, 6 failed while an earlier run's set still runs.
pub struct Status {
    /// the node's root, for the record kept under /var/lib when /run has none (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    pub(crate) root: PathBuf,
    /// whose record: bootstrap, hook, preflight, reprovision, activate, join-service, or all
    /// (each one found; the exit code is bootstrap's) (default bootstrap)
    #[argh(option, default = "RecordOf::One(\"bootstrap\")")]
    pub(crate) command: RecordOf,
    /// print the record as JSON (schema: docs/status.md)
    #[argh(switch)]
    pub(crate) json: bool,
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
    pub(crate) kubeconfig: String,
    /// the Node's name (default: the host name in lower case, as the kubelet registers)
    #[argh(option)]
    pub(crate) node_name: Option<String>,
    /// seconds to wait for the API server to confirm the Node's versions; 0: do not ask
    /// (default 60)
    #[argh(option, default = "60")]
    pub(crate) api_wait: u64,
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
    /// folder of node_exporter's textfile collector: nodestrap_verify.prom there holds the last
    /// check's figures (docs/status.md, "Metrics"; default: the node's setting, else none)
    #[argh(option)]
    pub(crate) metrics_dir: Option<String>,
    /// log level, any case: panic, fatal, error, warn, info, debug, trace (default info)
    #[argh(option, default = "\"info\".into()")]
    pub(crate) verbose: String,
}
