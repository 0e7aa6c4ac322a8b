"""The sysext family: a Debian 13 node (systemd 257) whose real systemd-sysext merges what
nodestrap staged. The containerd extension carries Debian 13's real containerd and runc; the
kubernetes extension carries Debian 13's real kubectl and a kubelet STAND-IN (Debian packages no
kubelet) that reports its version and runs `ctr version` against the merged containerd. The
images, their signed SHA256SUMS and a stand-in API server (its /version) are served from the
host. qemu/build-sysext builds the node image and the extension images."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

from harness.common import *  # noqa: F401,F403
from harness.vm import boot_until

CLUSTER = "v1.32.4"
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
FAIL_RE = re.compile(r"nodestrap\[\d+\]: (?:<3>)?(?:error: )?(.*(?:refused|signature check|out of date).*)")
REPORT_RE = re.compile(r"nodestrap-qemu: after bootstrap \((\S+)\): (.*)")


class Sx:
    """One sysext scenario: which path bootstraps (initramfs or first-boot unit), the cluster's
    version, what the mirror serves, what the disk holds before the boot, Ignition links."""

    def __init__(self, name, doc, initrd, mirror="good", cluster=CLUSTER, preseed=(), links=(),
                 expect_kube="v1.32.3", expect_runtime="v1.7", fails=None):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.boots = 1
        self.runner = lambda *a: run_sysext(*a)  # defined below


SCENARIOS = [
    Sx("sysext-initrd", "initramfs stages kubernetes + containerd; the real root's systemd-sysext "
       "merges them at boot; kubelet in the first boot, no reboot", initrd=True),
    Sx("sysext-firstboot", "the first-boot unit stages, refreshes live, reloads systemd, proves the "
       "merge; kubelet in the same boot", initrd=False),
    Sx("sysext-tampered", "SHA256SUMS changed after signing: refused, nothing staged, no kubelet",
       initrd=False, mirror="tampered", fails="signature check against keyring"),
    Sx("sysext-expired", "a signed SHA256SUMS past its BEST-BEFORE date: refused naming the date",
       initrd=False, mirror="expired", fails="out of date: its BEST-BEFORE-2021-06-30 marker passed"),
    Sx("sysext-mismatch", "the 1.32 image is for another OS: refused with systemd-sysext's reason; "
       "the previous v1.31.9 stays linked and merged", initrd=False, mirror="mismatch",
       preseed=(("kubernetes", "v1.31.9"),),
       fails="extension 'kubernetes' is for OS 'fedora', but deployed on top of 'debian'"),
    Sx("sysext-optout", "the user linked containerd.raw to /dev/null (Ignition links): containerd "
       "is not staged, kubernetes is", initrd=True, links=(("/etc/extensions/containerd.raw", "/dev/null"),),
       expect_runtime=None),
    Sx("sysext-upgrade", "node merged v1.31.9, the cluster is now 1.32: v1.32.3 staged beside it, "
       "link switched, refreshed live", initrd=False, preseed=(("kubernetes", "v1.31.9"),)),
]


class World:
    """Built once per run: the images (qemu/build-sysext), the mirror and its server."""

    def __init__(self, s):
        self.s = s
        kernel = s.images["KERNEL"]
        kver = os.path.basename(kernel).split("vmlinuz-", 1)[1]
        kdir = os.path.dirname(os.path.dirname(os.path.dirname(kernel)))
        out = run(["bash", os.path.join(HERE, "build-sysext"), kdir, kver], stdout=subprocess.PIPE).stdout
        self.images = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
        self.ext = self.images["SYSEXT_IMAGES"]
        self.containerd = self.images["CONTAINERD_VERSION"]
        self.www = s.path("sysext-www")
        os.makedirs(self.www)
        self.version_file = s.path("sysext-api-version")
        with open(self.version_file, "w") as f:
            f.write(CLUSTER)
        with open(s.path("sysext-configmaps.json"), "w") as f:
            f.write("{}")
        self.server = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "server.py"), "--www", self.www,
             "--cert", s.path("srv.pem"), "--key", s.path("srv.key"), "--token", s.path("token"),
             "--git-version", "@" + self.version_file, "--configmaps", s.path("sysext-configmaps.json"),
             "--log", s.path("sysext-server.log")], stdout=subprocess.PIPE, text=True)
        ready = self.server.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise SystemExit("qemu/run: the sysext servers did not start")
        self.port, self.api_port = int(ready[1]), int(ready[2])

    def stop(self):
        self.server.terminate()
        self.server.wait()

    def image(self, name, label):
        if name == "containerd":
            return os.path.join(self.ext, "containerd-v%s-x86-64.raw" % self.containerd)
        return os.path.join(self.ext, "kubernetes-%s-x86-64.raw" % label)

    def publish(self, sc):
        """The scenario's own mirror directory: images, SHA256SUMS and its binary signature."""
        offer = {"kubernetes": [("kubernetes-%s-x86-64.raw" % v, self.image("kubernetes", v))
                                for v in ("v1.31.9", "v1.32.1", "v1.32.3")],
                 "containerd": [("containerd-v%s-x86-64.raw" % self.containerd, self.image("containerd", None))]}
        if sc.mirror == "mismatch":
            offer["kubernetes"][-1] = ("kubernetes-v1.32.3-x86-64.raw", os.path.join(self.ext, "kubernetes-fedora.raw"))
        for name, files in offer.items():
            d = os.path.join(self.www, sc.name, name)
            os.makedirs(d)
            lines = []
            for fname, src in files:
                os.link(src, os.path.join(d, fname))
                lines.append("%s  %s\n" % (hashlib.sha256(open(src, "rb").read()).hexdigest(), fname))
            lines.append("%s  BEST-BEFORE-%s\n" % (EMPTY_SHA, "2021-06-30" if sc.mirror == "expired" else "2099-12-31"))
            sums = os.path.join(d, "SHA256SUMS")
            with open(sums, "w") as f:
                f.writelines(lines)
            run(["gpg", "--batch", "--yes", "--detach-sign", "-o", sums + ".gpg", sums])
            if sc.mirror == "tampered" and name == "kubernetes":
                with open(sums, "a") as f:
                    f.write("%s  kubernetes-v1.32.9-x86-64.raw\n" % EMPTY_SHA)
        return "https://%s:%d/%s/${NAME}" % (GUEST_HOST, self.port, sc.name)

    def node_files(self, sc, url):
        s = self.s
        d = s.path(sc.name + "-files")
        os.makedirs(d)
        import base64
        ca_b64 = base64.b64encode(open(s.path("ca.pem"), "rb").read()).decode()
        files = {
            "/etc/nodestrap/bootstrap.conf": (
                "# nodestrap bootstrap settings (same keys as its options)\n"
                "payload=sysext\nsysext-url=%s\nkeyring=/etc/nodestrap/keyring.asc\n"
                "ca-file=/etc/nodestrap/ca.pem\napi-tries=2\napi-retry-delay=2\nfetch-attempts=3\n" % url),
            "/etc/nodestrap/keyring.asc": open(s.path("keyring.asc")).read(),
            "/etc/nodestrap/ca.pem": open(s.path("ca.pem")).read(),
            "/etc/kubernetes/kubeconfig": (
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
                "    server: https://%s:%d\n    certificate-authority-data: %s\n"
                "users:\n- name: kubelet\n  user:\n    token: %s\n"
                "contexts:\n- name: default\n  context:\n    cluster: local\n    user: kubelet\n"
                "current-context: default\n" % (GUEST_HOST, self.api_port, ca_b64, s.token)),
            "/etc/kubernetes/installer/runtime-mappings.yaml": (
                'kind: VersionManifestV1\nversions:\n  k8s:\n    "1.31":\n      containerd: ["1.7"]\n'
                '    "1.32":\n      containerd: ["2.0", "1.7"]\n'),
        }
        args = []
        for node_path, text in files.items():
            local = os.path.join(d, node_path.strip("/").replace("/", "_"))
            with open(local, "w") as f:
                f.write(text)
            args += ["--file", "%s=%s" % (node_path, local)]
        for node_path, target in sc.links:
            args += ["--link", "%s=%s" % (node_path, target)]
        return args

    def disk(self, sc):
        """A copy-on-write overlay of the node image; with `preseed`, over a copy that already
        holds those images and links, as an earlier bootstrap left them."""
        base = self.images["SYSEXT_NODE_IMAGE"]
        if sc.preseed:
            raw = self.s.path(sc.name + "-base.raw")
            run(["cp", "--sparse=always", base, raw])
            cmds = []
            for name, label in sc.preseed + (("containerd", None),):
                fname = os.path.basename(self.image(name, label))
                cmds += ["mkdir /opt/extensions/%s" % name,
                         "write %s /opt/extensions/%s/%s" % (self.image(name, label), name, fname),
                         "symlink /etc/extensions/%s.raw /opt/extensions/%s/%s" % (name, name, fname)]
            r = subprocess.run(["debugfs", "-w", "-f", "-", raw], input="\n".join(cmds) + "\n",
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit("debugfs: %s" % r.stderr)
            base = raw
        disk = self.s.path(sc.name + ".qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", disk])
        return disk


