//! `nodestrap bootstrap` end to end: the built binary against a temp root and local servers.

#[path = "../support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};

use sha2::Digest as _;
use support::*;

const CUR: &str = "1520.5.0";
const NEXT: &str = "1632.3.0";
const INSTALLER_ENV: &str =
    "KUBELET_IMAGE_URL=\"quay.io/coreos/hyperkube\"\nKUBELET_IMAGE_TAG=\"v1.9.6_coreos.0\"\n";
const MAPPINGS: &str = "kind: VersionManifestV1\nversions:\n  k8s:\n    1.1:\n        docker: [ \"1.11\" ]\n    1.9:\n        docker: [ \"17.03\", \"1.12\"]\n    1.10:\n        docker: [ \"17.06\", \"17.03\" ]\n";

fn image(version: &str) -> Vec<u8> {
    // Distinct, incompressible-looking content per version, a few hundred KiB.
    let mut out = Vec::with_capacity(300 << 10);
    let mut h = sha2::Sha512::digest(version.as_bytes()).to_vec();
    while out.len() < 300 << 10 {
        h = sha2::Sha512::digest(&h).to_vec();
        out.extend_from_slice(&h);
    }
    out
}

fn sha512(b: &[u8]) -> String {
    format!(
        "sha512-{}",
        sha2::Sha512::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    )
}

/// Everything one scenario needs.
struct World {
    root: PathBuf,
    ca: Ca,
    ca_file: PathBuf,
    files: Server,
    signer: Signer_,
    keyring: PathBuf,
    extra: Vec<String>,
    /// The world's own /run/nodestrap, for the status record.
    run_dir: String,
}

impl NodeRoot for World {
    fn root(&self) -> &Path {
        &self.root
    }
}

impl World {
    fn new() -> World {
        let root = unique_dir("root");
        let ca = Ca::new("nodestrap test CA");
        let files = Server::start(&ca.server(), None);
        let signer = Signer_::new("torcx signer <torcx@nodestrap.invalid>");
        let keyring = root.with_extension("keyring.asc");
        std::fs::write(&keyring, signer.keyring()).unwrap();
        let ca_file = root.with_extension("ca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let w = World {
            run_dir: root.with_extension("run").display().to_string(),
            root,
            ca,
            ca_file,
            files,
            signer,
            keyring,
            extra: Vec::new(),
        };
        w.write("/usr/lib/os-release", &format!("NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nVERSION_ID={CUR}\nCOREOS_BOARD=\"amd64-usr\"\n"));
        w.write("/etc/kubernetes/installer/kubelet.env", INSTALLER_ENV);
        w.write("/etc/kubernetes/installer/runtime-mappings.yaml", MAPPINGS);
        for os in [CUR, NEXT] {
            w.publish(os, &w.manifest(os, &["17.03", "17.06"]));
        }
        for v in ["17.03", "17.06"] {
            w.files
                .set(&format!("/pkgs/docker-{v}.tgz"), Reply::ok(image(v)));
        }
        w
    }

    fn manifest(&self, _os: &str, versions: &[&str]) -> String {
        let mut vs: Vec<String> = versions.iter().map(|v| format!(
            r#"{{"version":"{v}","hash":"{}","sourcePackage":"app-torcx/docker-{v}","locations":[{{"url":"{}"}}]}}"#,
            sha512(&image(v)), self.files.url(&format!("/pkgs/docker-{v}.tgz")))).collect();
        vs.push(r#"{"version":"1.12","hash":"sha512-0e3e75234abc68f4378a86b3f4b32a198ba301845b0cd6e50106e874345700cc6663a86c1ea125dc5e92be17c98f9a0f85ca9d5f595db2012f7cc3571945c123","locations":[{"path":"/usr/share/torcx/store/docker:1.12.torcx.tgz"}]}"#.into());
        format!(
            r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","defaultVersion":"1.12","versions":[{}]}}]}}}}"#,
            vs.join(",")
        )
    }

    fn manifest_path(os: &str) -> String {
        format!("/manifests/amd64-usr/{os}/torcx_manifest.json")
    }

    /// Serve `manifest` for `os`, signed by the world's key.
    fn publish(&self, os: &str, manifest: &str) {
        let p = Self::manifest_path(os);
        self.files.set(&p, Reply::ok(manifest.as_bytes().to_vec()));
        self.files.set(
            &format!("{p}.asc"),
            Reply::ok(self.signer.sign(manifest.as_bytes())),
        );
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "bootstrap".into(),
            format!("--root={}", self.root.display()),
            format!(
                "--torcx-manifest-url={}",
                self.files
                    .url("/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json")
            ),
            format!("--keyring={}", self.keyring.display()),
            format!("--ca-file={}", self.ca_file.display()),
            "--upgrade-os=false".into(),
            "--api-tries=2".into(),
            "--api-retry-delay=0".into(),
            "--fetch-attempts=3".into(),
            "--fetch-backoff-ms=10".into(),
        ];
        a.extend(self.extra.iter().cloned());
        a
    }

