"""The sysext family: a Debian 13 node (systemd 257) whose real systemd-sysext merges what
nodestrap staged, joining the run's real control plane (harness/cluster.py). The containerd
extension carries Debian 13's real containerd and runc; the kubernetes extensions carry the real
kubelet (kubeadm, kubectl) of two releases built from the k8s.io/kubernetes module, sysext-bakery's
kubelet unit, and the pause and busybox images. The images and their signed SHA256SUMS are
served from the host. A scenario that reaches the kubelet passes only when its Node registers
with the kubelet version nodestrap chose and the staged containerd, and its static pod runs.
qemu/build-sysext builds the node image and the extension images.

sysext-verify and sysext-verify-runtime boot one node twice and prove the boot check,
nodestrap-verify.service: it passes on the first boot, and on the second (bootstrapped again from
the initramfs) it finds what does not run as chosen (sysext-verify: an image that lies about its
kubelet; sysext-verify-runtime: a containerd staged for an OS update that was rolled back, which
systemd-sysext left out of the merge), refuses the image and returns the node to the known-good
set, which the Node then reports.

sysext-signed (issue 34's signed half) serves signed DDIs (qemu/build-sysext's sysext-ddi-*) to a
node whose bootstrap.conf says `sysext-trust=signed`: the initramfs proves and stages them and
installs the certificate and the strict image policy, the real root's systemd-sysext merges them
under that policy at boot and the node joins; then another signer's image is put under the
staged kubernetes image's name, and the second boot shows what systemd-sysext and the boot check
make of it. sysext-initrd-signed (bench only) is its first boot with sysext-initrd's events.
sysext-signed-usr (by name only) is that first boot with DDIs whose data partition is /usr itself
(qemu/build-sysext's sysext-ddi-usr-*), as systemd-repart makes them from usr, usr-verity and
usr-verity-sig definitions: Debian 13's systemd-sysext (257) would merge them with no dm-verity,
so nodestrap refuses them before anything is staged (sysext-signed-usr-262, in initrd262.py, is
the same DDIs on systemd 262, which verifies them)."""

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid

from harness.common import (
    CURRENT, GUEST_HOST, HERE, PATCH, PREVIOUS, TOP, disk_file, disk_ls, free_port, joined, run, say, timings,
)
from harness.cluster import Joining, kubelet_config, static_pod
from harness.vm import boot_until

EMPTY_SHA = hashlib.sha256(b"").hexdigest()
FAIL_RE = re.compile(r"nodestrap\[\d+\]: (?:<3>)?(?:error: )?(.*(?:refused|signature check|out of date).*)")
REPORT_RE = re.compile(r"nodestrap-qemu: after bootstrap \((\S+)\): (.*)")
RUN_DONE_RE = re.compile(r"^run done after (\d+(?:\.\d+)?) s")
KUBELET_STARTED_RE = re.compile(r"nodestrap-qemu: kubelet starting|Started kubelet\.service")
# The patch scenario's window: every minute, each node at its fixed offset in the first 20 s.
PATCH_WINDOW = "[Timer]\nOnCalendar=\nOnCalendar=*:*:00\nRandomizedDelaySec=20s\nAccuracySec=1s\n"
# ... and the patch run's log on the console, as the first-boot unit's is.
PATCH_CONSOLE = "[Service]\nStandardOutput=journal+console\nStandardError=journal+console\n"
# The verify scenarios keep the patch stream out of their run: the window's random offset (up to
# 6 h, seeded by the machine ID) could land in it, and a patch run verifies and rewrites the
# record the scenario reads.
PATCH_NEVER = "[Timer]\nOnCalendar=\nOnCalendar=2099-01-01 00:00:00\nRandomizedDelaySec=0\nPersistent=false\n"
# ... and its step between the two boots (qemu/guest/sysext/rebootstrap), once, after the boot
# check of the first boot passed.
REBOOTSTRAP_UNIT = """# The sysext-verify scenarios (qemu/harness/sysext.py): once the boot check passed, wait for the
# harness to publish the new image, remove kubelet.env and reboot, once.
[Unit]
Description=nodestrap-qemu: bootstrap again from the initramfs at the next boot
Requires=nodestrap-verify.service
After=nodestrap-verify.service
ConditionPathExists=/etc/kubernetes/kubelet.env
ConditionPathExists=!/var/lib/nodestrap-qemu/rebootstrapped

[Service]
Type=oneshot
ExecStart=/opt/nodestrap-qemu/rebootstrap %s
TimeoutStartSec=30min

[Install]
WantedBy=multi-user.target
"""
# sysext-verify-runtime's stand-in for an OS update rolled back: the step between the boots made
# os-release claim the next Debian and kept the one it replaced; this puts that back early in the
# second boot, after the initramfs bootstrapped for the next Debian, before systemd-sysext merges.
ROLLBACK_UNIT = """# The sysext-verify-runtime scenario (qemu/harness/sysext.py): a stand-in for an OS update that
# was rolled back. Between the boots the test's step (qemu/guest/sysext/rebootstrap) made
# os-release claim the next Debian, as an update staged for the next boot would, and the
# initramfs bootstrapped for that OS; the OS that boots is the one it replaced, so its os-release
# (Debian's link to ../usr/lib/os-release) is put back before the real root's systemd-sysext
# merges. A unit of the real root rather than a dracut hook after nodestrap-initrd.service: for
# the merge it is the same, and the initramfs every scenario shares stays as it is.
[Unit]
Description=nodestrap-qemu: the OS update rolled back (the test's stand-in)
DefaultDependencies=no
After=local-fs.target
Before=systemd-sysext.service sysinit.target
ConditionPathIsSymbolicLink=/var/lib/nodestrap-qemu/os-release.rolled-back

[Service]
Type=oneshot
ExecStart=/usr/bin/mv -f /var/lib/nodestrap-qemu/os-release.rolled-back /etc/os-release
ExecStart=/bin/sh -c 'echo "nodestrap-qemu: the OS update rolled back: os-release $$(grep ^VERSION_ID= /etc/os-release) again" >/dev/console'

[Install]
WantedBy=sysinit.target
"""
# In both verify scenarios: containerd says on the console when it has started, and which.
CONTAINERD_CONSOLE = """[Service]
ExecStartPost=-/bin/sh -c 'echo "nodestrap-qemu: containerd started: $$(/usr/bin/containerd --version)" >/dev/console'
"""
CONTAINERD_STARTED_RE = re.compile(r"nodestrap-qemu: containerd started: (.*)")
# The signed scenarios: the policy nodestrap sets for systemd 257 and where (docs/bootstrap.md,
# "Signed images"), and the test's report of what systemd-sysext did at each boot
# (qemu/guest/sysext/trust-report), after the boot check so that it costs the measured boot
# nothing.
POLICY = "root=signed+absent:usr=signed+absent"
POLICY_DROPIN = "/etc/systemd/system/systemd-sysext.service.d/50-nodestrap-image-policy.conf"
TRUST_REPORT_UNIT = """# The signed sysext scenarios (qemu/harness/sysext.py): what systemd-sysext did at this boot,
# on the console (qemu/guest/sysext/trust-report).
[Unit]
Description=nodestrap-qemu: report what systemd-sysext did at this boot
After=systemd-sysext.service sysext-reload.service nodestrap-verify.service

[Service]
Type=oneshot
ExecStart=/opt/nodestrap-qemu/trust-report

[Install]
WantedBy=multi-user.target
"""
# sysext-signed-usr: nodestrap's reason for refusing a /usr-partition DDI on systemd 257.
USR_REFUSED = ("refused: a signed DDI, but its data partition is /usr, which systemd %d merges without dm-verity, "
               "its signature never checked (systemd 258 or later checks it): on this node only a DDI with a root "
               "partition (systemd-repart --make-ddi=sysext) is taken")
# sysext-signed's step between its boots (qemu/guest/sysext/swap-image), once, after the boot
# check of the first boot passed and the report was made.
SWAP_UNIT = """# The sysext-signed scenario (qemu/harness/sysext.py): once the boot check passed, wait for the
# harness, take the second signer out of nodestrap's configuration and run nodestrap again, put
# that signer's image under the staged kubernetes image's name, reboot, once.
[Unit]
Description=nodestrap-qemu: untrust the second signer, run nodestrap, swap in its image, then reboot
After=nodestrap-verify.service nodestrap-qemu-trust-report.service
ConditionPathExists=!/var/lib/nodestrap-qemu/swapped

[Service]
Type=oneshot
ExecStart=/opt/nodestrap-qemu/swap-image %s
TimeoutStartSec=30min

[Install]
WantedBy=multi-user.target
"""
IMPOSTER_DIR = "/var/lib/nodestrap-qemu/imposter"
KEPT_PEM = "/etc/nodestrap/verity-kept.pem"
# Boot 1's record, saved by swap-image before nodestrap runs again on the running node.
BOOT1_RECORD = "/var/lib/nodestrap-qemu/status-boot1.json"
# The report's lines, read from the console as they come (the timeline would take a journal line
# such as "Failed to start systemd-sysext.service" for systemd's own).
TRUST_REPORT_RE = re.compile(r"nodestrap-qemu: sysext-report: (.*)")
# What nodestrap's second run in sysext-signed said of /etc/verity.d (swap-image, from its journal).
PATCH_RUN_RE = re.compile(r"nodestrap-qemu: patch run: (.*)")
# nodestrap verify's lines (journald has taken the priority prefix off).
VERIFY_RE = re.compile(r"nodestrap\[\d+\]: (?:<\d>)?(?:\w+: )?((?:verified: |check |the node does not run what |"
                       r"\w+ \S+ \(sha256-\S+\) refused|expecting the known-good).*)")


class Sx:
    """One sysext scenario: which path bootstraps (initramfs or first-boot unit), what the
    mirror serves, what the disk holds before the boot, Ignition links, what must be staged.
    `events`: None, or where the node's events go ("up": the World's receiver; "down": a closed
    port on the host). `bench_only`: run only when named (`qemu/run NAME`, bench/boot).
    `trust`: None, or "signed" (the mirror serves signed DDIs, the node's bootstrap.conf sets
    `sysext-trust=signed` and its certificate). `tamper`: a second boot after another signer's
    image replaced the staged kubernetes image (sysext-signed). `ddi`: None, or "usr": with
    `trust`, the mirror serves the DDIs whose data partition is /usr (sysext-signed-usr and, in
    initrd262.py, sysext-signed-usr-262)."""

    def __init__(self, name, doc, initrd, mirror="good", preseed=(), links=(), expect_runtime=True, fails=None,
                 butane=False, boots=1, events=None, bench_only=False, trust=None, tamper=False,
                 ddi=None):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.runner = lambda *a: (run_signed if tamper else run_verify if mirror.startswith("verify")
                                  else run_sysext)(*a)  # defined below


SCENARIOS = [
    Sx("sysext-initrd", "initramfs stages kubernetes + containerd; the real root's systemd-sysext "
       "merges them at boot; the node joins in the first boot, no reboot; the events of the initramfs "
       "run and of the real root's boot check reach the receiver complete and in order",
       initrd=True, events="up"),
    Sx("sysext-initrd-events-down", "(bench only) sysext-initrd with its events sent to a closed port: "
       "the node joins as fast; the initramfs run's events wait in the spool", initrd=True,
       events="down", bench_only=True),
    Sx("sysext-oci", "the signed source published to Debian's real docker-registry (TLS, htpasswd) by "
       "deploy/publish-oci; the initramfs stages kubernetes + containerd from it by digest with the "
       "node's registry-auth config.json; the node joins in the first boot, as in sysext-initrd, and "
       "the events of both runs reach the receiver as there (CI's one boot of them)",
       initrd=True, mirror="oci", events="up"),
    Sx("sysext-firstboot", "the first-boot unit stages, refreshes live, reloads systemd, proves the "
       "merge; the node joins in the same boot", initrd=False),
    Sx("sysext-tampered", "SHA256SUMS changed after signing: refused, nothing staged, no kubelet",
       initrd=False, mirror="tampered", fails="signature check against keyring"),
    Sx("sysext-expired", "a signed SHA256SUMS past its BEST-BEFORE date: refused naming the date",
       initrd=False, mirror="expired", fails="out of date: its BEST-BEFORE-2021-06-30 marker passed"),
    Sx("sysext-mismatch", "the current release's image is for another OS: refused with systemd-sysext's "
       "reason; the previous release stays linked and merged", initrd=False, mirror="mismatch",
       preseed=(("kubernetes", PREVIOUS),),
       fails="extension 'kubernetes' is for OS 'fedora', but deployed on top of 'debian'"),
    Sx("sysext-optout", "the user linked containerd.raw to /dev/null (Ignition links): containerd "
       "is not staged, kubernetes is; with no runtime the kubelet starts but cannot join",
       initrd=True, links=(("/etc/extensions/containerd.raw", "/dev/null"),), expect_runtime=False),
    Sx("sysext-upgrade", "node merged the previous release, the cluster is the current one: the "
       "current kubernetes image staged beside it, link switched, refreshed live, the node joins",
       initrd=False, preseed=(("kubernetes", PREVIOUS),)),
    Sx("sysext-butane", "the operator's on-ramp: ignition/examples/sysext-worker.bu as shipped, rendered "
       "by real Butane with this cluster's files and mirror; no kubeconfig: the version comes from the "
       "kubelet's bootstrap kubeconfig; the initramfs stages, the node joins in the first boot",
       initrd=True, butane=True),
    Sx("sysext-patch", "the mirror offers an earlier patch of the cluster's minor: the node joins "
       "with it; a newer patch is published while it runs: nodestrap-patch.timer merges it in its "
       "window, the kubelet restarts, and the Node reports the new patch", initrd=True, mirror="patch"),
    Sx("sysext-verify", "the boot check: the node joins with an earlier patch and nodestrap-verify.service "
       "confirms it; the mirror publishes an image named as the current release with the previous "
       "release's kubelet inside; the next boot's initramfs stages it, the boot check finds the lie, "
       "refuses the image, returns to the earlier patch, and the Node reports it again",
       initrd=True, mirror="verify", boots=2),
    Sx("sysext-verify-runtime", "the boot check, when the runtime is left out: the node joins and "
       "nodestrap-verify.service confirms it; the mirror publishes containerd 2.0.5 for Debian 14 alone and "
       "an OS update is staged for the next boot (os-release says Debian 14); the next boot's initramfs "
       "stages that containerd, the update is rolled back (a stand-in), systemd-sysext merges everything "
       "but containerd; the boot check finds it not merged, refuses the image, returns to containerd "
       "1.7.24, which starts, and the Node reports it again",
       initrd=True, mirror="verify-runtime", boots=2),
    Sx("sysext-signed", "signed DDIs under sysext-trust=signed with two trusted signers: the initramfs proves and "
       "stages them, installs both certificates and the strict image policy; the real root's systemd-sysext "
       "merges both under that policy at boot, the node joins in the first boot and the boot check passes; "
       "then the second signer leaves the configuration and the node's patch unit runs nodestrap, which takes "
       "its certificate away; an image that signer signed replaces the staged kubernetes image under its "
       "name: at the next boot systemd-sysext merges nothing of it, and the boot check reports the mismatch "
       "naming the image",
       initrd=True, trust="signed", tamper=True, boots=2),
    Sx("sysext-initrd-signed", "(bench only) sysext-initrd with signed DDIs under sysext-trust=signed (the first "
       "boot of sysext-signed with one certificate and sysext-initrd's events): the cost of verity", initrd=True, trust="signed",
       events="up", bench_only=True),
    Sx("sysext-signed-usr", "(by name only) the first boot of sysext-signed with one certificate, the mirror "
       "serving DDIs whose data partition is /usr itself (usr, usr-verity, usr-verity-sig): Debian 13's systemd "
       "257 would merge them with no dm-verity, so the initramfs refuses them before anything is staged, and so "
       "does the real root's retry; nothing linked, no kubelet.env, no kubelet",
       initrd=True, trust="signed", ddi="usr", bench_only=True, fails=USR_REFUSED % 257),
]


