//! `nodestrap hook` end to end: the built binary against a temp host root, a file server, a
//! fake API server that checks credentials and records patches, and a private D-Bus with the
//! test update_engine.

#[path = "../support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sha2::Digest as _;
use support::*;

const CUR: &str = "2345.3.0";
const NEXT: &str = "2411.1.0";
const NODE: &str = "worker-1.example.internal";
const KEY: &str = "container-linux-update.v1.coreos.com/tectonic-torcx-pre-hook-ok";
const TOKEN: &str = "hook-sa-token-0123456789";
const MAPPINGS: &str = "kind: VersionManifestV1\nversions:\n  k8s:\n    1.9:\n        docker: [ \"17.03\", \"1.12\"]\n    1.10:\n        docker: [ \"17.06\", \"17.03\" ]\n";

fn image(version: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 << 10);
    let mut h = sha2::Sha512::digest(version.as_bytes()).to_vec();
    while out.len() < 200 << 10 {
        h = sha2::Sha512::digest(&h).to_vec();
        out.extend_from_slice(&h);
    }
    out
}

fn sha512(b: &[u8]) -> String {
    let hex: String = sha2::Sha512::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    format!("sha512-{hex}")
}

fn node_path() -> String {
    format!("/api/v1/nodes/{NODE}")
}

struct World {
    root: PathBuf,
    /// Pod-side files: keyring, CA, mappings, service account.
    pod: PathBuf,
    ca: Ca,
    files: Server,
    api: Server,
    signer: Signer_,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl NodeRoot for World {
    fn root(&self) -> &Path {
        &self.root
    }
}

impl World {
    fn new() -> World {
        let root = unique_dir("hook-root");
        let pod = unique_dir("hook-pod");
        let ca = Ca::new("nodestrap hook test CA");
        let files = Server::start(&ca.server(), None);
        let api = Server::start(&ca.server(), None);
        api.require_bearer(TOKEN);
        let node = serde_json::json!({"apiVersion":"v1","kind":"Node","metadata":{"name":NODE,"annotations":{KEY:"true"}}});
        api.set(
            &format!("PATCH {}", node_path()),
            Reply::ok(node.to_string()),
        );
        let signer = Signer_::new("torcx signer <torcx@nodestrap.invalid>");
        std::fs::write(pod.join("keyring.asc"), signer.keyring()).unwrap();
        std::fs::write(pod.join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(pod.join("runtime-mappings.yaml"), MAPPINGS).unwrap();
        let sa = pod.join("serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), format!("{TOKEN}\n")).unwrap();
        std::fs::write(sa.join("ca.crt"), &ca.pem).unwrap();
        let env = vec![
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), api.port.to_string()),
            ("NODESTRAP_SA_DIR".into(), sa.display().to_string()),
            ("NODE".into(), NODE.into()),
        ];
        let w = World {
            root,
            pod,
            ca,
            files,
            api,
            signer,
            extra: Vec::new(),
            env,
        };
        w.write(
            "/usr/lib/os-release",
            &format!("ID=flatcar\nVERSION_ID={CUR}\nCOREOS_BOARD=\"amd64-usr\"\n"),
        );
        w.write(
            "/etc/kubernetes/kubelet.env",
            "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\n",
        );
        for os in [CUR, NEXT] {
            w.publish(os);
        }
        for v in ["17.03", "17.06"] {
            w.files
                .set(&format!("/pkgs/docker-{v}.tgz"), Reply::ok(image(v)));
        }
        w
    }

