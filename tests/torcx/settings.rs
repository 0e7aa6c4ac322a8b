//! Settings from the node's config file, its drop-ins and the kernel command line.

use super::*;

// ---- settings from the node's config file and the kernel command line -------------------

pub(crate) const CONF: &str = "/etc/nodestrap/bootstrap.conf";
/// The options the config file sets in these tests.
pub(crate) const FROM_CONF: &[&str] = &["--torcx-manifest-url", "--keyring", "--ca-file"];

impl World {
    /// A stand-in for /proc/cmdline, outside the root.
    pub(crate) fn cmdline(&self, text: &str) -> PathBuf {
        let p = self.root.with_extension("cmdline");
        std::fs::write(&p, text).unwrap();
        p
    }

    pub(crate) fn run_with_cmdline(&self, args: &[String], cmdline: &Path) -> Run {
        nodestrap(
            args,
            None,
            &[("NODESTRAP_PROC_CMDLINE", cmdline.to_str().unwrap())],
        )
    }

    pub(crate) fn manifest_url(&self, prefix: &str) -> String {
        self.files.url(&format!(
            "/{prefix}/{{{{.Board}}}}/{{{{.OSVersion}}}}/torcx_manifest.json"
        ))
    }
}

#[test]
fn config_file_supplies_the_manifest_url_and_node_keyring_and_ca() {
    let w = World::new();
    w.write(
        "/etc/nodestrap/keyring.asc",
        &String::from_utf8(w.signer.keyring()).unwrap(),
    );
    w.write("/etc/nodestrap/ca.pem", &w.ca.pem);
    let url = w.manifest_url("manifests");
    w.write(
        CONF,
        &format!("# written by Ignition\n\n  manifest-url = \"{url}\"\nkeyring=/etc/nodestrap/keyring.asc\n\t# the test CA\nca-file = /etc/nodestrap/ca.pem\nverbose=debug\n"),
    );
    let r = nodestrap(&w.args_without(FROM_CONF), None, &[]);
    r.assert_ok();
    assert!(w.store_file(CUR, "17.03").exists());
    let conf = w.path(CONF).display().to_string();
    let line = format!("info: settings from {conf}: torcx-manifest-url, keyring, ca-file, verbose");
    let logged = r.stderr.lines().find(|l| l.contains("settings from"));
    assert_eq!(logged, Some(line.as_str()), "{}", r.stderr);
    // --verbose from the file took effect; the keyring and CA came from the node.
    let node = w.path("/etc/nodestrap").display().to_string();
    for needle in [
        format!("debug: keyring {node}/keyring.asc (from {conf}): "),
        format!("trust anchors: ca-file {node}/ca.pem (from {conf}) (1 certificates)"),
    ] {
        assert!(
            r.stderr.contains(&needle),
            "{needle:?} not in\n{}",
            r.stderr
        );
    }
    // A node file the settings name that is not there: the setting's error, named with its source.
    std::fs::remove_file(w.path("/etc/nodestrap/ca.pem")).unwrap();
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    nodestrap(&w.args_without(FROM_CONF), None, &[]).assert_fails(
        2,
        &format!("ca-file {node}/ca.pem (from {conf}): does not exist"),
    );
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
    // A kernel argument naming another node file wins over the file's, and says where it is from.
    let cmdline = w.cmdline("ro nodestrap.ca-file=/etc/nodestrap/karg-ca.pem\n");
    let mut args = w.args_without(FROM_CONF);
    args.push("--cmdline".into());
    w.run_with_cmdline(&args, &cmdline).assert_fails(
        2,
        &format!("ca-file {node}/karg-ca.pem (from the kernel command line): does not exist"),
    );
    w.write("/etc/nodestrap/karg-ca.pem", &w.ca.pem);
    let r = w.run_with_cmdline(&args, &cmdline);
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "trust anchors: ca-file {node}/karg-ca.pem (from the kernel command line)"
        )),
        "{}",
        r.stderr
    );
}

