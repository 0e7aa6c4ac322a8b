//! The fuzz crate's one way in (fuzz/): each function runs a parser that is private to its
//! module as the target of the same name needs it. Not part of nodestrap's interface; nothing
//! in nodestrap calls these.

use std::io::{BufReader, Read};

use crate::activation::ledger::{self, ClusterLedger, RecordOut};
use crate::error::Result;

/// join-service's file ledger as read, written back as it writes it.
pub fn ticket_record(text: &str, name: &str) -> Result<String> {
    let issued = ledger::parse_record(text, name)?;
    Ok(serde_json::to_string_pretty(&RecordOut {
        issued: &issued,
    })?)
}

/// A ticket record's ConfigMap as the API server returns it, read as a claim reads it, judged
/// by the rule at the ends of time, and (when it reads) written back and read the same.
pub fn ticket_object(bytes: &[u8]) -> Option<String> {
    let cm: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let (e, rv) = ClusterLedger::read(&cm, "ticket-x").ok()?;
    let asking = ledger::Asking {
        identity: &e.identity,
        node: "n",
        role: crate::activation::nodelock::Role::Worker,
        session: Some("0123456789abcdef0123456789abcdef"),
    };
    let _ = ledger::judge(&e, &asking, ledger::now(), 45, 900, false);
    let _ = ledger::judge(&e, &asking, u64::MAX, u64::MAX, u64::MAX, true);
    let back = serde_json::json!({"metadata": {"resourceVersion": rv}, "data": e});
    let (again, _) = ClusterLedger::read(&back, "ticket-x").ok()?;
    assert_eq!(again, e, "a record written reads back the same");
    Some(again.identity)
}

/// An answer's framing as activate's `post` reads it (the body to EOF).
pub fn wire_answer(r: &mut impl Read) -> std::io::Result<(String, Vec<u8>)> {
    crate::activation::exchange::read_message(&mut BufReader::new(r), true)
        .map(|m| (m.first, m.body))
}

/// The config-file parser, settings as (key, value).
pub fn config_file(text: &str, name: &str) -> Result<Vec<(&'static str, String)>> {
    crate::cli::settings::parse_file(text, name)
        .map(|v| v.into_iter().map(|s| (s.key, s.value)).collect())
}

/// The kernel-command-line parser, settings as (key, value).
pub fn kernel_cmdline(text: &str) -> Result<Vec<(&'static str, String)>> {
    crate::cli::settings::parse_cmdline(text)
        .map(|v| v.into_iter().map(|s| (s.key, s.value)).collect())
}

/// An exec plugin's output in every apiVersion kubectl speaks; `Ok` holds the token's or the
/// certificate's length.
pub fn exec_credential(out: &[u8], now: i64) -> std::result::Result<usize, String> {
    use crate::net::kubeconfig::{parse_exec_output, ExecCredential, EXEC_VERSIONS};
    for v in EXEC_VERSIONS {
        if let Ok(c) = parse_exec_output(out, v, now) {
            return Ok(match c {
                ExecCredential::Token(t) => t.len(),
                ExecCredential::Cert(c, _) => c.len(),
            });
        }
    }
    Err("not an ExecCredential".into())
}

/// torcx's configuration file: parsed, then every store path derived from it checked clean.
pub fn torcx_config(data: &[u8]) -> std::result::Result<usize, String> {
    let l = crate::torcx::layout::Layout::parse(data, "fuzz").map_err(|e| e.to_string())?;
    for p in l.stores("1.2.3", true) {
        if !p.starts_with('/') || p.split('/').any(|c| c == ".." || c == ".") {
            return Err(format!("unclean store path {p:?}"));
        }
    }
    Ok(l.store_paths.len())
}

/// A systemd drop-in's settings as the sysext trust check reads them (`sysext::trust`).
pub fn systemd_dropin(text: &str) -> Vec<(String, String, String)> {
    crate::sysext::trust::settings(text)
}

/// containerd's `hosts.toml` (`net::toml`, `net::mirrors`): a document read or refused, never
/// a panic or a hang; hosts read keep containerd's shape (mirrors first, the server at most
/// once and last, an API root every URL starts with, header values without line breaks).
pub fn hosts_toml(text: &str) {
    let Ok(doc) = crate::net::toml::parse(text, "hosts.toml") else {
        return;
    };
    let Ok(hosts) =
        crate::net::mirrors::parse_hosts(&doc, "/etc/containerd/certs.d/r", "r:5000", "fuzz")
    else {
        return;
    };
    let servers = hosts.iter().filter(|h| !h.mirror).count();
    assert!(servers <= 1, "one server at most");
    if servers == 1 {
        assert!(!hosts[hosts.len() - 1].mirror, "the server comes last");
    }
    for h in &hosts {
        let url = h.url("r:5000", "a/b", "blobs/sha256:00");
        assert!(url.starts_with(&h.root()), "{url} below {}", h.root());
        assert!(h.path.is_empty() || h.path.starts_with('/'), "{:?}", h.path);
        assert!(!h.host.is_empty() && !h.host.contains('/'), "{:?}", h.host);
        for (_, v) in &h.headers {
            assert!(!v.contains(['\r', '\n']), "{v:?}");
        }
        for f in h.ca.iter().chain(h.client.iter().map(|(c, _)| c)) {
            assert!(f.starts_with('/'), "{f:?} is absolute");
        }
    }
}

/// What an OCI registry and its operator hand nodestrap (`net::oci`), by the first byte: 0 a
/// Docker config.json, 1 a `WWW-Authenticate` value, 2 an artifact manifest, else an `oci://`
/// location or a digest-pinned reference (a torcx manifest's). Each result is checked against the rule its reader promises.
pub fn oci_registry(data: &[u8]) {
    use crate::net::oci::{self, Challenge, Location, Reference};
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which {
        0 => {
            if let Ok(a) = oci::Auths::parse(rest, "config.json") {
                for (host, _, _) in &a.entries {
                    assert!(!host.contains('/'), "a host without a path: {host:?}");
                    let b = a.basic(host).expect("an entry gives credentials");
                    assert!(b.starts_with("Basic "));
                }
            }
        }
        1 => {
            if let Some(Challenge::Bearer { realm, service }) =
                oci::parse_challenge(&String::from_utf8_lossy(rest))
            {
                assert!(!realm.contains('"'), "{realm:?}");
                assert!(!service.unwrap_or_default().contains('"'));
            }
        }
        2 => {
            if let Ok(l) = oci::file_layer(rest, "f.raw", "fuzz") {
                assert_eq!(
                    l.annotations.get(oci::TITLE).map(String::as_str),
                    Some("f.raw")
                );
            }
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            if let Ok(Some(l)) = Location::parse_dir(&text) {
                assert!(!l.host.contains('/') && !l.repo.is_empty());
                let again = Location::parse_dir(&format!("oci://{}/{}/", l.host, l.repo));
                assert_eq!(
                    again.ok().flatten(),
                    Some(l),
                    "a location reads back the same"
                );
            }
            if let Ok(Some(r)) = Reference::parse(&text) {
                let again = format!(
                    "oci://{}/{}@sha256:{}",
                    r.loc.host, r.loc.repo, r.manifest.hex
                );
                assert_eq!(
                    Reference::parse(&again).ok().flatten(),
                    Some(r),
                    "a pinned reference reads back the same"
                );
            }
        }
    }
}
