#!/usr/bin/python3
"""A stand-in for systemd's manager on a private system bus (no real systemd can run here: it
is not PID 1): org.freedesktop.systemd1 at /org/freedesktop/systemd1, interface
org.freedesktop.systemd1.Manager, with StartUnit(name, mode) and TryRestartUnit(name, mode) ->
job path, and Reload(), as systemd exposes them.

  --record FILE   append "StartUnit NAME MODE" or "TryRestartUnit NAME MODE" for every call
  --refuse        answer StartUnit with org.freedesktop.DBus.Error.AccessDenied, as systemd
                  does for a caller polkit refuses
Prints "ready" once it owns its name."""
import argparse

import dbus
import dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

IFACE = "org.freedesktop.systemd1.Manager"
ap = argparse.ArgumentParser()
ap.add_argument("--record", default="")
ap.add_argument("--refuse", action="store_true")
args = ap.parse_args()


class AccessDenied(dbus.DBusException):
    _dbus_error_name = "org.freedesktop.DBus.Error.AccessDenied"


class Manager(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, "/org/freedesktop/systemd1")
        self.jobs = 0

    def job(self, method, name, mode):
        if args.record:
            with open(args.record, "a") as f:
                f.write(f"{method} {name} {mode}\n")
        if args.refuse:
            raise AccessDenied("Access denied")
        self.jobs += 1
        return dbus.ObjectPath(f"/org/freedesktop/systemd1/job/{self.jobs}")

    @dbus.service.method(IFACE, in_signature="ss", out_signature="o")
    def StartUnit(self, name, mode):
        return self.job("StartUnit", name, mode)

    @dbus.service.method(IFACE, in_signature="ss", out_signature="o")
    def TryRestartUnit(self, name, mode):
        return self.job("TryRestartUnit", name, mode)

    @dbus.service.method(IFACE, in_signature="", out_signature="")
    def Reload(self):
        pass


DBusGMainLoop(set_as_default=True)
bus = dbus.SystemBus()
name = dbus.service.BusName("org.freedesktop.systemd1", bus)
m = Manager(bus)
print("ready", flush=True)
GLib.MainLoop().run()