    fn publish(&self, os: &str) {
        let vs: Vec<String> = ["17.03", "17.06"]
            .iter()
            .map(|v| {
                format!(
                    r#"{{"version":"{v}","hash":"{}","locations":[{{"url":"{}"}}]}}"#,
                    sha512(&image(v)),
                    self.files.url(&format!("/pkgs/docker-{v}.tgz"))
                )
            })
            .collect();
        let m = format!(
            r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","versions":[{}]}}]}}}}"#,
            vs.join(",")
        );
        let p = format!("/manifests/amd64-usr/{os}/torcx_manifest.json");
        self.files.set(&p, Reply::ok(m.as_bytes().to_vec()));
        self.files.set(
            &format!("{p}.asc"),
            Reply::ok(self.signer.sign(m.as_bytes())),
        );
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "hook".into(),
            format!("--root={}", self.root.display()),
            format!(
                "--torcx-manifest-url={}",
                self.files
                    .url("/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json")
            ),
            format!("--keyring={}", self.pod.join("keyring.asc").display()),
            format!("--ca-file={}", self.pod.join("ca.pem").display()),
            format!(
                "--version-manifest={}",
                self.pod.join("runtime-mappings.yaml").display()
            ),
            "--verbose=debug".into(),
            "--api-tries=2".into(),
            "--api-retry-delay=0".into(),
            "--fetch-attempts=2".into(),
            "--fetch-backoff-ms=10".into(),
        ];
        a.extend(self.extra.iter().cloned());
        a
    }

    fn run_on(&self, bus: Option<&Bus>) -> Run {
        Run::from(
            self.command(None, &self.args(), bus.map(|b| b.address.as_str()))
                .output()
                .unwrap(),
        )
    }

    /// The binary with this world's environment (argv0 for the multicall name).
    fn command(&self, argv0: Option<&str>, args: &[String], bus: Option<&str>) -> Command {
        let mut c = command_as(argv0, args, bus);
        c.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    /// With update_engine on the bus and idle: no update pending.
    fn run_idle(&self) -> Run {
        let mut bus = Bus::start();
        bus.update_engine(&[]);
        self.run_on(Some(&bus))
    }

    fn unset_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    fn set_env(&mut self, key: &str, value: &str) {
        self.unset_env(key);
        self.env.push((key.into(), value.into()));
    }

    fn store(&self) -> PathBuf {
        self.path("/var/lib/torcx/store")
    }

    /// Old stores with content, a non-version dir and a loose file: what GC must tell apart.
    fn seed_store(&self) {
        for (dir, file) in [
            ("1000.0.0", "docker:1.12.torcx.tgz"),
            ("1500.0.0/sub", "x"),
            (CUR, "keep-me"),
            ("custom", "docker:17.03.torcx.tgz"),
            ("3000.0.0", "newer"),
        ] {
            self.write(&format!("/var/lib/torcx/store/{dir}/{file}"), "old");
        }
        self.write("/var/lib/torcx/store/loose.txt", "loose");
        self.write(
            "/var/lib/torcx/store/999.0.0",
            "a loose file named like a version",
        );
        // A symlinked old store must not lead the removal outside.
        let outside = self.root.with_extension("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("precious"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, self.store().join("1200.0.0")).unwrap();
    }

    fn store_names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.store())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn patches(&self) -> Vec<Seen> {
        self.api.requests("PATCH", &node_path())
    }

    /// Nothing a bootstrap would do on its own: no kubelet.env rewrite, no cleanup unit.
    fn assert_no_bootstrap_side_effects(&self) {
        assert_eq!(
            std::fs::read_to_string(self.path("/etc/kubernetes/kubelet.env")).unwrap(),
            "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\n",
            "kubelet.env is the node's, untouched"
        );
        assert!(
            !self.path("/run/systemd/system").exists(),
            "no cleanup unit"
        );
        assert!(!self.path("/etc/kubernetes/installer").exists());
    }
}

fn temp_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(".nodestrap-") {
            out.push(e.path().display().to_string());
        }
        if e.file_type().unwrap().is_dir() {
            out.extend(temp_files(&e.path()));
        }
    }
    out
}

fn pending_bus(record: Option<&Path>) -> Bus {
    let mut bus = Bus::start();
    let mut args = vec![
        "--status".to_string(),
        "UPDATE_STATUS_UPDATED_NEED_REBOOT".into(),
        "--new-version".into(),
        NEXT.into(),
    ];
    if let Some(r) = record {
        args.extend(["--record".into(), r.display().to_string()]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    bus.update_engine(&refs);
    bus
}

fn assert_annotation_patch(p: &Seen) {
    assert_eq!(
        p.header("content-type"),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        p.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let body: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"metadata":{"annotations":{KEY:"true"}}})
    );
}

