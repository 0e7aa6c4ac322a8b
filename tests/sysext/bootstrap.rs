//! `nodestrap bootstrap --payload sysext` end to end: real squashfs images made with mksquashfs
//! at test time, SHA256SUMS signed with a key made at test time (and checked by gpg, as
//! systemd-sysupdate checks it), served over HTTPS; what nodestrap stages is then merged by the
//! real systemd-sysext of this machine in a private mount namespace. The programs inside the
//! images (`kubelet`, `containerd`) are stand-in scripts that print a version: the real
//! containerd and kubectl are merged in the QEMU scenarios (qemu/harness/sysext.py).
//! Needs root (loop devices and mounts), mksquashfs, gpg, unshare and systemd-sysext.

#[path = "../support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest as _;
use support::*;

const ANY: &str = "ID=_any\nARCHITECTURE=x86-64\nEXTENSION_RELOAD_MANAGER=1\n";
const MAPPINGS: &str =
    "kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.32\":\n      containerd: [\"1.7\"]\n    \"1.31\":\n      containerd: [\"1.7\"]\n";
const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn sha256(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A squashfs sysext image: `extension-release.<release_name>` holding `release`, and `files`
/// (path, content, mode). `pad` bytes of incompressible data make it bigger.
fn squashfs(
    work: &Path,
    release_name: &str,
    release: &str,
    files: &[(&str, String, u32)],
    pad: usize,
) -> Vec<u8> {
    let tree = unique_dir("tree");
    let rel = tree.join("usr/lib/extension-release.d");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join(format!("extension-release.{release_name}")),
        release,
    )
    .unwrap();
    for (p, content, mode) in files {
        let f = tree.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, content).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    if pad > 0 {
        let mut data = Vec::with_capacity(pad);
        let mut h = sha2::Sha512::digest(release.as_bytes()).to_vec();
        while data.len() < pad {
            h = sha2::Sha512::digest(&h).to_vec();
            data.extend_from_slice(&h);
        }
        std::fs::create_dir_all(tree.join("usr/share/pad")).unwrap();
        std::fs::write(tree.join("usr/share/pad/data"), data).unwrap();
    }
    let out = work.join(format!(
        "img-{}.raw",
        sha256(release.as_bytes()) + &sha256(format!("{files:?}{pad}").as_bytes())[..8]
    ));
    let st = Command::new("mksquashfs")
        .arg(&tree)
        .arg(&out)
        .args(["-all-root", "-noappend", "-quiet", "-no-progress"])
        .output()
        .expect("mksquashfs (Debian package squashfs-tools) must be installed");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::read(out).unwrap()
}

fn kubernetes(work: &Path, v: &str, release: &str) -> Vec<u8> {
    squashfs(
        work,
        "kubernetes",
        release,
        &[
            ("usr/bin/kubelet", format!("#!/bin/sh\necho 'Kubernetes v{v}'\n"), 0o755),
            (
                "usr/lib/systemd/system/kubelet.service",
                "[Service]\nEnvironmentFile=/etc/kubernetes/kubelet.env\nExecStart=/usr/bin/kubelet\n".into(),
                0o644,
            ),
        ],
        0,
    )
}

fn containerd(work: &Path, v: &str, pad: usize) -> Vec<u8> {
    squashfs(
        work,
        "containerd",
        ANY,
        &[(
            "usr/bin/containerd",
            format!("#!/bin/sh\necho 'containerd github.com/containerd/containerd {v}'\n"),
            0o755,
        )],
        pad,
    )
}

struct World {
    root: PathBuf,
    work: PathBuf,
    files: Server,
    signer: Signer_,
    keyring: PathBuf,
    ca_file: PathBuf,
    extra: Vec<String>,
}

impl NodeRoot for World {
    fn root(&self) -> &Path {
        &self.root
    }
}

impl World {
    /// A Debian 13 node (os-release), cluster v1.32.4 (from the installer's kubelet.env), and a
    /// source offering kubernetes v1.31.9, v1.32.1, v1.32.3 and containerd 1.7.20, 1.7.24.
    fn new() -> World {
        let root = unique_dir("sysroot");
        let work = unique_dir("sysext-work");
        let ca = Ca::new("nodestrap test CA");
        let files = Server::start(&ca.server(), None);
        let signer = Signer_::new("sysext signer <sysext@nodestrap.invalid>");
        let keyring = work.join("keyring.asc");
        std::fs::write(&keyring, signer.keyring()).unwrap();
        let ca_file = work.join("ca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let w = World {
            root,
            work,
            files,
            signer,
            keyring,
            ca_file,
            extra: Vec::new(),
        };
        w.write(
            "/etc/os-release",
            "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nID=debian\nVERSION_ID=\"13\"\n",
        );
        w.write(
            "/etc/kubernetes/installer/kubelet.env",
            "KUBELET_IMAGE_TAG=v1.32.4\n",
        );
        w.write("/etc/kubernetes/installer/runtime-mappings.yaml", MAPPINGS);
        w.publish_versions("kubernetes", &["1.31.9", "1.32.1", "1.32.3"]);
        w.publish_versions("containerd", &["1.7.20", "1.7.24"]);
        w
    }

    /// Make and serve `name`'s images of `versions` (x86-64), signed: the images, in order.
    fn publish_versions(&self, name: &str, versions: &[&str]) -> Vec<(String, Vec<u8>)> {
        let images: Vec<(String, Vec<u8>)> = versions
            .iter()
            .map(|v| {
                let body = match name {
                    "kubernetes" => kubernetes(&self.work, v, ANY),
                    _ => containerd(&self.work, v, 0),
                };
                (format!("{name}-v{v}-x86-64.raw"), body)
            })
            .collect();
        self.publish(name, &images, "");
        images
    }

    /// Serve `images` of `name` with a SHA256SUMS (plus `extra` lines) signed by the world's key.
    fn publish(&self, name: &str, images: &[(String, Vec<u8>)], extra: &str) -> String {
        let mut sums = String::new();
        for (f, b) in images {
            sums.push_str(&format!("{}  {f}\n", sha256(b)));
            self.files
                .set(&format!("/ext/{name}/{f}"), Reply::ok(b.clone()));
        }
        sums.push_str(extra);
        self.files
            .set(&format!("/ext/{name}/SHA256SUMS"), Reply::ok(sums.clone()));
        self.files.set(
            &format!("/ext/{name}/SHA256SUMS.gpg"),
            Reply::ok(self.signer.sign_binary(sums.as_bytes())),
        );
        sums
    }

    fn link(&self, name: &str) -> Option<String> {
        std::fs::read_link(self.path(&format!("/etc/extensions/{name}.raw")))
            .ok()
            .map(|p| p.display().to_string())
    }

    fn store(&self, name: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(&format!("/opt/extensions/{name}")))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn args_for(&self, root: &str) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "bootstrap".into(),
            format!("--root={root}"),
            "--payload=sysext".into(),
            format!("--sysext-url={}", self.files.url("/ext/${NAME}")),
            format!("--keyring={}", self.keyring.display()),
            format!("--ca-file={}", self.ca_file.display()),
            "--kubeconfig=".into(),
            "--fetch-attempts=2".into(),
            "--fetch-backoff-ms=10".into(),
        ];
        a.extend(self.extra.iter().cloned());
        a
    }

    fn run(&self) -> Run {
        nodestrap(&self.args_for(&self.root.display().to_string()), None, &[])
    }

    /// The failure contract: nothing in the store or the search directory, no marker.
    fn assert_nothing_staged(&self) {
        assert_eq!(self.store("kubernetes"), Vec::<String>::new());
        assert_eq!(self.store("containerd"), Vec::<String>::new());
        assert!(self.link("kubernetes").is_none() && self.link("containerd").is_none());
        assert!(self.read("/etc/kubernetes/kubelet.env").is_none());
    }
}

/// Run `script` with sh in a private mount namespace laid out as systemd-sysext needs it (found
/// by trying it on Debian 12's systemd 252): `/` shared inside the namespace, a tmpfs on /run,
/// and overlays on /etc and /var/lib so that nothing of the host changes; `opt` is bound on
/// /opt.
fn in_namespace(opt: &Path, script: &str, env: &[(&str, &str)]) -> (bool, String) {
    let scratch = unique_dir("ns");
    let prelude = format!(
        "set -e\nS={s}\nmount --make-rshared /\nmount -t tmpfs tmpfs $S\nmkdir -p $S/eu/extensions $S/ew $S/vu $S/vw\nmount -t tmpfs tmpfs /run\nmount -t overlay overlay -o lowerdir=/etc,upperdir=$S/eu,workdir=$S/ew /etc\nmount -t overlay overlay -o lowerdir=/var/lib,upperdir=$S/vu,workdir=$S/vw /var/lib\nmount --bind {opt} /opt\n",
        s = scratch.display(),
        opt = opt.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{prelude}{script}"))
        .envs(env.iter().copied())
        .output()
        .expect("unshare (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
    (out.status.success(), text)
}

#[test]
fn initramfs_staging_is_merged_by_the_real_systemd_sysext() {
    let w = World::new();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("nodestrap: sysext done k8s=v1.32.4 kubernetes=v1.32.3 containerd=v1.7.24 activation=staged"),
        "{}",
        r.stdout
    );
    // Decisions and their sources are logged.
    for needle in [
        "from KUBELET_IMAGE_TAG in",
        "good signature by",
        "kubernetes v1.32.3 chosen for a v1.32.4 cluster (newest patch of the cluster's minor 1.32",
        "containerd v1.7.24 chosen (mapped for Kubernetes v1.32.4 by",
        "contents checked",
    ] {
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    }
    assert_eq!(w.store("kubernetes"), vec!["kubernetes-v1.32.3-x86-64.raw"]);
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    assert_eq!(
        w.link("containerd").as_deref(),
        Some("/opt/extensions/containerd/containerd-v1.7.24-x86-64.raw")
    );
    // No systemd-sysupdate files: nothing would run them (docs/bootstrap.md).
    assert!(!w.path("/etc/sysupdate.kubernetes.d").exists());
    assert!(w
        .read("/etc/kubernetes/kubelet.env")
        .unwrap()
        .contains("KUBELET_VERSION=v1.32.3"));
    // The status record kept under the root: each choice with its source, each image with the
    // digest the signed list gave.
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(
        (&rec["state"], &rec["phase"]),
        (&"done".into(), &"done".into())
    );
    let decided = |what: &str| {
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["what"] == what)
            .map(|d| (d["value"].to_string(), d["source"].to_string()))
            .unwrap_or_else(|| panic!("no {what} in {rec:#}"))
    };
    assert_eq!(decided("k8s").0, "\"v1.32.4\"");
    let (v, src) = decided("kubernetes");
    assert_eq!(v, "\"v1.32.3\"");
    assert!(
        src.contains("/SHA256SUMS (newest patch of the cluster's minor 1.32"),
        "{src}"
    );
    assert_eq!(decided("containerd").0, "\"v1.7.24\"");
    assert_eq!(decided("activation").0, "\"staged\"");
    // Both images, each with the SHA-256 of the file now in place.
    let mut files: Vec<(String, String)> = rec["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap().to_string();
            let on_disk = std::fs::read(w.path(&path)).unwrap();
            assert_eq!(
                f["digest"],
                format!("sha256-{}", sha256(&on_disk)),
                "{path}"
            );
            (path, f["digest"].as_str().unwrap().to_string())
        })
        .collect();
    files.sort();
    assert_eq!(
        files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        [
            "/opt/extensions/containerd/containerd-v1.7.24-x86-64.raw",
            "/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw"
        ]
    );
    assert_eq!(rec["reboot"]["decision"], "no");

    // The real consumer: this machine's systemd-sysext merges the staged layout.
    let (ok, out) = in_namespace(
        &w.path("/opt"),
        &format!(
            "cp -a {}/. /etc/extensions/\nsystemd-sysext merge\nsystemd-sysext status --json=short\necho; findmnt -n -o FSTYPE /usr\nkubelet --version\ncontainerd --version\n",
            w.path("/etc/extensions").display()
        ),
        &[],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains(r#""extensions":["containerd","kubernetes"]"#),
        "{out}"
    );
    assert!(
        out.contains(
            "overlay\nKubernetes v1.32.3\ncontainerd github.com/containerd/containerd 1.7.24"
        ),
        "{out}"
    );
}