class World:
    """Built once per run: the images (qemu/build-sysext) and the mirror's server."""

    def __init__(self, s):
        self.s = s
        self.cp = s.cluster
        kernel = s.images["KERNEL"]
        kver = os.path.basename(kernel).split("vmlinuz-", 1)[1]
        kdir = os.path.dirname(os.path.dirname(os.path.dirname(kernel)))
        out = run(["bash", os.path.join(HERE, "build-sysext"), kdir, kver], stdout=subprocess.PIPE,
                  env=dict(os.environ, **s.images)).stdout
        self.images = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
        self.ext = self.images["SYSEXT_IMAGES"]
        # The signed DDIs of the same trees, the certificate a node trusts, and how nodestrap
        # names it in /etc/verity.d (the first 16 hex digits of the SHA-256 of its DER).
        self.ddis = self.images["SYSEXT_DDIS"]
        # ... and the current release's kubernetes tree and containerd's as /usr-partition DDIs.
        self.usr_ddis = self.images["SYSEXT_USR_DDIS"]
        self.verity_cert = os.path.join(self.ddis, "keys", "signing.crt")
        self.cert_fp = hashlib.sha256(pem_der(open(self.verity_cert).read())).hexdigest()
        self.cert_file = "nodestrap-%s.crt" % self.cert_fp[:16]
        # The second signer's: sysext-signed trusts it in its first boot (a rotation under way)
        # and takes it out of the configuration before the imposter it signed is swapped in.
        self.imposter_cert = os.path.join(self.ddis, "keys", "imposter.crt")
        self.imposter_file = "nodestrap-%s.crt" % hashlib.sha256(
            pem_der(open(self.imposter_cert).read())).hexdigest()[:16]
        self.digests = {}
        self.containerd = self.images["CONTAINERD_VERSION"]
        # sysext-verify-runtime's: the next Debian, and the containerd of its image.
        self.next_os = self.images["NEXT_OS_VERSION_ID"]
        self.next_containerd = self.images["CONTAINERD_NEXT_OS_VERSION"]
        self.release = {CURRENT: s.images["KUBE_VERSION"], PREVIOUS: s.images["KUBE_PREV_VERSION"],
                        PATCH: s.images["KUBE_PATCH_VERSION"]}
        self.www = s.path("sysext-www")
        os.makedirs(self.www)
        with open(s.path("sysext-configmaps.json"), "w") as f:
            f.write("{}")
        # The events' receiver (POST /progress/events on the mirror): its bearer token, or the
        # kubelet's client certificate from the cluster's CA once the node has joined.
        self.events_token = s.path("sysext-events-token")
        with open(self.events_token, "w") as f:
            f.write(secrets.token_hex(16))
        self.events_log = s.path("sysext-events.jsonl")
        open(self.events_log, "w").close()
        # A port on the host that refuses connections (bound, never listening) for the
        # receiver-down scenario.
        self.closed = socket.socket()
        self.closed.bind(("127.0.0.1", 0))
        # The mirror (server.py's files; its API server stand-in is not used: the cluster is real).
        self.server = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "server.py"), "--www", self.www,
             "--cert", s.path("srv.pem"), "--key", s.path("srv.key"), "--token", s.path("token"),
             "--git-version", "v0.0.0-unused", "--configmaps", s.path("sysext-configmaps.json"),
             "--log", s.path("sysext-server.log"), "--progress-token", self.events_token,
             "--progress-log", self.events_log, "--client-ca", os.path.join(self.cp.pki, "ca.crt")],
            stdout=subprocess.PIPE, text=True)
        ready = self.server.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise SystemExit("qemu/run: the sysext servers did not start")
        self.port = int(ready[1])

    def stop(self):
        self.server.terminate()
        self.server.wait()
        self.closed.close()
        if hasattr(self, "registry"):
            self.registry.terminate()
            self.registry.wait()

    def events_url(self, sc):
        port = self.port if sc.events == "up" else self.closed.getsockname()[1]
        return "https://%s:%d/progress/events" % (GUEST_HOST, port)

    def received(self):
        """The receiver's log as it is now: one event per line, in arrival order."""
        return [json.loads(l) for l in open(self.events_log) if l.strip()]

    def image(self, name, which, signed=False):
        """The plain image, or with `signed` the signed DDI of the same tree (same file name);
        with signed="usr", the /usr-partition DDI of it (the current release and containerd)."""
        d = self.usr_ddis if signed == "usr" else self.ddis if signed else self.ext
        if name == "containerd":
            return os.path.join(d, "containerd-v%s-x86-64.raw" % self.containerd)
        return os.path.join(d, "kubernetes-%s-x86-64.raw" % self.release[which])

    def imposter(self):
        """The current release's kubernetes tree signed by a key no node trusts, its file named as
        the trusted DDI's (qemu/build-sysext)."""
        return os.path.join(self.ddis, "imposter", "kubernetes-%s-x86-64.raw" % self.release[CURRENT])

    def digest(self, path):
        """`sha256-<hex>` of a file of the run's images, computed once."""
        if path not in self.digests:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            self.digests[path] = "sha256-" + h.hexdigest()
        return self.digests[path]

    def publish(self, sc):
        """The scenario's own mirror directory: images, SHA256SUMS and its binary signature."""
        releases = (PREVIOUS, PATCH) if sc.mirror in ("patch", "verify") else (PREVIOUS, CURRENT)
        signed = signed_as(sc)  # the signed DDIs, under the plain images' names
        if signed == "usr":
            releases = (CURRENT,)  # the /usr-partition DDIs: the current release alone
        offer = {"kubernetes": [("kubernetes-%s-x86-64.raw" % self.release[w], self.image("kubernetes", w, signed))
                                for w in releases],
                 "containerd": [("containerd-v%s-x86-64.raw" % self.containerd, self.image("containerd", None, signed))]}
        if sc.mirror == "control-plane":
            # A fresh cluster's payload: the current release with the control plane's images.
            offer["kubernetes"] = [("kubernetes-%s-x86-64.raw" % self.release[CURRENT],
                                    os.path.join(self.ext, "kubernetes-control-plane.raw"))]
        if sc.mirror == "mismatch":
            offer["kubernetes"][-1] = (offer["kubernetes"][-1][0], os.path.join(self.ext, "kubernetes-fedora.raw"))
        for name, files in offer.items():
            self.sign(sc, name, files)
        if sc.mirror == "oci":
            return self.publish_oci(sc)
        return "https://%s:%d/%s/${NAME}" % (GUEST_HOST, self.port, sc.name)

    def publish_oci(self, sc):
        """The scenario's signed folder published to a real registry (docker-registry, with the
        mirror's certificate and an htpasswd user) by deploy/publish-oci; the node's
        registry-auth file names the registry as the guest reaches it."""
        if not hasattr(self, "registry"):
            d = self.s.path("registry")
            os.makedirs(d)
            self.registry_password = secrets.token_hex(12)
            with open(os.path.join(d, "htpasswd"), "w") as f:
                f.write(run(["htpasswd", "-nbB", "node", self.registry_password], stdout=subprocess.PIPE).stdout)
            self.registry_port = free_port()
            with open(os.path.join(d, "config.yml"), "w") as f:
                f.write("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n"
                        "http:\n  addr: 127.0.0.1:%d\n  tls:\n    certificate: %s\n    key: %s\n"
                        "auth:\n  htpasswd:\n    realm: nodestrap-qemu\n    path: %s\n"
                        % (os.path.join(d, "data"), self.registry_port, self.s.path("srv.pem"),
                           self.s.path("srv.key"), os.path.join(d, "htpasswd")))
            self.registry = subprocess.Popen(["docker-registry", "serve", os.path.join(d, "config.yml")],
                                             stdout=open(os.path.join(d, "log"), "w"), stderr=subprocess.STDOUT)
            for _ in range(200):
                with socket.socket() as c:
                    if c.connect_ex(("127.0.0.1", self.registry_port)) == 0:
                        break
                time.sleep(0.05)
            else:
                raise SystemExit("qemu/run: docker-registry did not listen (%s)" % os.path.join(d, "log"))
            token = base64.b64encode(("node:" + self.registry_password).encode()).decode()
            for host, name in (("127.0.0.1", "push"), (GUEST_HOST, "node")):
                with open(os.path.join(d, name + ".json"), "w") as f:
                    json.dump({"auths": {"%s:%d" % (host, self.registry_port): {"auth": token}}}, f)
            self.registry_auth = os.path.join(d, "node.json")
        run([os.path.join(TOP, "deploy/publish-oci"), "sysext", "--auth", self.s.path("registry/push.json"),
             "--ca-file", self.s.path("ca.pem"), os.path.join(self.www, sc.name),
             "oci://127.0.0.1:%d/%s" % (self.registry_port, sc.name)], stdout=subprocess.DEVNULL)
        return "oci://%s:%d/%s/${NAME}" % (GUEST_HOST, self.registry_port, sc.name)

    def publish_patch(self, sc):
        """The patch scenario's new patch: the current release added to the kubernetes folder and
        its SHA256SUMS signed again, as a mirror publishes one while nodes run."""
        self.sign(sc, "kubernetes", [("kubernetes-%s-x86-64.raw" % self.release[w], self.image("kubernetes", w))
                                     for w in (PREVIOUS, PATCH, CURRENT)])

    def publish_lie(self, sc):
        """The verify scenario's lying image: named as the current release on the mirror (and
        correctly signed), the previous release's kubelet inside (qemu/build-sysext)."""
        self.sign(sc, "kubernetes", [("kubernetes-%s-x86-64.raw" % self.release[w], self.image("kubernetes", w))
                                     for w in (PREVIOUS, PATCH)] +
                  [("kubernetes-%s-x86-64.raw" % self.release[CURRENT], self.lying())])

    def lying(self):
        return os.path.join(self.ext, "kubernetes-lying.raw")

    def publish_next_os_runtime(self, sc):
        """The verify-runtime scenario's new runtime: containerd for the next Debian only (its
        extension-release says so; qemu/build-sysext) added to the containerd folder, its
        SHA256SUMS signed again."""
        self.sign(sc, "containerd", [("containerd-v%s-x86-64.raw" % self.containerd, self.image("containerd", None)),
                                     ("containerd-v%s-x86-64.raw" % self.next_containerd, self.next_os_runtime())])

    def next_os_runtime(self):
        return os.path.join(self.ext, "containerd-next-os.raw")

    def sign(self, sc, name, files):
        """`files` (name, source) in the scenario's folder of extension `name`, with their
        SHA256SUMS and its signature, the list replaced atomically after its signature."""
        d = os.path.join(self.www, sc.name, name)
        os.makedirs(d, exist_ok=True)
        lines = []
        for fname, src in files:
            if not os.path.exists(os.path.join(d, fname)):
                try:
                    os.link(src, os.path.join(d, fname))
                except OSError:  # another filesystem (a binary in the checkout)
                    shutil.copy(src, os.path.join(d, fname))
            lines.append("%s  %s\n" % (hashlib.sha256(open(src, "rb").read()).hexdigest(), fname))
        lines.append("%s  BEST-BEFORE-%s\n" % (EMPTY_SHA, "2021-06-30" if sc.mirror == "expired" else "2099-12-31"))
        sums = os.path.join(d, "SHA256SUMS")
        with open(sums + ".new", "w") as f:
            f.writelines(lines)
        run(["gpg", "--batch", "--yes", "--detach-sign", "-o", sums + ".gpg.new", sums + ".new"])
        os.rename(sums + ".gpg.new", sums + ".gpg")
        os.rename(sums + ".new", sums)
        if sc.mirror == "tampered" and name == "kubernetes":
            with open(sums, "a") as f:
                f.write("%s  kubernetes-v1.99.9-x86-64.raw\n" % EMPTY_SHA)

    def node_files(self, sc, url):
        """What Ignition puts on the node: nodestrap's settings, keyring and trust anchors, its
        kubeconfig (the nodestrap-bootstrap identity: /version), and what the kubelet needs to
        join (a bootstrap token kubeconfig, the cluster CA, its configuration, the node's name)
        and run (a static pod)."""
        s, cp = self.s, self.cp
        d = s.path(sc.name + "-files")
        os.makedirs(d)
        files = {
            "/etc/nodestrap/bootstrap.conf": (
                "# nodestrap bootstrap settings (same keys as its options)\n"
                "payload=sysext\nsysext-url=%s\nkeyring=/etc/nodestrap/keyring.asc\n"
                "ca-file=/etc/nodestrap/ca.pem\napi-tries=2\napi-retry-delay=2\nfetch-attempts=3\n" % url),
            "/etc/nodestrap/keyring.asc": open(s.path("keyring.asc")).read(),
            "/etc/nodestrap/ca.pem": open(s.path("ca.pem")).read() + cp.ca_pem(),
            "/etc/kubernetes/kubeconfig": cp.kubeconfig("nodestrap-bootstrap"),
            "/etc/kubernetes/installer/runtime-mappings.yaml": (
                'kind: VersionManifestV1\nversions:\n  k8s:\n    "%s":\n      containerd: ["1.7"]\n'
                '    "%s":\n      containerd: ["2.0", "1.7"]\n'
                % (minor(self.release[PREVIOUS]), minor(self.release[CURRENT]))),
            "/etc/hostname": sc.name + "\n",
            "/etc/kubernetes/bootstrap-kubelet.conf": cp.kubeconfig(token=cp.bootstrap_token),
            "/etc/kubernetes/pki/ca.crt": cp.ca_pem(),
            "/var/lib/kubelet/config.yaml": kubelet_config(),
            "/etc/kubernetes/manifests/probe.yaml": static_pod(s.images["BUSYBOX_REF"]),
        }
        if sc.events:
            # The receiver's token and CA; its URL is on the kernel command line (prepare).
            files["/etc/nodestrap/bootstrap.conf"] += (
                "events-token-file=/etc/nodestrap/events-token\nevents-ca-file=/etc/nodestrap/ca.pem\n")
            files["/etc/nodestrap/events-token"] = open(self.events_token).read()
        if sc.mirror == "oci":
            # The registry's credentials as the kubelet keeps them (a Docker config.json).
            files["/etc/nodestrap/bootstrap.conf"] += "registry-auth=/etc/nodestrap/registry-auth.json\n"
            files["/etc/nodestrap/registry-auth.json"] = open(self.registry_auth).read()
        units = []
        if sc.trust:
            # Signed mode from the node's config file, its certificate delivered by Ignition
            # (a node path there); and the test's report of what systemd-sysext did at boot.
            files["/etc/nodestrap/bootstrap.conf"] += (
                "sysext-trust=%s\nsysext-verity-certs=/etc/nodestrap/verity.pem\n" % sc.trust)
            files["/etc/nodestrap/verity.pem"] = open(self.verity_cert).read()
            if sc.tamper:
                # Both signers trusted at first; the step between the boots puts back the
                # first alone (KEPT_PEM) before nodestrap runs again.
                files[KEPT_PEM] = files["/etc/nodestrap/verity.pem"]
                files["/etc/nodestrap/verity.pem"] += open(self.imposter_cert).read()
            files["/opt/nodestrap-qemu/trust-report"] = open(os.path.join(HERE, "guest/sysext/trust-report")).read()
            units.append(("nodestrap-qemu-trust-report.service", TRUST_REPORT_UNIT))
        if sc.tamper:
            # The step between the boots (qemu/guest/sysext/swap-image), told by the harness
            # through `sc.signal_port`; the imposter was planted on the disk (disk()). The patch
            # stream stays out of the run, as in the verify scenarios.
            fname = os.path.basename(self.imposter())
            files["/opt/nodestrap-qemu/swap-image"] = open(os.path.join(HERE, "guest/sysext/swap-image")).read()
            units += [("nodestrap-patch.timer.d/10-test.conf", PATCH_NEVER),
                      ("nodestrap-qemu-swap.service", SWAP_UNIT % "%d %s/%s /opt/extensions/kubernetes/%s %s %s"
                       % (sc.signal_port, IMPOSTER_DIR, fname, fname, KEPT_PEM, "/etc/nodestrap/verity.pem"))]
        args = []
        if sc.mirror.startswith("verify"):
            # The step between the two boots (qemu/guest/sysext/rebootstrap), told by the harness
            # through `sc.signal_port` when the new image is published.
            files["/opt/nodestrap-qemu/rebootstrap"] = open(os.path.join(HERE, "guest/sysext/rebootstrap")).read()
        for node_path, text in files.items():
            local = os.path.join(d, node_path.strip("/").replace("/", "_"))
            with open(local, "w") as f:
                f.write(text)
            mode = ":0755" if node_path.startswith("/opt/") else \
                ":0600" if node_path.endswith(("-token", "-auth.json")) else ""
            args += ["--file", "%s=%s%s" % (node_path, local, mode)]
        for node_path, target in sc.links:
            args += ["--link", "%s=%s" % (node_path, target)]
        if sc.mirror.startswith("verify"):
            step = "%d %s" % (sc.signal_port, self.next_os) if sc.mirror == "verify-runtime" else "%d" % sc.signal_port
            units += [("nodestrap-patch.timer.d/10-test.conf", PATCH_NEVER),
                      ("nodestrap-qemu-rebootstrap.service", REBOOTSTRAP_UNIT % step),
                      ("containerd.service.d/99-console.conf", CONTAINERD_CONSOLE)]
            if sc.mirror == "verify-runtime":
                units.append(("nodestrap-qemu-rollback.service", ROLLBACK_UNIT))
        for unit, text in units:
            local = os.path.join(d, unit)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "w") as f:
                f.write(text)
            args += ["--unit", local]
        if sc.mirror == "patch":
            # The patch window shortened to a minute for the test, and the run on the console.
            for unit, text in (("nodestrap-patch.timer", PATCH_WINDOW), ("nodestrap-patch.service", PATCH_CONSOLE)):
                drop = os.path.join(d, unit + ".d")
                os.makedirs(drop)
                with open(os.path.join(drop, "10-test.conf"), "w") as f:
                    f.write(text)
                args += ["--unit", os.path.join(drop, "10-test.conf")]
        return args

    def publish_nodestrap(self, sc, path):
        """nodestrap's release `path` (a binary) in the scenario's signed nodestrap/ folder, as
        deploy/sign-sysext-source files one, beside those already there; its file name and
        version."""
        version = run([path, "--version"], stdout=subprocess.PIPE).stdout.split()[1]
        fname = "nodestrap-v%s-x86-64" % version
        self.releases = getattr(self, "releases", {})
        have = self.releases.setdefault(sc.name, [])
        have.append((fname, path))
        self.sign(sc, "nodestrap", have)
        return fname, version

    def butane_config(self, sc, url, config, extra=""):
        """ignition/examples/sysext-worker.bu as an operator uses it: its four files replaced with
        this cluster's (the signing key, the mirror's CA, a bootstrap token kubeconfig, the
        cluster's CA), its example mirror URL with this one, nodestrap's release and its SHA-512
        with the run's binary in the mirror's nodestrap/ folder, rendered by real Butane, strict.
        A second Butane config merges it and adds what only the test needs: the node's name
        (a cloud's metadata gives it), a static pod to prove the kubelet runs one, and `extra`
        (more of its storage.files entries)."""
        s, cp = self.s, self.cp
        d = s.path(sc.name + "-butane")
        os.makedirs(d)
        token = getattr(sc, "token", None) or cp.bootstrap_token
        for name, text in (("sysext-keyring.asc", open(s.path("keyring.asc")).read()),
                           ("mirror-ca.pem", open(s.path("ca.pem")).read()),
                           ("bootstrap-kubelet.conf", cp.kubeconfig(token=token)),
                           ("cluster-ca.crt", cp.ca_pem()),
                           ("hostname", sc.name + "\n"),
                           ("probe.yaml", static_pod(self.s.images["BUSYBOX_REF"]))):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        example = open(os.path.join(TOP, "ignition/examples/sysext-worker.bu")).read()
        binary = os.environ.get("NODESTRAP_BIN") or os.path.join(TOP, "target/x86_64-unknown-linux-musl/release/nodestrap")
        fname, _ = self.publish_nodestrap(sc, binary)
        sha512 = hashlib.sha512(open(binary, "rb").read()).hexdigest()
        for shipped, ours in (("sysext-url=https://extensions.example.com/${NAME}/", "sysext-url=%s/" % url),
                              ("source: https://extensions.example.com/nodestrap/nodestrap-v0.1.0-x86-64",
                               "source: %s/%s" % (url.replace("${NAME}", "nodestrap"), fname)),
                              ("hash: sha512-" + "0" * 128, "hash: sha512-" + sha512)):
            if shipped not in example:
                raise SystemExit("qemu/run: sysext-worker.bu no longer says %r" % shipped)
            example = example.replace(shipped, ours)
        with open(os.path.join(d, "sysext-worker.bu"), "w") as f:
            f.write(example)
        butane = run(["bash", os.path.join(HERE, "build-butane")], stdout=subprocess.PIPE).stdout.strip()
        with open(os.path.join(d, "sysext-worker.ign"), "w") as f:
            run([butane, "--strict", "--files-dir", d, os.path.join(d, "sysext-worker.bu")], stdout=f)
        with open(os.path.join(d, "test.bu"), "w") as f:
            f.write("variant: flatcar\nversion: 1.0.0\nignition:\n  config:\n    merge:\n"
                    "      - local: sysext-worker.ign\nstorage:\n  files:\n"
                    "    - path: /etc/hostname\n      overwrite: true\n      contents: {local: hostname}\n"
                    "    - path: /etc/kubernetes/manifests/probe.yaml\n      contents: {local: probe.yaml}\n" + extra)
        with open(config, "w") as f:
            run([butane, "--strict", "--files-dir", d, os.path.join(d, "test.bu")], stdout=f)

    def disk(self, sc):
        """A copy-on-write overlay of the node image; with `preseed`, over a copy that already
        holds those images and links, as an earlier bootstrap left them; with `tamper`, over a
        copy that holds the imposter in IMPOSTER_DIR."""
        # sysext-initrd-262 boots Debian 14's root (qemu/build-forky).
        base = self.s.images[sc.node_image] if getattr(sc, "node_image", None) else self.images["SYSEXT_NODE_IMAGE"]
        stock = getattr(sc, "stock", False)
        if sc.preseed or sc.tamper or stock:
            raw = self.s.path(sc.name + "-base.raw")
            run(["cp", "--sparse=always", base, raw])
            cmds = []
            for name, which in sc.preseed + ((("containerd", None),) if sc.preseed else ()):
                fname = os.path.basename(self.image(name, which))
                cmds += ["mkdir /opt/extensions/%s" % name,
                         "write %s /opt/extensions/%s/%s" % (self.image(name, which), name, fname),
                         "symlink /etc/extensions/%s.raw /opt/extensions/%s/%s" % (name, name, fname)]
            if sc.tamper:
                # The imposter waits outside every folder systemd-sysext or nodestrap reads,
                # for the step between the boots (qemu/guest/sysext/swap-image).
                cmds += ["mkdir %s" % os.path.dirname(IMPOSTER_DIR), "mkdir %s" % IMPOSTER_DIR,
                         "write %s %s/%s" % (self.imposter(), IMPOSTER_DIR, os.path.basename(self.imposter()))]
            if stock:
                # A stock node: nothing of nodestrap in its image (Ignition installs it).
                cmds.append("rm /opt/bin/nodestrap")
            r = subprocess.run(["debugfs", "-w", "-f", "-", raw], input="\n".join(cmds) + "\n",
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit("debugfs: %s" % r.stderr)
            base = raw
        disk = self.s.path(sc.name + ".qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", disk])
        return disk


