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
use std::time::{Duration, Instant};

use crate::cli::Verify;
use crate::error::{Error, Result};
use crate::net::nodeinfo;
use crate::node::root::Root;
use crate::node::state_file::StateFile;
use crate::node::status::{
    self, ApiCheck, Check, Chosen, Phase, Record, Returned, State, Verification,
};
use crate::node::undo::Undo;
use crate::sysext::known_good::{KnownGood, Refused};
use crate::sysext::merge::{self, Expect};
use crate::sysext::report::{self, describe};
use crate::sysext::stage;

/// An image is hashed in full; a larger one is not one nodestrap staged.
const IMAGE_CAP: u64 = 8 << 30;

pub fn run(v: &Verify) -> Result<()> {
    let since = Instant::now();
    // A name that cannot be a Node's is the operator's error: exit 2 before anything.
    let node = if v.api_wait > 0 || v.node_name.is_some() {
        nodeinfo::node_name(v.node_name.as_deref())?
    } else {
        String::new()
    };
    let root = Root::open(Path::new("/"))?;
    let boot_id = crate::node::seams::boot_id()?;
    // Never while a bootstrap (the patch stream) switches links, and one check at a time: the
    // links' lock, held to the end, taken before anything is read, so that a second check
    // judges what the first left. What a killed return left there goes first.
    let links = root.dir(stage::LINKS)?;
    let _links = match &links {
        Some(d) => Some(d.lock(Duration::from_secs(60))?),
        None => None,
    };
    if let Some(d) = &links {
        d.sweep_leftovers(true);
    }
    crate::node::temps::sweep(&root);
    let (record, from) = status::last_bootstrap()?;
    let mut known = KnownGood::load(&root)?;

    // What the node should run.
    let carried = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.clone())
        .filter(|r| r.result == "merged");
    let basis = if record.state != State::Done {
        // A failed or interrupted bootstrap put the node back as it was: the known-good set.
        if known.set.is_empty() {
            return Err(not_done(&record, &from));
        }
        crate::info!(
            "{}; expecting the known-good set verified at {}",
            not_done(&record, &from),
            known.verified.as_deref().unwrap_or("?")
        );
        Basis::KnownGood(known.set.clone())
    } else {
        check_sysext(&record, &from)?;
        match carried.clone() {
            // A return of an earlier check stands until a bootstrap chooses again.
            Some(r) => {
                crate::info!(
                    "expecting the known-good set a check returned to at boot {} ({from})",
                    r.boot_id
                );
                Basis::Record(r.to)
            }
            None if record.chosen.is_empty() => {
                crate::info!(
                    "{from} names no extension set (written before the boot check, or every extension left alone): nothing to verify"
                );
                return Ok(());
            }
            None => Basis::Record(record.chosen.clone()),
        }
    };
    let expected = match &basis {
        Basis::Record(e) | Basis::KnownGood(e) => e.clone(),
    };
    // The Node's condition says the check runs (when the API server is asked at all).
    let to = (!node.is_empty()).then(|| report::To {
        root: &root,
        kubeconfig: &v.kubeconfig,
        node: &node,
    });
    if let Some(t) = &to {
        crate::info!("reported {}", report::checking(t, &boot_id));
    }
    let (checks, lying) = local_checks(&root, &expected);
    let local_ok = checks.iter().all(|c| c.ok);
    let local_s = since.elapsed();

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
        let kubelet = expected
            .iter()
            .find(|c| c.name == "kubernetes")
            .map(|c| c.version.clone());
        let runtime = expected
            .iter()
            .find(|c| c.name == "containerd" || c.name == "docker")
            .map(|c| format!("{}://{}", c.name, c.version.trim_start_matches('v')));
        let judge = |got: &str| {
            runtime
                .as_ref()
                .is_some_and(|w| nodeinfo::same_version(w, got))
        };
        let a = nodeinfo::ask(
            &root,
            &v.kubeconfig,
            Duration::from_secs(v.api_wait),
            &node,
            &nodeinfo::Want {
                kubelet,
                runtime: runtime.clone().map(|w| (w, &judge as nodeinfo::Judge)),
            },
        );
        (a.api, a.note, a.checks)
    };
    let mut checks = checks;
    checks.extend(api_checks);
    let ok = local_ok && api != ApiCheck::Mismatch;

    let mut verification = Verification::taken(&boot_id, checks, ok, api, api_note, carried);
    verification.local_s = Some(status::millis(local_s));
    verification.merged_by = crate::sysext::boot_merge::which_took().map(|by| {
        crate::info!("merged by: the {by} merge (systemd-sysext status's since, systemd's UserspaceTimestamp)");
        by.to_string()
    });
    let set = describe(&expected);

    if let Basis::KnownGood(_) = basis {
        // The record is of a run that failed: nothing of this check goes into it.
        let first = first_failed(&verification.checks);
        let ending = if ok {
            report::Ending::Verified { known_good: true }
        } else {
            report::Ending::Mismatch {
                first: &first,
                refused: Vec::new(),
                returned: Err("nothing to return to: the node needs an operator".into()),
            }
        };
        if let Some(t) = &to {
            report::verdict(
                t,
                &record,
                &expected,
                &ending,
                verification.merged_by.as_deref(),
            );
        }
        if ok {
            known.verified = Some(verification.at.clone());
            known.save(&root)?;
            crate::info!("verified: the node runs the known-good set ({set})");
            return Ok(());
        }
        return Err(Error::failed(format!(
            "the node does not run its known-good set ({set}): {first}; nothing to return to: the node needs an operator"
        )));
    }

    let mut after = record.clone();
    if ok {
        if !expected.is_empty() {
            known.set = expected.clone();
            known.verified = Some(verification.at.clone());
            known.save(&root)?;
        }
        after.phase = Phase::Verified;
        let ending = report::Ending::Verified { known_good: false };
        verification.reported = to.as_ref().map(|t| {
            report::verdict(
                t,
                &record,
                &expected,
                &ending,
                verification.merged_by.as_deref(),
            )
        });
        verification.timed(since);
        verification.events = status::verdict_events(&verification, 0);
        after.verification = Some(verification);
        let at = status::amend(&root, &record, &after)?;
        crate::info!(
            "verified: the node runs {set} as {from} records; now the known-good set ({}); recorded in {at}",
            root.show(crate::sysext::known_good::PATH)
        );
        return Ok(());
    }

    // A mismatch: images that did not run as named (another version inside, or left out of a
    // merge that took the others) are never staged again. A link or a file changed on the node,
    // or a merge that failed as a whole, is not the image's fault: the image stays eligible.
    let mut refused = Vec::new();
    for c in expected.iter().filter(|c| lying.contains(&c.name)) {
        if known.image_of(&c.name) == Some(c) {
            continue;
        }
        refused.push(format!("{} {} ({})", c.name, c.version, c.digest));
        let why: Vec<String> = verification
            .checks
            .iter()
            .filter(|k| !k.ok && k.what.starts_with(&format!("{} ", c.name)))
            .map(|k| format!("{}: expected {}, found {}", k.what, k.expected, k.running))
            .collect();
        crate::warn!(
            "{} {} ({}) refused: never staged again on this node",
            c.name,
            c.version,
            c.digest
        );
        let back = known.image_of(&c.name).map(|k| k.version.clone());
        known
            .floor
            .back(&c.name, &c.version, back.as_deref(), &verification.at);
        known.refuse(Refused {
            name: c.name.clone(),
            version: c.version.clone(),
            digest: c.digest.clone(),
            why: crate::error::excerpt(&why.join("; "), 400),
            at: verification.at.clone(),
        });
    }

    // The refusals first: whatever happens to the return, the lying image is never staged again.
    known.save(&root)?;
    // ... and the node goes back to the known-good set, once per boot (the boot is kept with
    // the known-good set, which outlives the records of later bootstraps in this boot, and in
    // the record, which holds it first: a kill between the two still counts the return). A
    // return that failed (a disk that refused the links) changed nothing that holds: the next
    // check tries it again.
    let recorded = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.as_ref())
        .is_some_and(|r| r.boot_id == boot_id && r.result == "merged");
    let returned_now = known.returned_boot.as_deref() == Some(boot_id.as_str()) || recorded;
    let mut returning = false;
    let back = if returned_now {
        "not returned again: this boot already returned to the known-good set once; the node needs an operator".to_string()
    } else if known.set.is_empty() {
        "nothing to return to: no boot of this node has been verified yet".to_string()
    } else if known.set == expected {
        "nothing to return to: the known-good set itself does not run as recorded".to_string()
    } else {
        returning = true;
        // Extensions this boot's merge left out: their services never started in this boot.
        let missing: Vec<String> = verification
            .checks
            .iter()
            .filter(|k| !k.ok)
            .filter_map(|k| k.what.strip_suffix(" merged for /usr").map(str::to_string))
            .collect();
        let (result, note) = match return_to(
            &root,
            &known.set,
            &expected,
            &missing,
            crate::sysext::trust::policy_of(&record),
        ) {
            Ok(None) => ("merged".to_string(), String::new()),
            Ok(Some(restart)) => ("merged".to_string(), format!("; but {restart}")),
            Err(e) => (e.to_string(), String::new()),
        };
        let merged = result == "merged";
        verification.returned = Some(Returned {
            to: known.set.clone(),
            boot_id: boot_id.clone(),
            result: result.clone(),
        });
        if merged {
            format!(
                "returned to the known-good set verified at {} ({}){note}",
                known.verified.as_deref().unwrap_or("?"),
                describe(&known.set)
            )
        } else {
            format!("the return to the known-good set failed: {result}")
        }
    };
    let first = first_failed(&verification.checks);
    let returned_ok = returning
        && verification
            .returned
            .as_ref()
            .is_some_and(|r| r.result == "merged");
    let ending = report::Ending::Mismatch {
        first: &first,
        refused,
        returned: if returned_ok {
            Ok(back.clone())
        } else {
            Err(back.clone())
        },
    };
    verification.timed(since);
    // The chosen set no longer holds: the record goes back to `done`.
    after.phase = Phase::Done;
    verification.events = status::verdict_events(&verification, 1);
    let merged_by = verification.merged_by.clone();
    after.verification = Some(verification);
    let at = status::amend(&root, &record, &after)?;
    if returned_ok {
        known.returned_boot = Some(boot_id.clone());
        known.save(&root)?;
    }
    // The Node is told once the return is recorded: a kill while the cluster is slow never
    // leaves a return that the record does not hold.
    if let Some(t) = &to {
        let told = report::verdict(t, &record, &expected, &ending, merged_by.as_deref());
        let mut told_after = after.clone();
        if let Some(v) = told_after.verification.as_mut() {
            v.reported = Some(told);
        }
        if let Err(e) = status::amend(&root, &record, &told_after) {
            crate::warn!("what the Node was told is not recorded: {e}");
        }
    }
    Err(Error::failed(format!(
        "the node does not run what {from} chose: {first}; {back} (recorded in {at})"
    )))
}

