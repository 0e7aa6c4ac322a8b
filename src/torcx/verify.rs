//! `nodestrap verify` on a torcx node: after the boot the bootstrap asked for, prove that torcx
//! applied the profile it chose (sealed with that profile, docker at the chosen version in the
//! applied profile, and that docker answering as that version), that kubelet.env names the
//! chosen kubelet, and, when the API server answers, that the Node reports that kubelet and a
//! runtime of the applied image; or record what runs instead. A runtime that is not the chosen
//! one selects the known-good profile for the next boot: torcx applies a profile only at boot,
//! so the return needs a reboot, which is recorded (the record's `reboot`) and left to the
//! operator or the update agent, never taken here (docs/verify.md, "torcx nodes").
use std::cell::RefCell;
use std::collections::HashMap;

use crate::cli::Verify;
use crate::error::{Error, Result};
use crate::net::boot_check::{self, Opening};
use crate::net::node_report::{
    self, label_value, Event, Report, Verdict, LABEL_KUBERNETES, LABEL_RUNTIME, LABEL_TRUST,
};
use crate::net::nodeinfo;
use crate::node::envfile::EnvFile;
use crate::node::exec;
use crate::node::root::Root;
use crate::node::status::{Check, Chosen, Outcome, Reboot, Record, Returned, State, Verification};
use crate::torcx::layout::Layout;
use crate::torcx::store::{self, Profile, KNOWN_GOOD};

/// torcx's seal: written once the generator applied a profile (torcx.target asserts it).
const SEAL: &str = "/run/metadata/torcx";
/// The image nodestrap stages, and the decision that names its version.
const RUNTIME: &str = "docker";
/// `Returned::result` of a return: the known-good profile is next-profile, for the next boot.
const NEXT_BOOT: &str = "next-profile for the next boot";

/// What the node should run: a profile, and the docker version it names; and the kubelet
/// kubelet.env names (its path and version), when the record chose one.
struct Expected {
    profile: String,
    version: String,
    kubelet: Option<(String, String)>,
}

impl Expected {
    /// `profile P with docker V`, as the log, the errors and the Node say it.
    fn what(&self) -> String {
        format!("profile {} with docker {}", self.profile, self.version)
    }
}

pub fn run(v: &Verify) -> Result<()> {
    // 1. The Node's name (a wrong one exits 2 before anything), the root, the last
    //    bootstrap's record (what killed runs left swept first), this boot.
    let o = Opening::new(&v.kubeconfig, v.api_wait, v.node_name.as_deref())?;
    let (record, from) = o.last_bootstrap()?;
    let boot_id = crate::node::seams::boot_id()?;
    // 2. torcx's folders and the known-good profile.
    let layout = Layout::read(&o.root)?;
    let known_path = store::known_good_path(&layout);
    let known = read_profile(&o.root, &known_path)?;
    // The vendor profile names `com.coreos.cl`: compared as the version it stands for.
    let known_version = known
        .as_ref()
        .and_then(|p| p.reference(RUNTIME))
        .map(|r| store::resolved_reference(&o.root, RUNTIME, r));
    let carried = boot_check::carried(&record, NEXT_BOOT);
    let c = Run {
        o,
        boot_id,
        record,
        from,
        layout,
        known_path,
        known_version,
        carried,
    };
    // 3. What the node should run, unless nothing of it runs before the next boot.
    let Some(expected) = c.expected()? else {
        return Ok(());
    };
    if c.chosen_for_the_next_boot(&expected) {
        return Ok(());
    }
    // 4. The checks on the node itself, then the Node's word.
    let verification = c.judge(&expected);
    // 5. The verdict: a match, or a mismatch and the known-good profile for the next boot.
    if verification.outcome == Outcome::Verified {
        return c.verified(&expected, verification);
    }
    c.mismatch(&expected, verification)
}

/// One check's inputs, read in steps 1 and 2.
struct Run {
    o: Opening,
    boot_id: String,
    record: Record,
    from: String,
    layout: Layout,
    /// The known-good profile (a node path), and the docker version it names.
    known_path: String,
    known_version: Option<String>,
    /// A return of an earlier check, which stands until a bootstrap chooses again.
    carried: Option<Returned>,
}