WORLD = {}


def run_sysext(s, sc, accel, boot_timeout):
    say("\n=== %s: %s" % (sc.name, sc.doc))
    if "w" not in WORLD:
        WORLD["w"] = World(s)
        s.on_stop.append(WORLD["w"].stop)
    w = WORLD["w"]
    with open(w.version_file, "w") as f:
        f.write(sc.cluster)
    url = w.publish(sc)
    config = s.path(sc.name + ".ign")
    with open(config, "w") as f:
        run([os.path.join(TOP, "ignition/render"), "sysext"] + w.node_files(sc, url), stdout=f)
    run(["ignition-validate", config])
    disk = w.disk(sc)
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1"]
    if not sc.initrd:
        base.append("rd.nodestrap=0")
    if os.environ.get("NODESTRAP_QEMU_DEBUG") == "1":
        base.append("systemd.journald.forward_to_console=1")
    events, kubelet, failures, reports = [], [], [], []
    t0 = time.time()

    def on_line(now, boots, line):
        m = KUBELET_RE.search(line)
        if m and not kubelet:
            kubelet.append((now, m.group(1)))
        m = FAIL_RE.search(line)
        if m:
            failures.append(m.group(1))
        m = REPORT_RE.search(line)
        if m:
            reports.append(m.groups())

    def done(boots):
        if sc.fails:
            return len(reports) >= 2  # the unit failed, reported, retried and failed again
        return bool(kubelet)

    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events,
                                      on_line, done, "the kubelet" if not sc.fails else "two failed attempts",
                                      "no kubelet" if not sc.fails else "no second failed attempt")
    if not problems:
        problems = check(w, sc, events, kubelet, failures, reports, disk)
    sc.timings = timings(events, kubelet[0][0] if kubelet else None)
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, kubelet[0][0] if kubelet else None, problems