    /// `args()` without the options named, so that settings from elsewhere decide them.
    fn args_without(&self, flags: &[&str]) -> Vec<String> {
        self.args()
            .into_iter()
            .filter(|a| !flags.iter().any(|f| a.split('=').next() == Some(f)))
            .collect()
    }

    fn run(&self) -> Run {
        nodestrap(&self.args(), None, &self.env())
    }

    fn run_on(&self, bus: &Bus) -> Run {
        nodestrap(&self.args(), Some(&bus.address), &self.env())
    }

    fn env(&self) -> [(&'static str, &str); 1] {
        [("NODESTRAP_RUN_DIR", &self.run_dir)]
    }

    /// `nodestrap status` on this world (`--json` when `json`).
    fn status(&self, json: bool) -> Run {
        let mut a = vec![
            "status".to_string(),
            format!("--root={}", self.root.display()),
        ];
        if json {
            a.push("--json".into());
        }
        nodestrap(&a, None, &self.env())
    }

    fn record(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(Path::new(&self.run_dir).join("status.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The record's decision `what`: its value and source.
    fn decision(&self, what: &str) -> (String, String) {
        let rec = self.record();
        let d = rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["what"] == what)
            .unwrap_or_else(|| panic!("no decision {what:?} in {rec:#}"));
        (
            d["value"].as_str().unwrap().to_string(),
            d["source"].as_str().unwrap().to_string(),
        )
    }

    fn store_file(&self, os: &str, v: &str) -> PathBuf {
        self.path(&format!("/var/lib/torcx/store/{os}/docker:{v}.torcx.tgz"))
    }

    /// Files under the store (temp files included), relative to it.
    fn store_listing(&self) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let base = self.path("/var/lib/torcx/store");
        walk(&base, &base, &mut out);
        out.sort();
        out
    }

    /// The failure contract: no file at any final path, no temp file left behind.
    fn assert_nothing_written(&self) {
        assert_eq!(
            self.store_listing(),
            Vec::<String>::new(),
            "store must stay empty"
        );
        for p in [
            "/etc/kubernetes/kubelet.env",
            "/etc/torcx/next-profile",
            "/etc/torcx/profiles/tectonic.json",
        ] {
            assert!(!self.path(p).exists(), "{p} must not exist");
        }
    }

    fn with_api(&self, version: &str, mappings: Option<&str>) -> (Server, Ca) {
        let client_ca = Ca::new("kube client CA");
        let api = Server::start(&self.ca.server(), Some(&client_ca));
        api.set(
            "/version",
            Reply::ok(format!(
                r#"{{"major":"1","minor":"10","gitVersion":"{version}","platform":"linux/amd64"}}"#
            )),
        );
        if let Some(m) = mappings {
            let cm = serde_json::json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"tectonic-torcx-runtime-mappings","namespace":"tectonic-system"},"data":{"runtime-mappings.yaml": m}});
            api.set(
                "/api/v1/namespaces/tectonic-system/configmaps/tectonic-torcx-runtime-mappings",
                Reply::ok(cm.to_string()),
            );
        }
        let leaf = client_ca.client("system:node:test");
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // Tectonic's shape: one unnamed context, no current-context.
        self.write("/etc/kubernetes/kubeconfig", &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: kubelet\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- context:\n    cluster: local\n    user: kubelet\n",
            api.url(""), b64(&self.ca.pem), b64(&leaf.cert_pem), b64(&leaf.key_pem)));
        (api, client_ca)
    }
}