#[test]
fn update_pending_stages_next_collects_old_stores_and_annotates() {
    let w = World::new();
    w.seed_store();
    let calls = w.pod.join("update_engine.calls");
    let bus = pending_bus(Some(&calls));
    let r = w.run_on(Some(&bus));
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "nodestrap: hook done k8s=v1.10.2+coreos.0 docker=17.06 next-os={NEXT} annotated={KEY}"
        )),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    // The verified image in the next version's store (and the current one's).
    for os in [NEXT, CUR] {
        assert_eq!(
            std::fs::read(w.store().join(os).join("docker:17.06.torcx.tgz")).unwrap(),
            image("17.06"),
            "{os}"
        );
    }
    assert_eq!(w.files.hits("/pkgs/docker-17.06.tgz"), 1);
    let profile: serde_json::Value = serde_json::from_slice(
        &std::fs::read(w.path("/etc/torcx/profiles/tectonic.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        profile["value"]["images"],
        serde_json::json!([{"name":"docker","reference":"17.06"}])
    );
    assert_eq!(
        std::fs::read_to_string(w.path("/etc/torcx/next-profile")).unwrap(),
        "tectonic\n"
    );
    // Older versioned dirs gone; current, next, newer, non-version dirs and files kept; the
    // symlink named like an old version is not a store dir and its target is untouched.
    assert_eq!(
        w.store_names(),
        vec![
            "1200.0.0",
            CUR,
            NEXT,
            "3000.0.0",
            "999.0.0",
            "custom",
            "loose.txt"
        ]
    );
    assert!(w.store().join(CUR).join("keep-me").exists());
    assert!(w.store().join("custom/docker:17.03.torcx.tgz").exists());
    assert!(w.root.with_extension("outside").join("precious").exists());
    // Annotated once, with a merge patch.
    let patches = w.patches();
    assert_eq!(patches.len(), 1);
    assert_annotation_patch(&patches[0]);
    // update_engine was only asked, never told to update; no reboot, no kubelet.env write.
    assert_eq!(std::fs::read_to_string(&calls).unwrap().trim(), "GetStatus");
    w.assert_no_bootstrap_side_effects();
    assert!(!r.stderr.contains(TOKEN), "token in the log:\n{}", r.stderr);
    assert!(
        !r.stderr.contains("rebooting") && !r.stderr.contains("reboot needed"),
        "{}",
        r.stderr
    );
    // The run's status record, in the same schema as bootstrap's, read by `nodestrap status`.
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status-hook.json").unwrap()).unwrap();
    assert_eq!(rec["command"], "hook", "{rec}");
    assert_eq!(rec["state"], "done", "{rec}");
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "docker" && d["value"] == "17.06"),
        "{rec}"
    );
    let root = format!("--root={}", w.root.display());
    let s = nodestrap(
        &["status".into(), root.clone(), "--command=hook".into()],
        None,
        &[],
    );
    s.assert_ok();
    assert!(s.stdout.starts_with("nodestrap hook "), "{}", s.stdout);
    // No bootstrap record on this root: `all` shows the hook's, with its exit code.
    let s = nodestrap(
        &["status".into(), root.clone(), "--command=all".into()],
        None,
        &[],
    );
    s.assert_ok();
    assert!(s.stdout.contains("nodestrap hook "), "{}", s.stdout);
    let s = nodestrap(&["status".into(), root], None, &[]);
    assert_eq!(s.code, 4, "no bootstrap record: {}", s.stderr);
}

