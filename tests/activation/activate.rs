//! `nodestrap activate`, `join-service` and `init-cluster` end to end: the built binary, real
//! mutual TLS with CAs made at test time, and stand-in kubeadm/kubelet programs that record
//! their arguments (and the config files they were given) next to themselves.

#[path = "../support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose};
use support::*;

mod faults;
mod images;

const SECRET: &str = "s3cret-init-value-0123456789";
const TOKEN: &str = "abcdef.0123456789abcdef";
const STATE: &str = "var/lib/nodestrap/node-state.json";
/// What a control-plane ticket must carry (kubeadm's shared cluster keys).
const CP_FILES: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
];

// ---------------------------------------------------------------------------------------------
// PKI and files

struct Pki {
    admin: Ca,
    nodes: Ca,
    cluster: Ca,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            admin: Ca::new("test admin CA"),
            nodes: Ca::new("test node-provisioning CA"),
            cluster: Ca::new("test cluster CA"),
        }
    }
}

/// A certificate for both ends of TLS (a node serves init and calls the join service).
fn both_ways(ca: &Ca, cn: &str, org: Option<&str>) -> Leaf {
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = org {
        p.distinguished_name.push(DnType::OrganizationName, o);
    }
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    ca.issue(p)
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn secret_hash(secret: &str) -> String {
    // Python's hashlib, an implementation independent of the one under test.
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib,base64,sys; print('pbkdf2_sha256$1000$salt-x$' + base64.b64encode(hashlib.pbkdf2_hmac('sha256', sys.argv[1].encode(), b'salt-x', 1000)).decode())",
            secret,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Stand-in kubeadm and kubelet starter in `bin/`: every call appended to `bin/kubeadm.log`,
/// config files copied, manifests folder listed; behaviour switched by files in `bin/`:
/// `fail-init`, `fail-join` (count of failures left), `fail-token`, `sleep-init` (seconds).
fn stand_ins(dir: &Path, root: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let kubeadm = format!(
        r#"#!/bin/sh
d='{bin}'
root='{root}'
echo "$*" >> "$d/kubeadm.log"
echo $$ > "$d/kubeadm.pid"
case "$1" in
config)
  # What kubeadm itself says (its image list): the real one, where the test gives it.
  exec "$(cat "$d/real-kubeadm")" "$@"
  ;;
init)
  cp "$3" "$d/init-config.yaml"
  ls -A "$root/etc/kubernetes/manifests" > "$d/manifests-at-init"
  [ -f "$d/sleep-init" ] && sleep "$(cat "$d/sleep-init")"
  if [ -f "$d/fail-init" ]; then
    echo "[preflight] some check failed"
    echo "kubeadm join 10.0.0.1:6443 --token {token}" >&2
    echo "error execution phase preflight: stand-in failure" >&2
    exit 1
  fi
  mkdir -p "$root/etc/kubernetes"
  printf 'apiVersion: v1\nkind: Config\n# admin of the stand-in cluster\n' > "$root/etc/kubernetes/admin.conf"
  ;;
join)
  if [ -f "$d/gate-join" ]; then
    touch "$d/waiting-join"
    while [ ! -f "$d/go-join" ]; do sleep 0.01; done
  fi
  n=$(grep -c '^join' "$d/kubeadm.log")
  cp "$3" "$d/join-config-$n.yaml"
  ls -A "$root/etc/kubernetes/manifests" > "$d/manifests-at-join-$n"
  ls -AR "$root/etc/kubernetes/pki" > "$d/pki-at-join-$n" 2>/dev/null
  touch "$root/etc/kubernetes/manifests/kube-apiserver.yaml"
  left=$(cat "$d/fail-join" 2>/dev/null || echo 0)
  if [ "$left" -gt 0 ]; then
    echo $((left - 1)) > "$d/fail-join"
    echo "error execution phase kubelet-start: stand-in failure $n" >&2
    exit 1
  fi
  ;;
token)
  [ -f "$d/fail-token" ] && {{ echo "failed to create token: stand-in" >&2; exit 1; }}
  [ -f "$d/sleep-token" ] && sleep "$(cat "$d/sleep-token")"
  if [ -f "$d/gate" ]; then
    touch "$d/waiting"
    while [ ! -f "$d/go" ]; do sleep 0.002; done
    rm -f "$d/go" "$d/waiting"
  fi
  echo '{token}'
  ;;