#[test]
fn happy_path_without_api_server() {
    let w = World::new();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout
            .contains("bootstrap done k8s=v1.9.6+coreos.0 docker=17.03 next-os=none reboot=no"),
        "{}",
        r.stdout
    );
    assert_eq!(
        std::fs::read(w.store_file(CUR, "17.03")).unwrap(),
        image("17.03")
    );
    assert_eq!(
        w.store_listing(),
        vec![format!("{CUR}/docker:17.03.torcx.tgz")]
    );
    let profile: serde_json::Value =
        serde_json::from_str(&w.read("/etc/torcx/profiles/tectonic.json").unwrap()).unwrap();
    assert_eq!(
        profile,
        serde_json::json!({"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"17.03"}]}})
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    assert_eq!(
        w.read("/etc/kubernetes/kubelet.env").unwrap(),
        "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.9.6_coreos.0\n"
    );
    // One decision line per step, each naming its source.
    for needle in [
        "from KUBELET_IMAGE_TAG in",
        "/usr/lib/os-release)",
        " s after boot",
        "no pending OS update: update_engine is not on the system bus",
        "good signature by",
        "hash verified",
    ] {
        assert!(
            r.stderr.contains(needle),
            "missing {needle:?} in\n{}",
            r.stderr
        );
    }
    // A second run keeps the verified image instead of downloading it again.
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 1);
}

#[test]
fn status_record_says_what_was_decided_and_staged() {
    let w = World::new();
    w.run().assert_ok();
    let rec = w.record();
    assert_eq!(rec["schema"], 1);
    assert_eq!(rec["command"], "bootstrap");
    assert_eq!(rec["state"], "done");
    assert_eq!(rec["exit_code"], 0);
    assert_eq!(rec["phase"], "done");
    assert!(rec["error"].is_null());
    assert_eq!(rec["root"], w.root.display().to_string());
    assert!(rec["started"].as_str().unwrap().ends_with('Z'));
    assert!(rec["duration_s"].as_f64().unwrap() >= 0.0);
    // Each decision, its value and its source.
    let decided = |what: &str| w.decision(what);
    let (v, src) = decided("k8s");
    assert_eq!(v, "v1.9.6+coreos.0");
    assert!(
        src.starts_with("fallback (KUBELET_IMAGE_TAG in") && src.contains("no kubeconfig"),
        "{src}"
    );
    assert_eq!(decided("os").0, format!("{CUR} board amd64-usr"));
    assert_eq!(decided("runtime-mappings").0, "17.03, 1.12");
    let (v, src) = decided("docker");
    assert_eq!(v, "17.03");
    assert!(src.contains("/torcx_manifest.json"), "{src}");
    assert_eq!(decided("os-update").0, "none");
    assert_eq!(decided("torcx-profile").0, "tectonic");
    // Each file staged, with the digest it was verified against.
    assert_eq!(
        rec["files"],
        serde_json::json!([{
            "path": format!("/var/lib/torcx/store/{CUR}/docker:17.03.torcx.tgz"),
            "digest": sha512(&image("17.03")),
        }])
    );
    assert_eq!(rec["reboot"], serde_json::json!({"decision": "no"}));
    assert_eq!(rec["kubelet_env"]["path"], "/etc/kubernetes/kubelet.env");
    assert!(rec["kubelet_env"]["since_boot_s"].as_f64().unwrap() > 0.0);
    // The copy that outlives a reboot is the same record.
    let kept: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(kept, rec);

    // `nodestrap status`: the record for machines and for a person; exit 0 for a done run.
    let r = w.status(true);
    r.assert_ok();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap(),
        rec
    );
    let r = w.status(false);
    r.assert_ok();
    for needle in [
        "nodestrap bootstrap 0.1.0: done\n",
        &row(
            "k8s",
            "v1.9.6+coreos.0  from fallback (KUBELET_IMAGE_TAG in",
        ),
        &row("docker", "17.03  from torcx manifest"),
        &row(
            "staged",
            &format!("/var/lib/torcx/store/{CUR}/docker:17.03.torcx.tgz  sha512-"),
        ),
        &row("kubelet", "/etc/kubernetes/kubelet.env written "),
        &row("reboot", "no"),
    ] {
        assert!(
            r.stdout.contains(needle),
            "missing {needle:?} in\n{}",
            r.stdout
        );
    }
    // After a reboot /run is empty: the copy under /var/lib answers.
    std::fs::remove_file(Path::new(&w.run_dir).join("status.json")).unwrap();
    let r = w.status(false);
    r.assert_ok();
    assert!(
        r.stdout.contains("/var/lib/nodestrap/status.json"),
        "{}",
        r.stdout
    );
}

#[test]
fn status_of_a_failed_run_names_its_error_and_exits_1() {
    let mut w = World::new();
    // Nothing ran yet: no record, exit 4.
    let r = w.status(false);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("no status record at"), "{}", r.stderr);

    unreachable_api(&w);
    w.extra.push("--version-fallback=never".into());
    assert_eq!(w.run().code, 1);
    let rec = w.record();
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["exit_code"], 1);
    assert_eq!(rec["phase"], "started");
    assert_eq!(rec["reboot"], serde_json::json!({"decision": "undecided"}));
    assert!(rec["kubelet_env"].is_null());
    let err = rec["error"].as_str().unwrap();
    assert!(
        err.contains("unable to determine the cluster version: the API server is unreachable"),
        "{err}"
    );
    let r = w.status(false);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains("FAILED (exit 1) in phase started")
            && r.stdout
                .contains(&row("error", "unable to determine the cluster version")),
        "{}",
        r.stdout
    );
    assert_eq!(w.status(true).code, 1);

    // Settings that are wrong end the run before it starts: recorded all the same (exit 2).
    w.write("/etc/nodestrap/bootstrap.conf", "no-such-key = 1\n");
    assert_eq!(w.run().code, 2);
    let rec = w.record();
    assert_eq!(
        (&rec["state"], &rec["exit_code"]),
        (&"failed".into(), &2.into())
    );
    assert!(
        rec["error"].as_str().unwrap().contains("no-such-key"),
        "{rec:#}"
    );
    assert_eq!(w.status(false).code, 1);

    // A record that is not one is an error naming the file.
    std::fs::write(Path::new(&w.run_dir).join("status.json"), "{\"schema\": 1}").unwrap();
    let r = w.status(false);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("status.json: not a status record"),
        "{}",
        r.stderr
    );
}