#[test]
fn live_refresh_merges_reloads_and_proves_the_version() {
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    // The node is this machine's root inside the namespace: Debian 12 (systemd 252).
    let opt = unique_dir("opt");
    let installer = w.path("/etc/kubernetes/installer/kubelet.env");
    let mappings = w.path("/etc/kubernetes/installer/runtime-mappings.yaml");
    let env_out = unique_dir("env").join("kubelet.env");
    let mut args = w.args_for("/");
    args.extend([
        format!("--installer-kubelet-env={}", installer.display()),
        format!("--version-manifest={}", mappings.display()),
        format!("--kubelet-env-path={}", env_out.display()),
    ]);
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    // Twice: the second run finds everything merged and restarts nothing.
    let (ok, out) = in_namespace(
        &opt,
        &format!(
            "{b} {a}\nsystemd-sysext status --json=short\necho\nkubelet --version\necho second run\n{b} {a} 2>&1\necho second run ends\n",
            b = bin(),
            a = quoted.join(" ")
        ),
        &[("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)],
    );
    assert!(ok, "{out}");
    // What runs from the images that changed is restarted, once, after the merge.
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap_or_default(),
        "TryRestartUnit kubelet.service replace\nTryRestartUnit containerd.service replace\n",
        "{out}"
    );
    let second = out
        .split("second run\n")
        .nth(1)
        .and_then(|r| r.split("second run ends").next())
        .unwrap_or_default();
    // ... nor touches /usr: already merged at the chosen versions.
    assert!(
        second.contains("already links to")
            && second.contains("activation=unchanged")
            && !second.contains("restarted")
            && !second.contains("systemd-sysext refresh"),
        "{second}"
    );
    for needle in [
        "systemd reloaded: units inside the extensions are visible",
        "kubernetes merged into /usr: /usr/bin/kubelet --version says Kubernetes v1.32.3",
        "containerd merged into /usr",
        "nodestrap: sysext done k8s=v1.32.4 kubernetes=v1.32.3 containerd=v1.7.24 activation=merged",
        r#""extensions":["containerd","kubernetes"]"#,
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert!(std::fs::read_to_string(&env_out)
        .unwrap()
        .contains("KUBELET_VERSION=v1.32.3"));
}

/// A zero-length image, its empty SHA-256 duly signed, is called empty (in either trust mode),
/// never a plain image or an unknown file system.
#[test]
fn an_empty_image_is_refused_as_empty() {
    let w = World::new();
    w.publish(
        "kubernetes",
        &[("kubernetes-v1.32.3-x86-64.raw".to_string(), Vec::new())],
        "",
    );
    let r = w.run();
    r.assert_fails(
        1,
        "kubernetes-v1.32.3-x86-64.raw refused: it is empty (0 bytes): no file system, no DDI",
    );
    w.assert_nothing_staged();
}

#[test]
fn a_tampered_list_stages_nothing() {
    let w = World::new();
    let sums = w.files.url("/ext/kubernetes/SHA256SUMS");
    // Signed, then changed: one digest swapped.
    let good = format!("{EMPTY_SHA}  kubernetes-v1.32.3-x86-64.raw\n");
    let sig = w.signer.sign_binary(good.as_bytes());
    w.files.set(
        "/ext/kubernetes/SHA256SUMS",
        Reply::ok(good.replace("e3b0", "e3b1")),
    );
    w.files
        .set("/ext/kubernetes/SHA256SUMS.gpg", Reply::ok(sig.clone()));
    w.run()
        .assert_fails(1, &format!("{sums}: signature check against keyring"));
    w.assert_nothing_staged();
    // gpg, which systemd-sysupdate uses, refuses it too, and takes the untampered list.
    let dir = unique_dir("gpg");
    std::fs::write(dir.join("SHA256SUMS"), good.replace("e3b0", "e3b1")).unwrap();
    std::fs::write(dir.join("SHA256SUMS.gpg"), &sig).unwrap();
    let gpg = |d: &Path| {
        let home = unique_dir("gnupg");
        let ring = home.join("ring.gpg");
        let imp = Command::new("gpg")
            .args(["--batch", "--no-default-keyring", "--homedir"])
            .arg(&home)
            .arg("--keyring")
            .arg(&ring)
            .arg("--import")
            .arg(&w.keyring)
            .output()
            .expect("gpg");
        assert!(imp.status.success());
        Command::new("gpg")
            .args([
                "--batch",
                "--no-default-keyring",
                "--trust-model=always",
                "--homedir",
            ])
            .arg(&home)
            .arg("--keyring")
            .arg(&ring)
            .arg("--verify")
            .arg(d.join("SHA256SUMS.gpg"))
            .arg(d.join("SHA256SUMS"))
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(!gpg(&dir));
    std::fs::write(dir.join("SHA256SUMS"), &good).unwrap();
    assert!(gpg(&dir));
}

#[test]
fn a_list_past_its_best_before_date_is_refused() {
    let w = World::new();
    let k = vec![(
        "kubernetes-v1.32.3-x86-64.raw".to_string(),
        kubernetes(&w.work, "1.32.3", ANY),
    )];
    w.publish(
        "kubernetes",
        &k,
        &format!("{EMPTY_SHA}  BEST-BEFORE-2020-01-31\n"),
    );
    w.run()
        .assert_fails(1, "out of date: its BEST-BEFORE-2020-01-31 marker passed");
    w.assert_nothing_staged();
    // A future date is fine; an armored signature under .asc is taken when there is no .gpg.
    let sums = w.publish(
        "kubernetes",
        &k,
        &format!("{EMPTY_SHA}  BEST-BEFORE-2999-01-31\n"),
    );
    w.files
        .set("/ext/kubernetes/SHA256SUMS.gpg", Reply::status(404));
    w.files.set(
        "/ext/kubernetes/SHA256SUMS.asc",
        Reply::ok(w.signer.sign(sums.as_bytes())),
    );
    w.run().assert_ok();
}

#[test]
fn a_wrong_digest_leaves_no_file() {
    let w = World::new();
    let k = kubernetes(&w.work, "1.32.3", ANY);
    w.publish(
        "kubernetes",
        &[("kubernetes-v1.32.3-x86-64.raw".into(), k)],
        "",
    );
    w.files.set(
        "/ext/kubernetes/kubernetes-v1.32.3-x86-64.raw",
        Reply::ok(kubernetes(&w.work, "1.32.9", ANY)),
    );
    w.run().assert_fails(1, "hash mismatch: computed sha256-");
    w.assert_nothing_staged();
    // No temp file, and not even the directories the run made for it.
    assert!(!w.path("/opt").exists(), "the store the run made is gone");
    assert!(!w.path("/etc/extensions").exists());
}

#[test]
fn images_systemd_sysext_would_refuse_are_refused_first_and_the_previous_stays() {
    let w = World::new();
    // A first bootstrap on a 1.31 cluster.
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.31.2\n",
    );
    w.run().assert_ok();
    let before = w.link("kubernetes");
    assert_eq!(
        before.as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw")
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.32.4\n",
    );
    // (image name, extension-release, extra files (path, content, mode), the refusal).
    type Extra = Vec<(&'static str, String, u32)>;
    let cases: [(&str, &str, Extra, &str); 5] = [
        (
            "kubernetes",
            "ID=fedora\nVERSION_ID=40\n",
            vec![],
            "extension 'kubernetes' is for OS 'fedora', but deployed on top of 'debian'",
        ),
        (
            "kubernetes",
            "ID=_any\nARCHITECTURE=arm64\n",
            vec![],
            "is for architecture 'arm64', but deployed on top of 'x86-64'",
        ),
        (
            "kubernetes",
            "ID=debian\nVERSION_ID=12\n",
            vec![],
            "is for OS '12', but deployed on top of '13'",
        ),
        (
            "other",
            ANY,
            vec![],
            "it has no /usr/lib/extension-release.d/extension-release.kubernetes",
        ),
        (
            "kubernetes",
            ANY,
            vec![("opt/k/bin", "x".to_string(), 0o644)],
            "it ships /opt",
        ),
    ];
    for (rel_name, release, files, needle) in cases {
        let img = squashfs(&w.work, rel_name, release, &files, 0);
        w.publish(
            "kubernetes",
            &[("kubernetes-v1.32.3-x86-64.raw".into(), img)],
            "",
        );
        w.run().assert_fails(1, needle);
        assert_eq!(w.link("kubernetes"), before, "{needle}");
        assert_eq!(
            w.store("kubernetes"),
            vec!["kubernetes-v1.31.9-x86-64.raw"],
            "{needle}"
        );
        assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    }
    // Not a file system at all.
    w.publish(
        "kubernetes",
        &[("kubernetes-v1.32.3-x86-64.raw".into(), vec![7u8; 8192])],
        "",
    );
    w.run()
        .assert_fails(1, "not a squashfs, erofs or ext4 file system");
    // An erofs image is taken as systemd-sysext takes it.
    let tree = unique_dir("erofs");
    std::fs::create_dir_all(tree.join("usr/lib/extension-release.d")).unwrap();
    std::fs::write(
        tree.join("usr/lib/extension-release.d/extension-release.kubernetes"),
        ANY,
    )
    .unwrap();
    let img = w.work.join("erofs.raw");
    let st = Command::new("mkfs.erofs")
        .arg(&img)
        .arg(&tree)
        .output()
        .expect("mkfs.erofs (erofs-utils)");
    assert!(st.status.success());
    w.publish(
        "kubernetes",
        &[(
            "kubernetes-v1.32.3-x86-64.raw".into(),
            std::fs::read(&img).unwrap(),
        )],
        "",
    );
    w.run().assert_ok();
}

#[test]
fn the_user_opt_out_and_flatcar_runtimes_are_respected() {
    let w = World::new();
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink("/dev/null", w.path("/etc/extensions/containerd.raw")).unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("kubernetes=v1.32.3 containerd=masked"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("containerd not staged: the user opted out"),
        "{}",
        r.stderr
    );
    assert_eq!(w.link("containerd").as_deref(), Some("/dev/null"));
    assert!(w.store("containerd").is_empty());

    // Flatcar's own containerd is active: the bakery's is not merged over it.
    let w = World::new();
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/share/flatcar/sysext/containerd-flatcar.raw",
        w.path("/etc/extensions/containerd-flatcar.raw"),
    )
    .unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("containerd=flatcar"), "{}", r.stdout);
    assert!(w.link("containerd").is_none());
    assert_eq!(
        w.link("containerd-flatcar").as_deref(),
        Some("/usr/share/flatcar/sysext/containerd-flatcar.raw")
    );
}

#[test]
fn a_cluster_one_minor_newer_switches_keeps_old_ones_and_prunes() {
    let w = World::new();
    // Older versions from earlier boots.
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.31.2\n",
    );
    w.run().assert_ok();
    for v in ["1.29.1", "1.30.4"] {
        std::fs::write(
            w.path(&format!(
                "/opt/extensions/kubernetes/kubernetes-v{v}-x86-64.raw"
            )),
            kubernetes(&w.work, v, ANY),
        )
        .unwrap();
    }
    // The transfer files an earlier nodestrap wrote go; the admin's own stay.
    seed_old_transfers(&w);
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.32.0\n",
    );
    let r = w.run();
    r.assert_ok();
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    // Three kept: the new one, and the two newest older ones.
    assert_eq!(
        w.store("kubernetes"),
        vec![
            "kubernetes-v1.30.4-x86-64.raw",
            "kubernetes-v1.31.9-x86-64.raw",
            "kubernetes-v1.32.3-x86-64.raw"
        ]
    );
    let left: Vec<String> = std::fs::read_dir(w.path("/etc/sysupdate.kubernetes.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["kubernetes-mine.transfer"], "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "kubernetes-v1.31.transfer: nodestrap no longer writes systemd-sysupdate files"
        ),
        "{}",
        r.stderr
    );
}