WORLD = {}


def world(s):
    """The run's World, built at its first use (the activate scenarios use it too)."""
    if "w" not in WORLD:
        WORLD["w"] = World(s)
        s.on_stop.append(WORLD["w"].stop)
    return WORLD["w"]


def minor(v):
    return ".".join(v.lstrip("v").split(".")[:2])


def prepare(s, sc):
    """The run's World, the scenario's mirror, its Ignition config (validated), its disk, and the
    kernel arguments of its boots."""
    w = world(s)
    url = w.publish(sc)
    config = s.path(sc.name + ".ign")
    if sc.butane:
        w.butane_config(sc, url, config)
    else:
        with open(config, "w") as f:
            run([os.path.join(TOP, "ignition/render"), "sysext"] + w.node_files(sc, url), stdout=f)
    run(["ignition-validate", config])
    disk = w.disk(sc)
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1"]
    if not sc.initrd:
        base.append("rd.nodestrap=0")
    if sc.events:
        base.append("nodestrap.events-url=" + w.events_url(sc))
    if os.environ.get("NODESTRAP_QEMU_DEBUG") == "1":
        base.append("systemd.journald.forward_to_console=1")
    return w, config, disk, base


def run_sysext(s, sc, accel, boot_timeout):
    say("\n=== %s: %s" % (sc.name, sc.doc))
    w, config, disk, base = prepare(s, sc)
    events, started, failures, reports, report, initramfs_failures = [], [], [], [], [], []
    joining = Joining(w.cp, sc.name)
    # The receiver's log before this scenario: its events are the lines after these.
    before = len(w.received())
    verify = {}
    t0 = time.time()

    def on_line(now, boots, line):
        if KUBELET_STARTED_RE.search(line) and not started:
            started.append(now)
        if re.search(r"Finished nodestrap-verify\.s|Failed to start nodestrap-verify\.s", line):
            verify.setdefault("ended", now)
        m = FAIL_RE.search(line)
        if m:
            failures.append(m.group(1))
            if not reports:
                initramfs_failures.append(m.group(1))  # before the real root's first attempt ended
        m = REPORT_RE.search(line)
        if m:
            reports.append(m.groups())
        m = TRUST_REPORT_RE.search(line)
        if m:
            report.append((boots, m.group(1)))
        if not sc.fails and sc.expect_runtime:
            joining.poll(now)

    patch = {}

    def done(boots):
        if sc.fails:
            return len(reports) >= 2  # the unit failed, reported, retried and failed again
        if not sc.expect_runtime:
            return bool(started)  # the kubelet ran; with no runtime it cannot join
        if sc.trust and not trust_report(report, 1)["end"]:
            joining.poll(time.time() - t0)
            return False  # the report of what systemd-sysext did comes after the boot check
        joining.poll(time.time() - t0)
        if sc.events and joining.done():
            # The boot check's events too: until nodestrap-verify.service ended and, with the
            # receiver up, its `finished` event arrived (or 20 s after the unit ended).
            if "ended" not in verify:
                return False
            if sc.events == "up" and time.time() - t0 - verify["ended"] < 20:
                return any(e.get("command") == "verify" and e.get("kind") == "finished"
                           for e in w.received()[before:])
            return True
        if sc.mirror != "patch" or not joining.done():
            return joining.done()
        # The patch stream: once the node runs with the earlier patch, the mirror publishes the
        # new one, and the scenario ends when the API server reports the Node's kubelet at it
        # and the patch run's boot check (nodestrap-patch.service's ExecStartPost=nodestrap
        # verify, which waits for just that) has confirmed it.
        now = time.time() - t0
        if "published" not in patch:
            patch["joined"], patch["published"] = joining.info, now
            w.publish_patch(sc)
            say("  %5.1fs  the mirror publishes kubernetes %s" % (now, w.release[CURRENT]))
            return False
        if "reported" not in patch:
            if now - patch.get("asked", 0) < 3:
                return False
            patch["asked"] = now
            info = w.cp.node_info(sc.name)
            if not info or info[0] != w.release[CURRENT]:
                return False
            patch["reported"] = now
            joining.info = info
            say("  %5.1fs  the Node reports kubelet %s" % (now, info[0]))
        verified = "verified: the node runs kubernetes %s" % w.release[CURRENT]
        at = next((t for t, _, k, x in events if k == "nodestrap" and verified in x), None)
        if at is not None:
            patch["verified"] = at
        return at is not None or now - patch["reported"] > 60

    if sc.mirror == "patch":
        boot_timeout += 300  # the join, then a patch window, a download and a restart
    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events,
                                      on_line, done, "the node's join" if not sc.fails else "two failed attempts",
                                      "no Node registered with its pod running" if not sc.fails
                                      else "no second failed attempt")
    if not problems:
        problems = check(w, sc, events, joining, started, failures, reports, disk, patch)
    sc.timings = timings(events, started[0] if started else None)
    sc.timings.update(joined(events, joining))
    # The first run's own wall time as it logs it last (`run done after N s`), after the events'
    # wait at the run's end and its record (the summary line comes before both).
    run_done = next((RUN_DONE_RE.search(x) for _, _, k, x in events if k == "nodestrap" and RUN_DONE_RE.search(x)), None)
    if run_done:
        sc.timings["nodestrap_run"] = float(run_done.group(1))
    if sc.events and not problems:
        problems = check_events(w, sc, w.received()[before:], disk)
    if sc.trust and sc.fails and not problems:
        problems = check_usr_refused(w, sc, initramfs_failures, failures, disk)
    elif sc.trust and not problems:
        problems = check_trust_disk(w, sc, report, disk, 1)
    if sc.events:
        f = lambda k: "%.1f s" % sc.timings[k] if sc.timings.get(k) is not None else "-"
        say("  receiver %s: nodestrap %s (first line to summary), %s (its `run done after`), the record's duration %s; "
            "kernel to kubelet %s; the boot check's duration %s (on the node itself %s)" % (
                sc.events, f("nodestrap"), f("nodestrap_run"), f("bootstrap_duration_s"),
                f("kernel_to_kubelet"), f("verify_duration_s"), f("verify_local_s")))
    figures(w, sc, events)
    if "reported" in patch:
        sc.timings["patch published to Node at it"] = round(patch["reported"] - patch["published"], 1)
    if "verified" in patch:
        sc.timings["patch published to verified"] = round(patch["verified"] - patch["published"], 1)
    for k, v in sc.timings.items():
        if k.startswith("patch "):
            say("  %-40s %6.1f s" % (k, v))
    sc.proof = joining.info
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, started[0] if started else None, problems


