"""sysext-initrd-262 (issue 50): a node whose initramfs merges the real root's extensions itself.
Everything the node boots is Debian 14's (qemu/build-forky): systemd 262 in the real root and in
the initramfs, which forky's own dracut 112 builds with Ignition's module, nodestrap's, and its
systemd-sysext module (systemd-sysext-sysroot.service: `systemd-sysext --root=/sysroot refresh`,
ordered before initrd-root-fs.target), and forky's kernel. Signed mode throughout (signed DDIs,
the node's certificate, the strict image policy). Three boots of one node:

1. the first boot: the initramfs merge finds nothing to merge (Ignition has not run); nodestrap
   stages kubernetes (an earlier patch of the cluster's minor) and containerd, then restarts
   systemd-sysext-sysroot.service: the journal shows that unit merging both before "Switching
   root."; the kubelet from the extension starts in the first boot, the Node registers with the
   chosen versions, a pod runs, and the boot check says the initramfs merge took them;
2. the mirror publishes the current release signed by a key the node does not trust, and the
   node boots with `rd.systemd.sysext=0` (and `rd.nodestrap=1`, kubelet.env removed): nodestrap
   says that argument does not stop the initramfs merge of the real root (systemd 262 reads
   `systemd.sysext=` there) and refuses the image before any link; the previous set stays, and
   the journal shows the initramfs merge of it (the kubelet of the earlier patch);
3. the mirror publishes the current release signed by the trusted key, and the node boots with
   `rd.systemd.mask=systemd-sysext-sysroot.service` (the way to leave an initramfs merge out):
   nodestrap stages it and says the real root's systemd-sysext.service merges it; that unit does,
   the Node reports the new kubelet, and the boot check says the real root's merge took it.

sysext-signed-usr-262 (by name only) is the first boot of it with the DDIs whose data partition
is /usr itself (qemu/build-sysext's sysext-ddi-usr-*: the current release and containerd), which
nodestrap refuses on Debian 13's systemd 257 (sysext-signed-usr) and takes on 262: it stages them,
the initramfs merge takes them before switch-root, each file system is mounted from the dm-verity
device of its root hash (never from a loop partition), and the node joins with them."""

import os
import re
import subprocess
import time

from harness.common import CURRENT, PATCH, PREVIOUS, HERE, TOP, joined, run, say, timings
from harness.cluster import Joining
from harness.sysext import (KUBELET_STARTED_RE, PATCH_NEVER, WORLD, Sx, World, ddi_partitions, figures,
                            node_status, usr_layout, with_signal)
from harness.vm import boot_until

NAME = "sysext-initrd-262"
MASK = "rd.systemd.mask=systemd-sysext-sysroot.service"
REPORT_RE = re.compile(r"nodestrap-qemu: merge-report: (.*)")
SAID_RE = re.compile(r"nodestrap\[\d+\]: (?:<\d>)?(.*)")
MONO_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")
REPORT_UNIT = """# The sysext-initrd-262 scenario (qemu/harness/initrd262.py): at every boot, after the boot
# check, which merge took the extensions (qemu/guest/sysext/merge-report), then the step to the
# next boot when the harness asks for one.
[Unit]
Description=nodestrap-qemu: report which merge took the extensions, then the next boot
After=systemd-sysext.service sysext-reload.service nodestrap-verify.service nodestrap-qemu-trust-report.service

[Service]
Type=oneshot
ExecStart=/opt/nodestrap-qemu/merge-report %d
TimeoutStartSec=30min

[Install]
WantedBy=multi-user.target
"""

SCENARIO = Sx(NAME, "Debian 14 (systemd 262, dracut 112, its kernel), whose initramfs merges the real root's "
              "extensions (systemd-sysext-sysroot.service), signed mode: the initramfs stages and restarts that "
              "merge, the journal shows it merging both before switch-root, the node joins in the first boot and "
              "the boot check names the initramfs merge; with rd.systemd.sysext=0 an image of an untrusted signer "
              "is refused before the link and the initramfs merge keeps the previous set; with the merge masked "
              "the real root's merges the new release and the boot check names it",
              initrd=True, trust="signed", boots=3)
