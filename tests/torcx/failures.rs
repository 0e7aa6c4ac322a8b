//! Failures of `nodestrap bootstrap` (torcx): exit 1 or 2, a message naming the input, nothing
//! at any final path.

use super::*;

// ---- failures: exit 1 or 2, a message naming the input, nothing at any final path ----------

#[test]
fn bad_signature_is_refused() {
    let w = World::new();
    let p = World::manifest_path(CUR);
    // Signed by the right key, but over other bytes.
    w.files.set(
        &format!("{p}.asc"),
        Reply::ok(w.signer.sign(b"something else")),
    );
    w.run().assert_fails(
        1,
        &format!("{}: signature check against keyring", w.files.url(&p)),
    );
    w.assert_nothing_written();
}

#[test]
fn unknown_key_is_refused() {
    let w = World::new();
    let p = World::manifest_path(CUR);
    let stranger = Signer_::new("stranger <x@nodestrap.invalid>");
    let m = w.manifest(CUR, &["17.03"]);
    w.files.set(&p, Reply::ok(m.clone()));
    w.files
        .set(&format!("{p}.asc"), Reply::ok(stranger.sign(m.as_bytes())));
    w.run().assert_fails(
        1,
        &format!("{}: signature check against keyring", w.files.url(&p)),
    );
    w.run().assert_fails(1, "Missing key");
    w.assert_nothing_written();
}

#[test]
fn unsigned_manifest_is_refused() {
    let w = World::new();
    let p = World::manifest_path(CUR);
    w.files.set(&format!("{p}.asc"), Reply::status(404));
    w.run()
        .assert_fails(1, &format!("GET {}.asc: HTTP 404", w.files.url(&p)));
    w.assert_nothing_written();
}

#[test]
fn no_verify_signatures_skips_the_asc() {
    let mut w = World::new();
    w.extra.push("--no-verify-signatures".into());
    w.keyring = PathBuf::from("/nonexistent/keyring.asc");
    let r = w.run();
    r.assert_ok();
    assert!(r.stderr.contains("NOT be authenticated"), "{}", r.stderr);
    assert_eq!(
        w.files.hits(&format!("{}.asc", World::manifest_path(CUR))),
        0
    );
}

#[test]
fn hash_mismatch_leaves_no_file() {
    let w = World::new();
    w.files
        .set("/pkgs/docker-17.03.tgz", Reply::ok(image("evil")));
    w.run().assert_fails(
        1,
        &format!(
            "GET {}: hash mismatch",
            w.files.url("/pkgs/docker-17.03.tgz")
        ),
    );
    w.assert_nothing_written();
    // A wrong hash is not a transport error: no retry.
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 1);
}

#[test]
fn truncated_body_is_retried_then_fails_cleanly() {
    let w = World::new();
    w.files.set(
        "/pkgs/docker-17.03.tgz",
        Reply::truncated(image("17.03"), 100_000),
    );
    w.run().assert_fails(1, "/pkgs/docker-17.03.tgz");
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 3);
    w.assert_nothing_written();
    // One broken transfer, then a good one: it converges.
    w.files.queue(
        "/pkgs/docker-17.03.tgz",
        Reply::truncated(image("17.03"), 1000),
    );
    w.files
        .set("/pkgs/docker-17.03.tgz", Reply::ok(image("17.03")));
    w.run().assert_ok();
    assert_eq!(
        w.store_listing(),
        vec![format!("{CUR}/docker:17.03.torcx.tgz")]
    );
}

/// The `Range` requests of `path` the server saw, in order (`-` for none).
pub(crate) fn ranges(w: &World, path: &str) -> Vec<String> {
    w.files
        .requests("GET", path)
        .iter()
        .map(|s| s.header("range").unwrap_or("-").to_string())
        .collect()
}