esac
exit 0
"#,
        bin = bin.display(),
        root = root.display(),
        token = TOKEN
    );
    for (name, text) in [
        ("kubeadm", kubeadm),
        (
            "kubelet-start",
            format!(
                "#!/bin/sh\necho started >> '{}/kubelet.log'\n",
                bin.display()
            ),
        ),
    ] {
        let p = bin.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// The real kubeadm reads `path` as it would for `kubeadm init` or `join` (`kubeadm config
/// validate`: strict, an unknown or misplaced field fails it).
fn kubeadm_reads(path: &Path) {
    let out = std::process::Command::new(vars::kube_bin().join("kubeadm"))
        .args(["config", "validate", "--config"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubeadm config validate {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn calls(bin: &Path) -> Vec<String> {
    read(&bin.join("kubeadm.log"))
        .lines()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Processes

struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<String>>,
    what: String,
}

impl Proc {
    fn start(args: Vec<String>) -> Proc {
        Proc::spawn(command(&args, None), &args[0])
    }

    /// `cmd` (nodestrap, or nodestrap under strace) started, its output collected.
    fn spawn(mut cmd: std::process::Command, what: &str) -> Proc {
        let what = what.to_string();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Default::default();
        let stdout: Arc<Mutex<String>> = Default::default();
        let (l2, o2) = (lines.clone(), stdout.clone());
        let err = child.stderr.take().unwrap();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines() {
                let Ok(l) = l else { break };
                l2.lock().unwrap().push(l);
            }
        });
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(out).read_to_string(&mut s);
            o2.lock().unwrap().push_str(&s);
        });
        Proc {
            child,
            lines,
            stdout,
            what,
        }
    }

    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The first stderr line containing `needle`, waiting at most `secs`.
    fn wait_for(&self, needle: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < end,
                "{}: no line with {needle:?} within {secs} s:\n{}",
                self.what,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    fn port(&self) -> u16 {
        let l = self.wait_for("listening on 127.0.0.1:", 30);
        let rest = &l[l.find("127.0.0.1:").unwrap() + 10..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn sigterm(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Exit within `secs` (the watchdog: a hang fails the test instead of blocking it).
    fn wait(mut self, secs: u64) -> Run {
        let (what, lines) = (&self.what, &self.lines);
        let status = exit_within(&mut self.child, secs, || {
            format!("{what} (hang):\n{}", lines.lock().unwrap().join("\n"))
        });
        std::thread::sleep(Duration::from_millis(50)); // let the readers drain
        Run {
            code: status.code().unwrap_or(-1),
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// A node and a join service

struct Node {
    dir: PathBuf,
    root: PathBuf,
    bin: PathBuf,
}

impl Node {
    fn new(pki: &Pki, tag: &str, org: Option<&str>) -> Node {
        let dir = unique_dir(tag);
        let root = dir.join("root");
        let bin = stand_ins(&dir, &root);
        let id = both_ways(&pki.nodes, &format!("{tag}-node"), org);
        let a = root.join("etc/nodestrap/activate");
        write(&a.join("node.crt"), &id.cert_pem);
        write(&a.join("node.key"), &id.key_pem);
        write(&a.join("admin-ca.crt"), &pki.admin.pem);
        write(&a.join("cluster-ca.crt"), &pki.cluster.pem);
        write(&a.join("init-secret.hash"), &secret_hash(SECRET));
        // The stand-in hands `kubeadm config …` to the real one.
        write(
            &bin.join("real-kubeadm"),
            &vars::kube_bin().join("kubeadm").display().to_string(),
        );
        // What a previous attempt might have left: kubeadm must get an empty folder.
        write(&root.join("etc/kubernetes/manifests/stale.yaml"), "stale");
        Node { dir, root, bin }
    }

    fn args(&self, endpoints: &[String]) -> Vec<String> {
        let mut a = s(&[
            "activate",
            "--listen",
            "127.0.0.1:0",
            "--join-interval",
            "1",
            "--join-timeout",
            "5",
        ]);
        a.extend([
            "--root".into(),
            self.root.display().to_string(),
            "--kubeadm".into(),
            self.bin.join("kubeadm").display().to_string(),
            "--kubelet-command".into(),
            self.bin.join("kubelet-start").display().to_string(),
        ]);
        if !endpoints.is_empty() {
            a.extend(["--join-endpoints".into(), endpoints.join(",")]);
        }
        a
    }

    fn activate(&self, endpoints: &[String]) -> Proc {
        Proc::start(self.args(endpoints))
    }

    fn state(&self) -> Option<serde_json::Value> {
        std::fs::read(self.root.join(STATE))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    /// The kubeadm calls that act: init, join, token (its `config` questions change nothing).
    fn calls(&self) -> Vec<String> {
        let mut c = calls(&self.bin);
        c.retain(|c| !c.starts_with("config "));
        c
    }

    fn all_calls(&self) -> Vec<String> {
        calls(&self.bin)
    }
}

/// An activate process with an init request sent and kubeadm init running (it sleeps as long
/// as `sleep-init` in the node's bin says).
fn init_in_flight(pki: &Pki, node: &Node) -> (Proc, Proc) {
    let act = node.activate(&[]);
    let client = Proc::start(Admin::new(pki, None).args(act.port()));
    let end = Instant::now() + Duration::from_secs(30);
    while node.calls().is_empty() {
        assert!(
            Instant::now() < end,
            "kubeadm init never started:\n{}",
            act.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (act, client)
}

/// The admin's files and an init-cluster run against a node's init server.
struct Admin {
    dir: PathBuf,
}

impl Admin {
    fn new(pki: &Pki, ca: Option<&Ca>) -> Admin {
        let dir = unique_dir("admin");
        let leaf = ca.unwrap_or(&pki.admin).client("cluster-admin");
        write(&dir.join("admin.crt"), &leaf.cert_pem);
        write(&dir.join("admin.key"), &leaf.key_pem);
        write(&dir.join("node-ca.crt"), &pki.nodes.pem);
        write(&dir.join("secret"), &format!("{SECRET}\n"));
        Admin { dir }
    }

    fn args(&self, port: u16) -> Vec<String> {
        self.args_for(port, "v1.37.2")
    }

    fn args_for(&self, port: u16, version: &str) -> Vec<String> {
        let d = |n: &str| self.dir.join(n).display().to_string();
        let mut a = s(&[
            "init-cluster",
            "--cluster-name",
            "demo",
            "--kubernetes-version",
            version,
        ]);
        a.extend([
            "--endpoint".into(),
            format!("https://127.0.0.1:{port}"),
            "--cert".into(),
            d("admin.crt"),
            "--key".into(),
            d("admin.key"),
            "--ca".into(),
            d("node-ca.crt"),
            "--secret-file".into(),
            d("secret"),
            "--apiserver-sans".into(),
            "10.0.0.1,api.demo.test".into(),
            "--out".into(),
            d("admin.conf"),
            "--wait".into(),
            "10".into(),
            "--timeout".into(),
            "60".into(),
        ]);
        a
    }

    fn init(&self, port: u16) -> Run {
        Proc::start(self.args(port)).wait(90)
    }
}

struct JoinSvc {
    dir: PathBuf,
    root: PathBuf,
    bin: PathBuf,
    proc: Option<Proc>,
}

impl JoinSvc {
    /// A join service whose serving certificate comes from `serving` (the pinned cluster CA,
    /// or another one), with the control-plane files under /etc/kubernetes/pki.
    fn new(pki: &Pki, serving: &Ca) -> JoinSvc {
        let dir = unique_dir("joinsvc");
        let root = dir.join("root");
        let bin = stand_ins(&dir, &root);
        let tls = serving.server();
        write(
            &root.join("etc/nodestrap/join-service/tls.crt"),
            &tls.cert_pem,
        );
        write(
            &root.join("etc/nodestrap/join-service/tls.key"),
            &tls.key_pem,
        );
        write(
            &root.join("etc/nodestrap/join-service/node-ca.crt"),
            &pki.nodes.pem,
        );
        let pki_dir = root.join("etc/kubernetes/pki");
        for name in &CP_FILES[1..] {
            write(
                &pki_dir.join(name),
                &format!("-----BEGIN TEST-----\n{name}\n-----END TEST-----\n"),
            );
        }
        write(&pki_dir.join("ca.crt"), &pki.cluster.pem);
        let mut j = JoinSvc {
            dir,
            root,
            bin,
            proc: None,
        };
        j.start();
        j
    }

    fn start(&mut self) {
        let p = Proc::start(self.args());
        p.port();
        self.proc = Some(p);
    }

    fn args(&self) -> Vec<String> {
        let mut a = s(&[
            "join-service",
            "--listen",
            "127.0.0.1:0",
            "--api-server-endpoint",
            "10.0.0.1:6443",
            "--cluster-name",
            "demo",
            "--kubernetes-version",
            "v1.31.2",
            // The ledger in the cluster is tested against a real API server (tests/activation/
            // ledger.rs); these tests are about the service's other parts.
            "--ledger",
            "file",
        ]);
        a.extend([
            "--root".into(),
            self.root.display().to_string(),
            "--token-command".into(),
            format!(
                "{} token create --ttl 15m0s",
                self.bin.join("kubeadm").display()
            ),
        ]);
        a
    }

    fn port(&self) -> u16 {
        self.proc.as_ref().unwrap().port()
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port())
    }

    fn stop(&mut self) -> Run {
        let p = self.proc.take().unwrap();
        p.sigterm();
        p.wait(30)
    }

    fn issued(&self) -> serde_json::Value {
        let p = self.root.join("var/lib/nodestrap/join-service/issued.json");
        std::fs::read(p)
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or_default()
    }
}

fn assert_no_secrets(what: &str, text: &str) {
    for secret in [TOKEN, SECRET, "BEGIN PRIVATE KEY", "BEGIN TEST"] {
        assert!(!text.contains(secret), "{what} shows {secret:?}:\n{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn init_wins() {
    let pki = Pki::new();
    let node = Node::new(&pki, "init-wins", None);
    let act = node.activate(&[]);
    let admin = Admin::new(&pki, None);
    let r = admin.init(act.port());
    r.assert_ok();
    says(&r, "nodestrap: init-cluster done cluster=demo");
    // The kubeconfig the stand-in kubeadm wrote, now on the admin's side, 0600.
    let conf = admin.dir.join("admin.conf");
    assert!(read(&conf).contains("admin of the stand-in cluster"));
    assert_eq!(
        std::fs::metadata(&conf).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let run = act.wait(30);
    run.assert_ok();
    says(
        &run,
        "nodestrap: activate done role=control-plane via=init cluster=demo",
    );
    // kubeadm init once, with a config file and without printing its token; from an empty
    // manifests folder; the temp config gone afterwards.
    let c = node.calls();
    assert_eq!(c.len(), 1, "{c:?}");
    let cfg_path = node.root.join("run/nodestrap/kubeadm-init.yaml");
    // Before the lock, the real kubeadm judged that very file.
    assert_eq!(
        node.all_calls()[0],
        format!("config validate --config {}", cfg_path.display())
    );
    assert_eq!(
        c[0],
        format!("init --config {} --skip-token-print", cfg_path.display())
    );
    assert!(!cfg_path.exists());
    assert_eq!(read(&node.bin.join("manifests-at-init")), "");
    let cfg = read(&node.bin.join("init-config.yaml"));
    for want in [
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n",
        "kind: ClusterConfiguration\nclusterName: \"demo\"\nkubernetesVersion: \"v1.37.2\"\n",
        "  podSubnet: \"10.244.0.0/16\"\n  serviceSubnet: \"10.96.0.0/12\"\n",
        "  certSANs:\n  - \"10.0.0.1\"\n  - \"api.demo.test\"\n",
    ] {
        assert!(cfg.contains(want), "{want:?} not in\n{cfg}");
    }
    kubeadm_reads(&node.bin.join("init-config.yaml"));
    let st = node.state().unwrap();
    assert_eq!(
        (
            st["state"].as_str(),
            st["role"].as_str(),
            st["cluster"].as_str()
        ),
        (Some("done"), Some("control-plane"), Some("demo"))
    );
    assert!(
        st["source"]
            .as_str()
            .unwrap()
            .starts_with("init request from cluster-admin"),
        "{st}"
    );
    assert_no_secrets("activate's log", &run.stderr);
    assert!(
        !node.bin.join("kubelet.log").exists(),
        "kubeadm starts the kubelet on activation"
    );

    // Restarted: done means only the kubelet; nothing listens, kubeadm is not called again.
    let again = node.activate(&[]).wait(30);
    again.assert_ok();
    assert!(
        again
            .stdout
            .contains("activate already done role=control-plane cluster=demo"),
        "{}",
        again.stdout
    );
    assert!(!again.stderr.contains("listening"), "{}", again.stderr);
    assert_eq!(read(&node.bin.join("kubelet.log")), "started\n");
    assert_eq!(node.calls().len(), 1);
}

#[test]
fn join_wins_as_worker() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    let node = Node::new(&pki, "join-worker", None);
    let run = node.activate(&[svc.url()]).wait(60);
    run.assert_ok();
    says(&run, "activate done role=worker via=join cluster=demo");
    let c = node.calls();
    let cfg_path = node.root.join("run/nodestrap/kubeadm-join.yaml");
    assert_eq!(
        c,
        vec![format!("join --config {}", cfg_path.display())],
        "the token is not in argv"
    );
    assert!(!cfg_path.exists(), "the config with the token is removed");
    assert_eq!(read(&node.bin.join("manifests-at-join-1")), "");
    let cfg = read(&node.bin.join("join-config-1.yaml"));
    let hash = openssl_spki_hash(&svc.root.join("etc/kubernetes/pki/ca.crt"));
    let want = format!(
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: \"10.0.0.1:6443\"\n    token: \"{TOKEN}\"\n    caCertHashes:\n    - \"{hash}\"\n"
    );
    assert_eq!(cfg, want);
    kubeadm_reads(&node.bin.join("join-config-1.yaml"));
    let st = node.state().unwrap();
    assert_eq!(
        (st["state"].as_str(), st["role"].as_str()),
        (Some("done"), Some("worker"))
    );
    assert_eq!(st["ca_cert_hash"].as_str(), Some(hash.as_str()));
    assert!(
        !node.root.join("etc/kubernetes/pki").exists(),
        "a worker gets no cluster keys"
    );
    // The service recorded the identity and made exactly one token.
    let issued = svc.issued();
    let ids: Vec<_> = issued["issued"].as_object().unwrap().values().collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(
        (
            ids[0]["node"].as_str(),
            ids[0]["role"].as_str(),
            ids[0]["kept"].as_bool()
        ),
        (Some("join-worker-node"), Some("worker"), Some(true)),
        "the node said it keeps its ticket once its lock was durable"
    );
    assert!(
        run.stderr.contains("that this node keeps its ticket")
            && !run.stderr.contains("could not tell"),
        "{}",
        run.stderr
    );
    assert_eq!(
        calls(&svc.bin),
        vec!["token create --ttl 15m0s".to_string()]
    );
    assert_no_secrets("activate's log", &run.stderr);
    assert_no_secrets("activate's stdout", &run.stdout);
    let mut svc = svc;
    let sv = svc.stop();
    sv.assert_ok();
    assert_no_secrets("join-service's log", &sv.stderr);
    // Both commands keep a status record of their run, in the same schema as bootstrap's.
    let rec = record(&node.root, "activate");
    assert_eq!(rec["state"], "done", "{rec}");
    assert!(decided(&rec, "node-state", "fresh"), "{rec}");
    assert!(decided(&rec, "role", "worker"), "{rec}");
    let rec = record(&svc.root, "join-service");
    assert_eq!(rec["state"], "done", "stopped by its signal: {rec}");
    let tickets: Vec<&serde_json::Value> = rec["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["what"].as_str().unwrap_or("").starts_with("ticket "))
        .collect();
    assert!(
        tickets.len() == 1
            && tickets[0]["value"] == "worker"
            && tickets[0]["what"]
                .as_str()
                .unwrap()
                .contains("join-worker-node"),
        "{rec}"
    );
    assert_no_secrets("join-service's record", &rec.to_string());
}

/// The kept status record of `command` under `root`.
fn record(root: &Path, command: &str) -> serde_json::Value {
    let p = root.join(format!("var/lib/nodestrap/status-{command}.json"));
    serde_json::from_str(&read(&p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn decided(rec: &serde_json::Value, what: &str, value: &str) -> bool {
    rec["decisions"]
        .as_array()
        .is_some_and(|d| d.iter().any(|d| d["what"] == what && d["value"] == value))
}

#[test]
fn join_wins_as_control_plane() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    let node = Node::new(&pki, "join-cp", Some("nodestrap:control-plane"));
    let run = node.activate(&[svc.url()]).wait(60);
    run.assert_ok();
    says(&run, "role=control-plane via=join");
    let pki_dir = node.root.join("etc/kubernetes/pki");
    for name in CP_FILES {
        let p = pki_dir.join(name);
        assert_eq!(
            read(&p),
            read(&svc.root.join("etc/kubernetes/pki").join(name)),
            "{name}"
        );
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode,
            if name.ends_with(".key") { 0o600 } else { 0o644 },
            "{name}"
        );
    }
    assert!(read(&node.bin.join("join-config-1.yaml")).ends_with("controlPlane: {}\n"));
    kubeadm_reads(&node.bin.join("join-config-1.yaml"));
    assert_eq!(node.state().unwrap()["role"], "control-plane");
    assert_no_secrets("activate's log", &run.stderr);
}

#[test]
fn init_and_join_in_the_same_instant_exactly_one_runs() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    // The join service holds each ticket until the test says go: the init request is fired
    // at offsets around that moment, so both sides reach the lock in the same instant.
    write(&svc.bin.join("gate"), "");
    let admin = Admin::new(&pki, None);
    let (mut inits, mut joins) = (0, 0);
    const ROUNDS: i64 = 40;
    for i in 0..ROUNDS {
        let offset_ms = (i % 10) * 10 - 30; // init first (<0) .. ticket first (>0)
        let node = Node::new(&pki, &format!("race{i}"), None);
        let act = node.activate(&[svc.url()]);
        let mut args = admin.args(act.port());
        // No second try once the node is gone: that is a lost race, not an outage.
        let w = args.iter().position(|a| a == "--wait").unwrap();
        args[w + 1] = "1".into();
        let end = Instant::now() + Duration::from_secs(20);
        while !svc.bin.join("waiting").exists() {
            assert!(
                Instant::now() < end,
                "iteration {i}: the join client never asked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let go = || write(&svc.bin.join("go"), "");
        let pause = Duration::from_millis(offset_ms.unsigned_abs());
        let client = if offset_ms < 0 {
            let c = Proc::start(args);
            std::thread::sleep(pause);
            go();
            c
        } else {
            go();
            std::thread::sleep(pause);
            Proc::start(args)
        };
        let run = act.wait(60);
        let client = client.wait(60);
        run.assert_ok();
        let c = node.calls();
        assert_eq!(
            c.len(),
            1,
            "iteration {i}: exactly one kubeadm run, got {c:?}\n{}",
            run.stderr
        );
        let st = node.state().unwrap();
        assert_eq!(st["state"], "done", "iteration {i}");
        let source = st["source"].as_str().unwrap_or_default();
        if c[0].starts_with("init ") {
            inits += 1;
            client.assert_ok();
            assert_eq!(st["role"], "control-plane");
            assert!(
                source.starts_with("init request from "),
                "iteration {i}: {st}"
            );
            assert!(run.stdout.contains("via=init"));
        } else {
            joins += 1;
            assert!(c[0].starts_with("join "), "{c:?}");
            assert_eq!(st["role"], "worker");
            assert!(
                source.starts_with("ticket from https://"),
                "iteration {i}: {st}"
            );
            assert!(run.stdout.contains("via=join"));
            // The admin learns the node is taken (or finds it gone once the join finished).
            assert_ne!(
                client.code, 0,
                "iteration {i}: init reported success on a joined node"
            );
        }
        eprintln!(
            "race {i}: offset {offset_ms:+} ms: {} won",
            if c[0].starts_with("init ") {
                "init"
            } else {
                "join"
            }
        );
        let _ = std::fs::remove_dir_all(&node.dir);
    }
    // Which side wins is up to timing (on a slow emulated machine join may win every round):
    // reported, not required. Each round's exactly-one-kubeadm check above is the property.
    eprintln!("race: init won {inits} times, join won {joins} times");
}

#[test]
fn wrong_secret_or_untrusted_client_is_refused_and_the_lock_untouched() {
    let pki = Pki::new();
    let node = Node::new(&pki, "refused", None);
    let act = node.activate(&[]);
    let port = act.port();

    let bad = Admin::new(&pki, None);
    write(&bad.dir.join("secret"), "not the secret\n");
    bad.init(port).assert_fails(1, "wrong init secret");
    act.wait_for("refused, node lock untouched: wrong init secret", 10);

    let outsider = Ca::new("someone else's CA");
    let stranger = Admin::new(&pki, Some(&outsider));
    let r = stranger.init(port);
    assert_eq!(r.code, 1, "{}", r.stderr);
    act.wait_for("init server: refused a connection from 127.0.0.1", 10);

    // init-cluster refuses a bad field itself (exit 2, nothing sent)…
    let field = Admin::new(&pki, None);
    let mut args = field.args(port);
    let v = args.iter().position(|a| a == "v1.37.2").unwrap();
    args[v] = "1.31".into();
    let r = Proc::start(args).wait(30);
    r.assert_fails(
        2,
        "--kubernetes-version \"1.31\": expected vMAJOR.MINOR.PATCH",
    );
    // …so the node's own checks get raw requests: with the right secret the bad field is
    // refused by name; with a wrong one the secret is refused first, the field never looked at.
    let admin = pki.admin.client("raw-admin");
    let request = |secret: &str| {
        let body = serde_json::json!({
            "cluster_name": "demo",
            "kubernetes_version": "1.31",
            "pod_cidr": "10.244.0.0/16",
            "service_cidr": "10.96.0.0/12",
            "init_secret": secret,
        });
        post(port, &pki.nodes, &admin, "/v1/init", &body.to_string()).unwrap()
    };
    let (status, b) = request(SECRET);
    assert_eq!((status, b["code"].as_str()), (400, Some("invalid")), "{b}");
    assert!(
        b["error"]
            .as_str()
            .unwrap()
            .contains("kubernetes_version \"1.31\": expected vMAJOR.MINOR.PATCH"),
        "{b}"
    );
    act.wait_for(
        "refused, node lock untouched: init request: kubernetes_version",
        10,
    );
    let (status, b) = request("not the secret");
    assert_eq!(
        (status, b["code"].as_str()),
        (403, Some("bad_secret")),
        "{b}"
    );
    assert_eq!(b["error"], "wrong init secret", "{b}");

    assert!(node.state().is_none(), "no marker after refusals");
    assert!(node.calls().is_empty());
    // The server is still there, and the lock still free.
    Admin::new(&pki, None).init(port).assert_ok();
    act.wait(30).assert_ok();
    assert_eq!(node.calls().len(), 1);
}

#[test]
fn ticket_from_an_unpinned_join_service_is_refused() {
    let pki = Pki::new();
    let rogue_ca = Ca::new("rogue CA");
    let svc = JoinSvc::new(&pki, &rogue_ca);
    let node = Node::new(&pki, "unpinned", None);
    let act = node.activate(&[svc.url()]);
    // Two rounds, both refused at the handshake: the certificate is not from the pinned CA.
    act.wait_for("join client: POST", 20);
    let end = Instant::now() + Duration::from_secs(20);
    while act.count("join client: POST") < 2 {
        assert!(Instant::now() < end, "{}", act.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = act.wait_for("join client: POST", 1);
    assert!(
        line.contains("UnknownIssuer") || line.contains("invalid peer certificate"),
        "{line}"
    );
    assert!(node.state().is_none());
    assert!(node.calls().is_empty());
    assert!(svc.issued().is_null(), "no ticket left the service");
    act.sigterm();
    let run = act.wait(30);
    run.assert_ok();
    assert!(
        run.stdout.contains("activate stopped; node still fresh"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_request_kubeadm_refuses_keeps_the_node_fresh() {
    // The real kubeadm judges the config before the lock: v1.31.2 is below what kubeadm v1.37
    // deploys. Past the lock this would have cost the node (reset, reprovision).
    let pki = Pki::new();
    let node = Node::new(&pki, "kubeadm-refuses", None);
    let act = node.activate(&[]);
    let admin = Admin::new(&pki, None);
    let r = Proc::start(admin.args_for(act.port(), "v1.31.2")).wait(60);
    r.assert_fails(
        1,
        "only supports deploying clusters with the control plane version",
    );
    assert!(r.stderr.contains("kubeadm config validate"), "{}", r.stderr);
    assert!(node.state().is_none(), "the node lock was taken");
    assert!(node.calls().is_empty(), "{:?}", node.calls());
    assert!(!node.root.join("run/nodestrap/kubeadm-init.yaml").exists());
    // The same node initializes for a version kubeadm deploys.
    admin.init(act.port()).assert_ok();
    act.wait(30).assert_ok();
}

#[test]
fn failures_before_the_lock_are_retried() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    write(&svc.bin.join("fail-token"), "");
    let node = Node::new(&pki, "retried", None);
    let act = node.activate(&[svc.url()]);
    act.wait_for("--token-command exit status 1", 20);
    assert!(node.state().is_none() && node.calls().is_empty());
    assert!(
        svc.issued().is_null(),
        "a failed ticket does not use up the identity"
    );
    std::fs::remove_file(svc.bin.join("fail-token")).unwrap();
    let run = act.wait(60);
    run.assert_ok();
    assert!(run.stdout.contains("via=join"));
    assert_eq!(node.calls().len(), 1);
}

#[test]
fn kubeadm_init_failing_after_the_lock_resets_and_asks_for_a_reboot() {
    let pki = Pki::new();
    let node = Node::new(&pki, "init-fails", None);
    write(&node.bin.join("fail-init"), "");
    let act = node.activate(&[]);
    let r = Admin::new(&pki, None).init(act.port());
    r.assert_fails(1, "kubeadm init: exit status 1");
    // The admin gets the tail of kubeadm's output, tokens scrubbed.
    assert!(
        r.stderr
            .contains("error execution phase preflight: stand-in failure"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--token [token]"), "{}", r.stderr);
    assert_no_secrets("init-cluster's output", &r.stderr);
    let run = act.wait(30);
    run.assert_fails(1, "kubeadm init: exit status 1");
    // The reboot is asked for; with --root not / the executor declines it (a real reboot
    // cannot be tested here).
    assert!(
        run.stderr.contains(
            "reboot needed (activation failed after the node lock (node state reset)); \
             not rebooting: --root is not /"
        ),
        "{}",
        run.stderr
    );
    says(
        &run,
        "activate failed after the node lock; the node must be reprovisioned",
    );
    // The error is logged once, with the exit.
    assert_eq!(
        run.count_lines("kubeadm init: exit status 1"),
        1,
        "{}",
        run.stderr
    );
    let st = node.state().unwrap();
    assert_eq!(st["state"], "reset");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("kubeadm init: exit status 1"),
        "{st}"
    );
    // The restarted node is not fresh: it refuses, and nothing runs.
    let again = node.activate(&[]).wait(30);
    again.assert_fails(2, "node state reset");
    assert!(!again.stderr.contains("listening"));
    assert_eq!(node.calls().len(), 1);
}

#[test]
fn kubeadm_join_is_tried_three_times_then_fatal() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    // Fails once, then joins: two attempts, each from an empty manifests folder.
    let node = Node::new(&pki, "join-twice", None);
    write(&node.bin.join("fail-join"), "1");
    node.activate(&[svc.url()]).wait(60).assert_ok();
    assert_eq!(node.calls().len(), 2);
    assert_eq!(
        read(&node.bin.join("manifests-at-join-2")),
        "",
        "reset before each attempt"
    );
    assert_eq!(node.state().unwrap()["state"], "done");

    // A control plane, whose ticket carries the cluster CA keys: gone again once the join
    // failed for good, as is the config holding the token.
    let node = Node::new(&pki, "join-fails", Some("nodestrap:control-plane"));
    write(&node.bin.join("fail-join"), "9");
    let run = node.activate(&[svc.url()]).wait(60);
    run.assert_fails(1, "kubeadm join failed 3 times within 900 s");
    assert_eq!(run.count_lines("kubeadm join attempt"), 3);
    assert_eq!(node.calls().len(), 3);
    assert_eq!(node.state().unwrap()["state"], "reset");
    assert!(run.stderr.contains("not rebooting: --root is not /"));
    let at_join = read(&node.bin.join("pki-at-join-3"));
    for key in ["ca.key", "sa.key", "front-proxy-ca.key"] {
        assert!(
            at_join.contains(key),
            "{key} not in place for kubeadm:\n{at_join}"
        );
    }
    let pki_dir = node.root.join("etc/kubernetes/pki");
    for name in CP_FILES {
        assert!(
            !pki_dir.join(name).exists(),
            "{name} left after the failed join"
        );
    }
    assert!(run
        .stderr
        .contains("removed the 8 control-plane files of the ticket"));
    assert!(!node.root.join("run/nodestrap/kubeadm-join.yaml").exists());
    assert_no_secrets("activate's log", &run.stderr);
}

/// The run's stdout (its summary line) contains `needle`.
fn says(run: &Run, needle: &str) {
    assert!(
        run.stdout.contains(needle),
        "stdout lacks {needle:?}:\n{}",
        run.stdout
    );
}

trait Lines {
    fn count_lines(&self, needle: &str) -> usize;
}

impl Lines for Run {
    fn count_lines(&self, needle: &str) -> usize {
        self.stderr.lines().filter(|l| l.contains(needle)).count()
    }
}

#[test]
fn crash_after_committed_never_inits_or_joins_again() {
    let pki = Pki::new();
    let node = Node::new(&pki, "crash", None);
    write(&node.bin.join("sleep-init"), "30");
    let (mut act, client) = init_in_flight(&pki, &node);
    // kill -9 mid-init, and the stand-in kubeadm with it.
    act.child.kill().unwrap();
    let _ = act.child.wait();
    let pid: i32 = read(&node.bin.join("kubeadm.pid")).trim().parse().unwrap();
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    assert!(!act.running());
    assert_ne!(client.wait(30).code, 0);
    assert_eq!(node.state().unwrap()["state"], "committed");

    let svc = JoinSvc::new(&pki, &pki.cluster);
    let again = node.activate(&[svc.url()]).wait(30);
    again.assert_fails(2, "node state committed");
    assert!(again.stderr.contains("will not init or join again"));
    assert_eq!(node.calls().len(), 1, "no second kubeadm run");
    assert!(svc.issued().is_null(), "not even a ticket was asked for");
}

/// POST /v1/ticket as `leaf`, trusting `ca`: (status, body).
fn ticket(port: u16, ca: &Ca, leaf: &Leaf) -> Result<(u16, serde_json::Value), String> {
    post(port, ca, leaf, "/v1/ticket", "{}")
}

/// POST `body` to `path` as `leaf`, trusting `ca`: (status, body).
fn post(
    port: u16,
    ca: &Ca,
    leaf: &Leaf,
    path: &str,
    body: &str,
) -> Result<(u16, serde_json::Value), String> {
    post_after(port, ca, leaf, path, body, &|| {})
}

/// `post`, with `meanwhile` run between the TLS handshake and the request.
fn post_after(
    port: u16,
    ca: &Ca,
    leaf: &Leaf,
    path: &str,
    body: &str,
    meanwhile: &dyn Fn(),
) -> Result<(u16, serde_json::Value), String> {
    mtls_post(port, ca, leaf, path, body, meanwhile).map(|(status, _, v)| (status, v))
}

/// POST /v1/ticket as `leaf` from the node's run `session` (one letter, repeated).
fn ticket_in(
    port: u16,
    ca: &Ca,
    leaf: &Leaf,
    session: char,
) -> Result<(u16, serde_json::Value), String> {
    let body = session_body(session);
    post(port, ca, leaf, "/v1/ticket", &body)
}

/// POST /v1/ticket/kept as `leaf`: the node says it keeps its ticket.
fn kept(port: u16, ca: &Ca, leaf: &Leaf) -> Result<(u16, serde_json::Value), String> {
    post(port, ca, leaf, "/v1/ticket/kept", "{}")
}

#[test]
fn one_ticket_kept_per_node_identity_even_across_restarts() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let node = both_ways(&pki.nodes, "node-a", None);
    let (status, t) = ticket_in(svc.port(), &pki.cluster, &node, 'a').unwrap();
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["token"], TOKEN);
    assert_eq!(
        (t["role"].as_str(), t["cluster_name"].as_str()),
        (Some("worker"), Some("demo"))
    );
    assert_eq!(
        t["discovery_token_ca_cert_hash"].as_str().unwrap(),
        openssl_spki_hash(&svc.root.join("etc/kubernetes/pki/ca.crt"))
    );
    assert!(t.get("control_plane_files").is_none());
    let unkept = |svc: &JoinSvc| {
        let v = svc.issued();
        let e = v["issued"].as_object().unwrap().values().next().unwrap();
        !e["kept"].as_bool().unwrap()
    };
    assert!(unkept(&svc), "{}", svc.issued());

    // Asked again before it said it keeps the first: by the same run (at two join services
    // at once) or a run that does not say which, refused; by a new run (the node was killed
    // before its node lock was durable, and holds none), a new ticket, across a restart too.
    svc.stop().assert_ok();
    svc.start();
    let refused = |r: Result<(u16, serde_json::Value), String>| {
        let (status, again) = r.unwrap();
        assert_eq!(
            (status, again["code"].as_str()),
            (409, Some("already_issued")),
            "{again}"
        );
    };
    refused(ticket_in(svc.port(), &pki.cluster, &node, 'a'));
    refused(ticket(svc.port(), &pki.cluster, &node));
    let (status, again) = ticket_in(svc.port(), &pki.cluster, &node, 'b').unwrap();
    assert_eq!(
        (status, again["token"].as_str()),
        (200, Some(TOKEN)),
        "{again}"
    );
    refused(ticket_in(svc.port(), &pki.cluster, &node, 'b'));
    // Kept: final. Saying it twice is the same; an identity with no ticket has none to keep.
    for _ in 0..2 {
        let (status, k) = kept(svc.port(), &pki.cluster, &node).unwrap();
        assert_eq!((status, k), (200, serde_json::json!({})));
    }
    assert!(!unkept(&svc), "{}", svc.issued());
    let (status, k) = kept(
        svc.port(),
        &pki.cluster,
        &both_ways(&pki.nodes, "never-asked", None),
    )
    .unwrap();
    assert_eq!(
        (status, k["code"].as_str()),
        (409, Some("not_issued")),
        "{k}"
    );
    refused(ticket_in(svc.port(), &pki.cluster, &node, 'c'));
    // Durable: a restarted service refuses too.
    let log = svc.stop();
    log.assert_ok();
    for line in [
        "already got a ticket",
        "asks again from another run after the ticket of",
        "keeps its ticket (its node lock is durable)",
        "no ticket for this node identity",
    ] {
        assert!(log.stderr.contains(line), "{line}: {}", log.stderr);
    }
    svc.start();
    let (status, again) = ticket(svc.port(), &pki.cluster, &node).unwrap();
    assert_eq!(
        (status, again["code"].as_str()),
        (409, Some("already_issued")),
        "{again}"
    );
    // Another identity with the same name is another node; a certificate from outside the
    // node-provisioning CA gets nothing.
    let (status, _) = ticket(
        svc.port(),
        &pki.cluster,
        &both_ways(&pki.nodes, "node-a", None),
    )
    .unwrap();
    assert_eq!(status, 200);
    let outsider = Ca::new("outsider");
    assert!(ticket(
        svc.port(),
        &pki.cluster,
        &both_ways(&outsider, "node-b", None)
    )
    .is_err());
    assert_eq!(
        calls(&svc.bin).len(),
        3,
        "one token per ticket issued, none for refusals"
    );
    let log = svc.stop();
    assert!(
        log.stderr.contains("already got a ticket"),
        "{}",
        log.stderr
    );
    assert_no_secrets("join-service's log", &log.stderr);
    let _ = std::fs::remove_dir_all(&svc.dir);
}

/// A certificate's subject is outside text: a CN carrying a newline and a line shaped like
/// join-service's own, with CR, NUL and an escape sequence, stays inside its one log line,
/// its control characters written as escapes.
#[test]
fn a_forged_log_line_in_a_certificate_stays_in_its_line() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let forged = "node-x\ninfo: node forged-node (sha256:00) at 127.0.0.1:1: ticket issued as control-plane\r\u{0}\u{1b}[2K";
    let _ = ticket(
        svc.port(),
        &pki.cluster,
        &both_ways(&pki.nodes, forged, None),
    );
    let log = svc.stop();
    assert!(
        !log.stderr
            .lines()
            .any(|l| l.starts_with("info: node forged-node")),
        "{}",
        log.stderr
    );
    assert!(
        log.stderr.contains("node-x\\ninfo: node forged-node"),
        "{}",
        log.stderr
    );
    assert!(
        !log.stderr.contains('\r') && !log.stderr.contains('\u{1b}') && !log.stderr.contains('\0'),
        "{:?}",
        log.stderr
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}

#[test]
fn a_trickling_client_cannot_hold_the_join_service() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let port = svc.port();
    // A TLS record header announcing 512 bytes, then one byte a second: every read is in
    // time, so only one deadline for the whole connection (10 s) frees the service, which
    // serves one connection at a time.
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let start = Instant::now();
    let trickler = std::thread::spawn(move || {
        for _ in 0..60 {
            std::thread::sleep(Duration::from_secs(1));
            if slow.write_all(&[0]).is_err() {
                return Some(start.elapsed());
            }
        }
        None
    });
    // The service is busy with the slow one before the real request arrives.
    std::thread::sleep(Duration::from_millis(500));
    let node = both_ways(&pki.nodes, "node-behind", None);
    let (status, t) = ticket(port, &pki.cluster, &node).expect("served once the deadline passed");
    assert_eq!(status, 200, "{t}");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(16), "ticket after {took:?}");
    let cut = trickler
        .join()
        .unwrap()
        .expect("the slow connection was never closed");
    assert!(cut < Duration::from_secs(16), "cut off after {cut:?}");
    let log = svc.stop();
    assert!(
        log.stderr
            .contains("the connection's 10 s deadline has passed"),
        "{}",
        log.stderr
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}

#[test]
fn stop_waits_for_an_init_in_flight() {
    let pki = Pki::new();
    let node = Node::new(&pki, "stop", None);
    write(&node.bin.join("sleep-init"), "3");
    let (mut act, client) = init_in_flight(&pki, &node);
    act.sigterm();
    act.wait_for(
        "stop signal: stopping once any init in flight has finished",
        10,
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(act.running(), "stopped while kubeadm init was running");
    client.wait(60).assert_ok();
    let run = act.wait(30);
    run.assert_ok();
    says(&run, "activate done role=control-plane via=init");
    assert_eq!(node.state().unwrap()["state"], "done");
}

#[test]
fn bad_inputs_are_configuration_errors_naming_the_file() {
    let pki = Pki::new();
    let node = Node::new(&pki, "inputs", None);
    std::fs::remove_file(node.root.join("etc/nodestrap/activate/admin-ca.crt")).unwrap();
    node.activate(&[]).wait(30).assert_fails(2, "--admin-ca ");
    write(
        &node.root.join("etc/nodestrap/activate/admin-ca.crt"),
        &pki.admin.pem,
    );
    write(
        &node.root.join("etc/nodestrap/activate/init-secret.hash"),
        "sha256:abc\n",
    );
    node.activate(&[])
        .wait(30)
        .assert_fails(2, "init-secret.hash: not four $-separated fields");
    node.activate(&["http://127.0.0.1:1".into()])
        .wait(30)
        .assert_fails(2, "--join-endpoints \"http://127.0.0.1:1\"");
    assert!(node.state().is_none());
    // A marker that does not parse still means the lock was taken once: not fresh, exit 2
    // (no restart loop), naming the file and why.
    write(&node.root.join(STATE), "{\"state\": \"committed\"");
    let run = node.activate(&[]).wait(30);
    run.assert_fails(2, "node-state.json: not a node state (EOF while parsing");
    assert!(run.stderr.contains("not fresh"), "{}", run.stderr);
    assert!(!run.stderr.contains("listening"), "{}", run.stderr);

    // init-cluster: a field's flag is named, the value given kept as it was; no zero timeout.
    let admin = Admin::new(&pki, None);
    let mut args = admin.args(1);
    let n = args.iter().position(|a| a == "demo").unwrap();
    args[n] = "my_cluster".into();
    Proc::start(args)
        .wait(30)
        .assert_fails(2, "--cluster-name \"my_cluster\": expected a DNS label");
    let mut args = admin.args(1);
    let t = args.iter().position(|a| a == "--timeout").unwrap();
    args[t + 1] = "0".into();
    Proc::start(args)
        .wait(30)
        .assert_fails(2, "--timeout 0: must be at least 1");
}

// ---------------------------------------------------------------------------------------------
// Nobody slows the control plane down before authenticating

/// `n` TCP connections that say nothing, kept open for the length of the test.
fn idle_connections(port: u16, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect()
}

#[test]
fn idle_connections_do_not_delay_a_joiner() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let port = svc.port();
    let mut times = Vec::new();
    for n in [0, 10, 50] {
        let idle = idle_connections(port, n);
        // Let the service accept them all: they are in their handshakes now.
        std::thread::sleep(Duration::from_millis(300));
        let node = both_ways(&pki.nodes, &format!("node-behind-{n}"), None);
        let start = Instant::now();
        let (status, t) = ticket(port, &pki.cluster, &node).unwrap();
        let took = start.elapsed();
        assert_eq!(status, 200, "{t}");
        times.push((n, took));
        drop(idle);
    }
    eprintln!("join time with 0, 10 and 50 idle connections: {times:?}");
    for (n, took) in &times {
        // One idle connection used to hold every joiner for its whole 10 s deadline.
        assert!(*took < Duration::from_secs(3), "{n} idle: {took:?}");
    }
    svc.stop().assert_ok();
    let _ = std::fs::remove_dir_all(&svc.dir);
}

#[test]
fn idle_connections_do_not_delay_a_cluster_init() {
    let pki = Pki::new();
    let node = Node::new(&pki, "idle-init", None);
    let act = node.activate(&[]);
    let idle = idle_connections(act.port(), 10);
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let r = Admin::new(&pki, None).init(act.port());
    let took = start.elapsed();
    r.assert_ok();
    eprintln!("init time with 10 idle connections: {took:?}");
    // Three idle connections used to delay it by a minute and a half.
    assert!(took < Duration::from_secs(8), "{took:?}");
    drop(idle);
    act.wait(30).assert_ok();
}

#[test]
fn connections_beyond_the_bound_are_refused_not_queued() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let port = svc.port();
    // The service's bound on connections in their handshake (mtls::MAX_UNAUTHENTICATED).
    let idle = idle_connections(port, 128);
    std::thread::sleep(Duration::from_millis(500));
    let mut extra = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let start = Instant::now();
    let mut b = [0u8; 1];
    let r = extra.read(&mut b);
    // Closed at once (EOF or reset), not left waiting behind the idle ones.
    assert!(
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(idle);
    let log = svc.stop();
    assert!(
        log.stderr
            .contains("128 connections are already in their handshake"),
        "{}",
        log.stderr
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}

/// POST /v1/ticket as `leaf` from run `session`: (status, the wait its `Retry-After` asks on
/// the server's clock, from its `Date`, when it is an HTTP-date).
fn ask_for_turn(port: u16, ca: &Ca, leaf: &Leaf, session: char) -> (u16, Option<Duration>) {
    let (status, slot) = ask_for_slot(port, ca, leaf, session);
    (status, slot.map(|(wait, _)| wait))
}

/// A `Retry-After` date: the wait from the answer's `Date`, and the date itself.
type Slot = (Duration, std::time::SystemTime);

/// As `ask_for_turn`, with the slot's own date: the waits of two answers come from two `Date`s,
/// each whole seconds taken when its answer was written, so only the slots' dates compare.
fn ask_for_slot(port: u16, ca: &Ca, leaf: &Leaf, session: char) -> (u16, Option<Slot>) {
    let body = session_body(session);
    let (status, head, _) = mtls_post(port, ca, leaf, "/v1/ticket", &body, &|| {}).unwrap();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| httpdate::parse_http_date(v.trim()).unwrap())
    };
    let wait = match (header("Retry-After:"), header("Date:")) {
        (Some(at), Some(date)) => Some((at.duration_since(date).unwrap_or_default(), at)),
        (None, None) => None,
        other => panic!("a Retry-After date without a Date, or the other way: {other:?}\n{head}"),
    };
    (status, wait)
}

/// The join service's appointments (docs/join-service.md, "Appointments"): nodes that come at
/// once, faster than tickets are made, are served as far as no one waits long, and the rest are
/// each given a slot, later ones later; a node that comes back at its slot is served, while a
/// newcomer asking then is given a slot after the last one.
#[test]
fn a_herd_gets_appointments_and_a_node_on_time_goes_before_newcomers() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    write(&svc.bin.join("sleep-token"), "0.3");
    let port = svc.port();
    let herd: Vec<Leaf> = (0..12)
        .map(|i| both_ways(&pki.nodes, &format!("herd-{i}"), None))
        .collect();
    let first: Vec<(u16, Option<Slot>, Instant)> = std::thread::scope(|sc| {
        let go = Arc::new(std::sync::Barrier::new(herd.len()));
        let hs: Vec<_> = herd
            .iter()
            .map(|l| {
                let go = go.clone();
                let ca = &pki.cluster;
                sc.spawn(move || {
                    go.wait();
                    let (status, slot) = ask_for_slot(port, ca, l, 'a');
                    (status, slot, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let served = first.iter().filter(|(s, _, _)| *s == 200).count();
    let given: Vec<Slot> = first
        .iter()
        .filter(|(s, _, _)| *s == 503)
        .map(|(_, w, _)| w.expect("a 503 of the book carries a Retry-After date"))
        .collect();
    assert_eq!(served + given.len(), herd.len(), "{first:?}");
    assert!((1..=5).contains(&served), "served at once: {first:?}");
    // One slot each: no second of the server's clock holds more slots than its first guess of
    // a visit (0.25 s) allows (the dates are whole seconds), and the last within the time the
    // herd needs.
    let mut slots: Vec<std::time::SystemTime> = given.iter().map(|(_, at)| *at).collect();
    slots.sort();
    let per_second = slots.chunk_by(|a, b| a == b);
    assert!(per_second.into_iter().all(|c| c.len() <= 4), "{given:?}");
    assert!(
        given.iter().all(|(w, _)| *w < Duration::from_secs(20)),
        "{given:?}"
    );
    // Each comes back at its slot (half a second after the wait it was told, as the client's
    // jitter would), a newcomer with the first of them: they are served, the newcomer is given
    // a slot after theirs.
    let booked: Vec<(&Leaf, Instant)> = herd
        .iter()
        .zip(&first)
        .filter(|(_, (s, _, _))| *s == 503)
        .map(|(l, (_, w, at))| (l, *at + w.unwrap().0 + Duration::from_millis(500)))
        .collect();
    let earliest = booked.iter().map(|(_, t)| *t).min().unwrap();
    let latest = booked.iter().map(|(_, t)| *t).max().unwrap();
    let results: Vec<(u16, Option<Duration>)> = std::thread::scope(|sc| {
        let mut hs: Vec<_> = booked
            .iter()
            .map(|(l, t)| {
                let (l, t, ca) = (*l, *t, &pki.cluster);
                sc.spawn(move || {
                    std::thread::sleep(t.saturating_duration_since(Instant::now()));
                    ask_for_turn(port, ca, l, 'a')
                })
            })
            .collect();
        let newcomer = both_ways(&pki.nodes, "newcomer", None);
        let ca = &pki.cluster;
        hs.push(sc.spawn(move || {
            std::thread::sleep(earliest.saturating_duration_since(Instant::now()));
            ask_for_turn(port, ca, &newcomer, 'b')
        }));
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (newcomer, kept) = results.split_last().unwrap();
    assert!(kept.iter().all(|(s, _)| *s == 200), "{results:?}");
    assert_eq!(newcomer.0, 503, "{newcomer:?}");
    // (Both dates are whole seconds: two seconds of slack.)
    assert!(
        earliest + newcomer.1.unwrap() + Duration::from_secs(2) >= latest,
        "the newcomer's slot comes after every booked one: {results:?}"
    );
    let log = svc.stop();
    assert!(
        log.stderr.contains("this node's slot is at"),
        "{}",
        log.stderr
    );
    assert_eq!(
        calls(&svc.bin).len(),
        herd.len(),
        "one token per ticket: none for an appointment"
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}

#[test]
fn malformed_ticket_requests_cost_no_ticket() {
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    let node = both_ways(&pki.nodes, "node-m", None);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(8000));
    for body in [
        "[]",
        "{\"role\":\"control-plane\"}",
        "not json",
        big.as_str(),
    ] {
        let (status, answer) = post(svc.port(), &pki.cluster, &node, "/v1/ticket", body).unwrap();
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some("invalid")),
            "{body:.40}: {answer}"
        );
    }
    assert!(
        calls(&svc.bin).is_empty(),
        "no token made for a malformed request"
    );
    assert_eq!(svc.issued(), serde_json::Value::Null);
    // The same identity, asking properly, still gets its one ticket.
    let (status, t) = ticket(svc.port(), &pki.cluster, &node).unwrap();
    assert_eq!(status, 200, "{t}");
    assert_eq!(calls(&svc.bin).len(), 1);
    svc.stop().assert_ok();
    let _ = std::fs::remove_dir_all(&svc.dir);
}

#[test]
fn overlapping_cidrs_are_a_configuration_error() {
    let pki = Pki::new();
    let node = Node::new(&pki, "cidrs", None);
    let act = node.activate(&[]);
    let admin = Admin::new(&pki, None);
    for (pods, services, want) in [
        (
            "10.96.0.0/16",
            "10.96.0.0/12",
            "--pod-cidr 10.96.0.0/16 overlaps the service range 10.96.0.0/12",
        ),
        ("10.0.0.0/8", "10.96.0.0/12", "overlaps the service range"),
    ] {
        let mut a = admin.args(act.port());
        a.extend([
            "--pod-cidr".into(),
            pods.into(),
            "--service-cidr".into(),
            services.into(),
        ]);
        let r = Proc::start(a).wait(30);
        r.assert_fails(2, want);
    }
    // The server checks too, and against the node's own address: 127.0.0.1 is in 127.0.0.0/8.
    let leaf = pki.admin.client("cluster-admin");
    let body = serde_json::json!({"cluster_name":"demo","kubernetes_version":"v1.31.2",
        "pod_cidr":"127.0.0.0/8","service_cidr":"10.96.0.0/12","init_secret":SECRET});
    let (status, answer) =
        post(act.port(), &pki.nodes, &leaf, "/v1/init", &body.to_string()).unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("pod_cidr 127.0.0.0/8 holds the node's own address 127.0.0.1"),
        "{answer}"
    );
    assert!(node.calls().is_empty(), "kubeadm never ran");
    assert!(node.state().is_none(), "the node lock is untouched");
    act.sigterm();
}

/// The join side won and is joining: an admin who asks meanwhile gets 409 naming what the node
/// now is. One whose request arrives as activation ends (its connection accepted, the join done
/// before its request is read) still gets that answer, never a closed connection.
#[test]
fn a_node_that_chose_to_join_still_answers_the_admin() {
    let pki = Pki::new();
    let svc = JoinSvc::new(&pki, &pki.cluster);
    let node = Node::new(&pki, "join-busy", None);
    write(&node.bin.join("gate-join"), "");
    let act = node.activate(&[svc.url()]);
    let port = act.port();
    let end = Instant::now() + Duration::from_secs(30);
    while !node.bin.join("waiting-join").exists() {
        assert!(
            Instant::now() < end,
            "kubeadm join never started:\n{}",
            act.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let admin = Admin::new(&pki, None);
    let r = admin.init(port);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("the node is already activating: worker of cluster demo (ticket from https://127.0.0.1:")
            && r.stderr.contains("committed"),
        "{}",
        r.stderr
    );
    // A request whose connection is in when the join finishes.
    let leaf = pki.admin.client("cluster-admin");
    let body = serde_json::json!({
        "cluster_name": "demo", "kubernetes_version": "v1.37.2", "pod_cidr": "10.244.0.0/16",
        "service_cidr": "10.96.0.0/12", "apiserver_sans": [], "init_secret": SECRET,
    })
    .to_string();
    let got = post_after(port, &pki.nodes, &leaf, "/v1/init", &body, &|| {
        write(&node.bin.join("go-join"), "");
        act.wait_for("node state done recorded", 30);
        // The init server notices the stop within its 20 ms poll.
        std::thread::sleep(Duration::from_millis(300));
    });
    let (status, answer) = got.unwrap_or_else(|e| panic!("no answer: {e}\n{}", act.stderr()));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["code"], "already_activating", "{answer}");
    let msg = answer["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("worker of cluster demo (ticket from https://127.0.0.1:")
            && msg.ends_with("done"),
        "{answer}"
    );
    let run = act.wait(60);
    run.assert_ok();
    says(&run, "activate done role=worker via=join");
}
