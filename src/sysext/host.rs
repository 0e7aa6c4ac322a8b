//! What systemd-sysext compares an image with: the node's os-release and architecture.

use crate::error::{Error, Result};
use crate::node::envfile::EnvFile;
use crate::node::root::Root;

/// os-release as systemd reads it: /etc first, else /usr/lib.
const OS_RELEASE: [&str; 2] = ["/etc/os-release", "/usr/lib/os-release"];

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Host {
    pub(crate) id: String,
    pub(crate) version_id: Option<String>,
    pub(crate) sysext_level: Option<String>,
    /// systemd's `ConditionArchitecture=` spelling, which the bakery uses in file names.
    pub(crate) arch: &'static str,
    /// The file it was read from, for log lines.
    pub(crate) source: String,
}

impl Host {
    pub(crate) fn read(root: &Root) -> Result<Host> {
        for p in OS_RELEASE {
            let name = root.show(p);
            let Some(text) = root.read_text(p)? else {
                continue;
            };
            let env = EnvFile::parse(&text, &name)?;
            let get = |k| env.get(k).filter(|v| !v.is_empty()).map(str::to_string);
            return Ok(Host {
                id: get("ID").unwrap_or_else(|| "linux".into()),
                version_id: get("VERSION_ID"),
                sysext_level: get("SYSEXT_LEVEL"),
                arch: arch()?,
                source: name,
            });
        }
        Err(Error::failed(format!(
            "no os-release: neither {} nor {} exists",
            root.show(OS_RELEASE[0]),
            root.show(OS_RELEASE[1])
        )))
    }
}

/// This binary's architecture in systemd's spelling.
pub(crate) fn arch() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("x86-64"),
        "aarch64" => Ok("arm64"),
        a => Err(Error::failed(format!(
            "no sysext architecture name for {a}"
        ))),
    }
}