/// `w.run()` with the torcx store on a tmpfs of `size` (a private mount namespace: needs
/// root); the run's output, then `left:` and what the store holds afterwards.
fn run_with_small_store(w: &World, size: &str) -> Run {
    let store = w.path("/var/lib/torcx/store");
    std::fs::create_dir_all(&store).unwrap();
    let inner = command(&w.args(), None);
    let mut c = std::process::Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size={size} tmpfs '{s}' || exit 99\n\"$@\"; rc=$?\necho \"left: $(cd '{s}' && find . -type f | sort | tr '\\n' ' ')\"\nexit $rc",
            s = store.display()
        ))
        .arg("sh")
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.env("NODESTRAP_RUN_DIR", &w.run_dir);
    Run::from(c.output().unwrap())
}

#[test]
fn a_full_store_is_refused_with_the_numbers_and_a_full_disk_leaves_nothing() {
    let w = World::new();
    // A 3 MiB image, offered with its length declared.
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let m = w
        .manifest(CUR, &["17.03"])
        .replace(&sha512(&image("17.03")), &sha512(&big));
    w.publish(CUR, &m);
    w.files
        .set("/pkgs/docker-17.03.tgz", Reply::ok(big.clone()));
    // 3 MiB and the 32 MiB margin do not fit in 8 MiB: refused before a byte is written.
    let r = run_with_small_store(&w, "8m");
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("not enough space for")
            && r.stderr.contains(
                "docker:17.03.torcx.tgz: it is 3145728 bytes, 33554432 more are kept free, and"
            )
            && r.stderr.contains("bytes free"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.contains("left: \n"), "{}", r.stdout);
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    assert_eq!(w.record()["state"], "failed");

    // Sent chunked, its length unknown until the end: it may take what is free less the
    // margin, and is stopped there with both numbers; the temp file goes, nothing is left, no
    // marker. (A disk that fills anyway, ENOSPC on a write, is in the fault matrix.)
    w.files
        .set("/pkgs/docker-17.03.tgz", Reply::chunked(big.clone()));
    for (size, needle) in [
        ("1m", "not enough space, and no declared length"),
        ("34m", "no declared length, and the body passed"),
    ] {
        let r = run_with_small_store(&w, size);
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        let last = r
            .stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_default();
        assert!(
            last.contains(needle)
                && last.contains("docker:17.03.torcx.tgz may take at most 536870912 bytes")
                && last.contains("bytes free, 33554432 of which are kept free"),
            "{size}: {}",
            r.stderr
        );
        assert!(r.stdout.contains("left: \n"), "{}", r.stdout);
        assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
        assert!(w.read("/etc/torcx/next-profile").is_none());
    }
    // With room to spare, --image-max-mib stops a body without a declared length.
    let mut w = w;
    w.extra.push("--image-max-mib=2".into());
    let r = w.run();
    r.assert_fails(1, "no declared length, and the body passed 2097152 bytes: ");
    assert!(
        r.stderr.contains("may take at most 2097152 bytes"),
        "{}",
        r.stderr
    );
    assert_eq!(w.store_listing(), Vec::<String>::new());
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
}

/// The node's os-release stamped two years ahead: this machine's clock is then behind the
/// node's floor, as a node's clock is when its real-time clock lost years.
fn clock_behind(w: &World) {
    let ahead = std::time::SystemTime::now() + std::time::Duration::from_secs(2 * 365 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(w.path("/usr/lib/os-release"))
        .unwrap()
        .set_modified(ahead)
        .unwrap();
}

#[test]
fn a_clock_behind_its_floor_is_named_as_wrong_after_a_bounded_wait() {
    let mut w = World::new();
    clock_behind(&w);
    w.extra.push("--clock-wait=1".into());
    let t = std::time::Instant::now();
    let r = w.run();
    assert!(t.elapsed() >= std::time::Duration::from_secs(1));
    r.assert_fails(1, "the clock is wrong: it says ");
    let last = r
        .stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .unwrap();
    for needle in [
        format!(
            "(the modification time of {})",
            w.path("/usr/lib/os-release").display()
        )
        .as_str(),
        "it was not synchronised within 1 s (/nonexistent/timesync/synchronized never appeared; --clock-wait)",
        "nodestrap does not set the clock",
    ] {
        assert!(last.contains(needle), "{needle:?} missing from {last}");
    }
    // Nothing checked a certificate: not one request reached the server; nothing written.
    assert!(w.files.seen().is_empty());
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    assert!(w.record()["error"]
        .as_str()
        .unwrap()
        .starts_with("the clock is wrong"));
}

#[test]
fn time_synchronisation_arriving_during_the_wait_lets_the_run_go_on() {
    let mut w = World::new();
    clock_behind(&w);
    w.extra.push("--clock-wait=60".into());
    let sync = w.root.with_extension("synchronized");
    let child = command(&w.args(), None)
        .env("NODESTRAP_RUN_DIR", &w.run_dir)
        .env("NODESTRAP_TIMESYNC_FILE", &sync)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // As systemd-timesyncd does once it has set the clock.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    std::fs::write(&sync, "").unwrap();
    let r = Run::from(child.wait_with_output().unwrap());
    r.assert_ok();
    assert!(
        r.stderr.contains("the clock is wrong: it says ")
            && r.stderr
                .contains("waiting up to 60 s for time synchronisation")
            && r.stderr.contains("but time synchronisation vouches for it"),
        "{}",
        r.stderr
    );
    assert!(w.read("/etc/kubernetes/kubelet.env").is_some());
    let (_, source) = w.decision("clock");
    assert!(source.starts_with("synchronised ("), "{source}");
}

#[test]
fn board_falls_back_by_the_binarys_architecture() {
    let w = World::new();
    let board = bin_board();
    w.write(
        "/usr/lib/os-release",
        &format!("ID=flatcar\nVERSION_ID={CUR}\n"),
    );
    // Offered only under this architecture's board: any other board would get a 404.
    let p = format!("/manifests/{board}/{CUR}/torcx_manifest.json");
    let m = w.manifest(CUR, &["17.03"]);
    w.files.set(&p, Reply::ok(m.as_bytes().to_vec()));
    w.files
        .set(&format!("{p}.asc"), Reply::ok(w.signer.sign(m.as_bytes())));
    if board != "amd64-usr" {
        let amd = World::manifest_path(CUR);
        w.files.set(&amd, Reply::status(404));
    }
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "board {board} (from {}/usr/lib/os-release, board by architecture)",
            w.root.display()
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(&p), "{}", r.stderr);
}