impl Run {
    /// Step 3: what the node should run, or `None` when there is nothing to verify.
    fn expected(&self) -> Result<Option<Expected>> {
        let (record, from) = (&self.record, &self.from);
        let decided = |what: &str| {
            record
                .decisions
                .iter()
                .find(|d| d.what == what)
                .map(|d| d.value.clone())
        };
        if record.state != State::Done {
            // A failed or interrupted bootstrap put the node back as it was.
            let Some(v) = self.known_version.clone() else {
                return Err(Error::failed(format!(
                    "{from}: the last bootstrap did not complete ({:?}), and the node keeps no known-good profile ({})",
                    record.state,
                    self.o.root.show(&self.known_path)
                )));
            };
            crate::info!(
                "{from}: the last bootstrap did not complete; expecting the known-good profile"
            );
            return Ok(Some(Expected {
                profile: KNOWN_GOOD.into(),
                version: v,
                kubelet: None,
            }));
        }
        let kubelet = decided("k8s").zip(record.kubelet_env.as_ref().map(|m| m.path.clone()));
        let kubelet = kubelet.map(|(version, path)| (path, version));
        if let Some(r) = &self.carried {
            // A return of an earlier check stands until a bootstrap chooses again.
            crate::info!(
                "expecting the known-good profile a check selected at boot {} ({from})",
                r.boot_id
            );
            return Ok(Some(Expected {
                profile: KNOWN_GOOD.into(),
                version: r.to.first().map(|c| c.version.clone()).unwrap_or_default(),
                kubelet,
            }));
        }
        match (decided("torcx-profile"), decided(RUNTIME)) {
            (Some(profile), Some(version)) => Ok(Some(Expected {
                profile,
                version,
                kubelet,
            })),
            _ => {
                crate::info!(
                    "{from}: the last bootstrap selected no torcx profile (torcx left alone): nothing to verify"
                );
                Ok(None)
            }
        }
    }

    /// Chosen in this boot for the next one: nothing of it runs yet.
    fn chosen_for_the_next_boot(&self, e: &Expected) -> bool {
        let record = &self.record;
        let this_boot = record
            .process
            .as_ref()
            .is_some_and(|p| p.boot_id == self.boot_id);
        if this_boot && self.carried.is_none() && matches!(record.reboot, Reboot::Needed { .. }) {
            crate::info!(
                "{}: the bootstrap of this boot selected profile {} (docker {}) for the next boot; nothing to verify before it",
                self.from,
                e.profile,
                e.version
            );
            return true;
        }
        false
    }

    /// Step 4: the checks on the node itself, then (when they pass) the Node's nodeInfo.
    fn judge(&self, e: &Expected) -> Verification {
        let (checks, bindir) = checks(&self.o.root, &self.layout, e);
        let runtime = RuntimeJudge::new(&e.version, &bindir);
        let judge = |got: &str| runtime.judge(got);
        let want = nodeinfo::Want {
            kubelet: e.kubelet.as_ref().map(|(_, k)| k.clone()),
            runtime: Some((runtime.expected(), &judge)),
        };
        self.o
            .verdict(&self.boot_id, checks, &want, self.carried.clone())
    }

    /// Step 5 on a match: the profile torcx applied is the known-good one from now on.
    fn verified(&self, e: &Expected, mut verification: Verification) -> Result<()> {
        let root = &self.o.root;
        let applied = self.layout.applied_profile();
        if let Some(b) = root.read(&applied, crate::node::root::CONFIG_CAP)? {
            Profile::parse(&b, &root.show(&applied))?;
            root.write_atomic(&self.known_path, &b, 0o644)?;
        }
        let told = self.tell(e, None);
        if self.record.state != State::Done {
            crate::info!("verified: the node runs its known-good {}", e.what());
            return Ok(());
        }
        verification.reported = told;
        let mut after = self.record.clone();
        // The reboot an earlier check asked for has happened: nothing is pending any more.
        if verification.returned.is_some() {
            after.reboot = Reboot::No;
        }
        let at = self.o.record(&self.record, &mut after, verification)?;
        crate::info!(
            "verified: torcx applied {} as {} records; kept as the known-good profile {}; recorded in {at}",
            e.what(),
            self.from,
            root.show(&self.known_path)
        );
        Ok(())
    }

