"""The activation family: two fresh sysext nodes (Debian 13, the real systemd-sysext) that stage
the current release with the control plane's images from the initramfs, then race under the
node lock: node 1 is initialized by the admin through init-cluster (the real `kubeadm init`), node
2 joins with a ticket from node 1's join service (the real `kubeadm join`). And the same pair
where `kubeadm init` fails (a port taken): node 1's state goes to `reset` and it reboots, node 2
waits."""
import base64
import glob
import hashlib
import json
import os
import re
import secrets
import subprocess
import time

from harness.common import (
    ANSI, CURRENT, DEADLINE, GUEST_HOST, HERE, QUIET, TIMELINE, TOP, disk_copy, disk_file, disk_ls, free_port, run, say,
)
from harness.sysext import minor, world
from harness.vm import Boot, again_after_early_death, died_before_userspace


# ---------------------------------------------------------------------------------------------
# Scenarios `activate` and `activate-init-fails`. Both nodes have the same payload and options
# (either could win the race); node 1 alone has an init server the admin reaches (a port
# forward) and, once activated, the join service; node 2 asks node 1's join service through the
# host. The API server node 1 runs is reached by every node, and by the harness, through one
# more port forward: `controlPlaneEndpoint` is the host as the guests see it (10.0.2.2:PORT).

ACTIVATE_DIR = os.path.join(HERE, "guest", "activate")
ACTIVATE_BOOTS = 5  # the scenario's time limit, in boot timeouts (run_activate)
# The binary the images carry (qemu/build's default too), run here as the admin's client.
HOST_BIN = os.environ.get("NODESTRAP_BIN") or os.path.join(TOP, "target/x86_64-unknown-linux-musl/release/nodestrap")
DONE_RE = re.compile(r"nodestrap: activate done role=(\S+) via=(\S+) cluster=(\S+)")
NOT_FRESH_RE = re.compile(r"node state (reset|committed) \((\S+) of cluster ([^,\s)]+)")
TICKET_ASK_RE = re.compile(r"nodestrap\[\d+\]: .*(join service|ticket)", re.I)
# /run is a tmpfs, gone with the VM: what /run/nodestrap holds once activate has finished (the
# kubeadm configs, the join one with the token, must be gone; its status record stays) is said
# on the console instead.
RUN_LEFT_RE = re.compile(r"nodestrap-qemu: /run/nodestrap after activate: \[(.*)\]")
RUN_LEFT_DROPIN = ("[Service]\nExecStartPost=/bin/sh -c 'echo nodestrap-qemu: /run/nodestrap after activate: "
                   "[$$(ls -A /run/nodestrap)]'\n")
# Where the control plane's archives are once the kubernetes extension is merged (qemu/build-sysext).
IMAGES_DIR = "/usr/share/kubernetes/control-plane"
# activate-init-fails: a socket on kubeadm's API server port, so that kubeadm init's own
# preflight fails past the node lock.
SQUAT_SOCKET = """# The activate-init-fails scenario (qemu/harness/activation.py): holds the API server's port,
# so that kubeadm init fails on this node. Test image only.
[Unit]
Description=nodestrap-qemu: hold port 6443

[Socket]
ListenStream=6443

[Install]
WantedBy=sockets.target
"""
SQUAT_SERVICE = """# Started only if something connects to nodestrap-qemu-squat.socket. Test image only.
[Unit]
Description=nodestrap-qemu: hold port 6443

[Service]
ExecStart=/bin/sleep infinity
"""


class Act:
    """One activate scenario. `init_fails`: node 1's API server port is taken."""

    boots = 2
    bench_only = False
    mirror = "control-plane"
    trust = None

    def __init__(self, name, doc, init_fails):
        self.name, self.doc, self.init_fails = name, doc, init_fails
        self.timings, self.proof = {}, None
        self.runner = run_activate


def openssl_leaf(d, ca, name, subj, ext):
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write(ext)
    run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", subj,
         "-keyout", os.path.join(d, name + ".key"), "-out", os.path.join(d, name + ".csr")], **quiet)
    run(["openssl", "x509", "-req", "-in", os.path.join(d, name + ".csr"), "-CA", os.path.join(d, ca + ".crt"),
         "-CAkey", os.path.join(d, ca + ".key"), "-CAcreateserial", "-days", "2", "-extfile",
         os.path.join(d, name + ".ext"), "-out", os.path.join(d, name + ".crt")], **quiet)


