"""flatcar-year (issue 48): a stock node for a year, in one boot. The node's only input is the
Ignition config real Butane renders from ignition/examples/sysext-worker.bu (its four files,
mirror URL, nodestrap's release URL and SHA-512 replaced, as the operator does; a second config
merges it and adds the node's name, a static pod and the test's shorter patch window). Nothing of
nodestrap is in the node image (the sysext image with /opt/bin/nodestrap removed) or in the
initramfs (qemu/build's stock one: Ignition alone): Ignition fetches nodestrap from the signed
mirror and checks its hash, the first-boot unit bootstraps on the real root, and the node joins
the real control plane with a bootstrap token made for it alone. Then, as the months would:

1. the token is deleted (the API server answers it 401 from then on); the fleet's stop switch is
   set (deploy/rollout.yaml, applied and patched as docs/bootstrap.md says); a new patch of the
   node's minor and a new nodestrap release are published: the next patch run takes neither;
2. the switch is lifted: the next patch run asks the API server with the kubelet's own
   credentials (/etc/kubernetes/kubelet.conf), takes the patch and the release; the Node reports
   the new kubelet; the run after it is the new nodestrap's;
3. the mirror goes away for a run: that run fails, and `nodestrap status` (run after every patch
   run, on the console) shows the set that runs as fine, the failed attempt and exit 6.

Initramfs network: a stock Flatcar initramfs brings the network up when Ignition's config needs
it (Ignition's neednet flag, Flatcar's glue); Debian's Ignition package has no such glue, so the
boot asks for it on the kernel command line (`rd.neednet=1 ip=dhcp`), the stand-in the test says
it is."""

import os
import re
import subprocess
import time

from harness.common import CURRENT, PATCH, TOP, disk_file, disk_ls, joined, run, say, timings
from harness.cluster import Joining
from harness.sysext import (KUBELET_STARTED_RE, PATCH_WINDOW, WORLD, Sx, World, figures, record_of)
from harness.vm import boot_until

NAME = "flatcar-year"
STATUS_EXIT_RE = re.compile(r"nodestrap-qemu: status exit (\d+)")
STATUS_HEAD_RE = re.compile(r"^nodestrap bootstrap (\S+): (.*)")
HELD_RE = re.compile(r"nodestrap: sysext held k8s=(\S+) \((.*)\)")
INSTALLED_RE = re.compile(r"nodestrap v(\S+) installed over v(\S+)")
K8S_RE = re.compile(r"nodestrap: k8s=(\S+) from=(\S+) \((.*)\)")
# After every patch run, its status on the console, and the exit code of `nodestrap status`.
PATCH_STATUS = """[Service]
StandardOutput=journal+console
StandardError=journal+console
ExecStopPost=/bin/sh -c '/opt/bin/nodestrap status >/dev/console 2>&1; echo "nodestrap-qemu: status exit $$?" >/dev/console'
"""
ROLLOUT = os.path.join(TOP, "deploy/rollout.yaml")

SCENARIO = Sx(NAME, "a stock node for a year: Ignition alone installs nodestrap (hash-checked) on a node whose "
              "image and initramfs hold none of it; it joins with a token of its own, which is then deleted; "
              "the fleet's stop switch holds a new patch and a new nodestrap; lifted, the patch run takes both with "
              "the kubelet's credentials and the Node reports the patch; the mirror down for a run: status says "
              "the node runs fine and the attempt failed (exit 6)", initrd=False, mirror="patch", butane=True)
SCENARIO.stock = True
SCENARIO.initrd_image = "INITRD_STOCK"


def written_by(status):
    """The nodestrap version whose run `status` (its lines) shows: `nodestrap bootstrap 0.1.1: …`."""
    m = STATUS_HEAD_RE.search(status[0]) if status else None
    return m.group(1) if m else None


def files_entry(path, text):
    """A Butane storage.files entry with inline contents (indented for test.bu)."""
    body = "".join("          %s\n" % l if l else "\n" for l in text.splitlines())
    return "    - path: %s\n      overwrite: true\n      contents:\n        inline: |\n%s" % (path, body)


def prepare(s, sc):
    if "w" not in WORLD:
        WORLD["w"] = World(s)
        s.on_stop.append(WORLD["w"].stop)
    w = WORLD["w"]
    url = w.publish(sc)
    sc.token, sc.token_secret = w.cp.short_token(30 * 60)
    config = s.path(sc.name + ".ign")
    extra = (files_entry("/etc/systemd/system/nodestrap-patch.timer.d/10-test.conf", PATCH_WINDOW) +
             files_entry("/etc/systemd/system/nodestrap-patch.service.d/10-test.conf", PATCH_STATUS))
    w.butane_config(sc, url, config, extra)
    run(["ignition-validate", config])
    # Nothing of nodestrap in what the node boots.
    listing = run(["lsinitrd", s.images["INITRD_STOCK"]], stdout=subprocess.PIPE).stdout.splitlines()
    ours = [l for l in listing if re.match(r"[-dlcbps][-rwxsStT]{9} ", l) and "nodestrap" in l]
    if ours:
        raise SystemExit("qemu/run: the stock initramfs holds nodestrap: %r" % ours[:3])
    disk = w.disk(sc)
    raw = disk + ".check.raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        if disk_file(raw, "/opt/bin/nodestrap") or "nodestrap" in disk_ls(raw, "/usr/bin"):
            raise SystemExit("qemu/run: the stock node image holds nodestrap")
    finally:
        os.unlink(raw)
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1", "rd.neednet=1", "ip=dhcp"]
    if os.environ.get("NODESTRAP_QEMU_DEBUG") == "1":
        base.append("systemd.journald.forward_to_console=1")
    return w, url, config, disk, base