    /// Step 5 on a mismatch: the known-good profile selected for the next boot (when the
    /// profile is to blame), the verdict recorded, then the Node told.
    fn mismatch(&self, e: &Expected, mut verification: Verification) -> Result<()> {
        let first = verification.first_mismatch();
        if self.record.state != State::Done {
            let why = "nothing to return to: the node needs an operator";
            self.tell(e, Some(&format!("{first}; {why}")));
            return Err(Error::failed(format!(
                "the node does not run its known-good {}: {first}; {why}",
                e.what()
            )));
        }
        let mut after = self.record.clone();
        let back = self.go_back(e, &mut after, &mut verification)?;
        let at = self.o.record(&self.record, &mut after, verification)?;
        // Told once the record holds the verdict (as the sysext check does).
        if let Some(told) = self.tell(e, Some(&format!("{first}; {back}"))) {
            self.o.record_told(&self.record, &after, told);
        }
        Err(boot_check::mismatch(&self.from, &first, &back, &at))
    }

    /// The known-good profile as next-profile, the reboot it needs recorded in `after`, never
    /// taken; what became of the return.
    fn go_back(
        &self,
        e: &Expected,
        after: &mut Record,
        verification: &mut Verification,
    ) -> Result<String> {
        let root = &self.o.root;
        // Only a runtime that is not the chosen one is the profile's fault: the kubelet comes
        // from kubelet.env, which no profile changes.
        let profile_failed = verification.checks.iter().any(|c| {
            !c.ok && !c.what.ends_with("KUBELET_IMAGE_TAG") && !c.what.ends_with(".kubeletVersion")
        });
        // Once per boot, and never to what just failed.
        let returned_here = self
            .record
            .verification
            .as_ref()
            .and_then(|p| p.returned.as_ref())
            .is_some_and(|r| r.boot_id == self.boot_id);
        if !profile_failed {
            return Ok("nothing to return to: the kubelet comes from kubelet.env (KUBELET_IMAGE_TAG), which no torcx profile changes; the node needs an operator".to_string());
        }
        if returned_here {
            return Ok("not returned again: this boot already selected the known-good profile once; the node needs an operator".to_string());
        }
        if e.profile == KNOWN_GOOD {
            return Ok("nothing to return to: the known-good profile itself did not apply".into());
        }
        let (Some(v), Some(bytes)) = (
            self.known_version.clone(),
            root.read(&self.known_path, crate::node::root::CONFIG_CAP)?,
        ) else {
            return Ok(format!(
                "nothing to return to: the node keeps no known-good profile ({})",
                root.show(&self.known_path)
            ));
        };
        let next = self.layout.next_profile();
        root.write_atomic(&next, format!("{KNOWN_GOOD}\n").as_bytes(), 0o644)?;
        let reason = format!(
            "the boot check selected the known-good profile {KNOWN_GOOD} (docker {v}) as next-profile: torcx applies it at the next boot, which nodestrap leaves to the operator or the update agent"
        );
        crate::warn!("reboot needed: {reason}");
        after.reboot = Reboot::Needed { reason };
        verification.returned = Some(Returned {
            to: vec![Chosen {
                name: RUNTIME.into(),
                version: v.clone(),
                image: self.known_path.clone(),
                digest: format!(
                    "sha256-{}",
                    crate::crypto::digest::hex(&crate::crypto::digest::sha256(&bytes))
                ),
            }],
            boot_id: self.boot_id.clone(),
            result: NEXT_BOOT.into(),
        });
        Ok(format!(
            "{} now selects the known-good profile {KNOWN_GOOD} (docker {v}) for the next boot; the reboot is recorded, not taken",
            root.show(&next)
        ))
    }

