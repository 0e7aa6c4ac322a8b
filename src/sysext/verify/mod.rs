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

mod local;

use std::time::Duration;

use crate::cli::Verify;
use crate::error::{Error, Result};
use crate::net::boot_check::{self, Opening};
use crate::net::nodeinfo;
use crate::node::dir::DirLock;
use crate::node::root::Root;
use crate::node::state_file::StateFile;
use crate::node::status::{Chosen, Outcome, Record, Returned, State, Verification};
use crate::node::undo::Undo;
use crate::sysext::known_good::{KnownGood, Refused};
use crate::sysext::merge::{self, Expect};
use crate::sysext::report::{self, describe};
use crate::sysext::stage;

use local::{digest_of, local_checks};

pub fn run(v: &Verify) -> Result<()> {
    // 1. The Node's name (a wrong one exits 2 before anything), the root, this boot.
    let o = Opening::new(&v.kubeconfig, v.api_wait, v.node_name.as_deref())?;
    let boot_id = crate::node::seams::boot_id()?;
    // 2. The links' lock, held to the end.
    let _links = lock_links(&o.root)?;
    // 3. What killed runs left swept, the last bootstrap's record, and the known-good set.
    let (record, from) = o.last_bootstrap()?;
    let mut known = KnownGood::load(&o.root)?;
    let carried = boot_check::carried(&record, "merged");
    let c = Run {
        o,
        boot_id,
        record,
        from,
        carried,
    };
    // 4. What the node should run.
    let Some(basis) = c.basis(&known)? else {
        return Ok(());
    };
    // 5. The checks on the node itself, then the Node's word.
    let (verification, lying) = c.judge(basis.set());
    // 6. The verdict: on the known-good set; a match; or a mismatch, its refusals and return.
    match basis {
        Basis::KnownGood(set) => c.known_good(&mut known, &set, verification),
        Basis::Record(set) if verification.outcome == Outcome::Verified => {
            c.verified(&mut known, &set, verification)
        }
        Basis::Record(set) => c.mismatch(&mut known, &set, verification, &lying),
    }
}

/// Never while a bootstrap (the patch stream) switches links, and one check at a time: the
/// links' lock, held to the end, taken before anything is read, so that a second check judges
/// what the first left. What a killed return left there goes first.
fn lock_links(root: &Root) -> Result<Option<DirLock>> {
    let links = root.dir(stage::LINKS)?;
    let lock = match &links {
        Some(d) => Some(d.lock(Duration::from_secs(60))?),
        None => None,
    };
    if let Some(d) = &links {
        d.sweep_leftovers(true);
    }
    Ok(lock)
}

/// Where the expected set comes from.
enum Basis {
    /// The last bootstrap's record (its choice, or the return a check made since).
    Record(Vec<Chosen>),
    /// The known-good set: the last bootstrap did not complete.
    KnownGood(Vec<Chosen>),
}

impl Basis {
    fn set(&self) -> &[Chosen] {
        match self {
            Basis::Record(e) | Basis::KnownGood(e) => e,
        }
    }
}

/// One check's inputs, read in steps 1 to 3.
struct Run {
    o: Opening,
    boot_id: String,
    record: Record,
    from: String,
    /// A return of an earlier check, which stands until a bootstrap chooses again.
    carried: Option<Returned>,
}

