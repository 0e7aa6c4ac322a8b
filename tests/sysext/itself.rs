//! `--self-update`: nodestrap moves itself (/opt/bin/nodestrap, where Ignition installs it on a
//! stock node) to the newest release the signed source lists in its `nodestrap` folder. The
//! releases are real nodestrap builds: the binary under test and a later release of the same
//! code (tests/run.sh builds it with another version, `NODESTRAP_NEXT_BIN`), so the proof that
//! a release runs and is the version its name says is made by the release itself.

use super::*;

const INSTALLED: &str = "/opt/bin/nodestrap";

/// What `path --version` says, without the program's name: `0.1.0`.
fn version(path: &str) -> String {
    let out = Command::new(path).arg("--version").output().unwrap();
    let s = String::from_utf8(out.stdout).unwrap();
    s.trim().strip_prefix("nodestrap ").unwrap().to_string()
}

/// A release: its bytes and the version it reports.
type Release = (Vec<u8>, String);

/// The world's node with the binary under test installed as Ignition installs it, and the
/// run asked to update it; the two releases' bytes and versions.
fn installed_world() -> (World, Release, Release) {
    let mut w = World::new();
    let now = (std::fs::read(bin()).unwrap(), version(&bin()));
    let next_bin = support::vars::next_bin().display().to_string();
    let next = (std::fs::read(&next_bin).unwrap(), version(&next_bin));
    assert!(
        next.1 != now.1,
        "{next_bin} is the same release as {}",
        bin()
    );
    std::fs::create_dir_all(w.path("/opt/bin")).unwrap();
    std::fs::write(w.path(INSTALLED), &now.0).unwrap();
    std::fs::set_permissions(
        w.path(INSTALLED),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    w.extra.push("--self-update=true".into());
    (w, now, next)
}

fn installed(w: &World) -> Vec<u8> {
    std::fs::read(w.path(INSTALLED)).unwrap()
}

/// /opt/bin holds the installed copy alone: no temp file, no second name.
fn only_installed(w: &World) {
    let names: Vec<String> = std::fs::read_dir(w.path("/opt/bin"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["nodestrap"]);
}

#[test]
fn nodestrap_moves_itself_to_the_newest_signed_release_proven_to_run() {
    let (w, now, next) = installed_world();
    w.publish(
        "nodestrap",
        &[
            (format!("nodestrap-v{}-x86-64", now.1), now.0.clone()),
            (format!("nodestrap-v{}-x86-64", next.1), next.0.clone()),
            (
                format!("nodestrap-v{}-arm64", next.1),
                b"another architecture".to_vec(),
            ),
        ],
        "",
    );
    let r = w.run();
    r.assert_ok();
    assert!(installed(&w) == next.0, "{}", r.stderr);
    assert_eq!(version(&w.path(INSTALLED).display().to_string()), next.1);
    let mode = std::fs::metadata(w.path(INSTALLED)).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o755
    );
    only_installed(&w);
    assert!(
        r.stderr
            .contains(&format!("nodestrap v{} installed over v{}", next.1, now.1)),
        "{}",
        r.stderr
    );
    // In the record, and the floor: nodestrap only goes forward, as an extension does.
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "nodestrap"
                && d["value"] == format!("v{}", next.1)
                && d["source"]
                    .as_str()
                    .unwrap()
                    .starts_with("installed at /opt/bin/nodestrap")),
        "{rec:#}"
    );
    let known = w.read("/var/lib/nodestrap/known-good.json").unwrap();
    assert!(known.contains("\"nodestrap\""), "{known}");
    // The next run is the new release's: nothing newer, nothing changes.
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "nodestrap v{} installed: the newest release",
            next.1
        )),
        "{}",
        r.stderr
    );
    assert!(installed(&w) == next.0);
    // A source that went back below the floor is refused, and the copy stays.
    w.publish(
        "nodestrap",
        &[(format!("nodestrap-v{}-x86-64", now.1), now.0.clone())],
        "",
    );
    w.run().assert_fails(
        1,
        "every version the source offers is below the version floor",
    );
    assert!(installed(&w) == next.0);
}