#[test]
fn a_broken_download_resumes_where_it_broke_and_a_server_without_range_starts_over() {
    let p = "/pkgs/docker-17.03.tgz";
    let want = image("17.03");
    // Cut 280,000 bytes in: one whole 256 KiB chunk and part of the next are in the temp file.
    let w = World::new();
    w.files
        .queue(p, Reply::truncated(want.clone(), 280_000).ranged());
    w.files.set(p, Reply::ok(want.clone()).ranged());
    let r = w.run();
    r.assert_ok();
    assert_eq!(ranges(&w, p), ["-", "bytes=280000-"]);
    assert!(
        r.stderr
            .contains(&format!("GET {}: resuming at byte 280000", w.files.url(p))),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(w.store_file(CUR, "17.03")).unwrap(), want);

    // A server that ignores Range sends the whole body again: the kept bytes are dropped.
    let w = World::new();
    w.files.queue(p, Reply::truncated(want.clone(), 280_000));
    let r = w.run();
    r.assert_ok();
    assert_eq!(ranges(&w, p), ["-", "bytes=280000-"]);
    assert!(
        r.stderr
            .contains("HTTP 200 with the whole body, not the bytes from 280000 on; starting over"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(w.store_file(CUR, "17.03")).unwrap(), want);

    // The file changed between attempts: the pieces hash to neither, so the whole body is
    // fetched once more, and only then judged.
    let w = World::new();
    w.files
        .queue(p, Reply::truncated(image("17.03-old"), 280_000).ranged());
    w.files.set(p, Reply::ok(want.clone()).ranged());
    let r = w.run();
    r.assert_ok();
    assert_eq!(ranges(&w, p), ["-", "bytes=280000-", "-"]);
    assert!(
        r.stderr
            .contains("put together from 2 attempts hash to sha512-"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(w.store_file(CUR, "17.03")).unwrap(), want);

    // A range that starts elsewhere is not appended: the next attempt starts over.
    let w = World::new();
    w.files.queue(p, Reply::truncated(want.clone(), 280_000));
    let mut wrong = Reply::ok(want[1000..].to_vec());
    wrong.status = 206;
    wrong.headers.push((
        "Content-Range",
        format!("bytes 1000-{}/{}", want.len() - 1, want.len()),
    ));
    w.files.queue(p, wrong);
    let r = w.run();
    r.assert_ok();
    assert_eq!(ranges(&w, p), ["-", "bytes=280000-", "-"]);
    assert!(
        r.stderr
            .contains("asked for the bytes from 280000 on, got Content-Range \"bytes 1000-"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(w.store_file(CUR, "17.03")).unwrap(), want);

    // Broken on every attempt: the run fails, and the temp file with its kept bytes goes too.
    let w = World::new();
    w.files
        .set(p, Reply::truncated(want.clone(), 100_000).ranged());
    w.run().assert_fails(1, p);
    assert_eq!(ranges(&w, p), ["-", "bytes=100000-", "bytes=200000-"]);
    w.assert_nothing_written();
}

#[test]
fn server_errors_are_retried_until_success() {
    let w = World::new();
    let p = World::manifest_path(CUR);
    w.files.queue(&p, Reply::status(500));
    w.files.queue(&p, Reply::status(503));
    let r = w.run();
    r.assert_ok();
    assert_eq!(w.files.hits(&p), 3);
    assert!(
        r.stderr.contains("attempt 1 failed") && r.stderr.contains("HTTP 500"),
        "{}",
        r.stderr
    );
}

#[test]
fn not_found_is_final() {
    let w = World::new();
    w.files.set("/pkgs/docker-17.03.tgz", Reply::status(404));
    w.run().assert_fails(
        1,
        &format!("GET {}: HTTP 404", w.files.url("/pkgs/docker-17.03.tgz")),
    );
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 1);
    w.assert_nothing_written();
}

#[test]
fn untrusted_server_certificate_is_refused() {
    let mut w = World::new();
    let other = Ca::new("not the node's CA");
    w.ca_file = w.root.with_extension("other-ca.pem");
    std::fs::write(&w.ca_file, &other.pem).unwrap();
    w.run().assert_fails(1, "invalid peer certificate");
    w.assert_nothing_written();
    // Not retried: a certificate the anchors reject stays rejected.
    assert_eq!(
        w.files
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[test]
fn hostile_names_are_refused() {
    // In the signed manifest.
    let w = World::new();
    let m = w.manifest(CUR, &["17.03"]).replace(
        "\"version\":\"17.03\"",
        "\"version\":\"../../../../etc/cron.d/x\"",
    );
    w.publish(CUR, &m);
    w.run().assert_fails(
        1,
        "version \"../../../../etc/cron.d/x\": not a plain version",
    );
    w.assert_nothing_written();
    // In the runtime mappings.
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s:\n    1.9:\n      docker: [ \"../../x\" ]\n",
    );
    w.run().assert_fails(
        1,
        "runtime-mappings.yaml: docker version \"../../x\" is not a plain version",
    );
    w.assert_nothing_written();
    // As the profile name.
    let mut w = World::new();
    w.extra.push("--torcx-profile=../../etc/passwd".into());
    w.run().assert_fails(2, "--torcx-profile");
    w.assert_nothing_written();
}

#[test]
fn symlinks_pointing_outside_the_root_stay_inside() {
    let w = World::new();
    let outside = unique_dir("outside");
    std::fs::write(
        outside.join("kubelet.env"),
        "KUBELET_IMAGE_TAG=v9.9.9_outside\n",
    )
    .unwrap();
    // The store is an absolute symlink out of the root; the installer env a relative one.
    std::fs::create_dir_all(w.path("/var/lib")).unwrap();
    std::os::unix::fs::symlink(&outside, w.path("/var/lib/torcx")).unwrap();
    std::fs::remove_file(w.path("/etc/kubernetes/installer/kubelet.env")).unwrap();
    let rel = format!("../../../../../../../..{}/kubelet.env", outside.display());
    std::os::unix::fs::symlink(&rel, w.path("/etc/kubernetes/installer/kubelet.env")).unwrap();
    let r = w.run();
    // The env file resolves inside the root, where it does not exist.
    r.assert_fails(1, "unable to determine the cluster version");
    assert!(!r.stderr.contains("v9.9.9"), "{}", r.stderr);
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written outside the root"
    );
    // With a version forced, staging into the escaping store fails and writes nothing outside.
    let mut w = w;
    w.extra.push("--force-kube-version=v1.9.6".into());
    w.run().assert_fails(1, "/var/lib/torcx");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written outside the root"
    );
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
}

/// torcx names the store it searches by VERSION_ID as written (quotes kept): a quoted one is
/// refused with the directory torcx would search, and nothing is staged. The consumer's rule is
/// proven by qemu/check-torcx-generator (test_a_quoted_version_id_is_taken_with_its_quotes).
#[test]
fn a_quoted_version_id_is_refused_naming_the_store_torcx_would_search() {
    for (line, raw) in [
        (format!("VERSION_ID=\"{CUR}\""), format!("\"{CUR}\"")),
        (format!("VERSION_ID='{CUR}'"), format!("'{CUR}'")),
    ] {
        let w = World::new();
        w.write(
            "/usr/lib/os-release",
            &format!("ID=flatcar\n{line}\nCOREOS_BOARD=amd64-usr\n"),
        );
        w.run().assert_fails(
            1,
            &format!("would search the store /var/lib/torcx/store/{raw}, not .../{CUR}"),
        );
        w.assert_nothing_written();
    }
}

#[test]
fn malformed_os_release() {
    let w = World::new();
    w.write(
        "/usr/lib/os-release",
        "ID=flatcar\nthis is not a key value line\nVERSION_ID=1520.5.0\n",
    );
    w.run()
        .assert_fails(1, "/usr/lib/os-release:2: expected KEY=VALUE");
    w.assert_nothing_written();
    let w = World::new();
    w.write("/usr/lib/os-release", "ID=flatcar\n");
    w.run()
        .assert_fails(1, "/usr/lib/os-release: no VERSION_ID");
    w.assert_nothing_written();
}

#[test]
fn malformed_env() {
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=\"v1.9.6_coreos.0\n",
    );
    w.run().assert_fails(
        1,
        "/etc/kubernetes/installer/kubelet.env:1: unbalanced quotes",
    );
    w.assert_nothing_written();
}

#[test]
fn malformed_yaml() {
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions: [\n",
    );
    w.run()
        .assert_fails(1, "runtime-mappings.yaml: invalid YAML");
    w.assert_nothing_written();
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV2\nversions: {}\n",
    );
    w.run().assert_fails(1, "kind is \"VersionManifestV2\"");
    w.assert_nothing_written();
}