impl Run {
    /// The Node, when the API server is asked at all.
    fn to(&self) -> Option<report::To<'_>> {
        (!self.o.node.is_empty()).then(|| report::To {
            root: &self.o.root,
            kubeconfig: &self.o.kubeconfig,
            node: &self.o.node,
        })
    }

    /// Step 4: the set the node should run, or `None` when there is nothing to verify.
    fn basis(&self, known: &KnownGood) -> Result<Option<Basis>> {
        let (record, from) = (&self.record, &self.from);
        if record.state != State::Done {
            // A failed or interrupted bootstrap put the node back as it was: the known-good set.
            if known.set.is_empty() {
                return Err(not_done(record, from));
            }
            crate::info!(
                "{}; expecting the known-good set verified at {}",
                not_done(record, from),
                known.verified.as_deref().unwrap_or("?")
            );
            return Ok(Some(Basis::KnownGood(known.set.clone())));
        }
        check_sysext(record, from)?;
        Ok(match self.carried.clone() {
            // A return of an earlier check stands until a bootstrap chooses again.
            Some(r) => {
                crate::info!(
                    "expecting the known-good set a check returned to at boot {} ({from})",
                    r.boot_id
                );
                Some(Basis::Record(r.to))
            }
            None if record.chosen.is_empty() => {
                crate::info!(
                    "{from} names no extension set (written before the boot check, or every extension left alone): nothing to verify"
                );
                None
            }
            None => Some(Basis::Record(record.chosen.clone())),
        })
    }

    /// Step 5: the checks on the node itself, then (when they pass) the Node's nodeInfo; and
    /// the extensions whose image is to blame.
    fn judge(&self, expected: &[Chosen]) -> (Verification, Vec<String>) {
        // The Node's condition says the check runs (when the API server is asked at all).
        if let Some(t) = &self.to() {
            crate::info!("reported {}", report::checking(t, &self.boot_id));
        }
        let (checks, lying) = local_checks(&self.o.root, expected);
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
        let want = nodeinfo::Want {
            kubelet,
            runtime: runtime.clone().map(|w| (w, &judge as nodeinfo::Judge)),
        };
        let mut v = self
            .o
            .verdict(&self.boot_id, checks, &want, self.carried.clone());
        v.merged_by = crate::sysext::boot_merge::which_took().map(|by| {
            crate::info!("merged by: the {by} merge (systemd-sysext status's since, systemd's UserspaceTimestamp)");
            by.to_string()
        });
        (v, lying)
    }

    /// Step 6 on the known-good set (the record is of a run that failed): nothing of this
    /// check goes into it.
    fn known_good(
        &self,
        known: &mut KnownGood,
        expected: &[Chosen],
        verification: Verification,
    ) -> Result<()> {
        let ok = verification.outcome == Outcome::Verified;
        let set = describe(expected);
        let first = verification.first_mismatch();
        let ending = if ok {
            report::Ending::Verified { known_good: true }
        } else {
            report::Ending::Mismatch {
                first: &first,
                refused: Vec::new(),
                returned: Err("nothing to return to: the node needs an operator".into()),
            }
        };
        if let Some(t) = &self.to() {
            let by = verification.merged_by.as_deref();
            report::verdict(t, &self.record, expected, &ending, by);
        }
        if ok {
            known.verified = Some(verification.at.clone());
            known.save(&self.o.root)?;
            crate::info!("verified: the node runs the known-good set ({set})");
            return Ok(());
        }
        Err(Error::failed(format!(
            "the node does not run its known-good set ({set}): {first}; nothing to return to: the node needs an operator"
        )))
    }

    /// Step 6 on a match: the set is the known-good one from now on.
    fn verified(
        &self,
        known: &mut KnownGood,
        expected: &[Chosen],
        mut verification: Verification,
    ) -> Result<()> {
        let root = &self.o.root;
        if !expected.is_empty() {
            known.set = expected.to_vec();
            known.verified = Some(verification.at.clone());
            known.save(root)?;
        }
        let ending = report::Ending::Verified { known_good: false };
        verification.reported = self.to().map(|t| {
            let by = verification.merged_by.as_deref();
            report::verdict(&t, &self.record, expected, &ending, by)
        });
        let mut after = self.record.clone();
        let at = self.o.record(&self.record, &mut after, verification)?;
        crate::info!(
            "verified: the node runs {} as {} records; now the known-good set ({}); recorded in {at}",
            describe(expected),
            self.from,
            root.show(crate::sysext::known_good::PATH)
        );
        Ok(())
    }

    /// Step 6 on a mismatch: the lying images refused, the return to the known-good set, the
    /// verdict recorded, then the Node told.
    fn mismatch(
        &self,
        known: &mut KnownGood,
        expected: &[Chosen],
        mut verification: Verification,
        lying: &[String],
    ) -> Result<()> {
        let refused = refuse(known, expected, &verification, lying);
        // The refusals first: whatever happens to the return, the lying image is never staged
        // again.
        known.save(&self.o.root)?;
        let (back, returned_ok) = self.go_back(known, expected, &mut verification);
        let first = verification.first_mismatch();
        let ending = report::Ending::Mismatch {
            first: &first,
            refused,
            returned: if returned_ok {
                Ok(back.clone())
            } else {
                Err(back.clone())
            },
        };
        let merged_by = verification.merged_by.clone();
        let mut after = self.record.clone();
        let at = self.o.record(&self.record, &mut after, verification)?;
        if returned_ok {
            known.returned_boot = Some(self.boot_id.clone());
            known.save(&self.o.root)?;
        }
        // The Node is told once the return is recorded: a kill while the cluster is slow never
        // leaves a return that the record does not hold.
        if let Some(t) = &self.to() {
            let told = report::verdict(t, &self.record, expected, &ending, merged_by.as_deref());
            self.o.record_told(&self.record, &after, told);
        }
        Err(boot_check::mismatch(&self.from, &first, &back, &at))
    }

    /// The node goes back to the known-good set, once per boot (the boot is kept with the
    /// known-good set, which outlives the records of later bootstraps in this boot, and in the
    /// record, which holds it first: a kill between the two still counts the return). A return
    /// that failed (a disk that refused the links) changed nothing that holds: the next check
    /// tries it again. What became of it, and whether the known-good set is merged now.
    fn go_back(
        &self,
        known: &KnownGood,
        expected: &[Chosen],
        verification: &mut Verification,
    ) -> (String, bool) {
        let boot_id = &self.boot_id;
        let recorded = self
            .record
            .verification
            .as_ref()
            .and_then(|p| p.returned.as_ref())
            .is_some_and(|r| &r.boot_id == boot_id && r.result == "merged");
        if known.returned_boot.as_deref() == Some(boot_id.as_str()) || recorded {
            return ("not returned again: this boot already returned to the known-good set once; the node needs an operator".to_string(), false);
        }
        if known.set.is_empty() {
            return (
                "nothing to return to: no boot of this node has been verified yet".to_string(),
                false,
            );
        }
        if known.set == expected {
            return (
                "nothing to return to: the known-good set itself does not run as recorded"
                    .to_string(),
                false,
            );
        }
        // Extensions this boot's merge left out: their services never started in this boot.
        let missing: Vec<String> = verification
            .checks
            .iter()
            .filter(|k| !k.ok)
            .filter_map(|k| k.what.strip_suffix(" merged for /usr").map(str::to_string))
            .collect();
        let policy = crate::sysext::trust::policy_of(&self.record);
        let (result, note) = match return_to(&self.o.root, &known.set, expected, &missing, policy) {
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
        if !merged {
            return (
                format!("the return to the known-good set failed: {result}"),
                false,
            );
        }
        let back = format!(
            "returned to the known-good set verified at {} ({}){note}",
            known.verified.as_deref().unwrap_or("?"),
            describe(&known.set)
        );
        (back, true)
    }
}

/// A mismatch: images that did not run as named (another version inside, or left out of a
/// merge that took the others) are never staged again. A link or a file changed on the node,
/// or a merge that failed as a whole, is not the image's fault: the image stays eligible.
/// What was refused.
fn refuse(
    known: &mut KnownGood,
    expected: &[Chosen],
    verification: &Verification,
    lying: &[String],
) -> Vec<String> {
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
    refused
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
