//! `nodestrap preflight`: every dependency checked, a table printed, nothing changed.

use serde_json::Value;

use super::setup::*;
use crate::cli::Reprovision;
use crate::crypto::digest::Algo;
use crate::error::{Error, Result};
use crate::inplace::mco;
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::node::verified::{copy_verified, Expect, Written};

pub(super) struct Check {
    pub(crate) check: &'static str,
    pub(crate) target: String,
    pub(crate) pass: bool,
    pub(crate) detail: String,
}

pub(super) fn check(check: &'static str, target: &str, r: Result<String>) -> Check {
    let (pass, detail) = match r {
        Ok(d) => (true, d),
        Err(e) => (false, e.to_string()),
    };
    if pass {
        crate::info!("preflight {check} {target}: pass: {detail}");
    } else {
        crate::error!("preflight {check} {target}: FAIL: {detail}");
    }
    Check {
        check,
        target: target.to_string(),
        pass,
        detail,
    }
}

/// The Ignition config, fetched with the token and checked to be spec 3.x.
pub(super) fn fetch_ignition(s: &Setup) -> Result<Value> {
    let mut req = Request::get(&s.secrets.url);
    bearer(&mut req, &s.secrets.token);
    req.headers.push((
        "Accept".into(),
        "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1".into(),
    ));
    let body = s.pinned.fetch(&req, IGNITION_CAP)?;
    mco::parse(&body, &s.secrets.url)
}

/// `https://host[:port]/v2/` of a registry or mirror given as a URL or `host[:port][/path]`.
pub(super) fn v2_url(r: &str) -> String {
    let rest = r
        .strip_prefix("https://")
        .or_else(|| r.strip_prefix("http://"))
        .unwrap_or(r);
    let host = rest.split('/').next().unwrap_or(rest);
    let scheme = if r.starts_with("http://") {
        "http"
    } else {
        "https"
    };
    format!("{scheme}://{host}/v2/")
}

/// A registry answers `/v2/` with 200, or 401 when it wants credentials: both mean it is there.
pub(super) fn probe_registry(http: &Http, r: &str) -> Result<String> {
    let url = v2_url(r);
    match http.fetch_passing(&Request::get(&url), 1 << 20, &[401]) {
        Ok(_) => Ok("HTTP 200".into()),
        Err(FetchError {
            class: Failure::Passed(_),
            ..
        }) => Ok("HTTP 401 (wants credentials)".into()),
        Err(e) => Err(e.into()),
    }
}

