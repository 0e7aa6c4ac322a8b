//! What an answer, or its absence, says about trying again.

use std::io;
use std::time::Duration;

use super::{retry_after, server_now, Attempt};
use crate::error::Error;
use crate::net::retry::After;
use crate::net::tls::Tls;

/// ureq's own words for a timeout ("timeout: global") say too little to an operator.
fn timeout_words(t: &ureq::Timeout, deadline: Duration) -> String {
    match t {
        ureq::Timeout::Global => format!(
            "the attempt's deadline of {} passed (--fetch-timeout, or the run's --deadline)",
            crate::node::exec::secs(deadline)
        ),
        ureq::Timeout::PerRead => {
            "no byte arrived for a whole rate window (--fetch-min-rate-window)".into()
        }
        t => format!("timeout ({t})"),
    }
}

pub(super) fn read_failure(e: &io::Error, deadline: Duration) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
        Some(ureq::Error::Timeout(t)) => timeout_words(t, deadline),
        _ => e.to_string(),
    }
}

/// rustls's verdict that no trust anchor signs the server's certificate, whether ureq hands it
/// over as its own variant or inside the I/O error of the handshake.
fn unknown_issuer(e: &ureq::Error) -> bool {
    let is = |r: &rustls::Error| {
        matches!(
            r,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        )
    };
    match e {
        ureq::Error::Rustls(r) => is(r),
        ureq::Error::Io(io) => io
            .get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .is_some_and(is),
        _ => false,
    }
}

pub(super) fn classify_transport<T>(
    what: &str,
    e: ureq::Error,
    deadline: Duration,
    tls: &Tls,
) -> Attempt<T> {
    let mut msg = match &e {
        ureq::Error::Timeout(t) => format!("{what}: {}", timeout_words(t, deadline)),
        e => format!("{what}: {e}"),
    };
    // A server whose certificate no anchor signs: say which anchors, and how to add one.
    if unknown_issuer(&e) {
        let fix = tls.fix.as_deref().unwrap_or("a trust anchor");
        msg = format!(
            "{msg}: the server's certificate is not signed by a CA trusted here ({}): add its CA with {fix}",
            if tls.sources.is_empty() {
                "none".to_string()
            } else {
                tls.sources.join(", ")
            }
        );
    }
    match e {
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::TooManyRedirects
        | ureq::Error::RedirectFailed
        | ureq::Error::Pem(_) => Attempt::Final(Error::failed(msg)),
        // A certificate the trust anchors reject will not become trusted by asking again.
        ureq::Error::Io(ref io) if io.to_string().contains("invalid peer certificate") => {
            Attempt::Final(Error::failed(msg))
        }
        ureq::Error::Rustls(rustls::Error::InvalidCertificate(_)) => {
            Attempt::Final(Error::failed(msg))
        }
        _ => Attempt::Retry(Error::failed(msg)),
    }
}

/// An answer that is not 2xx: its status, its `Retry-After`, and an error with the server's
/// own message.
pub(super) struct Refusal {
    pub(super) status: u16,
    pub(super) retry_after: Option<After>,
    pub(super) error: Error,
}

/// `None` for 2xx; otherwise the refusal.
pub(super) fn status_failure(
    what: &str,
    resp: &mut ureq::http::Response<ureq::Body>,
) -> Option<Refusal> {
    let status = resp.status();
    if status.is_success() {
        return None;
    }
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
    let retry_after =
        header("retry-after").and_then(|v| retry_after(v, server_now(header("date"))));
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 10)
        .read_to_vec()
        .unwrap_or_default();
    let detail = server_message(&body);
    let msg = format!(
        "{what}: HTTP {}{}",
        status,
        detail.map(|d| format!(": {d}")).unwrap_or_default()
    );
    Some(Refusal {
        status: status.as_u16(),
        retry_after,
        error: Error::failed(msg),
    })
}

/// `curl --retry`: 408, 429 and 5xx are a busy server, asked again (after its `Retry-After`);
/// other statuses are final.
pub(super) fn verdict<T>(r: Refusal) -> Attempt<T> {
    match r.status {
        408 | 429 | 500.. => Attempt::Busy(r.error, r.status, r.retry_after),
        401 | 403 => Attempt::Denied(r.error),
        _ => Attempt::Final(r.error),
    }
}

/// The Kubernetes `Status.message` of an error body, or its first line of text.
pub(crate) fn server_message(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v.get("message").and_then(|m| m.as_str()) {
            return Some(m.to_string());
        }
    }
    let text = String::from_utf8_lossy(body);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    // A web server's error page (`<!DOCTYPE HTML>`) says nothing the status does not.
    if line.starts_with('<') {
        return None;
    }
    Some(line.chars().take(200).collect())
}

/// The body, at most `cap` bytes. ureq refuses any read once `limit` bytes have come, even the
/// one that would see the end: one more lets a body of exactly `cap` bytes end, and one past
/// it still fails.
pub(super) fn capped(
    resp: &mut ureq::http::Response<ureq::Body>,
    cap: u64,
) -> ureq::BodyReader<'_> {
    resp.body_mut()
        .with_config()
        .limit(cap.saturating_add(1))
        .reader()
}

pub(super) fn over_limit(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::BodyExceedsLimit(_)))
}
