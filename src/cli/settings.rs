//! Settings for `nodestrap bootstrap` from the node's config file (`--config`) and the kernel
//! command line (`--cmdline`), under the options given on the command line.
//!
//! Each setting becomes a synthetic `--key=value` placed before the user's arguments, so
//! `cli::last_wins` gives: command line > kernel arguments > config file > defaults.

use argh::FromArgs;

use crate::cli::check::{SYSEXT_ONLY, TORCX_ONLY};
use crate::cli::{self, Bootstrap, Cli, Cmd, Input, Payload};
use crate::error::{excerpt, Error, Kind, Result};
use crate::node::root::Root;

pub(crate) const DEFAULT_CONFIG: &str = "/etc/nodestrap/bootstrap.conf";
/// Drop-ins of the default config, as systemd orders its own (systemd-system.conf(5)): `*.conf`
/// in these directories, one set sorted by file name, a name in an earlier directory hiding
/// the same name in a later one, a link to /dev/null masking it. An explicit `--config FILE`
/// takes `FILE.d/` only.
const DROPIN_DIRS: &[&str] = &[
    "/etc/nodestrap/bootstrap.conf.d",
    "/run/nodestrap/bootstrap.conf.d",
    "/usr/lib/nodestrap/bootstrap.conf.d",
];
/// At most this many drop-ins are read (each is also capped like the config file).
const DROPIN_MAX: usize = 256;
const CONFIG_CAP: u64 = 64 << 10;
const KARG_PREFIX: &str = "nodestrap.";
const KERNEL: &str = "the kernel command line";

/// Bootstrap options a config file or kernel argument may set.
pub const KEYS: &[&str] = &[
    "payload",
    "sysext-url",
    "sysext-trust",
    "sysext-verity-certs",
    "kube-minor",
    "self-update",
    "registry-auth",
    "registry-config-path",
    "kubeconfig",
    "kubelet-kubeconfig",
    "bootstrap-kubeconfig",
    "join-config",
    "api-server",
    "force-kube-version",
    "version-manifest",
    "installer-kubelet-env",
    "torcx-manifest-url",
    "keyring",
    "ca-file",
    "no-verify-signatures",
    "upgrade-os",
    "torcx-skip-setup",
    "torcx-profile",
    "kubelet-env-path",
    "reboot",
    "verbose",
    "api-tries",
    "api-retry-delay",
    "version-fallback",
    "deadline",
    "clock-wait",
    "fetch-attempts",
    "fetch-backoff-ms",
    "fetch-timeout",
    "fetch-min-rate",
    "fetch-min-rate-window",
    "update-timeout",
    "image-max-mib",
    "allow-downgrade",
    "events-url",
    "events-token-file",
    "events-ca-file",
    "metrics-dir",
];
/// The keys `nodestrap verify` also takes from the node's settings: where events and metrics
/// go.
pub(crate) const EVENTS_KEYS: &[&str] = &[
    "events-url",
    "events-token-file",
    "events-ca-file",
    "metrics-dir",
];
/// Options that say where settings come from, or ask for a one-off plan: command line only.
const COMMAND_LINE_ONLY: &[&str] = &["root", "config", "cmdline", "dry-run", "help"];
const ALIASES: &[(&str, &str)] = &[("manifest-url", "torcx-manifest-url")];
/// Files nodestrap reads: node paths when set on the node (Ignition writes them to its disk).
const NODE_FILE_KEYS: &[&str] = &[
    "keyring",
    "ca-file",
    "events-token-file",
    "events-ca-file",
    "sysext-verity-certs",
    "registry-auth",
];

/// One `key=value` from a source, the key in its canonical spelling.
#[derive(Debug, PartialEq)]
pub(crate) struct Setting {
    pub(crate) key: &'static str,
    pub(crate) value: String,
}

pub(crate) struct Merged {
    /// Normalised arguments for argh, the user's last.
    pub(crate) args: Vec<String>,
    /// One line per source read, keys only (values may be secret-ish), logged once the logger
    /// is set up with the merged `--verbose`.
    pub(crate) notes: Vec<String>,
    /// Each option set anywhere, with where the value in force came from (the last source
    /// that set it): how an error about an option names the line to change.
    pub(crate) given: Vec<(&'static str, String)>,
}

impl Merged {
    /// Where the value in force of `key` came from; `None` when it is the default.
    pub(crate) fn source(&self, key: &str) -> Option<&str> {
        self.given
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, f)| f.as_str())
    }
}