    /// What the check tells the cluster on its Node, as the sysext check does (docs/verify.md,
    /// "On the Node"): `NodestrapVerified` True with the profile and docker that run, the labels
    /// of the kubelet and docker versions and `nodestrap.io/trust=torcx`; or False with the
    /// first failed check (`mismatch`). Only when the Node's name is known; what was told, or
    /// why not.
    fn tell(&self, e: &Expected, mismatch: Option<&str>) -> Option<String> {
        if self.o.node.is_empty() {
            return None;
        }
        let runs = e.what();
        let report = match mismatch {
            None => Report {
                verdict: Verdict::True,
                reason: "Verified",
                message: format!("runs {runs} as chosen"),
                labels: [
                    e.kubelet
                        .as_ref()
                        .map(|(_, k)| (LABEL_KUBERNETES, label_value(k))),
                    Some((LABEL_RUNTIME, label_value(&format!("docker-{}", e.version)))),
                    Some((LABEL_TRUST, "torcx".to_string())),
                ]
                .into_iter()
                .flatten()
                .collect(),
                events: vec![Event {
                    warning: false,
                    reason: "Verified",
                    message: format!("runs {runs} as chosen"),
                }],
            },
            Some(why) => Report {
                verdict: Verdict::False,
                reason: "Mismatch",
                message: why.to_string(),
                labels: Vec::new(),
                events: vec![Event {
                    warning: true,
                    reason: "Mismatch",
                    message: format!("does not run {runs} as chosen: {why}"),
                }],
            },
        };
        let line = node_report::send(&self.o.root, &self.o.kubeconfig, &self.o.node, &report);
        crate::info!("reported {line}");
        Some(line)
    }
}

/// The seal, the applied profile, docker's own word and kubelet.env's tag, against `e`; and
/// the folder of the applied image's programs.
fn checks(root: &Root, layout: &Layout, e: &Expected) -> (Vec<Check>, String) {
    let mut out = Vec::new();
    let seal = match root.read(SEAL, 64 << 10) {
        Ok(Some(b)) => {
            EnvFile::parse(&String::from_utf8_lossy(&b), SEAL).map_err(|e| e.to_string())
        }
        Ok(None) => Err(format!(
            "not sealed ({SEAL} missing): torcx did not complete"
        )),
        Err(e) => Err(e.to_string()),
    };
    out.push(Check::compare(
        "torcx seal".into(),
        format!("sealed with profile {}", e.profile),
        match &seal {
            Ok(s) => format!(
                "sealed with profile {}",
                s.get("TORCX_UPPER_PROFILE").unwrap_or("(none)")
            ),
            Err(why) => why.clone(),
        },
    ));
    out.push(Check::compare(
        format!("torcx applied {RUNTIME}"),
        format!("{RUNTIME}:{}", e.version),
        match store::applied_reference(root, layout, RUNTIME) {
            Ok(Some(Some(r))) => format!("{RUNTIME}:{r}"),
            Ok(Some(None)) => format!("no {RUNTIME} in {}", root.show(&layout.applied_profile())),
            Ok(None) => format!(
                "torcx applied no profile ({} missing)",
                root.show(&layout.applied_profile())
            ),
            Err(e) => e.to_string(),
        },
    ));
    let bindir = seal
        .as_ref()
        .ok()
        .and_then(|s| s.get("TORCX_BINDIR").map(str::to_string))
        .unwrap_or_else(|| format!("{}/bin", layout.run_dir));
    let argv = vec![format!("{bindir}/{RUNTIME}"), "--version".into()];
    let (said, ok) = match exec::version_line(&argv) {
        Ok(s) if says_torcx_version(&s, &e.version) => (format!("version {}", e.version), true),
        Ok(s) => (format!("{s:?}"), false),
        Err(why) => (why, false),
    };
    out.push(Check::judged(
        argv.join(" "),
        format!("version {}", e.version),
        said,
        ok,
    ));
    if let Some((path, version)) = &e.kubelet {
        // kubelet-wrapper runs the kubelet image this tag names (`+` spelled `_`).
        let tag = version.replace('+', "_");
        out.push(Check::compare(
            format!("kubelet {} KUBELET_IMAGE_TAG", root.show(path)),
            tag,
            match root.read(path, 64 << 10) {
                Ok(Some(b)) => match EnvFile::parse(&String::from_utf8_lossy(&b), path) {
                    Ok(env) => env
                        .get("KUBELET_IMAGE_TAG")
                        .map(str::to_string)
                        .unwrap_or_else(|| "no KUBELET_IMAGE_TAG".into()),
                    Err(e) => e.to_string(),
                },
                Ok(None) => "missing".into(),
                Err(e) => e.to_string(),
            },
        ));
    }
    (out, bindir)
}