SCENARIO.kernel_image, SCENARIO.initrd_image, SCENARIO.node_image = "FORKY_KERNEL", "FORKY_INITRD", "FORKY_NODE_IMAGE"
SCENARIO.boot_args = {2: ["rd.systemd.sysext=0"], 3: [MASK]}
SCENARIO.tcg_single = True  # qemu/harness/vm.py: the 7.2 kernel under multi-threaded TCG


def prepare(s, sc):
    """Debian 14's pieces (built once), the World's mirror with the earlier patch, the Ignition
    config with the report and the step between the boots, the disk, the kernel arguments."""
    if "FORKY_KERNEL" not in s.images:
        out = run(["bash", os.path.join(HERE, "build-forky")], stdout=subprocess.PIPE,
                  env=dict(os.environ, **s.images)).stdout
        s.images.update(l.split("=", 1) for l in out.splitlines() if "=" in l)
    if "w" not in WORLD:
        WORLD["w"] = World(s)
        s.on_stop.append(WORLD["w"].stop)
    w = WORLD["w"]
    url = w.publish(sc)
    if not getattr(sc, "ddi", None):
        publish(w, sc, None)  # the previous minor and the earlier patch alone
    d = s.path(sc.name + "-extra")
    os.makedirs(d)
    script, unit = os.path.join(d, "merge-report"), os.path.join(d, "nodestrap-qemu-merge-report.service")
    with open(script, "w") as f:
        f.write(open(os.path.join(HERE, "guest/sysext/merge-report")).read())
    with open(unit, "w") as f:
        f.write(REPORT_UNIT % sc.signal_port)
    os.makedirs(os.path.join(d, "nodestrap-patch.timer.d"))
    never = os.path.join(d, "nodestrap-patch.timer.d", "10-test.conf")
    with open(never, "w") as f:
        f.write(PATCH_NEVER)
    config = s.path(sc.name + ".ign")
    args = w.node_files(sc, url) + ["--file", "/opt/nodestrap-qemu/merge-report=%s:0755" % script, "--unit", unit, "--unit", never]
    with open(config, "w") as f:
        run([os.path.join(TOP, "ignition/render"), "sysext"] + args, stdout=f)
    run(["ignition-validate", config])
    disk = w.disk(sc)
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1", "rd.nodestrap=1"]
    if os.environ.get("NODESTRAP_QEMU_DEBUG") == "1":
        base.append("systemd.journald.forward_to_console=1")
    return w, config, disk, base