#[test]
fn happy_path_with_api_server_and_the_1_10_trap() {
    let w = World::new();
    // The ConfigMap has both 1.1 and 1.10: parsed as floats they would collide.
    let cm = "kind: VersionManifestV1\nversions:\n  k8s:\n    1.1:\n        docker: [ \"17.03\" ]\n    1.10:\n        docker: [ \"17.06\" ]\n";
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", Some(cm));
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.10.2+coreos.0 docker=17.06"),
        "{}",
        r.stdout
    );
    assert!(w.store_file(CUR, "17.06").exists());
    assert_eq!(
        w.read("/etc/kubernetes/kubelet.env").unwrap(),
        "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\n"
    );
    assert!(
        r.stderr.contains("(from the API server, GET /version"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("(from ConfigMap tectonic-system/tectonic-torcx-runtime-mappings key runtime-mappings.yaml)"),
        "{}",
        r.stderr
    );
    let seen = api.seen();
    assert!(seen.iter().any(|s| s.path == "/version"));
    assert!(
        seen.iter().all(|s| s.client_cert),
        "every API request presents the client certificate"
    );
}

#[test]
fn bearer_token_kubeconfig_and_secrets_stay_out_of_logs() {
    let w = World::new();
    let api = Server::start(&w.ca.server(), None);
    let token = "s3cr3t-token-value";
    api.require_bearer(token);
    api.set("/version", Reply::ok(r#"{"gitVersion":"v1.10.3"}"#));
    let ca = w.path("/etc/kubernetes/ca.pem");
    std::fs::create_dir_all(ca.parent().unwrap()).unwrap();
    std::fs::write(&ca, &w.ca.pem).unwrap();
    // A named context, a CA file relative to the kubeconfig, a token file.
    w.write("/etc/kubernetes/token", &format!("{token}\n"));
    w.write("/etc/kubernetes/kubeconfig", &format!(
        "clusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority: ca.pem}}\nusers:\n- name: u\n  user: {{tokenFile: /etc/kubernetes/token}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        api.url("")));
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.10.3 docker=17.06"),
        "{}",
        r.stdout
    );
    assert_eq!(
        api.seen()[0].header("authorization"),
        Some(&*format!("Bearer {token}"))
    );
    // A wrong token: 401 is final, and an API server that refuses is not an absent one: the
    // run fails without kubelet.env (docs/bootstrap.md, "The cluster's version"), unless
    // --version-fallback always-after-deadline lets the installer file decide. No token is
    // ever logged.
    let w2 = World::new();
    let kc = w.read("/etc/kubernetes/kubeconfig").unwrap();
    w2.write("/etc/kubernetes/kubeconfig", &kc);
    w2.write("/etc/kubernetes/ca.pem", &w.ca.pem);
    w2.write("/etc/kubernetes/token", "wrong-token\n");
    let before = api.seen().len();
    let mut args = w2.args();
    args.push("--verbose=debug".into());
    let r2 = nodestrap(&args, None, &[]);
    assert_eq!(r2.code, 1, "{}", r2.stderr);
    assert!(r2.stderr.contains("HTTP 401"), "{}", r2.stderr);
    assert!(
        r2.stderr
            .contains("the API server rejected the credentials of"),
        "{}",
        r2.stderr
    );
    assert!(w2.read("/etc/kubernetes/kubelet.env").is_none());
    assert_eq!(
        api.seen().len() - before,
        1,
        "401 is final: one /version request"
    );
    args.push("--version-fallback=always-after-deadline".into());
    let r3 = nodestrap(&args, None, &[]);
    r3.assert_ok();
    assert!(
        r3.stdout.contains("k8s=v1.9.6+coreos.0 from=fallback"),
        "{}",
        r3.stdout
    );
    assert!(r3.stdout.contains("HTTP 401"), "{}", r3.stdout);
    for out in [
        &r.stderr, &r.stdout, &r2.stderr, &r2.stdout, &r3.stderr, &r3.stdout,
    ] {
        assert!(
            !out.contains(token) && !out.contains("wrong-token"),
            "a token reached the output:\n{out}"
        );
    }
}

#[test]
fn proxy_variables_are_honoured() {
    let w = World::new();
    let proxy = Proxy::start();
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    nodestrap(&w.args(), None, &[("HTTPS_PROXY", &proxy_url)]).assert_ok();
    let t = proxy.targets.lock().unwrap().clone();
    assert!(
        t.iter()
            .any(|x| *x == format!("127.0.0.1:{}", w.files.port)),
        "{t:?}"
    );
    // NO_PROXY sends the same requests direct.
    let w2 = World::new();
    let before = proxy.targets.lock().unwrap().len();
    nodestrap(
        &w2.args(),
        None,
        &[("HTTPS_PROXY", &proxy_url), ("NO_PROXY", "127.0.0.1")],
    )
    .assert_ok();
    assert_eq!(proxy.targets.lock().unwrap().len(), before);
}

#[test]
fn api_server_without_the_configmap_falls_back_to_the_file() {
    let w = World::new();
    let (_api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("docker=17.06"), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("runtime mappings from the API unavailable")
            && r.stderr.contains("HTTP 404"),
        "{}",
        r.stderr
    );
    let file = w.path("/etc/kubernetes/installer/runtime-mappings.yaml");
    assert!(
        r.stderr.contains(&format!(
            "docker versions for Kubernetes v1.10.2+coreos.0: 17.06, 17.03 (from {})",
            file.display()
        )),
        "{}",
        r.stderr
    );
}

#[test]
fn mapping_file_keeps_1_10_apart_from_1_1() {
    let w = World::new();
    let mut w = w;
    w.extra.push("--force-kube-version=v1.1.0".into());
    w.write("/etc/kubernetes/installer/runtime-mappings.yaml",
        "kind: VersionManifestV1\nversions:\n  k8s:\n    1.1:\n        docker: [ \"17.03\" ]\n    1.10:\n        docker: [ \"17.06\" ]\n");
    let r = w.run();
    r.assert_ok();
    assert!(r.stdout.contains("k8s=v1.1.0 docker=17.03"), "{}", r.stdout);
}

#[test]
fn api_server_down_falls_back_to_installer_env() {
    let w = World::new();
    unreachable_api(&w);
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.9.6+coreos.0 docker=17.03"),
        "{}",
        r.stdout
    );
    // The fallback is said where an operator counts nodes: the log and the plan line.
    assert!(
        r.stderr
            .contains("a fallback: the API server is unreachable"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout
            .contains("nodestrap: k8s=v1.9.6+coreos.0 from=fallback (KUBELET_IMAGE_TAG in"),
        "{}",
        r.stdout
    );
    // ... and the status record, with the API server's last error.
    let (value, src) = w.decision("k8s");
    assert_eq!(value, "v1.9.6+coreos.0");
    assert!(
        src.starts_with("fallback (") && src.contains("the API server is unreachable: "),
        "{src}"
    );
    assert!(
        w.status(false).stdout.contains("from fallback ("),
        "the person's view says it too"
    );
}

/// One row of `nodestrap status` for a person.
fn row(key: &str, value: &str) -> String {
    format!("  {key:<16} {value}")
}

/// The kubeconfig of `w` pointed at a port nothing listens on.
fn unreachable_api(w: &World) {
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    let port = api.port;
    drop(api);
    let kc = w
        .read("/etc/kubernetes/kubeconfig")
        .unwrap()
        .replace(&format!(":{port}"), ":1");
    w.write("/etc/kubernetes/kubeconfig", &kc);
}

#[test]
fn version_fallback_never_fails_on_an_unreachable_api_server_and_writes_nothing() {
    let mut w = World::new();
    unreachable_api(&w);
    w.extra.push("--version-fallback=never".into());
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("unable to determine the cluster version: the API server is unreachable, and --version-fallback never does not let"),
        "{}",
        r.stderr
    );
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    // No kubeconfig at all is no better under `never`.
    std::fs::remove_file(w.path("/etc/kubernetes/kubeconfig")).unwrap();
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("no kubeconfig (none at ")
            && r.stderr
                .contains("give the node one of them, or set --force-kube-version"),
        "{}",
        r.stderr
    );
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
}

#[test]
fn a_busy_api_server_is_waited_for_and_its_version_used() {
    let w = World::new();
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    // Load shed twice, as a real API server's max-in-flight filter does (429, Retry-After: 1),
    // then a 503 from a proxy in front of it: more busy answers than --api-tries=2 allows for
    // failures without an answer, and none of them counts.
    api.queue("/version", Reply::busy(429, "1"));
    api.queue("/version", Reply::busy(429, "1"));
    api.queue("/version", Reply::busy(503, "1"));
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.10.2+coreos.0 docker=17.06"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("from=api-server"), "{}", r.stdout);
    let asked = api.requests("GET", "/version");
    assert_eq!(asked.len(), 4, "{}", r.stderr);
    for pair in asked.windows(2) {
        let waited = pair[1].at - pair[0].at;
        assert!(
            waited >= std::time::Duration::from_secs(1),
            "asked again after {waited:?}"
        );
    }
    assert!(r.stderr.contains("(Retry-After 1 s)"), "{}", r.stderr);
}

#[test]
fn a_run_that_ends_on_a_busy_server_hands_its_retry_after_to_the_next() {
    let mut w = World::new();
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    // A Retry-After past the run's deadline ends the run at once, busy (the initramfs unit's
    // run, cut short by its --deadline).
    api.queue("/version", Reply::busy(503, "6"));
    w.extra.push("--deadline=3".into());
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(api.requests("GET", "/version").len(), 1, "{}", r.stderr);
    // The next run (the real root's unit) waits for the moment the server named, then asks.
    w.extra.pop();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("starts from what the run before learned of its load"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("the server's last Retry-After named that moment"),
        "{}",
        r.stderr
    );
    let asked = api.requests("GET", "/version");
    assert_eq!(asked.len(), 2, "{}", r.stderr);
    let waited = asked[1].at - asked[0].at;
    assert!(
        waited >= std::time::Duration::from_millis(5900),
        "asked again after {waited:?}"
    );
    // Answered: nothing is left for a third run, which asks at once.
    let r = w.run();
    r.assert_ok();
    assert!(
        !r.stderr.contains("starts from what the run before"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_api_server_busy_until_the_deadline_is_not_guessed_past_by_default() {
    let mut w = World::new();
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    api.set("/version", Reply::busy(503, "1"));
    // Long enough for several answers even under qemu-user on a loaded machine (the arm64 run):
    // a first TLS handshake past the deadline would end the run as unreachable, not busy.
    w.extra.push("--deadline=8".into());
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("the API server is busy until the run's deadline (--deadline), and --version-fallback unreachable does not let"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("HTTP 503"), "{}", r.stderr);
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());
    // always-after-deadline: the node's files decide once the deadline has passed, and say why.
    w.extra
        .push("--version-fallback=always-after-deadline".into());
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains("k8s=v1.9.6+coreos.0 from=fallback"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("busy until the run's deadline"),
        "{}",
        r.stdout
    );
}

#[test]
fn update_pending_stages_both_stores_and_asks_for_a_reboot() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[
        "--on-attempt",
        "CHECKING_FOR_UPDATE,UPDATE_AVAILABLE,DOWNLOADING,VERIFYING,FINALIZING,UPDATED_NEED_REBOOT",
        "--new-version",
        NEXT,
        "--stale",
        "UPDATE_STATUS_IDLE",
    ]);
    let mut w = w;
    w.extra.push("--upgrade-os=true".into());
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "next-os={NEXT} reboot=needed (OS update to {NEXT} is pending)"
        )),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        w.store_listing(),
        vec![
            format!("{CUR}/docker:17.03.torcx.tgz"),
            format!("{NEXT}/docker:17.03.torcx.tgz")
        ]
    );
    // The image is fetched once and copied into the second store.
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 1);
    assert!(
        r.stderr.contains("not rebooting: --root is not /"),
        "{}",
        r.stderr
    );
}