/// Where the expected set comes from.
enum Basis {
    /// The last bootstrap's record (its choice, or the return a check made since).
    Record(Vec<Chosen>),
    /// The known-good set: the last bootstrap did not complete.
    KnownGood(Vec<Chosen>),
}

fn not_done(record: &Record, from: &str) -> Error {
    Error::failed(format!(
        "{from}: the last bootstrap {}: it chose nothing that can run",
        match record.state {
            State::Running => "is still running",
            State::Failed => "failed",
            State::Interrupted => "was interrupted",
            State::Done => "ended",
        }
    ))
}

fn first_failed(checks: &[Check]) -> String {
    checks
        .iter()
        .find(|k| !k.ok)
        .map(|k| format!("{}: expected {}, found {}", k.what, k.expected, k.running))
        .unwrap_or_default()
}

/// Only a sysext bootstrap has a set to verify.
fn check_sysext(record: &Record, from: &str) -> Result<()> {
    if record.command != "bootstrap" {
        return Err(Error::failed(format!(
            "{from} is the record of `{}`, not of a bootstrap: nothing to verify",
            record.command
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

/// The checks on the node itself, per extension; and the extensions whose image is to blame
/// (merged intact from the recorded link, yet not in /usr or another version runs). What takes
/// time (hashing each image, each program's `--version`, `systemd-sysext status`) runs side by
/// side; the checks are then made in order.
fn local_checks(root: &Root, expected: &[Chosen]) -> (Vec<Check>, Vec<String>) {
    let (merged, digests, said) = std::thread::scope(|s| {
        let merged = s.spawn(merge::status_usr);
        let digests: Vec<_> = expected
            .iter()
            .map(|c| s.spawn(move || digest_of(root, &c.image, &c.digest)))
            .collect();
        let said: Vec<_> = expected
            .iter()
            .map(|c| {
                s.spawn(move || {
                    merge::version_probe(&c.name)
                        .map(|argv| (crate::node::exec::version_line(&argv), argv))
                })
            })
            .collect();
        let join = |e: Box<dyn std::any::Any + Send>| {
            e.downcast_ref::<&str>()
                .map(|m| m.to_string())
                .unwrap_or_else(|| "a check's thread panicked".into())
        };
        (
            merged
                .join()
                .map_err(|e| Error::failed(join(e)))
                .and_then(|m| m),
            digests
                .into_iter()
                .map(|h| h.join().unwrap_or_else(join))
                .collect::<Vec<_>>(),
            said.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|e| Some((Err(join(e)), Vec::new())))
                })
                .collect::<Vec<_>>(),
        )
    });
    let backing = crate::sysext::image::loop_backings();
    let mut out = Vec::new();
    let mut lying = Vec::new();
    for ((c, digest), said) in expected.iter().zip(digests).zip(said) {
        let n = &c.name;
        let first = out.len();
        let link = format!("{}/{n}.raw", stage::LINKS);
        out.push(Check::compare(
            format!("{n} link {}", root.show(&link)),
            c.image.as_str(),
            root.dir(stage::LINKS)
                .ok()
                .flatten()
                .and_then(|d| d.link_target(&format!("{n}.raw")))
                .unwrap_or_else(|| "no link".to_string()),
        ));
        out.push(Check::compare(
            format!("{n} image {}", root.show(&c.image)),
            c.digest.as_str(),
            digest,
        ));
        // The image is to blame when the merge took the others and not this one, or when
        // another version runs from it; never for an error or a merge that failed as a whole.
        let mut blame = false;
        out.push(Check::compare(
            format!("{n} merged for /usr"),
            "listed by systemd-sysext status",
            match &merged {
                Ok(m) if m.contains(n) => "listed by systemd-sysext status".to_string(),
                Ok(m) if m.is_empty() => "nothing merged".to_string(),
                Ok(m) => {
                    blame = true;
                    format!("not listed (merged: {})", m.join(", "))
                }
                Err(e) => e.to_string(),
            },
        ));
        out.push(Check::compare(
            format!("{n} merged image"),
            "read by a loop device",
            match identity(root, &c.image) {
                Ok(id) if backing.contains(&id) => "read by a loop device".to_string(),
                Ok(_) => "no loop device reads it".to_string(),
                Err(e) => e,
            },
        ));
        if let Some((line, argv)) = said {
            let version = c.version.trim_start_matches('v');
            out.push(Check::compare(
                format!("{n} {}", argv.join(" ")),
                format!("version {version}"),
                match line {
                    Ok(s) if crate::node::exec::says_version(&s, version) => {
                        format!("version {version}")
                    }
                    Ok(s) => {
                        blame = true;
                        format!("{s:?}")
                    }
                    Err(e) => e,
                },
            ));
        }
        // Only when the link and the file are as recorded (the node's part).
        if blame && out[first..first + 2].iter().all(|k| k.ok) {
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

/// Links back to `set`, each image checked against its digest first; refresh, prove, restart
/// what changed. A failure up to the proof puts the links back as they were (the undo log);
/// a restart that fails after it is returned as `Some(why)`: the known-good set is merged.
/// The caller holds the links' lock.
/// Put `set` back: its links, a refresh, its proof, its services restarted. An extension of
/// `leaving` (the set that did not run as chosen) that `set` does not have is unlinked, when
/// its link is nodestrap's (into its store folder): the known-good set did not run it. The
/// services of the extensions in `missing` (left out of this boot's merge) never ran in this
/// boot: a try-restart leaves them stopped, so they are started.
fn return_to(
    root: &Root,
    set: &[Chosen],
    leaving: &[Chosen],
    missing: &[String],
    policy: Option<&'static str>,
) -> Result<Option<String>> {
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
    match relink(root, set, leaving, policy, &mut undo) {
        Ok(changed) => {
            undo.commit();
            Ok(restart(set, missing, &changed))
        }
        Err(e) => Err(undo.undo(e)),
    }
}

/// `set`'s links, and `leaving`'s unlinked, each step in `undo`; then the refresh and its
/// proof. The services of the links that changed, with their versions.
fn relink(
    root: &Root,
    set: &[Chosen],
    leaving: &[Chosen],
    policy: Option<&'static str>,
    undo: &mut Undo,
) -> Result<Vec<(&'static str, String)>> {
    let mut changed = Vec::new();
    for c in set {
        if stage::relink(root, &c.name, &c.image, undo)? {
            if let Some(u) = merge::service_of(&c.name) {
                changed.push((u, c.version.clone()));
            }
        }
    }
    for c in leaving
        .iter()
        .filter(|c| !set.iter().any(|k| k.name == c.name))
    {
        let link = format!("{}/{}.raw", stage::LINKS, c.name);
        let ours = format!("{}/{}/", stage::STORE, c.name);
        if root.read_link(&link).is_some_and(|t| t.starts_with(&ours)) {
            undo.remove(&link)?;
            crate::info!(
                "{} removed: {} {} is not in the known-good set",
                root.show(&link),
                c.name,
                c.version
            );
        }
    }
    undo.then_on_undo("the extensions found at boot are merged again", move || {
        merge::refresh(policy)
    });
    let expect: Vec<Expect> = set
        .iter()
        .map(|c| Expect {
            name: &c.name,
            label: c.version.clone(),
            version: c.version.trim_start_matches('v').to_string(),
        })
        .collect();
    merge::refresh(policy).and_then(|()| merge::prove(&expect))?;
    Ok(changed)
}

/// The services of the links that `changed` restarted, and those of `missing` started: why one
/// of them did not, logged.
fn restart(
    set: &[Chosen],
    missing: &[String],
    changed: &[(&'static str, String)],
) -> Option<String> {
    let mut failed = merge::restart_changed(changed).err();
    for c in set.iter().filter(|c| missing.contains(&c.name)) {
        let Some(unit) = merge::service_of(&c.name) else {
            continue;
        };
        match crate::node::dbus::systemd_start(unit) {
            Ok(_) => crate::info!(
                "{unit} started: {} was missing from this boot's merge, so it never ran",
                c.name
            ),
            Err(e) => {
                failed.get_or_insert(e.hint(format!(
                    "{} {} is merged again, but {unit} did not start: systemctl start {unit}",
                    c.name, c.version
                )));
            }
        }
    }
    failed.map(|e| {
        crate::error!("{e}");
        e.to_string()
    })
}
