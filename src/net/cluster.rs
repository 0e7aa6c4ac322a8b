//! The cluster's Kubernetes version, from the same sources for every payload family: a forced
//! version, else the API server's `/version` through the kubeconfig, else (the fallback, when
//! `--version-fallback` allows it) `KUBELET_IMAGE_TAG` in the installer's kubelet.env
//! (docs/bootstrap.md, "The cluster's version").

use std::fmt;

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError};
use crate::net::join_config::Unreached;
use crate::net::kube::Kube;
use crate::node::envfile::EnvFile;
use crate::node::root::Root;
use crate::node::status;

/// When the node's own files may stand in for the cluster's answer (`--version-fallback`).
/// A busy API server (429, 503, other 5xx) is not an absent one: only `AfterDeadline` falls
/// back from it, and only once the run's deadline has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No kubeconfig, or no answer at all (refused, not resolved, timed out): the default.
    Unreachable,
    /// Never: without the API server's answer the run fails.
    Never,
    /// Any failure, once retrying is over (for a busy server: at the run's deadline).
    AfterDeadline,
}

impl Fallback {
    pub(crate) const WORDS: &'static str = "unreachable, never or always-after-deadline";

    pub(crate) fn parse(v: &str) -> Option<Fallback> {
        match v {
            "unreachable" => Some(Fallback::Unreachable),
            "never" => Some(Fallback::Never),
            "always-after-deadline" => Some(Fallback::AfterDeadline),
            _ => None,
        }
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Fallback::Unreachable => "unreachable",
            Fallback::Never => "never",
            Fallback::AfterDeadline => "always-after-deadline",
        }
    }

    /// Whether the API server's failure lets the node's files decide.
    pub fn allows(self, f: Failure) -> bool {
        match self {
            Fallback::Never => false,
            Fallback::AfterDeadline => true,
            Fallback::Unreachable => f == Failure::Unreachable,
        }
    }
}

impl argh::FromArgValue for Fallback {
    fn from_arg_value(v: &str) -> std::result::Result<Self, String> {
        Fallback::parse(v).ok_or_else(|| format!("expected {}, got {v:?}", Fallback::WORDS))
    }
}

/// Where the version may come from, in order.
pub(crate) struct Sources<'a> {
    /// `--force-kube-version`.
    pub(crate) forced: Option<&'a str>,
    /// The API server, when a kubeconfig exists.
    pub(crate) kube: Option<&'a Kube>,
    /// Else what `before_join` reached.
    pub(crate) joining: Option<&'a Joining>,
    /// A joined node's kubeconfigs (`--kubeconfig`, `--kubelet-kubeconfig`), and the sources of
    /// a node that has not joined, named when none is there.
    pub(crate) kubeconfigs: [&'a str; 2],
    pub(crate) before_join: &'a BeforeJoin<'a>,
    /// `--installer-kubelet-env`.
    pub(crate) installer_env: &'a str,
    /// `--version-fallback`.
    pub(crate) fallback: Fallback,
}

impl Sources<'_> {
    /// What was looked for and not found, for a message.
    fn none_there(&self, root: &Root) -> String {
        let at = |p: &str| {
            if p.is_empty() {
                "none set".to_string()
            } else {
                format!("none at {}", root.show(p))
            }
        };
        format!(
            "no kubeconfig ({}), no kubelet kubeconfig ({}), no kubelet bootstrap kubeconfig ({}), no join configuration ({}) and no --api-server",
            at(self.kubeconfigs[0]),
            at(self.kubeconfigs[1]),
            at(self.before_join.bootstrap_kubeconfig),
            at(self.before_join.join_config)
        )
    }
}