#[test]
fn no_update_pending_removes_nothing_and_still_annotates() {
    let w = World::new();
    w.seed_store();
    let before = w.store_names();
    let mut bus = Bus::start();
    bus.update_engine(&[]);
    let r = w.run_on(Some(&bus));
    r.assert_ok();
    assert!(
        r.stdout.contains("docker=17.06 next-os=none annotated="),
        "{}",
        r.stdout
    );
    let mut expected = before;
    expected.sort();
    assert_eq!(w.store_names(), expected, "nothing removed");
    assert!(w.store().join("1000.0.0/docker:1.12.torcx.tgz").exists());
    assert!(w.store().join(CUR).join("docker:17.06.torcx.tgz").exists());
    assert_eq!(w.patches().len(), 1);
    assert_annotation_patch(&w.patches()[0]);
    w.assert_no_bootstrap_side_effects();
}

#[test]
fn no_update_engine_fails_without_annotation() {
    let w = World::new();
    w.seed_store();
    let r = w.run_on(None);
    r.assert_fails(
        1,
        "update_engine cannot be asked for the pending OS version",
    );
    assert!(w.store().join("1000.0.0").exists(), "nothing collected");
    assert!(w.patches().is_empty(), "no annotation");
    let s = nodestrap(
        &[
            "status".into(),
            format!("--root={}", w.root.display()),
            "--command=hook".into(),
        ],
        None,
        &[],
    );
    assert_eq!(s.code, 1, "{}", s.stdout);
    assert!(
        s.stdout.contains("FAILED (exit 1)") && s.stdout.contains("update_engine"),
        "{}",
        s.stdout
    );
}

#[test]
fn conflict_on_the_first_patch_is_retried() {
    let w = World::new();
    w.api.queue(
        &format!("PATCH {}", node_path()),
        Reply {
            status: 409,
            body: br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Operation cannot be fulfilled on nodes \"worker-1\": the object has been modified","reason":"Conflict","code":409}"#.to_vec(),
            ..Reply::status(409)
        },
    );
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    r.assert_ok();
    let patches = w.patches();
    assert_eq!(patches.len(), 2, "{}", r.stderr);
    for p in &patches {
        assert_annotation_patch(p);
    }
    assert!(
        r.stderr.contains("the object has been modified"),
        "{}",
        r.stderr
    );
}

#[test]
fn persistent_conflict_fails_naming_the_request() {
    let w = World::new();
    w.api
        .set(&format!("PATCH {}", node_path()), Reply::status(409));
    let r = w.run_idle();
    r.assert_fails(
        1,
        &format!(
            "PATCH https://127.0.0.1:{}/api/v1/nodes/{NODE}: HTTP 409",
            w.api.port
        ),
    );
    assert!(
        r.stderr.contains("status 409 from the test server"),
        "{}",
        r.stderr
    );
    assert_eq!(w.patches().len(), 4);
    assert!(!r.stdout.contains("hook done"));
}