/// An option set anywhere (`merged.given`) that the chosen payload would silently ignore is an
/// error naming where it was set and why; one that only turns off what the payload never does
/// (`--upgrade-os=false`, `--reboot=false`, `--torcx-skip-setup` with sysext, an empty
/// `--sysext-url` with torcx) is accepted, so one initramfs unit serves both payloads.
pub(crate) fn payload_options(a: &Bootstrap, merged: &Merged) -> Result<()> {
    let (other, theirs) = match a.payload {
        Payload::Torcx => ("sysext", SYSEXT_ONLY),
        Payload::Sysext => ("torcx", TORCX_ONLY),
    };
    let chosen = if other == "torcx" { "sysext" } else { "torcx" };
    if let Some(v) = a.force_kube_version.as_deref() {
        if a.payload == Payload::Torcx && crate::node::mappings::is_minor_only(v) {
            return Err(Error::config(format!(
                "--force-kube-version {v}: the torcx payload writes the kubelet's image tag, a full version like {v}.7; a minor alone is for --payload sysext"
            )));
        }
    }
    for key in theirs {
        let Some(from) = merged.source(key) else {
            continue;
        };
        let off = match *key {
            "upgrade-os" => !a.upgrade_os,
            "reboot" => a.reboot == cli::RebootMode::Never,
            "torcx-skip-setup" => a.torcx_skip_setup,
            "sysext-url" => a.sysext_url.is_empty(),
            "sysext-trust" => a.sysext_trust == cli::SysextTrust::Plain,
            "sysext-verity-certs" => a.sysext_verity_certs.is_none(),
            "kube-minor" => a.kube_minor.is_none(),
            "self-update" => !a.self_update,
            _ => false,
        };
        if off {
            continue;
        }
        let payload_from = merged.source("payload").unwrap_or("the default");
        let why = match *key {
            "upgrade-os" => {
                "; a sysext node's OS is updated by its own update_engine, not by nodestrap"
            }
            "reboot" => "; a sysext run never reboots (the images are merged, or merged at boot)",
            _ => "",
        };
        return Err(Error::config(format!(
            "--{key} (from {from}) is for --payload {other}, and this run's payload is {chosen} (from {payload_from}){why}: remove it, or set --payload {other}"
        )));
    }
    Ok(())
}

/// The options `user` (normalised arguments after the subcommand) sets, as settings keys.
fn on_command_line(user: &[String]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut it = user.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        let Some(name) = a.strip_prefix("--") else {
            continue;
        };
        if let Some(key) = KEYS.iter().find(|k| **k == name) {
            out.push((*key, "the command line".to_string()));
        }
        if !cli::is_switch(a) {
            it.next();
        }
    }
    out
}

/// Put the settings of the config file and (with `--cmdline`) the kernel command line before
/// `user`, the already parsed and normalised arguments that gave `b`.
pub(crate) fn merge(b: &Bootstrap, user: &[String]) -> Result<Merged> {
    let root = Root::open(&b.root)?;
    let (synthetic, notes, mut given) = node_settings(&root, b.config.as_deref(), b.cmdline)?;
    given.extend(on_command_line(user.get(1..).unwrap_or_default()));
    if synthetic.is_empty() {
        return Ok(Merged {
            args: user.to_vec(),
            notes,
            given,
        });
    }
    let (sub, rest) = user.split_first().expect("argh parsed a subcommand");
    let mut args = vec![sub.clone()];
    args.extend(cli::normalize(&synthetic));
    args.extend(rest.iter().cloned());
    Ok(Merged {
        args: cli::last_wins(args),
        notes,
        given,
    })
}

/// The events settings of the node's config file, drop-ins and kernel command line, for
/// `nodestrap verify` (its command line wins over them): `(key, value)`, a file's value as
/// `Input` marks it.
pub(crate) fn events(root: &Root) -> Result<Vec<(&'static str, String)>> {
    let (synthetic, _, given) = node_settings(root, None, true)?;
    let mut out = Vec::new();
    for (arg, (key, _)) in synthetic.iter().zip(given) {
        if EVENTS_KEYS.contains(&key) {
            let value = arg.split_once('=').map_or("", |(_, v)| v);
            out.retain(|(k, _)| *k != key);
            out.push((key, value.to_string()));
        }
    }
    Ok(out)
}

