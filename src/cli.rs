//! Command line. argh does not take `--flag=value` or bare boolean flags the way Go's flag
//! package does, and the original units pass them that way, so argv is normalised first.

use std::path::PathBuf;

use argh::FromArgs;

use crate::config::Input;

pub const DEFAULT_MANIFEST_URL: &str =
    "https://tectonic-torcx.release.core-os.net/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json";

#[derive(FromArgs, Debug)]
/// Prepare this machine to join a Kubernetes cluster before anything else runs.
pub struct Cli {
    #[argh(subcommand)]
    pub cmd: Cmd,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Cmd {
    Bootstrap(Bootstrap),
    Hook(Hook),
    Preflight(Preflight),
    Reprovision(Reprovision),
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "bootstrap")]
/// Stage the container runtime the cluster needs for this node's OS (and a pending OS update),
/// write kubelet.env, and reboot if that is needed for the runtime to apply.
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
    /// kubeconfig for the API server (node path, default /etc/kubernetes/kubeconfig)
    #[argh(option, default = "\"/etc/kubernetes/kubeconfig\".into()")]
    pub kubeconfig: String,
    /// use this Kubernetes version instead of detecting it
    #[argh(option)]
    pub force_kube_version: Option<String>,
    /// runtime mappings file (node path, default /etc/kubernetes/installer/runtime-mappings.yaml)
    #[argh(
        option,
        default = "\"/etc/kubernetes/installer/runtime-mappings.yaml\".into()"
    )]
    pub version_manifest: String,
    /// installer kubelet.env: fallback version source and template (node path)
    #[argh(option, default = "\"/etc/kubernetes/installer/kubelet.env\".into()")]
    pub installer_kubelet_env: String,
    /// torcx manifest URL template: {{.Board}} {{.OSVersion}} ${COREOS_BOARD} ${VERSION_ID}
    #[argh(option, default = "DEFAULT_MANIFEST_URL.into()")]
    pub torcx_manifest_url: String,
    /// armored OpenPGP keyring that signs manifests (host path; a node path when set on the node)
    #[argh(
        option,
        default = "Input::Host(PathBuf::from(\"/usr/share/nodestrap/keyring.asc\"))"
    )]
    pub keyring: Input,
    /// extra PEM trust anchors for the system roots (host path; a node path when set on the node)
    #[argh(option)]
    pub ca_file: Option<Input>,
    /// skip the manifest signature check (and do not fetch .asc): dangerous
    #[argh(option, default = "false")]
    pub no_verify_signatures: bool,
    /// ask update_engine to update and wait; false: only read its status (default true)
    #[argh(option, default = "true")]
    pub upgrade_os: bool,
    /// skip all torcx steps, still write kubelet.env
    #[argh(option, default = "false")]
    pub torcx_skip_setup: bool,
    /// profile to create when no user next-profile exists (default tectonic)
    #[argh(option, default = "\"tectonic\".into()")]
    pub torcx_profile: String,
    /// where to write kubelet.env (node path; empty: do not write it)
    #[argh(option, default = "\"/etc/kubernetes/kubelet.env\".into()")]
    pub kubelet_env_path: String,
    /// auto (reboot when needed, only if --root is /) or never (report only)
    #[argh(option, default = "RebootMode::Auto")]
    pub reboot: RebootMode,
    /// print the plan; write nothing, update nothing, reboot nothing
    #[argh(switch)]
    pub dry_run: bool,
    /// log level: error, warn, info, debug (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
    /// API server tries for the version and the runtime mappings (default 3)
    #[argh(option, default = "3")]
    pub api_tries: u32,
    /// seconds between API server tries (default 10)
    #[argh(option, default = "10")]
    pub api_retry_delay: u64,
    /// attempts per manifest, signature or image download (default 6)
    #[argh(option, default = "6")]
    pub fetch_attempts: u32,
    /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
    #[argh(option, default = "1000")]
    pub fetch_backoff_ms: u64,
    /// seconds to wait for update_engine to settle (default 1800)
    #[argh(option, default = "1800")]
    pub update_timeout: u64,
}