#[test]
fn kernel_arguments_override_the_file_and_the_command_line_overrides_both() {
    let w = World::new();
    // Only /karg/ and /manifests/ serve manifests; /file/ is a 404.
    let karg_path = format!("/karg/amd64-usr/{CUR}/torcx_manifest.json");
    let m = w.manifest(CUR, &["17.03"]);
    w.files.set(&karg_path, Reply::ok(m.clone()));
    w.files.set(
        &format!("{karg_path}.asc"),
        Reply::ok(w.signer.sign(m.as_bytes())),
    );
    w.write(
        CONF,
        &format!(
            "torcx-manifest-url={}\ntorcx-profile=fromfile\n",
            w.manifest_url("file")
        ),
    );
    let cmdline = w.cmdline(&format!(
        "BOOT_IMAGE=/vmlinuz rd.nodestrap=0 nodestrap.manifest-url=\"{}\" nodestrap.torcx-profile=fromkarg console=ttyS0\n",
        w.manifest_url("karg")
    ));
    let mut args = w.args_without(&["--torcx-manifest-url"]);
    args.push("--dry-run".into());
    let good_sig = |r: &Run, prefix: &str| {
        let needle = format!(
            "manifest {}/amd64-usr/{CUR}/torcx_manifest.json: good signature",
            w.files.url(&format!("/{prefix}"))
        );
        assert!(
            r.stderr.contains(&needle),
            "{needle:?} not in\n{}",
            r.stderr
        );
    };

    // Without --cmdline the kernel arguments are not read: the file decides.
    let r = w.run_with_cmdline(&args, &cmdline);
    r.assert_fails(
        1,
        &format!(
            "GET {}: HTTP 404",
            w.files
                .url(&format!("/file/amd64-usr/{CUR}/torcx_manifest.json"))
        ),
    );

    // Kernel arguments over the file.
    args.push("--cmdline".into());
    let r = w.run_with_cmdline(&args, &cmdline);
    r.assert_ok();
    good_sig(&r, "karg");
    assert!(r.stdout.contains("plan: profile fromkarg "), "{}", r.stdout);
    assert!(
        r.stderr.contains(
            "info: settings from the kernel command line: torcx-manifest-url, torcx-profile\n"
        ),
        "{}",
        r.stderr
    );

    // The command line over both, in either spelling.
    args.push(format!(
        "--torcx-manifest-url={}",
        w.manifest_url("manifests")
    ));
    args.extend(["--torcx-profile".into(), "fromargv".into()]);
    let karg_hits = w.files.hits(&karg_path);
    let r = w.run_with_cmdline(&args, &cmdline);
    r.assert_ok();
    good_sig(&r, "manifests");
    assert!(r.stdout.contains("plan: profile fromargv "), "{}", r.stdout);
    assert_eq!(w.files.hits(&karg_path), karg_hits);
    w.assert_nothing_written();
}

#[test]
fn kernel_arguments_are_ignored_without_cmdline() {
    let w = World::new();
    let cmdline =
        w.cmdline("ro nodestrap.bogus=1 nodestrap.torcx-manifest-url=https://127.0.0.1:1/m.json\n");
    w.run_with_cmdline(&w.args(), &cmdline).assert_ok();
    let mut args = w.args();
    args.push("--cmdline=false".into());
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run_with_cmdline(&args, &cmdline).assert_ok();
    args.push("--cmdline".into());
    w.run_with_cmdline(&args, &cmdline).assert_fails(
        2,
        "kernel command line: nodestrap.bogus=1: unknown key \"bogus\"",
    );
}