/// Each way a release can be other than its signed list says, and a run that fails after the
/// release took the name: the installed copy stays (or comes back), nothing is left in
/// /opt/bin, no kubelet.env.
#[test]
fn a_release_that_is_not_what_its_list_says_leaves_the_installed_copy() {
    let elf_junk = {
        let mut b = b"\x7fELF\x02\x01\x01".to_vec();
        b.resize(4096, 0);
        b
    };
    for (case, want) in [
        ("other bytes", "hash mismatch: computed sha256-"),
        (
            "another version",
            "not nodestrap 9.9.9: the list names another release",
        ),
        ("does not run", "it does not run on this node"),
        ("a later failure", "hash mismatch: computed sha256-"),
    ] {
        let (w, now, next) = installed_world();
        let file = match case {
            "another version" => "nodestrap-v9.9.9-x86-64".to_string(),
            _ => format!("nodestrap-v{}-x86-64", next.1),
        };
        let body = if case == "does not run" {
            elf_junk.clone()
        } else {
            next.0.clone()
        };
        w.publish("nodestrap", &[(file.clone(), body)], "");
        match case {
            "other bytes" => w
                .files
                .set(&format!("/ext/nodestrap/{file}"), Reply::ok(now.0.clone())),
            // The kubernetes image, fetched after nodestrap's release took the name.
            "a later failure" => w.files.set(
                "/ext/kubernetes/kubernetes-v1.32.3-x86-64.raw",
                Reply::ok(b"not the listed image".to_vec()),
            ),
            _ => {}
        }
        let r = w.run();
        assert!(
            r.code == 1 && r.stderr.contains(want),
            "{case}: {}",
            r.stderr
        );
        assert!(installed(&w) == now.0, "{case}: the installed copy changed");
        only_installed(&w);
        assert!(w.read("/etc/kubernetes/kubelet.env").is_none(), "{case}");
    }
}

/// Refused at the start (exit 2), nothing changed: no copy where Ignition installs it (the node
/// image carries nodestrap: its vendor updates it), and a source whose list is not verified.
#[test]
fn self_update_needs_the_installed_copy_and_a_verified_list() {
    let mut w = World::new();
    w.extra.push("--self-update=true".into());
    w.run().assert_fails(2, "/opt/bin/nodestrap does not exist: nodestrap updates only the copy Ignition installs there");
    w.assert_nothing_staged();
    w.extra.push("--no-verify-signatures=true".into());
    w.run()
        .assert_fails(2, "--self-update needs the signed list");
    w.assert_nothing_staged();
}

/// A self-update that fails (EIO, ENOSPC) at each mutating call of the run, or is killed at
/// each rename and fsync: every path is as it was or as a clean run leaves it (nodestrap itself
/// included), and after a kill the next run finishes the job.
#[test]
fn fault_matrix_of_a_self_update() {
    use support::faults::*;
    if !native() {
        return;
    }
    let (w, _, next) = installed_world();
    w.publish(
        "nodestrap",
        &[(format!("nodestrap-v{}-x86-64", next.1), next.0.clone())],
        "",
    );
    // As on a real node: the records' folder's parents exist.
    std::fs::create_dir_all(w.path("/var/lib")).unwrap();
    let pristine = w.work.join("pristine");
    copy_tree(&w.root, &pristine);
    let skip = ["var/lib/nodestrap"];
    let before = snapshot(&w.root, &skip);
    let cmd = || command(&w.args_for(&w.root.display().to_string()), None);
    let (calls, run) = trace(&cmd(), &w.work.join("trace"));
    run.assert_ok();
    assert!(installed(&w) == next.0);
    let after = snapshot(&w.root, &skip);
    assert!(calls.len() > 20, "{calls:#?}");
    matrix(&w.root, &pristine, &w.work, &cmd, &calls, &before, &after);
}