/// What nodestrap before this version wrote in /etc/sysupdate.kubernetes.d (a transfer file
/// and its `.conf` copy, first line its mark), beside a transfer file of the admin's own.
fn seed_old_transfers(w: &World) {
    let old = "# Written by nodestrap: kubernetes follows the v1.31 patch stream of https://x/\n[Transfer]\nVerify=yes\n";
    w.write("/etc/sysupdate.kubernetes.d/kubernetes-v1.31.transfer", old);
    w.write("/etc/sysupdate.kubernetes.d/kubernetes-v1.31.conf", old);
    w.write(
        "/etc/sysupdate.kubernetes.d/kubernetes-mine.transfer",
        "[Transfer]\nVerify=yes\n",
    );
}

#[test]
fn version_skew_decides_and_none_names_the_offer() {
    let w = World::new();
    // 1.34: no 1.34 or 1.33 image; 1.32 is two minors older and allowed.
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.34.1\n",
    );
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s: {}\n",
    );
    // The node's OS ships its runtime: the mappings need not name one.
    w.write("/usr/bin/containerd", "#!/bin/sh\n");
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("offers no 1.34; 1.32 is 2 minor(s) older than the API server"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains("kubernetes=v1.32.3 runtime=os"),
        "{}",
        r.stdout
    );
    // 1.36: nothing within three minors.
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.36.0\n",
    );
    w.run().assert_fails(1, "no Kubernetes image for a 1.36 cluster: a kubelet must be 1.36 or at most 3 minors older, and https://127.0.0.1");
    w.run().assert_fails(1, "offers v1.31.9, v1.32.1, v1.32.3");
    w.assert_nothing_staged();
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let mut w = World::new();
    w.extra.push("--dry-run".into());
    let r = w.run();
    r.assert_ok();
    for needle in [
        "plan: fetch https://127.0.0.1",
        "/ext/kubernetes/kubernetes-v1.32.3-x86-64.raw -> /opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw",
        "plan: leave the merge to the real root's systemd-sysext at boot",
        "KUBELET_VERSION=v1.32.3",
        "nodestrap: sysext planned k8s=v1.32.4 kubernetes=v1.32.3 containerd=v1.7.24",
    ] {
        assert!(r.stdout.contains(needle), "{needle}: {}", r.stdout);
    }
    assert!(!w.path("/opt/extensions").exists());
    w.assert_nothing_staged();
}

/// The payload chosen in the node's config file, as Ignition writes it (`payload` on one line,
/// its source on the next): the rule between the two is checked once both are read.
#[test]
fn the_config_file_chooses_the_sysext_payload() {
    let w = World::new();
    w.write(
        "/etc/nodestrap/keyring.asc",
        &std::fs::read_to_string(&w.keyring).unwrap(),
    );
    w.write(
        "/etc/nodestrap/ca.pem",
        &std::fs::read_to_string(&w.ca_file).unwrap(),
    );
    let conf = format!(
        "payload=sysext\nsysext-url={}\nkeyring=/etc/nodestrap/keyring.asc\n\
         ca-file=/etc/nodestrap/ca.pem\nkubeconfig=\nfetch-attempts=2\n",
        w.files.url("/ext/${NAME}")
    );
    w.write("/etc/nodestrap/bootstrap.conf", &conf);
    let root = format!("--root={}", w.root.display());
    let r = nodestrap(
        &["bootstrap".into(), root.clone(), "--dry-run".into()],
        None,
        &[],
    );
    r.assert_ok();
    assert!(
        r.stdout.contains(
            "nodestrap: sysext planned k8s=v1.32.4 kubernetes=v1.32.3 containerd=v1.7.24"
        ),
        "{}",
        r.stdout
    );
    // Without its source the payload is refused before anything is read, naming both options.
    w.write("/etc/nodestrap/bootstrap.conf", "payload=sysext\n");
    nodestrap(&["bootstrap".into(), root, "--dry-run".into()], None, &[])
        .assert_fails(2, "--payload sysext needs --sysext-url");
    w.assert_nothing_staged();
}

#[test]
fn a_full_or_read_only_target_is_refused_with_the_numbers() {
    let w = World::new();
    let c = vec![(
        "containerd-v1.7.24-x86-64.raw".to_string(),
        containerd(&w.work, "1.7.24", 3 << 20),
    )];
    w.publish("containerd", &c, "");
    let quoted: Vec<String> = w
        .args_for(&w.root.display().to_string())
        .iter()
        .map(|a| format!("'{a}'"))
        .collect();
    let store = w.path("/opt/extensions/containerd");
    std::fs::create_dir_all(&store).unwrap();
    let (ok, out) = in_namespace(
        &unique_dir("opt"),
        &format!(
            "mount -t tmpfs -o size=2m tmpfs {}\n{} {}",
            store.display(),
            bin(),
            quoted.join(" ")
        ),
        &[],
    );
    assert!(!ok);
    assert!(out.contains("not enough space for"), "{out}");
    assert!(
        out.contains("32 MiB") || out.contains("33554432 more are kept free"),
        "{out}"
    );
    let (ok, out) = in_namespace(
        &unique_dir("opt"),
        &format!(
            "mount -t tmpfs -o ro tmpfs {}\n{} {}",
            store.display(),
            bin(),
            quoted.join(" ")
        ),
        &[],
    );
    assert!(!ok);
    assert!(
        out.contains("is read-only: is an extension that ships /opt merged over it?"),
        "{out}"
    );
}

#[test]
fn a_merge_that_does_not_prove_itself_is_rolled_back() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.systemd(&[]);
    // v1.32.3's image carries a kubelet that says v1.32.9: systemd-sysext merges it, but the
    // merged binary is not the version chosen.
    let k = vec![
        (
            "kubernetes-v1.31.9-x86-64.raw".to_string(),
            kubernetes(&w.work, "1.31.9", ANY),
        ),
        (
            "kubernetes-v1.32.3-x86-64.raw".to_string(),
            kubernetes(&w.work, "1.32.9", ANY),
        ),
    ];
    w.publish("kubernetes", &k, "");
    let opt = unique_dir("opt");
    let env_dir = unique_dir("env");
    // The runtime goes with it (a node is never done without one): containerd 1.7.24, the
    // same for both minors, so only kubernetes changes between the runs.
    let mappings = env_dir.join("mappings.yaml");
    std::fs::write(&mappings, MAPPINGS).unwrap();
    let run = |tag: &str| {
        let installer = env_dir.join(format!("installer-{tag}.env"));
        std::fs::write(&installer, format!("KUBELET_IMAGE_TAG={tag}\n")).unwrap();
        let mut args = w.args_for("/");
        args.extend([
            format!("--installer-kubelet-env={}", installer.display()),
            format!("--version-manifest={}", mappings.display()),
            format!(
                "--kubelet-env-path={}",
                env_dir.join("kubelet.env").display()
            ),
        ]);
        let q: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        format!("{} {}", bin(), q.join(" "))
    };
    let (ok, out) = in_namespace(
        &opt,
        &format!(
            "{}\nrm {}\nif {}; then echo SECOND-OK; fi\nreadlink /etc/extensions/kubernetes.raw\nkubelet --version\n",
            run("v1.31.2"),
            env_dir.join("kubelet.env").display(),
            run("v1.32.4")
        ),
        &[("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)],
    );
    assert!(ok, "{out}");
    assert!(!out.contains("SECOND-OK"), "{out}");
    for needle in [
        "/usr/bin/kubelet --version after the merge: expected version v1.32.3, got Kubernetes v1.32.9",
        "restored /etc/extensions/kubernetes.raw to /opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw",
        "the previous extensions are merged again",
        "/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw\nKubernetes v1.31.9",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert!(
        !env_dir.join("kubelet.env").exists(),
        "no done marker after a failed merge"
    );
}

// ---------------------------------------------------------------------------------------------
// The fault matrix

/// A node with kubernetes v1.31.9 and containerd 1.7.20 merged (and two older kubernetes
/// versions kept), whose cluster is now v1.32: the next run upgrades kubernetes to v1.32.3 and
/// containerd to 1.7.24.
fn upgrade_world() -> World {
    let w = World::new();
    w.publish_versions("containerd", &["1.7.20"]);
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.31.2\n",
    );
    w.run().assert_ok();
    for v in ["1.29.1", "1.30.4"] {
        std::fs::write(
            w.path(&format!(
                "/opt/extensions/kubernetes/kubernetes-v{v}-x86-64.raw"
            )),
            kubernetes(&w.work, v, ANY),
        )
        .unwrap();
    }
    // As an earlier nodestrap left the node: its sysupdate files, which this run removes.
    seed_old_transfers(&w);
    w.publish_versions("containerd", &["1.7.20", "1.7.24"]);
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.32.4\n",
    );
    // The operator moves this node to the cluster's new minor (a patch run alone stays).
    let mut w = w;
    w.extra.push("--kube-minor=v1.32".into());
    w
}

/// What this machine's systemd-sysext merges from the node's layout: `kubelet --version` and
/// `containerd --version` of the merged /usr (empty lines for what is not there).
fn merged_versions(w: &World) -> String {
    let (ok, out) = in_namespace(
        &w.path("/opt"),
        &format!(
            "cp -a {}/. /etc/extensions/\nsystemd-sysext merge >/dev/null\necho \"kubelet=$(kubelet --version 2>/dev/null) containerd=$(containerd --version 2>/dev/null)\"\n",
            w.path("/etc/extensions").display()
        ),
        &[],
    );
    assert!(ok, "{out}");
    out.lines()
        .rfind(|l| l.starts_with("kubelet="))
        .unwrap_or_default()
        .to_string()
}

