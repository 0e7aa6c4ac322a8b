//! The promises every run keeps: the done marker never outlives a failed run, every network
//! attempt has a deadline and a floor on progress, every parser has a budget, and the fault
//! matrix (a kill or a failure at every mutating system call converges).

use super::*;

// ---------------------------------------------------------------------------------------------
// The done marker never outlives a failed run

/// The world's run under strace, whose fault injection makes the real `fsync` fail with EIO
/// the way a dying disk does: the first fsync of `path` (or of anything, without a path).
pub(crate) fn run_with_fsync_failure(w: &World, path: Option<&Path>) -> Run {
    let inner = command(&w.args(), None);
    let mut c = std::process::Command::new("strace");
    c.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync"])
        .args(["-e", "inject=fsync:error=EIO:when=1"]);
    if let Some(p) = path {
        c.arg("-P").arg(p);
    }
    c.arg("--").arg(inner.get_program()).args(inner.get_args());
    c.env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    Run::from(c.output().expect("strace (CI installs it in .ci/setup)"))
}

pub(crate) fn kubelet_env_dir_listing(w: &World) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(w.path("/etc/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_failed_directory_fsync_takes_the_done_marker_back() {
    let w = World::new();
    let r = run_with_fsync_failure(&w, Some(&w.path("/etc/kubernetes")));
    r.assert_fails(1, "removed");
    assert!(
        r.stderr
            .contains("kubelet.env again so bootstrap runs again")
            && r.stderr.contains("(os error 5)"),
        "{}",
        r.stderr
    );
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
    assert_eq!(kubelet_env_dir_listing(&w), vec!["installer"]);
    // The next run, on a healthy disk, completes.
    w.run().assert_ok();
    assert!(w.path("/etc/kubernetes/kubelet.env").exists());
}

#[test]
fn a_failed_data_fsync_names_the_final_path() {
    let mut w = World::new();
    w.extra.extend([
        "--torcx-skip-setup".into(),
        "--force-kube-version=v1.11.0".into(),
    ]);
    let r = run_with_fsync_failure(&w, None);
    let want = format!(
        "(temp file for {})",
        w.path("/etc/kubernetes/kubelet.env").display()
    );
    r.assert_fails(1, &want);
    assert_eq!(kubelet_env_dir_listing(&w), vec!["installer"]);
}

#[test]
fn a_closed_stdout_takes_the_done_marker_back() {
    use std::io::BufRead as _;
    let w = World::new();
    // The manifest trickles in over about a second, so the plan line is read, and the pipe
    // closed, well before the summary line is written.
    let p = World::manifest_path(CUR);
    let m = w.manifest(CUR, &["17.03", "17.06"]);
    w.files.set(
        &p,
        Reply::trickled(m.into_bytes(), std::time::Duration::from_millis(3)),
    );
    let mut child = command(&w.args(), None)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("nodestrap: k8s="), "{first}");
    // Close the reading end before the summary line is written: that write fails (EPIPE).
    drop(out);
    let r = Run::from(child.wait_with_output().unwrap());
    r.assert_fails(1, "writing to standard output");
    assert!(
        r.stderr.contains("again so bootstrap runs again"),
        "{}",
        r.stderr
    );
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
}

#[test]
fn a_stdout_closed_from_the_start_fails_at_the_plan_line_and_writes_nothing() {
    let w = World::new();
    let mut child = command(&w.args(), None)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let r = Run::from(child.wait_with_output().unwrap());
    r.assert_fails(1, "writing to standard output");
    w.assert_nothing_written();
}

// ---------------------------------------------------------------------------------------------
// Every network attempt has a deadline and a floor on progress

#[test]
fn a_trickling_server_is_cut_off_by_the_rate_floor() {
    let mut w = World::new();
    w.files.set(
        "/pkgs/docker-17.03.tgz",
        Reply::trickled(image("17.03"), std::time::Duration::from_millis(20)),
    );
    w.extra.extend([
        "--fetch-attempts=2".into(),
        "--fetch-min-rate=2000".into(),
        "--fetch-min-rate-window=2".into(),
    ]);
    let start = std::time::Instant::now();
    let r = w.run();
    let took = start.elapsed();
    r.assert_fails(1, "slower than 2000 bytes/s");
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 2, "{}", r.stderr);
    // Two windows of 2 s and a short backoff, not the 300 KiB at 50 bytes/s (an hour and a half).
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    w.assert_nothing_written();
}

