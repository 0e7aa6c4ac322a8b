"""Booting a node under QEMU: a copy-on-write overlay, the serial console followed line by
line, reboots when the guest asks, and the accelerator probe."""
import os
import signal
import subprocess
import tempfile
import time


class Boot:
    """One QEMU run until it powers off or reboots (-no-reboot makes a guest reboot exit)."""

    def __init__(self, s, n, disk, config, kargs, accel, log, netdev="user,id=n0"):
        self.log = log
        cmd = ["qemu-system-x86_64", "-accel", accel, "-m", "2048", "-smp", "2", "-nodefaults",
               "-display", "none", "-no-reboot", "-kernel", s.images["KERNEL"], "-initrd", s.images["INITRD"],
               "-append", " ".join(kargs), "-drive", "if=virtio,format=qcow2,file=" + disk,
               "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
               "-device", "virtio-rng-pci", "-fw_cfg", "name=opt/com.coreos/config,file=" + config,
               "-serial", "file:" + log]
        if accel == "kvm":
            cmd += ["-cpu", "host"]
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
