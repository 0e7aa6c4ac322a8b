//! `nodestrap verify`: after a boot, prove that the node runs the extensions the last bootstrap
//! chose (its status record), or say what runs instead and go back to the known-good set.
//! Runs as a oneshot unit ordered before boot-complete.target, after the kubelet starts, so a
//! mismatch fails the boot for boot counting and update_engine (docs/verify.md).
//!
//! Per extension of the chosen set: the link in /etc/extensions names the recorded image, the
//! image still has the digest the signed list named, `systemd-sysext status` lists it for /usr,
//! a loop device reads the image (so the merged one is this file), and the merged binary's own
//! `--version` says the chosen version. Then, when the API server answers within
//! `--api-wait`, the Node's nodeInfo says the same. On a mismatch, once per boot, the links go
//! back to the known-good set, systemd-sysext refreshes and the changed services restart.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use crate::cli::Verify;
use crate::error::{Error, Result};
use crate::net::kube::Kube;
use crate::net::retry::Retry;
use crate::node::root::Root;
use crate::node::status::{
    self, ApiCheck, Check, Chosen, Outcome, Phase, Record, Returned, State, Verification,
};
use crate::node::undo::Undo;
use crate::sysext::known_good::{KnownGood, Refused};
use crate::sysext::merge::{self, Expect};
use crate::sysext::stage;

/// An image is hashed in full; a larger one is not one nodestrap staged.
const IMAGE_CAP: u64 = 8 << 30;
/// Between two questions to the API server while the Node catches up with a restarted kubelet.
const API_PAUSE: Duration = Duration::from_secs(2);

pub fn run(v: &Verify) -> Result<()> {
    let since = Instant::now();
    let root = Root::open(Path::new("/"))?;
    let (record, from) = status::load(Path::new("/"), "bootstrap")?.ok_or_else(|| {
        Error::failed(format!(
            "no status record at {} nor {}: no bootstrap has run, nothing to verify",
            status::run_file("bootstrap").display(),
            status::KEPT
        ))
    })?;
    let boot_id = crate::node::seams::boot_id()?;
    check_record(&record, &from)?;

    // What the node should run: what the last bootstrap chose, or the known-good set a check
    // of an earlier boot returned to (that return stands until a bootstrap chooses again).
    let carried = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.clone())
        .filter(|r| r.result == "merged");
    let expected = match &carried {
        Some(r) => {
            log::info!(
                "expecting the known-good set a check returned to at boot {} ({from})",
                r.boot_id
            );
            r.to.clone()
        }
        None => record.chosen.clone(),
    };
    let (checks, lying) = local_checks(&root, &expected);
    let local_ok = checks.iter().all(|c| c.ok);

    let (api, api_note, api_checks) = if !local_ok {
        (
            ApiCheck::Skipped,
            Some("not asked: the node itself does not run the chosen set".to_string()),
            Vec::new(),
        )
    } else if v.api_wait == 0 {
        (
            ApiCheck::Skipped,
            Some("--api-wait 0".to_string()),
            Vec::new(),
        )
    } else {
        ask_api(&root, v, &expected)
    };
    let mut checks = checks;
    checks.extend(api_checks);
    let ok = local_ok && api != ApiCheck::Mismatch;

    let mut known = KnownGood::load(&root)?;
    let mut verification = Verification {
        at: status::rfc3339(SystemTime::now()),
        boot_id: boot_id.clone(),
        duration_s: 0.0,
        outcome: if ok {
            Outcome::Verified
        } else {
            Outcome::Mismatch
        },
        checks,
        api,
        api_note,
        returned: carried.clone(),
    };
    let mut after = record.clone();

    if ok {
        known.set = expected.clone();
        known.verified = Some(verification.at.clone());
        known.save(&root)?;
        after.phase = Phase::Verified;
        verification.duration_s = secs(since);
        after.verification = Some(verification);
        let at = status::amend(&root, &record, &after)?;
        let set: Vec<String> = expected
            .iter()
            .map(|c| format!("{} {}", c.name, c.version))
            .collect();
        log::info!(
            "verified: the node runs {} as {from} records; now the known-good set ({}); recorded in {at}",
            if set.is_empty() { "no extension of nodestrap's".to_string() } else { set.join(", ") },
            root.show(crate::sysext::known_good::PATH)
        );
        return Ok(());
    }

    // A mismatch: images that did not run as named (another version inside, or refused by
    // systemd-sysext at boot) are never staged again. A link or a file changed on the node is
    // not the image's fault: the return puts it right, the image stays eligible.
    let failed: Vec<Check> = verification
        .checks
        .iter()
        .filter(|c| !c.ok)
        .cloned()
        .collect();
    for c in expected.iter().filter(|c| lying.contains(&c.name)) {
        if known.image_of(&c.name) == Some(c) {
            continue;
        }
        let why: Vec<String> = failed
            .iter()
            .filter(|k| k.what.starts_with(&format!("{} ", c.name)))
            .map(|k| format!("{}: expected {}, found {}", k.what, k.expected, k.running))
            .collect();
        log::warn!(
            "{} {} ({}) refused: never staged again on this node",
            c.name,
            c.version,
            c.digest
        );
        known.refuse(Refused {
            name: c.name.clone(),
            version: c.version.clone(),
            digest: c.digest.clone(),
            why: why.join("; "),
            at: verification.at.clone(),
        });
    }
    known.save(&root)?;

    // ... and the node goes back to the known-good set, once per boot.
    let earlier = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.as_ref())
        .filter(|r| r.boot_id == boot_id);
    let back = if let Some(r) = earlier {
        format!(
            "not returned again: this boot already returned to the known-good set ({}); the node needs an operator",
            r.result
        )
    } else if known.set.is_empty() {
        "nothing to return to: no boot of this node has been verified yet".to_string()
    } else if known.set == expected {
        "nothing to return to: the known-good set itself does not run as recorded".to_string()
    } else {
        let result = match return_to(&root, &known.set) {
            Ok(()) => "merged".to_string(),
            Err(e) => e.to_string(),
        };
        let merged = result == "merged";
        verification.returned = Some(Returned {
            to: known.set.clone(),
            boot_id: boot_id.clone(),
            result: result.clone(),
        });
        if merged {
            format!(
                "returned to the known-good set verified at {} ({})",
                known.verified.as_deref().unwrap_or("?"),
                describe(&known.set)
            )
        } else {
            format!("the return to the known-good set failed: {result}")
        }
    };
    verification.duration_s = secs(since);
    after.verification = Some(verification);
    let at = status::amend(&root, &record, &after)?;
    let first = failed
        .first()
        .map(|k| format!("{}: expected {}, found {}", k.what, k.expected, k.running))
        .unwrap_or_default();
    Err(Error::failed(format!(
        "the node does not run what {from} chose: {first}; {back} (recorded in {at})"
    )))
}

