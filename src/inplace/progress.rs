//! Progress events of a reprovision, POSTed as JSON to the operator's endpoint. Reporting is
//! best effort: a few quick tries, then a warning; it never fails the node.

use std::cell::Cell;
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::net::fetch::{Http, Request};
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::status::rfc3339;

pub(crate) struct Reporter {
    target: Option<(Http, String, Option<String>)>,
    node: String,
    flow: &'static str,
    /// A failure was reported: the caller's own catch-all does not report it twice.
    failed: Cell<bool>,
}

impl Reporter {
    /// `url` and `token` from the Secret; no URL means nothing is reported.
    pub(crate) fn new(
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
    pub(crate) fn silent(node: &str, flow: &'static str) -> Reporter {
        Reporter {
            target: None,
            node: node.to_string(),
            flow,
            failed: Cell::new(false),
        }
    }

    /// `phase` is preflight, fetch, configure or reboot; `status` started, succeeded or failed
    /// (and, for a reboot this run was told not to make, skipped).
    pub(crate) fn report(&self, phase: &str, status: &str, message: &str) {
        if status == "failed" {
            self.failed.set(true);
        }
        let line = format!("progress: {phase} {status}: {message}");
        if status == "failed" {
            crate::error!("{line}");
        } else {
            crate::info!("{line}");
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
            req.headers
                .push(("Authorization".into(), format!("Bearer {t}")));
        }
        if let Err(e) = http.fetch(&req, 1 << 20) {
            crate::warn!("progress report not delivered (the node carries on): {e}");
        }
    }

    /// Report `phase` failed unless a failure was reported already.
    pub(crate) fn fail_once(&self, phase: &str, message: &str) {
        if !self.failed.get() {
            self.report(phase, "failed", message);
        }
    }
}