def check(w, sc, events, joining, started, failures, reports, disk, patch):
    p = []
    texts = [(b, k, t) for _, b, k, t in events]
    said = [t for _, k, t in texts if k == "nodestrap"]
    current, previous = w.release[CURRENT], w.release[PREVIOUS]
    if sc.mirror == "patch":
        # Joined with the earlier patch (staged by the initramfs), then patched live.
        first = w.release[PATCH]
        if not patch.get("joined") or patch["joined"][0] != first:
            p.append("the Node joined with kubelet %r, the mirror offered %s then" % (patch.get("joined"), first))
        if not any("kubernetes=%s containerd=v%s activation=staged" % (first, w.containerd) in t for t in said):
            p.append("the initramfs did not stage %s" % first)
        for want in ("kubernetes=%s containerd=v%s activation=merged" % (current, w.containerd),
                     "kubelet.service restarted (if it ran): its extension changed to %s" % current,
                     "verified: the node runs kubernetes %s" % current):
            if not any(want in t for t in said):
                p.append("the patch run did not say %r" % want)
    if sc.butane and not any("from=api-server" in t and "bootstrap-kubelet.conf" in t for t in said):
        p.append("the version did not come from the API server through the bootstrap kubeconfig: %r"
                 % [t for t in said if "k8s=" in t][:2])
    if sc.fails:
        if not any(sc.fails in f for f in failures):
            p.append("no failure naming %r (saw %r)" % (sc.fails, failures[:3]))
        if started:
            p.append("the kubelet started although bootstrap failed")
        if w.cp.node_info(sc.name):
            p.append("a Node %s registered although bootstrap failed" % sc.name)
        for result, rest in reports:
            if result == "success":
                p.append("a bootstrap attempt succeeded: %s" % rest)
    else:
        summary = [t for t in said if "nodestrap: sysext done" in t]
        activation = "staged" if sc.initrd and sc.mirror != "patch" else "merged"
        want = "kubernetes=%s %s activation=%s" % (
            current, "containerd=v" + w.containerd if sc.expect_runtime else "containerd=masked", activation)
        if not any(want in t for t in summary):
            p.append("no summary with %r (saw %r)" % (want, summary))
        if sc.initrd and not any("activation=staged" in t for b, k, t in texts if k == "nodestrap" and b == 1):
            p.append("the initramfs did not stage")
        if sc.expect_runtime:
            # The proof: the API server knows the Node, with the kubelet nodestrap chose and the
            # containerd it staged, and the kubelet ran the pod from the payload's image.
            kubelet, runtime = joining.info or (None, None)
            if kubelet != current:
                p.append("the Node reports kubeletVersion %r, nodestrap chose %s" % (kubelet, current))
            if runtime != "containerd://" + w.containerd:
                p.append("the Node reports containerRuntimeVersion %r, nodestrap staged containerd %s"
                         % (runtime, w.containerd))
            if joining.running is None:
                p.append("the static pod's mirror pod never ran")
            if sc.events:
                # The boot check has ended (done() waited for it): what it told the Node.
                cond, labels, ev = node_told(w.cp, sc.name)
                want = {"nodestrap.io/kubernetes": current, "nodestrap.io/runtime": "containerd-" + w.containerd,
                        "nodestrap.io/trust": "plain"}
                if cond != ("True", "Verified") or labels != want or not {"Staged=1", "Verified=1"} <= set(ev):
                    p.append("the Node was told %r, labels %r, events %r; expected (True, Verified), %r, Staged and "
                             "Verified" % (cond, labels, ev, want))
                else:
                    say("  the Node: NodestrapVerified %s (%s), labels %s, events %s"
                        % (cond[0], cond[1], ", ".join("%s=%s" % kv for kv in sorted(labels.items())), " ".join(ev)))
        else:
            if w.cp.node_info(sc.name):
                p.append("a Node registered although the node has no container runtime")
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
            want_store = ["kubernetes-%s-x86-64.raw" % previous] if sc.preseed else []
            if store != want_store:
                p.append("/opt/extensions/kubernetes holds %r, expected %r" % (store, want_store))
            if env is not None:
                p.append("kubelet.env exists after a failed bootstrap")
            if sc.preseed and "kubernetes-%s-x86-64.raw" % previous not in link("kubernetes"):
                p.append("the kubernetes link no longer names %s" % previous)
            if sc.preseed and not any("link=/opt/extensions/kubernetes/kubernetes-%s-x86-64.raw"
                                      " kubelet=Kubernetes_%s" % (previous, previous) in r[1] and '"kubernetes"' in r[1]
                                      for r in reports):
                p.append("after the refusal, %s is not reported merged: %r" % (previous, reports[-1:]))
        else:
            want = ["kubernetes-%s-x86-64.raw" % current]
            if sc.preseed:
                want = sorted(want + ["kubernetes-%s-x86-64.raw" % previous])
            if sc.mirror == "patch":
                want = sorted(want + ["kubernetes-%s-x86-64.raw" % w.release[PATCH]])
                rec = (disk_file(raw, "/var/lib/nodestrap/status.json") or b"").decode()
                if '"what": "kubelet.service"' not in rec or '"value": "restarted"' not in rec:
                    p.append("the status record does not say kubelet.service was restarted: %r" % rec[-400:])
                # The patch run's boot check: the Node confirmed the new patch, now known-good.
                r, e = record_of(rec.encode(), "status.json")
                kg, e2 = record_of(disk_file(raw, "/var/lib/nodestrap/known-good.json"), "known-good.json")
                p += [x for x in (e, e2) if x]
                if r:
                    v = r.get("verification") or {}
                    got = (r.get("phase"), v.get("outcome"), v.get("api"), chosen(r.get("chosen"), "kubernetes"))
                    if got != ("verified", "verified", "confirmed", current):
                        p.append("the patch run's record (phase, outcome, api, kubernetes): %r, expected %r"
                                 % (got, ("verified", "verified", "confirmed", current)))
                if kg and chosen(kg.get("set"), "kubernetes") != current:
                    p.append("known-good.json's set is %r after the patch run" % kg.get("set"))
            if store != want:
                p.append("/opt/extensions/kubernetes holds %r, expected %r" % (store, want))
            if "kubernetes-%s-x86-64.raw" % current not in link("kubernetes"):
                p.append("/etc/extensions/kubernetes.raw does not name %s" % current)
            if disk_ls(raw, "/etc/sysupdate.kubernetes.d"):
                p.append("sysupdate files were written: %r" % disk_ls(raw, "/etc/sysupdate.kubernetes.d"))
            if "KUBELET_VERSION=%s" % current not in (env or b"").decode():
                p.append("kubelet.env on disk: %r" % env)
            if not sc.expect_runtime and "/dev/null" not in link("containerd"):
                p.append("the user's /dev/null link for containerd was changed")
        for d in ("/opt/extensions/kubernetes", "/opt/extensions/containerd", "/etc/extensions", "/etc/kubernetes"):
            left = [n for n in disk_ls(raw, d) if ".nodestrap-" in n]
            if left:
                p.append("temp files left in %s: %r" % (d, left))
    finally:
        os.unlink(raw)
    return p


def in_order(evs, what):
    """One run's events as received: (the events without exact repeats, problems, repeats). A
    repeat of a (run, seq) pair may happen by design (an event on its way as the run ends); an
    exact repeat is tolerated and counted, any other is a problem, as is more than one run, and
    seq not 1..n in arrival order."""
    p, seen, uniq, repeats = [], {}, [], 0
    for e in evs:
        key = (e.get("run"), e.get("seq"))
        if key in seen:
            if seen[key] != e:
                p.append("%s: (run, seq) %r arrived twice, different: %r then %r" % (what, key, seen[key], e))
            repeats += 1
            continue
        seen[key] = e
        uniq.append(e)
    runs = sorted({e.get("run") for e in uniq})
    if len(runs) != 1:
        p.append("%s: %d runs, expected 1: %r" % (what, len(runs), runs))
    seqs = [e.get("seq") for e in uniq]
    if seqs != list(range(1, len(uniq) + 1)):
        p.append("%s: seq in arrival order is %r, expected 1..%d without a gap" % (what, seqs, len(uniq)))
    return uniq, p, repeats