/// A joined node's client: the first of `kubeconfigs` that exists (empty paths are skipped):
/// `--kubeconfig`, then the kubelet's own kubeconfig, so that a node keeps asking with its own
/// credentials long after its bootstrap token has expired.
pub(crate) fn joined(
    root: &Root,
    kubeconfigs: [&str; 2],
    retry: crate::net::retry::Retry,
) -> Result<Option<Kube>> {
    for p in kubeconfigs.into_iter().filter(|p| !p.is_empty()) {
        if let Some(k) = Kube::from_kubeconfig(root, p, retry)? {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

/// Where a node that has not joined finds its cluster, in this order: `--bootstrap-kubeconfig`,
/// `--join-config`, `--api-server` (empty: not set).
pub(crate) struct BeforeJoin<'a> {
    pub(crate) bootstrap_kubeconfig: &'a str,
    pub(crate) join_config: &'a str,
    pub(crate) api_server: &'a str,
}

/// What a node that has not joined reached (`before_join`).
// One per run: the client's size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Joining {
    /// A client, asked for `/version` under the fallback policy.
    Client(Kube),
    /// kubeadm's token discovery could not reach the API server before a client existed.
    Unreached(Unreached),
}

/// A node that has not joined has no kubeconfig, but the cluster it will join already answers
/// `/version` (system:public-info-viewer: anyone, authenticated or not): ask it through the
/// kubelet's bootstrap kubeconfig, else through kubeadm's join configuration, else at
/// `--api-server` without credentials. For the version only. `None` when none is set or there.
pub(crate) fn before_join(
    root: &Root,
    b: &BeforeJoin,
    retry: crate::net::retry::Retry,
    tls: impl FnOnce() -> Result<crate::net::tls::Tls>,
) -> Result<Option<Joining>> {
    let BeforeJoin {
        bootstrap_kubeconfig,
        join_config,
        api_server,
    } = *b;
    if !bootstrap_kubeconfig.is_empty() {
        if let Some(k) = Kube::from_kubeconfig(root, bootstrap_kubeconfig, retry)? {
            crate::info!(
                "no kubeconfig yet: asking the API server for its version through the kubelet's bootstrap kubeconfig {}",
                root.show(bootstrap_kubeconfig)
            );
            return Ok(Some(Joining::Client(k)));
        }
    }
    if !join_config.is_empty() {
        if let Some(reached) = crate::net::join_config::kube(root, join_config, retry)? {
            crate::info!(
                "no kubeconfig yet: asking the API server for its version through the join configuration {}",
                root.show(join_config)
            );
            return Ok(Some(match reached {
                Ok(k) => Joining::Client(k),
                Err(u) => Joining::Unreached(u),
            }));
        }
    }
    if api_server.is_empty() {
        return Ok(None);
    }
    crate::info!("no kubeconfig yet: asking {api_server} for its version, without credentials");
    Kube::anonymous(api_server, tls()?, retry).map(|k| Some(Joining::Client(k)))
}

/// Where the version came from, for the log, the plan and the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Forced,
    /// The API server's `/version`, with where the credentials came from.
    ApiServer(String),
    /// The installer's kubelet.env, and why the API server did not decide.
    Fallback {
        file: String,
        why: String,
    },
}

impl Source {
    /// One word for counting nodes: `forced`, `api-server` or `fallback`.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Source::Forced => "forced",
            Source::ApiServer(_) => "api-server",
            Source::Fallback { .. } => "fallback",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Forced => f.write_str("--force-kube-version"),
            Source::ApiServer(creds) => {
                write!(f, "the API server, GET /version, credentials from {creds}")
            }
            Source::Fallback { file, why } => {
                write!(f, "KUBELET_IMAGE_TAG in {file}, a fallback: {why}")
            }
        }
    }
}

/// The cluster's version and its source.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub(crate) value: String,
    pub(crate) source: Source,
}

/// Whether this run printed its plan line.
static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Version {
    /// The plan's line on stdout as soon as the version is known, also under `--dry-run`:
    /// `nodestrap: k8s=<v> from=<word> (<source>)`.
    fn report(&self) -> Result<()> {
        REPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::outln!(
            "nodestrap: k8s={} from={} ({})",
            self.value,
            self.source.word(),
            self.source
        )
    }
}

/// The plan line of a run that ended before its version was known, so that every run prints
/// one (`nodestrap: k8s=unknown from=none (<error>)`): a fleet's count of `from=` words then
/// covers the failed nodes too.
pub(crate) fn report_unknown(why: &dyn fmt::Display) {
    if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        // Best effort: the run has failed already and says why on stderr.
        let _ = crate::outln!("nodestrap: k8s=unknown from=none ({why})");
    }
}

/// The cluster's version, with one log line saying where it came from (a warning when the
/// node's files stand in for the cluster), also in the status record.
pub(crate) fn version(root: &Root, s: &Sources) -> Result<Version> {
    let v = find_version(root, s)?;
    status::decide(
        "k8s",
        &v.value,
        format_args!("{} ({})", v.source.word(), v.source),
    );
    status::phase(status::Phase::Version);
    v.report()?;
    Ok(v)
}