#[test]
fn malformed_json_manifest() {
    let w = World::new();
    w.publish(CUR, "{\"kind\":\"torcx-package-list-v0\",\"value\":");
    w.run().assert_fails(
        1,
        &format!(
            "{}: invalid package list JSON",
            w.files.url(&World::manifest_path(CUR))
        ),
    );
    w.assert_nothing_written();
}

#[test]
fn malformed_kubeconfig() {
    let w = World::new();
    w.write("/etc/kubernetes/kubeconfig", "clusters: [\n");
    w.run()
        .assert_fails(1, "/etc/kubernetes/kubeconfig: invalid YAML");
    w.assert_nothing_written();
    let w = World::new();
    w.write("/etc/kubernetes/kubeconfig", "clusters:\n- name: a\n  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: x\n  context: {cluster: a}\n- name: y\n  context: {cluster: a}\n");
    w.run().assert_fails(
        1,
        "kubeconfig: no current-context, so kubectl would use no context",
    );
    w.assert_nothing_written();
}

#[test]
fn usage_errors_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--no-such-flag"], "Unrecognized argument: --no-such-flag"),
        (&["--reboot=sometimes"], "expected true or false"),
        (&["--verbose=loud"], "--verbose \"loud\""),
        (
            &["--torcx-manifest-url=https://x/{{.Channel}}/m.json"],
            "unknown placeholder",
        ),
        (
            &["--kubelet-env-path=kubelet.env"],
            "--kubelet-env-path \"kubelet.env\": expected an absolute file path",
        ),
        (
            &["--force-kube-version=garbage"],
            "--force-kube-version \"garbage\"",
        ),
        (
            &["--update-timeout=18446744073709551615"],
            "--update-timeout 18446744073709551615: at most",
        ),
        (
            &["--api-retry-delay=99999999"],
            "--api-retry-delay 99999999: at most",
        ),
        (
            &["--keyring=/nonexistent/keyring.asc"],
            "--keyring /nonexistent/keyring.asc",
        ),
        (
            &["--ca-file=/nonexistent/ca.pem"],
            "--ca-file /nonexistent/ca.pem",
        ),
    ];
    for (extra, needle) in cases {
        let mut w = World::new();
        w.extra.extend(extra.iter().map(|x| x.to_string()));
        let r = w.run();
        assert_eq!(r.code, 2, "{extra:?}: expected exit 2\n{}", r.stderr);
        assert!(
            r.stderr.contains(needle),
            "{extra:?}: {needle:?} not in\n{}",
            r.stderr
        );
        w.assert_nothing_written();
        assert_eq!(
            w.files.seen().len(),
            0,
            "{extra:?}: no request before the options are checked"
        );
    }
    // A keyring that holds no OpenPGP certificate.
    let mut w = World::new();
    w.keyring = w.ca_file.clone();
    w.run().assert_fails(2, "keyring");
    w.assert_nothing_written();
}

