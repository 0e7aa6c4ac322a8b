//! What the sysext boot check tells the cluster on its Node (net/node_report.rs sends it): the
//! `NodestrapVerified` condition, the labels of the set that runs, and the events an operator
//! reads in `kubectl describe node`: what the last bootstrap staged, a downgrade it was allowed,
//! and the check's verdict (verified, a mismatch, an image refused, the return to the
//! known-good set). Contract: docs/verify.md, "On the Node".

use crate::net::node_report::{
    self, label_value, Event, Report, Verdict, LABEL_KUBERNETES, LABEL_RUNTIME, LABEL_TRUST,
};
use crate::node::root::Root;
use crate::node::status::{Chosen, Record, State};

/// Where the check reports: the kubelet's kubeconfig (a node path) and the Node's name; none
/// when the API server is not asked.
pub(crate) struct To<'a> {
    pub(crate) root: &'a Root,
    pub(crate) kubeconfig: &'a str,
    pub(crate) node: &'a str,
}

/// How the check ended, for the condition and its events.
pub(crate) enum Ending<'a> {
    /// The set runs as chosen (`known_good`: the known-good set, the last bootstrap having
    /// failed).
    Verified { known_good: bool },
    /// It does not: the first failed check, the images refused for good, and what became of
    /// the return (`None`: none was made, the reason given).
    Mismatch {
        first: &'a str,
        refused: Vec<String>,
        returned: Result<String, String>,
    },
}

/// The condition Unknown while the check runs, nothing else: what the check told.
pub(crate) fn checking(to: &To, boot_id: &str) -> String {
    node_report::send(
        to.root,
        to.kubeconfig,
        to.node,
        &Report {
            verdict: Verdict::Unknown,
            reason: "Checking",
            message: format!("the boot check of boot {boot_id} runs"),
            labels: Vec::new(),
            events: Vec::new(),
        },
    )
}

/// The verdict of the check on `set` (the record it judged: `record`), sent; what the check
/// told.
pub(crate) fn verdict(
    to: &To,
    record: &Record,
    set: &[Chosen],
    ending: &Ending,
    merged_by: Option<&str>,
) -> String {
    let r = report(record, set, ending, merged_by);
    let line = node_report::send(to.root, to.kubeconfig, to.node, &r);
    crate::info!("reported {line}");
    line
}