class Boots:
    """The three boots, driven from the console and the API server while the VM runs."""

    def __init__(self, sc, w, t0, listener):
        self.sc, self.w, self.cp, self.t0, self.listener = sc, w, w.cp, t0, listener
        self.joining = Joining(w.cp, sc.name)
        self.said, self.report, self.started, self.at, self.nodes = [], [], [], {}, {}

    def now(self):
        return time.time() - self.t0

    def mark(self, what):
        self.at[what] = self.now()
        say("  %5.1fs  %s" % (self.at[what], what))

    def on_line(self, now, boots, line):
        if KUBELET_STARTED_RE.search(line) and not self.started:
            self.started.append(now)
        m = REPORT_RE.search(line)
        if m:
            self.report.append((boots, m.group(1)))
            return
        m = SAID_RE.search(line)
        if m and "nodestrap[" in line:
            self.said.append((boots, m.group(1)))

    def reported(self, boot):
        return any(b == boot and x == "end" for b, x in self.report)

    def verified(self, boot):
        return any(b == boot and x.startswith("verified: ") for b, x in self.said)

    def tell(self):
        """The guest's step to the next boot, once it asks (it connects after its report)."""
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return False
        with conn:
            conn.settimeout(10)
            conn.sendall(b"again\n")
        return True

    def done(self, boots):
        self.joining.poll(self.now())
        key = "told %d" % boots
        if key in self.at:
            return False
        if boots == 1:
            if not (self.joining.done() and self.verified(1) and self.reported(1)):
                return False
            if "published 1" not in self.at:
                self.nodes[1] = node_status(self.cp, self.sc.name)
                publish(self.w, self.sc, imposter=True)
                self.mark("boot 1 joined and verified; the mirror publishes %s signed by an untrusted key"
                          % self.w.release[CURRENT])
                self.at["published 1"] = self.now()
        elif boots == 2:
            if not self.reported(2):
                return False
            if "published 2" not in self.at:
                publish(self.w, self.sc, imposter=False)
                self.mark("boot 2 reported; the mirror publishes %s signed by the trusted key" % self.w.release[CURRENT])
                self.at["published 2"] = self.now()
        else:
            if self.now() - self.at.get("asked", 0) < 3:
                return False
            self.at["asked"] = self.now()
            info = node_status(self.cp, self.sc.name)
            if not info or info[0] != self.w.release[CURRENT] or not self.verified(3) or not self.reported(3):
                return False
            self.nodes[3] = info
            self.mark("boot 3: the Node reports %s, the boot check passed" % info[0])
            return True
        if self.tell():
            self.mark("boot %d: the guest told to boot again" % boots)
            self.at[key] = self.now()
        return False

    def lines(self, boot, prefix=""):
        return [x for b, x in self.report if b == boot and x.startswith(prefix)]

    def nodestrap(self, boot):
        return [x for b, x in self.said if b == boot]

    def check(self):
        p = []
        w, patch, current = self.w, self.w.release[PATCH], self.w.release[CURRENT]

        def need(boot, what, texts, hint):
            if not any(what in t for t in texts):
                p.append("boot %d: %s not found (%s): %r" % (boot, what, hint, texts[-12:]))

        # Boot 1: the initramfs merge, restarted by nodestrap after staging, before switch-root.
        n1 = self.nodestrap(1)
        need(1, "merge: the initramfs's systemd-sysext-sysroot.service", n1, "nodestrap's decision")
        need(1, "systemd-sysext-sysroot.service merged containerd, kubernetes into /sysroot/usr before switch-root",
             n1, "nodestrap's proof")
        need(1, "activation=merged", n1, "the summary")
        need(1, "merged by: the initramfs merge", n1, "the boot check")
        p += self.before_switch_root(1, True)
        if not self.nodes.get(1) or self.nodes[1][:2] != (patch, "containerd://%s" % w.containerd):
            p.append("boot 1: the Node reported %r, nodestrap chose %s and containerd %s" % (
                self.nodes.get(1), patch, w.containerd))
        # Boot 2: rd.systemd.sysext=0 stops nothing of the real root's; the imposter refused.
        n2 = self.nodestrap(2)
        need(2, "rd.systemd.sysext= on the kernel command line turns off the initramfs's own extensions only",
             n2, "nodestrap on the kill switch")
        need(2, "merge: the initramfs's systemd-sysext-sysroot.service", n2, "nodestrap's decision")
        need(2, "signature", n2, "the refusal of the untrusted signer's image")
        if any("activation=" in t for t in n2):
            p.append("boot 2: a run went on to activate: %r" % [t for t in n2 if "activation=" in t])
        p += self.before_switch_root(2, False)
        need(2, "kubernetes-%s-x86-64.raw" % patch, self.lines(2, "link"), "the previous link kept")
        need(2, patch.lstrip("v"), self.lines(2, "kubelet"), "the previous kubelet merged")
        # Boot 3: masked in the initramfs: the real root's merge.
        n3 = self.nodestrap(3)
        need(3, "merge: the real root's systemd-sysext.service: systemd-sysext-sysroot.service is masked", n3,
             "nodestrap's decision")
        need(3, "activation=staged", n3, "the summary")
        need(3, "merged by: the real-root merge", n3, "the boot check")
        j3 = self.lines(3, "journal:")
        if any("systemd-sysext-sysroot" in x and "Merged extensions" in x for x in j3):
            p.append("boot 3: the masked initramfs merge ran: %r" % j3)
        if not any("Merged extensions into '/usr'" in x for x in j3):
            p.append("boot 3: the real root's systemd-sysext.service did not merge: %r" % j3)
        if not self.nodes.get(3) or self.nodes[3][0] != current:
            p.append("boot 3: the Node reported %r, expected %s" % (self.nodes.get(3), current))
        return p

    def before_switch_root(self, boot, restarted):
        """The journal of boot `boot`: before systemd's "Switching root." (so in the initramfs: the
        unit runs only there), a merge into /sysroot/usr of the kubernetes and containerd images;
        after it, the real root's systemd-sysext found nothing changed and skipped its refresh."""
        p, journal = [], self.lines(boot, "journal:")
        switch = [float(m.group(1)) for x in self.lines(boot, "pid1:") for m in [MONO_RE.search(x[5:].strip())] if m]
        if not switch:
            return ["boot %d: no \"Switching root.\" line: %r" % (boot, self.lines(boot, "pid1:"))]
        at = lambda x: float(MONO_RE.search(x[8:].strip()).group(1)) if MONO_RE.search(x[8:].strip()) else None
        initramfs = [x for x in journal if at(x) is not None and at(x) < switch[0]]
        real_root = [x for x in journal if at(x) is not None and at(x) >= switch[0]]
        merges = [x for x in initramfs if "Merged extensions into '/sysroot/usr'" in x]
        if not merges:
            p.append("boot %d: no initramfs merge before switch-root at %s: %r" % (boot, switch[0], journal))
        using = [x for x in initramfs if "Using extensions" in x]
        if not any("'containerd-" in x and "'kubernetes-" in x for x in using[-1:]):
            p.append("boot %d: the last initramfs merge does not take containerd and kubernetes: %r" % (boot, using))
        if restarted and len(merges) != 1:
            p.append("boot %d: %d initramfs merges, expected one (nodestrap's restart): %r" % (boot, len(merges), merges))
        if not any("Skipping extension refresh because no change was found" in x for x in real_root):
            p.append("boot %d: the real root's systemd-sysext merged again: %r" % (boot, real_root))
        return p