class Year:
    """The scenario's phases, driven from the console and the API server while the VM runs."""

    def __init__(self, s, sc, w, url, t0):
        self.s, self.sc, self.w, self.cp, self.url, self.t0 = s, sc, w, w.cp, url, t0
        self.joining = Joining(w.cp, sc.name)
        self.phase, self.at, self.problems, self.said = "join", {}, [], []
        self.status, self.statuses, self.started = [], [], []
        self.next_bin = os.environ.get("NODESTRAP_NEXT_BIN")
        self.next_version = None

    def now(self):
        return time.time() - self.t0

    def mark(self, what):
        self.at[what] = self.now()
        say("  %5.1fs  %s" % (self.at[what], what))

    def on_line(self, now, boots, line):
        if KUBELET_STARTED_RE.search(line) and not self.started:
            self.started.append(now)
        m = re.search(r"nodestrap\[\d+\]: (?:<\d>)?(.*)", line)
        if m:
            self.said.append((now, self.phase, m.group(1)))
        # `nodestrap status` after a patch run: its lines, then its exit code.
        if STATUS_HEAD_RE.search(line.strip()):
            self.status = [line.strip()]
        elif self.status and not STATUS_EXIT_RE.search(line):
            self.status.append(line.rstrip())
        m = STATUS_EXIT_RE.search(line)
        if m:
            self.statuses.append((now, self.phase, int(m.group(1)), self.status))
            self.status = []

    def saw(self, rx, phase):
        """The first nodestrap line matching `rx` said in `phase`, as a match."""
        return next((m for _, p, x in self.said if p == phase for m in [rx.search(x)] if m), None)

    def done(self, boots):
        step = getattr(self, "step_" + self.phase.replace("-", "_"))
        return step()

    def step_join(self):
        self.joining.poll(self.now())
        if not self.joining.done():
            return False
        self.mark("joined with kubelet %s" % self.joining.info[0])
        self.joined_info = self.joining.info
        # 1. The token goes; the API server refuses it from then on.
        self.cp.kubectl("-n", "kube-system", "delete", "secret", self.sc.token_secret)
        self.token_refused = self.cp.refuses(self.sc.token)
        # The fleet's stop switch, as docs/bootstrap.md tells the operator to set it.
        self.cp.kubectl("apply", "-f", ROLLOUT)
        self.cp.kubectl("-n", "kube-system", "patch", "configmap", "nodestrap-rollout", "--type", "merge",
                        "-p", '{"data":{"hold":"true"}}')
        self.w.publish_patch(self.sc)
        if self.next_bin:
            _, self.next_version = self.w.publish_nodestrap(self.sc, self.next_bin)
        self.phase = "held"
        self.mark("token deleted (refused: %s), hold set, kubernetes %s%s published" % (
            self.token_refused, self.w.release[CURRENT],
            " and nodestrap %s" % self.next_version if self.next_version else ""))
        return False

    def step_held(self):
        if not self.saw(HELD_RE, "held"):
            return False
        self.held_info = self.cp.node_info(self.sc.name)
        self.cp.kubectl("-n", "kube-system", "patch", "configmap", "nodestrap-rollout", "--type", "merge",
                        "-p", '{"data":{"hold":"false"}}')
        self.phase = "patch"
        self.mark("a patch run held (the Node at %s); hold lifted" % (self.held_info or ("?",))[0])
        return False

    def step_patch(self):
        if self.now() - self.at.get("asked", 0) < 3:
            return False
        self.at["asked"] = self.now()
        info = self.cp.node_info(self.sc.name)
        ran = any(p == "patch" for _, p, _, _ in self.statuses)
        if not info or info[0] != self.w.release[CURRENT] or not ran:
            return False
        self.patched_info = info
        self.phase = "after"
        self.mark("the Node reports kubelet %s" % info[0])
        return False

    def step_after(self):
        # The run after the patch: the new nodestrap's, when one was published (the patch run's
        # own status, written by the release it replaced, may come after the Node's report).
        runs = [st for _, p, _, st in self.statuses
                if p == "after" and (not self.next_version or written_by(st) == self.next_version)]
        if not runs:
            return False
        self.after_status = runs[0]
        os.rename(self.mirror(), self.mirror() + ".down")
        self.phase = "down"
        self.mark("a run after the patch (%s); the mirror goes away" % (runs[0][:1] or ["?"])[0])
        return False

    def step_down(self):
        runs = [(code, st) for _, p, code, st in self.statuses if p == "down"]
        if not runs:
            return False
        self.down_code, self.down_status = runs[0]
        os.rename(self.mirror() + ".down", self.mirror())
        self.mark("a run without the mirror: status exit %d; the mirror is back" % self.down_code)
        return True

    def mirror(self):
        return os.path.join(self.w.www, self.sc.name)

    def check(self, disk):
        p, current, first = [], self.w.release[CURRENT], self.w.release[PATCH]
        said = lambda phase: [x for _, ph, x in self.said if ph == phase]
        # The first boot: Ignition installed nodestrap, the real root bootstrapped, the token read.
        if (self.joined_info or ("",))[0] != first:
            p.append("the Node joined with %r, the mirror offered %s" % (self.joined_info, first))
        k8s = self.saw(K8S_RE, "join")
        if not k8s or k8s.group(2) != "api-server" or "bootstrap-kubelet.conf" not in k8s.group(3):
            p.append("the first run's version did not come from the bootstrap token: %r" % (k8s and k8s.group(0)))
        if not any("activation=merged" in x for x in said("join")):
            p.append("the first run did not merge on the real root: %r" % [x for x in said("join") if "done" in x])
        if not self.token_refused:
            p.append("the deleted bootstrap token was not refused by the API server")
        # The hold: nothing taken, the Node where it was.
        held = self.saw(HELD_RE, "held")
        if not held or "hold=true" not in held.group(2):
            p.append("no held run: %r" % said("held")[-3:])
        if (self.held_info or ("",))[0] != first:
            p.append("the Node moved while held: %r" % (self.held_info,))
        would = next((x for x in said("held") if "it would take" in x), "")
        if self.next_version and "nodestrap v%s" % self.next_version not in would:
            p.append("the held run does not name the nodestrap release it kept back: %r" % would)
        # The patch, with the kubelet's credentials, and nodestrap's own release.
        k8s = self.saw(K8S_RE, "patch")
        if not k8s or k8s.group(2) != "api-server" or "/etc/kubernetes/kubelet.conf" not in k8s.group(3):
            p.append("the patch run did not ask with the kubelet's credentials: %r" % (k8s and k8s.group(0)))
        if self.next_version:
            inst = self.saw(INSTALLED_RE, "patch")
            if not inst or inst.group(1) != self.next_version:
                p.append("the patch run did not install nodestrap %s: %r" % (self.next_version, inst and inst.group(0)))
            if written_by(getattr(self, "after_status", None)) != self.next_version:
                p.append("the run after the patch was not nodestrap %s's: %r" % (
                    self.next_version, getattr(self, "after_status", [])[:1]))
        else:
            say("  (NODESTRAP_NEXT_BIN unset: no nodestrap release published; tests/run.sh sets it)")
        # The mirror down: the status of a node that runs fine after a failed attempt.
        text = "\n".join(getattr(self, "down_status", []))
        if getattr(self, "down_code", None) != 6:
            p.append("status after the failed run exited %r, expected 6:\n%s" % (getattr(self, "down_code", None), text))
        for want in ("FAILED (exit 1)", "kubernetes %s" % current):
            if want not in text:
                p.append("status after the failed run does not say %r:\n%s" % (want, text))
        # The disk: nodestrap where Ignition put it and the patch stream moved it.
        raw = disk + ".raw"
        run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
        try:
            _, e = record_of(disk_file(raw, "/var/lib/nodestrap/status.json"), "status.json")
            if e:
                p.append(e)
            if self.next_version and disk_file(raw, "/opt/bin/nodestrap") != open(self.next_bin, "rb").read():
                p.append("/opt/bin/nodestrap on the disk is not nodestrap %s" % self.next_version)
            left = [n for n in disk_ls(raw, "/opt/bin") if n != "nodestrap"]
            if left:
                p.append("/opt/bin holds more than nodestrap: %r" % left)
        finally:
            os.unlink(raw)
        return p


def run_year(s, sc, accel, boot_timeout):
    say("\n=== %s: %s" % (sc.name, sc.doc))
    w, url, config, disk, base = prepare(s, sc)
    t0 = time.time()
    y = Year(s, sc, w, url, t0)
    events = []
    try:
        boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout + 900, base, t0, events,
                                          y.on_line, y.done, "the year's last phase",
                                          "phase %r not reached" % y.phase)
        if not problems:
            problems = y.check(disk)
    finally:
        # The switch is cluster-wide: the next scenario runs without it.
        w.cp.kubectl("-n", "kube-system", "delete", "configmap", "nodestrap-rollout", "--ignore-not-found", check=False)
    sc.timings = timings(events, y.started[0] if y.started else None)
    sc.timings.update(joined(events, y.joining))
    for k, v in sorted(y.at.items(), key=lambda kv: kv[1]):
        if k != "asked":
            sc.timings["year: " + k] = round(v, 1)
    figures(w, sc, events)
    sc.proof = getattr(y, "patched_info", None) or y.joining.info
    for pr in problems:
        say("  problem: " + pr)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, y.started[0] if y.started else None, problems


SCENARIO.runner = run_year
