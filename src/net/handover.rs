//! What a run leaves the next one of its servers' load (docs/bootstrap.md, "Retries"): each
//! handing-over client's `retry::Load` for each server (its streak and the server's last
//! `Retry-After`, with the moment it named), one small file each in the run folder, which
//! switch-root carries from the initramfs to the real root. A run that ends while its server
//! sheds load so hands the real root's unit, or its own restart, the wait the server asked for
//! and the spread it had reached: without it the next run asks sooner than the server said, and
//! its nodes come back as a new first wave.

use std::time::{Instant, SystemTime};

use crate::crypto::digest::{hex, sha256};
use crate::net::retry::Load;
use crate::node::root::read_capped;
use crate::node::run::{run_file_named, save_run_file};

/// It is a few hundred bytes; anything larger is not ours.
const CAP: u64 = 4 << 10;

/// The server a URL names, as the handover's key: scheme, host and port, without the
/// credentials a URL may carry.
pub(crate) fn server_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{host}")
}

/// One file per client and server (no process rewrites another's): `retry-api-<hash>.json`.
fn file(key: &str, server: &str) -> String {
    let h = hex(&sha256(server.as_bytes()));
    format!("retry-{key}-{}.json", &h[..16])
}

/// What the run before left for the client `key` of `server`.
pub(crate) fn take(key: &str, server: &str) -> Load {
    let path = run_file_named(&file(key, server));
    let bytes = match std::fs::File::open(&path).and_then(|f| read_capped(f, CAP)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Load::default(),
        Err(e) => {
            crate::warn!("{}: not read ({e}); the run starts afresh", path.display());
            return Load::default();
        }
    };
    match parse(&bytes, server, (Instant::now(), SystemTime::now())) {
        Some(l) => {
            crate::info!(
                "{server}: starts from what the run before learned of its load ({})",
                path.display()
            );
            l
        }
        None => {
            crate::warn!(
                "{}: not a handover of this program; the run starts afresh",
                path.display()
            );
            Load::default()
        }
    }
}

/// A handover's bytes, for `server`, at `now` (the same moment on both clocks): `None` for
/// anything `keep` did not write for that server.
pub fn parse(bytes: &[u8], server: &str, now: (Instant, SystemTime)) -> Option<Load> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if v["server"] != server {
        return None;
    }
    Load::from_json(&v, now)
}

/// What `keep` writes for `server`.
pub fn to_bytes(load: &Load, server: &str, now: (Instant, SystemTime)) -> Vec<u8> {
    let mut v = load.to_json(now);
    v["server"] = server.into();
    v.to_string().into_bytes()
}

/// Leave `load` for the next run's client `key` of `server` (nothing learned: the file goes).
/// A failure costs only the handover: logged.
pub(crate) fn keep(key: &str, server: &str, load: &Load) {
    let name = file(key, server);
    if !load.is_learned() {
        if let Err(e) = std::fs::remove_file(run_file_named(&name)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::warn!("{}: {e}", run_file_named(&name).display());
            }
        }
        return;
    }
    let bytes = to_bytes(load, server, (Instant::now(), SystemTime::now()));
    if let Err(e) = save_run_file(&name, &bytes) {
        crate::warn!("handing {server}'s load to the next run: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_is_the_server_without_credentials() {
        for (url, server) in [
            ("https://10.0.0.1:6443/version", "https://10.0.0.1:6443"),
            (
                "https://user:secret@mirror.example/a/b?c#d",
                "https://mirror.example",
            ),
            ("http://[::1]:8080", "http://[::1]:8080"),
        ] {
            assert_eq!(super::server_of(url), server);
        }
    }
}