#[test]
fn an_attempt_ends_at_its_deadline_even_above_the_rate_floor() {
    let mut w = World::new();
    // 5 KB/s passes a floor of 1 KB/s, but 300 KiB would take a minute.
    w.files.set(
        "/pkgs/docker-17.03.tgz",
        Reply::trickled(image("17.03"), std::time::Duration::from_micros(200)),
    );
    w.extra.extend([
        "--fetch-attempts=2".into(),
        "--fetch-timeout=3".into(),
        "--fetch-min-rate-window=1".into(),
    ]);
    let start = std::time::Instant::now();
    let r = w.run();
    let took = start.elapsed();
    r.assert_fails(1, "/pkgs/docker-17.03.tgz");
    assert!(r.stderr.contains("deadline of 3 s passed"), "{}", r.stderr);
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 2);
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    w.assert_nothing_written();
}

#[test]
fn fetch_limits_are_checked_as_options() {
    let w = World::new();
    for (flag, want) in [
        ("--fetch-timeout=0", "--fetch-timeout 0: at least 1"),
        (
            "--fetch-min-rate-window=0",
            "--fetch-min-rate-window 0: at least 1",
        ),
        (
            "--fetch-timeout=100000",
            "--fetch-timeout 100000: at most 86400",
        ),
    ] {
        let mut a = w.args();
        a.push(flag.into());
        nodestrap(&a, None, &[]).assert_fails(2, want);
    }
}

// ---------------------------------------------------------------------------------------------
// Every parser has a budget

/// Ten levels of ten aliases each: 10^10 nodes once expanded, in 600 bytes.
pub(crate) fn billion_laughs() -> String {
    let mut doc = String::from("kind: VersionManifestV1\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        doc.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    doc.push_str("versions: {k8s: {'1.9': {docker: *a9}}}\n");
    doc
}

#[test]
fn a_hostile_mappings_configmap_is_refused_by_its_budget() {
    let w = World::new();
    let (_api, _ca) = w.with_api("v1.9.6+coreos.0", Some(&billion_laughs()));
    let r = w.run();
    r.assert_fails(
        1,
        "ConfigMap tectonic-system/tectonic-torcx-runtime-mappings key runtime-mappings.yaml: more than 100000 YAML nodes once aliases are expanded",
    );
    w.assert_nothing_written();
}

#[test]
fn a_hostile_mappings_file_is_refused_naming_it() {
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        &billion_laughs(),
    );
    let name = w
        .path("/etc/kubernetes/installer/runtime-mappings.yaml")
        .display()
        .to_string();
    w.run()
        .assert_fails(1, &format!("{name}: more than 100000 YAML nodes"));
    let deep: String = (0..100)
        .map(|i| format!("{}a:\n", "  ".repeat(i)))
        .collect();
    w.write("/etc/kubernetes/installer/runtime-mappings.yaml", &deep);
    w.run()
        .assert_fails(1, &format!("{name}: nesting deeper than 64 levels"));
    w.assert_nothing_written();
}

#[test]
fn no_suitable_version_names_both_sides() {
    let w = World::new();
    let only = format!(
        r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","versions":[{{"version":"17.06","hash":"{}","locations":[{{"url":"{}"}}]}}]}}]}}}}"#,
        sha512(&image("17.06")),
        w.files.url("/pkgs/docker-17.06.tgz")
    );
    w.publish(CUR, &only);
    let mappings = w
        .path("/etc/kubernetes/installer/runtime-mappings.yaml")
        .display()
        .to_string();
    let manifest = w.files.url(&World::manifest_path(CUR));
    w.run().assert_fails(
        1,
        &format!("no suitable docker version for OS {CUR}: {mappings} maps to 17.03, 1.12; manifest {manifest} offers 17.06"),
    );
    w.assert_nothing_written();
}

#[test]
fn the_last_log_line_gives_the_runs_duration_and_outcome() {
    let w = World::new();
    let r = w.run();
    r.assert_ok();
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("info: run done after ") && last.ends_with(" s (exit 0)"),
        "{last}"
    );
    let mut w = w;
    w.extra.push("--version-fallback=never".into());
    let r = w.run();
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("info: run failed after ") && last.ends_with(" s (exit 1)"),
        "{last}"
    );
}

