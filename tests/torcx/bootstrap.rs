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
fn ranges(w: &World, path: &str) -> Vec<String> {
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

// ---- settings from the node's config file and the kernel command line -------------------

const CONF: &str = "/etc/nodestrap/bootstrap.conf";
/// The options the config file sets in these tests.
const FROM_CONF: &[&str] = &["--torcx-manifest-url", "--keyring", "--ca-file"];

impl World {
    /// A stand-in for /proc/cmdline, outside the root.
    fn cmdline(&self, text: &str) -> PathBuf {
        let p = self.root.with_extension("cmdline");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn run_with_cmdline(&self, args: &[String], cmdline: &Path) -> Run {
        nodestrap(
            args,
            None,
            &[("NODESTRAP_PROC_CMDLINE", cmdline.to_str().unwrap())],
        )
    }

    fn manifest_url(&self, prefix: &str) -> String {
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

// ---------------------------------------------------------------------------------------------
// The done marker never outlives a failed run

/// The world's run under strace, whose fault injection makes the real `fsync` fail with EIO
/// the way a dying disk does: the first fsync of `path` (or of anything, without a path).
fn run_with_fsync_failure(w: &World, path: Option<&Path>) -> Run {
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

fn kubelet_env_dir_listing(w: &World) -> Vec<String> {
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
fn billion_laughs() -> String {
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

// ---------------------------------------------------------------------------------------------
// Where torcx looks

/// The real torcx (`qemu/build-torcx`: github.com/coreos/torcx v0.2.0 from the Go module proxy),
/// named by NODESTRAP_TORCX (tests/run.sh sets it).
fn real_torcx() -> PathBuf {
    support::vars::torcx()
}

/// A real torcx image: `bin/docker` printing `version`, with its manifest.
fn torcx_image(version: &str) -> Vec<u8> {
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
fn boot_torcx(w: &World, cmdline: &str) -> (i32, String, Option<serde_json::Value>, String) {
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
    fn with_real_images(&self) {
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

// ---------------------------------------------------------------------------------------------
// A real API server

/// The real API server (kube-apiserver built from the k8s.io/kubernetes module,
/// tests/support/cluster.rs): bootstrap reads its /version and the runtime-mappings ConfigMap
/// as an identity RBAC allows exactly that, and stages what they say. An identity that may not
/// read the ConfigMap gets an error naming the 403, the verb and the resource, and nothing is
/// staged: the node's own mappings file is no stand-in for a cluster that refuses.
#[test]
fn a_real_api_server_decides_as_far_as_rbac_allows() {
    let c = support::cluster::cluster();
    c.apply(
        r#"{"apiVersion":"v1","kind":"List","items":[
  {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"tectonic-system"}},
  {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"tectonic-torcx-runtime-mappings","namespace":"tectonic-system"},
   "data":{"runtime-mappings.yaml":"kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.37\":\n      docker: [\"17.06\"]\n"}},
  {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"nodestrap-bootstrap","namespace":"tectonic-system"},
   "rules":[{"apiGroups":[""],"resources":["configmaps"],"resourceNames":["tectonic-torcx-runtime-mappings"],"verbs":["get"]}]},
  {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"nodestrap-bootstrap","namespace":"tectonic-system"},
   "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"nodestrap-bootstrap"},
   "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"nodestrap-bootstrap"}]}]}"#,
    );
    let version = c.kubectl(&["version", "-o", "json"]);
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    let git = version["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(git.starts_with("v1.37."), "{git}");

    let w = World::new();
    c.kubeconfig("nodestrap-bootstrap", &w.path("/etc/kubernetes/kubeconfig"));
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "bootstrap done k8s={git} docker=17.06 next-os=none reboot=no"
        )),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains(&format!("nodestrap: k8s={git} from=api-server"))
            || r.stdout
                .contains(&format!("nodestrap: k8s={git} from=api-server")),
        "{}{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        w.decision("runtime-mappings").1,
        "ConfigMap tectonic-system/tectonic-torcx-runtime-mappings key runtime-mappings.yaml"
    );
    assert_eq!(
        w.read("/etc/kubernetes/kubelet.env").unwrap(),
        format!("KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG={git}\n")
    );

    let w = World::new();
    c.kubeconfig("nodestrap-nobody", &w.path("/etc/kubernetes/kubeconfig"));
    let r = w.run();
    r.assert_fails(1, "HTTP 403");
    let last = r.stderr.lines().rfind(|l| l.starts_with("error")).unwrap();
    assert!(
        last.contains(r#"User "nodestrap-nobody" cannot get resource "configmaps""#)
            && last.contains(
                "runtime mappings: the API server refused these credentials the ConfigMap"
            ),
        "{last}"
    );
    w.assert_nothing_written();
    assert_eq!(w.files.seen().len(), 0, "nothing fetched");
}

/// Errors one step short of the fix, made whole: rejected credentials come first with what
/// fixes them; a kubeconfig whose CA does not sign the server names the CA field to change; a
/// manifest that is not there names the template that built its URL, not the server's page.
#[test]
fn api_and_manifest_errors_name_the_setting_that_fixes_them() {
    let mut w = World::new();
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    api.set("/version", Reply::status(401));
    w.extra.push("--version-fallback=never".into());
    let r = w.run();
    r.assert_fails(
        1,
        "unable to determine the cluster version: the API server rejected the credentials of ",
    );
    assert!(
        r.stderr.contains("give the node a kubeconfig whose credentials the cluster accepts, or set --force-kube-version"),
        "{}",
        r.stderr
    );
    // A kubeconfig whose CA is another one.
    let other = Ca::new("another CA");
    use base64::Engine as _;
    let kc = w.read("/etc/kubernetes/kubeconfig").unwrap();
    let ours = base64::engine::general_purpose::STANDARD.encode(&w.ca.pem);
    let theirs = base64::engine::general_purpose::STANDARD.encode(&other.pem);
    w.write("/etc/kubernetes/kubeconfig", &kc.replace(&ours, &theirs));
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("UnknownIssuer") && r.stderr.contains("add its CA with certificate-authority-data (or certificate-authority) of the cluster in "),
        "{}",
        r.stderr
    );
    // No manifest for this OS: the option and its template, and no HTML.
    w.extra = vec!["--force-kube-version=v1.10.2".into()];
    let p = World::manifest_path(CUR);
    w.files.set(
        &p,
        Reply {
            body: b"<!DOCTYPE HTML>\n<html><title>404</title></html>\n".to_vec(),
            ..Reply::status(404)
        },
    );
    let r = w.run();
    r.assert_fails(
        1,
        &format!(
            "no torcx manifest for OS {CUR} board amd64-usr there: check --torcx-manifest-url ("
        ),
    );
    assert!(!r.stderr.contains("DOCTYPE"), "{}", r.stderr);
    // Manifests from a server whose CA is not given: --ca-file is the fix.
    w.extra = vec!["--force-kube-version=v1.10.2".into()];
    let args: Vec<String> = w
        .args()
        .into_iter()
        .filter(|a| !a.starts_with("--ca-file"))
        .collect();
    let r = nodestrap(&args, None, &[]);
    r.assert_fails(1, "add its CA with --ca-file (a PEM file)");
    w.assert_nothing_written();
}

/// One boot of `w`'s root: a fresh /run, the real torcx generator as at boot, then
/// `nodestrap verify` in the same mount namespace (torcx's unpacked images live there), as
/// nodestrap-verify.service runs it, with `boot_id` as the kernel's boot ID. The generator's
/// exit code and log, then verify's exit code and log.
fn boot_and_verify(w: &World, boot_id: &str) -> (i32, String, i32, String) {
    boot_and_verify_with(w, boot_id, "--api-wait=0")
}

/// `boot_and_verify` with verify's `args`.
fn boot_and_verify_with(w: &World, boot_id: &str, args: &str) -> (i32, String, i32, String) {
    let _ = std::fs::remove_dir_all(w.path("/run"));
    verify_in(w, boot_id, true, args)
}

/// `nodestrap verify ARGS` once more in the boot `boot_and_verify` left (`generator`: boot
/// first).
fn verify_in(w: &World, boot_id: &str, generator: bool, args: &str) -> (i32, String, i32, String) {
    let gen = w.path("/usr/lib/systemd/system-generators/torcx-generator");
    std::fs::create_dir_all(gen.parent().unwrap()).unwrap();
    std::fs::copy(real_torcx(), &gen).unwrap();
    std::fs::create_dir_all(w.path("/usr/bin")).unwrap();
    std::fs::copy(bin(), w.path("/usr/bin/nodestrap")).unwrap();
    for d in ["/run", "/proc", "/gen", "/bin", "/boot-id", "/dev"] {
        std::fs::create_dir_all(w.path(d)).unwrap();
    }
    // The image's docker is a shell script: this machine's sh, with what it links.
    copy_with_libraries(w, "/bin/sh");
    std::fs::write(w.path("/proc/cmdline"), "ro quiet\n").unwrap();
    std::fs::write(w.path("/boot-id/id"), format!("{boot_id}\n")).unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "if [ \"$1\" = boot ]; then\n\
               chroot \"$0\" /usr/lib/systemd/system-generators/torcx-generator /gen /gen /gen 2>\"$0/gen.log\"; echo $? >\"$0/gen.rc\"\n\
             fi\n\
             mount --bind /dev \"$0/dev\"\n\
             chroot \"$0\" /usr/bin/nodestrap verify $2",
        )
        .arg(&w.root)
        .arg(if generator { "boot" } else { "again" })
        .arg(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NODESTRAP_BOOT_ID", "/boot-id/id")
        .env("NODESTRAP_RUN_DIR", "/run/nodestrap")
        .output()
        .unwrap();
    let gen_rc = w.read("/gen.rc").unwrap().trim().parse().unwrap();
    (
        gen_rc,
        w.read("/gen.log").unwrap_or_default(),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `program` and the shared libraries ldd names for it, at the same paths under `w`'s root.
fn copy_with_libraries(w: &World, program: &str) {
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .unwrap();
    let mut files = vec![program.to_string()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(p) = line.split_whitespace().find(|t| t.starts_with('/')) {
            files.push(p.to_string());
        }
    }
    for f in files {
        let to = w.path(&f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&f, &to).unwrap();
    }
}

/// Issue 28 on torcx, with the real torcx generator applying profiles as at boot: the boot
/// after the bootstrap runs docker 17.03 as chosen: verified, and the applied profile is kept
/// as the known-good one. The next bootstrap stages 17.06, whose archive is then broken on
/// disk: torcx does not apply the profile and docker is missing. The check finds it, records
/// expected and running, selects the known-good profile as next-profile and records the
/// reboot, which it does not take; once per boot. The boot after applies the known-good
/// profile, and the check passes again.
#[test]
fn a_torcx_profile_that_did_not_apply_is_found_and_the_known_good_one_selected() {
    if support::vars::runner().is_some() {
        // verify runs chrooted in the node's root, where no qemu-user is.
        return;
    }
    let w = World::new();
    w.with_real_images();
    w.run().assert_ok();
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    let (gen, log, code, out) = boot_and_verify(&w, "boot-1");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        "check torcx seal: expected sealed with profile tectonic, found sealed with profile tectonic",
        "check torcx applied docker: expected docker:17.03, found docker:17.03",
        "check /run/torcx/bin/docker --version: expected version 17.03, found version 17.03",
        "check kubelet /etc/kubernetes/kubelet.env KUBELET_IMAGE_TAG: expected v1.9.6_coreos.0, found v1.9.6_coreos.0",
        "verified: torcx applied profile tectonic with docker 17.03",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let known = w
        .read("/etc/torcx/profiles/nodestrap-known-good.json")
        .unwrap();
    assert!(known.contains("\"17.03\""), "{known}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["phase"], "verified", "{rec}");

    // The cluster moves to v1.10: docker 17.06 is staged, and its archive breaks on disk.
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    let staged = w.path(&format!(
        "/var/lib/torcx/store/{CUR}/docker:17.06.torcx.tgz"
    ));
    assert!(staged.exists());
    std::fs::write(&staged, b"not a gzip archive any more").unwrap();
    let (gen, log, code, out) = boot_and_verify(&w, "boot-2");
    assert_ne!(gen, 0, "torcx applied a broken archive: {log}");
    assert_eq!(code, 1, "{out}");
    for needle in [
        "check torcx seal: expected sealed with profile tectonic, found not sealed (/run/metadata/torcx missing): torcx did not complete",
        "check torcx applied docker: expected docker:17.06, found torcx applied no profile",
        "reboot needed: the boot check selected the known-good profile nodestrap-known-good (docker 17.03) as next-profile",
        "the reboot is recorded, not taken",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert_eq!(
        w.read("/etc/torcx/next-profile").unwrap(),
        "nodestrap-known-good\n"
    );
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    let v = &rec["verification"];
    assert_eq!(v["outcome"], "mismatch", "{rec}");
    assert_eq!(v["returned"]["to"][0]["version"], "17.03", "{rec}");
    assert_eq!(rec["reboot"]["decision"], "needed", "{rec}");
    assert_eq!(rec["phase"], "done", "{rec}");

    // The same boot checked again: no second return.
    let (_, _, code, out) = verify_in(&w, "boot-2", false, "--api-wait=0");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("expecting the known-good profile a check selected at boot boot-2"),
        "{out}"
    );

    // The next boot: torcx applies the known-good profile; the check passes.
    let (gen, log, code, out) = boot_and_verify(&w, "boot-3");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("verified: torcx applied profile nodestrap-known-good with docker 17.03"),
        "{out}"
    );
    // The next bootstrap edits its own profile, never the known-good one.
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("names \"nodestrap-known-good\", which is not a user profile"),
        "{}",
        r.stderr
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    assert_eq!(
        w.read("/etc/torcx/profiles/nodestrap-known-good.json")
            .unwrap(),
        known
    );
}

/// The known-good profile a first bootstrap keeps is the one torcx applied in its boot: on a
/// fresh node the vendor profile, whose docker is `com.coreos.cl` (the vendor store's link to
/// the shipped version). When the first chosen profile does not apply, the check returns to it
/// and, in the boot after, finds it running as the version the link names; the reboot it asked
/// for is then no longer pending.
#[test]
fn a_vendor_known_good_profile_is_returned_to_and_verified() {
    if support::vars::runner().is_some() {
        return;
    }
    let w = World::new();
    w.with_real_images();
    let store = w.path("/usr/share/torcx/store");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("docker:1.12.torcx.tgz"), torcx_image("1.12")).unwrap();
    std::os::unix::fs::symlink(
        "docker:1.12.torcx.tgz",
        store.join("docker:com.coreos.cl.torcx.tgz"),
    )
    .unwrap();
    w.write(
        "/usr/share/torcx/profiles/vendor.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}"#,
    );
    // Boot 0: torcx applies the vendor profile (no record yet: nothing to verify).
    let (gen, log, _, _) = boot_and_verify(&w, "boot-0");
    assert_eq!(gen, 0, "{log}");
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "{r}/run/torcx/profile.json kept as {r}/etc/torcx/profiles/nodestrap-known-good.json",
            r = w.root.display()
        )),
        "{}",
        r.stderr
    );
    let staged = w.path(&format!(
        "/var/lib/torcx/store/{CUR}/docker:17.03.torcx.tgz"
    ));
    std::fs::write(&staged, b"broken on disk").unwrap();
    let (gen, _, code, out) = boot_and_verify(&w, "boot-1");
    assert_ne!(gen, 0);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the known-good profile nodestrap-known-good (docker 1.12) as next-profile"),
        "{out}"
    );
    let (gen, log, code, out) = boot_and_verify(&w, "boot-2");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        "check torcx applied docker: expected docker:1.12, found docker:1.12",
        "verified: torcx applied profile nodestrap-known-good with docker 1.12",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["reboot"]["decision"], "no", "{rec}");
    assert_eq!(rec["phase"], "verified", "{rec}");
}

/// The torcx check asks the real kube-apiserver: a Node whose nodeInfo reports the chosen
/// kubelet and docker at the chosen release line (as a dockershim kubelet spells it, leading
/// zeros dropped) confirms the boot. A Node reporting a containerd the applied image does not
/// carry is the runtime's mismatch: the known-good profile is selected for the next boot. A
/// Node reporting another kubelet is recorded and fails, and the profile is left alone: the
/// kubelet comes from kubelet.env.
#[test]
fn the_real_api_server_confirms_or_contradicts_a_torcx_node() {
    if support::vars::runner().is_some() {
        return;
    }
    let c = support::cluster::cluster();
    let w = World::new();
    w.with_real_images();
    w.run().assert_ok();
    let node = format!("torcx-verify-{}", std::process::id());
    let user = format!("nodestrap-torcx-verify-{}", std::process::id());
    c.node_reader(&user, &w.path("/etc/kubernetes/kubelet.conf"));
    c.apply(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{node}\"}}}}"
    ));
    // As the kubelet reports: its versions, and its Ready heartbeat (now, or `at`).
    let report_at =
        |kubelet: &str, runtime: &str, at: &str| c.report_node(&node, kubelet, runtime, at);
    let report = |kubelet: &str, runtime: &str| report_at(kubelet, runtime, &support::utc_now());
    let args = |wait: u32| format!("--node-name={node} --api-wait={wait}");
    // A Node whose kubelet has not reported since this boot began is not judged: unreached.
    report_at("v1.9.5+coreos.0", "docker://17.3.2", "2020-01-01T00:00:00Z");
    let (gen, log, code, out) = boot_and_verify_with(&w, "boot-0", &args(3));
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "unreached", "{rec}");
    assert!(
        rec["verification"]["api_note"].as_str().unwrap().contains(
            "has not reported since this boot began (its Ready heartbeat: 2020-01-01T00:00:00Z)"
        ),
        "{rec}"
    );
    report("v1.9.6+coreos.0", "docker://17.3.2");
    let (gen, log, code, out) = boot_and_verify_with(&w, "boot-1", &args(20));
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        format!("check Node {node} nodeInfo.kubeletVersion: expected v1.9.6+coreos.0, found v1.9.6+coreos.0"),
        format!("check Node {node} nodeInfo.containerRuntimeVersion: expected docker://17.03, or a runtime in /run/torcx/bin at the version it says, found docker://17.3.2"),
    ] {
        assert!(out.contains(&needle), "{needle}: {out}");
    }
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "confirmed", "{rec}");
    assert!(rec["verification"]["local_s"].as_f64().is_some(), "{rec}");

    // Another kubelet: recorded, failed, the profile left alone.
    report("v1.9.5+coreos.0", "docker://17.3.2");
    let (_, _, code, out) = boot_and_verify_with(&w, "boot-2", &args(3));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.kubeletVersion: expected v1.9.6+coreos.0, found v1.9.5+coreos.0"
        )) && out.contains("nothing to return to: the kubelet comes from kubelet.env"),
        "{out}"
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "mismatch", "{rec}");
    assert_eq!(rec["reboot"]["decision"], "no", "{rec}");

    // A containerd the applied image does not carry: the runtime is not the chosen one.
    report("v1.9.6+coreos.0", "containerd://1.7.24");
    let (_, _, code, out) = boot_and_verify_with(&w, "boot-3", &args(3));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.containerRuntimeVersion: expected docker://17.03, or a runtime in /run/torcx/bin at the version it says, found containerd://1.7.24"
        )) && out.contains("as next-profile"),
        "{out}"
    );
    assert_eq!(
        w.read("/etc/torcx/next-profile").unwrap(),
        "nodestrap-known-good\n"
    );
}

