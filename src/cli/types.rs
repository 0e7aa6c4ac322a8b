//! The value types of the options (coreos-installer's `cmdline/types.rs`): each parses its
//! token with `argh::FromArgValue`, so a bad value is exit 2 naming the option, at parse time.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::node::root::{read_host_file, Root};

/// Where join-service records the tickets it issued (`--ledger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ledger {
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
pub(crate) enum RecordOf {
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
pub(crate) enum SysextTrust {
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

/// What an in-place reprovision installs (`--flow`): it decides which Secret keys are read
/// and how the node takes its new configuration. Persisted in the state file by these names.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Flow {
    Rhcos,
    Rhel,
}

impl Flow {
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) enum Pick<T> {
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
pub(crate) enum HostReboot {
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
pub(crate) enum RebootMode {
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

/// The kubeadm addons `activate --skip-addons` leaves out of `kubeadm init` (kubeadm's
/// `dns.disabled`, `proxy.disabled`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Addons {
    pub(crate) coredns: bool,
    pub(crate) kube_proxy: bool,
}

impl Addons {
    pub(crate) fn any(&self) -> bool {
        self.coredns || self.kube_proxy
    }
}

impl argh::FromArgValue for Addons {
    fn from_arg_value(v: &str) -> Result<Self, String> {
        let mut a = Addons::default();
        for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "coredns" => a.coredns = true,
                "kube-proxy" => a.kube_proxy = true,
                _ => return Err(format!("expected coredns or kube-proxy, got {name:?}")),
            }
        }
        Ok(a)
    }
}

/// A file named by `--keyring` or `--ca-file`, and where that name came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input {
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
    pub(crate) fn label(&self, root: &Root) -> String {
        match self {
            Input::Host(p) => p.display().to_string(),
            Input::Node { path, from } => format!("{} (from {from})", root.show(path)),
        }
    }

    /// `--keyring /etc/k.asc` or `keyring /sysroot/etc/k.asc (from ...)`.
    pub(crate) fn name(&self, root: &Root, key: &str) -> String {
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
    pub(crate) fn read(&self, root: &Root, cap: u64, key: &str) -> Result<Vec<u8>> {
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