def activate_pki(d):
    """Admin CA (init requests), node-provisioning CA (node identities), cluster CA (kubeadm's,
    pinned by nodes; it signs the join service's serving certificate)."""
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for ca in ("admin-ca", "node-ca", "cluster-ca"):
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "30",
             "-subj", "/CN=nodestrap-qemu-" + ca, "-keyout", os.path.join(d, ca + ".key"),
             "-out", os.path.join(d, ca + ".crt")], **quiet)
    for node in ("node1", "node2"):
        openssl_leaf(d, "node-ca", node, "/CN=" + node, "subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n"
                     "keyUsage=digitalSignature\n" % node)
    openssl_leaf(d, "admin-ca", "admin", "/CN=qemu-admin", "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n")
    openssl_leaf(d, "cluster-ca", "join-service", "/CN=nodestrap-join-service",
                 "subjectAltName=IP:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n" % GUEST_HOST)


def spki_hash(pem):
    out = subprocess.run("openssl x509 -pubkey -noout -in '%s' | openssl pkey -pubin -outform der | sha256sum" % pem,
                         shell=True, check=True, capture_output=True, text=True).stdout
    return "sha256:" + out.split()[0]


def conflist(node):
    """The pod network of one node: the bridge plugin with a /24 of the cluster's 10.244.0.0/16
    of its own (no overlay: each node's pods stay on it). containerd reads it from
    /etc/cni/net.d; the kubelet unit copies the plugins to /opt/cni/bin."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": "nodestrap-qemu",
        "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.%d.0/24" % (node == "node2")}]],
                              "routes": [{"dst": "0.0.0.0/0"}]}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2) + "\n"


def activate_config(s, w, sc, d, node, ports, url):
    """Node NAME's Ignition config (ignition/render sysext): the bootstrap's settings (the
    version pinned: a fresh cluster has no API server to ask), its pod network, the activation's
    identity, CAs, init secret hash and options, nodestrap-activate.service, and on node 1 the
    cluster CA kubeadm init uses and the join service."""
    v = w.release[CURRENT]
    texts = {
        "/etc/nodestrap/bootstrap.conf": (
            "# nodestrap bootstrap settings (same keys as its options)\n"
            "payload=sysext\nsysext-url=%s\nkeyring=/etc/nodestrap/keyring.asc\nca-file=/etc/nodestrap/ca.pem\n"
            "force-kube-version=%s\nfetch-attempts=3\n" % (url, v)),
        "/etc/nodestrap/keyring.asc": open(s.path("keyring.asc")).read(),
        "/etc/nodestrap/ca.pem": open(s.path("ca.pem")).read(),
        "/etc/kubernetes/installer/runtime-mappings.yaml": (
            'kind: VersionManifestV1\nversions:\n  k8s:\n    "%s":\n      containerd: ["2.0", "1.7"]\n' % minor(v)),
        "/etc/hostname": node + "\n",
        # kubeadm's preflight wants forwarding on; the node's own sysctl.d sets it at boot.
        "/etc/sysctl.d/90-kubernetes.conf": "net.ipv4.ip_forward = 1\n",
        "/etc/cni/net.d/10-nodestrap-qemu.conflist": conflist(node),
        # The journal on the disk within 10 s (journald's default: 5 min), for journal_tail after
        # a failed run, whose VMs are stopped, not shut down. Test image only.
        "/etc/systemd/journald.conf.d/90-nodestrap-qemu.conf": "[Journal]\nSyncIntervalSec=10s\n",
    }
    files = {
        "/etc/nodestrap/activate/node.crt": node + ".crt",
        "/etc/nodestrap/activate/node.key": node + ".key",
        "/etc/nodestrap/activate/admin-ca.crt": "admin-ca.crt",
        "/etc/nodestrap/activate/cluster-ca.crt": "cluster-ca.crt",
        "/etc/nodestrap/activate/init-secret.hash": "init-secret.hash",
        "/etc/nodestrap/activate.env": node + "-activate.env",
    }
    units = [os.path.join(TOP, "ignition/units/nodestrap-activate.service")]
    # What a fresh control-plane node needs, on both: the images kubeadm init runs come from the
    # staged extension (Debian's etcd under its own tag; no CoreDNS image: no pod network spans
    # the nodes for it to serve).
    args = ("--kubeadm /usr/bin/kubeadm --images %s --etcd-image-tag %s --skip-addons coredns"
            % (IMAGES_DIR, s.images["ETCD_IMAGE_TAG"]))
    if node == "node1":
        files.update({
            "/etc/kubernetes/pki/ca.crt": "cluster-ca.crt",
            "/etc/kubernetes/pki/ca.key": "cluster-ca.key",
            "/etc/nodestrap/join-service/tls.crt": "join-service.crt",
            "/etc/nodestrap/join-service/tls.key": "join-service.key",
            "/etc/nodestrap/join-service/node-ca.crt": "node-ca.crt",
            "/etc/nodestrap/join-service.env": "join-service.env",
        })
        units.append(os.path.join(ACTIVATE_DIR, "nodestrap-join-service.service"))
        with open(os.path.join(d, "join-service.env"), "w") as f:
            f.write("NODESTRAP_JOIN_SERVICE_ARGS=--api-server-endpoint %s:%d --cluster-name qemu "
                    "--kubernetes-version %s --kubeconfig /etc/kubernetes/admin.conf\n" % (GUEST_HOST, ports["api"], v))
        if sc.init_fails:
            for name, text in (("nodestrap-qemu-squat.socket", SQUAT_SOCKET), ("nodestrap-qemu-squat.service", SQUAT_SERVICE)):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
                units.append(os.path.join(d, name))
    else:
        args += " --join-endpoints https://%s:%d --join-interval 5" % (GUEST_HOST, ports["join"])
    with open(os.path.join(d, node + "-activate.env"), "w") as f:
        f.write("NODESTRAP_ACTIVATE_ARGS=%s\n" % args)
    argv = [os.path.join(TOP, "ignition/render"), "sysext"]
    for node_path, text in texts.items():
        local = os.path.join(d, node + "_" + node_path.strip("/").replace("/", "_"))
        with open(local, "w") as f:
            f.write(text)
        argv += ["--file", "%s=%s" % (node_path, local)]
    for node_path, local in files.items():
        argv += ["--file", "%s=%s" % (node_path, os.path.join(d, local))]
    for u in units:
        argv += ["--unit", u]
    config = json.loads(run(argv, stdout=subprocess.PIPE).stdout)
    # The patch stream and the boot check stay out: until it is activated the node runs no
    # kubelet the check could confirm (a boot check of a node that is not yet a member is not
    # what this scenario proves).
    config["systemd"]["units"] = [u for u in config["systemd"]["units"]
                                  if not u["name"].startswith(("nodestrap-patch.", "nodestrap-verify."))]
    for u in config["systemd"]["units"]:
        if u["name"] == "nodestrap-activate.service":
            u["dropins"] = [{"name": "qemu-run-left.conf", "contents": RUN_LEFT_DROPIN}]
    path = s.path("%s-%s.ign" % (sc.name, node))
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    run(["ignition-validate", path])
    return path


class Cluster:
    """Node 1's cluster as the admin sees it: kubectl (the build's) with the admin kubeconfig
    init-cluster wrote, its server the host's end of the port forward (the API server's
    certificate names 127.0.0.1 too: --apiserver-sans)."""

    def __init__(self, s, d, api_port):
        text = open(os.path.join(d, "admin.conf")).read()
        self.server = re.search(r"server: (\S+)", text).group(1)
        self.kubeconfig = os.path.join(d, "admin-host.conf")
        with open(self.kubeconfig, "w") as f:
            f.write(text.replace(self.server, "https://127.0.0.1:%d" % api_port))
        os.chmod(self.kubeconfig, 0o600)
        self.kubectl_bin = os.path.join(s.images["KUBE_BIN"], "kubectl")

    def get(self, *args):
        r = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, "--request-timeout=10s", "get"]
                           + list(args) + ["-o", "json"], capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def nodes(self):
        """{name: (ready, kubeletVersion, containerRuntimeVersion)}"""
        out = {}
        for n in (self.get("nodes") or {}).get("items", []):
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            info = n["status"].get("nodeInfo", {})
            out[n["metadata"]["name"]] = (ready, info.get("kubeletVersion"), info.get("containerRuntimeVersion"))
        return out

    def running(self):
        """{node: [namespace/pod Running on it]}"""
        out = {}
        for p in (self.get("pods", "-A") or {}).get("items", []):
            if p["status"].get("phase") == "Running" and p["spec"].get("nodeName"):
                out.setdefault(p["spec"]["nodeName"], []).append("%s/%s" % (p["metadata"]["namespace"],
                                                                          p["metadata"]["name"]))
        return out


def run_activate(s, sc, accel, boot_timeout):
    """Returns (ok, boots, None: no kubelet starts at a fixed point here, the figures are in
    sc.timings, problems)."""
    say("\n=== %s: %s" % (sc.name, sc.doc))
    w = world(s)
    url = w.publish(sc)
    d = s.path(sc.name)
    os.makedirs(d)
    activate_pki(d)
    secret = secrets.token_hex(16)
    with open(os.path.join(d, "secret"), "w") as f:
        f.write(secret + "\n")
    salt = secrets.token_hex(8)
    key = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt.encode(), 20000)
    with open(os.path.join(d, "init-secret.hash"), "w") as f:
        f.write("pbkdf2_sha256$20000$%s$%s\n" % (salt, base64.b64encode(key).decode()))
    ports = {"init": free_port(), "join": free_port(), "api": free_port()}
    configs = {n: activate_config(s, w, sc, d, n, ports, url) for n in ("node1", "node2")}
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0", "rd.emergency=poweroff",
            "systemd.show_status=1"]
    first = ["ignition.firstboot", "ignition.platform.id=qemu"]
    nets = {"node1": "user,id=n0,hostfwd=tcp:127.0.0.1:%d-:9000,hostfwd=tcp:127.0.0.1:%d-:9090,"
                     "hostfwd=tcp:127.0.0.1:%d-:6443" % (ports["init"], ports["join"], ports["api"]),
            "node2": "user,id=n0"}
    st = {"done": {}, "run_left": {}, "events": [], "problems": [], "admin": None, "asked": 0,
          "reset": None, "ready": {}, "running": {}, "cluster": None, "joins": 0}
    boots, disks, count, again = {}, {}, {}, set()
    t0 = time.time()
    # Five boots' worth (1,800 s under TCG): two images staged, the imports and kubeadm's init and
    # join took 505, 718 and 898 s in full runs here, a standalone run on a loaded machine missed
    # 1,080 s with both nodes activated and node 2 not yet Ready (kubeadm init alone took 146 s to
    # over 475 s), and the whole scenario runs about twice as long on a loaded host. A failed run
    # prints the end of each node's journal (journal_tail).
    deadline = min(time.time() + ACTIVATE_BOOTS * boot_timeout, DEADLINE)
    try:
        for n in ("node1", "node2"):
            disks[n] = s.path("%s-%s.qcow2" % (sc.name, n))
            run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", w.images["SYSEXT_NODE_IMAGE"], "-F", "raw", disks[n]])
            count[n] = 1
            boots[n] = Boot(s, 1, disks[n], configs[n], base + first, accel, s.path("%s-%s-boot1.log" % (sc.name, n)),
                            netdev=nets[n])
        while True:
            if finished(sc, st):
                # The cluster is checked while its nodes still run; the disks once they stopped.
                st["problems"] += (check_failed if sc.init_fails else check_cluster)(sc, st, d, w)
                break
            for n, b in list(boots.items()):
                exited = b.proc.poll() is not None
                rebooted = False
                for line in b.lines():
                    line = ANSI.sub("", line)
                    rebooted = rebooted or "reboot: Restarting system" in line
                    on_line(s, sc, d, ports, st, n, count[n], time.time() - t0, line)
                if exited:
                    if not rebooted and n not in again and died_before_userspace(b.log):
                        again.add(n)
                        again_after_early_death(b.log)
                        boots[n] = Boot(s, count[n], disks[n], configs[n], b.kargs, accel, b.log, netdev=nets[n])
                    elif rebooted and n == "node1" and sc.init_fails and count[n] == 1:
                        # The reboot activate asked for after the reset: the node boots again.
                        count[n] = 2
                        boots[n] = Boot(s, 2, disks[n], configs[n], base, accel,
                                        s.path("%s-%s-boot2.log" % (sc.name, n)), netdev=nets[n])
                    else:
                        st["problems"].append("%s stopped in boot %d (see %s)" % (n, count[n], b.log))
            if st["cluster"] is not None and time.time() - st["asked"] > 5:
                poll_cluster(st, time.time() - t0)
            if st["problems"]:
                break
            if time.time() > deadline:
                st["problems"].append("not done within %d s (%s): activated %r, Ready %r, pods on %r (see %s)"
                                      % (deadline - t0, "the run's deadline" if deadline == DEADLINE else "its limit",
                                         sorted(st["done"]), sorted(st["ready"]),
                                         sorted(st["running"]), d))
                break
            time.sleep(0.5)
    finally:
        for b in boots.values():
            b.kill()
        if st["admin"] and st["admin"].poll() is None:
            st["admin"].kill()
    p = st["problems"]
    if p:
        for n, disk in disks.items():
            try:
                tail = journal_tail(d, n, disk)
            except (OSError, subprocess.CalledProcessError) as e:
                tail = ["not read: %s" % e]  # the evidence must not hide the failure it explains
            for line in tail:
                say("  %s journal: %s" % (n, line[:220]))
    else:
        p += check_disks(sc, disks, d)
    sc.timings = {k: round(v, 1) for k, v in st.get("timings", {}).items()}
    # The table's columns (qemu/run): node 2's, the node that joined the cluster node 1 made.
    for col, k in (("kernel_to_node", "node2 VM start to Node Ready"), ("kernel_to_pod", "node2 VM start to a pod Running")):
        if k in sc.timings:
            sc.timings[col] = sc.timings[k]
    for k, v in sorted(sc.timings.items(), key=lambda kv: kv[1]):
        if not k.startswith("kernel_to_"):
            say("  %-40s %6.1f s" % (k, v))
    for x in p:
        say("  problem: " + x)
    return not p, sum(count.values()), None, p


def on_line(s, sc, d, ports, st, n, boot, now, line):
    """One console line of node N: the timeline, the admin's request once node 1 listens, the
    activations, what /run/nodestrap keeps, node 1's refusal after its reboot."""
    for rx, kind in TIMELINE:
        m = rx.search(line)
        if m:
            text = m.group(0) if kind == "systemd" else m.group(1) if m.groups() else m.group(0)
            st["events"].append((now, n, kind, text))
            if not QUIET:
                say("%7.1fs  %s  %-9s %s" % (now, n, kind, text[:150]))
            break
    timings = st.setdefault("timings", {})
    if "Started kubelet.service" in line or "Started kubelet" in line:
        timings.setdefault("%s VM start to kubelet first started" % n, now)
    m = DONE_RE.search(line)
    if m and n not in st["done"]:
        st["done"][n] = (now, m.groups())
        timings["%s VM start to activate done (%s)" % (n, m.group(2))] = now
    m = RUN_LEFT_RE.search(line)
    if m and n not in st["run_left"]:
        st["run_left"][n] = m.group(1)
    if n == "node2" and TICKET_ASK_RE.search(line):
        st["joins"] += 1
    m = NOT_FRESH_RE.search(line)
    if m and n == "node1" and boot == 2 and st["reset"] is None:
        st["reset"] = (now, m.groups())
        timings["node1 VM start to refusal after its reboot"] = now
    if n == "node1" and boot == 1 and st["admin"] is None and "init server listening on" in line:
        # The admin's side: the real client, through the port forward.
        st["admin"] = subprocess.Popen(
            [HOST_BIN, "init-cluster", "--endpoint", "https://127.0.0.1:%d" % ports["init"],
             "--server-name", "node1", "--cert", os.path.join(d, "admin.crt"),
             "--key", os.path.join(d, "admin.key"), "--ca", os.path.join(d, "node-ca.crt"),
             "--secret-file", os.path.join(d, "secret"), "--cluster-name", "qemu",
             "--kubernetes-version", s.images["KUBE_VERSION"],
             "--apiserver-sans", "%s,127.0.0.1,api.qemu.test" % GUEST_HOST,
             "--control-plane-endpoint", "%s:%d" % (GUEST_HOST, ports["api"]),
             "--out", os.path.join(d, "admin.conf"), "--wait", "60", "--timeout", "900"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        st["admin_sent"] = now
        timings["node1 VM start to init request sent"] = now
        say("%7.1fs  host   harness   nodestrap init-cluster --endpoint https://127.0.0.1:%d" % (now, ports["init"]))
    a = st["admin"]
    if a is not None and "admin_rc" not in st and a.poll() is not None:
        st["admin_out"] = a.communicate()[0]
        st["admin_rc"] = a.returncode
        timings["init request sent to its answer"] = now - st["admin_sent"]
        for l in st["admin_out"].splitlines():
            say("           host   init-cluster %s" % l)
        if a.returncode == 0 and not sc.init_fails:
            st["cluster"] = Cluster(s, d, ports["api"])


def poll_cluster(st, now):
    """Every 5 s once node 1 is initialized: which Nodes are Ready, where pods run."""
    st["asked"] = time.time()
    c = st["cluster"]
    for name, (ready, kubelet, runtime) in c.nodes().items():
        if ready and name not in st["ready"]:
            st["ready"][name] = (now, kubelet, runtime)
            st["timings"]["%s VM start to Node Ready" % name] = now
            say("%7.1fs  %s  cluster   Node Ready: kubelet %s, %s" % (now, name, kubelet, runtime))
    for name, pods in c.running().items():
        if name not in st["running"]:
            st["running"][name] = (now, pods)
            st["timings"]["%s VM start to a pod Running" % name] = now
            say("%7.1fs  %s  cluster   Running: %s" % (now, name, ", ".join(pods)))


def finished(sc, st):
    if sc.init_fails:
        # Node 1 refused to activate again after its reboot, the admin has its answer, and node 2
        # kept asking for a ticket (it waits) for at least two rounds meanwhile.
        return st["reset"] is not None and "admin_rc" in st and st["joins"] >= 2
    return (len(st["done"]) == 2 and len(st["run_left"]) == 2 and "admin_rc" in st
            and len(st["ready"]) == 2 and all(n in st["running"] for n in ("node1", "node2")))


def check_cluster(sc, st, d, w):
    """What the admin got, what each node did, and the cluster as node 1's API server reports it:
    both Nodes Ready with the kubelet and runtime they staged, pods Running on each, the join
    service's record of node 2's identity, kubeadm's stored configuration."""
    p = []
    v = w.release[CURRENT]
    if st["admin_rc"] != 0:
        return ["init-cluster exited %d" % st["admin_rc"]]
    roles = {n: x[1] for n, x in st["done"].items()}
    if roles != {"node1": ("control-plane", "init", "qemu"), "node2": ("worker", "join", "qemu")}:
        p.append("activations: %r" % roles)
    for n, listed in sorted(st["run_left"].items()):
        # What stays is activate's own status record and the bootstrap's (docs/status.md); the
        # kubeadm configurations, the join one with its token, are gone.
        names = listed.split()
        if set(names) - {"status-activate.json", "status.json"} or "status-activate.json" not in names:
            p.append("%s: /run/nodestrap after activate holds %r" % (n, names))
    c = st["cluster"]
    want = (True, v, "containerd://" + w.containerd)
    nodes = c.nodes()
    for n in ("node1", "node2"):
        if nodes.get(n) != want:
            p.append("Node %s: (Ready, kubelet, runtime) %r, not %r" % (n, nodes.get(n), want))
    pods = c.running()
    for n, prefixes in (("node1", ("kube-system/kube-apiserver-node1", "kube-system/etcd-node1", "kube-system/kube-proxy-")),
                        ("node2", ("kube-system/kube-proxy-",))):
        for prefix in prefixes:
            if not any(x.startswith(prefix) for x in pods.get(n, [])):
                p.append("no pod %s* Running on %s: %r" % (prefix, n, pods.get(n)))
    ledger = (c.get("configmaps", "-n", "nodestrap-join", "-l", "app.kubernetes.io/managed-by=nodestrap-join-service")
              or {}).get("items", [])
    identity = spki_hash(os.path.join(d, "node2.crt"))
    records = [(x["metadata"]["name"], x.get("data", {})) for x in ledger]
    if len(records) != 1 or records[0][0] != "ticket-" + identity.split(":", 1)[1] or \
            (records[0][1].get("node"), records[0][1].get("role"), records[0][1].get("state"),
             records[0][1].get("identity")) != ("node2", "worker", "kept", identity):
        p.append("the join service's records in the cluster: %r" % records)
    cfg = ((c.get("configmap", "-n", "kube-system", "kubeadm-config") or {}).get("data") or {}).get("ClusterConfiguration", "")
    for line in ("clusterName: qemu", "kubernetesVersion: %s" % v, "controlPlaneEndpoint: %s" % c.server.split("//")[1],
                 "- api.qemu.test"):
        if line not in cfg:
            p.append("kubeadm's stored ClusterConfiguration lacks %r" % line)
    # The bootstrap tokens the join service had kubeadm make: never on a console.
    secrets_ = (c.get("secrets", "-n", "kube-system", "--field-selector", "type=bootstrap.kubernetes.io/token")
                or {}).get("items", [])
    tokens = ["%s.%s" % (base64.b64decode(x["data"]["token-id"]).decode(), base64.b64decode(x["data"]["token-secret"]).decode())
              for x in secrets_]
    if not tokens:
        p.append("no bootstrap token in the cluster: node 2's ticket carried none")
    for log in sorted(f for f in os.listdir(os.path.dirname(d)) if f.startswith(sc.name) and f.endswith(".log")):
        text = open(os.path.join(os.path.dirname(d), log), errors="replace").read()
        if any(t in text for t in tokens):
            p.append("%s shows a bootstrap token" % log)
    sc.proof = list(nodes.get("node2", ())[1:])
    return p


def check_failed(sc, st, d, w):
    """kubeadm init failed on node 1 past the lock: the admin got kubeadm's reason, node 1 was
    reset and, after its reboot, refuses to activate again; node 2 still waits for a ticket."""
    p = []
    if st["admin_rc"] == 0 or "6443" not in st["admin_out"]:
        p.append("init-cluster exited %d; its output does not name the port taken: %s" % (st["admin_rc"], st["admin_out"][-400:]))
    if st["reset"][1] != ("reset", "control-plane", "qemu"):
        p.append("node 1 after its reboot: %r" % (st["reset"][1],))
    if st["done"]:
        p.append("activations: %r" % {n: x[1] for n, x in st["done"].items()})
    return p


def journal_tail(d, n, disk, lines=40):
    """A failed run's evidence (the console shows nodestrap's lines only): the last LINES that
    nodestrap, the kubelet and containerd wrote to node N's journal (without the kubelet's ten a
    second about mirror pods before its API server answers), read from its disk by the host's
    journalctl. The whole journal stays in D, the work dir a failed run keeps."""
    out = os.path.join(d, n + "-journal")
    os.makedirs(out, exist_ok=True)
    with disk_copy(disk) as (raw, _):
        subprocess.run(["debugfs", "-R", "rdump /var/log/journal " + out, raw], capture_output=True)
    files = glob.glob(os.path.join(out, "**", "*.journal"), recursive=True)
    if not files:
        return ["no journal in /var/log/journal on %s" % disk]
    r = subprocess.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-u", "nodestrap-activate.service",
                        "-u", "kubelet.service", "-u", "containerd.service"] + ["--file=" + f for f in files],
                       capture_output=True, text=True)
    kept = [line for line in r.stdout.splitlines() if "mirror pod" not in line]
    return kept[-lines:] or ["journalctl: exit %d: %s" % (r.returncode, r.stderr.strip()[:200])]