/// Issue 26's first report: EIO on the fsync of /etc/extensions right after the new
/// kubernetes.raw link is renamed into place. The run fails, and systemd-sysext merges what was
/// merged before: kubernetes v1.31.9 and containerd 1.7.20.
#[test]
fn a_failed_fsync_after_the_link_switch_keeps_the_merged_kubernetes() {
    let w = upgrade_world();
    let before = merged_versions(&w);
    assert_eq!(
        before,
        "kubelet=Kubernetes v1.31.9 containerd=containerd github.com/containerd/containerd 1.7.20"
    );
    let inner = command(&w.args_for(&w.root.display().to_string()), None);
    let mut c = std::process::Command::new("strace");
    c.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync"])
        .args(["-e", "inject=fsync:error=EIO:when=1", "-P"])
        .arg(w.path("/etc/extensions"))
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
    let r = Run::from(c.output().unwrap());
    r.assert_fails(1, "(os error 5)");
    assert!(
        r.stderr.contains("restored")
            && r.stderr
                .contains("etc/extensions/kubernetes.raw to /opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw"),
        "{}",
        r.stderr
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw")
    );
    assert_eq!(merged_versions(&w), before);
    // Nothing of the failed run stays: not the new images, and the old sysupdate files are
    // still there.
    assert!(!w
        .path("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
        .exists());
    assert!(w
        .path("/etc/sysupdate.kubernetes.d/kubernetes-v1.31.transfer")
        .exists());
    assert!(w
        .read("/etc/kubernetes/kubelet.env")
        .unwrap()
        .contains("v1.31.9"));
    // The next run, on a healthy disk, upgrades.
    w.run().assert_ok();
    assert_eq!(
        merged_versions(&w),
        "kubelet=Kubernetes v1.32.3 containerd=containerd github.com/containerd/containerd 1.7.24"
    );
}

/// A run killed while replacing a link leaves `.kubernetes.raw.nodestrap-<hex>` behind, and one
/// killed mid-download a temp image: the next run removes both (it holds /etc/extensions' lock,
/// so no live run's temp link is taken).
#[test]
fn temp_links_and_files_of_a_killed_run_are_swept() {
    let w = World::new();
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink(
        "/opt/extensions/kubernetes/kubernetes-v1.32.1-x86-64.raw",
        w.path("/etc/extensions/.kubernetes.raw.nodestrap-0123456789ab"),
    )
    .unwrap();
    std::fs::create_dir_all(w.path("/opt/extensions/containerd")).unwrap();
    std::fs::write(
        w.path("/opt/extensions/containerd/.containerd-v1.7.20-x86-64.raw.nodestrap-abcdef012345"),
        "cut short",
    )
    .unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(r.stderr.contains("removed stale temp file"), "{}", r.stderr);
    let mut links: Vec<String> = std::fs::read_dir(w.path("/etc/extensions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    assert_eq!(links, ["containerd.raw", "kubernetes.raw"]);
    assert_eq!(w.store("containerd"), ["containerd-v1.7.24-x86-64.raw"]);
}

/// An upgrade (kubernetes v1.31.9 to v1.32.3, containerd 1.7.20 to 1.7.24, one older kubernetes
/// version pruned, an earlier nodestrap's sysupdate files removed, kubelet.env rewritten) run once
/// per mutating system call from its first rename on, with EIO and with ENOSPC injected there,
/// and once per rename and fsync with SIGKILL on entry. A failed run must leave the node as it
/// was, a run that succeeds as a clean run leaves it; a killed run leaves every file either as
/// it was or as the run meant it (temp names aside), and the next run finishes the job. The
/// status record is the run's report, not node state: it is not compared.
#[test]
fn fault_matrix_of_an_upgrade() {
    use support::faults::*;
    if !native() {
        return;
    }
    let w = upgrade_world();
    let skip = ["var/lib/nodestrap"];
    let pristine = w.work.join("pristine");
    copy_tree(&w.root, &pristine);
    let before = snapshot(&w.root, &skip);
    let cmd = || command(&w.args_for(&w.root.display().to_string()), None);
    let (calls, run) = trace(&cmd(), &w.work.join("trace"));
    run.assert_ok();
    let after = snapshot(&w.root, &skip);
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    assert!(
        !w.path("/opt/extensions/kubernetes/kubernetes-v1.29.1-x86-64.raw")
            .exists(),
        "the clean run prunes"
    );
    assert!(calls.len() > 20, "{calls:#?}");
    matrix(&w.root, &pristine, &w.work, &cmd, &calls, &before, &after);
}

/// A node without the installer's kubelet.env (Flatcar has none): the log says kubelet.env is a
/// new file, not that it came from a file that does not exist.
#[test]
fn the_log_names_kubelet_envs_real_source() {
    let mut w = World::new();
    std::fs::remove_file(w.path("/etc/kubernetes/installer/kubelet.env")).unwrap();
    w.extra.push("--force-kube-version=v1.32.3".into());
    let r = w.run();
    r.assert_ok();
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("wrote") && l.contains("/etc/kubernetes/kubelet.env"))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(
        line.contains("(a new file: there is no ") && !line.contains("(from "),
        "{line}"
    );
    // Again, over the file that run wrote: not a new file.
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("/etc/kubernetes/kubelet.env (written anew, no template: there is no "),
        "{}",
        r.stderr
    );
    // With the installer's file, that file is the source.
    let mut w = World::new();
    w.extra.push("--force-kube-version=v1.32.3".into());
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains("/etc/kubernetes/kubelet.env (from ")
            && r.stderr
                .contains("installer/kubelet.env, setting KUBELET_VERSION)"),
        "{}",
        r.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// An operator's first hour: options that would be ignored, the plan line of a failed run, the
// status of another root and of a killed run, and what killed runs leave behind.

/// An option the chosen payload would ignore is refused (exit 2), naming where it was set and
/// why; one that only turns off what the payload never does is taken, so one initramfs unit
/// serves both payloads. `-h` and `--version` work, and the help is grouped.
#[test]
fn options_of_the_other_payload_are_refused_with_their_source() {
    let w = World::new();
    let root = format!("--root={}", w.root.display());
    // sysext's source without --payload sysext: torcx would run and ignore it.
    let r = nodestrap(
        &[
            "bootstrap".into(),
            root.clone(),
            format!("--sysext-url={}", w.files.url("/ext/${NAME}")),
        ],
        None,
        &[],
    );
    r.assert_fails(
        2,
        "--sysext-url (from the command line) is for --payload sysext, and this run's payload is torcx (from the default)",
    );
    // A torcx option in a drop-in, with the payload from the config file.
    w.write("/etc/nodestrap/bootstrap.conf", "payload=sysext\n");
    w.write(
        "/etc/nodestrap/bootstrap.conf.d/10-profile.conf",
        "torcx-profile=mine\n",
    );
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| x != "--payload=sysext");
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(
        2,
        &format!(
            "--torcx-profile (from {}) is for --payload torcx, and this run's payload is sysext (from {})",
            w.path("/etc/nodestrap/bootstrap.conf.d/10-profile.conf").display(),
            w.path("/etc/nodestrap/bootstrap.conf").display()
        ),
    );
    // Asking a sysext run to update the OS is refused, with the reason.
    std::fs::remove_file(w.path("/etc/nodestrap/bootstrap.conf.d/10-profile.conf")).unwrap();
    let mut up = a.clone();
    up.push("--upgrade-os=true".into());
    nodestrap(&up, None, &[]).assert_fails(2, "not by nodestrap: remove it");
    w.assert_nothing_staged();
    // Turning off what sysext never does is fine (the dracut unit passes --upgrade-os=false),
    // in the one vocabulary of true/false.
    let mut off = a.clone();
    off.extend(["--upgrade-os=false".into(), "--reboot=false".into()]);
    nodestrap(&off, None, &[]).assert_ok();
    // -h and --version.
    let h = nodestrap(&["bootstrap".into(), "-h".into()], None, &[]);
    h.assert_ok();
    assert!(h
        .stdout
        .starts_with("Usage: nodestrap bootstrap [--payload torcx|sysext] [options]\n"));
    for group in [
        "sysext payload (--payload sysext):",
        "Network (the API server and downloads):",
        "Examples:",
        "Node paths are read and written under --root",
    ] {
        assert!(h.stdout.contains(group), "{group} not in\n{}", h.stdout);
    }
    let v = nodestrap(&["--version".into()], None, &[]);
    v.assert_ok();
    assert_eq!(
        v.stdout,
        format!("nodestrap {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// Every run prints its plan line, a failed one too, so that a fleet's `grep from=` counts
/// every node; a settings error also ends with the run's last line.
#[test]
fn failed_runs_print_the_plan_line_and_the_last_line() {
    let w = World::new();
    // (A run that fails after its version is known: errors_name_the_fix.)
    // Fails before: a config file line that is wrong.
    w.write("/etc/nodestrap/bootstrap.conf", "fetch-attempts=many\n");
    let r = w.run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stdout.starts_with("nodestrap: k8s=unknown from=none (")
            && r.stdout.contains("bootstrap.conf:1: fetch-attempts"),
        "{}",
        r.stdout
    );
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("run failed after") && last.ends_with("(exit 2)"),
        "{}",
        r.stderr
    );
}

/// The run dir shared by the runs of one test, apart from every other test's.
fn own_run_dir() -> (PathBuf, String) {
    let d = unique_dir("run");
    let s = d.display().to_string();
    (d, s)
}

/// A run of `args` (status records in `run`) started while `name`'s `image` trickles in (a
/// byte every 5 ms): it stays in its download until killed.
fn held_up(
    w: &World,
    args: &[String],
    run: &str,
    name: &str,
    image: &(String, Vec<u8>),
) -> std::process::Child {
    w.files.set(
        &format!("/ext/{name}/{}", image.0),
        Reply::trickled(image.1.clone(), std::time::Duration::from_millis(5)),
    );
    command(args, None)
        .env("NODESTRAP_RUN_DIR", run)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// `status --root X` shows X's record, never the running system's record of another root; a
/// run whose process is gone reads as interrupted (exit 1), a live one as running (exit 3).
#[test]
fn status_reads_the_roots_own_record_and_knows_a_killed_run() {
    let (_dir, run) = own_run_dir();
    let env = [("NODESTRAP_RUN_DIR", run.as_str())];
    let a = World::new();
    let b = World::new();
    // a's run; then b's, whose record is the one in the run dir.
    nodestrap(&a.args_for(&a.root.display().to_string()), None, &env).assert_ok();
    let mut fail = b.args_for(&b.root.display().to_string());
    fail.push("--force-kube-version=v1.40.0".into());
    nodestrap(&fail, None, &env);
    let st = |root: &Path| {
        nodestrap(
            &[
                "status".into(),
                format!("--root={}", root.display()),
                "--json".into(),
            ],
            None,
            &env,
        )
    };
    let sa = st(&a.root);
    assert_eq!(sa.code, 0, "{}{}", sa.stdout, sa.stderr);
    let rec: serde_json::Value = serde_json::from_str(&sa.stdout).unwrap();
    assert_eq!(rec["root"], a.root.display().to_string());
    assert!(
        sa.stderr.contains("is the record of a run on root"),
        "{}",
        sa.stderr
    );
    let sb = st(&b.root);
    assert_eq!(sb.code, 1, "{}{}", sb.stdout, sb.stderr);
    let rec: serde_json::Value = serde_json::from_str(&sb.stdout).unwrap();
    assert_eq!(rec["root"], b.root.display().to_string());
    assert!(rec["process"]["pid"].as_u64().is_some(), "{rec}");

    // A run held up by a trickling image: running while it runs, interrupted once killed.
    let c = World::new();
    let k = c.publish_versions("kubernetes", &["1.32.3"]);
    let args = c.args_for(&c.root.display().to_string());
    let mut child = held_up(&c, &args, &run, "kubernetes", &k[0]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = st(&c.root);
        if s.code == 3 {
            assert!(s.stdout.contains("\"running\""), "{}", s.stdout);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never running: {}{}",
            s.stdout,
            s.stderr
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let s = nodestrap(
        &["status".into(), format!("--root={}", c.root.display())],
        None,
        &env,
    );
    assert_eq!(s.code, 1, "{}{}", s.stdout, s.stderr);
    assert!(
        s.stdout.contains(": INTERRUPTED in phase ") && s.stdout.contains(": its process"),
        "{}",
        s.stdout
    );
}

/// A download cut short by a kill leaves its temp image (as large as the image) in the store;
/// the next run sweeps it even when it fetches nothing of that extension (here the operator
/// opted out of it meanwhile), and the status record's temps of killed runs go too.
#[test]
fn the_temp_image_of_a_killed_download_goes_whatever_the_next_run_picks() {
    let (_dir, run) = own_run_dir();
    let env = [("NODESTRAP_RUN_DIR", run.as_str())];
    let w = World::new();
    let args = w.args_for(&w.root.display().to_string());
    nodestrap(&args, None, &env).assert_ok();
    assert_eq!(w.store("containerd"), ["containerd-v1.7.24-x86-64.raw"]);
    // A new containerd trickles in; the run is killed mid-download.
    let c = w.publish_versions("containerd", &["1.7.24", "1.7.30"]);
    let mut child = held_up(&w, &args, &run, "containerd", &c[1]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !w
        .store("containerd")
        .iter()
        .any(|n| n.starts_with(".containerd-v1.7.30"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no temp image: {:?}",
            w.store("containerd")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // A record temp of a killed run, as nodestrap names them.
    std::fs::write(format!("{run}/.status.json.nodestrap-0123456789ab"), "{").unwrap();
    // The operator opts out of nodestrap's containerd: the next run never opens its store.
    std::fs::remove_file(w.path("/etc/extensions/containerd.raw")).unwrap();
    std::os::unix::fs::symlink("/dev/null", w.path("/etc/extensions/containerd.raw")).unwrap();
    let r = nodestrap(&args, None, &env);
    r.assert_ok();
    assert!(r.stdout.contains("containerd=masked"), "{}", r.stdout);
    assert_eq!(
        w.store("containerd"),
        ["containerd-v1.7.24-x86-64.raw"],
        "{}",
        r.stderr
    );
    let left: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["status.json"], "{}", r.stderr);
}

/// Every error names the input, the reason and the setting that fixes it: an unsigned list, a
/// directory that is not there, a typo in an option or a config key, and a keyring that is
/// missing (exit 2 wherever the setting was made).
#[test]
fn errors_name_the_fix() {
    let w = World::new();
    // Neither signature.
    w.files
        .set("/ext/kubernetes/SHA256SUMS.gpg", Reply::status(404));
    let r = w.run();
    r.assert_fails(1, "SHA256SUMS is not signed: neither SHA256SUMS.gpg nor SHA256SUMS.asc is beside it (HTTP 404 for both): sign it as systemd-sysupdate reads it");
    // A run that fails after its version is known has printed its plan line.
    assert!(
        r.stdout
            .starts_with("nodestrap: k8s=v1.32.4 from=fallback (KUBELET_IMAGE_TAG in "),
        "{}",
        r.stdout
    );
    // A directory that is not there, answered with a web server's error page.
    w.files.set(
        "/ext/kubernetes/SHA256SUMS",
        Reply {
            body: b"<!DOCTYPE HTML>\n<html><body>Not found</body></html>\n".to_vec(),
            ..Reply::status(404)
        },
    );
    let r = w.run();
    r.assert_fails(
        1,
        "HTTP 404 Not Found: the source has no list for kubernetes where --sysext-url points (",
    );
    assert!(!r.stderr.contains("DOCTYPE"), "{}", r.stderr);
    w.assert_nothing_staged();
    // Typos.
    let mut a = w.args_for(&w.root.display().to_string());
    a.push("--sysext-ur=x".into());
    let r = nodestrap(&a, None, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("Did you mean --sysext-url?"),
        "{}",
        r.stderr
    );
    w.write("/etc/nodestrap/bootstrap.conf", "fetch-attempt=3\n");
    let r = w.run();
    r.assert_fails(
        2,
        "unknown key \"fetch-attempt\": did you mean fetch-attempts?",
    );
    std::fs::remove_file(w.path("/etc/nodestrap/bootstrap.conf")).unwrap();
    // A keyring that is not there: 2 from the command line and from the config file alike.
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| !x.starts_with("--keyring"));
    let mut cl = a.clone();
    cl.push("--keyring=/nonexistent/keyring.asc".into());
    nodestrap(&cl, None, &[]).assert_fails(2, "--keyring /nonexistent/keyring.asc");
    w.write(
        "/etc/nodestrap/bootstrap.conf",
        "keyring=/etc/nodestrap/keyring.asc\n",
    );
    nodestrap(&a, None, &[]).assert_fails(
        2,
        &format!(
            "keyring {} (from {}): does not exist: put it there, or change keyring= in {}",
            w.path("/etc/nodestrap/keyring.asc").display(),
            w.path("/etc/nodestrap/bootstrap.conf").display(),
            w.path("/etc/nodestrap/bootstrap.conf").display()
        ),
    );
    w.assert_nothing_staged();
}

/// docs/try-it.md's block, run as written in an empty folder with nodestrap on PATH.
#[test]
fn the_try_it_page_runs_as_written() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/try-it.md")).unwrap();
    let (_, rest) = page.split_once("<!-- try-it -->\n```sh\n").unwrap();
    let (script, _) = rest.split_once("```\n<!-- /try-it -->").unwrap();
    let dir = unique_dir("try-it");
    let bin_dir = unique_dir("try-it-bin");
    std::os::unix::fs::symlink(bin(), bin_dir.join("nodestrap")).unwrap();
    let (_run, run) = own_run_dir();
    let port = support::cluster::free_port().to_string();
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(&dir)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()))
        .env("HOME", &dir)
        .env("PORT", &port)
        .env("NODESTRAP_RUN_DIR", &run)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for want in [
        "nodestrap: sysext done k8s=v1.32 kubernetes=v1.32.3 runtime=os activation=staged",
        "nodestrap bootstrap 0.1.0: done",
        "KUBELET_VERSION=v1.32.3",
        "signature check against keyring",
        "bootstrap exited 1",
        "FAILED (exit 1) in phase version",
        "status exited 6",
        "running          kubernetes v1.32.3 sha256-",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let links: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("/opt/extensions/kubernetes/"))
        .collect();
    assert_eq!(links.len(), 2, "{text}");
    assert!(links
        .iter()
        .all(|l| l.starts_with("/opt/extensions/kubernetes/kubernetes-v1.32.3-")));

    // As another user (nobody, no capabilities): step 4 stops at once with the documented
    // message and exit 2. Its folder and binary are its own, outside the tests' private folder.
    let dir = PathBuf::from(format!(
        "/tmp/nodestrap-try-it-nobody-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(bin(), dir.join("bin/nodestrap")).unwrap();
    Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(&dir)
        .status()
        .unwrap();
    let port = support::cluster::free_port().to_string();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "bash",
            "-c",
        ])
        .arg(script)
        .current_dir(&dir)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", dir.join("bin").display()),
        )
        .env("HOME", &dir)
        .env("PORT", &port)
        .env("NODESTRAP_RUN_DIR", dir.join("run"))
        .output()
        .expect("setpriv (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2), "{text}");
    let want = "error: nodestrap bootstrap --payload sysext needs CAP_SYS_ADMIN (to mount each image read-only and check it as systemd-sysext will), which this process (uid 65534) does not hold: run it as root, as its units and the initramfs do";
    assert!(text.contains(want), "{text}");
    let page = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        page.contains(&want.replace("uid 65534", "uid 1000")),
        "docs/try-it.md must give the message as it is"
    );
}

/// `--no-verify-signatures` is visible to an audit: the record and `status` carry a
/// `signatures: not verified` decision, and no line calls the list signed. Its twin, the same
/// run with the keyring, records `signatures: verified` and the keyring.
#[test]
fn unverified_signatures_are_recorded_and_never_called_signed() {
    let w = World::new();
    let (_dir, run) = own_run_dir();
    let env = [("NODESTRAP_RUN_DIR", run.as_str())];
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| !x.starts_with("--keyring="));
    a.push("--no-verify-signatures".into());
    let r = nodestrap(&a, None, &env);
    r.assert_ok();
    assert!(
        r.stderr
            .contains("SHA-256 matches the unverified SHA256SUMS"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("signed SHA256SUMS"), "{}", r.stderr);
    let st = |json: bool| {
        let mut a = vec!["status".to_string(), format!("--root={}", w.root.display())];
        if json {
            a.push("--json".into());
        }
        nodestrap(&a, None, &env)
    };
    let rec: serde_json::Value = serde_json::from_str(&st(true).stdout).unwrap();
    let sig = rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["what"] == "signatures")
        .unwrap_or_else(|| panic!("no signatures decision in {rec:#}"));
    assert_eq!(
        (&sig["value"], &sig["source"]),
        (&"not verified".into(), &"--no-verify-signatures".into())
    );
    let shown = st(false).stdout;
    assert!(
        shown
            .lines()
            .any(|l| l.contains("signatures") && l.contains("not verified")),
        "{shown}"
    );
    // The twin: checked against the keyring.
    w.run().assert_ok();
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    let sig = rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["what"] == "signatures")
        .unwrap();
    assert_eq!(sig["value"], "verified");
    assert!(
        sig["source"].as_str().unwrap().starts_with("keyring "),
        "{sig}"
    );
}