#[test]
fn api_server_down_fails_without_partial_files() {
    let mut w = World::new();
    w.seed_store();
    w.set_env("KUBERNETES_SERVICE_PORT", &dead_port().to_string());
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    r.assert_fails(1, "PATCH https://127.0.0.1:");
    assert!(
        r.stderr.contains("giving up after 2 attempts"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("hook done"), "{}", r.stdout);
    assert_eq!(temp_files(&w.store()), Vec::<String>::new());
    // Whatever was staged is complete and verified.
    let staged = w.store().join(NEXT).join("docker:17.06.torcx.tgz");
    if staged.exists() {
        assert_eq!(std::fs::read(staged).unwrap(), image("17.06"));
    }
    assert!(
        w.api.seen().is_empty(),
        "the live API server was never asked"
    );
    w.assert_no_bootstrap_side_effects();
}

#[test]
fn wrong_token_is_refused_and_nothing_is_annotated() {
    let mut w = World::new();
    let sa = w.pod.join("serviceaccount");
    std::fs::write(sa.join("token"), "not-the-token\n").unwrap();
    w.set_env("NODESTRAP_SA_DIR", &sa.display().to_string());
    let r = w.run_idle();
    r.assert_fails(1, "HTTP 401");
    // The 401 is final: one try, not retried.
    assert_eq!(w.patches().len(), 1);
}

#[test]
fn missing_node_name_exits_2_before_touching_anything() {
    let mut w = World::new();
    w.unset_env("NODE");
    // Even the node's files may be missing: nothing is read before the name is checked.
    std::fs::remove_dir_all(&w.root).unwrap();
    let r = w.run_idle();
    r.assert_fails(2, "no node name");
    assert!(!w.root.exists());
    assert!(w.api.seen().is_empty() && w.files.seen().is_empty());
    // An empty --node-name with no NODE is the same.
    w.extra.push("--node-name=".into());
    w.run_on(None).assert_fails(2, "no node name");
}

#[test]
fn node_name_flag_wins_over_env_and_is_checked() {
    let mut w = World::new();
    w.set_env("NODE", "other-node");
    w.extra.push(format!("--node-name={NODE}"));
    w.run_idle().assert_ok();
    assert_eq!(w.patches().len(), 1);
    let mut w = World::new();
    w.extra.push("--node-name=../../namespaces".into());
    w.run_on(None).assert_fails(2, "not a valid node name");
    let mut w = World::new();
    w.extra.push("--node-annotation=bad key".into());
    w.run_on(None)
        .assert_fails(2, "--node-annotation \"bad key\": not a valid key");
}

#[test]
fn in_cluster_service_account_is_used_without_kubeconfig() {
    let w = World::new();
    let r = w.run_idle();
    r.assert_ok();
    let seen = w.api.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the patch: no GET /version, no ConfigMap"
    );
    assert_annotation_patch(&seen[0]);
    assert!(r.stderr.contains("the service account in"), "{}", r.stderr);
}

#[test]
fn kubeconfig_with_client_certificate() {
    let mut w = World::new();
    let client_ca = Ca::new("kube client CA");
    let api = Server::start(&w.ca.server(), Some(&client_ca));
    let node =
        serde_json::json!({"kind":"Node","metadata":{"name":NODE,"annotations":{KEY:"true"}}});
    api.set(
        &format!("PATCH {}", node_path()),
        Reply::ok(node.to_string()),
    );
    let leaf = client_ca.client("system:serviceaccount:hook");
    std::fs::write(w.pod.join("client.pem"), &leaf.cert_pem).unwrap();
    std::fs::write(w.pod.join("client-key.pem"), &leaf.key_pem).unwrap();
    let kc = w.pod.join("kubeconfig");
    std::fs::write(&kc, format!(
        "clusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority: ca.pem}}\nusers:\n- name: u\n  user: {{client-certificate: client.pem, client-key: client-key.pem}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        api.url(""))).unwrap();
    // No service account env: the kubeconfig alone must do.
    w.unset_env("KUBERNETES_SERVICE_HOST");
    w.extra.push(format!("--kubeconfig={}", kc.display()));
    w.run_idle().assert_ok();
    let patches = api.requests("PATCH", &node_path());
    assert_eq!(patches.len(), 1);
    assert!(patches[0].client_cert);
    assert!(w.api.seen().is_empty());
}

#[test]
fn missing_kubelet_env_fails_without_annotation() {
    let w = World::new();
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run_on(None);
    r.assert_fails(1, "kubelet.env does not exist");
    assert!(w.api.seen().is_empty());
    assert!(
        !w.path("/etc/kubernetes/kubelet.env").exists(),
        "never written"
    );
}

#[test]
fn bad_signature_fails_without_annotation() {
    let w = World::new();
    let p = format!("/manifests/amd64-usr/{NEXT}/torcx_manifest.json.asc");
    let other = Signer_::new("mallory <m@nodestrap.invalid>");
    w.files.set(&p, Reply::ok(other.sign(b"something else")));
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(w.api.seen().is_empty());
    assert!(!w.store().join(NEXT).join("docker:17.06.torcx.tgz").exists());
}

#[test]
fn sleep_stays_up_and_exits_0_on_sigterm() {
    let mut w = World::new();
    w.extra.push("--sleep=3600".into());
    let mut bus = Bus::start();
    bus.update_engine(&[]);
    let mut child = w
        .command(None, &w.args(), Some(&bus.address))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("nodestrap: hook done"), "{line:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "must stay up");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = exit_within(&mut child, 5, || "SIGTERM'd".into());
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(w.patches().len(), 1);
}

#[test]
fn multicall_name_runs_the_hook() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.update_engine(&[]);
    let out = w
        .command(
            Some("/tectonic-torcx-hook-pre"),
            &w.args()[1..],
            Some(&bus.address),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("hook done"));
}

/// A tmpfs mounted on a directory for the length of a test: a store GC cannot remove.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {} (tests run as root)", at.display());
        std::fs::write(at.join("docker:1.12.torcx.tgz"), "old").unwrap();
        Mounted(at.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn an_unremovable_old_store_is_skipped_and_the_others_collected() {
    let w = World::new();
    w.seed_store();
    for old in ["1100.0.0", "1300.0.0", "1400.0.0", "1600.0.0"] {
        w.write(
            &format!("/var/lib/torcx/store/{old}/docker:1.12.torcx.tgz"),
            "old",
        );
    }
    // Readdir order is the file system's: with stores on both sides of the mount point, one
    // of them always comes after it.
    let _m = Mounted::tmpfs(&w.store().join("1250.0.0"));
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "old torcx store {} not removed, skipped",
            w.store().join("1250.0.0").display()
        )),
        "{}",
        r.stderr
    );
    let names = w.store_names();
    for gone in [
        "1000.0.0", "1100.0.0", "1300.0.0", "1400.0.0", "1500.0.0", "1600.0.0",
    ] {
        assert!(!names.contains(&gone.to_string()), "{gone} kept: {names:?}");
    }
    assert!(w.store().join("1250.0.0/docker:1.12.torcx.tgz").exists());
    assert_eq!(w.patches().len(), 1, "still annotated");
}