def check_disks(sc, disks, d):
    """The node state each node keeps (docs/activate.md) and no temp file left beside it."""
    p = []
    want = {"node1": ("reset", "control-plane", "qemu"), "node2": None} if sc.init_fails else \
        {"node1": ("done", "control-plane", "qemu"), "node2": ("done", "worker", "qemu")}
    for n, disk in disks.items():
        raw = disk + ".raw"
        run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
        try:
            subprocess.run(["e2fsck", "-fy", raw], capture_output=True)
            text = (disk_file(raw, "/var/lib/nodestrap/node-state.json") or b"").decode()
            left = [x for x in disk_ls(raw, "/var/lib/nodestrap") if ".nodestrap-" in x]
        finally:
            os.unlink(raw)
        if left:
            p.append("%s: temp files left: %r" % (n, left))
        try:
            got = json.loads(text) if text else None
        except ValueError:
            got = {"unreadable": text}
        have = (got.get("state"), got.get("role"), got.get("cluster")) if got else None
        if have != want[n]:
            p.append("%s's node state: %r, not %r" % (n, got, want[n]))
    return p


SCENARIOS = [
    Act("activate", "two fresh sysext nodes stage the current release with the control plane's images; "
        "the admin's init request makes node 1 run the real kubeadm init, node 2 joins with a ticket from "
        "its join service (the real kubeadm join); both Nodes Ready, pods Running on each", init_fails=False),
    Act("activate-init-fails", "as activate, with node 1's API server port taken: kubeadm init fails past "
        "the lock, node 1's state goes to reset, the admin gets kubeadm's reason, node 1 reboots and refuses to "
        "activate again; node 2 keeps asking for a ticket", init_fails=True),
]