/// A bootstrapped node takes patches of the minor it runs only, whatever minor the cluster has
/// moved to: a new minor is the operator's act (`--kube-minor`, after draining the node), and
/// the runtime mapped for that minor comes with it. `--kube-minor` above the cluster's minor is
/// refused, as is a malformed one.
#[test]
fn the_patch_stream_stays_at_the_nodes_minor_until_the_operator_moves_it() {
    let mut w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.32\":\n      containerd: [\"1.7.24\"]\n    \"1.31\":\n      containerd: [\"1.7.20\"]\n",
    );
    let cluster = |v: &str| {
        w.write(
            "/etc/kubernetes/installer/kubelet.env",
            &format!("KUBELET_IMAGE_TAG={v}\n"),
        )
    };
    cluster("v1.31.2");
    w.run().assert_ok();
    let running = |w: &World| w.read("/etc/kubernetes/kubelet.env").unwrap();
    assert!(
        running(&w).contains("KUBELET_VERSION=v1.31.9"),
        "{}",
        running(&w)
    );

    // The cluster moves to 1.32: the node stays at 1.31, and says how to move it.
    cluster("v1.32.4");
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains("staying at v1.31 (the minor it runs, KUBELET_VERSION in ")
            && r.stderr.contains("while the cluster is at v1.32.4: patches of v1.31 only; to move this node, drain it, then run with --kube-minor v1.32"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains("kubernetes=v1.31.9 containerd=v1.7.20"),
        "{}",
        r.stdout
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw")
    );
    // A new patch of its minor is taken.
    w.publish_versions("kubernetes", &["1.31.9", "1.31.10", "1.32.1", "1.32.3"]);
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("kubernetes=v1.31.10"), "{}", r.stdout);

    // The operator's act: malformed, or above the cluster, refused before anything changes.
    w.extra.push("--kube-minor=1.32".into());
    w.run().assert_fails(
        2,
        "--kube-minor \"1.32\": expected a Kubernetes minor like v1.33",
    );
    w.extra.pop();
    w.extra.push("--kube-minor=v1.33".into());
    w.run().assert_fails(
        2,
        "--kube-minor v1.33 is newer than the cluster's v1.32.4: a kubelet is never newer than its API server",
    );
    assert!(
        running(&w).contains("KUBELET_VERSION=v1.31.10"),
        "{}",
        running(&w)
    );
    // Moved to 1.32: its newest patch, and the runtime the mappings give 1.32.
    w.extra.pop();
    w.extra.push("--kube-minor=v1.32".into());
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("moving this node from v1.31 to v1.32 (--kube-minor)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains("kubernetes=v1.32.3 containerd=v1.7.24"),
        "{}",
        r.stdout
    );
    assert!(
        running(&w).contains("KUBELET_VERSION=v1.32.3"),
        "{}",
        running(&w)
    );
}