def check_events(w, sc, got, disk):
    """The events scenarios: the receiver's log (`got`, this scenario's lines in arrival order)
    and the events in the status record on the disk."""
    p = []
    files, _, _ = read_disk(disk, ["/var/lib/nodestrap/status.json"])
    rec, err = record_of(files["/var/lib/nodestrap/status.json"], "status.json")
    if err:
        return [err]
    d, v = rec.get("events") or {}, rec.get("verification") or {}
    ve = v.get("events") or {}
    if v.get("duration_s") is not None:
        sc.timings["verify_duration_s"] = v["duration_s"]
    if v.get("local_s") is not None:
        sc.timings["verify_local_s"] = v["local_s"]
    if rec.get("duration_s") is not None:
        sc.timings["bootstrap_duration_s"] = rec["duration_s"]
    say("  the record: events %s; verification (%s, %s s) events %s" % (
        json.dumps(d, sort_keys=True), v.get("outcome"), v.get("duration_s"), json.dumps(ve, sort_keys=True)))
    if sc.events == "down":
        # Nothing reached a receiver; the initramfs run's events wait in the spool, the boot
        # check took them over (and, the receiver still down, spooled them again).
        if got:
            p.append("the receiver got %d events although the node sent them to a closed port" % len(got))
        if d.get("sent") != 0 or not d.get("spooled"):
            p.append("the record's events: %r, expected sent 0 and spooled > 0" % d)
        if v.get("outcome") != "verified":
            p.append("the boot check's outcome is %r, expected verified" % v.get("outcome"))
        return p
    initrd = [(i, e) for i, e in enumerate(got) if (e.get("command"), e.get("stage")) == ("bootstrap", "initramfs")]
    check = [(i, e) for i, e in enumerate(got) if (e.get("command"), e.get("stage")) == ("verify", "system")]
    other = [e for e in got if (e.get("command"), e.get("stage")) not in (("bootstrap", "initramfs"), ("verify", "system"))]
    if other:
        p.append("events of neither run: %r" % [(e.get("command"), e.get("stage"), e.get("kind")) for e in other][:5])
    b, pb, rb = in_order([e for _, e in initrd], "the initramfs bootstrap's events")
    c, pc, rc = in_order([e for _, e in check], "nodestrap verify's events")
    p += pb + pc
    kinds = lambda evs: [e.get("kind") for e in evs]
    phases = lambda evs: [e.get("phase") for e in evs if e.get("kind") == "phase"]
    # The initramfs run: started, its phases in order, finished with 0.
    if not b or b[0].get("kind") != "started":
        p.append("the initramfs run's first event is %r, expected started" % (b[0] if b else None))
    if phases(b) != ["version", "chosen", "staged", "marker"]:
        p.append("the initramfs run's phases: %r, expected version, chosen, staged, marker" % phases(b))
    if not b or b[-1].get("kind") != "finished" or b[-1].get("exit_code") != 0:
        p.append("the initramfs run's last event is %r, expected finished with exit_code 0" % (b[-1] if b else None))
    # The real root's boot check: started, its checks, verified, its verdict, finished with 0.
    ck = kinds(c)
    want = ["started"] + ["check"] * ck.count("check") + ["phase", "verification", "finished"]
    if not ck.count("check") or ck != want:
        p.append("nodestrap verify's events: %r, expected started, check..., phase, verification, finished" % ck)
    else:
        if phases(c) != ["verified"]:
            p.append("nodestrap verify's phase: %r, expected verified" % phases(c))
        if (c[-2].get("outcome") or (c[-2].get("verification") or {}).get("outcome")) != "verified":
            p.append("nodestrap verify's verification event: %r" % c[-2])
        if c[-1].get("exit_code") != 0:
            p.append("nodestrap verify's finished event: %r" % c[-1])
    boot_ids = {e.get("boot_id") for e in b + c}
    if len(boot_ids) != 1 or "" in boot_ids or None in boot_ids:
        p.append("the events' boot IDs: %r, expected one, the same in both runs" % boot_ids)
    if initrd and check and max(i for i, _ in initrd) > min(i for i, _ in check):
        p.append("an initramfs event (line %d) arrived after verify's first (line %d)"
                 % (max(i for i, _ in initrd), min(i for i, _ in check)))
    # Who sent them: the token in the initramfs; the kubelet's certificate once the node joined.
    log = open(w.s.path("sysext-server.log")).read().splitlines()
    who = sorted({l.split(" as=", 1)[1] for l in log if "POST /progress/events 200" in l and " as=" in l})
    say("  the receiver: %d events (%d of the initramfs bootstrap, %d exact repeats; %d of verify, %d repeats); "
        "as %s" % (len(got), len(b), rb, len(c), rc, ", ".join(who) or "?"))
    for name, evs in (("initramfs bootstrap", b), ("verify", c)):
        shown = []
        for e in evs:
            k = e.get("kind") + (" " + e["phase"] if e.get("kind") == "phase" else "")
            if shown and shown[-1][0] == k:
                shown[-1][1] += 1
            else:
                shown.append([k, 1])
        say("    %s, seq 1..%d: %s" % (name, len(evs), ", ".join(k + (" x%d" % n if n > 1 else "") for k, n in shown)))
    # The record: what the bootstrap sent, or spooled and the boot check sent.
    if d.get("spooled") == 0:
        if d.get("sent") != len(b):
            p.append("the record's events.sent is %r, the receiver got %d of the initramfs run" % (d.get("sent"), len(b)))
        say("  none spooled: the initramfs run delivered all %d of its events itself" % len(b))
    elif d.get("spooled"):
        if ve.get("from_spool") != d["spooled"]:
            p.append("the initramfs run spooled %d events; verify took %r from the spool" % (d["spooled"], ve.get("from_spool")))
        if d.get("sent", 0) + d["spooled"] != len(b):
            p.append("the record's events (sent %r + spooled %d) are not the %d the receiver got of the initramfs run"
                     % (d.get("sent"), d["spooled"], len(b)))
        say("  the initramfs run spooled %d of its events; the boot check sent them (from_spool %r)"
            % (d["spooled"], ve.get("from_spool")))
    else:
        p.append("the record has no events: %r" % d)
    if d.get("dropped") or ve.get("dropped"):
        p.append("events dropped: bootstrap %r, verify %r" % (d.get("dropped"), ve.get("dropped")))
    return p


def read_disk(disk, files, dirs=(), links=()):
    """The node's disk as it is now (a raw copy, its journal replayed on the copy): the files
    (bytes, or None when absent), the folders' names and the links' `debugfs stat`."""
    raw = disk + ".read.raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        subprocess.run(["e2fsck", "-fy", raw], capture_output=True)
        stat = lambda p: subprocess.run(["debugfs", "-R", "stat " + p, raw], capture_output=True, text=True).stdout
        return ({f: disk_file(raw, f) for f in files}, {d: disk_ls(raw, d) for d in dirs}, {n: stat(n) for n in links})
    finally:
        os.unlink(raw)


def node_status(cp, name):
    """The Node's (kubeletVersion, containerRuntimeVersion, bootID) as the API server has it, or None."""
    r = cp.kubectl("get", "node", name, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} "
                   "{.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.bootID}", check=False)
    parts = r.stdout.split()
    return tuple(parts) if r.returncode == 0 and len(parts) == 3 else None


def node_told(cp, name):
    """What the boot check told the cluster on Node `name` (docs/verify.md, "On the Node"), as
    kubectl shows it: NodestrapVerified's (status, reason), the nodestrap.io labels, and the
    reasons of the Node's events from nodestrap with their counts."""
    c = '{.status.conditions[?(@.type=="NodestrapVerified")]'
    cond = cp.kubectl("get", "node", name, "-o", "jsonpath=%s.status} %s.reason}" % (c, c), check=False).stdout.split()
    labels = json.loads(cp.kubectl("get", "node", name, "-o", "jsonpath={.metadata.labels}", check=False).stdout or "{}")
    ev = cp.kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name=%s,source=nodestrap" % name,
                    "-o", "jsonpath={range .items[*]}{.reason}={.count} {end}", check=False).stdout.split()
    return tuple(cond), {k: v for k, v in labels.items() if k.startswith("nodestrap.io/")}, ev


def record_of(blob, name):
    """A JSON file from the node's disk, or a problem."""
    try:
        return json.loads(blob.decode()), None
    except (AttributeError, ValueError) as e:
        return None, "%s on the disk is not JSON (%s): %r" % (name, e, (blob or b"")[:200])


def chosen(entries, name):
    """The version of extension `name` in a `chosen` (or known-good `set`) list."""
    return next((c.get("version") for c in entries or [] if c.get("name") == name), None)



def versions(entries):
    """{name: version} of a `chosen` (or known-good `set`) list."""
    return {c.get("name"): c.get("version") for c in entries or []}


def image_file(name, label):
    return "%s-%s-x86-64.raw" % (name, label)


class Second:
    """A verify scenario's two boots in the World's versions: the set each boot's initramfs
    stages (`first`, `second`: {name: label}), what the mirror publishes once the first boot's
    check passed (`publish`, `published` says it), the Debian the step between the boots makes
    os-release claim (`next_os`, or None), the check that fails in the second boot (its line as
    verify logs it), the image it refuses (name, label, file), and what the Node reports once the
    node is back at the first set (`back`: kubelet and runtime versions)."""

    def __init__(self, w, sc):
        current, patch, previous = w.release[CURRENT], w.release[PATCH], w.release[PREVIOUS]
        ctd = "v" + w.containerd
        if sc.mirror == "verify":
            # An image named as the current release with the previous release's kubelet inside.
            self.first = {"kubernetes": patch, "containerd": ctd}
            self.second = {"kubernetes": current, "containerd": ctd}
            self.publish = lambda: w.publish_lie(sc)
            self.published = "the mirror publishes kubernetes %s: the previous release's kubelet inside" % current
            self.next_os = None
            self.failed = 'check kubernetes /usr/bin/kubelet --version: expected version %s, found "Kubernetes %s"' % (
                current.lstrip("v"), previous)
            self.mismatch = "the kubelet check's mismatch"
            self.refused = ("kubernetes", current, w.lying())
            self.back_label = "the Node at %s again" % patch
        else:
            # A runtime for the next Debian, staged while os-release said it, skipped at boot by
            # the real root's systemd-sysext once the update was rolled back.
            nxt = "v" + w.next_containerd
            self.first = {"kubernetes": current, "containerd": ctd}
            self.second = {"kubernetes": current, "containerd": nxt}
            self.publish = lambda: w.publish_next_os_runtime(sc)
            self.published = "the mirror publishes containerd %s for Debian %s only" % (nxt, w.next_os)
            self.next_os = w.next_os
            self.failed = ("check containerd merged for /usr: expected listed by systemd-sysext status, "
                           "found not listed (merged: kubernetes)")
            self.mismatch = "the merge check's mismatch"
            self.refused = ("containerd", nxt, w.next_os_runtime())
            self.back_label = "the Node at containerd %s again" % w.containerd
        self.back = (self.first["kubernetes"], "containerd://" + w.containerd)

    def staged(self, which):
        return "kubernetes=%s containerd=%s activation=staged" % (which["kubernetes"], which["containerd"])

    def describe(self, which):
        """As nodestrap verify names a set: `kubernetes v1.37.1, containerd v1.7.24`."""
        return ", ".join("%s %s" % kv for kv in which.items())



def with_signal(sc, boots):
    """Announce the scenario, then run `boots(listener)` with the port the guest's step between
    the boots connects to (sc.signal_port), closed afterwards."""
    say("\n=== %s: %s" % (sc.name, sc.doc))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    sc.signal_port = listener.getsockname()[1]
    try:
        return boots(listener)
    finally:
        listener.close()

def run_verify(s, sc, accel, boot_timeout):
    """The verify scenarios: boot 1 joins and the boot check passes; the harness publishes the
    new image and tells the guest (sc.signal_port), which removes kubelet.env (sysext-verify-runtime:
    and makes os-release claim the next Debian) and reboots; boot 2's initramfs stages the new
    image, and the boot check finds it does not run as chosen and returns."""
    return with_signal(sc, lambda listener: verify_boots(s, sc, accel, boot_timeout, listener))


def verify_boots(s, sc, accel, boot_timeout, listener):
    w, config, disk, base = prepare(s, sc)
    # Without it the generator pulls nodestrap-initrd.service in only on the first boot.
    base.append("rd.nodestrap=1")
    case = Second(w, sc)
    events, started, said, seen, runtime = [], [], [], [], []
    st = {}
    joining = Joining(w.cp, sc.name)
    t0 = time.time()
    store_files = ["/var/lib/nodestrap/status.json", "/var/lib/nodestrap/known-good.json",
                   "/etc/kubernetes/kubelet.env", "/var/lib/nodestrap-qemu/rebootstrapped", "/etc/os-release"]

    def on_line(now, boots, line):
        if KUBELET_STARTED_RE.search(line) and not started:
            started.append(now)
        m = VERIFY_RE.search(line)
        if m:
            said.append((now, boots, m.group(1)))
        m = CONTAINERD_STARTED_RE.search(line)
        if m:
            runtime.append((now, boots, m.group(1)))
        if "Failed to start nodestrap-verify.s" in line:  # the console's status line cuts it at its width
            st.setdefault("unit failed in boot %d" % boots, now)
        if boots == 1 and "reboot: Restarting system" in line and "first disk" not in st:
            # The disk as the first boot left it (the guest synced and unmounted before this line).
            st["first disk"] = read_disk(disk, store_files)

    def done(boots):
        now = time.time() - t0
        joining.poll(now)
        if boots == 1:
            if "published" not in st:
                if not joining.done() or not any(b == 1 and t.startswith("verified: ") for _, b, t in said):
                    return False
                st["joined"], st["boot 1 Node"] = joining.info, node_status(w.cp, sc.name)
                case.publish()
                st["published"] = now
                say("  %5.1fs  %s" % (now, case.published))
            if "told" not in st:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    return False
                with conn:
                    conn.settimeout(10)
                    conn.sendall(b"published\n")
                st["told"] = now
            return False
        # Boot 2: the Node as the API server reports it, until the boot check's return shows.
        if now - st.get("asked", 0) < 3:
            return False
        st["asked"] = now
        info = node_status(w.cp, sc.name)
        if info and (not seen or seen[-1][2:] != info):
            seen.append((now, boots) + info)
            say("  %5.1fs  the Node reports kubelet %s, %s (boot ID %s)" % ((now,) + info))
        boot1 = (st.get("boot 1 Node") or (None, None, None))[2]
        # A kubelet of this boot reporting the first set's versions (sysext-verify: the lying
        # kubelet says the previous release; sysext-verify-runtime: no kubelet of this boot
        # reports anything until a runtime runs).
        back = next((t for t, b, k, r, bid in seen if b == 2 and (k, r) == case.back and bid != boot1), None)
        if back is None or not any(b == 2 and t.startswith("the node does not run what") for _, b, t in said):
            return False
        st.setdefault("Node back", back)
        # The unit's failure shows on the console right after verify exits; wait for it a little.
        return "unit failed in boot 2" in st or now - back > 30

    boot_timeout += 120  # the second boot: the initramfs bootstraps again, the check and the return
    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events, on_line, done,
                                      "the reboot into the second boot, or the boot check's return",
                                      "the boot check's verdict and %s" % case.back_label)
    kernel = {b: t for t, b, k, _ in reversed(events) if k == "kernel"}
    first_said = lambda b, prefix: next((t for t, bb, x in said if bb == b and x.startswith(prefix)), None)
    figures = {
        "boot 1: kernel to verified": (1, first_said(1, "verified: ")),
        "boot 2: kernel to %s" % case.mismatch: (2, first_said(2, case.failed)),
        "boot 2: kernel to verify's error (returned)": (2, first_said(2, "the node does not run what")),
        "boot 2: kernel to %s" % case.back_label: (2, st.get("Node back")),
    }
    if case.next_os is None:
        figures["boot 2: kernel to the Node at %s (the lie running)" % w.release[PREVIOUS]] = (
            2, next((t for t, b, k, _, _ in seen if b == 2 and k == w.release[PREVIOUS]), None))
    else:
        figures["boot 2: kernel to containerd started again"] = (2, next((t for t, b, _ in runtime if b == 2), None))
    sc.timings = timings(events, started[0] if started else None)
    sc.timings.update(joined(events, joining))
    for k, (b, t) in figures.items():
        if t is not None and b in kernel:
            sc.timings[k] = round(t - kernel[b], 1)
    if "published" in st and "told" in st:
        sc.timings["published to the guest told"] = round(st["told"] - st["published"], 1)
    if not problems:
        problems = check_verify(w, sc, case, events, said, seen, runtime, st, disk)
    sc.proof = seen[-1][2:4] if seen else joining.info
    for k, v in sc.timings.items():
        if k.startswith("boot ") or k.startswith("published"):
            say("  %-56s %6.1f s" % (k, v))
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, started[0] if started else None, problems