def publish(w, sc, imposter):
    """The kubernetes folder: the previous minor and the earlier patch, and with `imposter` not
    None the current release under its name, signed by the untrusted key (`imposter`) or by the
    trusted one."""
    d = os.path.join(w.www, sc.name, "kubernetes")
    fname = "kubernetes-%s-x86-64.raw" % w.release[CURRENT]
    if os.path.exists(os.path.join(d, fname)):
        os.unlink(os.path.join(d, fname))
    files = [("kubernetes-%s-x86-64.raw" % w.release[r], w.image("kubernetes", r, True)) for r in (PREVIOUS, PATCH)]
    if imposter is not None:
        files.append((fname, w.imposter() if imposter else w.image("kubernetes", CURRENT, True)))
    w.sign(sc, "kubernetes", files)


def run_262(s, sc, accel, boot_timeout):
    return with_signal(sc, lambda listener: boots_262(s, sc, accel, boot_timeout, listener))


def boots_262(s, sc, accel, boot_timeout, listener):
    w, config, disk, base = prepare(s, sc)
    t0 = time.time()
    b = Boots(sc, w, t0, listener)
    events = []
    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout + 120, base, t0, events, b.on_line,
                                      b.done, "the third boot", "the next step")
    if not problems:
        problems = b.check()
    sc.timings = timings(events, b.started[0] if b.started else None)
    sc.timings.update(joined(events, b.joining))
    for k, v in sorted(b.at.items(), key=lambda kv: kv[1]):
        if k != "asked" and not k.startswith(("told", "published")):
            sc.timings["262: " + k] = round(v, 1)
    figures(w, sc, events)
    sc.proof = b.nodes.get(3) and b.nodes[3][:2] or b.joining.info
    for pr in problems:
        say("  problem: " + pr)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, b.started[0] if b.started else None, problems


SCENARIO.runner = run_262