/// A node whose runtime is masked (Flatcar's) or absent, and whose mappings name none for the
/// cluster's minor, is refused before anything changes, naming the minor and the mapping that is
/// missing (exit 2: only the operator can fix it). Its twins: the same mappings on a node whose
/// OS ships containerd, or with Flatcar's containerd active, are done.
#[test]
fn a_node_without_a_runtime_is_refused_before_anything_changes() {
    let w = World::new();
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.35\":\n      containerd: [\"2.0\"]\n    \"1.36\":\n      containerd: [\"2.0\"]\n",
    );
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink(
        "/dev/null",
        w.path("/etc/extensions/containerd-flatcar.raw"),
    )
    .unwrap();
    let r = w.run();
    r.assert_fails(2, "no container runtime for Kubernetes v1.32.4: ");
    for needle in [
        "runtime-mappings.yaml maps no containerd or docker for 1.32 (it maps 1.35, 1.36)",
        "the node has none of its own (Flatcar's containerd-flatcar and docker-flatcar are not active in",
        "add a \"1.32\" entry naming containerd's streams to",
    ] {
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    }
    assert!(!r.stdout.contains("sysext done"), "{}", r.stdout);
    w.assert_nothing_staged();
    // No mappings at all: the same refusal, naming the missing file.
    std::fs::remove_file(w.path("/etc/kubernetes/installer/runtime-mappings.yaml")).unwrap();
    w.run().assert_fails(
        2,
        "runtime-mappings.yaml does not exist, and the node has none of its own",
    );
    w.assert_nothing_staged();

    // The twin: the node's OS ships containerd.
    w.write("/usr/bin/containerd", "#!/bin/sh\n");
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("runtime=os"), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("no runtime extension staged: the node's OS ships"),
        "{}",
        r.stderr
    );

    // The other twin: Flatcar's own containerd active.
    let w = World::new();
    std::fs::remove_file(w.path("/etc/kubernetes/installer/runtime-mappings.yaml")).unwrap();
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/share/flatcar/sysext/containerd-flatcar.raw",
        w.path("/etc/extensions/containerd-flatcar.raw"),
    )
    .unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("runtime=flatcar"), "{}", r.stdout);
}

/// URL templates take their own placeholders only: another spelling, or the empty segment a
/// shell leaves of `${NAME}` in double quotes, is refused at the option check (exit 2) with the
/// accepted forms, before anything is fetched. The twin with `${NAME}` is done.
#[test]
fn a_url_template_of_another_spelling_is_refused_at_the_option_check() {
    let w = World::new();
    let base = w.files.url("/ext/");
    for (template, needle) in [
        (
            format!("{base}{{NAME}}/"),
            "an unknown placeholder at \"{NAME}/\"",
        ),
        (
            format!("{base}$NAME/"),
            "an unknown placeholder at \"$NAME/\"",
        ),
        (format!("{base}%n/"), "an unknown placeholder at \"%n/\""),
        (format!("{base}/"), "an empty path segment"),
    ] {
        let mut a = w.args_for(&w.root.display().to_string());
        a.retain(|x| !x.starts_with("--sysext-url="));
        a.push(format!("--sysext-url={template}"));
        let r = nodestrap(&a, None, &[]);
        r.assert_fails(2, needle);
        assert!(
            r.stderr
                .contains("the accepted placeholders are ${NAME} {{.Name}}"),
            "{}",
            r.stderr
        );
        assert!(
            w.files.seen().is_empty(),
            "{template}: fetched {:?}",
            w.files.seen().len()
        );
        w.assert_nothing_staged();
    }
    w.run().assert_ok();
}

// ---------------------------------------------------------------------------------------------
// A node that has not joined: its version from the real API server it will join

/// The sysext world with images of the real API server's minor (v1.37, from
/// qemu/build-kubernetes) and no kubeconfig: the node has not joined.
fn joining_world() -> World {
    let w = World::new();
    w.publish_versions("kubernetes", &["1.36.4", "1.37.0", "1.37.2"]);
    w.write(
        "/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.37\":\n      containerd: [\"1.7\"]\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/installer/kubelet.env")).unwrap();
    w
}

fn args_without_kubeconfig(w: &World) -> Vec<String> {
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| x != "--kubeconfig=");
    a.push("--version-fallback=never".into());
    a
}

/// `/version` is public on a default cluster (system:public-info-viewer), so a node that has no
/// kubeconfig yet asks the real kube-apiserver through the kubelet's bootstrap kubeconfig (a
/// real bootstrap token, as kubeadm makes them) or at `--api-server` without credentials; the
/// errors are the API server's own (a token it rejects, a CA that does not sign it).
#[test]
fn a_node_that_has_not_joined_asks_the_real_api_server() {
    let c = support::cluster::cluster();
    let version = c.kubectl(&["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    let server = v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(server.starts_with("v1.37."), "{server}");
    let w = joining_world();
    let ca_file = w.work.join("cluster-ca.pem");
    std::fs::write(&ca_file, &c.ca.pem).unwrap();

    // Nothing to ask: the error names every source and the fix.
    let r = nodestrap(&args_without_kubeconfig(&w), None, &[]);
    r.assert_fails(1, "no kubeconfig (none at ");
    assert!(
        r.stderr.contains("no kubelet bootstrap kubeconfig (none at ")
            && r.stderr.contains("and no --api-server, and --version-fallback never: give the node one of them, or set --force-kube-version"),
        "{}",
        r.stderr
    );

    // --api-server, trusted through --ca-file, without credentials.
    let mut a = args_without_kubeconfig(&w);
    a.retain(|x| !x.starts_with("--ca-file"));
    a.push(format!("--api-server={}", c.url));
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(1, "add its CA with --ca-file (a PEM file)");
    a.push(format!("--ca-file={}", ca_file.display()));
    // The images come from the test's own server, whose CA --ca-file must hold too.
    let both = w.work.join("both-ca.pem");
    std::fs::write(
        &both,
        format!(
            "{}{}",
            c.ca.pem,
            std::fs::read_to_string(&w.ca_file).unwrap()
        ),
    )
    .unwrap();
    a.retain(|x| !x.starts_with("--ca-file"));
    a.push(format!("--ca-file={}", both.display()));
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "nodestrap: k8s={server} from=api-server (the API server, GET /version, credentials from none (--api-server {}; /version is public))",
            c.url
        )),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("kubernetes=v1.37.2"), "{}", r.stdout);

    // The kubelet's bootstrap kubeconfig, with a bootstrap token the cluster knows.
    c.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "secret",
        "generic",
        "bootstrap-token-nstrap",
        "--type=bootstrap.kubernetes.io/token",
        "--from-literal=token-id=nstrap",
        "--from-literal=token-secret=0123456789abcdef",
        "--from-literal=usage-bootstrap-authentication=true",
    ]);
    use base64::Engine as _;
    let kc = |token: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: {token}\ncontexts:\n- name: b\n  context:\n    cluster: c\n    user: tls-bootstrap-token-user\ncurrent-context: b\n",
            c.url,
            base64::engine::general_purpose::STANDARD.encode(&c.ca.pem)
        )
    };
    w.write(
        "/etc/kubernetes/bootstrap-kubelet.conf",
        &kc("nstrap.0123456789abcdef"),
    );
    let mut a = args_without_kubeconfig(&w);
    a.push(format!("--api-server={}", c.url));
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "nodestrap: k8s={server} from=api-server (the API server, GET /version, credentials from {})",
            w.path("/etc/kubernetes/bootstrap-kubelet.conf").display()
        )),
        "{}",
        r.stdout
    );
    // A token the cluster does not know: rejected credentials, said first.
    w.write(
        "/etc/kubernetes/bootstrap-kubelet.conf",
        &kc("nstrap.fedcba9876543210"),
    );
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(1, "the API server rejected the credentials of ");
    assert!(r.stderr.contains("HTTP 401"), "{}", r.stderr);
}

/// A joined node keeps asking the API server with the kubelet's own credentials, laid out as
/// kubeadm and the kubelet lay them out (kubelet.conf naming kubelet-client-current.pem, a link to
/// the certificate the kubelet rotated to), long after its bootstrap token has expired: the
/// expired token alone is refused (the twin), the kubelet's certificate is taken before it.
#[test]
fn a_joined_node_asks_with_the_kubelets_own_credentials() {
    let c = support::cluster::cluster();
    let w = joining_world();
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // A bootstrap token the cluster no longer knows (expired and collected, or deleted).
    w.write(
        "/etc/kubernetes/bootstrap-kubelet.conf",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: expird.0123456789abcdef\ncontexts:\n- name: b\n  context:\n    cluster: c\n    user: tls-bootstrap-token-user\ncurrent-context: b\n",
            c.url,
            b64(&c.ca.pem)
        ),
    );
    let a = args_without_kubeconfig(&w);
    nodestrap(&a, None, &[]).assert_fails(1, "the API server rejected the credentials of ");

    // The kubelet joined: its client certificate, where the kubelet keeps it, and the
    // kubeconfig kubeadm wrote for it.
    join_as_kubelet(&w, c, "worker-1");
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "from=api-server (the API server, GET /version, credentials from {})",
            w.path("/etc/kubernetes/kubelet.conf").display()
        )),
        "{}",
        r.stdout
    );
    assert!(!r.stderr.contains("bootstrap-kubelet.conf"), "{}", r.stderr);
    // --kubelet-kubeconfig= turns it off: the expired token is all that is left.
    let mut off = a.clone();
    off.push("--kubelet-kubeconfig=".into());
    nodestrap(&off, None, &[]).assert_fails(1, "the API server rejected the credentials of ");
}

/// The kubelet's credentials as kubeadm and the kubelet lay them out: a client certificate of
/// the cluster's CA for `system:node:NAME` in `system:nodes`, behind kubelet-client-current.pem,
/// and /etc/kubernetes/kubelet.conf naming it.
fn join_as_kubelet(w: &World, c: &support::cluster::Cluster, node: &str) {
    use base64::Engine as _;
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = c.ca.issue(p);
    let pki = "/var/lib/kubelet/pki";
    w.write(
        &format!("{pki}/kubelet-client-2026-11-28-10-00-00.pem"),
        &format!("{}{}", leaf.cert_pem, leaf.key_pem),
    );
    let _ = std::fs::remove_file(w.path(&format!("{pki}/kubelet-client-current.pem")));
    std::os::unix::fs::symlink(
        format!("{pki}/kubelet-client-2026-11-28-10-00-00.pem"),
        w.path(&format!("{pki}/kubelet-client-current.pem")),
    )
    .unwrap();
    w.write(
        "/etc/kubernetes/kubelet.conf",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: default-auth\n  user:\n    client-certificate: {pki}/kubelet-client-current.pem\n    client-key: {pki}/kubelet-client-current.pem\ncontexts:\n- name: default-context\n  context:\n    cluster: kubernetes\n    namespace: default\n    user: default-auth\ncurrent-context: default-context\n",
            c.url,
            base64::engine::general_purpose::STANDARD.encode(&c.ca.pem)
        ),
    );
}

