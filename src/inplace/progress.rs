//! Progress events of a reprovision, POSTed as JSON to the operator's endpoint. Reporting is
//! best effort: a few quick tries, then a warning; it never fails the node.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::net::fetch::{Http, Request, Retry, Tls};

pub struct Reporter {
    target: Option<(Http, String, Option<String>)>,
    node: String,
    flow: &'static str,
    /// A failure was reported: the caller's own catch-all does not report it twice.
    failed: Cell<bool>,
}

impl Reporter {
    /// `url` and `token` from the Secret; no URL means nothing is reported.
    pub fn new(
        tls: &Tls,
        url: Option<&str>,
        token: Option<&str>,
        node: &str,
        flow: &'static str,
    ) -> Reporter {
        let retry = Retry::exponential(3, Duration::from_millis(500))
            .capped_at(Duration::from_secs(4))
            .within(Duration::from_secs(30))
            .busy_attempts(3);
        Reporter {
            target: url.map(|u| {
                (
                    Http::new(tls, retry),
                    u.to_string(),
                    token.map(String::from),
                )
            }),
            node: node.to_string(),
            flow,
            failed: Cell::new(false),
        }
    }

    /// A reporter that only logs (preflight, dry runs).
    pub fn silent(node: &str, flow: &'static str) -> Reporter {
        Reporter {
            target: None,
            node: node.to_string(),
            flow,
            failed: Cell::new(false),
        }
    }

    /// `phase` is preflight, fetch, configure or reboot; `status` started, succeeded or failed
    /// (and, for a reboot this run was told not to make, skipped).
    pub fn report(&self, phase: &str, status: &str, message: &str) {
        if status == "failed" {
            self.failed.set(true);
        }
        let line = format!("progress: {phase} {status}: {message}");
        if status == "failed" {
            log::error!("{line}");
        } else {
            log::info!("{line}");
        }
        let Some((http, url, token)) = &self.target else {
            return;
        };
        let body = json!({
            "node": self.node,
            "flow": self.flow,
            "phase": phase,
            "status": status,
            "message": message,
            "time": rfc3339(SystemTime::now()),
        });
        let mut req = Request::get(url);
        req.method = "POST";
        req.body = Some(("application/json", body.to_string().into_bytes()));
        if let Some(t) = token {
            req.headers.push(("Authorization", format!("Bearer {t}")));
        }
        if let Err(e) = http.fetch(&req, 1 << 20) {
            log::warn!("progress report not delivered (the node carries on): {e}");
        }
    }

    /// Report `phase` failed unless a failure was reported already.
    pub fn fail_once(&self, phase: &str, message: &str) {
        if !self.failed.get() {
            self.report(phase, "failed", message);
        }
    }
}

/// `2026-11-22T05:26:40Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        let at = |s| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_325_200), "2026-11-22T05:26:40Z");
    }
}