/// The settings of the config file (its default one and drop-ins unless `config` names one)
/// and, with `cmdline`, the kernel command line, as normalised `--key=value` arguments in
/// order, with a note per source and each key's source.
#[allow(clippy::type_complexity)]
fn node_settings(
    root: &Root,
    config: Option<&str>,
    cmdline: bool,
) -> Result<(Vec<String>, Vec<String>, Vec<(&'static str, String)>)> {
    let mut synthetic = Vec::new();
    let mut notes = Vec::new();
    let mut given = Vec::new();
    let (path, explicit) = match config {
        Some(p) => (p, true),
        None => (DEFAULT_CONFIG, false),
    };
    if !path.is_empty() {
        if !is_node_file(path) {
            return Err(Error::config(format!(
                "--config {path:?}: expected an absolute file path on the node"
            )));
        }
        let name = root.show(path);
        match root
            .read(path, CONFIG_CAP)
            .map_err(|e| e.with_kind(Kind::Config))?
        {
            None if explicit => {
                return Err(Error::config(format!("--config {name}: does not exist")))
            }
            None => {}
            Some(bytes) => {
                let settings = parse_file(&utf8(bytes, &name)?, &name)?;
                add(&settings, &name, &mut synthetic, &mut notes, &mut given);
            }
        }
        let dirs = if explicit {
            vec![format!("{path}.d")]
        } else {
            DROPIN_DIRS.iter().map(|d| d.to_string()).collect()
        };
        for p in dropins(root, &dirs, &mut notes)? {
            let name = root.show(&p);
            // Listed a moment ago: gone since means nothing to read.
            let Some(bytes) = root
                .read(&p, CONFIG_CAP)
                .map_err(|e| e.with_kind(Kind::Config))?
            else {
                continue;
            };
            let settings = parse_file(&utf8(bytes, &name)?, &name)?;
            add(&settings, &name, &mut synthetic, &mut notes, &mut given);
        }
    }
    if cmdline {
        let text =
            crate::node::cmdline::read().map_err(|e| e.with_kind(crate::error::Kind::Config))?;
        let settings = parse_cmdline(&text)?;
        add(&settings, KERNEL, &mut synthetic, &mut notes, &mut given);
    }
    Ok((synthetic, notes, given))
}

fn utf8(bytes: Vec<u8>, name: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::config(format!("{name}: not UTF-8 text")))
}