/// The fleet's rollout setting, read by a patch run with the node's own credentials (the Node
/// authorizer on; deploy/rollout.yaml's RBAC applied as an operator applies it): a hold keeps
/// every node as it is (exit 0, the record keeping the set that runs), a canary share lets only
/// the nodes below it change, and each twin takes the new patch. Without the RBAC the setting
/// is unread, said, and the run goes on. A cluster of the test's own: the setting is cluster-wide.
#[test]
fn the_fleets_hold_and_canary_share_are_read_by_every_patch_run() {
    let c = support::cluster::own_cluster();
    let w = joining_world();
    w.write("/etc/machine-id", "5f1c3a0b9e2d4c7a8b6e0f1d2c3b4a59\n");
    join_as_kubelet(&w, &c, "worker-1");
    let a = args_without_kubeconfig(&w);
    // The first bootstrap: v1.37.2, never held.
    nodestrap(&a, None, &[]).assert_ok();
    assert!(w
        .read("/etc/kubernetes/kubelet.env")
        .unwrap()
        .contains("v1.37.2"));
    let record = || -> serde_json::Value {
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap()
    };
    let since = record()["running"]["since"].clone();
    assert!(since.is_string(), "{:#}", record());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    w.publish_versions("kubernetes", &["1.36.4", "1.37.0", "1.37.2", "1.37.3"]);

    // A hold set before the RBAC: unread, said, and the run goes on (it would have patched).
    let rollout = |data: &str| {
        c.kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "configmap",
            "nodestrap-rollout",
            "--ignore-not-found",
        ]);
        c.kubectl(&[
            "-n",
            "kube-system",
            "create",
            "configmap",
            "nodestrap-rollout",
            data,
        ]);
    };
    rollout("--from-literal=hold=true");
    let mut dry = a.clone();
    dry.push("--dry-run".into());
    let r = nodestrap(&dry, None, &[]);
    r.assert_ok();
    assert!(
        r.stderr.contains(
            "rollout setting unread, going on without it: ConfigMap kube-system/nodestrap-rollout:"
        ) && r.stderr.contains("403"),
        "{}",
        r.stderr
    );
    // The operator applies the shipped RBAC, as written.
    c.kubectl(&[
        "apply",
        "-f",
        concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rollout.yaml"),
    ]);
    rollout("--from-literal=hold=true");
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains("nodestrap: sysext held k8s=v1.37.2 (held by ConfigMap kube-system/nodestrap-rollout hold=true)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("it would take kubernetes v1.37.3"),
        "{}",
        r.stderr
    );
    assert!(w
        .read("/etc/kubernetes/kubelet.env")
        .unwrap()
        .contains("KUBELET_VERSION=v1.37.2"));
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["chosen"][0]["version"], "v1.37.2", "{rec:#}");
    // The set in place is the first bootstrap's, since then: a held run puts nothing in place.
    assert_eq!(rec["running"]["since"], since, "{rec:#}");
    assert!(rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["what"] == "rollout" && d["value"] == "held"));
    // The set in place stays merged, as the boot check after the patch run finds it.
    assert!(rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["what"] == "activation" && d["value"] == "unchanged"));
    // A canary share this node is outside of (its share point is fixed by its machine ID).
    rollout("--from-literal=canary-percent=0");
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(r.stdout.contains("(outside the canary share: kube-system/nodestrap-rollout canary-percent=0, this node's share point is"), "{}", r.stdout);
    // A value that is no share is refused, never guessed.
    rollout("--from-literal=canary-percent=ten");
    nodestrap(&a, None, &[]).assert_fails(
        1,
        "canary-percent \"ten\" is not a whole number from 0 to 100",
    );
    // The twin: the whole fleet; the patch is taken.
    rollout("--from-literal=canary-percent=100");
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(r.stdout.contains("kubernetes=v1.37.3"), "{}", r.stdout);
}

/// kubeadm's JoinConfiguration as the version source of a node that has not joined, against
/// the real API server with the cluster-info ConfigMap real kubeadm publishes: the token and the
/// CA hash are the ones `kubeadm token create --print-join-command` prints, the file is kubeadm's
/// own `config print join-defaults` filled in and passed by `kubeadm config validate`. A pin of
/// another CA is refused naming both hashes; file discovery reads the kubeconfig it names.
#[test]
fn a_kubeadm_join_configuration_is_a_version_source() {
    let c = support::cluster::cluster();
    let server = {
        let v: serde_json::Value =
            serde_json::from_str(&c.kubectl(&["version", "-o", "json"])).unwrap();
        v["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // cluster-info in kube-public, readable by anyone, as `kubeadm init` leaves it.
    let work = support::unique_dir("join-config");
    let init = work.join("init.yaml");
    std::fs::write(
        &init,
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nbootstrapTokens:\n- token: nsjoin.0123456789abcdef\n",
    )
    .unwrap();
    c.kubeadm(&[
        "init",
        "phase",
        "bootstrap-token",
        "--config",
        &init.display().to_string(),
    ]);
    let join = c.kubeadm(&["token", "create", "--print-join-command"]);
    let word = |after: &str| -> String {
        let mut it = join.split_whitespace();
        it.find(|w| *w == after);
        it.next()
            .unwrap_or_else(|| panic!("{after} in {join}"))
            .to_string()
    };
    let (endpoint, token, hash) = (
        word("join"),
        word("--token"),
        word("--discovery-token-ca-cert-hash"),
    );
    assert_eq!(hash, support::openssl_spki_hash(&c.ca_file), "{join}");
    let defaults = c.kubeadm(&["config", "print", "join-defaults"]);
    let config = |pin: &str| {
        defaults
            .replace("kube-apiserver:6443", &endpoint)
            .replace("abcdef.0123456789abcdef", &token)
            .replace(
                "    unsafeSkipCAVerification: true\n",
                &format!("    caCertHashes:\n    - {pin}\n"),
            )
    };
    let good = config(&hash);
    assert!(
        good.contains("caCertHashes") && good.contains(&endpoint),
        "{good}"
    );
    let file = work.join("join.yaml");
    std::fs::write(&file, &good).unwrap();
    c.kubeadm(&[
        "config",
        "validate",
        "--config",
        &file.display().to_string(),
    ]);

    let w = joining_world();
    w.write("/etc/kubeadm/join.yaml", &good);
    let mut a = args_without_kubeconfig(&w);
    a.push("--join-config=/etc/kubeadm/join.yaml".into());
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "nodestrap: k8s={server} from=api-server (the API server, GET /version, credentials from {} (its bootstrap token; the cluster's CA pinned by caCertHashes))",
            w.path("/etc/kubeadm/join.yaml").display()
        )),
        "{}",
        r.stdout
    );
    assert!(!r.stderr.contains(&token) && !r.stdout.contains(&token));

    // A pin of another CA: cluster-info's CA is not trusted, and nothing is asked with it.
    let other = support::Ca::new("other");
    let other_pem = work.join("other.pem");
    std::fs::write(&other_pem, &other.pem).unwrap();
    let other_hash = support::openssl_spki_hash(&other_pem);
    w.write("/etc/kubeadm/join.yaml", &config(&other_hash));
    let before = w.read("/etc/kubernetes/kubelet.env");
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(
        1,
        &format!("its CA ({hash}) matches none of caCertHashes ({other_hash})"),
    );
    assert_eq!(w.read("/etc/kubernetes/kubelet.env"), before);

    // Nothing listens at the endpoint: unreachable, judged by --version-fallback as a
    // /version that failed so (never: the run fails; the default: the node's files decide).
    let dead = format!("127.0.0.1:{}", support::cluster::free_port());
    w.write(
        "/etc/kubeadm/join.yaml",
        &config(&hash).replace(&endpoint, &dead),
    );
    let mut quick = a.clone();
    quick.push("--api-tries=1".into());
    let r = nodestrap(&quick, None, &[]);
    r.assert_fails(
        1,
        "the API server is unreachable, and --version-fallback never does not let",
    );
    assert!(
        r.stderr.contains("discovery.bootstrapToken: cluster-info"),
        "{}",
        r.stderr
    );
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.37.0\n",
    );
    quick.retain(|x| x != "--version-fallback=never");
    let r = nodestrap(&quick, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains("nodestrap: k8s=v1.37.0 from=fallback (")
            && r.stdout.contains("the API server is unreachable: "),
        "{}",
        r.stdout
    );
    std::fs::remove_file(w.path("/etc/kubernetes/installer/kubelet.env")).unwrap();

    // File discovery: the kubeconfig it names (here with the bootstrap token as its user).
    use base64::Engine as _;
    w.write(
        "/etc/kubeadm/discovery.conf",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: t\n  user:\n    token: {token}\ncontexts:\n- name: d\n  context:\n    cluster: c\n    user: t\ncurrent-context: d\n",
            c.url,
            base64::engine::general_purpose::STANDARD.encode(&c.ca.pem)
        ),
    );
    w.write(
        "/etc/kubeadm/join.yaml",
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  file:\n    kubeConfigPath: /etc/kubeadm/discovery.conf\n",
    );
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "from=api-server (the API server, GET /version, credentials from {})",
            w.path("/etc/kubeadm/discovery.conf").display()
        )),
        "{}",
        r.stdout
    );
}

/// `--force-kube-version v1.32.1` pins that patch, `v1.32` takes the newest patch of the
/// minor; a patch the source lacks is refused naming what it offers; torcx takes no minor.
#[test]
fn a_forced_version_pins_a_patch_or_a_minor() {
    let w = World::new();
    let run = |v: &str| {
        let mut a = w.args_for(&w.root.display().to_string());
        a.push(format!("--force-kube-version={v}"));
        nodestrap(&a, None, &[])
    };
    let r = run("v1.32.1");
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.32.1 kubernetes=v1.32.1"),
        "{}",
        r.stdout
    );
    let r = run("v1.32");
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.32 kubernetes=v1.32.3"),
        "{}",
        r.stdout
    );
    let r = run("v1.32.2");
    r.assert_fails(1, "--force-kube-version v1.32.2: ");
    // What is below the version floor (v1.32.3, staged just before) is not offered.
    assert!(
        r.stderr
            .contains("has no kubernetes v1.32.2: it offers v1.32.3")
            && r.stderr.contains("2 version(s) below the floor v1.32.3"),
        "{}",
        r.stderr
    );
    // v1.32.1, which the source does offer, is below that floor: said as such, never as not
    // offered (the list as filtered by the floor leaves it out).
    let r = run("v1.32.1");
    r.assert_fails(1, "--force-kube-version v1.32.1: the source offers it, but it is below kubernetes's version floor v1.32.3 (staged at ");
    assert!(
        r.stderr
            .contains("--allow-downgrade kubernetes=v1.32.1 lets it through")
            && !r.stderr.contains("has no kubernetes v1.32.1"),
        "{}",
        r.stderr
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    let r = nodestrap(
        &[
            "bootstrap".into(),
            format!("--root={}", w.root.display()),
            "--force-kube-version=v1.32".into(),
        ],
        None,
        &[],
    );
    r.assert_fails(
        2,
        "--force-kube-version v1.32: the torcx payload writes the kubelet's image tag",
    );
}

// ---------------------------------------------------------------------------------------------
// Sources: a bakery folder signed by deploy/sign-sysext-source, and the bakery's flat layout

