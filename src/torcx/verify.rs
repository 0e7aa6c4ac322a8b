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
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::Verify;
use crate::error::{Error, Result};
use crate::net::node_report::{
    self, label_value, Event, Report, Verdict, LABEL_KUBERNETES, LABEL_RUNTIME, LABEL_TRUST,
};
use crate::net::nodeinfo;
use crate::node::envfile::EnvFile;
use crate::node::exec;
use crate::node::root::Root;
use crate::node::status::{
    self, ApiCheck, Check, Chosen, Phase, Reboot, Returned, State, Verification,
};
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

pub fn run(v: &Verify) -> Result<()> {
    let since = Instant::now();
    // A name that cannot be a Node's is the operator's error: exit 2 before anything.
    let node = if v.api_wait > 0 || v.node_name.is_some() {
        nodeinfo::node_name(v.node_name.as_deref())?
    } else {
        String::new()
    };
    let root = Root::open(Path::new("/"))?;
    crate::node::temps::sweep(&root);
    let (record, from) = status::last_bootstrap()?;
    let boot_id = crate::node::seams::boot_id()?;
    let layout = Layout::read(&root)?;
    let known_path = store::known_good_path(&layout);
    let known = read_profile(&root, &known_path)?;
    // The vendor profile names `com.coreos.cl`: compared as the version it stands for.
    let known_version = known
        .as_ref()
        .and_then(|p| p.reference(RUNTIME))
        .map(|r| store::resolved_reference(&root, RUNTIME, r));

    let carried = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.clone())
        .filter(|r| r.result == NEXT_BOOT);
    let decided = |what: &str| {
        record
            .decisions
            .iter()
            .find(|d| d.what == what)
            .map(|d| d.value.clone())
    };
    let expected = if record.state != State::Done {
        // A failed or interrupted bootstrap put the node back as it was.
        let Some(v) = known_version.clone() else {
            return Err(Error::failed(format!(
                "{from}: the last bootstrap did not complete ({:?}), and the node keeps no known-good profile ({})",
                record.state,
                root.show(&known_path)
            )));
        };
        crate::info!(
            "{from}: the last bootstrap did not complete; expecting the known-good profile"
        );
        Expected {
            profile: KNOWN_GOOD.into(),
            version: v,
            kubelet: None,
        }
    } else {
        let kubelet = decided("k8s").zip(record.kubelet_env.as_ref().map(|m| m.path.clone()));
        let kubelet = kubelet.map(|(version, path)| (path, version));
        if let Some(r) = &carried {
            // A return of an earlier check stands until a bootstrap chooses again.
            crate::info!(
                "expecting the known-good profile a check selected at boot {} ({from})",
                r.boot_id
            );
            Expected {
                profile: KNOWN_GOOD.into(),
                version: r.to.first().map(|c| c.version.clone()).unwrap_or_default(),
                kubelet,
            }
        } else {
            match (decided("torcx-profile"), decided(RUNTIME)) {
                (Some(profile), Some(version)) => Expected {
                    profile,
                    version,
                    kubelet,
                },
                _ => {
                    crate::info!(
                        "{from}: the last bootstrap selected no torcx profile (torcx left alone): nothing to verify"
                    );
                    return Ok(());
                }
            }
        }
    };
    // Chosen in this boot for the next one: nothing of it runs yet.
    let this_boot = record
        .process
        .as_ref()
        .is_some_and(|p| p.boot_id == boot_id);
    if this_boot && carried.is_none() && matches!(record.reboot, Reboot::Needed { .. }) {
        crate::info!(
            "{from}: the bootstrap of this boot selected profile {} (docker {}) for the next boot; nothing to verify before it",
            expected.profile,
            expected.version
        );
        return Ok(());
    }

    let (mut checks, bindir) = checks(&root, &layout, &expected);
    let local_ok = checks.iter().all(|c| c.ok);
    let local_s = since.elapsed();
    let (api, api_note) = if !local_ok {
        (
            ApiCheck::Skipped,
            Some("not asked: the node itself does not run the chosen set".to_string()),
        )
    } else if v.api_wait == 0 {
        (ApiCheck::Skipped, Some("--api-wait 0".to_string()))
    } else {
        let runtime = RuntimeJudge::new(&expected.version, &bindir);
        let judge = |got: &str| runtime.judge(got);
        let a = nodeinfo::ask(
            &root,
            &v.kubeconfig,
            Duration::from_secs(v.api_wait),
            &node,
            &nodeinfo::Want {
                kubelet: expected.kubelet.as_ref().map(|(_, k)| k.clone()),
                runtime: Some((runtime.expected(), &judge)),
            },
        );
        checks.extend(a.checks);
        (a.api, a.note)
    };
    let ok = local_ok && api != ApiCheck::Mismatch;
    // Only a runtime that is not the chosen one is the profile's fault: the kubelet comes from
    // kubelet.env, which no profile changes.
    let profile_failed = checks.iter().any(|c| {
        !c.ok && !c.what.ends_with("KUBELET_IMAGE_TAG") && !c.what.ends_with(".kubeletVersion")
    });
    let mut verification = Verification::taken(&boot_id, checks, ok, api, api_note, carried);
    verification.local_s = Some(status::millis(local_s));
    let mut after = record.clone();
    let what = format!(
        "profile {} with docker {}",
        expected.profile, expected.version
    );

    if ok {
        // The profile torcx applied is the known-good one from now on.
        let applied = layout.applied_profile();
        if let Some(b) = root.read(&applied, crate::node::root::CONFIG_CAP)? {
            Profile::parse(&b, &root.show(&applied))?;
            root.write_atomic(&known_path, &b, 0o644)?;
        }
        let told = tell(v, &root, &node, &expected, None);
        if record.state != State::Done {
            crate::info!("verified: the node runs its known-good {what}");
            return Ok(());
        }
        verification.reported = told;
        after.phase = Phase::Verified;
        // The reboot an earlier check asked for has happened: nothing is pending any more.
        if verification.returned.is_some() {
            after.reboot = Reboot::No;
        }
        verification.timed(since);
        verification.events = status::verdict_events(&verification, 0);
        after.verification = Some(verification);
        let at = status::amend(&root, &record, &after)?;
        crate::info!(
            "verified: torcx applied {what} as {from} records; kept as the known-good profile {}; recorded in {at}",
            root.show(&known_path)
        );
        return Ok(());
    }

    let first = verification.first_mismatch();
    if record.state != State::Done {
        let why = "nothing to return to: the node needs an operator";
        tell(v, &root, &node, &expected, Some(&format!("{first}; {why}")));
        return Err(Error::failed(format!(
            "the node does not run its known-good {what}: {first}; {why}"
        )));
    }
    // Once per boot, and never to what just failed.
    let returned_here = record
        .verification
        .as_ref()
        .and_then(|p| p.returned.as_ref())
        .is_some_and(|r| r.boot_id == boot_id);
    let back = if !profile_failed {
        "nothing to return to: the kubelet comes from kubelet.env (KUBELET_IMAGE_TAG), which no torcx profile changes; the node needs an operator".to_string()
    } else if returned_here {
        "not returned again: this boot already selected the known-good profile once; the node needs an operator".to_string()
    } else if expected.profile == KNOWN_GOOD {
        "nothing to return to: the known-good profile itself did not apply".to_string()
    } else if let (Some(v), Some(bytes)) = (
        known_version.clone(),
        root.read(&known_path, crate::node::root::CONFIG_CAP)?,
    ) {
        root.write_atomic(
            &layout.next_profile(),
            format!("{KNOWN_GOOD}\n").as_bytes(),
            0o644,
        )?;
        let reason = format!(
            "the boot check selected the known-good profile {KNOWN_GOOD} (docker {v}) as next-profile: torcx applies it at the next boot, which nodestrap leaves to the operator or the update agent"
        );
        crate::warn!("reboot needed: {reason}");
        after.reboot = Reboot::Needed {
            reason: reason.clone(),
        };
        verification.returned = Some(Returned {
            to: vec![Chosen {
                name: RUNTIME.into(),
                version: v.clone(),
                image: known_path.clone(),
                digest: format!(
                    "sha256-{}",
                    crate::crypto::digest::hex(&crate::crypto::digest::sha256(&bytes))
                ),
            }],
            boot_id: boot_id.clone(),
            result: NEXT_BOOT.into(),
        });
        format!(
            "{} now selects the known-good profile {KNOWN_GOOD} (docker {v}) for the next boot; the reboot is recorded, not taken",
            root.show(&layout.next_profile())
        )
    } else {
        format!(
            "nothing to return to: the node keeps no known-good profile ({})",
            root.show(&known_path)
        )
    };
    verification.timed(since);
    after.phase = Phase::Done;
    verification.events = status::verdict_events(&verification, 1);
    after.verification = Some(verification);
    let at = status::amend(&root, &record, &after)?;
    // Told once the record holds the verdict (as the sysext check does).
    if let Some(told) = tell(
        v,
        &root,
        &node,
        &expected,
        Some(&format!("{first}; {back}")),
    ) {
        let mut told_after = after.clone();
        if let Some(t) = told_after.verification.as_mut() {
            t.reported = Some(told);
        }
        if let Err(e) = status::amend(&root, &record, &told_after) {
            crate::warn!("what the Node was told is not recorded: {e}");
        }
    }
    Err(Error::failed(format!(
        "the node does not run what {from} chose: {first}; {back} (recorded in {at})"
    )))
}

/// What the check tells the cluster on its Node, as the sysext check does (docs/verify.md, "On
/// the Node"): `NodestrapVerified` True with the profile and docker that run, the labels of the
/// kubelet and docker versions and `nodestrap.io/trust=torcx`; or False with the first failed
/// check (`mismatch`). Only when the Node's name is known; what was told, or why not.
fn tell(
    v: &Verify,
    root: &Root,
    node: &str,
    e: &Expected,
    mismatch: Option<&str>,
) -> Option<String> {
    if node.is_empty() {
        return None;
    }
    let runs = format!("profile {} with docker {}", e.profile, e.version);
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
    let line = node_report::send(root, &v.kubeconfig, node, &report);
    crate::info!("reported {line}");
    Some(line)
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
