//! Command line. argh does not take `--flag=value` or bare boolean flags the way Go's flag
//! package does, and the original units pass them that way, so argv is normalised first.

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

mod activation;
pub mod argv;
mod bootstrap;
pub(crate) mod check;
pub(crate) mod help;
mod hook;
mod inplace;
mod record;
mod run;
pub mod settings;
mod types;

pub(crate) use activation::*;
pub use argv::*;
pub use bootstrap::*;
pub(crate) use hook::*;
pub use inplace::*;
pub(crate) use record::*;
pub use run::*;
pub use types::*;

#[derive(FromArgs, Debug)]
#[argh(help_triggers("-h", "--help", "help"))]
/// Prepare this machine to join a Kubernetes cluster before anything else runs.
pub struct Cli {
    #[argh(subcommand)]
    pub cmd: Cmd,
}

/// The subcommands' names, for a did-you-mean.
pub(crate) const COMMANDS: &[&str] = &[
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

/// The options bootstrap and hook share, checked and used by the same code.
pub struct Common<'a> {
    pub(crate) torcx_manifest_url: &'a str,
    pub(crate) keyring: &'a Input,
    pub(crate) ca_file: Option<&'a Input>,
    pub(crate) registry_auth: Option<&'a Input>,
    pub(crate) registry_config_path: &'a str,
    pub(crate) no_verify_signatures: bool,
    pub(crate) torcx_profile: &'a str,
    pub(crate) api_tries: u32,
    pub(crate) api_retry_delay: u64,
    pub(crate) deadline: u64,
    pub(crate) fetch_attempts: u32,
    pub(crate) fetch_backoff_ms: u64,
    pub(crate) fetch_timeout: u64,
    pub(crate) fetch_min_rate: u64,
    pub(crate) fetch_min_rate_window: u64,
}

/// `--deadline`'s default: half of k8s-node-bootstrap.service's TimeoutStartSec=1h, so that the
/// unit's own retry gets a full run before systemd gives up on it.
pub(crate) const DEFAULT_DEADLINE_SECS: u64 = 1800;

/// The hook's `--deadline` default. The update operator waits for the hook's annotation with
/// no time limit of its own, and a hook that exits 1 is started again by the kubelet (its
/// restart back-off grows to 5 minutes): a shorter run that fails and is restarted beats one
/// that holds on for half an hour, and the node is asked again about every 15 minutes.
pub(crate) const HOOK_DEADLINE_SECS: u64 = 600;

/// When this process started (`args()` reads it first): `--deadline` counts from here.
pub(crate) use crate::node::status::started;

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
    pub(crate) fn keyring(&self, root: &Root) -> Result<Option<Keyring>> {
        if self.no_verify_signatures {
            crate::warn!("--no-verify-signatures: manifests will NOT be authenticated; anyone on the path can choose what runs on this node");
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
            .handed_over_as("api")
    }

    /// The moment `--deadline` ends the run's network attempts.
    pub(crate) fn run_deadline(&self) -> std::time::Instant {
        started() + Duration::from_secs(self.deadline)
    }

    /// The HTTPS client for manifests and images: system roots plus `--ca-file`.
    pub(crate) fn http(&self, root: &Root) -> Result<Http> {
        let tls = self.tls(root)?;
        let limits = self.limits()?;
        Ok(Http::new(&tls, self.fetch_retry()).with_limits(limits))
    }

    /// The OCI registry client over `http`: `--registry-auth`'s credentials (none without it:
    /// a registry that asks for some is refused, naming the option) and the mirrors of
    /// `--registry-config-path` on the node.
    pub(crate) fn registry<'h>(&self, root: &'h Root, http: &'h Http) -> Result<oci::Client<'h>> {
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
    pub(crate) fn tls(&self, root: &Root) -> Result<Tls> {
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
            crate::warn!(
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
        .handed_over_as("downloads")
    }

    /// The fetch options' own checks (exit 2), shared by every payload family.
    pub(crate) fn check_fetch(&self) -> Result<()> {
        at_most("--api-tries", self.api_tries as u64, 100)?;
        at_most("--api-retry-delay", self.api_retry_delay, 3600)?;
        deadline(self.deadline)?;
        at_most("--fetch-attempts", self.fetch_attempts as u64, 100)?;
        at_most("--fetch-backoff-ms", self.fetch_backoff_ms, 60_000)?;
        self.limits().map(|_| ())
    }

    /// Each attempt's limits: `--fetch-timeout`, `--fetch-min-rate` and its window.
    pub fn limits(&self) -> Result<AttemptLimits> {
        AttemptLimits::from_options(
            self.fetch_timeout,
            self.fetch_min_rate,
            self.fetch_min_rate_window,
        )
    }
}

pub(crate) fn at_most(flag: &str, value: u64, max: u64) -> Result<()> {
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
pub(crate) fn deadline(secs: u64) -> Result<std::time::Instant> {
    if secs == 0 {
        return Err(Error::config("--deadline 0: at least 1"));
    }
    at_most("--deadline", secs, 7 * 24 * 3600)?;
    Ok(started() + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
