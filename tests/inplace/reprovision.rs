//! `nodestrap reprovision` and `nodestrap preflight` end to end: the built binary against a temp
//! host root and a Secret folder, an Ignition server and a payload server that insist on their
//! tokens, a progress endpoint that records events, a fake API server that records the label
//! patch, a registry and mirrors, and stand-in machine-config-daemon and extraction programs
//! that record what they were given.

#[path = "../support/mod.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::Digest as _;
use support::*;

mod faults;

const NODE: &str = "worker-7.example.internal";
const LABEL: &str = "ibm-cloud.kubernetes.io/ipb-schedule";
const IGN_TOKEN: &str = "ign-token-5f1e0c2a9b";
const PAYLOAD_TOKEN: &str = "payload-token-77aa11";
const PROGRESS_TOKEN: &str = "progress-token-c0ffee";
const SA_TOKEN: &str = "reprovision-sa-token-31337";
const RENDERED: &str = "rendered-worker-5d8a2c1f";
const MCO_IMAGE: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:1234abcd";
const ENCAPSULATED: &str = "/etc/ignition-machine-config-encapsulated.json";
const PAYLOAD_PATH: &str = "/bootstrap/payload.tar.gz";
const PAYLOAD_QUERY: &str = "?workerID=w-0042&clusterID=c-abc&region=us-south";

fn data_url(b: &[u8]) -> String {
    format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(b)
    )
}

fn decode(source: &str) -> Vec<u8> {
    let b64 = source.split_once(";base64,").unwrap().1;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

/// What a machine-config-server serves for a worker (docs/reprovision.md, RHCOS).
fn served_config() -> Value {
    let mc = json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"name": RENDERED},
        "spec": {"osImageURL": "quay.io/openshift-release-dev/rhcos@sha256:feed", "kernelArguments": ["nosmt"],
                 "config": {"ignition": {"version": "3.2.0"}}}});
    json!({"ignition": {"version": "3.2.0"},
        "storage": {"files": [
            {"path": ENCAPSULATED, "contents": {"source": data_url(mc.to_string().as_bytes())}, "mode": 420, "overwrite": true},
            {"path": "/etc/kubernetes/kubeconfig", "contents": {"source": "data:,served-kubeconfig"}, "mode": 384},
            {"path": "/etc/motd", "contents": {"source": "data:,reprovisioned%0A"}, "mode": 420}]},
        "systemd": {"units": [
            {"name": "machine-config-daemon-firstboot.service", "enabled": true,
             "contents": format!("[Unit]\nDescription=Machine Config Daemon Firstboot\n[Service]\nType=oneshot\nExecStart=/usr/bin/podman run --rm --privileged --net=host -v /:/rootfs --entrypoint machine-config-daemon '{MCO_IMAGE}' firstboot-complete-machineconfig\n")},
            {"name": "kubelet.service", "enabled": true, "contents": "[Service]\nExecStart=/usr/bin/kubelet\n"}]}})
}