/// The drop-ins to read, in order (node paths): `*.conf` of `dirs`, by file name, the first
/// directory holding a name winning; masked ones (links to /dev/null) noted and skipped.
fn dropins(root: &Root, dirs: &[String], notes: &mut Vec<String>) -> Result<Vec<String>> {
    let mut listed = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for d in dirs {
        let Some(dir) = root.dir(d).map_err(|e| e.with_kind(Kind::Config))? else {
            continue;
        };
        let entries = dir.entries().map_err(|e| e.with_kind(Kind::Config))?;
        names.extend(entries.iter().filter(|n| n.ends_with(".conf")).cloned());
        listed.push((d, dir, entries));
    }
    names.sort();
    names.dedup();
    if names.len() > DROPIN_MAX {
        return Err(Error::config(format!(
            "{} drop-ins in {}: at most {DROPIN_MAX}",
            names.len(),
            dirs.join(", ")
        )));
    }
    let mut out = Vec::new();
    for name in names {
        // The first directory that holds the name decides.
        let Some((d, dir, _)) = listed.iter().find(|(_, _, e)| e.contains(&name)) else {
            continue;
        };
        let path = format!("{d}/{name}");
        if dir.link_target(&name).as_deref() == Some("/dev/null") {
            notes.push(format!("settings from {}: masked", root.show(&path)));
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

fn add(
    settings: &[Setting],
    from: &str,
    synthetic: &mut Vec<String>,
    notes: &mut Vec<String>,
    given: &mut Vec<(&'static str, String)>,
) {
    let keys: Vec<&str> = settings.iter().map(|s| s.key).collect();
    let keys = if keys.is_empty() {
        "none".to_string()
    } else {
        keys.join(", ")
    };
    notes.push(format!("settings from {from}: {keys}"));
    for s in settings {
        given.push((s.key, from.to_string()));
        let value = if NODE_FILE_KEYS.contains(&s.key) {
            Input::marker(&s.value, from)
        } else {
            s.value.clone()
        };
        // `--k=v`, never `--k v`: normalize splits at the first `=`, so any value survives.
        synthetic.push(format!("--{}={value}", s.key));
    }
}

/// `key=value` lines; blank lines and `#` comments skipped; `name` is how errors name the file.
pub(crate) fn parse_file(text: &str, name: &str) -> Result<Vec<Setting>> {
    let mut out: Vec<(Setting, usize)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |why: String| Error::config(format!("{name}:{n}: {why}"));
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| err(format!("expected key=value: \"{}\"", excerpt(line, 80))))?;
        let key = canonical(k.trim()).map_err(err)?;
        let value = unquote(v.trim())
            .ok_or_else(|| err(format!("{key}: unbalanced quotes")))?
            .to_string();
        if let Some((_, first)) = out.iter().find(|(s, _)| s.key == key) {
            return Err(err(format!(
                "duplicate key {key:?} (first on line {first})"
            )));
        }
        check_value(key, &value).map_err(|e| err(format!("{key}: {e}")))?;
        out.push((Setting { key, value }, n));
    }
    Ok(out.into_iter().map(|(s, _)| s).collect())
}

/// `nodestrap.<key>=<value>` arguments; every other argument belongs to someone else.
pub(crate) fn parse_cmdline(text: &str) -> Result<Vec<Setting>> {
    let mut out: Vec<Setting> = Vec::new();
    for (raw, param, value) in kernel_args(text) {
        let Some(k) = param.strip_prefix(KARG_PREFIX) else {
            continue;
        };
        let err = |why: String| {
            Error::config(format!("kernel command line: {}: {why}", excerpt(&raw, 80)))
        };
        let key = canonical(k).map_err(err)?;
        let value = value.ok_or_else(|| err(format!("expected {KARG_PREFIX}{key}=<value>")))?;
        if out.iter().any(|s| s.key == key) {
            return Err(err(format!("duplicate key {key:?}")));
        }
        check_value(key, &value).map_err(|e| err(format!("{key}: {e}")))?;
        out.push(Setting { key, value });
    }
    Ok(out)
}

/// Split the way the kernel's `next_arg` does: whitespace outside double quotes ends an
/// argument; a quote opening the argument or its value is dropped with the closing one.
/// Returns (as written, parameter, value).
fn kernel_args(text: &str) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut in_quote = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                if c == '"' {
                    in_quote = !in_quote;
                }
                c.is_whitespace() && !in_quote
            })
            .map_or(rest.len(), |(i, _)| i);
        let raw = &rest[..end];
        rest = rest[end..].trim_start();
        let (quoted, body) = match raw.strip_prefix('"') {
            Some(b) => (true, b),
            None => (false, raw),
        };
        let (mut param, mut value) = match body.split_once('=') {
            Some((p, v)) => (p, Some(v)),
            None => (body, None),
        };
        let mut closed = false;
        if let Some(v) = value.and_then(|v| v.strip_prefix('"')) {
            closed = v.ends_with('"');
            value = Some(v.strip_suffix('"').unwrap_or(v));
        }
        if quoted && !closed {
            match &mut value {
                Some(v) => *v = v.strip_suffix('"').unwrap_or(v),
                None => param = param.strip_suffix('"').unwrap_or(param),
            }
        }
        out.push((
            raw.to_string(),
            param.to_string(),
            value.map(str::to_string),
        ));
    }
    out
}

fn canonical(k: &str) -> std::result::Result<&'static str, String> {
    if let Some((_, to)) = ALIASES.iter().find(|(a, _)| *a == k) {
        return Ok(to);
    }
    if let Some(key) = KEYS.iter().find(|key| **key == k) {
        return Ok(key);
    }
    if COMMAND_LINE_ONLY.contains(&k) {
        return Err(format!("{k:?} can only be given on the command line"));
    }
    let known = KEYS.iter().chain(ALIASES.iter().map(|(a, _)| a)).copied();
    let hint = crate::cli::help::closest(k, known)
        .map(|c| format!(": did you mean {c}?"))
        .unwrap_or_default();
    Err(format!("unknown key \"{}\"{hint}", excerpt(k, 64)))
}