USR_NAME = "sysext-signed-usr-262"
USR_SCENARIO = Sx(USR_NAME, "(by name only) the first boot of sysext-initrd-262 with the mirror serving the /usr-partition "
                  "DDIs (usr, usr-verity, usr-verity-sig) that Debian 13's systemd 257 would merge unverified: on "
                  "systemd 262 nodestrap proves and stages them, the initramfs merge takes them before switch-root "
                  "from dm-verity devices, the node joins with them", initrd=True, trust="signed", ddi="usr",
                  bench_only=True)
USR_SCENARIO.kernel_image, USR_SCENARIO.initrd_image, USR_SCENARIO.node_image = SCENARIO.kernel_image, \
    SCENARIO.initrd_image, SCENARIO.node_image
USR_SCENARIO.tcg_single = True
EROFS_RE = re.compile(r"erofs:? \(device ([\w-]+)\): mounted")
DM_RE = re.compile(r"^(dm-\d+) (\S+)")


def verity_uuid(path):
    """The UUID (32 hex digits) of the verity superblock at the start of a DDI's verity
    partition, as libcryptsetup puts it in the device's UUID."""
    for _, label, first, _ in ddi_partitions(path):
        if label.endswith("-verity"):
            with open(path, "rb") as f:
                f.seek(first * 512)
                sb = f.read(32)
            return sb[16:32].hex() if sb[:8] == b"verity\0\0" else None
    return None