#[test]
fn pending_update_read_with_get_status_only() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[
        "--status",
        "UPDATE_STATUS_UPDATED_NEED_REBOOT",
        "--new-version",
        NEXT,
    ]);
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!("next-os={NEXT}")),
        "{}",
        r.stdout
    );
    assert!(w.store_file(NEXT, "17.03").exists() && w.store_file(CUR, "17.03").exists());
}

#[test]
fn no_update_available_ends_at_idle() {
    let mut w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&["--on-attempt", "CHECKING_FOR_UPDATE,IDLE", "--silent"]);
    w.extra.push("--upgrade-os=true".into());
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(r.stdout.contains("next-os=none reboot=no"), "{}", r.stdout);
    assert_eq!(
        w.store_listing(),
        vec![format!("{CUR}/docker:17.03.torcx.tgz")]
    );
}

#[test]
fn update_wait_has_a_deadline() {
    let mut w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&["--on-attempt", "CHECKING_FOR_UPDATE,DOWNLOADING"]);
    w.extra
        .extend(["--upgrade-os=true".into(), "--update-timeout=1".into()]);
    w.run_on(&bus)
        .assert_fails(1, "update_engine did not settle within 1s");
    w.assert_nothing_written();
}

#[test]
fn first_boot_after_torcx_applied_the_vendor_runtime_reboots() {
    let w = World::new();
    // What a run killed at the rename of the cleanup unit's link left: the next run removes it.
    let requires = w.path("/run/systemd/system/umount.target.requires");
    std::fs::create_dir_all(&requires).unwrap();
    std::os::unix::fs::symlink(
        "../torcx-docker-cleanup.service",
        requires.join(".torcx-docker-cleanup.service.nodestrap-0123456789ab"),
    )
    .unwrap();
    w.write(
        "/run/torcx/profile.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}"#,
    );
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains(
            "reboot=needed (torcx applied docker com.coreos.cl in this boot, 17.03 is staged)"
        ),
        "{}",
        r.stdout
    );
    let unit = w
        .read("/run/systemd/system/torcx-docker-cleanup.service")
        .unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/rm -rf /var/lib/docker")
            && unit.contains("RequiredBy=umount.target")
    );
    let link = std::fs::read_link(
        w.path("/run/systemd/system/umount.target.requires/torcx-docker-cleanup.service"),
    )
    .unwrap();
    assert_eq!(link, Path::new("../torcx-docker-cleanup.service"));
    let left: Vec<_> = std::fs::read_dir(&requires)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["torcx-docker-cleanup.service"], "{}", r.stderr);
    // Same runtime already applied: no reboot, no wipe.
    let w2 = World::new();
    w2.write(
        "/run/torcx/profile.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"17.03"}]}}"#,
    );
    let r2 = w2.run();
    r2.assert_ok();
    assert!(r2.stdout.contains("reboot=no"), "{}", r2.stdout);
    assert!(!w2
        .path("/run/systemd/system/torcx-docker-cleanup.service")
        .exists());
}