#[test]
fn config_drop_ins_merge_in_systemd_order() {
    let w = World::new();
    w.write(CONF, "torcx-profile=fromfile\n");
    // /etc hides /usr/lib's file of the same name; among names, the later one wins; a link
    // to /dev/null masks; only *.conf counts.
    w.write(
        "/usr/lib/nodestrap/bootstrap.conf.d/10-vendor.conf",
        "torcx-profile=vendor\n",
    );
    w.write(
        "/etc/nodestrap/bootstrap.conf.d/10-vendor.conf",
        "torcx-profile=admin\n",
    );
    w.write(
        "/usr/lib/nodestrap/bootstrap.conf.d/30-masked.conf",
        "torcx-profile=masked\n",
    );
    std::os::unix::fs::symlink(
        "/dev/null",
        w.path("/etc/nodestrap/bootstrap.conf.d/30-masked.conf"),
    )
    .unwrap();
    w.write(
        "/run/nodestrap/bootstrap.conf.d/20-run.conf",
        "torcx-profile=runtime\n",
    );
    w.write(
        "/run/nodestrap/bootstrap.conf.d/40-notes.txt",
        "torcx-profile=ignored\n",
    );
    let r = w.run();
    r.assert_ok();
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "runtime\n");
    let shown = |p: &str| w.path(p).display().to_string();
    for line in [
        format!(
            "settings from {}: torcx-profile",
            shown("/etc/nodestrap/bootstrap.conf.d/10-vendor.conf")
        ),
        format!(
            "settings from {}: torcx-profile",
            shown("/run/nodestrap/bootstrap.conf.d/20-run.conf")
        ),
        format!(
            "settings from {}: masked",
            shown("/etc/nodestrap/bootstrap.conf.d/30-masked.conf")
        ),
    ] {
        assert!(r.stderr.contains(&line), "{line:?} not in\n{}", r.stderr);
    }
    assert!(!r.stderr.contains("usr/lib/nodestrap"), "{}", r.stderr);
    // A bad line in a drop-in is refused like one in the file, naming the drop-in and line.
    w.write(
        "/run/nodestrap/bootstrap.conf.d/20-run.conf",
        "\nfetch-attempts=lots\n",
    );
    let r = w.run();
    r.assert_fails(
        2,
        &format!(
            "{}:2: fetch-attempts: ",
            shown("/run/nodestrap/bootstrap.conf.d/20-run.conf")
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// The fault matrix

/// A torcx staging (a corrupt image at the final name replaced, a user profile naming another
/// image updated, next-profile and kubelet.env written) run once per mutating system call from
/// its first rename on, with EIO and with ENOSPC injected there, and once per rename and fsync
/// with SIGKILL on entry: a failed run leaves the node as it was, a run that succeeds as a clean
/// run leaves it, a killed run leaves every file as it was or as the run meant it, and the next
/// run finishes the job (support/faults.rs).
#[test]
fn fault_matrix_of_a_torcx_staging() {
    use support::faults::*;
    if !native() {
        return;
    }
    let w = World::new();
    w.write(
        "/etc/torcx/profiles/tectonic.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"other","reference":"1"},{"name":"docker","reference":"1.12"}]}}"#,
    );
    w.write("/etc/torcx/next-profile", "tectonic\n");
    w.write(
        &format!("/var/lib/torcx/store/{CUR}/docker:17.03.torcx.tgz"),
        "a download that was cut short",
    );
    let work = w.root.with_extension("faults");
    std::fs::create_dir_all(&work).unwrap();
    let pristine = work.join("pristine");
    copy_tree(&w.root, &pristine);
    let skip = ["var/lib/nodestrap"];
    let before = snapshot(&w.root, &skip);
    let cmd = || {
        let mut c = command(&w.args(), None);
        c.env("NODESTRAP_RUN_DIR", &w.run_dir);
        c
    };
    let (calls, run) = trace(&cmd(), &work.join("trace"));
    run.assert_ok();
    let after = snapshot(&w.root, &skip);
    let profile: serde_json::Value =
        serde_json::from_str(&w.read("/etc/torcx/profiles/tectonic.json").unwrap()).unwrap();
    assert_eq!(
        profile["value"]["images"],
        serde_json::json!([{"name":"other","reference":"1"},{"name":"docker","reference":"17.03"}])
    );
    assert_eq!(
        std::fs::read(w.store_file(CUR, "17.03")).unwrap(),
        image("17.03")
    );
    assert!(calls.len() > 15, "{calls:#?}");
    matrix(&w.root, &pristine, &work, &cmd, &calls, &before, &after);
}
