//! argv as argh reads it: Go-style flags (`--flag=value`, bare booleans, a later flag winning)
//! rewritten first, as the original units pass them.

use super::started;

/// Options that take true/false and may be given bare (`--upgrade-os` means true).
const BOOL_OPTIONS: &[&str] = &[
    "--no-verify-signatures",
    "--upgrade-os",
    "--torcx-skip-setup",
    "--reboot",
];
/// Switches that may be written `--dry-run=true` / `--dry-run=false`.
const SWITCHES: &[&str] = &["--dry-run", "--cmdline"];

/// Rewrite Go-style arguments into what argh parses.
pub fn normalize(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a.clone());
            out.extend(it.cloned());
            break;
        }
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if SWITCHES.contains(&flag.as_str()) {
            match value.as_deref() {
                None | Some("true") | Some("1") => out.push(flag),
                Some("false") | Some("0") => {}
                Some(v) => out.extend([flag, v.to_string()]), // let argh report it
            }
            continue;
        }
        if BOOL_OPTIONS.contains(&flag.as_str()) && value.is_none() {
            let next_is_value = it.peek().is_some_and(|n| !n.starts_with("--"));
            out.push(flag);
            if !next_is_value {
                out.push("true".into());
            }
            continue;
        }
        out.push(flag);
        if let Some(v) = value {
            out.push(v);
        }
    }
    last_wins(out)
}

/// Whether `flag` (normalised) takes no value.
pub(crate) fn is_switch(flag: &str) -> bool {
    SWITCHES.contains(&flag) || flag == "--help"
}

/// Go's flag package lets a later `--flag v` override an earlier one; argh refuses duplicates.
/// Also how settings from the config file and the kernel command line, put first, give way.
pub(crate) fn last_wins(args: Vec<String>) -> Vec<String> {
    let takes_value =
        |a: &str| a.starts_with("--") && a != "--" && a != "--help" && !SWITCHES.contains(&a);
    let mut items: Vec<Vec<String>> = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--" {
            items.push(std::iter::once(a).chain(it.by_ref()).collect());
            break;
        }
        let mut item = vec![a];
        if takes_value(&item[0]) {
            item.extend(it.next());
        }
        items.push(item);
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let overridden = item.len() == 2
            && takes_value(&item[0])
            && items[i + 1..].iter().any(|l| l[0] == item[0]);
        if !overridden {
            out.extend(item.iter().cloned());
        }
    }
    out
}

/// The command line, with tectonic-torcx's multicall names (`tectonic-torcx-bootstrap`,
/// `tectonic-torcx-hook-pre`) turned into their subcommands, normalised.
pub fn args() -> Vec<String> {
    started();
    let mut argv: Vec<String> = std::env::args().collect();
    let prog = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    match prog.as_str() {
        "tectonic-torcx-bootstrap" => argv.insert(1, "bootstrap".into()),
        "tectonic-torcx-hook-pre" => argv.insert(1, "hook".into()),
        _ => {}
    }
    normalize(argv.get(1..).unwrap_or_default())
}