#[test]
fn existing_user_next_profile_is_reused() {
    let w = World::new();
    w.write("/etc/torcx/profiles/mine.json", r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"rkt","reference":"1.0"},{"name":"docker","reference":"1.12"}]}}"#);
    w.write("/etc/torcx/next-profile", "mine.json\n");
    w.run().assert_ok();
    let p: serde_json::Value =
        serde_json::from_str(&w.read("/etc/torcx/profiles/mine.json").unwrap()).unwrap();
    assert_eq!(
        p["value"]["images"],
        serde_json::json!([{"name":"rkt","reference":"1.0"},{"name":"docker","reference":"17.03"}])
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "mine\n");
    assert!(!w.path("/etc/torcx/profiles/tectonic.json").exists());
}

#[test]
fn dry_run_writes_nothing() {
    let mut w = World::new();
    let mut bus = Bus::start();
    let calls = w.root.with_extension("calls");
    bus.update_engine(&[
        "--on-attempt",
        "CHECKING_FOR_UPDATE,UPDATED_NEED_REBOOT",
        "--new-version",
        NEXT,
        "--record",
        calls.to_str().unwrap(),
    ]);
    w.extra
        .extend(["--dry-run".into(), "--upgrade-os=true".into()]);
    w.write(
        "/run/torcx/profile.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}"#,
    );
    let r = w.run_on(&bus);
    r.assert_ok();
    assert!(r.stdout.contains("bootstrap planned"), "{}", r.stdout);
    // A dry run reads update_engine's status but never asks it to update.
    assert_eq!(std::fs::read_to_string(&calls).unwrap(), "GetStatus\n");
    for plan in [
        "plan: fetch",
        "plan: profile tectonic",
        "plan: write",
        "KUBELET_IMAGE_TAG=v1.9.6_coreos.0",
        "plan: install torcx-docker-cleanup.service",
    ] {
        assert!(
            r.stdout.contains(plan),
            "{plan:?} missing from\n{}",
            r.stdout
        );
    }
    w.assert_nothing_written();
    assert!(!w.path("/run/systemd/system").exists());
    assert_eq!(w.files.hits("/pkgs/docker-17.03.tgz"), 0);
    // Not even a status record.
    assert!(!Path::new(&w.run_dir).exists());
    assert!(!w.path("/var/lib/nodestrap").exists());
}