/// Only a completed sysext bootstrap has a set to verify.
fn check_record(record: &Record, from: &str) -> Result<()> {
    if record.command != "bootstrap" {
        return Err(Error::failed(format!(
            "{from} is the record of `{}`, not of a bootstrap: nothing to verify",
            record.command
        )));
    }
    if record.state != State::Done {
        return Err(Error::failed(format!(
            "{from}: the last bootstrap {}: it chose nothing that can run",
            match record.state {
                State::Running => "is still running",
                State::Failed => "failed",
                State::Interrupted => "was interrupted",
                State::Done => "ended",
            }
        )));
    }
    let sysext = record.decisions.iter().any(|d| d.what == "activation");
    if !sysext {
        return Err(Error::config(format!(
            "{from}: the last bootstrap staged no systemd-sysext payload: verify checks sysext nodes"
        )));
    }
    Ok(())
}

fn check(what: String, expected: impl Into<String>, running: impl Into<String>) -> Check {
    let (expected, running) = (expected.into(), running.into());
    let ok = expected == running;
    let line = format!("check {what}: expected {expected}, found {running}");
    if ok {
        log::info!("{line}");
    } else {
        log::error!("{line}");
    }
    Check {
        what,
        expected,
        running,
        ok,
    }
}

/// The checks on the node itself, per extension; and the extensions whose image is to blame
/// (merged intact from the recorded link, yet not in /usr or another version runs).
fn local_checks(root: &Root, expected: &[Chosen]) -> (Vec<Check>, Vec<String>) {
    let merged = merge::status_usr();
    let backing = crate::sysext::image::loop_backings();
    let mut out = Vec::new();
    let mut lying = Vec::new();
    for c in expected {
        let n = &c.name;
        let first = out.len();
        let link = format!("{}/{n}.raw", stage::LINKS);
        out.push(check(
            format!("{n} link {}", root.show(&link)),
            c.image.as_str(),
            root.dir(stage::LINKS)
                .ok()
                .flatten()
                .and_then(|d| d.link_target(&format!("{n}.raw")))
                .unwrap_or_else(|| "no link".to_string()),
        ));
        out.push(check(
            format!("{n} image {}", root.show(&c.image)),
            c.digest.as_str(),
            digest_of(root, &c.image, &c.digest),
        ));
        out.push(check(
            format!("{n} merged for /usr"),
            "listed by systemd-sysext status",
            match &merged {
                Ok(m) if m.contains(n) => "listed by systemd-sysext status".to_string(),
                Ok(m) if m.is_empty() => "nothing merged".to_string(),
                Ok(m) => format!("not listed (merged: {})", m.join(", ")),
                Err(e) => e.to_string(),
            },
        ));
        out.push(check(
            format!("{n} merged image"),
            "read by a loop device",
            match identity(root, &c.image) {
                Ok(id) if backing.contains(&id) => "read by a loop device".to_string(),
                Ok(_) => "no loop device reads it".to_string(),
                Err(e) => e,
            },
        ));
        if let Some(argv) = merge::version_probe(n) {
            let version = c.version.trim_start_matches('v');
            let said = merge::probe(&argv);
            out.push(check(
                format!("{n} {}", argv.join(" ")),
                format!("version {version}"),
                match said {
                    Ok(s) if s.contains(version) => format!("version {version}"),
                    Ok(s) => format!("{s:?}"),
                    Err(e) => e,
                },
            ));
        }
        // The first two are the node's (link, file); the rest the image's.
        let node_ok = out[first..first + 2].iter().all(|k| k.ok);
        if node_ok && out[first + 2..].iter().any(|k| !k.ok) {
            lying.push(n.clone());
        }
    }
    (out, lying)
}