/// The progress endpoint answers with the token: any answer but 401/403 and 5xx will do (it may
/// take POST only).
pub(super) fn probe_progress(s: &Setup, url: &str) -> Result<String> {
    let mut req = Request::get(url);
    if let Some(t) = &s.secrets.progress_token {
        bearer(&mut req, t);
    }
    let pass: Vec<u16> = (400..500)
        .filter(|c| ![401, 403, 408, 429].contains(c))
        .collect();
    match s.open.fetch_passing(&req, 1 << 20, &pass) {
        Ok(_) => Ok("answers (2xx)".into()),
        Err(FetchError {
            class: Failure::Passed(_),
            error,
        }) => Ok(format!("answers ({})", short_status(&error.to_string()))),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn short_status(msg: &str) -> String {
    msg.split(": ")
        .find(|p| p.starts_with("HTTP "))
        .unwrap_or("4xx")
        .to_string()
}

/// Hash the payload while it streams (to nowhere: preflight writes nothing). Its SHA-256 is
/// kept in `seen`: the apply step must get the same bytes.
pub(super) fn probe_payload(s: &Setup, seen: &mut Option<String>) -> Result<String> {
    let mut req = Request::get(&s.secrets.url);
    let url = s.secrets.payload_url();
    req.url = &url;
    bearer(&mut req, &s.secrets.token);
    let expect = match &s.secrets.payload_sha256 {
        Some(d) => Expect::Digest(d, "payload-sha256"),
        None => Expect::Record(Algo::Sha256),
    };
    let mut hash =
        |body: &mut dyn std::io::Read| copy_verified(body, &mut std::io::sink(), &expect);
    let Written { bytes: n, hex: got } = s.pinned.stream(&req, PAYLOAD_CAP, None, &mut hash)?;
    *seen = Some(got.clone());
    Ok(match &s.secrets.payload_sha256 {
        Some(_) => format!("{n} bytes, sha256 matches"),
        None => format!("{n} bytes, sha256 {got} (no payload-sha256 to check)"),
    })
}

/// What preflight found: its checks, the Ignition config (RHCOS), the payload's SHA-256 (RHEL).
pub(super) struct Preflight {
    pub(super) checks: Vec<Check>,
    pub(super) config: Option<Value>,
    pub(super) payload_sha256: Option<String>,
}

/// Every check the flow depends on, side by side (each in its own thread), so that the table is
/// ready within the deadline however many endpoints are slow; in the flow's order.
pub(super) fn preflight_checks(s: &Setup, api: Option<&Api>) -> Preflight {
    let mut payload_sha256 = None;
    let mut config = None;
    let checks = std::thread::scope(|t| {
        let mut jobs: Vec<std::thread::ScopedJoinHandle<Check>> = Vec::new();
        let first = match s.secrets.flow {
            Flow::Rhcos => t.spawn(|| {
                let r = fetch_ignition(s).map(|c| {
                    let d = format!(
                        "spec {}, {} files, {} units",
                        mco::version(&c),
                        c.pointer("/storage/files")
                            .and_then(Value::as_array)
                            .map_or(0, Vec::len),
                        c.pointer("/systemd/units")
                            .and_then(Value::as_array)
                            .map_or(0, Vec::len)
                    );
                    config = Some(c);
                    d
                });
                check("ignition", &s.secrets.url, r)
            }),
            Flow::Rhel => t.spawn(|| {
                check(
                    "payload",
                    &s.secrets.url,
                    probe_payload(s, &mut payload_sha256),
                )
            }),
        };
        if let Some(r) = &s.secrets.registry_url {
            jobs.push(t.spawn(move || check("registry", &v2_url(r), probe_registry(&s.open, r))));
        }
        for m in &s.secrets.mirror_urls {
            jobs.push(t.spawn(move || check("mirror", &v2_url(m), probe_registry(&s.open, m))));
        }
        if let Some(u) = &s.secrets.progress_url {
            jobs.push(t.spawn(move || check("progress", u, probe_progress(s, u))));
        }
        if let Some(Api { node: n, kube: k }) = api {
            jobs.push(t.spawn(move || {
                let r = k
                    .get_node(n)
                    .map(|_| format!("Node {n} readable ({})", k.source));
                check("kubernetes", &format!("nodes/{n}"), r)
            }));
        }
        let joined = |h: std::thread::ScopedJoinHandle<Check>| {
            h.join().unwrap_or_else(|_| Check {
                check: "internal",
                target: String::new(),
                pass: false,
                detail: "a check's thread panicked".into(),
            })
        };
        let mut checks = vec![joined(first)];
        checks.extend(jobs.into_iter().map(joined));
        checks
    });
    Preflight {
        checks,
        config,
        payload_sha256,
    }
}

pub(super) fn print_table(checks: &[Check]) -> Result<()> {
    let w0 = checks
        .iter()
        .map(|c| c.check.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let w1 = checks
        .iter()
        .map(|c| c.target.len())
        .max()
        .unwrap_or(0)
        .max(6);
    crate::outln!("{:w0$}  {:w1$}  RESULT  DETAIL", "CHECK", "TARGET")?;
    for c in checks {
        crate::outln!(
            "{:w0$}  {:w1$}  {:6}  {}",
            c.check,
            c.target,
            if c.pass { "pass" } else { "FAIL" },
            c.detail
        )?;
    }
    Ok(())
}

/// A summary line once the node's state is decided: a stdout that went away is logged only.
pub(super) fn summary(line: std::fmt::Arguments) {
    if let Err(e) = crate::output::line(line) {
        crate::warn!("{e}");
    }
}

/// `nodestrap preflight`.
pub fn preflight(a: &Reprovision) -> Result<()> {
    let (s, api) = setup::<ForPreflight>(a)?;
    let checks = preflight_checks(&s, api.as_ref()).checks;
    for c in &checks {
        crate::node::status::decide(
            c.check,
            format_args!("{} {}", if c.pass { "pass" } else { "FAIL" }, c.detail),
            &c.target,
        );
    }
    print_table(&checks)?;
    let failed = checks.iter().filter(|c| !c.pass).count();
    if failed > 0 {
        return Err(Error::failed(format!(
            "preflight: {failed} of {} checks failed",
            checks.len()
        )));
    }
    crate::info!("preflight: all {} checks passed", checks.len());
    Ok(())
}