#[test]
fn torcx_skip_setup_still_writes_kubelet_env() {
    let mut w = World::new();
    w.extra.extend([
        "--torcx-skip-setup".into(),
        "--force-kube-version=v1.11.0+coreos.0".into(),
    ]);
    w.keyring = PathBuf::from("/nonexistent");
    w.run().assert_ok();
    assert_eq!(
        w.read("/etc/kubernetes/kubelet.env").unwrap(),
        "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.11.0_coreos.0\n"
    );
    assert_eq!(w.store_listing(), Vec::<String>::new());
}

#[test]
fn journald_priority_prefixes_under_systemd() {
    let w = World::new();
    // JOURNAL_STREAM naming stderr's own device and inode, as systemd sets it.
    let dir = unique_dir("journal");
    let errf = dir.join("stderr");
    let f = std::fs::File::create(&errf).unwrap();
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata().unwrap();
    let status = command(&w.args(), None)
        .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
        .stdout(std::process::Stdio::null())
        .stderr(f)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&errf).unwrap();
    assert!(
        text.lines()
            .all(|l| l.starts_with("<6>") || l.starts_with("<4>") || l.starts_with("<7>")),
        "{text}"
    );
    assert!(
        text.contains("<6>OS version 1520.5.0 board amd64-usr"),
        "{text}"
    );
}