def check(w, sc, events, kubelet, failures, reports, disk):
    p = []
    texts = [(b, k, t) for _, b, k, t in events]
    said = [t for _, k, t in texts if k == "nodestrap"]
    if sc.fails:
        if not any(sc.fails in f for f in failures):
            p.append("no failure naming %r (saw %r)" % (sc.fails, failures[:3]))
        if kubelet:
            p.append("the kubelet started although bootstrap failed: %s" % kubelet[0][1])
        for result, rest in reports:
            if result == "success":
                p.append("a bootstrap attempt succeeded: %s" % rest)
    else:
        summary = [t for t in said if "nodestrap: sysext done" in t]
        activation = "staged" if sc.initrd else "merged"
        want = "kubernetes=%s %s activation=%s" % (
            sc.expect_kube, "containerd=masked" if sc.expect_runtime is None else "containerd=v" + w.containerd,
            activation)
        if not any(want in t for t in summary):
            p.append("no summary with %r (saw %r)" % (want, summary))
        fields = dict(re.findall(r"(\S+?)=(\S*)", kubelet[0][1])) if kubelet else {}
        if fields.get("version") != sc.expect_kube or fields.get("KUBELET_VERSION") != sc.expect_kube:
            p.append("kubelet started as %r" % (kubelet[0][1] if kubelet else None))
        if sc.expect_runtime is None:
            if fields.get("ctr-server") != "none":
                p.append("containerd merged although the user opted out: %r" % fields.get("ctr-server"))
        elif not fields.get("ctr-server", "").startswith(w.containerd):
            p.append("ctr version against the merged containerd: %r, expected %s" % (fields.get("ctr-server"), w.containerd))
        if not fields.get("kubectl", "").startswith("v1.32"):
            p.append("kubectl from the extension: %r" % fields.get("kubectl"))
        if sc.initrd and not any("activation=staged" in t for b, k, t in texts if k == "nodestrap" and b == 1):
            p.append("the initramfs did not stage")
    # The disk the node left behind.
    raw = disk + ".raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        subprocess.run(["e2fsck", "-fy", raw], capture_output=True)
        link = lambda n: subprocess.run(["debugfs", "-R", "stat /etc/extensions/%s.raw" % n, raw],
                                        capture_output=True, text=True).stdout
        store = disk_ls(raw, "/opt/extensions/kubernetes")
        env = disk_file(raw, "/etc/kubernetes/kubelet.env")
        if sc.fails:
            want_store = ["kubernetes-v1.31.9-x86-64.raw"] if sc.preseed else []
            if store != want_store:
                p.append("/opt/extensions/kubernetes holds %r, expected %r" % (store, want_store))
            if env is not None:
                p.append("kubelet.env exists after a failed bootstrap")
            if sc.preseed and "kubernetes-v1.31.9-x86-64.raw" not in link("kubernetes"):
                p.append("the kubernetes link no longer names v1.31.9")
            if sc.preseed and not any("link=/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw"
                                      " kubelet=Kubernetes_v1.31.9" in r[1] and '"kubernetes"' in r[1]
                                      for r in reports):
                p.append("after the refusal, v1.31.9 is not reported merged: %r" % reports[-1:])
        else:
            want = ["kubernetes-%s-x86-64.raw" % sc.expect_kube]
            if sc.preseed:
                want = sorted(want + ["kubernetes-v1.31.9-x86-64.raw"])
            if store != want:
                p.append("/opt/extensions/kubernetes holds %r, expected %r" % (store, want))
            if "kubernetes-%s-x86-64.raw" % sc.expect_kube not in link("kubernetes"):
                p.append("/etc/extensions/kubernetes.raw does not name %s" % sc.expect_kube)
            t = (disk_file(raw, "/etc/sysupdate.kubernetes.d/kubernetes-v1.32.transfer") or b"").decode()
            if "MatchPattern=kubernetes-v1.32.@v-%a.raw" not in t or "Verify=yes" not in t:
                p.append("sysupdate transfer: %r" % t[:200])
            if "KUBELET_VERSION=%s" % sc.expect_kube not in (env or b"").decode():
                p.append("kubelet.env on disk: %r" % env)
            if sc.expect_runtime is None and "/dev/null" not in link("containerd"):
                p.append("the user's /dev/null link for containerd was changed")
        for d in ("/opt/extensions/kubernetes", "/opt/extensions/containerd", "/etc/extensions", "/etc/kubernetes"):
            left = [n for n in disk_ls(raw, d) if ".nodestrap-" in n]
            if left:
                p.append("temp files left in %s: %r" % (d, left))
    finally:
        os.unlink(raw)
    return p