fn find_version(root: &Root, s: &Sources) -> Result<Version> {
    if let Some(v) = s.forced {
        crate::info!("Kubernetes version {v} (from --force-kube-version)");
        return Ok(Version {
            value: v.to_string(),
            source: Source::Forced,
        });
    }
    let asked = match (s.kube, s.joining) {
        (Some(k), _) | (None, Some(Joining::Client(k))) => Some((k.server_version(), &k.source)),
        (None, Some(Joining::Unreached(u))) => Some((
            Err(FetchError::new(u.failure, Error::failed(u.error.clone()))),
            &u.source,
        )),
        (None, None) => None,
    };
    let why = match asked {
        Some((answer, from)) => match answer {
            Ok(v) => {
                let source = Source::ApiServer(from.clone());
                crate::info!("Kubernetes version {v} (from {source})");
                let value = checked_version(v, &source.to_string())?;
                return Ok(Version { value, source });
            }
            Err(FetchError { class, error: e }) if s.fallback.allows(class) => match class {
                Failure::Unreachable => format!("the API server is unreachable: {e}"),
                Failure::Busy => format!(
                    "the API server was busy until the run's deadline (--version-fallback always-after-deadline): {e}"
                ),
                Failure::Final | Failure::Denied | Failure::Passed(_) => format!(
                    "the API server refused (--version-fallback always-after-deadline): {e}"
                ),
            },
            // Credentials the cluster rejects: that first, and how to fix it; the fallback
            // policy only says why the node's files were not used instead.
            Err(f) if f.class == Failure::Denied => {
                return Err(Error::failed(format!(
                    "unable to determine the cluster version: the API server rejected the credentials of {from} ({}): give the node a kubeconfig whose credentials the cluster accepts, or set --force-kube-version (--version-fallback {} does not let {} decide)",
                    f.error,
                    s.fallback.word(),
                    root.show(s.installer_env)
                )));
            }
            Err(FetchError { class, error: e }) => {
                let state = match class {
                    Failure::Unreachable => "unreachable",
                    Failure::Busy => "busy until the run's deadline (--deadline)",
                    // Denied is answered above.
                    Failure::Final | Failure::Denied | Failure::Passed(_) => "refusing",
                };
                return Err(e.context(format!(
                    "unable to determine the cluster version: the API server is {state}, and --version-fallback {} does not let {} decide",
                    s.fallback.word(),
                    root.show(s.installer_env)
                )));
            }
        },
        None if s.fallback == Fallback::Never => {
            return Err(Error::failed(format!(
                "unable to determine the cluster version: {}, and --version-fallback never: give the node one of them, or set --force-kube-version",
                s.none_there(root)
            )))
        }
        None => s.none_there(root),
    };
    let file = root.show(s.installer_env);
    let value = kubelet_env_version(root, s.installer_env)?.ok_or_else(|| {
        Error::failed(format!(
            "unable to determine the cluster version: {why}; and {file} does not exist"
        ))
    })?;
    let source = Source::Fallback { file, why };
    crate::warn!("Kubernetes version {value} from {source}");
    Ok(Version { value, source })
}

/// The Kubernetes version a kubelet.env names (`KUBELET_IMAGE_TAG`); `None` if it does not exist.
pub(crate) fn kubelet_env_version(root: &Root, node_path: &str) -> Result<Option<String>> {
    let name = root.show(node_path);
    let Some(text) = root.read_text(node_path)? else {
        return Ok(None);
    };
    let env = EnvFile::parse(&text, &name)?;
    let tag = env
        .get("KUBELET_IMAGE_TAG")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Error::failed(format!(
                "unable to determine the cluster version: {name} has no KUBELET_IMAGE_TAG"
            ))
        })?;
    // Docker tags cannot hold '+', so the installer wrote '_'.
    let v = tag.replace('_', "+");
    checked_version(v, &format!("KUBELET_IMAGE_TAG in {name}")).map(Some)
}

/// A version the mappings can be looked up by (`v1.10.2+coreos.0`), or an error naming its source.
pub(crate) fn checked_version(v: String, from: &str) -> Result<String> {
    match crate::node::mappings::major_minor(&v) {
        Some(_) => Ok(v),
        None => Err(Error::failed(format!(
            "Kubernetes version {v:?} from {from} is not a version like v1.10.2"
        ))),
    }
}