#[test]
fn a_hash_mismatch_leaves_no_empty_store_directory() {
    let w = World::new();
    w.files.set(
        "/pkgs/docker-17.06.tgz",
        Reply::ok(b"not the image".to_vec()),
    );
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("hash mismatch"), "{}", r.stderr);
    assert!(!w.store().join(NEXT).exists(), "{:?}", w.store_names());
    assert!(w.patches().is_empty());
}

/// An API server that answers 503 to every PATCH: the hook ends at its --deadline with the
/// reason, annotates nothing, and leaves the node as it was (nothing staged stays, the profile
/// and next-profile are the node's, no old store was collected: that comes only after the
/// annotation). Its default deadline is 600 s (docs/hook.md).
#[test]
fn a_busy_api_server_ends_the_hook_at_its_deadline_and_changes_nothing() {
    let mut w = World::new();
    w.seed_store();
    w.write(
        "/etc/torcx/profiles/tectonic.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"17.03"}]}}"#,
    );
    w.write("/etc/torcx/next-profile", "tectonic\n");
    w.api
        .set(&format!("PATCH {}", node_path()), Reply::busy(503, "1"));
    w.extra.push("--deadline=6".into());
    let before = support::faults::snapshot_but_records(&w.root);
    let bus = pending_bus(None);
    let start = std::time::Instant::now();
    let r = w.run_on(Some(&bus));
    let took = start.elapsed();
    r.assert_fails(1, "busy: 503, Retry-After 1; giving up after");
    assert!(took < std::time::Duration::from_secs(12), "took {took:?}");
    assert!(r.stderr.contains("the node is as it was"), "{}", r.stderr);
    assert!(w.patches().len() >= 2, "asked again while busy");
    let after = support::faults::snapshot_but_records(&w.root);
    assert_eq!(before, after, "{}", support::faults::diff(&before, &after));
}