def check_verify(w, sc, case, events, said, seen, runtime, st, disk):
    p = []
    first, second = case.first, case.second
    name, label, image = case.refused
    in_boot = lambda b: [t for _, bb, t in said if bb == b]
    at = lambda b, prefix: next((t for t, bb, x in said if bb == b and x.startswith(prefix)), None)
    boot_said = lambda b: [t for _, bb, k, t in events if bb == b and k == "nodestrap"]
    guest_said = lambda b: [t for _, bb, k, t in events if bb == b and k == "guest"]
    # Boot 1: the initramfs stages the first set; the node joins with it; the check passes and
    # the API server confirms it.
    if not any(case.staged(first) in t for t in boot_said(1)):
        p.append("boot 1: the initramfs did not stage %s: %r" % (case.describe(first), [t for t in boot_said(1) if "done" in t]))
    if not st.get("joined") or st["joined"] != case.back:
        p.append("boot 1: the Node joined with %r, expected %r" % (st.get("joined"), case.back))
    if not any(t.startswith("verified: the node runs %s" % case.describe(first)) for t in in_boot(1)):
        p.append("boot 1: no `verified: the node runs %s` from nodestrap verify: %r" % (case.describe(first), in_boot(1)))
    api = "check Node %s nodeInfo.kubeletVersion: expected %s, found %s" % (sc.name, first["kubernetes"], first["kubernetes"])
    if api not in in_boot(1):
        p.append("boot 1: verify did not log %r" % api)
    if not any(b == 1 and w.containerd in x for _, b, x in runtime):
        p.append("boot 1: containerd %s never said it started: %r" % (w.containerd, runtime))
    disk1 = st.get("first disk")
    if not disk1:
        p.append("boot 1 ended without the guest's reboot: its disk was not read")
    else:
        files = disk1[0]
        rec, err = record_of(files["/var/lib/nodestrap/status.json"], "boot 1's status.json")
        kg, err2 = record_of(files["/var/lib/nodestrap/known-good.json"], "boot 1's known-good.json")
        p += [e for e in (err, err2) if e]
        if rec:
            v = rec.get("verification") or {}
            got = (rec.get("phase"), v.get("outcome"), v.get("api"), v.get("api_note"), versions(rec.get("chosen")))
            want = ("verified", "verified", "confirmed", "from /etc/kubernetes/kubelet.conf", first)
            if got != want:
                p.append("boot 1's record (phase, outcome, api, api_note, chosen): %r, expected %r" % (got, want))
        if kg and (versions(kg.get("set")) != first or kg.get("refused")):
            p.append("boot 1's known-good.json: %r" % kg)
        if files["/etc/kubernetes/kubelet.env"] is not None or files["/var/lib/nodestrap-qemu/rebootstrapped"] is None:
            p.append("boot 1: the guest did not remove kubelet.env before its reboot")
        if case.next_os and 'VERSION_ID="%s"' % case.next_os not in (files["/etc/os-release"] or b"").decode():
            p.append("boot 1: the guest's os-release does not say Debian %s for the next boot: %r"
                     % (case.next_os, files["/etc/os-release"]))
    # Boot 2: the initramfs stages the second set; the boot check finds what does not run as
    # chosen, refuses that image and returns to the first set.
    if not any(case.staged(second) in t for t in boot_said(2)):
        p.append("boot 2: the initramfs did not stage %s: %r" % (case.describe(second), [t for t in boot_said(2) if "done" in t]))
    if case.failed not in in_boot(2):
        p.append("boot 2: verify did not log %r: %r" % (case.failed, in_boot(2)))
    if not any(t.startswith("%s %s (sha256-" % (name, label)) and "refused" in t for t in in_boot(2)):
        p.append("boot 2: verify did not refuse %s %s" % (name, label))
    err = [t for t in in_boot(2) if t.startswith("the node does not run what")]
    if not err or "returned to the known-good set" not in err[0] or "(%s)" % case.describe(first) not in err[0]:
        p.append("boot 2: verify's error does not name the return to %s: %r" % (case.describe(first), err))
    if "unit failed in boot 2" not in st:
        p.append("boot 2: systemd did not report nodestrap-verify.service failed")
    if "unit failed in boot 1" in st:
        p.append("boot 1: nodestrap-verify.service failed")
    if case.next_os:
        # The initramfs bootstrapped for the next Debian; the real root booted Debian 13 again
        # (the stand-in's line) and merged without containerd, which ran only after the return.
        host = "node ID=debian VERSION_ID=%s " % case.next_os
        if not any(t.startswith(host) for t in boot_said(2)):
            p.append("boot 2: the initramfs did not read os-release as Debian %s: %r"
                     % (case.next_os, [t for t in boot_said(2) if t.startswith("node ID=")]))
        if not any(t.startswith('the OS update rolled back: os-release VERSION_ID="13" again') for t in guest_said(2)):
            p.append("boot 2: no line of the rollback's stand-in: %r" % guest_said(2))
        error_at = at(2, "the node does not run what")
        ran = [(t, x) for t, b, x in runtime if b == 2]
        if not ran or error_at is None or ran[0][0] < error_at or w.containerd not in ran[0][1]:
            p.append("boot 2: containerd %s did not start after verify's return (verify's error at %r): %r"
                     % (w.containerd, error_at, ran))
    final = seen[-1] if seen else None
    if not final or final[2:4] != case.back:
        p.append("the Node reports %r at the end, expected %r" % (final, case.back))
    # The disk the node left.
    files, dirs, links = read_disk(disk, ["/var/lib/nodestrap/status.json", "/var/lib/nodestrap/known-good.json",
                                          "/etc/kubernetes/kubelet.env"],
                                   ["/opt/extensions/kubernetes", "/opt/extensions/containerd", "/etc/extensions",
                                    "/etc/kubernetes", "/var/lib/nodestrap", "/var/lib/nodestrap-qemu"],
                                   ["/etc/extensions/kubernetes.raw", "/etc/extensions/containerd.raw", "/etc/os-release"])
    rec, e1 = record_of(files["/var/lib/nodestrap/status.json"], "status.json")
    kg, e2 = record_of(files["/var/lib/nodestrap/known-good.json"], "known-good.json")
    p += [e for e in (e1, e2) if e]
    if rec:
        v = rec.get("verification") or {}
        r = v.get("returned") or {}
        got = (versions(rec.get("chosen")), v.get("outcome"), v.get("api"), r.get("result"), versions(r.get("to")))
        want = (second, "mismatch", "skipped", "merged", first)
        if got != want:
            p.append("the record (chosen, outcome, api, returned.result, returned to): %r, expected %r" % (got, want))
        # The first failed check as the record keeps it: what was expected and what ran.
        bad = next(("check %s: expected %s, found %s" % (c.get("what"), c.get("expected"), c.get("running"))
                    for c in v.get("checks") or [] if not c.get("ok")), None)
        if bad != case.failed:
            p.append("the record's first failed check is %r, expected %r" % (bad, case.failed))
        if final and v.get("boot_id") != final[4]:
            p.append("the record's boot ID %r is not the one the Node reports, %r" % (v.get("boot_id"), final[4]))
    if kg:
        digest = "sha256-" + hashlib.sha256(open(image, "rb").read()).hexdigest()
        refused = [(x.get("name"), x.get("version"), x.get("digest")) for x in kg.get("refused") or []]
        if refused != [(name, label, digest)]:
            p.append("known-good.json refuses %r, expected %s %s %s" % (refused, name, label, digest))
        if versions(kg.get("set")) != first:
            p.append("known-good.json's set is %r, expected %s" % (kg.get("set"), case.describe(first)))
        # The refused image raised its extension's version floor; the refusal puts it back. (A
        # nodestrap from before version floors writes no `floor` at all; one since always does.)
        floor = next(((f.get("version"), f.get("how")) for f in kg.get("floor") or [] if f.get("name") == name), None)
        if "floor" in kg and floor != (first[name], "back"):
            p.append("known-good.json's floor of %s is %r, expected %s back" % (name, floor, first[name]))
    for n in ("kubernetes", "containerd"):
        want = sorted({image_file(n, first[n]), image_file(n, second[n])})
        if dirs["/opt/extensions/" + n] != want:
            p.append("/opt/extensions/%s holds %r, expected %r" % (n, dirs["/opt/extensions/" + n], want))
        if image_file(n, first[n]) not in links["/etc/extensions/%s.raw" % n]:
            p.append("/etc/extensions/%s.raw does not name %s: %r" % (n, first[n], links["/etc/extensions/%s.raw" % n][:300]))
    if "KUBELET_VERSION=%s" % second["kubernetes"] not in (files["/etc/kubernetes/kubelet.env"] or b"").decode():
        p.append("kubelet.env on disk (it keeps what the bootstrap chose): %r" % files["/etc/kubernetes/kubelet.env"])
    if case.next_os and ('"../usr/lib/os-release"' not in links["/etc/os-release"]
                         or "os-release.rolled-back" in dirs["/var/lib/nodestrap-qemu"]):
        p.append("/etc/os-release is not Debian's link again: %r; /var/lib/nodestrap-qemu holds %r"
                 % (links["/etc/os-release"][:300], dirs["/var/lib/nodestrap-qemu"]))
    for d, names in dirs.items():
        left = [n for n in names if ".nodestrap-" in n]
        if left:
            p.append("temp files left in %s: %r" % (d, left))
    # What the failed check told the Node (docs/verify.md, "On the Node").
    cond, labels, ev = node_told(w.cp, sc.name)
    if cond != ("False", "ReturnedToKnownGood") or not any(e.startswith("ReturnedToKnownGood=") for e in ev):
        p.append("the Node was told %r, events %r; expected (False, ReturnedToKnownGood) and a ReturnedToKnownGood "
                 "event" % (cond, ev))
    else:
        say("  the Node: NodestrapVerified %s (%s), events %s" % (cond[0], cond[1], " ".join(ev)))
    return p


DOWNLOADED_RE = re.compile(r"^downloaded (\S+): ")
CHECKED_RE = re.compile(r": \d+ bytes from (\S+), SHA-256 matches")


def figures(w, sc, events):
    """One line of the scenario's figures for bench/boot (qemu/run's results file carries no
    `local_s`): `  figures NAME: {json}`; with the MiB of the images the mirror offers for the
    current release (kubernetes and containerd: what a node that joins downloads), and the
    seconds nodestrap's first run spent between each image's last byte and its `contents
    checked` line (for a DDI: its layout, signature and hash tree proven; as the console's
    lines arrived), summed."""
    keys = ("kernel_to_kubelet", "kernel_to_node", "kernel_to_pod", "nodestrap", "nodestrap_run",
            "bootstrap_duration_s", "verify_duration_s", "verify_local_s")
    fig = {k: sc.timings.get(k) for k in keys}
    got, checked = {}, {}
    for t, b, k, x in events:
        if b == 1 and k == "nodestrap":
            m = DOWNLOADED_RE.search(x) or CHECKED_RE.search(x)
            if m:
                (got if m.re is DOWNLOADED_RE else checked).setdefault(m.group(1), t)
    fig["check_s"] = round(sum(checked[u] - got[u] for u in checked if u in got), 1) if checked else None
    signed = signed_as(sc)
    fig["images_mib"] = round(sum(os.path.getsize(w.image(n, wh, signed))
                                  for n, wh in (("kubernetes", CURRENT), ("containerd", None))) / 2 ** 20, 1)
    say("  figures %s: %s" % (sc.name, json.dumps(fig, sort_keys=True)))


def signed_as(sc):
    """What World.image's `signed` is for the scenario's mirror: False (plain images), True (the
    signed DDIs) or "usr" (the /usr-partition DDIs)."""
    if sc.trust != "signed":
        return False
    return getattr(sc, "ddi", None) or True


def pem_der(pem):
    """The DER of the first certificate of a PEM text."""
    body = pem.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    return base64.b64decode("".join(body.split()))


def trust_report(lines, boot):
    """qemu/guest/sysext/trust-report's lines of one boot (`lines`: (boot, text) as
    TRUST_REPORT_RE took them from the console): {"ExecStart", "unit", "status", "verity.d":
    text, "journal", "kernel": [lines], "end": bool}."""
    r = {"journal": [], "kernel": [], "end": False}
    for b, t in lines:
        if b != boot:
            continue
        if t == "end":
            r["end"] = True
        elif t.startswith("journal: ") or t.startswith("kernel: "):
            key, _, line = t.partition(": ")
            r[key].append(line)
        else:
            key, _, rest = t.partition(" ")
            r.setdefault(key, rest)
    return r


def ddi_partitions(path):
    """A DDI's partitions as its GPT lists them (512-byte sectors, as systemd-repart writes
    them): [(type GUID, label, first sector, last sector)], or [] for no GPT."""
    with open(path, "rb") as f:
        f.seek(512)
        hdr = f.read(92)
        if hdr[:8] != b"EFI PART":
            return []
        lba, count, size = struct.unpack_from("<QII", hdr, 72)
        f.seek(lba * 512)
        table = f.read(count * size)
    parts = []
    for i in range(count):
        e = table[i * size:(i + 1) * size]
        if e[:16] == bytes(16):
            continue
        first, last = struct.unpack_from("<QQ", e, 32)
        parts.append((str(uuid.UUID(bytes_le=e[:16])), e[56:128].decode("utf-16-le").rstrip("\0"), first, last))
    return parts