/// (major, minor, inode) of the file at `node_path`.
fn identity(root: &Root, node_path: &str) -> std::result::Result<(u32, u32, u64), String> {
    match root.open_file(node_path) {
        Ok(Some(f)) => rustix::fs::fstat(&f)
            .map(|st| {
                (
                    rustix::fs::major(st.st_dev),
                    rustix::fs::minor(st.st_dev),
                    st.st_ino,
                )
            })
            .map_err(|e| format!("{}: {e}", root.show(node_path))),
        Ok(None) => Err("no such file".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// `sha256-<hex>` of the image now, or why it cannot be read.
fn digest_of(root: &Root, node_path: &str, recorded: &str) -> String {
    let Some(d) = crate::crypto::digest::Digest::parse(recorded) else {
        return format!("a record that names no digest ({recorded:?})");
    };
    let f = match root.open_file(node_path) {
        Ok(Some(f)) => f,
        Ok(None) => return "no such file".to_string(),
        Err(e) => return e.to_string(),
    };
    let mut h = d.hasher();
    let mut sink = std::io::sink();
    match crate::crypto::digest::copy_hashing(
        &mut std::io::Read::take(f, IMAGE_CAP),
        &mut h,
        &mut sink,
    ) {
        Ok(_) => format!("{}-{}", d.algo_name(), h.finish_hex()),
        Err(
            crate::crypto::digest::CopyError::Read(e) | crate::crypto::digest::CopyError::Write(e),
        ) => format!("unreadable: {e}"),
    }
}

/// The Node's own report: `nodeInfo.kubeletVersion` and `containerRuntimeVersion` say the
/// chosen versions. Asked again for up to `--api-wait` while it does not (a restarted kubelet
/// updates its Node within seconds); no answer in that time is `unreached`, never a pass.
fn ask_api(root: &Root, v: &Verify, expected: &[Chosen]) -> (ApiCheck, Option<String>, Vec<Check>) {
    let until = Instant::now() + Duration::from_secs(v.api_wait);
    let name = match node_name(v) {
        Ok(n) => n,
        Err(e) => return (ApiCheck::Unreached, Some(e.to_string()), Vec::new()),
    };
    let want_kubelet = expected
        .iter()
        .find(|c| c.name == "kubernetes")
        .map(|c| c.version.clone());
    let want_runtime = expected
        .iter()
        .find(|c| c.name == "containerd" || c.name == "docker")
        .map(|c| format!("{}://{}", c.name, c.version.trim_start_matches('v')));
    let mut last: Option<(String, String)> = None;
    let mut why = String::new();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let retry = Retry::exponential(1, Duration::from_millis(500))
            .within(left.max(Duration::from_secs(1)));
        match Kube::from_kubeconfig(root, &v.kubeconfig, retry)
            .and_then(|k| {
                k.ok_or_else(|| {
                    Error::failed(format!("{} does not exist yet", root.show(&v.kubeconfig)))
                })
            })
            .and_then(|k| k.get_node(&name))
        {
            Ok(node) => {
                let info = |k: &str| {
                    node.pointer(&format!("/status/nodeInfo/{k}"))
                        .and_then(|x| x.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                let got = (info("kubeletVersion"), info("containerRuntimeVersion"));
                let agrees = want_kubelet.as_ref().is_none_or(|w| *w == got.0)
                    && want_runtime.as_ref().is_none_or(|w| *w == got.1);
                last = Some(got);
                if agrees {
                    break;
                }
            }
            Err(e) => why = e.to_string(),
        }
        if Instant::now() + API_PAUSE >= until {
            break;
        }
        std::thread::sleep(API_PAUSE);
    }
    let Some((kubelet, runtime)) = last else {
        log::warn!("API server not asked in time: {why}: recorded as unreached");
        return (
            ApiCheck::Unreached,
            Some(format!(
                "no answer within --api-wait {} s: {why}",
                v.api_wait
            )),
            Vec::new(),
        );
    };
    let mut checks = Vec::new();
    if let Some(w) = want_kubelet {
        checks.push(check(
            format!("Node {name} nodeInfo.kubeletVersion"),
            w,
            kubelet,
        ));
    }
    if let Some(w) = want_runtime {
        checks.push(check(
            format!("Node {name} nodeInfo.containerRuntimeVersion"),
            w,
            runtime,
        ));
    }
    let api = if checks.iter().all(|c| c.ok) {
        ApiCheck::Confirmed
    } else {
        ApiCheck::Mismatch
    };
    (
        api,
        Some(format!("from {}", root.show(&v.kubeconfig))),
        checks,
    )
}

/// `--node-name`, else the host name as the kubelet registers it (lower case).
fn node_name(v: &Verify) -> Result<String> {
    let n = match &v.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_ascii_lowercase())
            .map_err(|e| Error::failed(format!("/proc/sys/kernel/hostname: {e}")))?,
    };
    crate::net::kube::NodeName::parse(&n)
        .map(|n| n.to_string())
        .ok_or_else(|| Error::config(format!("node name {n:?}: not a DNS subdomain")))
}

/// Links back to `set`, each image checked against its digest first; refresh, prove, restart
/// what changed. A failure puts the links back as they were (the undo log).
fn return_to(root: &Root, set: &[Chosen]) -> Result<()> {
    for c in set {
        let now = digest_of(root, &c.image, &c.digest);
        if now != c.digest {
            return Err(Error::failed(format!(
                "known-good {} {}: {} is {now}, not {}",
                c.name,
                c.version,
                root.show(&c.image),
                c.digest
            )));
        }
    }
    let mut undo = Undo::new(root);
    let changed = (|| -> Result<Vec<(&'static str, String)>> {
        stage::lock_links(&mut undo)?;
        let mut changed = Vec::new();
        for c in set {
            if stage::relink(root, &c.name, &c.image, &mut undo)? {
                if let Some(u) = merge::service_of(&c.name) {
                    changed.push((u, c.version.clone()));
                }
            }
        }
        undo.then_on_undo(
            "the extensions found at boot are merged again",
            merge::refresh,
        );
        let expect: Vec<Expect> = set
            .iter()
            .map(|c| Expect {
                name: &c.name,
                label: c.version.clone(),
                version: c.version.trim_start_matches('v').to_string(),
            })
            .collect();
        merge::refresh().and_then(|()| merge::prove(&expect))?;
        Ok(changed)
    })();
    match changed {
        Ok(changed) => {
            undo.commit();
            merge::restart_changed(&changed)
        }
        Err(e) => Err(undo.undo(e)),
    }
}

fn describe(set: &[Chosen]) -> String {
    set.iter()
        .map(|c| format!("{} {}", c.name, c.version))
        .collect::<Vec<_>>()
        .join(", ")
}

fn secs(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}