pub const DEFAULT_HOOK_ANNOTATION: &str =
    "container-linux-update.v1.coreos.com/tectonic-torcx-pre-hook-ok";

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "hook")]
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
    /// log level: error, warn, info, debug (default info)
    #[argh(option, default = "\"info\".into()")]
    pub verbose: String,
    /// API server tries per request (default 3)
    #[argh(option, default = "3")]
    pub api_tries: u32,
    /// seconds between API server tries (default 10)
    #[argh(option, default = "10")]
    pub api_retry_delay: u64,
    /// attempts per manifest, signature or image download (default 6)
    #[argh(option, default = "6")]
    pub fetch_attempts: u32,
    /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
    #[argh(option, default = "1000")]
    pub fetch_backoff_ms: u64,
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
        #[argh(subcommand, name = "preflight")]
        /// Check every dependency of an in-place re-bootstrap (Ignition or payload endpoint,
        /// registry, mirrors, progress endpoint) and print a table; exit 0 only if all pass.
        pub struct Preflight { $($body)* }

        #[derive(FromArgs, Debug)]
        #[argh(subcommand, name = "reprovision")]
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
        #[argh(option, default = "\"auto\".into()")]
        pub flow: String,
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
        /// RHEL: auto (reboot only if --root is /), host (--root is the host's root
        /// mounted in this pod: reboot the host through the system bus) or never
        #[argh(option, default = "\"auto\".into()")]
        pub reboot: String,
        /// check and fetch, change nothing on the node or the Node, reboot nothing
        #[argh(switch)]
        pub dry_run: bool,
        /// log level: error, warn, info, debug (default info)
        #[argh(option, default = "\"info\".into()")]
        pub verbose: String,
        /// API server tries per request (default 3)
        #[argh(option, default = "3")]
        pub api_tries: u32,
        /// seconds between API server tries (default 10)
        #[argh(option, default = "10")]
        pub api_retry_delay: u64,
        /// attempts per download or check (default 6)
        #[argh(option, default = "6")]
        pub fetch_attempts: u32,
        /// first retry delay in milliseconds; doubles per retry with full jitter, capped at 60 s
        #[argh(option, default = "1000")]
        pub fetch_backoff_ms: u64,
} [root, secret_dir, flow, node_name, kubeconfig, label, mcd_binary, mcd_extract_command,
    payload_entry, entry_timeout, reboot, dry_run, verbose, api_tries, api_retry_delay,
    fetch_attempts, fetch_backoff_ms]}

/// The options bootstrap and hook share, checked and used by the same code.
pub struct Common<'a> {
    pub torcx_manifest_url: &'a str,
    pub keyring: &'a Input,
    pub ca_file: Option<&'a Input>,
    pub no_verify_signatures: bool,
    pub torcx_profile: &'a str,
    pub api_tries: u32,
    pub api_retry_delay: u64,
    pub fetch_attempts: u32,
    pub fetch_backoff_ms: u64,
}

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
                    fetch_attempts: self.fetch_attempts,
                    fetch_backoff_ms: self.fetch_backoff_ms,
                }
            }
        }
    };
}
common!(Bootstrap);
common!(Hook);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RebootMode {
    Auto,
    Never,
}

impl argh::FromArgValue for RebootMode {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        match v {
            "auto" => Ok(RebootMode::Auto),
            "never" => Ok(RebootMode::Never),
            _ => Err(format!("expected auto or never, got {v:?}")),
        }
    }
}

/// Options that take true/false and may be given bare (`--upgrade-os` means true).
const BOOL_OPTIONS: &[&str] = &[
    "--no-verify-signatures",
    "--upgrade-os",
    "--torcx-skip-setup",
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