class UsrBoot(Boots):
    """sysext-signed-usr-262's one boot: it ends when the Node has joined (its pod running), the
    boot check verified and the guest reported."""

    def done(self, boots):
        self.joining.poll(self.now())
        if not (self.joining.done() and self.verified(1) and self.reported(1)):
            return False
        self.nodes[1] = node_status(self.cp, self.sc.name)
        self.mark("boot 1: the Node reports %s, the boot check passed, the guest reported" % (self.nodes[1] or ("-",))[0])
        return True

    def check(self):
        """Boot 1: the /usr DDIs served, proven and staged by nodestrap, merged by the initramfs
        merge before switch-root, each erofs mounted from the verity device of its root hash."""
        w, current = self.w, self.w.release[CURRENT]
        p, hashes = usr_layout(w)
        n1 = self.nodestrap(1)

        def need(what, texts, hint):
            if not any(what in t for t in texts):
                p.append("boot 1: %s not found (%s): %r" % (what, hint, texts[-12:]))

        for fname, rh in sorted(hashes.items()):
            need("%s: signed DDI, root hash %s " % (fname, rh), n1, "nodestrap's proof of the /usr DDI")
        need("merge: the initramfs's systemd-sysext-sysroot.service", n1, "nodestrap's decision")
        need("kubernetes=%s containerd=v%s activation=merged" % (current, w.containerd), n1, "the summary")
        need("systemd-sysext-sysroot.service merged containerd, kubernetes into /sysroot/usr before switch-root",
             n1, "nodestrap's proof")
        need("merged by: the initramfs merge", n1, "the boot check")
        p += self.before_switch_root(1, True)
        # The kernel: in the merge (from the initramfs unit's last start to switch-root), each
        # extension's erofs mounted from a dm-verity device, none from a loop partition. systemd
        # 262 names a verity device after the loop partition (`loop2p1-22-verity`); libcryptsetup's
        # device UUID (`CRYPT-VERITY-<hex>-<name>`) carries the UUID of the verity superblock,
        # which ties the device to the DDI whose usr-verity partition holds it. (Earlier erofs
        # mounts of whole loop devices are nodestrap's own look into the data partitions.)
        switch = [float(m.group(1)) for x in self.lines(1, "pid1:") for m in [MONO_RE.search(x[5:].strip())] if m]
        at = lambda x: float(MONO_RE.search(x[8:].strip()).group(1)) if MONO_RE.search(x[8:].strip()) else None
        kernel, journal = self.lines(1, "kernel:"), self.lines(1, "journal:")
        starts = [at(x) for x in journal if "Starting systemd-sysext-sysroot.service" in x and at(x) is not None]
        dm = {m.group(1): m.group(2) for x in self.lines(1, "dm:") for m in [DM_RE.match(x[3:].strip())] if m}
        uuids = {d: (re.match(r"CRYPT-VERITY-([0-9a-f]{32})-", x[3:].strip().split(" ", 2)[-1]) or [None, None])[1]
                 for d in dm for x in self.lines(1, "dm: " + d + " ")}
        if not switch or not starts:
            return p + ["boot 1: no start of systemd-sysext-sysroot.service (%r) or no switch-root (%r)" % (starts, switch)]
        window = (starts[-1], switch[0])
        mounted = [(at(x), m.group(1)) for x in kernel for m in [EROFS_RE.search(x)] if m]
        in_merge = [(t, d) for t, d in mounted if t is not None and window[0] <= t < window[1]]
        say("  the initramfs merge, %.1f to %.1f s (switch-root): erofs mounted from %s; device-mapper devices after "
            "it: %s" % (window[0], window[1], ", ".join(d for _, d in in_merge) or "nothing",
                        ", ".join("%s %s" % kv for kv in sorted(dm.items())) or "none"))
        for line in journal + kernel:
            if at(line) is not None and window[0] <= at(line) < window[1] and re.search(
                    r"-verity|verity:|device-mapper|erofs|Using extensions|Merged extensions", line):
                say("    " + line)
        plain = [d for _, d in in_merge if not d.startswith("dm-")]
        if plain:
            p.append("boot 1: in the initramfs merge erofs was mounted straight from %s, through no dm-verity device: "
                     "systemd 262 merged the /usr partitions unverified" % ", ".join(plain))
        for fname, rh in sorted(hashes.items()):
            sb = verity_uuid(w.image("containerd" if fname.startswith("containerd-") else "kubernetes", CURRENT, "usr"))
            devs = [d for d, u in uuids.items() if u == sb]
            last = [t for t, d in mounted if d in devs]
            if not devs:
                p.append("boot 1: no dm-verity device of %s (its verity superblock %s) after the merge: %r"
                         % (fname, sb, sorted(self.lines(1, "dm:"))))
            elif not last or not window[0] <= last[-1] < window[1]:
                p.append("boot 1: %s's erofs was not mounted from %s (%s) in the initramfs merge (%.1f to %.1f s): %r"
                         % (fname, devs[0], dm[devs[0]], window[0], window[1], mounted))
            elif not any(dm[devs[0]] in x for x in journal if at(x) is not None and window[0] <= at(x) < window[1]):
                p.append("boot 1: the initramfs merge's journal does not name %s's verity device %s: %r"
                         % (fname, dm[devs[0]], journal))
            else:
                say("  %s (root hash %s…): erofs from %s (%s, verity superblock %s) at %.1f s" % (
                    fname, rh[:16], devs[0], dm[devs[0]], sb, last[-1]))
        if len(dm) != 2:
            p.append("boot 1: %d device-mapper devices after the boot, expected the merge's 2: %r" % (len(dm), dm))
        want = (current, "containerd://%s" % w.containerd)
        if not self.nodes.get(1) or self.nodes[1][:2] != want:
            p.append("boot 1: the Node reported %r, expected %r" % (self.nodes.get(1), want))
        if self.joining.running is None:
            p.append("boot 1: the static pod's mirror pod never ran")
        return p


def run_usr(s, sc, accel, boot_timeout):
    return with_signal(sc, lambda listener: boot_usr(s, sc, accel, boot_timeout, listener))


def boot_usr(s, sc, accel, boot_timeout, listener):
    say("\n=== %s: %s" % (sc.name, sc.doc))
    w, config, disk, base = prepare(s, sc)
    t0 = time.time()
    b = UsrBoot(sc, w, t0, listener)
    events = []
    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout + 120, base, t0, events, b.on_line,
                                      b.done, "the join", "the join, the boot check and the report")
    if not problems:
        problems = b.check()
    sc.timings = timings(events, b.started[0] if b.started else None)
    sc.timings.update(joined(events, b.joining))
    figures(w, sc, events)
    sc.proof = b.nodes.get(1) and b.nodes[1][:2] or b.joining.info
    for pr in problems:
        say("  problem: " + pr)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, b.started[0] if b.started else None, problems


USR_SCENARIO.runner = run_usr
