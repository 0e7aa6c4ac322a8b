//! D-Bus: a private dbus-daemon with the stand-in update_engine and systemd.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::*;

pub struct Bus {
    pub address: String,
    daemon: Child,
    services: Vec<Child>,
    dir: PathBuf,
}

impl Bus {
    pub fn start() -> Bus {
        let dir = unique_dir("bus");
        let sock = dir.join("system_bus_socket");
        let conf = dir.join("bus.conf");
        std::fs::write(&conf, format!(r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#, sock.display())).unwrap();
        let mut daemon = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--nopidfile", "--print-address"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("dbus-daemon (Debian package dbus-daemon) must be installed");
        let mut line = String::new();
        BufReader::new(daemon.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Bus {
            address: format!("unix:path={}", sock.display()),
            daemon,
            services: Vec::new(),
            dir,
        }
    }

    /// Start the test update_engine; `args` configure its states (see the script).
    pub fn update_engine(&mut self, args: &[&str]) {
        self.service("fake_update_engine.py", args);
    }

    /// The stand-in for systemd's manager (tests/support/fake_systemd.py).
    pub fn systemd(&mut self, args: &[&str]) {
        self.service("fake_systemd.py", args);
    }

    fn service(&mut self, file: &str, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/support")
            .join(file);
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{file} did not start");
        self.services.push(child);
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        for s in &mut self.services {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