/// A value in matching double quotes loses them; a lone quote at one end is an error.
fn unquote(v: &str) -> Option<&str> {
    match (v.starts_with('"'), v.ends_with('"')) {
        (true, true) if v.len() >= 2 => Some(&v[1..v.len() - 1]),
        (false, false) => Some(v),
        _ => None,
    }
}

fn is_node_file(p: &str) -> bool {
    p.starts_with('/') && !p.ends_with('/')
}

/// Check one value the way it would be checked on the command line (argh's parse, then
/// `check::check_values` with every other option at its default), so a bad one is reported with
/// the file line or kernel argument it came from.
fn check_value(key: &str, value: &str) -> std::result::Result<(), String> {
    if value.contains('\0') {
        return Err("contains a NUL character".into());
    }
    if NODE_FILE_KEYS.contains(&key) {
        if !is_node_file(value) {
            return Err(format!(
                "{value:?}: expected an absolute file path on the node"
            ));
        }
        return Ok(());
    }
    if key == "verbose" {
        return crate::logger::parse_level(value)
            .map(|_| ())
            .ok_or_else(|| {
                format!(
                    "\"{}\": expected panic, fatal, error, warn, info, debug or trace",
                    excerpt(value, 64)
                )
            });
    }
    let args = cli::normalize(&["bootstrap".to_string(), format!("--{key}={value}")]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let parsed = Cli::from_args(&["nodestrap"], &refs).map_err(|e| e.output.trim().to_string())?;
    let Cmd::Bootstrap(b) = parsed.cmd else {
        unreachable!("parsed as bootstrap")
    };
    crate::cli::check::check_values(&b)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(v: &[(&'static str, &str)]) -> Vec<Setting> {
        v.iter()
            .map(|(key, value)| Setting {
                key,
                value: value.to_string(),
            })
            .collect()
    }

    #[test]
    fn file_lines_comments_quotes_and_alias() {
        let text = "# node settings\n\n  torcx-manifest-url = \"https://h/${VERSION_ID}/m.json\"  \n\t# indented comment\nupgrade-os=false\r\nkeyring=/etc/nodestrap/keyring.asc\nforce-kube-version = \"v1.10.2\"\nkubeconfig=\n";
        assert_eq!(
            parse_file(text, "f").unwrap(),
            kv(&[
                ("torcx-manifest-url", "https://h/${VERSION_ID}/m.json"),
                ("upgrade-os", "false"),
                ("keyring", "/etc/nodestrap/keyring.asc"),
                ("force-kube-version", "v1.10.2"),
                ("kubeconfig", ""),
            ])
        );
        assert_eq!(
            parse_file("manifest-url=https://a/m.json\n", "f").unwrap(),
            kv(&[("torcx-manifest-url", "https://a/m.json")])
        );
        // A value may hold '=' and '#'.
        assert_eq!(
            parse_file("torcx-manifest-url=https://a/m.json?x=1#y\n", "f").unwrap(),
            kv(&[("torcx-manifest-url", "https://a/m.json?x=1#y")])
        );
    }

    #[test]
    fn file_errors_name_the_file_line_and_key() {
        let e = |text: &str| {
            let e = parse_file(text, "/r/etc/nodestrap/bootstrap.conf").unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            e.to_string()
        };
        assert_eq!(
            e("# c\nfoo=1\n"),
            "/r/etc/nodestrap/bootstrap.conf:2: unknown key \"foo\""
        );
        assert!(
            e("upgrade-os\n").starts_with("/r/etc/nodestrap/bootstrap.conf:1: expected key=value")
        );
        assert_eq!(
            e("api-tries=1\n\napi-tries=2\n"),
            "/r/etc/nodestrap/bootstrap.conf:3: duplicate key \"api-tries\" (first on line 1)"
        );
        // The alias and its target are one key.
        assert!(e("manifest-url=https://a\ntorcx-manifest-url=https://b\n")
            .contains(":2: duplicate key \"torcx-manifest-url\""));
        assert!(e("root=/sysroot\n").contains(":1: \"root\" can only be given on the command line"));
        assert!(e("dry-run=true\n").contains("can only be given on the command line"));
        assert!(e("torcx-profile=\"x\n").contains(":1: torcx-profile: unbalanced quotes"));
        // Invalid values, checked as the command line checks them.
        for (text, needle) in [
            ("api-tries=many\n", ":1: api-tries: "),
            (
                "api-tries=1000\n",
                "api-tries: --api-tries 1000: at most 100",
            ),
            ("upgrade-os=yes\n", ":1: upgrade-os: "),
            ("reboot=sometimes\n", "reboot: "),
            ("verbose=loud\n", "verbose: \"loud\""),
            ("torcx-profile=../x\n", "torcx-profile: --torcx-profile"),
            ("kubelet-env-path=rel\n", "expected an absolute file path"),
            (
                "keyring=keyring.asc\n",
                "keyring: \"keyring.asc\": expected an absolute file path on the node",
            ),
            (
                "ca-file=\n",
                "ca-file: \"\": expected an absolute file path",
            ),
            (
                "torcx-manifest-url=https://x/{{.Channel}}\n",
                "unknown placeholder",
            ),
        ] {
            let m = e(text);
            assert!(m.contains(needle), "{text:?}: {m}");
            assert!(m.starts_with("/r/etc/nodestrap/bootstrap.conf:1: "), "{m}");
        }
    }

    #[test]
    fn kernel_arguments_split_like_the_kernel() {
        let a = kernel_args(
            " BOOT_IMAGE=/vmlinuz  ro nodestrap.torcx-profile=\"a b\"\tquiet \"nodestrap.verbose=debug\" x=\"y\" rd.nodestrap=0\n",
        );
        let pv: Vec<(&str, Option<&str>)> = a
            .iter()
            .map(|(_, p, v)| (p.as_str(), v.as_deref()))
            .collect();
        assert_eq!(
            pv,
            vec![
                ("BOOT_IMAGE", Some("/vmlinuz")),
                ("ro", None),
                ("nodestrap.torcx-profile", Some("a b")),
                ("quiet", None),
                ("nodestrap.verbose", Some("debug")),
                ("x", Some("y")),
                ("rd.nodestrap", Some("0")),
            ]
        );
        assert_eq!(a[2].0, "nodestrap.torcx-profile=\"a b\"");
        // An unterminated quote runs to the end, as in the kernel.
        assert_eq!(kernel_args("a=\"b c")[0].2.as_deref(), Some("b c"));
    }

    #[test]
    fn kernel_settings() {
        assert_eq!(
            parse_cmdline("ro rd.nodestrap=0 nodestrap=1 nodestrap.manifest-url=\"https://a/m.json\" nodestrap.upgrade-os=false console=ttyS0\n").unwrap(),
            kv(&[("torcx-manifest-url", "https://a/m.json"), ("upgrade-os", "false")])
        );
        let e = |t: &str| parse_cmdline(t).unwrap_err().to_string();
        assert_eq!(
            e("ro nodestrap.bogus=1"),
            "kernel command line: nodestrap.bogus=1: unknown key \"bogus\""
        );
        assert!(e("nodestrap.upgrade-os").contains("expected nodestrap.upgrade-os=<value>"));
        assert!(e("nodestrap.api-tries=1 nodestrap.api-tries=2")
            .contains("nodestrap.api-tries=2: duplicate key"));
        assert!(e("nodestrap.api-tries=x")
            .starts_with("kernel command line: nodestrap.api-tries=x: api-tries: "));
    }

    #[test]
    fn node_inputs_travel_through_last_wins() {
        use argh::FromArgValue;
        let node =
            Input::from_arg_value(&Input::marker("/etc/k.asc", "the kernel command line")).unwrap();
        assert_eq!(
            node,
            Input::Node {
                path: "/etc/k.asc".into(),
                from: "the kernel command line".into()
            }
        );
        assert_eq!(
            Input::from_arg_value("/etc/k.asc").unwrap(),
            Input::Host("/etc/k.asc".into())
        );
    }

    #[test]
    fn keys_are_the_bootstrap_options() {
        let help = match Cli::from_args(&["nodestrap"], &["bootstrap", "--help"]) {
            Err(e) => e.output,
            Ok(_) => unreachable!(),
        };
        let (_, rest) = help.split_once("\nOptions:\n").unwrap();
        let entries = crate::cli::help::entries(rest.split("\n\n").next().unwrap());
        let mut options: Vec<&str> = entries
            .iter()
            .map(|(n, _)| if n.is_empty() { "help" } else { n.as_str() })
            .collect();
        options.sort();
        let mut expected: Vec<&str> = KEYS.iter().chain(COMMAND_LINE_ONLY).copied().collect();
        expected.sort();
        assert_eq!(options, expected);
    }
}