/// Issue 34 on torcx: versions only go forward. A bootstrap for a v1.10 cluster stages docker
/// 17.06; the cluster's version goes back to v1.9, whose mappings want 17.03, validly signed
/// and offered: refused, naming the floor, and nothing changes. A wiped store does not lower
/// the floor. `--allow-downgrade docker=17.03` lets that exact version through once: logged,
/// recorded as a `downgrade` decision, and the floor is lowered to it.
#[test]
fn a_torcx_image_never_goes_below_its_floor_unless_named() {
    let mut w = World::new();
    let to = |w: &World, tag: &str| {
        w.write(
            "/etc/kubernetes/installer/kubelet.env",
            &format!("KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG={tag}\n"),
        );
        let _ = std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env"));
    };
    to(&w, "v1.10.2_coreos.0");
    w.run().assert_ok();
    assert_eq!(w.decision("docker").0, "17.06");
    let floor: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/torcx-floor.json").unwrap()).unwrap();
    assert_eq!(floor["floor"][0]["name"], "docker", "{floor}");
    assert_eq!(floor["floor"][0]["version"], "17.06", "{floor}");
    assert_eq!(floor["floor"][0]["how"], "raised", "{floor}");

    to(&w, "v1.9.6_coreos.0");
    let profile = w.read("/etc/torcx/profiles/tectonic.json").unwrap();
    std::fs::remove_dir_all(w.path("/var/lib/torcx/store")).unwrap();
    let r = w.run();
    r.assert_fails(1, "docker: every version");
    for needle in [
        "maps to is below the version floor: docker 17.03, 1.12 below the version floor 17.06 (staged at ",
        "/var/lib/nodestrap/torcx-floor.json) not considered; --allow-downgrade docker=VERSION lets one exact version through",
    ] {
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    }
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
    assert_eq!(
        w.read("/etc/torcx/profiles/tectonic.json").unwrap(),
        profile
    );
    assert!(w
        .read("/var/lib/nodestrap/torcx-floor.json")
        .unwrap()
        .contains("\"17.06\""));

    w.extra = vec!["--allow-downgrade=docker=17.03".into()];
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(
            "docker downgraded to 17.03 below its floor 17.06 (--allow-downgrade): the floor is lowered"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(w.decision("docker").0, "17.03");
    let (what, src) = w.decision("downgrade");
    assert_eq!(
        (what.as_str(), src.as_str()),
        ("docker 17.03", "--allow-downgrade, below the floor 17.06")
    );
    let floor: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/torcx-floor.json").unwrap()).unwrap();
    assert_eq!(floor["floor"][0]["version"], "17.03", "{floor}");
    assert_eq!(floor["floor"][0]["how"], "lowered", "{floor}");
}

/// The torcx manifest's locations as `oci://HOST/REPO@sha256:…`: the images published to
/// Debian's real docker-registry by deploy/publish-oci, each location pinned by its artifact's
/// manifest digest inside the signed manifest. Trust stays with the manifest's sha512.
#[test]
fn torcx_images_from_a_registry_pinned_by_digest_in_the_signed_manifest() {
    const USER: &str = "node";
    const PASSWORD: &str = "torcx-pull-s3cret";
    let mut w = World::new();
    let reg = Registry::start(
        &w.ca,
        RegistryAuth::Basic {
            user: USER.into(),
            password: PASSWORD.into(),
        },
        None,
    );
    let auth = reg.auth_json(USER, PASSWORD);
    let dir = unique_dir("torcx-images");
    let mut paths = Vec::new();
    for v in ["17.03", "17.06"] {
        let p = dir.join(format!("docker:{v}.torcx.tgz"));
        std::fs::write(&p, image(v)).unwrap();
        paths.push(p);
    }
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let said = reg.publish_as("torcx", &refs, "torcx/docker", Some(&auth), &w.ca_file);
    let location = |v: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("location docker:{v}.torcx.tgz: ")))
            .unwrap_or_else(|| panic!("no location for {v} in {said}"))
            .to_string()
    };
    assert!(
        location("17.03").starts_with(&format!("oci://{}/torcx/docker@sha256:", reg.host())),
        "{said}"
    );
    let manifest = |loc_03: &str| {
        format!(
            r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","versions":[{{"version":"17.03","hash":"{}","locations":[{{"url":"{loc_03}"}}]}},{{"version":"17.06","hash":"{}","locations":[{{"url":"{}"}}]}}]}}]}}}}"#,
            sha512(&image("17.03")),
            sha512(&image("17.06")),
            location("17.06")
        )
    };
    w.publish(CUR, &manifest(&location("17.03")));
    // The https copies are gone: only the registry has the images.
    w.files.set("/pkgs/docker-17.03.tgz", Reply::status(404));

    // Without credentials: refused, naming the option; nothing staged, no kubelet.env.
    let r = w.run();
    r.assert_fails(1, "--registry-auth");
    assert!(w.store_listing().is_empty(), "{:?}", w.store_listing());
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());

    w.extra.push(format!("--registry-auth={}", auth.display()));
    let r = w.run();
    r.assert_ok();
    assert_eq!(
        std::fs::read(w.store_file(CUR, "17.03")).unwrap(),
        image("17.03")
    );
    assert!(r.stderr.contains("hash verified"), "{}", r.stderr);
    assert!(!r.stderr.contains(PASSWORD));
    let log = reg.log();
    assert!(
        log.contains(&format!(
            "\"GET /v2/torcx/docker/manifests/{} HTTP/1.1\" 200",
            location("17.03").rsplit_once('@').unwrap().1
        )),
        "the manifest by its pinned digest: {log}"
    );
    assert!(
        !log.contains("\"GET /v2/torcx/docker/manifests/docker-"),
        "no tag asked for: {log}"
    );

    // A location pinned to another artifact (17.06's) for 17.03: its layer is not titled
    // docker:17.03.torcx.tgz; refused, the store left as it was.
    let before = w.store_listing();
    std::fs::remove_file(w.store_file(CUR, "17.03")).unwrap();
    w.publish(CUR, &manifest(&location("17.06")));
    let r = w.run();
    r.assert_fails(1, "no layer titled docker:17.03.torcx.tgz");
    assert_eq!(w.store_listing().len(), before.len() - 1);

    // A blob swapped in the registry's storage: refused by the signed sha512.
    w.publish(CUR, &manifest(&location("17.03")));
    let hex = format!("{:x}", sha2::Sha256::digest(image("17.03")));
    let mut other = image("17.03");
    other[0] ^= 0xff;
    std::fs::write(reg.blob(&hex), &other).unwrap();
    let r = w.run();
    r.assert_fails(1, "hash mismatch");
    assert!(!w.store_file(CUR, "17.03").exists());
}
