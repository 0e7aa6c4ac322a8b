//! Where the real torcx looks: what nodestrap stages is what torcx finds at boot.

use super::*;

// ---------------------------------------------------------------------------------------------
// Where torcx looks

/// The real torcx (`qemu/build-torcx`: github.com/coreos/torcx v0.2.0 from the Go module proxy),
/// named by NODESTRAP_TORCX (tests/run.sh sets it).
pub(crate) fn real_torcx() -> PathBuf {
    support::vars::torcx()
}

/// A real torcx image: `bin/docker` printing `version`, with its manifest.
pub(crate) fn torcx_image(version: &str) -> Vec<u8> {
    let tree = unique_dir("torcx-image");
    std::fs::create_dir_all(tree.join(".torcx")).unwrap();
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::write(
        tree.join(".torcx/manifest.json"),
        r#"{"kind":"image-manifest-v0","value":{"bin":["/bin/docker"]}}"#,
    )
    .unwrap();
    std::fs::write(
        tree.join("bin/docker"),
        format!("#!/bin/sh\necho docker {version}\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        tree.join("bin/docker"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = tree.with_extension("tgz");
    let st = std::process::Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-czf"])
        .arg(&out)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::read(out).unwrap()
}

/// The real torcx generator run on `w`'s root, as at boot: a chroot in a private mount
/// namespace (its tmpfs and remounts die with it), /proc/cmdline holding `cmdline`. Its exit
/// code, its log, the profile it applied, and what `/run/torcx/bin/docker` held meanwhile.
pub(crate) fn boot_torcx(
    w: &World,
    cmdline: &str,
) -> (i32, String, Option<serde_json::Value>, String) {
    let gen = w.path("/usr/lib/systemd/system-generators/torcx-generator");
    std::fs::create_dir_all(gen.parent().unwrap()).unwrap();
    std::fs::copy(real_torcx(), &gen).unwrap();
    for d in ["/run", "/proc", "/gen"] {
        std::fs::create_dir_all(w.path(d)).unwrap();
    }
    std::fs::write(w.path("/proc/cmdline"), cmdline).unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "chroot \"$0\" /usr/lib/systemd/system-generators/torcx-generator /gen /gen /gen; rc=$?\n\
             cat \"$0/run/torcx/unpack/docker/bin/docker\" 2>/dev/null\nexit $rc",
        )
        .arg(&w.root)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let applied = std::fs::read_to_string(w.path("/run/torcx/profile.json"))
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    (
        out.status.code().unwrap_or(-1),
        log,
        applied,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

impl World {
    /// Serve real torcx images for 17.03 and 17.06 under both OS versions' manifests.
    pub(crate) fn with_real_images(&self) {
        let mut m = self.manifest(CUR, &["17.03", "17.06"]);
        for v in ["17.03", "17.06"] {
            let img = torcx_image(v);
            m = m.replace(&sha512(&image(v)), &sha512(&img));
            self.files
                .set(&format!("/pkgs/docker-{v}.tgz"), Reply::ok(img));
        }
        for os in [CUR, NEXT] {
            self.publish(os, &m);
        }
    }
}

/// torcx's own configuration moves its stores and profiles (base_dir, conf_dir): nodestrap
/// stages there, and the real torcx generator, booting the node, applies docker 17.03 from it.
/// The configuration file is the one `torcx_config=` names on the kernel command line, when it
/// does (for nodestrap and for torcx alike).
#[test]
fn real_torcx_applies_what_was_staged_where_its_config_says() {
    for via_cmdline in [false, true] {
        let mut w = World::new();
        w.with_real_images();
        let conf = r#"{"kind":"torcx-config-v0","value":{"base_dir":"/srv/torcx/","conf_dir":"/etc/torcx-alt"}}"#;
        let cmdline = if via_cmdline {
            w.write("/etc/site/torcx.json", conf);
            // A default file that says otherwise is not read then.
            w.write(
                "/etc/torcx/config.json",
                r#"{"kind":"torcx-config-v0","value":{"base_dir":"/nowhere"}}"#,
            );
            "ro quiet torcx_config=/etc/site/torcx.json\n"
        } else {
            w.write("/etc/torcx/config.json", conf);
            "ro quiet\n"
        };
        let cmdline_file = w.root.with_extension("cmdline");
        std::fs::write(&cmdline_file, cmdline).unwrap();
        let r = nodestrap(
            &w.args(),
            None,
            &[
                ("NODESTRAP_RUN_DIR", &w.run_dir),
                (
                    "NODESTRAP_PROC_CMDLINE",
                    &cmdline_file.display().to_string(),
                ),
            ],
        );
        r.assert_ok();
        assert!(
            r.stderr.contains(
                "torcx stores under /srv/torcx/store, profiles in /etc/torcx-alt/profiles"
            ),
            "{}",
            r.stderr
        );
        assert!(w
            .path(&format!("/srv/torcx/store/{CUR}/docker:17.03.torcx.tgz"))
            .exists());
        assert!(!w.path("/var/lib/torcx").exists());
        assert_eq!(w.read("/etc/torcx-alt/next-profile").unwrap(), "tectonic\n");
        let (code, log, applied, docker) = boot_torcx(&w, cmdline);
        assert_eq!(code, 0, "{log}");
        assert_eq!(
            applied.unwrap()["value"]["images"],
            serde_json::json!([{"name":"docker","reference":"17.03"}]),
            "{log}"
        );
        assert!(log.contains("/srv/torcx/store"), "{log}");
        assert_eq!(docker, "#!/bin/sh\necho docker 17.03\n", "{log}");
        w.extra.clear();
    }
}

/// What torcx would refuse, or take from elsewhere, is refused by name before anything is
/// staged: a configuration torcx cannot start with, and an archive of the same name and
/// version that torcx finds first (a squashfs anywhere, a tgz in a store searched first) when
/// it does not match the signed digest. One that matches is used as it is.
#[test]
fn what_torcx_would_not_find_is_refused_by_name() {
    let cases = [
        (
            r#"{"kind":"torcx-config-v0","value":{"base_dir":"var/lib/torcx"}}"#,
            None,
            "/etc/torcx/config.json (torcx's default): torcx would not start with this configuration (non-absolute base_dir \"var/lib/torcx\")",
        ),
        (
            r#"{"kind":"torcx-config-v1"}"#,
            None,
            "unknown config file kind \"torcx-config-v1\"",
        ),
        (
            r#"{"kind":"torcx-config-v0","value":{"store_paths":["/opt/torcx"]}}"#,
            Some("/opt/torcx/docker:17.03.torcx.tgz"),
            "torcx would take docker:17.03 for OS 1520.5.0 from",
        ),
        (
            r#"{"kind":"torcx-config-v0","value":{}}"#,
            Some("/var/lib/torcx/store/docker:17.03.torcx.squashfs"),
            "/var/lib/torcx/store/docker:17.03.torcx.squashfs, not from",
        ),
    ];
    for (conf, other, needle) in cases {
        let w = World::new();
        w.write("/etc/torcx/config.json", conf);
        if let Some(o) = other {
            w.write(o, "another archive");
        }
        let r = w.run();
        r.assert_fails(1, needle);
        assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
        assert!(w.read("/etc/torcx/next-profile").is_none());
        assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 0, "{needle}");
    }
    // The same archive, matching the signed digest, in a store torcx searches first: used.
    let w = World::new();
    w.write(
        "/etc/torcx/config.json",
        r#"{"kind":"torcx-config-v0","value":{"store_paths":["/opt/torcx"]}}"#,
    );
    std::fs::create_dir_all(w.path("/opt/torcx")).unwrap();
    std::fs::write(w.path("/opt/torcx/docker:17.03.torcx.tgz"), image("17.03")).unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(
            "/opt/torcx/docker:17.03.torcx.tgz, which matches the signed manifest (sha512-"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 0);
    assert_eq!(w.store_listing(), Vec::<String>::new());
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
}
