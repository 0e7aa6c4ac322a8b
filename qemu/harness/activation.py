"""The activation family: two fresh nodes, one initialized by the admin through init-cluster,
the other joining with a ticket from the first one's join service."""
import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import time

from harness.common import (
    ANSI, DEADLINE, GUEST_HOST, HERE, QUIET, Scenario, TIMELINE, TOP, disk_file, disk_ls,
    free_port, run, say,
)
from harness.vm import Boot


# ---------------------------------------------------------------------------------------------
# Scenario `activate`: two fresh nodes at once. Node 1 is initialized by the harness as the admin
# (nodestrap init-cluster through a port forward to its init server); once done it serves join
# tickets, and node 2 joins with one, reaching node 1's join service through the host. Both run
# the stand-in kubeadm (qemu/guest/activate/kubeadm).

ACTIVATE_DIR = os.path.join(HERE, "guest", "activate")
# The binary the images carry (qemu/build's default too), run here as the admin's client.
HOST_BIN = os.environ.get("NODESTRAP_BIN") or os.path.join(TOP, "target/x86_64-unknown-linux-musl/release/nodestrap")
DONE_RE = re.compile(r"nodestrap: activate done role=(\S+) via=(\S+) cluster=(\S+)")
# /run is a tmpfs, gone with the VM: what /run/nodestrap holds once activate has finished (the
# kubeadm configs, the join one with the token, must be gone; its status record stays) is said
# on the console instead.
RUN_LEFT_RE = re.compile(r"nodestrap-qemu: /run/nodestrap after activate: \[(.*)\]")
RUN_LEFT_DROPIN = ("[Service]\nExecStartPost=/bin/sh -c 'echo nodestrap-qemu: /run/nodestrap after activate: "
                   "[$$(ls -A /run/nodestrap)]'\n")


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
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
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


def activate_config(s, d, node, join_port, token):
    """Node NAME's Ignition config: identity, CAs, init secret hash, options, the stand-in kubeadm,
    nodestrap-activate.service (and on node 1 the join service); no torcx bootstrap units."""
    files = {
        "/etc/nodestrap/activate/node.crt": node + ".crt",
        "/etc/nodestrap/activate/node.key": node + ".key",
        "/etc/nodestrap/activate/admin-ca.crt": "admin-ca.crt",
        "/etc/nodestrap/activate/cluster-ca.crt": "cluster-ca.crt",
        "/etc/nodestrap/activate/init-secret.hash": "init-secret.hash",
        "/etc/nodestrap/activate.env": node + "-activate.env",
    }
    units = [os.path.join(TOP, "ignition/units/nodestrap-activate.service")]
    if node == "node1":
        args = "--kubeadm /opt/bin/kubeadm"
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
            f.write("NODESTRAP_JOIN_SERVICE_ARGS=--ledger file --api-server-endpoint %s:6443 --cluster-name qemu "
                    "--kubernetes-version v1.31.2\nNODESTRAP_QEMU_TOKEN=%s\n" % (GUEST_HOST, token))
    else:
        args = "--kubeadm /opt/bin/kubeadm --join-endpoints https://%s:%d --join-interval 5" % (GUEST_HOST, join_port)
    with open(os.path.join(d, node + "-activate.env"), "w") as f:
        f.write("NODESTRAP_ACTIVATE_ARGS=%s\n" % args)
    argv = [os.path.join(TOP, "ignition/render"), "worker",
            "--file", "/opt/bin/kubeadm=%s:0755" % os.path.join(ACTIVATE_DIR, "kubeadm")]
    for node_path, local in files.items():
        argv += ["--file", "%s=%s" % (node_path, os.path.join(d, local))]
    for u in units:
        argv += ["--unit", u]
    config = json.loads(run(argv, stdout=subprocess.PIPE).stdout)
    ours = [os.path.basename(u) for u in units]
    config["systemd"]["units"] = [u for u in config["systemd"]["units"] if u["name"] in ours]
    for u in config["systemd"]["units"]:
        if u["name"] == "nodestrap-activate.service":
            u["dropins"] = [{"name": "qemu-run-left.conf", "contents": RUN_LEFT_DROPIN}]
    path = s.path("activate-%s.ign" % node)
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    run(["ignition-validate", path])
    return path