#[test]
fn node_paths_from_the_config_file_never_leave_the_root() {
    let w = World::new();
    let conf = w.path(CONF).display().to_string();
    let node = w.path("/etc/nodestrap").display().to_string();
    w.write(
        CONF,
        "keyring=/etc/nodestrap/keyring.asc\nca-file=/etc/nodestrap/ca.pem\n",
    );
    w.write("/etc/nodestrap/ca.pem", &w.ca.pem);
    // The keyring: an absolute symlink to the host's copy of the right keyring.
    std::os::unix::fs::symlink(&w.keyring, w.path("/etc/nodestrap/keyring.asc")).unwrap();
    let args = w.args_without(&["--keyring", "--ca-file"]);
    let run = || nodestrap(&args, None, &[]);
    run().assert_fails(
        2,
        &format!("keyring {node}/keyring.asc (from {conf}): does not exist"),
    );
    // What it names inside the root is what is read: another key, so the signature fails.
    let stranger = Signer_::new("stranger <x@nodestrap.invalid>");
    let inside = w.root.join(w.keyring.strip_prefix("/").unwrap());
    std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
    std::fs::write(&inside, stranger.keyring()).unwrap();
    run().assert_fails(
        1,
        &format!("signature check against keyring {node}/keyring.asc (from {conf}) failed"),
    );
    // The CA: a relative symlink climbing out to the host's copy of the right CA.
    std::fs::write(&inside, w.signer.keyring()).unwrap();
    std::fs::remove_file(w.path("/etc/nodestrap/ca.pem")).unwrap();
    let rel = format!("../../../../../../../..{}", w.ca_file.display());
    std::os::unix::fs::symlink(&rel, w.path("/etc/nodestrap/ca.pem")).unwrap();
    run().assert_fails(
        2,
        &format!("ca-file {node}/ca.pem (from {conf}): does not exist"),
    );
    w.assert_nothing_written();
    // With the target inside the root, the same settings work.
    let ca_inside = w.root.join(w.ca_file.strip_prefix("/").unwrap());
    std::fs::write(&ca_inside, &w.ca.pem).unwrap();
    run().assert_ok();
}

#[test]
fn bad_settings_exit_2_naming_their_source() {
    let cases: &[(&str, Option<&str>, &[&str], &str)] = &[
        (
            "# c\nupgrade-os=false\nbogus=1\n",
            None,
            &[],
            "{conf}:3: unknown key \"bogus\"",
        ),
        ("api-tries=lots\n", None, &[], "{conf}:1: api-tries: "),
        ("upgrade-os\n", None, &[], "{conf}:1: expected key=value"),
        (
            "fetch-attempts=2\nfetch-attempts=3\n",
            None,
            &[],
            "{conf}:2: duplicate key \"fetch-attempts\"",
        ),
        (
            "root=/\n",
            None,
            &[],
            "{conf}:1: \"root\" can only be given on the command line",
        ),
        (
            "keyring=keyring.asc\n",
            None,
            &[],
            "{conf}:1: keyring: \"keyring.asc\": expected an absolute file path on the node",
        ),
        (
            "",
            Some("ro nodestrap.bogus=1"),
            &["--cmdline"],
            "kernel command line: nodestrap.bogus=1: unknown key \"bogus\"",
        ),
        (
            "",
            Some("nodestrap.reboot=sometimes"),
            &["--cmdline"],
            "kernel command line: nodestrap.reboot=sometimes: reboot: ",
        ),
        (
            "",
            None,
            &["--config=/etc/nodestrap/other.conf"],
            "--config {root}/etc/nodestrap/other.conf: does not exist",
        ),
        (
            "",
            None,
            &["--config", "etc/nodestrap/bootstrap.conf"],
            "--config \"etc/nodestrap/bootstrap.conf\": expected an absolute file path",
        ),
    ];
    for (conf_text, cmdline, extra, needle) in cases {
        let mut w = World::new();
        w.write(CONF, conf_text);
        w.extra.extend(extra.iter().map(|x| x.to_string()));
        let cmdline = w.cmdline(cmdline.unwrap_or(""));
        let needle = needle
            .replace("{conf}", &w.path(CONF).display().to_string())
            .replace("{root}", &w.root.display().to_string());
        w.run_with_cmdline(&w.args(), &cmdline)
            .assert_fails(2, &needle);
        w.assert_nothing_written();
        assert_eq!(w.files.seen().len(), 0, "{needle}: nothing fetched");
    }
    // Over 64 KiB.
    let w = World::new();
    w.write(CONF, &"#\n".repeat(33 << 10));
    w.run().assert_fails(2, "larger than the 65536-byte limit");
    // An empty --config reads no file at all.
    let mut w = World::new();
    w.write(CONF, "bogus=1\n");
    w.extra.push("--config=".into());
    let r = w.run();
    r.assert_ok();
    assert!(!r.stderr.contains("settings from"), "{}", r.stderr);
}