def ddi_root_hash(path):
    """The root hash a signed DDI's signature partition names (its JSON's `rootHash`)."""
    for _, label, first, last in ddi_partitions(path):
        if label.endswith("-verity-sig"):
            with open(path, "rb") as f:
                f.seek(first * 512)
                return json.loads(f.read((last - first + 1) * 512).rstrip(b"\0")).get("rootHash")
    return None


# The Discoverable Partitions Specification's x86-64 /usr types, as systemd-repart labels them.
USR_PARTITIONS = [("8484680c-9521-48c6-9c11-b0720656f69e", "usr-x86-64"),
                  ("77ff5f63-e7b6-4633-acf4-1565b864c0e6", "usr-x86-64-verity"),
                  ("e7bb33fb-06cf-4e81-8273-e543b413e2e2", "usr-x86-64-verity-sig")]


def usr_layout(w):
    """The DDIs a /usr scenario's mirror serves are /usr-partition DDIs (a usr partition, its
    verity and signature partitions, nothing else): problems, and {file name: root hash}."""
    p, hashes = [], {}
    for name, which in (("kubernetes", CURRENT), ("containerd", None)):
        path = w.image(name, which, "usr")
        parts = [(t, label) for t, label, _, _ in ddi_partitions(path)]
        if parts != USR_PARTITIONS:
            p.append("%s: the served DDI's partitions are %r, expected %r" % (path, parts, USR_PARTITIONS))
        hashes[os.path.basename(path)] = ddi_root_hash(path)
        say("  %s (%.1f MiB): partitions %s; root hash %s" % (
            os.path.basename(path), os.path.getsize(path) / 2 ** 20, ", ".join(label for _, label in parts),
            hashes[os.path.basename(path)]))
    return p, hashes


def check_usr_refused(w, sc, initramfs_failures, failures, disk):
    """sysext-signed-usr (systemd 257): the served DDIs are /usr-partition DDIs; the initramfs run
    (its failure came before the real root's first attempt reported) refused one of them with
    nodestrap's reason, and every failure after it says the same; nothing of either image is on
    the disk, nothing linked in /etc/extensions, no kubelet.env (check() saw the kubelet, the
    Node and the attempts' results)."""
    p, _ = usr_layout(w)
    refused = [f for f in initramfs_failures if sc.fails in f]
    say("  the initramfs run: %s" % (refused[0] if refused else "-"))
    say("  failures with that reason: %d of %d (the initramfs run and the real root's retries)"
        % (len([f for f in failures if sc.fails in f]), len(failures)))
    if not refused:
        p.append("the initramfs run did not refuse a /usr DDI with %r: %r" % (sc.fails, initramfs_failures))
    other = [f for f in failures if sc.fails not in f]
    if other:
        p.append("failures for another reason: %r" % other[:3])
    files, dirs, _ = read_disk(disk, ["/etc/kubernetes/kubelet.env", "/var/lib/nodestrap/status.json"],
                               ["/opt/extensions/kubernetes", "/opt/extensions/containerd", "/etc/extensions"])
    for d, names in dirs.items():
        if names:
            p.append("%s holds %r after the refusal, expected nothing" % (d, names))
    if files["/etc/kubernetes/kubelet.env"] is not None:
        p.append("kubelet.env exists after the refusal")
    rec, _ = record_of(files["/var/lib/nodestrap/status.json"], "status.json")
    if rec:
        say("  the last attempt's record: phase %s, chosen %r" % (rec.get("phase"), versions(rec.get("chosen"))))
    return p


def merged_usr(status):
    """The extensions `systemd-sysext status --json=short` lists for /usr (sorted), or the text."""
    try:
        for h in json.loads(status):
            if h.get("hierarchy") == "/usr":
                e = h.get("extensions")
                return sorted(e) if isinstance(e, list) else e
    except (TypeError, ValueError, AttributeError):
        pass
    return "unreadable: %r" % (status,)


def check_trust(w, sc, report, rec, cert, dropin, boot, trusted=None):
    """A signed boot that merged: what the initramfs run recorded (signed mode, the strict
    policy in the drop-in, each image signed by the node's certificate and staged as the signed
    DDI's digest), the certificate and the drop-in on the disk, and what the real root's
    systemd-sysext did at boot `boot` (its command line with the policy, success, both
    extensions merged for /usr). `trusted`: the names nodestrap gave the configured
    certificates in /etc/verity.d (default: the node's certificate alone)."""
    p = []
    kind = signed_as(sc)
    trusted = sorted(trusted or [w.cert_file])
    d = {x.get("what"): (x.get("value"), x.get("source")) for x in (rec or {}).get("decisions") or []}
    tr = d.get("sysext-trust") or ("", "")
    if not tr[0].startswith("signed (%d certificate" % len(trusted)):
        p.append("the record's sysext-trust decision is %r, expected signed with %d certificate(s)" % (tr, len(trusted)))
    pol = d.get("image-policy") or ("", "")
    if pol[0] != POLICY or not (pol[1] or "").endswith(POLICY_DROPIN):
        p.append("the record's image-policy decision is %r, expected %s from %s" % (pol, POLICY, POLICY_DROPIN))
    tail = "(SHA-256 %s), trusted through /etc/verity.d/%s" % (w.cert_fp, w.cert_file)
    chosen_ = {c.get("name"): c for c in (rec or {}).get("chosen") or []}
    for name, which in (("kubernetes", CURRENT), ("containerd", None)):
        v, src = d.get(name + "-trust") or ("", "")
        f = os.path.basename(w.image(name, which, kind))
        if not v.startswith("signed by ") or not v.endswith(tail) or src != f:
            p.append("the record's %s-trust decision is %r, expected `signed by … %s` from %s" % (name, (v, src), tail, f))
        got = (chosen_.get(name) or {}).get("digest")
        if got != w.digest(w.image(name, which, kind)):
            p.append("the record chose %s with digest %r, not the signed DDI's %s"
                     % (name, got, w.digest(w.image(name, which, kind))))
    if cert is None or pem_der(cert.decode()) != pem_der(open(w.verity_cert).read()):
        p.append("/etc/verity.d/%s on the disk is not the node's certificate: %r" % (w.cert_file, (cert or b"")[:80]))
    want = "ExecStart=systemd-sysext refresh --image-policy=%s\n" % POLICY
    if dropin is None or want not in dropin.decode() or "ExecStart=\n" not in dropin.decode():
        p.append("the drop-in %s on the disk does not reset ExecStart= and set %r: %r" % (POLICY_DROPIN, want, dropin))
    # What systemd-sysext did at that boot, as the guest's report has it.
    if not report["end"]:
        p.append("boot %d: no report of what systemd-sysext did (trust-report)" % boot)
        return p
    p += check_policy_ran(report, boot)
    if sorted(report.get("unit", "").split()) != ["ActiveState=active", "ExecMainStatus=0", "Result=success"]:
        p.append("boot %d: systemd-sysext.service ended %r" % (boot, report.get("unit")))
    if merged_usr(report.get("status")) != ["containerd", "kubernetes"]:
        p.append("boot %d: systemd-sysext status lists %r for /usr, expected containerd and kubernetes"
                 % (boot, report.get("status")))
    if sorted(report.get("verity.d", "").split()) != trusted:
        p.append("boot %d: /etc/verity.d holds %r, expected %s" % (boot, report.get("verity.d"), " ".join(trusted)))
    # Each image activated as dm-verity: the kernel refused the signature first (its keyrings do
    # not know a test certificate), systemd's userspace check against /etc/verity.d accepted it,
    # and erofs was mounted from the verity device, not from the loop device.
    for name, which in (("kubernetes", CURRENT), ("containerd", None)):
        rh = ddi_root_hash(w.image(name, which, kind))
        kernel_no = "device-mapper: reload ioctl on %s-verity (" % rh
        if not any(l.startswith(kernel_no) and l.endswith("failed: Required key not available")
                   for l in report["journal"]):
            p.append("boot %d: no activation of %s's verity device (root hash %s) in systemd-sysext's journal: %r"
                     % (boot, name, rh, report["journal"]))
    for want in ("Using extensions 'containerd.raw', 'kubernetes.raw'.", "Merged extensions into '/usr'."):
        if want not in report["journal"]:
            p.append("boot %d: systemd-sysext's journal lacks %r: %r" % (boot, want, report["journal"]))
    on_dm = [l for l in report["kernel"] if re.match(r"erofs: \(device dm-\d+\): mounted", l)]
    if len(on_dm) != 2:
        p.append("boot %d: erofs was mounted from %d verity devices, expected 2: %r" % (boot, len(on_dm), report["kernel"]))
    return p


def check_policy_ran(report, boot):
    """The drop-in was in effect: systemd ran systemd-sysext.service's ExecStart= of nodestrap's
    drop-in (unqualified, as the drop-in writes it), with the strict policy."""
    want = "{ path=systemd-sysext ; argv[]=systemd-sysext refresh --image-policy=%s ;" % POLICY
    if not report.get("ExecStart", "").startswith(want):
        return ["boot %d: systemd-sysext.service's ExecStart is %r, expected %r…" % (boot, report.get("ExecStart"), want)]
    return []


def check_trust_disk(w, sc, lines, disk, boot):
    files, _, _ = read_disk(disk, ["/var/lib/nodestrap/status.json", "/etc/verity.d/" + w.cert_file, POLICY_DROPIN])
    rec, err = record_of(files["/var/lib/nodestrap/status.json"], "status.json")
    if err:
        return [err]
    report = trust_report(lines, boot)
    show_report(report, boot)
    return check_trust(w, sc, report, rec, files["/etc/verity.d/" + w.cert_file], files[POLICY_DROPIN], boot)


def show_report(report, boot):
    argv = re.search(r"argv\[\]=(.*?) ;", report.get("ExecStart", ""))
    say("  boot %d: systemd-sysext.service ran %s; %s; /usr: %s" % (
        boot, argv.group(1) if argv else repr(report.get("ExecStart")), report.get("unit", "?").strip(),
        merged_usr(report.get("status"))))
    for line in report["journal"]:
        say("    journal: " + line)
    for line in report["kernel"]:
        if "loop" not in line or "verity" in line:
            say("    kernel: " + line)


def run_signed(s, sc, accel, boot_timeout):
    """sysext-signed: boot 1 stages signed DDIs from the initramfs (two signers trusted), merges
    them under the strict policy at boot, joins and passes the boot check; the harness then tells
    the guest (sc.signal_port), which takes the second signer out of the configuration, runs
    nodestrap again (nodestrap-patch.service: its certificate goes), puts that signer's image
    under the staged kubernetes image's name and reboots; boot 2 shows what systemd-sysext and the
    boot check make of it."""
    return with_signal(sc, lambda listener: signed_boots(s, sc, accel, boot_timeout, listener))


def signed_boots(s, sc, accel, boot_timeout, listener):
    w, config, disk, base = prepare(s, sc)
    events, started, said, report = [], [], [], []
    st = {}
    joining = Joining(w.cp, sc.name)
    t0 = time.time()
    first_files = ["/var/lib/nodestrap/status.json", "/var/lib/nodestrap/known-good.json", BOOT1_RECORD,
                   "/etc/verity.d/" + w.cert_file, "/etc/verity.d/" + w.imposter_file, POLICY_DROPIN,
                   "/var/lib/nodestrap-qemu/swapped"]

    def on_line(now, boots, line):
        if KUBELET_STARTED_RE.search(line):
            started.append((now, boots))
        m = VERIFY_RE.search(line)
        if m:
            said.append((now, boots, m.group(1)))
        m = TRUST_REPORT_RE.search(line)
        if m:
            report.append((boots, m.group(1)))
            return
        m = PATCH_RUN_RE.search(line)
        if m:
            st.setdefault("patch run", []).append(m.group(1).strip())
            return
        for unit in ("nodestrap-verify", "systemd-sysext"):
            # systemd's status line, which cuts a unit's name at the console's width.
            if "Failed to start %s.s" % unit in line:
                st.setdefault("%s failed in boot %d" % (unit, boots), now)
        if boots == 1 and "reboot: Restarting system" in line and "first disk" not in st:
            # The disk as the first boot left it (the guest synced before this line).
            st["first disk"] = read_disk(disk, first_files, ["/opt/extensions/kubernetes", IMPOSTER_DIR])

    def reported(boot):
        return trust_report(report, boot)["end"]

    def done(boots):
        now = time.time() - t0
        if boots == 1:
            joining.poll(now)
            if "nodestrap-verify failed in boot 1" in st:
                return True  # the checks say why
            if "told" in st:
                return False
            if not joining.done() or not reported(1) or not any(
                    b == 1 and t.startswith("verified: ") for _, b, t in said):
                return False
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return False
            with conn:
                conn.settimeout(10)
                conn.sendall(b"swap\n")
            st["told"], st["joined"], st["boot 1 Node"] = now, joining.info, node_status(w.cp, sc.name)
            say("  %5.1fs  the guest is told to untrust the second signer, run nodestrap, swap in its image and reboot"
                % now)
            return False
        if any(b == 2 and t.startswith("verified: ") for _, b, t in said):
            return True  # not what should happen: the checks say so
        if not reported(2) or not any(b == 2 and t.startswith("the node does not run what") for _, b, t in said):
            return False
        st.setdefault("boot 2 reported", now)
        # The unit's failure shows on the console right after verify exits; wait for it a little.
        return "nodestrap-verify failed in boot 2" in st or now - st["boot 2 reported"] > 30

    # The first boot waits for the join, the check, the report and nodestrap's second run (which
    # proves both images again); then a second boot.
    boot_timeout += 300
    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events, on_line, done,
                                      "the reboot into the second boot",
                                      "the join, the boot check and the report, or the second boot's verdict")
    kernel = {b: t for t, b, k, _ in reversed(events) if k == "kernel"}
    sc.timings = timings(events, next((t for t, b in started if b == 1), None))
    sc.timings.update(joined(events, joining))
    run_done = next((RUN_DONE_RE.search(x) for _, b, k, x in events
                     if b == 1 and k == "nodestrap" and RUN_DONE_RE.search(x)), None)
    if run_done:
        sc.timings["nodestrap_run"] = float(run_done.group(1))
    first = st.get("first disk")
    rec1, _ = record_of(first[0][BOOT1_RECORD], "boot 1's status.json") if first else (None, None)
    v1 = (rec1 or {}).get("verification") or {}
    for k, v in (("verify_duration_s", v1.get("duration_s")), ("verify_local_s", v1.get("local_s")),
                 ("bootstrap_duration_s", (rec1 or {}).get("duration_s"))):
        if v is not None:
            sc.timings[k] = v
    at = lambda b, prefix: next((t for t, bb, x in said if bb == b and x.startswith(prefix)), None)
    for k, (b, t) in {"boot 1: kernel to verified": (1, at(1, "verified: ")),
                      "boot 2: kernel to systemd-sysext.service failed": (2, st.get("systemd-sysext failed in boot 2")),
                      "boot 2: kernel to verify's mismatch": (2, at(2, "the node does not run what"))}.items():
        if t is not None and b in kernel:
            sc.timings[k] = round(t - kernel[b], 1)
    if not problems:
        problems = check_signed(w, sc, events, said, started, st, disk, joining, report)
    sc.proof = st.get("joined") or joining.info
    figures(w, sc, events)
    for k, v in sc.timings.items():
        if k.startswith("boot "):
            say("  %-56s %6.1f s" % (k, v))
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, sc.timings.get("kernel_to_kubelet"), problems