#[test]
fn gnupg_signed_manifest_interoperates() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gnupg");
    let mut w = World::new();
    let p = World::manifest_path(CUR);
    w.files.set(
        &p,
        Reply::ok(std::fs::read(fixtures.join("manifest.json")).unwrap()),
    );
    w.files.set(
        &format!("{p}.asc"),
        Reply::ok(std::fs::read(fixtures.join("manifest.json.asc")).unwrap()),
    );
    w.keyring = fixtures.join("keyring.asc");
    w.extra.push("--force-kube-version=v1.10.0".into());
    let r = w.run();
    r.assert_ok();
    // 17.06 is vendored in that manifest: nothing to download, the profile names it.
    assert!(r.stdout.contains("docker=17.06"), "{}", r.stdout);
    assert!(r.stderr.contains("shipped in its /usr"), "{}", r.stderr);
    assert_eq!(w.store_listing(), Vec::<String>::new());
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
}

// The tests by subject, as tests/sysext/ is laid out; the helpers each defines, for all.
#[allow(unused_imports)]
use {cluster::*, contract::*, failures::*, settings::*, torcx_finds::*};
#[path = "failures.rs"]
mod failures;

#[path = "settings.rs"]
mod settings;

#[path = "contract.rs"]
mod contract;

#[path = "torcx_finds.rs"]
mod torcx_finds;

#[path = "cluster.rs"]
mod cluster;