#[test]
fn os_update_with_the_same_runtime_reboots_without_wiping_docker() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[
        "--status",
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        "--new-version",
        NEXT,
    ]);
    w.write("/run/torcx/profile.json", r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"17.03"}]}}"#);
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(
        r.stdout
            .contains(&format!("reboot=needed (OS update to {NEXT} is pending)")),
        "{}",
        r.stdout
    );
    assert!(!w
        .path("/run/systemd/system/torcx-docker-cleanup.service")
        .exists());
}

#[test]
fn a_failing_reboot_step_leaves_no_done_marker() {
    let w = World::new();
    w.write("/run/torcx/profile.json", "{not json");
    w.run()
        .assert_fails(1, "/run/torcx/profile.json: invalid profile JSON");
    // The unit must run again: kubelet.env is the done marker.
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
}

#[test]
fn hostile_values_from_every_source_are_refused() {
    // A package name in the signed manifest.
    let w = World::new();
    let m = w
        .manifest(CUR, &["17.03"])
        .replace("\"name\":\"docker\"", "\"name\":\"../docker\"");
    w.publish(CUR, &m);
    w.run()
        .assert_fails(1, "package name \"../docker\" is not a plain name");
    w.assert_nothing_written();
    // VERSION_ID, which names a store directory.
    let w = World::new();
    w.write(
        "/usr/lib/os-release",
        "ID=flatcar\nVERSION_ID=../../../etc\nCOREOS_BOARD=amd64-usr\n",
    );
    w.run().assert_fails(
        1,
        "/usr/lib/os-release: VERSION_ID \"../../../etc\" is not a plain version",
    );
    w.assert_nothing_written();
    // update_engine's new_version, which names another one.
    let w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[
        "--status",
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        "--new-version",
        "../../boot",
    ]);
    w.run_on(&bus).assert_fails(
        1,
        "new_version \"../../boot\", which is not a plain version",
    );
    w.assert_nothing_written();
}

#[test]
fn reboot_needed_into_an_unknown_version_defers_the_bootstrap() {
    // update_engine reports "0.0.0" after a restart, "" from some versions: nothing can be
    // staged for that OS, so the node reboots into it and bootstraps there.
    for version in ["0.0.0", ""] {
        let mut w = World::new();
        let mut bus = Bus::start();
        bus.update_engine(&[
            "--on-attempt",
            "CHECKING_FOR_UPDATE,UPDATED_NEED_REBOOT",
            "--new-version",
            version,
        ]);
        w.extra.push("--upgrade-os=true".into());
        let r = w.run_on(&bus);
        r.assert_ok();
        assert!(r.stdout.contains("bootstrap deferred k8s=v1.9.6+coreos.0 reboot=needed (an OS update of unknown version is pending"), "{version:?}: {}", r.stdout);
        w.assert_nothing_written();
        assert_eq!(w.files.seen().len(), 0, "nothing fetched for an unknown OS");
    }
}