def check_signed(w, sc, events, said, started, st, disk, joining, lines):
    p = []
    current = w.release[CURRENT]
    fname = "kubernetes-%s-x86-64.raw" % current
    image = "/opt/extensions/kubernetes/" + fname
    trusted, imposter = w.digest(w.image("kubernetes", CURRENT, True)), w.digest(w.imposter())
    in_boot = lambda b: [t for _, bb, t in said if bb == b]
    boot_said = lambda b: [t for _, bb, k, t in events if bb == b and k == "nodestrap"]
    # Boot 1: the initramfs staged the signed DDIs, systemd-sysext merged them under the policy,
    # the kubelet started and joined with the chosen versions, the boot check verified.
    staged = "kubernetes=%s containerd=v%s activation=staged" % (current, w.containerd)
    if not any(staged in t for t in boot_said(1)):
        p.append("boot 1: the initramfs did not stage %r: %r" % (staged, [t for t in boot_said(1) if "done" in t]))
    if not any(b == 1 for _, b in started):
        p.append("boot 1: the kubelet never started")
    want = (current, "containerd://" + w.containerd)
    if not st.get("joined") or tuple(st["joined"]) != want:
        p.append("boot 1: the Node joined with %r, expected %r" % (st.get("joined"), want))
    if joining.running is None:
        p.append("boot 1: the static pod's mirror pod never ran")
    if not any(t.startswith("verified: the node runs kubernetes %s, containerd v%s" % (current, w.containerd))
               for t in in_boot(1)):
        p.append("boot 1: no `verified:` from nodestrap verify: %r" % in_boot(1))
    if "nodestrap-verify failed in boot 1" in st:
        p.append("boot 1: nodestrap-verify.service failed")
    first = st.get("first disk")
    if not first:
        p.append("boot 1 ended without the guest's reboot: its disk was not read")
        return p
    files, dirs, _ = first
    # Boot 1's record as the boot check left it (swap-image saved it before nodestrap ran again).
    rec, e1 = record_of(files[BOOT1_RECORD], "boot 1's status.json")
    kg1, e2 = record_of(files["/var/lib/nodestrap/known-good.json"], "boot 1's known-good.json")
    p += [e for e in (e1, e2) if e]
    report1 = trust_report(lines, 1)
    show_report(report1, 1)
    # Both signers trusted in boot 1: both certificates installed, both images signed by the first.
    p += check_trust(w, sc, report1, rec, files["/etc/verity.d/" + w.cert_file], files[POLICY_DROPIN], 1,
                     trusted=[w.cert_file, w.imposter_file])
    # The run after the second signer left the configuration (nodestrap-patch.service on the
    # running node): signed mode with one certificate, nothing to change in the images, and the
    # second signer's certificate gone from /etc/verity.d before the swap.
    again, e3 = record_of(files["/var/lib/nodestrap/status.json"], "the status.json of the run after boot 1")
    p += [e3] if e3 else []
    if again:
        d = {x.get("what"): x.get("value") for x in again.get("decisions") or []}
        got = (again.get("phase"), (d.get("sysext-trust") or "").split(")")[0] + ")", d.get("activation"))
        say("  the run after the second signer left the configuration: phase %s, trust %r, activation %s" % got)
        if got != ("verified", "signed (1 certificate(s)", "unchanged"):
            p.append("the run after the second signer left the configuration recorded (phase, trust, activation) %r, "
                     "expected verified, signed (1 certificate(s)), unchanged" % (got,))
    if files["/etc/verity.d/" + w.imposter_file] is not None:
        p.append("/etc/verity.d/%s (the second signer's) was still there at the reboot" % w.imposter_file)
    for t in st.get("patch run", []):
        say("    patch run: " + t)
    if not any("/etc/verity.d/%s: removed: no longer a configured certificate" % w.imposter_file in t
               for t in st.get("patch run", [])):
        p.append("boot 1: nodestrap's run after the rotation did not say it removed /etc/verity.d/%s: %r"
                 % (w.imposter_file, st.get("patch run")))
    if rec:
        v = rec.get("verification") or {}
        got = (rec.get("phase"), v.get("outcome"), v.get("api"))
        if got != ("verified", "verified", "confirmed"):
            p.append("boot 1's record (phase, outcome, api): %r, expected verified, verified, confirmed" % (got,))
    if kg1 and (versions(kg1.get("set")) != {"kubernetes": current, "containerd": "v" + w.containerd}
                or kg1.get("refused")):
        p.append("boot 1's known-good.json: %r" % kg1)
    # At the reboot the imposter had moved from where it was planted to the staged name.
    if dirs["/opt/extensions/kubernetes"] != [fname] or dirs[IMPOSTER_DIR] != []:
        p.append("boot 1: /opt/extensions/kubernetes holds %r, %s %r" % (
            dirs["/opt/extensions/kubernetes"], IMPOSTER_DIR, dirs[IMPOSTER_DIR]))
    if files["/var/lib/nodestrap-qemu/swapped"] is None:
        p.append("boot 1: the guest rebooted without swapping the image")
    # Boot 2: another signer's image under the staged name. No bootstrap runs (kubelet.env is
    # there); systemd-sysext refuses it under the strict policy and merges nothing at all, so
    # neither the kubelet nor containerd runs; the boot check finds the image changed and the
    # merge empty, has nothing to return to, records the mismatch and fails.
    if boot_said(2) and any("nodestrap: sysext done" in t for t in boot_said(2)):
        p.append("boot 2: a bootstrap ran: %r" % [t for t in boot_said(2) if "done" in t])
    report2 = trust_report(lines, 2)
    show_report(report2, 2)
    if not report2["end"]:
        p.append("boot 2: no report of what systemd-sysext did (trust-report)")
    else:
        # As systemd 257 logs it at its default level: the images are activated in no fixed
        # order; the kernel refuses the imposter's root hash signature (as it refused the
        # trusted ones in boot 1), the userspace check against /etc/verity.d refuses it too
        # (silently at this level), no file system is mounted from its verity device, and the
        # whole merge fails: no extension at all, containerd included (its verity device may
        # have been set up before the imposter's failed).
        p += check_policy_ran(report2, 2)
        if merged_usr(report2.get("status")) != "none":
            p.append("boot 2: systemd-sysext status lists %r for /usr, expected none" % report2.get("status"))
        if sorted(report2.get("unit", "").split()) != ["ActiveState=failed", "ExecMainStatus=1", "Result=exit-code"]:
            p.append("boot 2: systemd-sysext.service ended %r, expected failed, exit code 1" % report2.get("unit"))
        no_key = re.compile(r"device-mapper: reload ioctl on ([0-9a-f]{64})-verity \(253:(\d+)\) failed: "
                            r"Required key not available$")
        imposter_rh, containerd_rh = ddi_root_hash(w.imposter()), ddi_root_hash(w.image("containerd", None, True))
        said_ = [l for l in report2["journal"] if not l.startswith("systemd-sysext.service: ")
                 and not l.startswith(("Starting ", "Failed to start ", "Finished "))]
        refused = [no_key.match(l) for l in said_ if no_key.match(l)]
        tried = {m.group(1): int(m.group(2)) for m in refused}
        if (imposter_rh not in tried or set(tried) - {imposter_rh, containerd_rh}
                or said_ != [m.group(0) for m in refused] + ["Failed to merge hierarchies"]):
            p.append("boot 2: systemd-sysext logged %r, expected the kernel's refusal of the imposter's root hash %s "
                     "(and of containerd's %s, if it came first), then `Failed to merge hierarchies`"
                     % (said_, imposter_rh, containerd_rh))
        if imposter_rh in tried and any(l.startswith("erofs: (device dm-%d)" % tried[imposter_rh])
                                        for l in report2["kernel"]):
            p.append("boot 2: a file system was mounted from the imposter's verity device dm-%d: %r"
                     % (tried[imposter_rh], report2["kernel"]))
        if any("Merged extensions" in l or "Using extensions" in l for l in report2["journal"]):
            p.append("boot 2: systemd-sysext merged something: %r" % report2["journal"])
    if "systemd-sysext failed in boot 2" not in st:
        p.append("boot 2: systemd did not report systemd-sysext.service failed")
    if any(b == 2 for _, b in started):
        p.append("boot 2: a kubelet started, though nothing should have merged")
    check_line = "check kubernetes image %s: expected %s, found %s" % (image, trusted, imposter)
    if check_line not in in_boot(2):
        p.append("boot 2: verify did not log %r: %r" % (check_line, in_boot(2)))
    err = [t for t in in_boot(2) if t.startswith("the node does not run what")]
    want_err = ("the node does not run what /var/lib/nodestrap/status.json chose: kubernetes image %s: expected %s, "
                "found %s; nothing to return to: the known-good set itself does not run as recorded" % (image, trusted, imposter))
    if not err or not err[0].startswith(want_err):
        p.append("boot 2: verify's error is %r, expected %r…" % (err, want_err))
    if "nodestrap-verify failed in boot 2" not in st:
        p.append("boot 2: systemd did not report nodestrap-verify.service failed")
    # The Node: no kubelet of boot 2 ever reported (its boot ID is still boot 1's).
    now = node_status(w.cp, sc.name)
    boot1 = (st.get("boot 1 Node") or (None, None, None))[2]
    if not now or now[2] != boot1:
        p.append("the Node at the end reports %r; boot 1's boot ID was %r" % (now, boot1))
    # The disk after boot 2: the record says mismatch, naming the image and both digests; the
    # image is not refused for good (the file changed on the node is not the image's fault);
    # nothing changed in /opt/extensions or /etc/extensions.
    files, dirs, links = read_disk(disk, ["/var/lib/nodestrap/status.json", "/var/lib/nodestrap/known-good.json"],
                                   ["/opt/extensions/kubernetes", "/opt/extensions/containerd", "/etc/extensions",
                                    "/etc/verity.d"], ["/etc/extensions/kubernetes.raw"])
    rec2, e1 = record_of(files["/var/lib/nodestrap/status.json"], "status.json")
    kg2, e2 = record_of(files["/var/lib/nodestrap/known-good.json"], "known-good.json")
    p += [e for e in (e1, e2) if e]
    if rec2:
        v = rec2.get("verification") or {}
        bad = [(c.get("what"), c.get("expected"), c.get("running")) for c in v.get("checks") or [] if not c.get("ok")]
        say("  the record after boot 2: phase %s, outcome %s, api %s, returned %r; failed checks:" % (
            rec2.get("phase"), v.get("outcome"), v.get("api"), v.get("returned")))
        for what, exp, run_ in bad:
            say("    %s: expected %s, found %s" % (what, exp, run_))
        got = (rec2.get("phase"), v.get("outcome"), v.get("api"), v.get("returned"))
        if got != ("done", "mismatch", "skipped", None):
            p.append("the record after boot 2 (phase, outcome, api, returned): %r, expected done, mismatch, skipped, None"
                     % (got,))
        if not bad or bad[0] != ("kubernetes image " + image, trusted, imposter):
            p.append("the record's first failed check is %r, expected the kubernetes image %s: %s, found %s"
                     % (bad[:1], image, trusted, imposter))
        for n in ("kubernetes", "containerd"):
            if (n + " merged for /usr", "listed by systemd-sysext status", "nothing merged") not in bad:
                p.append("the record does not say %s was not merged because nothing merged: %r" % (n, bad))
    if kg2:
        if kg2.get("refused"):
            p.append("known-good.json refuses %r: a file changed on the node is not the image's fault" % kg2["refused"])
        if kg1 and kg2.get("set") != kg1.get("set"):
            p.append("known-good.json's set changed in boot 2: %r" % kg2.get("set"))
    if dirs["/opt/extensions/kubernetes"] != [fname] or dirs["/etc/verity.d"] != [w.cert_file]:
        p.append("after boot 2: /opt/extensions/kubernetes holds %r, /etc/verity.d %r" % (
            dirs["/opt/extensions/kubernetes"], dirs["/etc/verity.d"]))
    if image not in links["/etc/extensions/kubernetes.raw"]:
        p.append("/etc/extensions/kubernetes.raw does not name %s: %r" % (image, links["/etc/extensions/kubernetes.raw"][:300]))
    for d, names in dirs.items():
        left = [n for n in names if ".nodestrap-" in n]
        if left:
            p.append("temp files left in %s: %r" % (d, left))
    return p