/// deploy/sign-sysext-source turns a folder of images named as sysext-bakery names them into a
/// source nodestrap reads: per extension a SHA256SUMS with BEST-BEFORE, and its signature as
/// .gpg and .asc, both good for the real gpgv. The bakery's own flat layout (every image and one
/// SHA256SUMS in one folder, `--sysext-url` without `${NAME}`) is a source too, its list read
/// and verified once.
#[test]
fn a_bakery_folder_signed_by_the_script_and_the_flat_layout_are_sources() {
    let w = World::new();
    let gnupg = unique_dir("gnupg");
    std::fs::set_permissions(&gnupg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let gpg = |args: &[&str]| {
        let out = Command::new("gpg")
            .args(["--batch", "--passphrase", ""])
            .args(args)
            .env("GNUPGHOME", &gnupg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    gpg(&[
        "--quick-gen-key",
        "mirror <mirror@nodestrap.invalid>",
        "ed25519",
        "sign",
        "never",
    ]);
    let armored = w.work.join("mirror.asc");
    std::fs::write(
        &armored,
        gpg(&["--armor", "--export", "mirror@nodestrap.invalid"]),
    )
    .unwrap();
    let binary = w.work.join("mirror.gpg");
    std::fs::write(&binary, gpg(&["--export", "mirror@nodestrap.invalid"])).unwrap();

    // The bakery's names: kubernetes keeps upstream's v, containerd drops it.
    let images = unique_dir("bakery");
    for v in ["1.32.1", "1.32.3"] {
        std::fs::write(
            images.join(format!("kubernetes-v{v}-x86-64.raw")),
            kubernetes(&w.work, v, ANY),
        )
        .unwrap();
    }
    std::fs::write(
        images.join("containerd-1.7.24-x86-64.raw"),
        containerd(&w.work, "1.7.24", 0),
    )
    .unwrap();
    let out = unique_dir("mirror");
    let script = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/sign-sysext-source"
    ))
    .args(["--key", "mirror@nodestrap.invalid", "--valid-days", "7"])
    .arg(&images)
    .arg(&out)
    .env("GNUPGHOME", &gnupg)
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&script.stdout).into_owned();
    assert!(
        script.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&script.stderr)
    );
    let best_before = String::from_utf8_lossy(
        &Command::new("date")
            .args(["-u", "-d", "+7 days", "+%Y-%m-%d"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    for ext in ["kubernetes", "containerd"] {
        let d = out.join(ext);
        let sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
        assert!(
            sums.ends_with(&format!("{EMPTY_SHA}  BEST-BEFORE-{best_before}\n")),
            "{sums}"
        );
        // The oracle: gpgv takes both signatures.
        for sig in ["SHA256SUMS.gpg", "SHA256SUMS.asc"] {
            let v = Command::new("gpgv")
                .arg("--keyring")
                .arg(&binary)
                .arg(d.join(sig))
                .arg(d.join("SHA256SUMS"))
                .output()
                .unwrap();
            assert!(
                v.status.success(),
                "gpgv {ext}/{sig}: {}",
                String::from_utf8_lossy(&v.stderr)
            );
        }
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            w.files.set(
                &format!("/mirror/{ext}/{name}"),
                Reply::ok(std::fs::read(e.path()).unwrap()),
            );
        }
    }
    stages_from(&w, &w.files.url("/mirror/${NAME}/"), &armored);

    // The flat layout: every image and one signed SHA256SUMS in one folder.
    let flat = World::new();
    let mut sums = String::new();
    for e in std::fs::read_dir(&images).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let body = std::fs::read(e.path()).unwrap();
        sums.push_str(&format!("{}  {name}\n", sha256(&body)));
        flat.files.set(&format!("/flat/{name}"), Reply::ok(body));
    }
    // The bakery lists its sysupdate .conf files in the same SHA256SUMS.
    sums.push_str(&format!("{EMPTY_SHA}  kubernetes-v1.32.conf\n"));
    flat.files.set("/flat/SHA256SUMS", Reply::ok(sums.clone()));
    flat.files.set(
        "/flat/SHA256SUMS.gpg",
        Reply::ok(flat.signer.sign_binary(sums.as_bytes())),
    );
    stages_from(&flat, &flat.files.url("/flat/"), &flat.keyring);
    assert_eq!(flat.files.hits("/flat/SHA256SUMS"), 1);
    assert_eq!(flat.files.hits("/flat/SHA256SUMS.gpg"), 1);
}

/// A bootstrap of `w` from `url` with `keyring` stages kubernetes v1.32.3 and containerd 1.7.24.
fn stages_from(w: &World, url: &str, keyring: &Path) {
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| !x.starts_with("--sysext-url") && !x.starts_with("--keyring"));
    a.push(format!("--sysext-url={url}"));
    a.push(format!("--keyring={}", keyring.display()));
    let r = nodestrap(&a, None, &[]);
    r.assert_ok();
    assert!(
        r.stdout
            .contains("kubernetes=v1.32.3 containerd=1.7.24 activation=staged"),
        "{}",
        r.stdout
    );
}

#[path = "verify.rs"]
mod verify;

#[path = "signed.rs"]
mod signed;

#[path = "oci.rs"]
mod oci;

/// The events a receiver got on `path`, parsed, in arrival order.
fn received(r: &Server, path: &str) -> Vec<serde_json::Value> {
    r.requests("POST", path)
        .iter()
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect()
}

/// What each event is about, `kind` or `kind:detail`, as a test compares a run's story.
fn story(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e["kind"].as_str().unwrap() {
            "phase" => format!("phase:{}", e["phase"].as_str().unwrap()),
            "decision" => format!("decision:{}", e["what"].as_str().unwrap()),
            "finished" => format!("finished:{}", e["exit_code"]),
            k => k.to_string(),
        })
        .collect()
}

/// Issue 28's events: each decision and phase of a run reaches the receiver as it happens, in
/// order, one JSON object per POST, with the bearer token when the node has no client
/// certificate; once it has the kubelet's, that is its identity. A receiver that refuses
/// them costs the run nothing: they are dropped and counted in the record.
#[test]
fn events_reach_the_receiver_in_order_as_the_node_is_allowed() {
    let (_dir, run) = own_run_dir();
    let env = [("NODESTRAP_RUN_DIR", run.as_str())];
    let mut w = World::new();
    let ca = Ca::new("events receiver CA");
    let receiver = Server::start(&ca.server(), None);
    receiver.set("/events", Reply::ok(""));
    receiver.require_bearer("s3cret-token");
    let ca_pem = w.work.join("events-ca.pem");
    std::fs::write(&ca_pem, &ca.pem).unwrap();
    let token = w.work.join("events-token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    w.extra = vec![
        format!("--events-url={}", receiver.url("/events")),
        format!("--events-ca-file={}", ca_pem.display()),
        format!("--events-token-file={}", token.display()),
    ];
    let out = nodestrap(&w.args_for(&w.root.display().to_string()), None, &env);
    out.assert_ok();
    assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "events: sending each decision and phase to {}, as the bearer token in {}",
            receiver.url("/events"),
            token.display()
        )),
        "{}",
        out.stderr
    );
    let got = received(&receiver, "/events");
    let story = story(&got);
    // The run's story: it starts, decides, chooses, stages, writes its marker and ends.
    let want = [
        "started",
        "decision:events",
        "phase:version",
        "phase:chosen",
        "staged",
        "phase:staged",
        "marker",
        "phase:marker",
        "finished:0",
    ];
    let mut at = 0;
    for w in want {
        at += story[at..]
            .iter()
            .position(|s| s == w)
            .unwrap_or_else(|| panic!("{w} not after {at}: {story:?}"));
    }
    assert_eq!(story.last().unwrap(), "finished:0", "{story:?}");
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
        assert_eq!(e["schema"], 1, "{e}");
        assert_eq!(e["command"], "bootstrap", "{e}");
        assert_eq!(e["stage"], "system", "{e}");
        assert_eq!(e["run"], got[0]["run"], "{e}");
    }
    for s in receiver.requests("POST", "/events") {
        assert_eq!(
            s.header("Authorization"),
            Some("Bearer s3cret-token"),
            "{s:?}"
        );
        assert_eq!(s.header("Content-Type"), Some("application/json"));
    }
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    let n = got.len() as u64;
    assert_eq!(
        rec["events"],
        serde_json::json!({"url": receiver.url("/events"), "sent": n, "dropped": 0,
                           "from_spool": 0, "spooled": 0}),
        "{rec}"
    );
    // A decision sent is the record's decision.
    let decided: Vec<&serde_json::Value> = got.iter().filter(|e| e["kind"] == "decision").collect();
    assert_eq!(decided.len(), rec["decisions"].as_array().unwrap().len());

    // Once the kubelet holds its client certificate, that is the node's identity.
    let kca = Ca::new("cluster CA");
    let mtls = Server::start(&ca.server(), Some(&kca));
    mtls.set("/events", Reply::ok(""));
    let leaf = kca.client("system:node:worker-1");
    w.write(
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
        &format!("{}{}", leaf.cert_pem, leaf.key_pem),
    );
    w.extra[0] = format!("--events-url={}", mtls.url("/events"));
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let out = nodestrap(&w.args_for(&w.root.display().to_string()), None, &env);
    out.assert_ok();
    assert!(
        out.stderr.contains("as the kubelet's client certificate"),
        "{}",
        out.stderr
    );
    let sent = mtls.requests("POST", "/events");
    assert!(sent.len() > 5, "{sent:?}");
    assert!(sent
        .iter()
        .all(|s| s.client_cert && s.header("Authorization").is_none()));

    // A receiver that refuses them: the run goes on, the events are counted as dropped.
    std::fs::remove_file(w.path("/var/lib/kubelet/pki/kubelet-client-current.pem")).unwrap();
    std::fs::write(&token, "another-token\n").unwrap();
    w.extra[0] = format!("--events-url={}", receiver.url("/events"));
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let before = receiver.requests("POST", "/events").len();
    nodestrap(&w.args_for(&w.root.display().to_string()), None, &env).assert_ok();
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["events"]["sent"], 0, "{rec}");
    let refused = receiver.requests("POST", "/events")[before..].to_vec();
    assert!(refused.len() > 5, "{refused:?}");
    assert_eq!(rec["events"]["dropped"], refused.len() as u64, "{rec}");

    // A receiver given as http is refused before anything: tokens travel with events.
    w.extra[0] = "--events-url=http://127.0.0.1:9/events".into();
    nodestrap(&w.args_for(&w.root.display().to_string()), None, &env)
        .assert_fails(2, "not an https URL");
}

/// Issue 34, "Versions only go forward": each version staged is the floor of its extension,
/// kept in known-good.json beside the images; a fresh, validly signed list offering only an
/// older patch is refused naming the floor, also once the store is wiped; the exact version a
/// setting names is let through, recorded, and lowers the floor. A signed list older than one
/// the node accepted from the same source is stale, naming both dates.
#[test]
fn versions_only_go_forward_and_an_older_signed_list_is_stale() {
    let mut w = World::new();
    let marker = |d: &str| format!("{}  BEST-BEFORE-{d}\n", "ab".repeat(32));
    w.publish(
        "kubernetes",
        &w.publish_versions("kubernetes", &["1.31.9", "1.32.1", "1.32.3"]),
        &marker("2030-01-31"),
    );
    w.run().assert_ok();
    let known = |w: &World| -> serde_json::Value {
        serde_json::from_str(&w.read("/var/lib/nodestrap/known-good.json").unwrap()).unwrap()
    };
    let k = known(&w);
    assert_eq!(k["floor"][0]["name"], "kubernetes", "{k}");
    assert_eq!(k["floor"][0]["version"], "v1.32.3", "{k}");
    assert_eq!(k["floor"][1]["name"], "containerd", "{k}");
    assert_eq!(k["lists"][0]["best_before"], "2030-01-31", "{k}");

    // A fresh signed list with only an older patch (and the older minor skew allows).
    w.publish(
        "kubernetes",
        &w.publish_versions("kubernetes", &["1.31.9", "1.32.1"]),
        &marker("2030-02-28"),
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_fails(
        1,
        "kubernetes: every version the source offers is below the version floor: 2 version(s) below the floor v1.32.3",
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    // A wiped store does not lower it.
    std::fs::remove_dir_all(w.path("/opt/extensions")).unwrap();
    std::fs::remove_dir_all(w.path("/etc/extensions")).unwrap();
    w.run().assert_fails(1, "below the floor v1.32.3");

    // The exact version a setting names goes through, once asked, and lowers the floor.
    w.extra = vec!["--allow-downgrade=kubernetes=v1.32.1".into()];
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(
            "kubernetes downgraded to v1.32.1 below its floor v1.32.3 (--allow-downgrade): the floor is lowered"
        ),
        "{}",
        r.stderr
    );
    let k = known(&w);
    assert_eq!(k["floor"][0]["version"], "v1.32.1", "{k}");
    assert_eq!(k["floor"][0]["how"], "lowered", "{k}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "downgrade" && d["value"] == "kubernetes v1.32.1"),
        "{rec}"
    );
    w.extra.clear();

    // An older signed list than the last accepted from that source: stale.
    w.publish(
        "kubernetes",
        &w.publish_versions("kubernetes", &["1.32.1", "1.32.3"]),
        &marker("2030-01-15"),
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_fails(
        1,
        "stale: its newest marker is BEST-BEFORE-2030-01-15, older than BEST-BEFORE-2030-02-28 of the list this node accepted",
    );
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.1-x86-64.raw")
    );
}

#[path = "itself.rs"]
mod itself;

#[path = "metrics.rs"]
mod metrics;