#[test]
fn vendor_runtime_of_the_chosen_version_needs_no_reboot() {
    let w = World::new();
    w.write("/run/torcx/profile.json", r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}"#);
    std::fs::create_dir_all(w.path("/usr/share/torcx/store")).unwrap();
    std::os::unix::fs::symlink(
        "docker:17.03.torcx.tgz",
        w.path("/usr/share/torcx/store/docker:com.coreos.cl.torcx.tgz"),
    )
    .unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("docker=17.03") && r.stdout.contains("reboot=no"),
        "{}",
        r.stdout
    );
    assert!(!w
        .path("/run/systemd/system/torcx-docker-cleanup.service")
        .exists());
}

#[test]
fn killed_mid_download_leaves_no_file_and_the_next_run_converges() {
    let w = World::new();
    w.files.set(
        "/pkgs/docker-17.03.tgz",
        Reply::stalled(image("17.03"), 290_000),
    );
    let mut child = command(&w.args(), None)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first 256 KiB chunk sits in the temp file, then kill -9 mid-transfer.
    let store = w.path(&format!("/var/lib/torcx/store/{CUR}"));
    let temp = (0..200).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::read_dir(&store)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".docker:17.03.torcx.tgz.nodestrap-")
                    && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
            })
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let temp = temp.expect("a temp file appeared during the download");
    assert!(temp.exists(), "the killed run leaves only its temp file");
    assert!(
        !w.store_file(CUR, "17.03").exists(),
        "nothing at the final path"
    );
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
    // The unit runs again: the stale temp is swept and the image lands whole.
    w.files
        .set("/pkgs/docker-17.03.tgz", Reply::ok(image("17.03")));
    let r = w.run();
    r.assert_ok();
    assert!(r.stderr.contains("removed stale temp file"), "{}", r.stderr);
    assert_eq!(
        w.store_listing(),
        vec![format!("{CUR}/docker:17.03.torcx.tgz")]
    );
    assert_eq!(
        std::fs::read(w.store_file(CUR, "17.03")).unwrap(),
        image("17.03")
    );
}

#[test]
fn update_engine_signals_are_followed() {
    // GetStatus lags behind; only the StatusUpdate signals say the update finished, well
    // within the deadline and before the first GetStatus poll (5 s) would be made.
    let mut w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[
        "--on-attempt",
        "CHECKING_FOR_UPDATE,DOWNLOADING,UPDATED_NEED_REBOOT",
        "--new-version",
        NEXT,
        "--lagging-status",
    ]);
    w.extra
        .extend(["--upgrade-os=true".into(), "--update-timeout=3".into()]);
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!("next-os={NEXT}")),
        "{}",
        r.stdout
    );
}

#[test]
fn oversized_manifest_is_refused_without_retry() {
    let w = World::new();
    let p = World::manifest_path(CUR);
    w.files.set(&p, Reply::ok(vec![b' '; (1 << 20) + 1]));
    w.run().assert_fails(
        1,
        &format!(
            "GET {}: response larger than the 1048576-byte limit",
            w.files.url(&p)
        ),
    );
    assert_eq!(w.files.hits(&p), 1);
    w.assert_nothing_written();
}

#[test]
fn empty_kubeconfig_with_a_forced_version() {
    let mut w = World::new();
    w.extra.extend([
        "--kubeconfig=".into(),
        "--force-kube-version=v1.10.1".into(),
    ]);
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.10.1 docker=17.06"),
        "{}",
        r.stdout
    );
}

#[test]
fn the_nodes_own_ca_bundle_is_the_system_trust_store() {
    // No SSL_CERT_FILE and no --ca-file: the bundle in the node root is what is trusted.
    let w = World::new();
    w.write("/etc/ssl/certs/ca-certificates.crt", &w.ca.pem);
    let args: Vec<String> = w
        .args()
        .into_iter()
        .filter(|a| !a.starts_with("--ca-file"))
        .collect();
    let out = command(&args, None)
        .env_remove("SSL_CERT_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(w.store_file(CUR, "17.03").exists());
}
