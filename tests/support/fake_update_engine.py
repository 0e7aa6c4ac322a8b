#!/usr/bin/python3
"""A test update_engine on a private system bus: com.coreos.update1 at /com/coreos/update1,
interface com.coreos.update1.Manager, with AttemptUpdate, GetStatus and the StatusUpdate signal,
as coreos/update_engine exposes them. A STAND-IN: no real update_engine can be installed here
(it ships only inside Container Linux and Flatcar images), so this one speaks its real bus
name, object path, interface and wire format, and the tests that use it say so.

  --status OP           status before any AttemptUpdate (default UPDATE_STATUS_IDLE)
  --new-version V       new_version reported with UPDATED_NEED_REBOOT
  --on-attempt A,B,...  statuses walked through, one every --step seconds, after AttemptUpdate
  --step S              seconds between steps (default 0.1)
  --stale OP            emit this status as a signal just before answering AttemptUpdate
  --silent              do not emit StatusUpdate signals (clients must poll GetStatus)
  --record FILE         append the name of every method called to FILE
  --lagging-status      GetStatus keeps answering CHECKING_FOR_UPDATE once an update started
                        (only the signals tell the rest)
Prints "ready" once it owns its name."""
import argparse
import time

import dbus
import dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

IFACE = "com.coreos.update1.Manager"
P = "UPDATE_STATUS_"

ap = argparse.ArgumentParser()
ap.add_argument("--status", default=P + "IDLE")
ap.add_argument("--new-version", default="")
ap.add_argument("--on-attempt", default="")
ap.add_argument("--step", type=float, default=0.1)
ap.add_argument("--stale", default="")
ap.add_argument("--silent", action="store_true")
ap.add_argument("--record", default="")
ap.add_argument("--lagging-status", action="store_true")


def record(method):
    if args.record:
        with open(args.record, "a") as f:
            f.write(method + "\n")
args = ap.parse_args()


class Manager(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, "/com/coreos/update1")
        self.op = args.status
        self.progress = 1.0 if self.op == P + "UPDATED_NEED_REBOOT" else 0.0
        self.pending = []
        self.started = False

    def tuple(self):
        version = args.new_version if self.op in (P + "UPDATED_NEED_REBOOT", P + "DOWNLOADING", P + "FINALIZING", P + "VERIFYING", P + "UPDATE_AVAILABLE") else ""
        return (dbus.Int64(int(time.time())), dbus.Double(self.progress), self.op, version, dbus.Int64(1234))

    @dbus.service.method(IFACE, in_signature="", out_signature="")
    def AttemptUpdate(self):
        record("AttemptUpdate")
        if args.stale:
            self.StatusUpdate(dbus.Int64(0), dbus.Double(0), args.stale, "", dbus.Int64(0))
        self.pending = [s for s in args.on_attempt.split(",") if s]
        self.started = True
        if self.pending:
            # Like the real one: CHECKING_FOR_UPDATE is set before the call returns.
            self.advance()
            if self.pending:
                GLib.timeout_add(int(args.step * 1000), self.tick)

    def tick(self):
        self.advance()
        return bool(self.pending)

    def advance(self):
        self.op = self.pending.pop(0)
        if not self.op.startswith(P):
            self.op = P + self.op
        self.progress = min(1.0, self.progress + 0.5)
        if not args.silent:
            self.StatusUpdate(*self.tuple())

    @dbus.service.method(IFACE, in_signature="", out_signature="xdssx")
    def GetStatus(self):
        record("GetStatus")
        if args.lagging_status and self.started:
            return (dbus.Int64(0), dbus.Double(0.0), P + "CHECKING_FOR_UPDATE", "", dbus.Int64(0))
        return self.tuple()

    @dbus.service.signal(IFACE, signature="xdssx")
    def StatusUpdate(self, last_checked_time, progress, current_operation, new_version, new_size):
        pass


DBusGMainLoop(set_as_default=True)
bus = dbus.SystemBus()
name = dbus.service.BusName("com.coreos.update1", bus)
m = Manager(bus)
print("ready", flush=True)
GLib.MainLoop().run()