/// The real API server (tests/support/cluster.rs): the hook patches its own Node as an identity
/// RBAC allows `get` and `patch` on that Node only. For a Node it may not patch, the error names
/// the 403, the verb and the resource, and the node is as it was (what the hook staged is taken
/// back: nothing staged stays behind a refused annotation).
#[test]
fn a_real_api_server_lets_the_hook_annotate_only_its_node() {
    let c = support::cluster::cluster();
    let other = "worker-2.example.internal";
    c.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{NODE}"}}}},
  {{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{other}"}}}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{{"name":"nodestrap-hook:{NODE}"}},
   "rules":[{{"apiGroups":[""],"resources":["nodes"],"resourceNames":["{NODE}"],"verbs":["get","patch"]}}]}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{{"name":"nodestrap-hook:{NODE}"}},
   "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"nodestrap-hook:{NODE}"}},
   "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"nodestrap-hook"}}]}}]}}"#
    ));
    let mut w = World::new();
    let kubeconfig = w.pod.join("hook.kubeconfig");
    c.kubeconfig("nodestrap-hook", &kubeconfig);
    w.extra
        .push(format!("--kubeconfig={}", kubeconfig.display()));
    let bus = pending_bus(None);
    w.run_on(Some(&bus)).assert_ok();
    let annotations = c.kubectl(&[
        "get",
        "node",
        NODE,
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(
        annotations.contains(&format!(r#""{KEY}":"true""#)),
        "{annotations}"
    );

    let mut w = World::new();
    w.extra
        .push(format!("--kubeconfig={}", kubeconfig.display()));
    w.set_env("NODE", other);
    let before = support::faults::snapshot_but_records(&w.root);
    let r = w.run_on(Some(&bus));
    r.assert_fails(1, "HTTP 403");
    let last = r.stderr.lines().rfind(|l| l.starts_with("error")).unwrap();
    assert!(
        last.contains(&format!(
            r#"nodes \"{other}\" is forbidden: User \"nodestrap-hook\" cannot patch resource \"nodes\""#
        )) || last.contains(&format!(
            r#"nodes "{other}" is forbidden: User "nodestrap-hook" cannot patch resource "nodes""#
        )),
        "{last}"
    );
    assert!(last.contains("the node is as it was"), "{last}");
    let after = support::faults::snapshot_but_records(&w.root);
    assert_eq!(before, after, "{}", support::faults::diff(&before, &after));
    let annotations = c.kubectl(&[
        "get",
        "node",
        other,
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(!annotations.contains(KEY), "{annotations}");
}

/// Issue 28: every command that keeps a record sends its events with `--events-url`: the
/// hook's decisions reach the receiver in order, from its start to its end.
#[test]
fn the_hooks_decisions_reach_an_events_receiver() {
    let mut w = World::new();
    w.seed_store();
    let run = unique_dir("run");
    w.env
        .push(("NODESTRAP_RUN_DIR".into(), run.display().to_string()));
    let receiver = Server::start(&w.ca.server(), None);
    receiver.set("/events", Reply::ok(""));
    let ca = w.pod.join("events-ca.pem");
    std::fs::write(&ca, &w.ca.pem).unwrap();
    w.extra
        .push(format!("--events-url={}", receiver.url("/events")));
    w.extra.push(format!("--events-ca-file={}", ca.display()));
    w.run_idle().assert_ok();
    let got: Vec<serde_json::Value> = receiver
        .requests("POST", "/events")
        .iter()
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect();
    let kinds: Vec<String> = got
        .iter()
        .map(|e| match e["kind"].as_str().unwrap() {
            "decision" => format!("decision:{}", e["what"].as_str().unwrap()),
            k => k.to_string(),
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("started"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("finished"),
        "{kinds:?}"
    );
    for d in ["decision:events", "decision:docker"] {
        assert!(kinds.iter().any(|k| k == d), "{d}: {kinds:?}");
    }
    assert_eq!(got.last().unwrap()["exit_code"], 0);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["command"], "hook", "{e}");
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
    }
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("status-hook.json")).unwrap())
            .unwrap();
    assert_eq!(rec["events"]["sent"], got.len() as u64, "{rec}");
}

#[test]
fn the_next_versions_image_comes_from_a_registry_pinned_by_digest() {
    const USER: &str = "hook";
    const PASSWORD: &str = "hook-pull-s3cret";
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
    let dir = unique_dir("hook-images");
    let file = dir.join("docker:17.06.torcx.tgz");
    std::fs::write(&file, image("17.06")).unwrap();
    let said = reg.publish_as(
        "torcx",
        &[file.as_path()],
        "torcx/docker",
        Some(&auth),
        &w.pod.join("ca.pem"),
    );
    let location = said
        .lines()
        .find_map(|l| l.strip_prefix("location docker:17.06.torcx.tgz: "))
        .unwrap_or_else(|| panic!("no location in {said}"))
        .to_string();
    // The next OS's signed manifest names the registry only; the https copy is gone.
    let m = format!(
        r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","versions":[{{"version":"17.06","hash":"{}","locations":[{{"url":"{location}"}}]}}]}}]}}}}"#,
        sha512(&image("17.06"))
    );
    for os in [CUR, NEXT] {
        let p = format!("/manifests/amd64-usr/{os}/torcx_manifest.json");
        w.files.set(&p, Reply::ok(m.as_bytes().to_vec()));
        w.files
            .set(&format!("{p}.asc"), Reply::ok(w.signer.sign(m.as_bytes())));
    }
    w.files.set("/pkgs/docker-17.06.tgz", Reply::status(404));
    w.extra.push(format!("--registry-auth={}", auth.display()));
    let bus = pending_bus(None);
    let r = w.run_on(Some(&bus));
    r.assert_ok();
    for os in [NEXT, CUR] {
        assert_eq!(
            std::fs::read(w.store().join(os).join("docker:17.06.torcx.tgz")).unwrap(),
            image("17.06"),
            "{os}"
        );
    }
    assert_eq!(w.files.hits("/pkgs/docker-17.06.tgz"), 0);
    assert!(!r.stderr.contains(PASSWORD), "{}", r.stderr);
    let log = reg.log();
    assert!(
        log.contains(&format!(
            "\"GET /v2/torcx/docker/manifests/{} HTTP/1.1\" 200",
            location.rsplit_once('@').unwrap().1
        )),
        "the manifest by its pinned digest: {log}"
    );
    assert_eq!(w.patches().len(), 1);
    w.assert_no_bootstrap_side_effects();
}

/// Issue 49: the hook failing (EIO, ENOSPC) at every mutating call of a staging with an update
/// pending, or killed (SIGKILL) at every rename and fsync: each case leaves every path as it
/// was before or as a clean run leaves it, and after a kill the next run finishes the job.
#[test]
fn fault_matrix_of_a_hook_staging() {
    use support::faults::*;
    if !native() {
        return;
    }
    let w = World::new();
    w.seed_store();
    let bus = pending_bus(None);
    let work = w.root.with_extension("faults");
    std::fs::create_dir_all(&work).unwrap();
    let pristine = work.join("pristine");
    copy_tree(&w.root, &pristine);
    let before = snapshot(&w.root, &["var/lib/nodestrap"]);
    let cmd = || w.command(None, &w.args(), Some(bus.address.as_str()));
    let (calls, run) = trace(&cmd(), &work.join("trace"));
    run.assert_ok();
    let after = snapshot(&w.root, &["var/lib/nodestrap"]);
    assert!(
        std::fs::read(w.store().join(NEXT).join("docker:17.06.torcx.tgz")).unwrap()
            == image("17.06")
    );
    assert!(calls.len() > 10, "{calls:#?}");
    // The collection of old stores is best effort: a store that cannot be removed is skipped
    // (`an_unremovable_old_store_is_skipped_and_the_others_collected`).
    matrix_with(
        &w.root,
        &pristine,
        &work,
        &cmd,
        &calls,
        (&before, &after),
        Removals::BestEffort,
    );
}