/// `kubernetes v1.37.2, containerd v1.7.24`.
pub(crate) fn describe(set: &[Chosen]) -> String {
    set.iter()
        .map(|c| format!("{} {}", c.name, c.version))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(record: &Record, set: &[Chosen], ending: &Ending, merged_by: Option<&str>) -> Report {
    let runs = describe(set);
    let mut events = staged(record);
    let (verdict, reason, message) = match ending {
        Ending::Verified { known_good } => {
            let by = merged_by
                .map(|m| format!(", merged by the {m} merge"))
                .unwrap_or_default();
            let message = format!(
                "runs {runs} as {}{by}",
                if *known_good {
                    "its known-good set"
                } else {
                    "chosen"
                }
            );
            events.push(Event {
                warning: false,
                reason: "Verified",
                message: message.clone(),
            });
            let reason = if *known_good {
                "VerifiedKnownGood"
            } else {
                "Verified"
            };
            (Verdict::True, reason, message)
        }
        Ending::Mismatch {
            first,
            refused,
            returned,
        } => {
            events.push(Event {
                warning: true,
                reason: "Mismatch",
                message: format!("does not run {runs} as chosen: {first}"),
            });
            events.extend(refused.iter().map(|r| Event {
                warning: true,
                reason: "Refused",
                message: format!("{r}: never staged again on this node"),
            }));
            match returned {
                Ok(back) => {
                    events.push(Event {
                        warning: true,
                        reason: "ReturnedToKnownGood",
                        message: back.clone(),
                    });
                    (
                        Verdict::False,
                        "ReturnedToKnownGood",
                        format!("{first}; {back}"),
                    )
                }
                Err(why) => (Verdict::False, "OperatorNeeded", format!("{first}; {why}")),
            }
        }
    };
    let labels = match ending {
        Ending::Verified { .. } => labels(record, set),
        Ending::Mismatch { .. } => Vec::new(),
    };
    Report {
        verdict,
        reason,
        message,
        labels,
        events,
    }
}

/// What the last bootstrap staged, and a downgrade it was allowed, as events.
fn staged(record: &Record) -> Vec<Event> {
    let mut ev = Vec::new();
    // A run that failed chose but staged nothing: the node went back as it was.
    if record.state == State::Done && !record.chosen.is_empty() {
        let activation = record
            .decisions
            .iter()
            .rfind(|d| d.what == "activation")
            .map(|d| format!(" (activation {}: {})", d.value, d.source))
            .unwrap_or_default();
        ev.push(Event {
            warning: false,
            reason: "Staged",
            message: format!(
                "nodestrap bootstrap of {} chose {}{activation}",
                record.started,
                describe(&record.chosen)
            ),
        });
    }
    ev.extend(
        record
            .decisions
            .iter()
            .filter(|d| d.what == "downgrade")
            .map(|d| Event {
                warning: true,
                reason: "DowngradeAllowed",
                message: format!("{} ({})", d.value, d.source),
            }),
    );
    ev
}

/// The versions that run and the trust mode, as label values.
fn labels(record: &Record, set: &[Chosen]) -> Vec<(&'static str, String)> {
    let mut l = Vec::new();
    for c in set {
        match c.name.as_str() {
            "kubernetes" => l.push((LABEL_KUBERNETES, label_value(&c.version))),
            // As the Node's containerRuntimeVersion spells it, `://` made `-`.
            "containerd" | "docker" => l.push((
                LABEL_RUNTIME,
                label_value(&format!("{}-{}", c.name, c.version.trim_start_matches('v'))),
            )),
            _ => {}
        }
    }
    if let Some(t) = record.decisions.iter().rfind(|d| d.what == "sysext-trust") {
        let mode = t.value.split_whitespace().next().unwrap_or("");
        l.push((LABEL_TRUST, label_value(mode)));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::status::Decision;

    fn record() -> Record {
        let c = |n: &str, v: &str| Chosen {
            name: n.into(),
            version: v.into(),
            image: format!("/opt/extensions/{n}/{n}-{v}-x86-64.raw"),
            digest: "sha256-ab".into(),
        };
        let d = |w: &str, v: &str| Decision {
            what: w.into(),
            value: v.into(),
            source: "test".into(),
        };
        let mut r: Record = serde_json::from_value(serde_json::json!({
            "schema": 1, "command": "bootstrap", "version": "0.1.0", "root": "/",
            "started": "2026-11-28T10:00:00Z", "ended": null, "duration_s": null,
            "state": "done", "exit_code": 0, "phase": "done", "error": null,
            "decisions": [], "files": [], "reboot": {"decision": "no"}, "kubelet_env": null,
        }))
        .unwrap();
        r.chosen = vec![c("kubernetes", "v1.37.2"), c("containerd", "1.7.24")];
        r.decisions = vec![
            d("sysext-trust", "signed (1 certificate(s))"),
            d("activation", "merged"),
        ];
        r
    }

    #[test]
    fn a_verified_set_is_labelled_and_told() {
        let r = record();
        let set = r.chosen.clone();
        let rep = report(
            &r,
            &set,
            &Ending::Verified { known_good: false },
            Some("initramfs"),
        );
        assert_eq!(rep.verdict, Verdict::True);
        assert!(
            rep.message.contains("merged by the initramfs merge"),
            "{}",
            rep.message
        );
        assert!(rep.labels.contains(&(LABEL_TRUST, "signed".into())));
        assert!(rep.events.iter().any(|e| e.reason == "Staged"));
        assert!(rep
            .events
            .iter()
            .any(|e| e.reason == "Verified" && !e.warning));
    }

    #[test]
    fn a_mismatch_labels_nothing_and_warns() {
        let r = record();
        let set = r.chosen.clone();
        let end = Ending::Mismatch {
            first: "kubernetes /usr/bin/kubelet --version: expected 1.37.2",
            refused: vec!["kubernetes v1.37.2 (sha256-ab)".into()],
            returned: Ok("returned to the known-good set".into()),
        };
        let rep = report(&r, &set, &end, None);
        assert_eq!(
            (rep.verdict, rep.reason),
            (Verdict::False, "ReturnedToKnownGood")
        );
        assert!(rep.labels.is_empty());
        let warned: Vec<&str> = rep
            .events
            .iter()
            .filter(|e| e.warning)
            .map(|e| e.reason)
            .collect();
        assert_eq!(warned, ["Mismatch", "Refused", "ReturnedToKnownGood"]);
    }
}
