"""Booting a node under QEMU: a copy-on-write overlay, the serial console followed line by
line, reboots when the guest asks, and the accelerator probe."""
import os
import signal
import subprocess
import tempfile
import time

from harness.common import ANSI, DEADLINE, RTC_PAST, note, say


class Boot:
    """One QEMU run until it powers off or reboots (-no-reboot makes a guest reboot exit)."""

    def __init__(self, s, n, disk, config, kargs, accel, log, netdev="user,id=n0", extra=(), initrd=None, kernel=None):
        self.log, self.kargs = log, kargs
        cmd = ["qemu-system-x86_64", "-accel", accel, "-m", "2048", "-smp", "2", "-nodefaults",
               "-display", "none", "-no-reboot", "-kernel", kernel or s.images["KERNEL"],
               "-initrd", initrd or s.images["INITRD"],
               "-append", " ".join(kargs), "-drive", "if=virtio,format=qcow2,file=" + disk,
               "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
               "-device", "virtio-rng-pci", "-fw_cfg", "name=opt/com.coreos/config,file=" + config,
               "-serial", "file:" + log]
        # Under TCG, every feature it emulates: its default CPU (qemu64) has no AES-NI, PCLMULQDQ
        # or SSSE3, and a guest's downloads (TLS, digests) ran 4 times slower (2.6 MiB/s, 10.7
        # with max, sysext-initrd's 84.7 MiB here).
        cmd += ["-cpu", "host" if accel == "kvm" else "max"]
        cmd += list(extra)
        open(log, "w").close()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log + ".qemu", "w"))
        self.pos = 0
        self.partial = ""

    def lines(self):
        with open(self.log, errors="replace") as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        data = self.partial + data
        *full, self.partial = data.split("\n")
        return [l.rstrip("\r") for l in full]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def probe_accel(images):
    forced = os.environ.get("NODESTRAP_QEMU_ACCEL")
    if forced:
        return forced
    if not os.access("/dev/kvm", os.W_OK):
        return "tcg"
    # KVM can be present yet hang under nested virtualisation: boot the kernel with no root and
    # see whether it prints anything within a few seconds.
    with tempfile.NamedTemporaryFile() as log:
        p = subprocess.Popen(["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults",
                              "-display", "none", "-no-reboot", "-kernel", images["KERNEL"],
                              "-append", "console=ttyS0 panic=-1", "-serial", "file:" + log.name],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 8
        ok = False
        while time.time() < deadline and not ok:
            time.sleep(0.5)
            ok = b"Linux version" in open(log.name, "rb").read()
        p.kill()
        p.wait()
    return "kvm" if ok else "tcg"


def died_before_userspace(log):
    """Whether the boot whose console is LOG ended before any userspace ran: no systemd's
    `Welcome to` (the initramfs's first line) and no reboot asked for. Under multi-threaded TCG a
    guest kernel now and then stops in its first second with nothing on the console (seen
    after 0.84 s in reprovision-rhcos: QEMU exited, -no-reboot turning the reset into an exit);
    nothing of the node's has run then, and its disk is as it was."""
    with open(log, errors="replace") as f:
        text = f.read()
    return "Welcome to " not in text and "reboot: " not in text


def again_after_early_death(log):
    """Keeps LOG aside (LOG.died) and says so: its boot runs again, once per scenario."""
    os.replace(log, log + ".died")
    say("  the guest kernel stopped before userspace (an emulator fault: nothing of the node's ran);"
        " booting again once (the console: %s.died)" % log)


def boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events, on_line, done,
               awaited, missing):
    """Boots the node again after each reboot (the first boot with Ignition's kernel arguments)
    until `done(boot)` says the scenario reached its end. Every console line, without colours,
    goes to the timeline and to `on_line(seconds, boot, line)`. A boot that ends without a
    reboot (`awaited` names what else would have done), one that outlives `boot_timeout` or
    the run's deadline (`missing` says what was missing), or one boot more than the scenario
    allows is a problem; a boot whose kernel stopped before userspace runs again, once
    (died_before_userspace). Returns (boots, problems, the last boot's console log)."""
    problems, boots, b, log, again = [], 0, None, None, True
    try:
        while not problems:
            boots += 1
            if boots > sc.boots + 1:
                problems.append("more than %d boots" % sc.boots)
                break
            kargs = base + (["ignition.firstboot", "ignition.platform.id=qemu"] if boots == 1 else [])
            extra = []
            if getattr(sc, "rtc_past", False):
                # The real-time clock starts years in the past at every boot; the guest's
                # timesyncd stand-in learns the true time from the kernel command line.
                kargs = kargs + ["nodestrap_qemu.time=%d" % time.time(), "nodestrap.clock-wait=25"]
                extra = ["-rtc", "base=%s" % RTC_PAST]
            log = s.path("%s-boot%d.log" % (sc.name, boots))
            # A scenario may boot another initramfs (flatcar-year: the stock one), another kernel
            # (sysext-initrd-262: Debian 14's), and arguments of its own from its second boot.
            initrd = s.images[sc.initrd_image] if getattr(sc, "initrd_image", None) else None
            kernel = s.images[sc.kernel_image] if getattr(sc, "kernel_image", None) else None
            kargs = kargs + list(getattr(sc, "boot_args", {}).get(boots, ()))
            # Debian 14's kernel patches its own text (int3 breakpoints) while its CPUs run, which
            # multi-threaded TCG does not always make visible in time: it died in one boot of
            # ten with "Oops: int3" in sched_clock_cpu. One host thread for the vCPUs has no race.
            boot_accel = accel + ",thread=single" if accel == "tcg" and getattr(sc, "tcg_single", False) else accel
            b = Boot(s, boots, disk, config, kargs, boot_accel, log, extra=extra, initrd=initrd, kernel=kernel)
            deadline = min(time.time() + boot_timeout, DEADLINE)
            rebooted = False
            while True:
                exited = b.proc.poll() is not None
                for line in b.lines():
                    line = ANSI.sub("", line)
                    now = time.time() - t0
                    note(events, now, boots, line)
                    rebooted = rebooted or "reboot: Restarting system" in line
                    on_line(now, boots, line)
                if done(boots):
                    b.kill()
                    return boots, problems, log
                if exited:
                    if not rebooted and again and died_before_userspace(log):
                        again = False
                        again_after_early_death(log)
                        boots -= 1
                    elif not rebooted:
                        problems.append("boot %d ended without %s (see %s)" % (boots, awaited, log))
                    break
                if time.time() > deadline:
                    b.kill()
                    problems.append("boot %d: %s within %d s or past the run's deadline (see %s)"
                                    % (boots, missing, boot_timeout, log))
                    break
                time.sleep(0.5)
    finally:
        if b is not None:
            b.kill()
    return boots, problems, log