/// What the Node may report as its runtime on a torcx node: `docker://` at the chosen release
/// line (a kubelet with dockershim), or a runtime the applied image carries that says that
/// version itself (a CRI kubelet talking to the image's containerd).
struct RuntimeJudge<'a> {
    docker: &'a str,
    bindir: &'a str,
    /// `--version` lines already asked, per program: the API server is asked again every 2 s.
    said: RefCell<HashMap<String, std::result::Result<String, String>>>,
}

impl<'a> RuntimeJudge<'a> {
    fn new(docker: &'a str, bindir: &'a str) -> Self {
        RuntimeJudge {
            docker,
            bindir,
            said: RefCell::new(HashMap::new()),
        }
    }

    fn expected(&self) -> String {
        format!(
            "{RUNTIME}://{}, or a runtime in {} at the version it says",
            self.docker, self.bindir
        )
    }

    fn judge(&self, got: &str) -> bool {
        let Some((scheme, version)) = got.split_once("://") else {
            return false;
        };
        if scheme == RUNTIME {
            return same_release(self.docker, version);
        }
        // A name from the API server: a program name, nothing more.
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return false;
        }
        let program = format!("{}/{scheme}", self.bindir);
        let mut said = self.said.borrow_mut();
        let line = said
            .entry(program.clone())
            .or_insert_with(|| exec::version_line(&[program, "--version".into()]));
        line.as_ref()
            .is_ok_and(|l| exec::says_version(l, version.trim_start_matches('v')))
    }
}

/// Whether `reported` (`17.9.1`, `17.09.1-ce`: the kubelet drops leading zeros) is of the
/// release line or version `chosen` (`17.09`), compared number by number.
fn same_release(chosen: &str, reported: &str) -> bool {
    let numbers = |s: &str| -> Option<Vec<u64>> {
        s.trim_start_matches('v')
            .split(['-', '+', '~'])
            .next()?
            .split('.')
            .map(|n| n.parse().ok())
            .collect()
    };
    match (numbers(chosen), numbers(reported)) {
        (Some(c), Some(r)) => r.len() >= c.len() && r[..c.len()] == c[..],
        _ => false,
    }
}

/// A torcx image's reference names a release line (`17.09`); its docker says the patch too
/// (`Docker version 17.09.1-ce`).
fn says_torcx_version(line: &str, version: &str) -> bool {
    exec::says_version(line, version)
        || line
            .split(|c: char| c.is_whitespace() || c == ',')
            .any(|w| w.strip_prefix(version).is_some_and(|r| r.starts_with('.')))
}

fn read_profile(root: &Root, path: &str) -> Result<Option<Profile>> {
    match root.read(path, crate::node::root::CONFIG_CAP)? {
        Some(b) => Profile::parse(&b, &root.show(path)).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_line_is_named_by_its_patches() {
        assert!(says_torcx_version(
            "Docker version 17.09.1-ce, build 19e2cf6",
            "17.09"
        ));
        assert!(says_torcx_version("docker 17.03", "17.03"));
        assert!(!says_torcx_version("Docker version 17.091.0", "17.09"));
        assert!(!says_torcx_version("Docker version 17.06.2-ce", "17.09"));
    }

    #[test]
    fn the_kubelet_s_docker_version_is_of_the_chosen_line() {
        assert!(same_release("17.09", "17.9.1"));
        assert!(same_release("17.09", "17.09.1-ce"));
        assert!(same_release("1.12", "1.12.6"));
        assert!(!same_release("17.09", "17.6.2"));
        assert!(!same_release("17.09.1", "17.9"));
        assert!(!same_release("17.09", "garbage"));
    }
}
