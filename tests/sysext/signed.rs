//! Issue 34, "Verity-signed images, enforced": real signed DDIs made by Debian 13's
//! systemd-repart 257 (`qemu/build-ddi-tools`, NODESTRAP_DDI_TOOLS), staged by the sysext
//! bootstrap under `--sysext-trust signed` into a node root as from the initramfs. What the
//! real systemd-sysext makes of them at boot needs dm-verity, which this machine's kernel
//! lacks: the QEMU guests prove that part (docs/where-it-runs.md).

use super::*;

/// The Debian 13 root holding systemd-repart and containerd (tests/run.sh sets it from
/// qemu/build-ddi-tools).
pub(super) fn tools() -> PathBuf {
    super::support::vars::ddi_tools()
}

/// A key and its self-signed certificate, made by openssl now.
struct Key {
    key: PathBuf,
    crt: PathBuf,
}

fn key(work: &Path, cn: &str) -> Key {
    let (key, crt) = (
        work.join(format!("{cn}.key")),
        work.join(format!("{cn}.crt")),
    );
    let o = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .arg(format!("-subj=/CN={cn}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Key { key, crt }
}

/// How a DDI is made.
enum Make<'a> {
    /// `systemd-repart --make-ddi=sysext`, signed by this key.
    Signed(&'a Key),
    /// root and root-verity partitions, no signature partition (repart definitions of its own).
    Unsigned,
    /// usr, usr-verity and usr-verity-sig partitions signed by this key (repart definitions of
    /// its own); the usr file system is /usr itself (`CopyFiles=/usr:/`, as systemd-sysext reads
    /// a /usr partition), or with `nested` the tree's usr/ folder at its top (`CopyFiles=/usr`).
    Usr { key: &'a Key, nested: bool },
}

/// A sysext DDI of extension `name` holding `files`, made by the real systemd-repart 257 in
/// the Debian 13 root, offline, in a private mount namespace.
fn ddi(work: &Path, name: &str, files: &[(&str, String)], make: Make) -> Vec<u8> {
    let w = unique_dir("ddi");
    let tree = w.join("tree");
    std::fs::create_dir_all(tree.join("usr/lib/extension-release.d")).unwrap();
    std::fs::write(
        tree.join(format!(
            "usr/lib/extension-release.d/extension-release.{name}"
        )),
        ANY,
    )
    .unwrap();
    for (p, content) in files {
        let f = tree.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, content).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let repart = match make {
        Make::Signed(k) => {
            std::fs::copy(&k.key, w.join("key.pem")).unwrap();
            std::fs::copy(&k.crt, w.join("cert.crt")).unwrap();
            "--make-ddi=sysext --private-key=/w/key.pem --certificate=/w/cert.crt".to_string()
        }
        Make::Unsigned => {
            let defs = w.join("defs");
            std::fs::create_dir_all(&defs).unwrap();
            std::fs::write(
                defs.join("10-root.conf"),
                "[Partition]\nType=root\nFormat=erofs\nCopyFiles=/usr\nVerity=data\nVerityMatchKey=root\nMinimize=best\n",
            )
            .unwrap();
            std::fs::write(
                defs.join("20-root-verity.conf"),
                "[Partition]\nType=root-verity\nVerity=hash\nVerityMatchKey=root\nMinimize=best\n",
            )
            .unwrap();
            "--definitions=/w/defs --empty=create --size=auto".to_string()
        }
        Make::Usr { key: k, nested } => {
            std::fs::copy(&k.key, w.join("key.pem")).unwrap();
            std::fs::copy(&k.crt, w.join("cert.crt")).unwrap();
            let defs = w.join("defs");
            std::fs::create_dir_all(&defs).unwrap();
            let copy = if nested { "/usr" } else { "/usr:/" };
            for (f, text) in [
                ("10-usr.conf", format!("[Partition]\nType=usr\nFormat=erofs\nCopyFiles={copy}\nVerity=data\nVerityMatchKey=usr\nMinimize=best\n")),
                ("20-usr-verity.conf", "[Partition]\nType=usr-verity\nVerity=hash\nVerityMatchKey=usr\nMinimize=best\n".into()),
                ("30-usr-verity-sig.conf", "[Partition]\nType=usr-verity-sig\nVerity=signature\nVerityMatchKey=usr\n".into()),
            ] {
                std::fs::write(defs.join(f), text).unwrap();
            }
            "--definitions=/w/defs --empty=create --size=auto --private-key=/w/key.pem --certificate=/w/cert.crt".to_string()
        }
    };
    let t = tools();
    let o = Command::new("unshare")
        .args(["-m", "sh", "-ec"])
        .arg(format!(
            "mkdir -p {t}/w && mount --bind {w} {t}/w && mount -t proc proc {t}/proc && mount --rbind /dev {t}/dev\n\
             chroot {t} systemd-repart {repart} --copy-source=/w/tree --offline=yes --no-pager /w/out.raw",
            t = t.display(),
            w = w.display()
        ))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "systemd-repart: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let b = std::fs::read(w.join("out.raw")).unwrap();
    let _ = std::fs::remove_dir_all(&w);
    let _ = work;
    b
}

fn kubelet(v: &str) -> Vec<(&'static str, String)> {
    vec![(
        "usr/bin/kubelet",
        format!("#!/bin/sh\necho 'Kubernetes v{v}'\n"),
    )]
}

fn containerd_bin(v: &str) -> Vec<(&'static str, String)> {
    vec![(
        "usr/bin/containerd",
        format!("#!/bin/sh\necho 'containerd github.com/containerd/containerd {v}'\n"),
    )]
}

/// A node that can merge signed images: systemd 257's shared library, libcryptsetup.so.12,
/// kmod, and dm-verity among the running kernel's modules.
fn verity_capable(w: &World) {
    w.write(
        "/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-257.so",
        "",
    );
    w.write("/usr/lib/x86_64-linux-gnu/libcryptsetup.so.12", "");
    w.write("/usr/bin/kmod", "");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    w.write(
        &format!(
            "/usr/lib/modules/{}/kernel/drivers/md/dm-verity.ko.xz",
            release.trim()
        ),
        "",
    );
}

/// The world's source, with signed DDIs of kubernetes v1.32.3 and containerd 1.7.24 by `k`.
fn signed_world(k: &Key) -> World {
    let w = World::new();
    verity_capable(&w);
    let kube = ddi(&w.work, "kubernetes", &kubelet("1.32.3"), Make::Signed(k));
    let ctd = ddi(
        &w.work,
        "containerd",
        &containerd_bin("1.7.24"),
        Make::Signed(k),
    );
    w.publish(
        "kubernetes",
        &[("kubernetes-v1.32.3-x86-64.raw".into(), kube)],
        "",
    );
    w.publish(
        "containerd",
        &[("containerd-v1.7.24-x86-64.raw".into(), ctd)],
        "",
    );
    w
}

fn signed_args(w: &mut World, certs: &Path) {
    w.extra = vec![
        "--sysext-trust=signed".into(),
        format!("--sysext-verity-certs={}", certs.display()),
    ];
}

fn decision(w: &World, what: &str) -> String {
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["what"] == what)
        .map(|d| {
            format!(
                "{} ({})",
                d["value"].as_str().unwrap(),
                d["source"].as_str().unwrap()
            )
        })
        .unwrap_or_default()
}

fn verity_d(w: &World) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(w.path("/etc/verity.d"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Signed mode with a trusted signer: both DDIs proven (signature, layout, hash tree) and
/// staged; the certificate in the real root's /etc/verity.d under nodestrap's name; the strict
/// policy in the drop-in systemd 257 reads; the record names each image's trust root.
#[test]
fn signed_ddis_of_a_trusted_key_are_staged_with_their_certificate_and_the_strict_policy() {
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains("signed DDI, root hash ")
            && r.stderr.contains(&format!("signed by {}", a.crt.display())),
        "{}",
        r.stderr
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    assert_eq!(
        w.link("containerd").as_deref(),
        Some("/opt/extensions/containerd/containerd-v1.7.24-x86-64.raw")
    );
    let certs = verity_d(&w);
    assert_eq!(certs.len(), 1, "{certs:?}");
    assert!(certs[0].starts_with("nodestrap-") && certs[0].ends_with(".crt"));
    // The installed file is the certificate: openssl reads it as the same one.
    let same = |p: &Path| {
        let o = Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(
        same(&w.path(&format!("/etc/verity.d/{}", certs[0]))),
        same(&a.crt)
    );
    let dropin = w
        .read("/etc/systemd/system/systemd-sysext.service.d/50-nodestrap-image-policy.conf")
        .unwrap();
    assert!(
        dropin.contains(
            "ExecStart=\nExecStart=systemd-sysext refresh --image-policy=root=signed+absent:usr=signed+absent\nExecReload=\nExecReload=systemd-sysext refresh --image-policy=root=signed+absent:usr=signed+absent\n"
        ),
        "{dropin}"
    );
    assert!(
        decision(&w, "kubernetes-trust").starts_with("signed by "),
        "{}",
        decision(&w, "kubernetes-trust")
    );
    assert!(decision(&w, "image-policy").starts_with("root=signed+absent:usr=signed+absent"));
    assert!(decision(&w, "sysext-trust").starts_with("signed (1 certificate(s))"));
    // `nodestrap status` shows the mode, the policy in force and each image's trust root.
    let st = nodestrap(
        &["status".into(), format!("--root={}", w.root.display())],
        None,
        &[],
    );
    for row in [
        "  sysext-trust     signed (1 certificate(s))  from --sysext-verity-certs ",
        "  image-policy     root=signed+absent:usr=signed+absent  from ",
        "  kubernetes-trust signed by ",
        "  containerd-trust signed by ",
    ] {
        assert!(st.stdout.contains(row), "{row:?}: {}", st.stdout);
    }
}

/// A DDI signed by a key that is not configured is refused before the switch, naming the
/// reason: systemd would refuse it at boot, and with it every extension. The previous set
/// stays linked.
#[test]
fn a_ddi_signed_by_another_key_is_refused_and_the_previous_set_stays() {
    let work = unique_dir("keys");
    let (a, b) = (key(&work, "trusted"), key(&work, "other"));
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    w.run().assert_ok();
    // The cluster moves to v1.32.4; that image is signed by another key.
    let kube = ddi(&w.work, "kubernetes", &kubelet("1.32.4"), Make::Signed(&b));
    let old = ddi(&w.work, "kubernetes", &kubelet("1.32.3"), Make::Signed(&a));
    w.publish(
        "kubernetes",
        &[
            ("kubernetes-v1.32.3-x86-64.raw".into(), old),
            ("kubernetes-v1.32.4-x86-64.raw".into(), kube),
        ],
        "",
    );
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.32.4\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run();
    r.assert_fails(
        1,
        "kubernetes-v1.32.4-x86-64.raw refused: its root hash signature does not verify: signer certificate not found among the trusted certificates",
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    assert!(!w.store("kubernetes").iter().any(|f| f.contains("1.32.4")));
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
}

/// A DDI with verity but no signature partition (the policy's `verity`, not `signed`) and a
/// plain squashfs image are refused in signed mode, before any link changes: the runtime's
/// link is not touched.
#[test]
fn unsigned_and_plain_images_are_refused_in_signed_mode() {
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    w.run().assert_ok();
    let runtime = w.link("containerd");
    for (label, body, needle) in [
        (
            "unsigned",
            ddi(&w.work, "containerd", &containerd_bin("1.7.25"), Make::Unsigned),
            "its root partition is not signed: root present, root-verity present, no signature present; the policy `root=signed+absent` refuses it",
        ),
        (
            "plain",
            containerd(&w.work, "1.7.25", 0),
            "a plain image, and --sysext-trust signed takes only signed DDIs",
        ),
    ] {
        let ctd = ddi(&w.work, "containerd", &containerd_bin("1.7.24"), Make::Signed(&a));
        w.publish(
            "containerd",
            &[
                ("containerd-v1.7.24-x86-64.raw".into(), ctd),
                ("containerd-v1.7.25-x86-64.raw".into(), body),
            ],
            "",
        );
        std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
        let r = w.run();
        r.assert_fails(1, needle);
        assert_eq!(w.link("containerd"), runtime, "{label}");
        assert!(w.read("/etc/kubernetes/kubelet.env").is_none(), "{label}");
        // The next test case starts from a done node again.
        w.write("/etc/kubernetes/kubelet.env", "KUBELET_IMAGE_TAG=v1.32.4\n");
    }
}

/// A signed DDI whose data partition is /usr (types usr, usr-verity, usr-verity-sig, as
/// systemd-repart makes it with `CopyFiles=/usr:/`) is read as systemd-sysext reads one: its
/// file system is /usr itself, and on a node of systemd 258 it is staged; the same tree copied
/// with its usr/ folder at the top (`CopyFiles=/usr`) has no release file where systemd looks,
/// and is refused saying so. On a node of systemd 257, which merges a /usr partition without
/// dm-verity (its signature never checked), it is refused before anything is staged.
#[test]
fn a_usr_partition_ddi_is_read_as_usr_itself() {
    let w0 = World::new();
    let k = key(&w0.work, "usr-signer");
    let nested_why = "its /usr partition's file system holds usr/ at its top, but a /usr partition is /usr itself";
    let old_why = "a signed DDI, but its data partition is /usr, which systemd 257 merges without dm-verity, its signature never checked (systemd 258 or later checks it)";
    for (systemd, nested, want) in [
        (258, false, None),
        (258, true, Some(nested_why)),
        (257, false, Some(old_why)),
    ] {
        let mut w = signed_world(&k);
        let lib = "/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared";
        std::fs::remove_file(w.path(&format!("{lib}-257.so"))).unwrap();
        w.write(&format!("{lib}-{systemd}.so"), "");
        let kube = ddi(
            &w.work,
            "kubernetes",
            &kubelet("1.32.3"),
            Make::Usr { key: &k, nested },
        );
        w.publish(
            "kubernetes",
            &[("kubernetes-v1.32.3-x86-64.raw".into(), kube)],
            "",
        );
        signed_args(&mut w, &k.crt);
        let r = w.run();
        match want {
            None => {
                r.assert_ok();
                assert!(r.stderr.contains("signed DDI, root hash"), "{}", r.stderr);
                assert_eq!(
                    w.link("kubernetes").as_deref(),
                    Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
                );
            }
            Some(why) => {
                r.assert_fails(1, why);
                if nested {
                    assert!(
                        r.stderr.contains(
                            "it has no /usr/lib/extension-release.d/extension-release.kubernetes"
                        ),
                        "{}",
                        r.stderr
                    );
                }
                w.assert_nothing_staged();
            }
        }
    }
}

/// The certificates follow the configuration: two configured, two installed; one taken out
/// of the PEM file, and the next run takes its file away (systemd then no longer trusts what
/// it signed). Plain mode takes the policy drop-in away.
#[test]
fn certificates_and_the_policy_follow_the_configuration() {
    let work = unique_dir("keys");
    let (a, b) = (key(&work, "trusted"), key(&work, "second"));
    let both = work.join("both.pem");
    std::fs::write(
        &both,
        [
            std::fs::read(&a.crt).unwrap(),
            std::fs::read(&b.crt).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    let mut w = signed_world(&a);
    signed_args(&mut w, &both);
    w.run().assert_ok();
    assert_eq!(verity_d(&w).len(), 2, "{:?}", verity_d(&w));
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    signed_args(&mut w, &a.crt);
    let r = w.run();
    r.assert_ok();
    assert_eq!(verity_d(&w).len(), 1, "{:?}", verity_d(&w));
    assert!(
        r.stderr
            .contains("removed: no longer a configured certificate"),
        "{}",
        r.stderr
    );
    // Something not nodestrap's in /etc/verity.d is left alone.
    w.write("/etc/verity.d/site.crt", "not ours");
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.extra = vec![format!("--sysext-verity-certs={}", a.crt.display())];
    w.run().assert_ok();
    assert!(w
        .read("/etc/systemd/system/systemd-sysext.service.d/50-nodestrap-image-policy.conf")
        .is_none());
    assert_eq!(verity_d(&w).len(), 2, "{:?}", verity_d(&w));
    assert!(decision(&w, "image-policy").starts_with("systemd's default"));
}

/// Signed mode on a node that cannot merge verity images is refused before anything is staged,
/// naming each thing missing.
#[test]
fn a_node_that_cannot_merge_signed_images_is_refused_first() {
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    std::fs::remove_file(w.path("/usr/lib/x86_64-linux-gnu/libcryptsetup.so.12")).unwrap();
    std::fs::remove_file(w.path("/usr/bin/kmod")).unwrap();
    let r = w.run();
    r.assert_fails(1, "cannot merge signed images: no libcryptsetup.so.12 (Debian: libcryptsetup12), which systemd loads to activate verity; no kmod: no module loads, not even loop");
    w.assert_nothing_staged();
    // Signed mode needs its certificates: a configuration error.
    w.extra = vec!["--sysext-trust=signed".into()];
    w.run()
        .assert_fails(2, "--sysext-trust signed needs --sysext-verity-certs");
}

/// The node's own settings choose signed mode: the config file names the certificates as a
/// node path, and the record says where the trust came from.
#[test]
fn the_config_file_sets_signed_mode_and_its_certificates() {
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let w = signed_world(&a);
    w.write(
        "/etc/nodestrap/keyring.asc",
        &std::fs::read_to_string(&w.keyring).unwrap(),
    );
    w.write(
        "/etc/nodestrap/ca.pem",
        &std::fs::read_to_string(&w.ca_file).unwrap(),
    );
    w.write(
        "/etc/nodestrap/verity.pem",
        &std::fs::read_to_string(&a.crt).unwrap(),
    );
    w.write(
        "/etc/nodestrap/bootstrap.conf",
        &format!(
            "payload=sysext\nsysext-url={}\nkeyring=/etc/nodestrap/keyring.asc\nca-file=/etc/nodestrap/ca.pem\n\
             kubeconfig=\nsysext-trust=signed\nsysext-verity-certs=/etc/nodestrap/verity.pem\n",
            w.files.url("/ext/${NAME}")
        ),
    );
    let r = nodestrap(
        &["bootstrap".into(), format!("--root={}", w.root.display())],
        None,
        &[],
    );
    r.assert_ok();
    assert!(
        decision(&w, "sysext-trust").contains("sysext-verity-certs ")
            && decision(&w, "sysext-trust").contains("/etc/nodestrap/verity.pem (from "),
        "{}",
        decision(&w, "sysext-trust")
    );
    assert_eq!(verity_d(&w).len(), 1);
    // A torcx node's config may not ask for it: an option of the other payload.
    w.write(
        "/etc/nodestrap/bootstrap.conf",
        "payload=torcx\nsysext-trust=signed\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    nodestrap(
        &[
            "bootstrap".into(),
            format!("--root={}", w.root.display()),
            "--dry-run".into(),
        ],
        None,
        &[],
    )
    .assert_fails(2, "sysext-trust");
}

/// Signed mode judges the extensions it does not manage as the strict policy will, and only
/// reports them: a DDI of a configured certificate is fine; a plain image and a DDI of another
/// key would make the boot merge nothing, and the record says so. None of them is touched.
#[test]
fn unmanaged_extensions_are_judged_and_reported_never_touched() {
    let work = unique_dir("keys");
    let (a, b) = (key(&work, "trusted"), key(&work, "other"));
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    let site = [
        (
            "good",
            ddi(&w.work, "good", &kubelet("0"), Make::Signed(&a)),
        ),
        (
            "foreign",
            ddi(&w.work, "foreign", &kubelet("0"), Make::Signed(&b)),
        ),
        ("plain", containerd(&w.work, "0.1", 0)),
    ];
    for (n, body) in &site {
        std::fs::create_dir_all(w.path("/var/lib/site")).unwrap();
        std::fs::write(w.path(&format!("/var/lib/site/{n}.raw")), body).unwrap();
        std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
        std::os::unix::fs::symlink(
            format!("/var/lib/site/{n}.raw"),
            w.path(&format!("/etc/extensions/{n}.raw")),
        )
        .unwrap();
    }
    let r = w.run();
    r.assert_ok();
    let seen: Vec<String> = ["foreign", "good", "plain"]
        .iter()
        .map(|n| format!("{n}.raw: {}", decision(&w, &format!("{n}-trust"))))
        .collect();
    assert!(
        seen[0].starts_with(
            "foreign.raw: not managed: refused by the strict policy: its root hash signature does not verify"
        ),
        "{seen:?}"
    );
    assert!(
        seen[1].starts_with("good.raw: not managed: signed by "),
        "{seen:?}"
    );
    assert!(
        seen[2].starts_with("plain.raw: not managed: refused by the strict policy: a plain image"),
        "{seen:?}"
    );
    assert!(r
        .stderr
        .contains("systemd will refuse it, and with it the boot's whole merge"));
    for (n, body) in &site {
        assert_eq!(
            &std::fs::read(w.path(&format!("/var/lib/site/{n}.raw"))).unwrap(),
            body
        );
        assert!(w.path(&format!("/etc/extensions/{n}.raw")).is_symlink());
    }
}

/// Signed mode's own changes (certificates in /etc/verity.d, the policy drop-in, a certificate
/// taken away) under the fault matrix: an upgrade from a set signed by one key to one signed by
/// another, the configuration naming only the new key; every mutating call of the run fails in
/// turn (EIO, ENOSPC) or the run is killed there, and the node must then be as before the run
/// or as after it, never in between.
#[test]
fn fault_matrix_of_a_signed_upgrade() {
    use support::faults::*;
    if !native() {
        return;
    }
    let work = unique_dir("keys");
    let (a, b) = (key(&work, "old"), key(&work, "new"));
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    w.run().assert_ok();
    let kube = ddi(&w.work, "kubernetes", &kubelet("1.32.4"), Make::Signed(&b));
    let ctd = ddi(
        &w.work,
        "containerd",
        &containerd_bin("1.7.24"),
        Make::Signed(&b),
    );
    w.publish(
        "kubernetes",
        &[("kubernetes-v1.32.4-x86-64.raw".into(), kube)],
        "",
    );
    w.publish(
        "containerd",
        &[("containerd-v1.7.24-x86-64.raw".into(), ctd)],
        "",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    signed_args(&mut w, &b.crt);
    let skip = ["var/lib/nodestrap"];
    let pristine = w.work.join("pristine");
    copy_tree(&w.root, &pristine);
    let before = snapshot(&w.root, &skip);
    let cmd = || command(&w.args_for(&w.root.display().to_string()), None);
    let (calls, run) = trace(&cmd(), &w.work.join("trace"));
    run.assert_ok();
    let after = snapshot(&w.root, &skip);
    assert_eq!(verity_d(&w).len(), 1, "{:?}", verity_d(&w));
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.4-x86-64.raw")
    );
    assert!(calls.len() > 20, "{calls:#?}");
    matrix(&w.root, &pristine, &w.work, &cmd, &calls, &before, &after);
}

/// The Debian 14 root whose systemd (259 or later) reads its image policy from sysext.conf
/// (tests/run.sh sets it from qemu/build-systemd-forky).
fn forky() -> PathBuf {
    super::support::vars::systemd_forky()
}

/// The systemd version of a root, from its shared library's name.
fn systemd_of(root: &Path) -> u32 {
    std::fs::read_dir(root.join("usr/lib/x86_64-linux-gnu/systemd"))
        .unwrap()
        .flatten()
        .find_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("libsystemd-shared-")?
                .split(['.', '-'])
                .next()?
                .parse()
                .ok()
        })
        .expect("libsystemd-shared-*.so in the Debian 14 root")
}

/// What the real systemd-sysext of the Debian 14 root does with `image` (a plain image) in
/// /etc/extensions, and the node's sysext.conf drop-ins `conf` (name, text) in
/// /etc/systemd/sysext.conf.d: `systemd-sysext merge` in a private mount namespace, the root
/// overlaid so that nothing of it changes. Its exit status and what it printed.
fn sysext_of_forky(image: &[u8], conf: &[(String, String)]) -> (bool, String) {
    forky_merge(image, conf, false)
}

/// The same node merged as an initramfs of systemd 261 and later merges it
/// (systemd-sysext-sysroot.service's `systemd-sysext --root=/sysroot refresh`): the node is a
/// second overlay of the root at /sysroot, the initramfs stand-in has no drop-in of its own.
fn sysext_of_forky_sysroot(image: &[u8], conf: &[(String, String)]) -> (bool, String) {
    forky_merge(image, conf, true)
}

fn forky_merge(image: &[u8], conf: &[(String, String)], sysroot: bool) -> (bool, String) {
    let s = unique_dir("forky");
    let up = s.join("up");
    std::fs::create_dir_all(up.join("etc/extensions")).unwrap();
    std::fs::create_dir_all(up.join("etc/systemd/sysext.conf.d")).unwrap();
    for d in ["work", "root", "up0", "work0"] {
        std::fs::create_dir_all(s.join(d)).unwrap();
    }
    std::fs::write(up.join("etc/extensions/probe.raw"), image).unwrap();
    for (name, text) in conf {
        std::fs::write(up.join("etc/systemd/sysext.conf.d").join(name), text).unwrap();
    }
    let (mount, merge, unmerge) = if sysroot {
        (
            "mount -t overlay overlay -o lowerdir=$T,upperdir=$S/up0,workdir=$S/work0 $R\nmkdir $R/sysroot\nmount -t overlay overlay -o lowerdir=$T,upperdir=$S/up,workdir=$S/work $R/sysroot",
            "systemd-sysext --root=/sysroot refresh",
            "systemd-sysext --root=/sysroot unmerge",
        )
    } else {
        (
            "mount -t overlay overlay -o lowerdir=$T,upperdir=$S/up,workdir=$S/work $R",
            "systemd-sysext merge",
            "systemd-sysext unmerge",
        )
    };
    let script = format!(
        "set -e\nmount --make-rprivate /\nS={s}\nT={t}\nR=$S/root\n{mount}\nmount --rbind /dev $R/dev\nmount -t proc proc $R/proc\nmount --rbind /sys $R/sys\nmount -t tmpfs tmpfs $R/run\nrc=0\nchroot $R {merge} || rc=$?\nchroot $R {unmerge} >/dev/null 2>&1 || true\nexit $rc\n",
        s = s.display(),
        t = forky().display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare (util-linux)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// systemd 259 and later read the image policy from sysext.conf's drop-ins, and there
/// nodestrap writes it (no unit drop-in): the real systemd-sysext of Debian 14 refuses a plain
/// image under nodestrap's file and merges it without. A later drop-in of the site's with a
/// weaker policy, which that systemd obeys, makes nodestrap refuse signed mode naming the file,
/// before anything is staged; plain mode takes nodestrap's drop-in away.
#[test]
fn systemd_259_and_later_read_the_policy_nodestrap_writes_to_sysext_conf() {
    const CONF: &str = "/etc/systemd/sysext.conf.d/60-nodestrap-image-policy.conf";
    const UNIT: &str =
        "/etc/systemd/system/systemd-sysext.service.d/50-nodestrap-image-policy.conf";
    let v = systemd_of(&forky());
    assert!(v >= 259, "the Debian 14 root has systemd {v}");
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let mut w = signed_world(&a);
    std::fs::remove_file(w.path("/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-257.so"))
        .unwrap();
    w.write(
        &format!("/usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-{v}.so"),
        "",
    );
    signed_args(&mut w, &a.crt);
    w.run().assert_ok();
    let ours = w.read(CONF).expect("nodestrap's sysext.conf drop-in");
    assert!(w.read(UNIT).is_none(), "no unit drop-in on systemd {v}");
    let policy = decision(&w, "image-policy");
    assert!(
        policy.starts_with("root=signed+absent:usr=signed+absent (") && policy.contains(CONF),
        "{policy}"
    );
    // The real reader: a plain image is refused under nodestrap's drop-in, merged without it.
    let plain = squashfs(
        &w.work,
        "probe",
        ANY,
        &[("usr/bin/probe", "probe".into(), 0o755)],
        0,
    );
    let named = |text: &str| {
        vec![(
            "60-nodestrap-image-policy.conf".to_string(),
            text.to_string(),
        )]
    };
    let (ok, said) = sysext_of_forky(&plain, &named(&ours));
    assert!(
        !ok && said.contains("probe.raw: Image does not match image policy"),
        "systemd {v} under nodestrap's drop-in: {said}"
    );
    let (ok, said) = sysext_of_forky(&plain, &[]);
    assert!(
        ok && said.contains("Using extensions 'probe.raw'"),
        "systemd {v} without it: {said}"
    );
    // The initramfs's merge of the real root (systemd 261 and later) reads the same drop-in
    // from the root it merges, not its own: refused there too, merged without it.
    let (ok, said) = sysext_of_forky_sysroot(&plain, &named(&ours));
    assert!(
        !ok && said.contains("Image does not match image policy"),
        "systemd {v}'s --root=/sysroot refresh under nodestrap's drop-in: {said}"
    );
    let (ok, said) = sysext_of_forky_sysroot(&plain, &[]);
    assert!(
        ok && said.contains("Using extensions 'probe.raw'")
            && said.contains("Merged extensions into '/sysroot/usr'"),
        "systemd {v}'s --root=/sysroot refresh without it: {said}"
    );
    // A site's drop-in sorted after nodestrap's weakens the policy, as systemd shows...
    let weaker =
        "[SysExt]\nImagePolicy=root=unprotected+signed+absent:usr=unprotected+signed+absent\n";
    let mut both = named(&ours);
    both.push(("70-site.conf".into(), weaker.into()));
    let (ok, said) = sysext_of_forky(&plain, &both);
    assert!(
        ok,
        "systemd {v} with a weaker drop-in after nodestrap's: {said}"
    );
    // ...so nodestrap refuses signed mode on such a node, naming it, and stages nothing.
    w.write("/etc/systemd/sysext.conf.d/70-site.conf", weaker);
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let before = support::faults::snapshot_but_records(&w.root);
    let r = w.run();
    r.assert_fails(1, &format!(
        "--sysext-trust signed: the node's own configuration would merge under another image policy than root=signed+absent:usr=signed+absent: {} sets ImagePolicy=root=unprotected+signed+absent:usr=unprotected+signed+absent",
        w.path("/etc/systemd/sysext.conf.d/70-site.conf").display()
    ));
    assert_eq!(support::faults::snapshot_but_records(&w.root), before);
    // A drop-in sorted before nodestrap's is overridden by it, as systemd shows: signed mode
    // goes on.
    let mut both = named(&ours);
    both.push(("40-site.conf".into(), weaker.into()));
    let (ok, said) = sysext_of_forky(&plain, &both);
    assert!(
        !ok && said.contains("Image does not match image policy"),
        "systemd {v} with a weaker drop-in before nodestrap's: {said}"
    );
    std::fs::rename(
        w.path("/etc/systemd/sysext.conf.d/70-site.conf"),
        w.path("/etc/systemd/sysext.conf.d/40-site.conf"),
    )
    .unwrap();
    w.run().assert_ok();
    // Plain mode takes nodestrap's drop-in away.
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.extra = vec![format!("--sysext-verity-certs={}", a.crt.display())];
    w.run().assert_ok();
    assert!(w.read(CONF).is_none());
}

/// On 254 to 258 the policy rides on the command line nodestrap's unit drop-in sets: a site's
/// drop-in applied after it (by name) that sets another command would run the merge without
/// the policy, so signed mode is refused naming it, before anything is staged; one applied
/// before it is overridden by nodestrap's, and signed mode goes on.
#[test]
fn a_unit_drop_in_after_nodestraps_that_sets_another_command_is_refused() {
    let work = unique_dir("keys");
    let a = key(&work, "trusted");
    let mut w = signed_world(&a);
    signed_args(&mut w, &a.crt);
    let site = "/etc/systemd/system/systemd-sysext.service.d/90-site.conf";
    w.write(
        site,
        "[Service]\nExecStart=\nExecStart=systemd-sysext refresh --image-policy=root=verity+signed+absent\n",
    );
    let before = support::faults::snapshot_but_records(&w.root);
    w.run().assert_fails(
        1,
        &format!(
            "image policy than root=signed+absent:usr=signed+absent: {} sets ExecStart=systemd-sysext refresh --image-policy=root=verity+signed+absent; take it away",
            w.path(site).display()
        ),
    );
    assert_eq!(support::faults::snapshot_but_records(&w.root), before);
    std::fs::rename(
        w.path(site),
        w.path("/etc/systemd/system/systemd-sysext.service.d/10-site.conf"),
    )
    .unwrap();
    w.run().assert_ok();
}