def run_activate(s, sc, accel, boot_timeout):
    """Returns (ok, boots, seconds until node 2 joined, problems)."""
    say("\n=== %s: %s" % (sc.name, sc.doc))
    d = s.path("activate")
    os.makedirs(d)
    activate_pki(d)
    secret = secrets.token_hex(16)
    with open(os.path.join(d, "secret"), "w") as f:
        f.write(secret + "\n")
    salt = secrets.token_hex(8)
    key = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt.encode(), 20000)
    with open(os.path.join(d, "init-secret.hash"), "w") as f:
        f.write("pbkdf2_sha256$20000$%s$%s\n" % (salt, base64.b64encode(key).decode()))
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    token = "".join(secrets.choice(alphabet) for _ in range(6)) + "." + "".join(secrets.choice(alphabet) for _ in range(16))
    init_port, join_port = free_port(), free_port()
    configs = {n: activate_config(s, d, n, join_port, token) for n in ("node1", "node2")}
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0", "rd.emergency=poweroff",
            "systemd.show_status=1", "rd.nodestrap=0", "ignition.firstboot", "ignition.platform.id=qemu"]
    nets = {"node1": "user,id=n0,hostfwd=tcp:127.0.0.1:%d-:9000,hostfwd=tcp:127.0.0.1:%d-:9090" % (init_port, join_port),
            "node2": "user,id=n0"}
    boots, disks, done, run_left, events, problems = {}, {}, {}, {}, [], []
    admin = None
    t0 = time.time()
    deadline = min(time.time() + 2 * boot_timeout, DEADLINE)
    try:
        for n in ("node1", "node2"):
            disks[n] = s.path("activate-%s.qcow2" % n)
            run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", s.images["NODE_IMAGE"], "-F", "raw", disks[n]])
            boots[n] = Boot(s, 1, disks[n], configs[n], base, accel, s.path("activate-%s.log" % n), netdev=nets[n])
        while len(done) < 2 or len(run_left) < 2 or (admin and admin.poll() is None):
            for n, b in boots.items():
                for line in b.lines():
                    line = ANSI.sub("", line)
                    now = time.time() - t0
                    for rx, kind in TIMELINE:
                        m = rx.search(line)
                        if m:
                            text = m.group(0) if kind == "systemd" else m.group(1) if m.groups() else m.group(0)
                            events.append((now, n, kind, text))
                            if not QUIET:
                                say("%7.1fs  %s  %-9s %s" % (now, n, kind, text[:150]))
                            break
                    if token in line:
                        problems.append("%s's console shows the bootstrap token: %s" % (n, line[:200]))
                    m = DONE_RE.search(line)
                    if m and n not in done:
                        done[n] = (now, m.groups())
                    m = RUN_LEFT_RE.search(line)
                    if m and n not in run_left:
                        run_left[n] = m.group(1)
                    if n == "node1" and admin is None and "init server listening on" in line:
                        # The admin's side: the real client, through the port forward.
                        admin = subprocess.Popen(
                            [HOST_BIN, "init-cluster", "--endpoint", "https://127.0.0.1:%d" % init_port,
                             "--server-name", "node1", "--cert", os.path.join(d, "admin.crt"),
                             "--key", os.path.join(d, "admin.key"), "--ca", os.path.join(d, "node-ca.crt"),
                             "--secret-file", os.path.join(d, "secret"), "--cluster-name", "qemu",
                             "--kubernetes-version", "v1.31.2", "--apiserver-sans", "10.0.2.15,api.qemu.test",
                             "--out", os.path.join(d, "admin.conf"), "--wait", "60", "--timeout", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                        events.append((now, "host", "harness", "init-cluster sent"))
                        say("%7.1fs  host   harness   nodestrap init-cluster --endpoint https://127.0.0.1:%d" % (now, init_port))
                if b.proc.poll() is not None:
                    problems.append("%s stopped (see %s)" % (n, b.log))
            if problems:
                break
            if time.time() > deadline:
                problems.append("not activated within %d s: done %r, /run/nodestrap listed %r (see %s)"
                                % (2 * boot_timeout, sorted(done), sorted(run_left), d))
                break
            time.sleep(0.5)
    finally:
        for b in boots.values():
            b.kill()
        if admin and admin.poll() is None:
            admin.kill()
    if admin is None:
        problems.append("node 1's init server never listened")
    elif not problems:
        out = admin.communicate()[0]
        for l in out.splitlines():
            say("           host   init-cluster %s" % l)
        if admin.returncode != 0:
            problems.append("init-cluster exited %d" % admin.returncode)
        elif "qemu-standin" not in open(os.path.join(d, "admin.conf")).read():
            problems.append("the admin kubeconfig is not the one node 1's kubeadm wrote")
    if not problems:
        if done["node1"][1] != ("control-plane", "init", "qemu") or done["node2"][1] != ("worker", "join", "qemu"):
            problems.append("activations: %r" % {n: v[1] for n, v in done.items()})
        for n, listed in sorted(run_left.items()):
            # What stays is activate's own status record (docs/status.md); nothing else.
            names = listed.split()
            left = [f for f in names if f != "status-activate.json"]
            if left:
                problems.append("%s: /run/nodestrap still holds %r after activate" % (n, left))
            if "status-activate.json" not in names:
                problems.append("%s: no status record of activate in /run/nodestrap" % n)
        problems += check_activate(disks, d, token)
    for p in problems:
        say("  problem: " + p)
    joined = done.get("node2", (None,))[0]
    return not problems, len(boots), joined, problems


def check_activate(disks, d, token):
    """The disks: each node's state marker, the stand-in kubeadm's record, the ticket record."""
    p = []
    ca_hash = spki_hash(os.path.join(d, "cluster-ca.crt"))
    files = {}
    for n, disk in disks.items():
        raw = disk + ".raw"
        run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
        try:
            subprocess.run(["e2fsck", "-fy", raw], capture_output=True)
            for f in ("/var/lib/nodestrap/node-state.json", "/var/log/kubeadm-standin/calls",
                      "/var/log/kubeadm-standin/config-calls",
                      "/var/log/kubeadm-standin/init-config.yaml", "/var/log/kubeadm-standin/join-config.yaml",
                      "/var/lib/nodestrap/join-service/issued.json"):
                files[n, f] = (disk_file(raw, f) or b"").decode()
            # (/run/nodestrap is a tmpfs, not on the disk: checked from the console instead.)
            left = [x for x in disk_ls(raw, "/var/lib/nodestrap") if ".nodestrap-" in x]
            if left:
                p.append("%s: temp files left: %r" % (n, left))
        finally:
            os.unlink(raw)
    for n, role in (("node1", "control-plane"), ("node2", "worker")):
        try:
            st = json.loads(files[n, "/var/lib/nodestrap/node-state.json"])
        except ValueError:
            st = {}
        if (st.get("state"), st.get("role"), st.get("cluster")) != ("done", role, "qemu"):
            p.append("%s's node state: %r" % (n, st))
    calls1 = files["node1", "/var/log/kubeadm-standin/calls"].splitlines()
    calls2 = files["node2", "/var/log/kubeadm-standin/calls"].splitlines()
    if [c.split()[0] for c in calls1] != ["init", "token"] or "--skip-token-print" not in calls1[0]:
        p.append("node 1's kubeadm calls: %r" % calls1)
    asked = files["node1", "/var/log/kubeadm-standin/config-calls"].splitlines()
    if asked != ["config validate --config /run/nodestrap/kubeadm-init.yaml"]:
        p.append("node 1's kubeadm config questions before init: %r" % asked)
    if calls2 != ["join --config /run/nodestrap/kubeadm-join.yaml"]:
        p.append("node 2's kubeadm calls: %r" % calls2)
    init_cfg = files["node1", "/var/log/kubeadm-standin/init-config.yaml"]
    for want in ('clusterName: "qemu"', 'kubernetesVersion: "v1.31.2"', '- "api.qemu.test"'):
        if want not in init_cfg:
            p.append("node 1's kubeadm init config lacks %s" % want)
    join_cfg = files["node2", "/var/log/kubeadm-standin/join-config.yaml"]
    for want in ('token: "%s"' % token, '- "%s"' % ca_hash, 'apiServerEndpoint: "%s:6443"' % GUEST_HOST):
        if want not in join_cfg:
            p.append("node 2's kubeadm join config lacks %s" % want)
    try:
        issued = json.loads(files["node1", "/var/lib/nodestrap/join-service/issued.json"])["issued"]
    except (ValueError, KeyError):
        issued = {}
    if [(v.get("node"), v.get("role")) for v in issued.values()] != [("node2", "worker")]:
        p.append("node 1's join service record: %r" % issued)
    elif list(issued) != [spki_hash(os.path.join(d, "node2.crt"))]:
        p.append("the ticket record is not keyed by node 2's public key hash: %r" % list(issued))
    return p


SCENARIO = Scenario(
    "activate", "two fresh nodes: one initialized by an admin's init request, the other joins through its join service",
    initrd=False, boots=2, tag=None, os_after=None, runner=run_activate)