struct World {
    root: PathBuf,
    secret: PathBuf,
    rec: PathBuf,
    ca: Ca,
    ign: Server,
    api: Server,
    progress: Server,
    registry: Server,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl NodeRoot for World {
    fn root(&self) -> &std::path::Path {
        &self.root
    }
}

impl World {
    fn new(os_id: &str) -> World {
        let root = unique_dir("rp-root");
        let secret = unique_dir("rp-secret");
        let rec = unique_dir("rp-rec");
        let pod = unique_dir("rp-pod");
        let ca = Ca::new("nodestrap reprovision test CA");
        let ign = Server::start(&ca.server(), None);
        ign.require_bearer(IGN_TOKEN);
        ign.set("/ignition", Reply::ok(served_config().to_string()));
        let api = Server::start(&ca.server(), None);
        api.require_bearer(SA_TOKEN);
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}}});
        api.set(
            &format!("/api/v1/nodes/{NODE}"),
            Reply::ok(node.to_string()),
        );
        let progress = Server::start(&ca.server(), None);
        progress.require_bearer(PROGRESS_TOKEN);
        progress.set("POST /events", Reply::ok("{}"));
        progress.set("GET /events", Reply::status(405));
        let registry = Server::start(&ca.server(), None);
        registry.set("/v2/", Reply::status(401));
        let sa = pod.join("serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), SA_TOKEN).unwrap();
        std::fs::write(sa.join("ca.crt"), &ca.pem).unwrap();
        let w = World {
            root,
            secret,
            rec,
            ca,
            ign,
            api,
            progress,
            registry,
            extra: Vec::new(),
            env: vec![
                ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
                ("KUBERNETES_SERVICE_PORT".into(), String::new()),
                ("NODESTRAP_SA_DIR".into(), sa.display().to_string()),
                ("NODE".into(), NODE.into()),
                ("NODESTRAP_BOOT_ID".into(), String::new()),
            ],
        };
        let mut w = w;
        w.set_env("KUBERNETES_SERVICE_PORT", &w.api.port.to_string());
        w.boot("boot-1");
        w.write(
            "/usr/lib/os-release",
            &format!("NAME=\"Test\"\nID={os_id}\nVERSION_ID=\"4.14\"\n"),
        );
        w.write("/etc/kubernetes/kubeconfig", "node-current-kubeconfig\n");
        w.secret_key("ca.crt", &w.ca.pem.clone());
        w.secret_key("progress-url", &w.progress.url("/events"));
        w.secret_key("progress-token", PROGRESS_TOKEN);
        w.secret_key("registry-url", &format!("127.0.0.1:{}", w.registry.port));
        match os_id {
            "rhcos" => {
                w.secret_key("ignition-url", &w.ign.url("/ignition"));
                w.secret_key("ignition-token", IGN_TOKEN);
                w.secret_key("kubeconfig", "secret-kubeconfig\n");
                let mcd = w.standin_mcd();
                w.extra.push(format!("--mcd-binary={}", mcd.display()));
            }
            _ => {
                w.secret_key("payload-url", &w.ign.url(PAYLOAD_PATH));
                w.secret_key("payload-token", PAYLOAD_TOKEN);
                w.secret_key("worker-id", "w-0042");
                w.secret_key("cluster-id", "c-abc\n");
                w.secret_key("region", "us-south");
                w.ign.require_bearer(PAYLOAD_TOKEN);
            }
        }
        w
    }

    fn boot(&mut self, id: &str) {
        let p = self.rec.join("boot_id");
        std::fs::write(&p, format!("{id}\n")).unwrap();
        self.set_env("NODESTRAP_BOOT_ID", &p.display().to_string());
    }

    fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    /// Keys as a Secret volume lays them out: symlinks into a `..data` folder.
    fn secret_key(&self, key: &str, value: &str) {
        let data = self.secret.join("..2026_11_22_05_00_00.000000001");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join(key), value).unwrap();
        let link = self.secret.join("..data");
        if !link.exists() {
            std::os::unix::fs::symlink("..2026_11_22_05_00_00.000000001", &link).unwrap();
        }
        let k = self.secret.join(key);
        let _ = std::fs::remove_file(&k);
        std::os::unix::fs::symlink(format!("..data/{key}"), k).unwrap();
    }

    fn drop_key(&self, key: &str) {
        std::fs::remove_file(self.secret.join(key)).unwrap();
    }

    fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.rec.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Records its arguments and the MachineConfig, prints to both streams, and renames the
    /// file away as the real one does once it has applied it.
    fn standin_mcd(&self) -> PathBuf {
        let rec = self.rec.display();
        self.script(
            "machine-config-daemon",
            &format!(
                "printf '%s\\n' \"$@\" >>{rec}/mcd-args\necho run >>{rec}/mcd-runs\n\
                 f=\"$3{ENCAPSULATED}\"\ncp \"$f\" {rec}/mc.json\nstat -c %a \"$f\" >{rec}/mc.mode\n\
                 mv \"$f\" \"$f.bak\"\necho 'mcd: applying {RENDERED}'\necho 'mcd: a warning' >&2\n"
            ),
        )
    }

    fn args(&self, cmd: &str) -> Vec<String> {
        let mut a = vec![
            cmd.to_string(),
            format!("--root={}", self.root.display()),
            format!("--secret-dir={}", self.secret.display()),
            "--verbose=debug".into(),
            "--api-tries=2".into(),
            "--api-retry-delay=0".into(),
            "--fetch-attempts=2".into(),
            "--fetch-backoff-ms=10".into(),
        ];
        a.extend(self.extra.iter().cloned());
        a
    }

    fn command(&self, cmd: &str) -> Command {
        let mut c = command(&self.args(cmd), None);
        c.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    fn run(&self, cmd: &str) -> Run {
        let r = Run::from(self.command(cmd).output().unwrap());
        for secret in [IGN_TOKEN, PAYLOAD_TOKEN, PROGRESS_TOKEN, SA_TOKEN] {
            assert!(
                !r.stderr.contains(secret) && !r.stdout.contains(secret),
                "a token reached the output:\n{}",
                r.stderr
            );
        }
        r
    }

    fn label_patches(&self) -> Vec<Seen> {
        self.api.requests("PATCH", &format!("/api/v1/nodes/{NODE}"))
    }

    /// (phase, status) of every progress event, in order.
    fn events(&self) -> Vec<(String, String)> {
        self.progress
            .requests("POST", "/events")
            .iter()
            .map(|s| {
                assert_eq!(
                    s.header("authorization"),
                    Some(format!("Bearer {PROGRESS_TOKEN}").as_str())
                );
                let v: Value = serde_json::from_slice(&s.body).unwrap();
                assert_eq!(v["node"], NODE);
                assert!(v["time"].as_str().unwrap().ends_with('Z'));
                (
                    v["phase"].as_str().unwrap().to_string(),
                    v["status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn state(&self) -> Option<Value> {
        std::fs::read(self.path("/var/lib/nodestrap/reprovision/state.json"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn mcd_runs(&self) -> usize {
        std::fs::read_to_string(self.rec.join("mcd-runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Nothing on the node or the Node changed.
    fn assert_untouched(&self) {
        assert!(!self.path(ENCAPSULATED).exists());
        assert!(self.state().is_none(), "no state file");
        assert!(self.label_patches().is_empty(), "no label patch");
        assert_eq!(self.mcd_runs(), 0);
        assert!(!self.rec.join("entry-ran").exists());
        assert!(!self.path("/var/lib/nodestrap/reprovision/payload").exists());
        assert!(!self
            .path("/var/lib/nodestrap/reprovision/payload.tar.gz")
            .exists());
    }

    fn serve_payload(&self, tgz: Vec<u8>) {
        self.ign
            .set(&format!("{PAYLOAD_PATH}{PAYLOAD_QUERY}"), Reply::ok(tgz));
    }
}

fn evs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

const ALL_PHASES: &[(&str, &str)] = &[
    ("preflight", "started"),
    ("preflight", "succeeded"),
    ("fetch", "started"),
    ("fetch", "succeeded"),
    ("configure", "started"),
    ("configure", "succeeded"),
    ("reboot", "started"),
    ("reboot", "succeeded"),
];

// ---------------------------------------------------------------------------------------------
// RHCOS

#[test]
fn rhcos_hands_the_completed_config_to_the_mcd_and_drops_the_label() {
    let mut w = World::new("rhcos");
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(
        r.stderr.contains("flow rhcos (from ID=rhcos in"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains("CHECK") && r.stdout.contains("ignition"),
        "{}",
        r.stdout
    );

    // The Ignition server saw the token; the label went by merge patch, before the MCD ran.
    let get = &w.ign.requests("GET", "/ignition")[0];
    assert_eq!(
        get.header("authorization"),
        Some(format!("Bearer {IGN_TOKEN}").as_str())
    );
    let patches = w.label_patches();
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].header("content-type"),
        Some("application/merge-patch+json")
    );
    let body: Value = serde_json::from_slice(&patches[0].body).unwrap();
    assert_eq!(body, json!({"metadata": {"labels": {LABEL: null}}}));

    // The MCD got the documented flags and a MachineConfig with the completed config.
    let args = std::fs::read_to_string(w.rec.join("mcd-args")).unwrap();
    assert_eq!(
        args.lines().collect::<Vec<_>>(),
        [
            "firstboot-complete-machineconfig",
            "--root-mount",
            w.root.to_str().unwrap(),
            "--machineconfig-file",
            ENCAPSULATED
        ]
    );
    assert_eq!(
        std::fs::read_to_string(w.rec.join("mc.mode"))
            .unwrap()
            .trim(),
        "600"
    );
    let mc: Value = serde_json::from_slice(&std::fs::read(w.rec.join("mc.json")).unwrap()).unwrap();
    assert_eq!(mc["kind"], "MachineConfig");
    assert_eq!(mc["apiVersion"], "machineconfiguration.openshift.io/v1");
    assert_eq!(mc["metadata"]["name"], RENDERED);
    assert_eq!(
        mc["spec"]["osImageURL"],
        "quay.io/openshift-release-dev/rhcos@sha256:feed"
    );
    assert_eq!(mc["spec"]["kernelArguments"], json!(["nosmt"]));
    let files = mc["spec"]["config"]["storage"]["files"].as_array().unwrap();
    let by_path = |p: &str| -> Vec<&Value> { files.iter().filter(|f| f["path"] == p).collect() };
    let kc = by_path("/etc/kubernetes/kubeconfig");
    assert_eq!(kc.len(), 1, "replaced, not duplicated: {files:?}");
    assert_eq!(
        decode(kc[0]["contents"]["source"].as_str().unwrap()),
        b"secret-kubeconfig\n"
    );
    assert_eq!(
        (kc[0]["mode"].clone(), kc[0]["overwrite"].clone()),
        (json!(420), json!(true))
    );
    let ann = by_path("/etc/machine-config-daemon/node-annotations.json");
    assert_eq!(ann.len(), 1);
    let ann: Value =
        serde_json::from_slice(&decode(ann[0]["contents"]["source"].as_str().unwrap())).unwrap();
    assert_eq!(
        ann,
        json!({"machineconfiguration.openshift.io/currentConfig": RENDERED,
               "machineconfiguration.openshift.io/desiredConfig": RENDERED,
               "machineconfiguration.openshift.io/state": "Done"})
    );
    assert!(by_path(ENCAPSULATED).is_empty());
    assert_eq!(by_path("/etc/motd").len(), 1);
    assert_eq!(
        mc["spec"]["config"]["systemd"]["units"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // MCD output went to the log line by line; progress events in order; state handed off.
    assert!(
        r.stderr.contains("machine-config-daemon: mcd: applying"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("machine-config-daemon: mcd: a warning"),
        "{}",
        r.stderr
    );
    assert_eq!(w.events(), evs(ALL_PHASES));
    let st = w.state().unwrap();
    assert_eq!(
        (st["phase"].as_str(), st["config"].as_str()),
        (Some("reboot-pending"), Some(RENDERED))
    );

    // Run again in the same boot (the MCD's reboot is under way): no fetch, no patch, no MCD.
    let fetches = w.ign.seen().len();
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stdout.contains("(reboot pending)"), "{}", r.stdout);
    assert_eq!(w.ign.seen().len(), fetches, "fetched again");
    assert_eq!(w.mcd_runs(), 1, "the MCD ran again");
    assert_eq!(w.label_patches().len(), 1, "patched again");

    // After the MCD's reboot: done, and nothing is done again.
    w.boot("boot-2");
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(
        r.stderr.contains("rebooted into its new configuration"),
        "{}",
        r.stderr
    );
    assert_eq!(w.state().unwrap()["phase"], "done");
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stderr.contains("already reprovisioned"), "{}", r.stderr);
    assert_eq!(w.mcd_runs(), 1);
    assert_eq!(w.label_patches().len(), 1);
    assert_eq!(w.ign.requests("GET", "/ignition").len(), 1);
}

#[test]
fn rhcos_without_a_kubeconfig_key_uses_the_nodes_and_extracts_the_mcd() {
    let mut w = World::new("rhcos");
    w.drop_key("kubeconfig");
    w.extra.clear();
    let mcd = w.standin_mcd();
    let rec = w.rec.display().to_string();
    let extract = w.script(
        "extract",
        &format!("echo \"$@\" >{rec}/extract-args\ncp {} \"$2/machine-config-daemon\"\nchmod 0600 \"$2/machine-config-daemon\"\n", mcd.display()),
    );
    w.extra.push(format!(
        "--mcd-extract-command={} {{image}} {{dir}} --root {{root}}",
        extract.display()
    ));
    w.run("reprovision").assert_ok();
    let dir = w.path("/var/lib/nodestrap/reprovision/mcd");
    assert_eq!(
        std::fs::read_to_string(w.rec.join("extract-args"))
            .unwrap()
            .trim(),
        format!("{MCO_IMAGE} {} --root {}", dir.display(), w.root.display())
    );
    let mc: Value = serde_json::from_slice(&std::fs::read(w.rec.join("mc.json")).unwrap()).unwrap();
    let kc = mc["spec"]["config"]["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/etc/kubernetes/kubeconfig")
        .unwrap()
        .clone();
    assert_eq!(
        decode(kc["contents"]["source"].as_str().unwrap()),
        b"node-current-kubeconfig\n"
    );
    assert_eq!(w.mcd_runs(), 1);
}

#[test]
fn rhcos_failed_extraction_keeps_the_label() {
    let mut w = World::new("rhcos");
    w.extra.clear();
    let extract = w.script(
        "extract",
        "echo 'oc: unauthorized: authentication required' >&2\nexit 1\n",
    );
    w.extra.push(format!(
        "--mcd-extract-command={} {{image}} {{dir}}",
        extract.display()
    ));
    let r = w.run("reprovision");
    r.assert_fails(1, "mcd-extract: exited with status 1");
    assert!(r.stderr.contains("oc: unauthorized"), "{}", r.stderr);
    // The Node is unchanged, so the DaemonSet runs again; nothing was handed over.
    assert!(w.label_patches().is_empty());
    assert!(!w.path(ENCAPSULATED).exists());
    assert!(w.state().is_none());
    assert_eq!(w.mcd_runs(), 0);
    assert_eq!(
        w.events().last().unwrap(),
        &("configure".to_string(), "failed".to_string())
    );
    w.extra.push("--mcd-extract-command= ".into());
    w.run("reprovision")
        .assert_fails(2, "--mcd-extract-command is empty");
}

#[test]
fn rhcos_bad_inputs_change_nothing() {
    // Wrong token: 401 from the Ignition server.
    let w = World::new("rhcos");
    w.secret_key("ignition-token", "not-the-token");
    let r = w.run("reprovision");
    r.assert_fails(1, "preflight failed: ignition");
    assert!(r.stderr.contains("HTTP 401"), "{}", r.stderr);
    assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
    w.assert_untouched();
    assert_eq!(
        w.events(),
        evs(&[("preflight", "started"), ("preflight", "failed")])
    );

    // A ca.crt that did not sign the server's certificate.
    let w = World::new("rhcos");
    w.secret_key("ca.crt", &Ca::new("some other CA").pem);
    let r = w.run("reprovision");
    r.assert_fails(1, "preflight failed: ignition");
    assert!(r.stderr.contains("certificate"), "{}", r.stderr);
    assert!(w.ign.requests("GET", "/ignition").is_empty());
    w.assert_untouched();

    // Not JSON, and spec 2.
    for (body, why) in [
        ("<html>login</html>", "invalid JSON"),
        (
            r#"{"ignition":{"version":"2.2.0"},"storage":{}}"#,
            "Ignition spec \"2.2.0\" is not supported",
        ),
    ] {
        let w = World::new("rhcos");
        w.ign.set("/ignition", Reply::ok(body));
        let r = w.run("reprovision");
        r.assert_fails(1, why);
        assert!(
            r.stderr.contains(&w.ign.url("/ignition")),
            "names the URL: {}",
            r.stderr
        );
        w.assert_untouched();
    }

    // No rendered config name in the served config: fails before anything is written.
    let w = World::new("rhcos");
    w.ign.set(
        "/ignition",
        Reply::ok(r#"{"ignition":{"version":"3.2.0"}}"#),
    );
    w.run("reprovision")
        .assert_fails(1, "no rendered config name");
    w.assert_untouched();
}

#[test]
fn mcd_failure_is_reported_and_a_rerun_converges() {
    let mut w = World::new("rhcos");
    w.extra.clear();
    let rec = w.rec.display().to_string();
    let flaky = w.script(
        "flaky-mcd",
        &format!("if [ ! -e {rec}/failed-once ]; then touch {rec}/failed-once; echo 'rpm-ostree: error' >&2; exit 1; fi\nexec {} \"$@\"\n", w.standin_mcd().display()),
    );
    w.extra.push(format!("--mcd-binary={}", flaky.display()));
    w.run("reprovision").assert_fails(1, "exited with status 1");
    assert_eq!(
        w.events().last().unwrap(),
        &("reboot".to_string(), "failed".to_string())
    );
    assert!(w.path(ENCAPSULATED).exists());
    // Same boot, run again (the operator relabels): converges.
    w.run("reprovision").assert_ok();
    assert_eq!(w.mcd_runs(), 1);
    w.boot("boot-2");
    w.run("reprovision").assert_ok();
    assert_eq!(w.state().unwrap()["phase"], "done");
}

// ---------------------------------------------------------------------------------------------
// RHEL

fn tgz(entries: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    for (name, data, mode) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        // Raw name bytes: the Builder would refuse `..` and absolute names.
        let n = &mut h.as_old_mut().name;
        n[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// The entry script first (so it is unpacked and would run), then a symlink.
fn with_symlink(script: &str, name: &str, target: &str) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(script.len() as u64);
    h.set_mode(0o755);
    b.append_data(&mut h, "bootstrap.sh", script.as_bytes())
        .unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, name, target).unwrap();
    b.into_inner().unwrap().finish().unwrap()
}

fn entry_script(rec: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\nenv | sort >{rec}/entry-env\npwd >{rec}/entry-pwd\ncat lib/data.txt >>{rec}/entry-ran\n\
         echo \"configuring worker $WORKER_ID in $CLUSTER_ID\"\necho 'a note on stderr' >&2\n\
         printf 'no newline at the end'\n"
    )
    .into_bytes()
}

fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[test]
fn rhel_runs_the_verified_payload_with_a_clean_environment() {
    let mut w = World::new("rhel");
    let rec = w.rec.display().to_string();
    let script = entry_script(&rec);
    let payload = tgz(&[
        ("bootstrap.sh", &script, 0o755),
        ("lib/data.txt", b"payload data\n", 0o644),
    ]);
    w.secret_key(
        "payload-sha256",
        &format!("sha256:{}", sha256_hex(&payload)),
    );
    w.serve_payload(payload);
    w.set_env("SHOULD_NOT_LEAK", "x");
    let r = w.run("reprovision");
    r.assert_ok();

    // The ids went as query parameters, with the token.
    let get = &w
        .ign
        .requests("GET", &format!("{PAYLOAD_PATH}{PAYLOAD_QUERY}"))[0];
    assert_eq!(
        get.header("authorization"),
        Some(format!("Bearer {PAYLOAD_TOKEN}").as_str())
    );
    assert!(
        r.stderr.contains("verified against payload-sha256"),
        "{}",
        r.stderr
    );
    // The script ran in the payload folder with only the variables it is given.
    assert_eq!(
        std::fs::read_to_string(w.rec.join("entry-ran")).unwrap(),
        "payload data\n"
    );
    let pwd = std::fs::read_to_string(w.rec.join("entry-pwd")).unwrap();
    assert!(
        pwd.trim()
            .ends_with("/var/lib/nodestrap/reprovision/payload"),
        "{pwd}"
    );
    let env = std::fs::read_to_string(w.rec.join("entry-env")).unwrap();
    let names: Vec<&str> = env
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .filter(|n| *n != "PWD" && *n != "SHLVL" && *n != "_")
        .collect();
    assert_eq!(
        names,
        [
            "CLUSTER_ID",
            "HOME",
            "HOST_ROOT",
            "LANG",
            "NODE_NAME",
            "PATH",
            "REGION",
            "WORKER_ID"
        ],
        "{env}"
    );
    assert!(
        env.contains("WORKER_ID=w-0042\n")
            && env.contains("CLUSTER_ID=c-abc\n")
            && env.contains("REGION=us-south\n")
    );
    // Its output, line by line, stdout and stderr, the unterminated last line too.
    for l in [
        "bootstrap.sh: configuring worker w-0042 in c-abc",
        "bootstrap.sh: a note on stderr",
        "bootstrap.sh: no newline at the end",
    ] {
        assert!(r.stderr.contains(l), "missing {l:?}:\n{}", r.stderr);
    }
    // Label removed, reboot asked for (and declined: the root is not this system), no payload left.
    assert_eq!(w.label_patches().len(), 1);
    assert!(
        r.stderr.contains("reboot needed (reprovisioned in place"),
        "{}",
        r.stderr
    );
    assert!(!w.path("/var/lib/nodestrap/reprovision/payload").exists());
    assert!(!w
        .path("/var/lib/nodestrap/reprovision/payload.tar.gz")
        .exists());
    let mode = std::fs::metadata(w.path("/var/lib/nodestrap/reprovision"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    // The reboot was declined, not accepted: no "succeeded" for it.
    let mut want = evs(&ALL_PHASES[..7]);
    want.push(("reboot".into(), "skipped".into()));
    assert_eq!(w.events(), want);
    assert_eq!(w.state().unwrap()["phase"], "reboot-pending");

    // After the reboot: done; the script does not run again.
    w.boot("boot-2");
    w.run("reprovision").assert_ok();
    w.run("reprovision").assert_ok();
    assert_eq!(
        std::fs::read_to_string(w.rec.join("entry-ran")).unwrap(),
        "payload data\n"
    );
    assert_eq!(w.state().unwrap()["phase"], "done");
}

#[test]
fn rhel_refuses_unsafe_payloads_before_running_anything() {
    let rec_marker = |w: &World| w.rec.join("entry-ran");
    type MakePayload = Box<dyn Fn(&str) -> Vec<u8>>;
    let cases: Vec<(&str, MakePayload, &str)> = vec![
        (
            "dotdot",
            Box::new(|s: &str| {
                tgz(&[
                    ("bootstrap.sh", s.as_bytes(), 0o755),
                    ("lib/../../../evil", b"x", 0o644),
                ])
            }),
            "..",
        ),
        (
            "absolute",
            Box::new(|s: &str| {
                tgz(&[
                    ("bootstrap.sh", s.as_bytes(), 0o755),
                    ("/tmp/evil-abs", b"x", 0o644),
                ])
            }),
            "absolute",
        ),
        (
            "symlink-out",
            Box::new(|s: &str| with_symlink(s, "escape", "../../../../etc")),
            "escape: symlink target ../../../../etc leaves the folder",
        ),
    ];
    for (name, make, why) in cases {
        let w = World::new("rhel");
        let script = format!("#!/bin/sh\ntouch {}\n", rec_marker(&w).display());
        w.serve_payload(make(&script));
        let r = w.run("reprovision");
        r.assert_fails(1, why);
        assert!(
            !rec_marker(&w).exists(),
            "{name}: the entry script must not run"
        );
        assert!(w.label_patches().is_empty(), "{name}");
        assert!(
            !w.path("/var/lib/nodestrap/reprovision/payload").exists(),
            "{name}"
        );
        assert!(
            // Where `lib/../../../evil` from the payload folder would land, and the absolute one.
            !w.path("/var/lib/nodestrap/evil").exists()
                && !std::path::Path::new("/tmp/evil-abs").exists()
        );
        assert_eq!(
            w.events().last().unwrap(),
            &("configure".to_string(), "failed".to_string()),
            "{name}"
        );
    }
}

#[test]
fn rhel_sha_mismatch_failing_and_hanging_scripts() {
    // A payload that is not the one the Secret names.
    let w = World::new("rhel");
    w.secret_key("payload-sha256", &"0".repeat(64));
    w.serve_payload(tgz(&[("bootstrap.sh", b"#!/bin/sh\nexit 0\n", 0o755)]));
    let r = w.run("reprovision");
    r.assert_fails(1, "preflight failed: payload");
    assert!(r.stderr.contains("hash mismatch"), "{}", r.stderr);
    w.assert_untouched();

    // Right at preflight, other bytes at the download: refused there, nothing kept or run.
    let w = World::new("rhel");
    let rec = w.rec.display().to_string();
    let good = tgz(&[("bootstrap.sh", b"#!/bin/sh\nexit 0\n", 0o755)]);
    let other = tgz(&[(
        "bootstrap.sh",
        format!("#!/bin/sh\ntouch {rec}/entry-ran\n").as_bytes(),
        0o755,
    )]);
    w.secret_key("payload-sha256", &sha256_hex(&good));
    let path = format!("{PAYLOAD_PATH}{PAYLOAD_QUERY}");
    w.ign.queue(&path, Reply::ok(good));
    w.ign.set(&path, Reply::ok(other));
    let r = w.run("reprovision");
    r.assert_fails(1, "hash mismatch");
    assert!(r.stderr.contains("payload-sha256 says"), "{}", r.stderr);
    assert_eq!(w.ign.requests("GET", &path).len(), 2);
    assert!(w.label_patches().is_empty() && w.state().is_none());
    assert!(!w.rec.join("entry-ran").exists());
    let work = w.path("/var/lib/nodestrap/reprovision");
    let left: Vec<_> = std::fs::read_dir(&work)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", work.display());

    // The entry script fails: the run fails, the label stays.
    let w = World::new("rhel");
    w.serve_payload(tgz(&[(
        "bootstrap.sh",
        b"#!/bin/sh\necho trying\nexit 3\n",
        0o755,
    )]));
    let r = w.run("reprovision");
    r.assert_fails(1, "exited with status 3");
    assert!(r.stderr.contains("bootstrap.sh: trying"), "{}", r.stderr);
    assert!(w.label_patches().is_empty());
    assert!(w.state().is_none());

    // The entry script hangs: killed at the timeout.
    let mut w = World::new("rhel");
    w.serve_payload(tgz(&[(
        "bootstrap.sh",
        b"#!/bin/sh\necho started\nsleep 600\n",
        0o755,
    )]));
    w.extra.push("--entry-timeout=2".into());
    let t = std::time::Instant::now();
    let r = w.run("reprovision");
    r.assert_fails(1, "timed out after 2 s");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t.elapsed()
    );
    assert!(w.label_patches().is_empty());
}

#[test]
fn rhel_a_crash_after_the_script_resumes_at_the_label() {
    let w = World::new("rhel");
    let rec = w.rec.display().to_string();
    w.serve_payload(tgz(&[(
        "bootstrap.sh",
        format!("#!/bin/sh\necho x >>{rec}/entry-ran\n").as_bytes(),
        0o755,
    )]));
    // The API server refuses the label patch the first time round (not retried: 403).
    w.api
        .queue(&format!("PATCH /api/v1/nodes/{NODE}"), Reply::status(403));
    w.run("reprovision").assert_fails(1, "removing label");
    assert_eq!(w.state().unwrap()["phase"], "configured");
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stderr.contains("resuming at the label"), "{}", r.stderr);
    assert_eq!(
        std::fs::read_to_string(w.rec.join("entry-ran")).unwrap(),
        "x\n",
        "ran once"
    );
    assert_eq!(w.label_patches().len(), 2);
}

#[test]
fn progress_endpoint_down_does_not_fail_the_node() {
    let w = World::new("rhel");
    w.serve_payload(tgz(&[("bootstrap.sh", b"#!/bin/sh\nexit 0\n", 0o755)]));
    w.secret_key(
        "progress-url",
        &format!("https://127.0.0.1:{}/events", dead_port()),
    );
    // Preflight checks the progress endpoint too: only the run's own reports may fail here.
    let mut w = w;
    w.extra.push("--flow=rhel".into());
    let r = w.run("reprovision");
    r.assert_fails(1, "preflight failed: progress");
    // Once preflight passed, reports that do not arrive are logged and the node goes on.
    let w2 = World::new("rhel");
    w2.serve_payload(tgz(&[("bootstrap.sh", b"#!/bin/sh\nexit 0\n", 0o755)]));
    w2.progress.set("POST /events", Reply::status(503));
    let r = w2.run("reprovision");
    r.assert_ok();
    assert!(
        r.stderr
            .contains("progress report not delivered (the node carries on)"),
        "{}",
        r.stderr
    );
    assert_eq!(w2.label_patches().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Preflight and configuration

#[test]
fn preflight_prints_a_table_and_fails_on_any_failed_check() {
    let w = World::new("rhcos");
    let mirror = Server::start(&w.ca.server(), None);
    mirror.set("/v2/", Reply::ok("{}"));
    w.secret_key(
        "mirror-urls",
        &format!(
            "# mirrors\nhttps://127.0.0.1:{}/ocp4/release\n\n",
            mirror.port
        ),
    );
    let r = w.run("preflight");
    r.assert_ok();
    let rows: Vec<&str> = r.stdout.lines().collect();
    assert!(
        rows[0].starts_with("CHECK")
            && rows[0].contains("TARGET")
            && rows[0].contains("RESULT")
            && rows[0].contains("DETAIL")
    );
    for (check, detail) in [
        ("ignition", "spec 3.2.0, 3 files, 2 units"),
        ("registry", "HTTP 401"),
        ("mirror", "HTTP 200"),
        ("progress", "answers"),
        ("kubernetes", "readable"),
    ] {
        assert!(
            rows.iter()
                .any(|l| l.starts_with(check) && l.contains(" pass ") && l.contains(detail)),
            "{check}: {}",
            r.stdout
        );
    }
    // Preflight changes nothing and reports nothing.
    w.assert_untouched();
    assert!(w.events().is_empty());

    // A mirror that is down fails it, and reprovision stops before changing anything.
    w.secret_key(
        "mirror-urls",
        &format!("127.0.0.1:{}\n127.0.0.1:{}\n", mirror.port, dead_port()),
    );
    let r = w.run("preflight");
    r.assert_fails(1, "1 of 6 checks failed");
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("mirror") && l.contains(" FAIL ")),
        "{}",
        r.stdout
    );
    w.run("reprovision")
        .assert_fails(1, "preflight failed: mirror");
    w.assert_untouched();
    // Each command's last run in its own record: preflight's names every check.
    let rec: Value = serde_json::from_str(
        &std::fs::read_to_string(w.root.join("var/lib/nodestrap/status-preflight.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["state"], "failed", "{rec}");
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "mirror" && d["value"].as_str().unwrap().starts_with("FAIL")),
        "{rec}"
    );
    let rec: Value = serde_json::from_str(
        &std::fs::read_to_string(w.root.join("var/lib/nodestrap/status-reprovision.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["exit_code"], 1, "{rec}");
    assert!(
        rec["error"]
            .as_str()
            .unwrap()
            .contains("preflight failed: mirror"),
        "{rec}"
    );
}

#[test]
fn configuration_errors_name_the_key() {
    let w = World::new("rhcos");
    w.drop_key("ignition-token");
    let r = w.run("reprovision");
    r.assert_fails(2, "key ignition-token is missing or empty");
    assert!(r.stderr.contains("--secret-dir"), "{}", r.stderr);
    w.secret_key("ignition-token", "  \n");
    w.run("preflight")
        .assert_fails(2, "key ignition-token is missing or empty");

    let w = World::new("rhel");
    w.secret_key("worker-id", "w 1; rm -rf /");
    w.run("reprovision").assert_fails(2, "key worker-id");
    let w = World::new("rhel");
    w.secret_key("payload-sha256", "sha256:xyz");
    w.run("reprovision").assert_fails(2, "key payload-sha256");
    let w = World::new("rhel");
    w.secret_key("payload-url", "http://insecure.example/p.tgz");
    w.run("reprovision").assert_fails(2, "not an https:// URL");

    let w = World::new("flatcar");
    w.run("reprovision")
        .assert_fails(2, "ID=\"flatcar\" is neither rhcos nor rhel; give --flow");
    let mut w = World::new("rhcos");
    w.env.retain(|(k, _)| k != "NODE");
    w.run("reprovision").assert_fails(2, "no node name");
    w.extra.push("--label=bad label".into());
    w.run("preflight").assert_fails(2, "--label \"bad label\"");
    assert!(w.state().is_none());
}

#[test]
fn dry_run_checks_and_fetches_but_changes_nothing() {
    let mut w = World::new("rhcos");
    w.extra.push("--dry-run".into());
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stdout.contains("dry run"), "{}", r.stdout);
    w.assert_untouched();
    assert!(w.events().is_empty());
    assert_eq!(w.ign.requests("GET", "/ignition").len(), 1, "fetched");
}

// ---------------------------------------------------------------------------------------------
// The reboot: "succeeded" only once systemd accepted it; then SIGTERM ends the process with 0.
// systemd itself cannot run here (it is not PID 1): tests/support/fake_systemd.py stands in for
// its manager on a private system bus, with the real StartUnit method and error names.

fn rhel_world_with_systemd(refuse: bool) -> (World, Bus, PathBuf) {
    let mut w = World::new("rhel");
    w.serve_payload(tgz(&[(
        "bootstrap.sh",
        b"#!/bin/sh\necho configured\n",
        0o755,
    )]));
    let mut bus = Bus::start();
    let calls = w.rec.join("systemd.calls");
    let rec = calls.display().to_string();
    let mut args = vec!["--record", rec.as_str()];
    if refuse {
        args.push("--refuse");
    }
    bus.systemd(&args);
    w.set_env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address);
    w.extra.push("--reboot=host".into());
    (w, bus, calls)
}

#[test]
fn a_queued_reboot_is_reported_then_sigterm_ends_the_wait_with_exit_0() {
    let (w, _bus, calls) = rhel_world_with_systemd(false);
    let mut child = w
        .command("reprovision")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let succeeded = ("reboot".to_string(), "succeeded".to_string());
    while !w.events().contains(&succeeded) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "no 'reboot succeeded': {:?}",
            w.events()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "StartUnit reboot.target replace-irreversibly\n"
    );
    // systemd stops the pod for the reboot.
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = exit_within(&mut child, 5, || {
        "SIGTERM'd (the reboot wait ignored it)".into()
    });
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("stopped by SIGTERM while the node reboots"),
        "{}",
        r.stderr
    );
    assert_eq!(w.events(), evs(ALL_PHASES));
}

#[test]
fn a_refused_reboot_is_never_reported_as_succeeded() {
    let (w, _bus, calls) = rhel_world_with_systemd(true);
    let r = w.run("reprovision");
    r.assert_fails(1, "systemd StartUnit(reboot.target)");
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "StartUnit reboot.target replace-irreversibly\n"
    );
    let ev = w.events();
    assert!(
        !ev.contains(&("reboot".to_string(), "succeeded".to_string())),
        "{ev:?}"
    );
    assert_eq!(
        ev.last().unwrap(),
        &("reboot".to_string(), "failed".to_string())
    );
}

#[test]
fn a_payload_that_changes_after_preflight_is_refused_without_a_configured_digest() {
    let w = World::new("rhel");
    let rec = w.rec.display().to_string();
    let good = tgz(&[("bootstrap.sh", &entry_script(&rec), 0o755)]);
    let other = tgz(&[(
        "bootstrap.sh",
        format!("#!/bin/sh\ntouch {rec}/entry-ran\n").as_bytes(),
        0o755,
    )]);
    // Preflight gets one payload, the apply step another (no payload-sha256 in the Secret).
    w.ign.queue(
        &format!("{PAYLOAD_PATH}{PAYLOAD_QUERY}"),
        Reply::ok(good.clone()),
    );
    w.serve_payload(other.clone());
    let r = w.run("reprovision");
    r.assert_fails(1, "hash mismatch");
    assert!(
        r.stderr.contains(&format!(
            "computed sha256-{} but the preflight fetch says sha256-{}",
            sha256_hex(&other),
            sha256_hex(&good)
        )),
        "{}",
        r.stderr
    );
    w.assert_untouched();
}

#[test]
fn fetch_limits_are_options_of_reprovision_too() {
    let mut w = World::new("rhel");
    w.extra.push("--fetch-timeout=0".into());
    w.run("preflight")
        .assert_fails(2, "--fetch-timeout 0: at least 1");
    w.extra = vec!["--fetch-min-rate-window=7200".into()];
    w.run("reprovision")
        .assert_fails(2, "--fetch-min-rate-window 7200: at most 3600");
    w.assert_untouched();
}

// ---------------------------------------------------------------------------------------------
// The RHCOS hand-off as the real machine-config-daemon makes it: once it has applied the config
// it renames the encapsulated file away, queues the reboot and sleeps until the shutdown kills
// it (pkg/daemon/update.go, reboot(): "wait to be killed via SIGTERM"); it never exits 0. The
// stand-in does the same (no real MCD can run here: it needs an RHCOS host).

/// The stand-in MCD, then its pid (which `exec sleep` keeps) and a sleep until it is killed.
fn rebooting_mcd(w: &mut World) -> PathBuf {
    let body = std::fs::read_to_string(w.standin_mcd()).unwrap();
    let rec = w.rec.display().to_string();
    let body = body.trim_start_matches("#!/bin/sh\n");
    let mcd = w.script(
        "rebooting-mcd",
        &format!("{body}echo $$ >{rec}/mcd.pid.tmp\nmv {rec}/mcd.pid.tmp {rec}/mcd.pid\nexec sleep 600\n"),
    );
    w.extra.retain(|e| !e.starts_with("--mcd-binary="));
    w.extra.push(format!("--mcd-binary={}", mcd.display()));
    w.rec.join("mcd.pid")
}

fn wait_for_file(p: &std::path::Path) -> String {
    let start = std::time::Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(p) {
            return s.trim().to_string();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn signal(sig: &str, pid: &str) {
    assert!(Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap()
        .success());
}

#[test]
fn rhcos_an_mcd_killed_by_the_shutdown_after_applying_is_a_hand_off() {
    let mut w = World::new("rhcos");
    let pid_file = rebooting_mcd(&mut w);
    let mut child = w
        .command("reprovision")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mcd = wait_for_file(&pid_file);
    assert!(!w.path(ENCAPSULATED).exists(), "the MCD took the config");
    // The node goes down: stopping the pod's scope sends SIGTERM to every process in it.
    signal("-TERM", &mcd);
    signal("-TERM", &child.id().to_string());
    let status = exit_within(&mut child, 5, || "SIGTERM'd".into());
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stderr.contains("killed by signal SIGTERM"),
        "says how the MCD ended: {}",
        r.stderr
    );
    assert_eq!(w.events(), evs(ALL_PHASES));
    assert_eq!(w.state().unwrap()["phase"], "reboot-pending");

    // Run again before the reboot took the node down: nothing is fetched, patched or run.
    let fetches = w.ign.seen().len();
    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stdout.contains("(reboot pending)"), "{}", r.stdout);
    assert_eq!(w.ign.seen().len(), fetches, "fetched again");
    assert_eq!(w.mcd_runs(), 1, "the MCD ran again");
    assert_eq!(w.label_patches().len(), 1, "patched again");
}

#[test]
fn rhcos_a_run_in_the_same_boot_after_the_mcd_took_the_config_does_nothing() {
    let mut w = World::new("rhcos");
    let pid_file = rebooting_mcd(&mut w);
    // Bounds the MCD a wrong re-run would start again.
    w.extra.push("--entry-timeout=3".into());
    let mut child = w
        .command("reprovision")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mcd = wait_for_file(&pid_file);
    // This process is killed outright while the MCD waits for the reboot (the kubelet's
    // SIGKILL after the grace period): the state still says handed-off.
    child.kill().unwrap();
    child.wait().unwrap();
    signal("-KILL", &mcd);
    assert_eq!(w.state().unwrap()["phase"], "handed-off");
    assert!(!w.path(ENCAPSULATED).exists());
    let fetches = w.ign.seen().len();

    let r = w.run("reprovision");
    r.assert_ok();
    assert!(r.stdout.contains("(reboot pending)"), "{}", r.stdout);
    assert_eq!(w.ign.seen().len(), fetches, "fetched again");
    assert_eq!(w.mcd_runs(), 1, "the MCD ran again");
    assert_eq!(w.label_patches().len(), 1, "patched again");
    assert!(!w.path(ENCAPSULATED).exists(), "config written again");

    // After the reboot: done.
    w.boot("boot-2");
    w.run("reprovision").assert_ok();
    assert_eq!(w.state().unwrap()["phase"], "done");
}

#[test]
fn rhel_a_run_in_the_same_boot_after_the_reboot_was_queued_does_nothing() {
    let (w, _bus, calls) = rhel_world_with_systemd(false);
    let mut child = w
        .command("reprovision")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let succeeded = ("reboot".to_string(), "succeeded".to_string());
    while !w.events().contains(&succeeded) {
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Killed outright while waiting for the reboot (the kubelet's SIGKILL after the grace).
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(w.state().unwrap()["phase"], "reboot-pending");

    // Run again in the same boot: no second label patch, no second reboot job, no wait.
    let mut again = w
        .command("reprovision")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while again.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(20) {
            let _ = again.kill();
            panic!("the re-run queued the reboot again and waits for it");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let r = Run::from(again.wait_with_output().unwrap());
    r.assert_ok();
    assert!(r.stdout.contains("(reboot pending)"), "{}", r.stdout);
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "StartUnit reboot.target replace-irreversibly\n"
    );
    assert_eq!(w.label_patches().len(), 1);
}

/// A registry and a mirror that answer 503 with Retry-After 30, an API server that answers 500
/// for the Node: preflight is a check, so a busy endpoint gets one short wait (the API server),
/// or none when it asks for a longer one than preflight waits (never sooner than it asked: the
/// registry and the mirror), then a failed row saying so; the checks run side by side and the
/// table prints within seconds (it took about 10 minutes when busy endpoints were waited for
/// like a download).
#[test]
fn preflight_with_busy_endpoints_prints_failed_rows_within_seconds() {
    let w = World::new("rhcos");
    w.registry.set("/v2/", Reply::busy(503, "30"));
    let mirror = Server::start(&w.ca.server(), None);
    mirror.set("/v2/", Reply::busy(429, "30"));
    w.secret_key("mirror-urls", &format!("127.0.0.1:{}\n", mirror.port));
    w.api
        .set(&format!("/api/v1/nodes/{NODE}"), Reply::status(500));
    let start = std::time::Instant::now();
    let r = w.run("preflight");
    let took = start.elapsed();
    r.assert_fails(1, "3 of 5 checks failed");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    for (check, detail) in [
        (
            "registry",
            "busy: 503, Retry-After 30; giving up: the server asks for a wait of 30 s",
        ),
        (
            "mirror",
            "busy: 429, Retry-After 30; giving up: the server asks for a wait of 30 s",
        ),
        ("kubernetes", "busy: 500; giving up after 2 attempts"),
    ] {
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with(check) && l.contains(" FAIL ") && l.contains(detail)),
            "{check}: {}",
            r.stdout
        );
    }
    assert_eq!(
        w.registry.hits("/v2/"),
        1,
        "not asked again before its Retry-After"
    );
    assert!(r
        .stdout
        .lines()
        .any(|l| l.starts_with("ignition") && l.contains(" pass ")));
    w.assert_untouched();
}

/// preflight and reprovision take --deadline: an endpoint that never stops being busy ends
/// the run at it, with the reason.
#[test]
fn reprovision_and_preflight_end_at_their_deadline() {
    let mut w = World::new("rhcos");
    w.ign.set("/ignition", Reply::busy(503, "1"));
    w.extra.push("--deadline=4".into());
    for cmd in ["preflight", "reprovision"] {
        let start = std::time::Instant::now();
        let r = w.run(cmd);
        let took = start.elapsed();
        assert_eq!(r.code, 1, "{cmd}: {}", r.stderr);
        assert!(
            took < std::time::Duration::from_secs(12),
            "{cmd} took {took:?}"
        );
        assert!(
            r.stderr.contains("busy: 503, Retry-After 1"),
            "{cmd}: {}",
            r.stderr
        );
        w.assert_untouched();
    }
    w.extra.pop();
    w.extra.push("--deadline=0".into());
    w.run("preflight")
        .assert_fails(2, "--deadline 0: at least 1");
}

/// The real API server (tests/support/cluster.rs): preflight reads the Node, and reprovision
/// removes its label by merge patch, as an identity RBAC allows `get` and `patch` on Nodes.
/// One that may not read Nodes fails preflight's kubernetes row naming the 403, the verb and
/// the resource, and reprovision changes nothing.
#[test]
fn a_real_api_server_allows_the_reprovision_identity_and_refuses_another() {
    let c = support::cluster::cluster();
    c.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{NODE}","labels":{{"{LABEL}":"true","kubernetes.io/os":"linux"}}}}}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{{"name":"nodestrap-reprovision"}},
   "rules":[{{"apiGroups":[""],"resources":["nodes"],"verbs":["get","patch"]}}]}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{{"name":"nodestrap-reprovision"}},
   "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"nodestrap-reprovision"}},
   "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"nodestrap-reprovision"}}]}}]}}"#
    ));
    let mut w = World::new("rhcos");
    let kubeconfig = w.rec.join("reprovision.kubeconfig");
    c.kubeconfig("nodestrap-reprovision", &kubeconfig);
    w.extra
        .push(format!("--kubeconfig={}", kubeconfig.display()));
    let r = w.run("preflight");
    r.assert_ok();
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("kubernetes") && l.contains(" pass ")),
        "{}",
        r.stdout
    );
    w.run("reprovision").assert_ok();
    let labels = c.kubectl(&["get", "node", NODE, "-o", "jsonpath={.metadata.labels}"]);
    assert!(
        !labels.contains(LABEL) && labels.contains("kubernetes.io/os"),
        "{labels}"
    );

    let mut w = World::new("rhcos");
    let other = w.rec.join("other.kubeconfig");
    c.kubeconfig("nodestrap-nobody", &other);
    w.extra.push(format!("--kubeconfig={}", other.display()));
    let r = w.run("preflight");
    r.assert_fails(1, "1 of 4 checks failed");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("kubernetes"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(
        row.contains(" FAIL ")
            && row.contains("HTTP 403")
            && row.contains(r#"User "nodestrap-nobody" cannot get resource "nodes""#),
        "{row}"
    );
    w.run("reprovision")
        .assert_fails(1, "preflight failed: kubernetes");
    w.assert_untouched();
}
