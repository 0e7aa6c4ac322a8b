//! `nodestrap bootstrap --help` in groups. argh lists options in field order, which for
//! bootstrap's three dozen is one long list; an operator looks for the ones of a payload or of the
//! network. The groups come from the tables that also decide which options each payload takes
//! (`check::TORCX_ONLY`, `check::SYSEXT_ONLY`), so the help cannot say otherwise than the check.

use argh::FromArgs;

use crate::cli::check::{SYSEXT_ONLY, TORCX_ONLY};

/// Options about the network: the API server's and the downloads' retries and limits.
pub(crate) const NETWORK: &[&str] = &[
    "ca-file",
    "registry-auth",
    "registry-config-path",
    "api-tries",
    "api-retry-delay",
    "deadline",
    "fetch-attempts",
    "fetch-backoff-ms",
    "fetch-timeout",
    "fetch-min-rate",
    "fetch-min-rate-window",
    "image-max-mib",
];

/// bootstrap's help with its options in groups: common, torcx, sysext, network (every option
/// not in a later group is common). Any other text passes unchanged.
pub(crate) fn grouped(text: &str) -> String {
    let Some((head, rest)) = text.split_once("\nOptions:\n") else {
        return text.to_string();
    };
    let (block, tail) = match rest.find("\n\n") {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let entries = entries(block);
    // (title, the group's table; `None`: every option in no other table).
    let groups: [(&str, Option<&[&str]>); 4] = [
        ("Options:", None),
        (
            "torcx payload (--payload torcx, the default):",
            Some(TORCX_ONLY),
        ),
        ("sysext payload (--payload sysext):", Some(SYSEXT_ONLY)),
        ("Network (the API server and downloads):", Some(NETWORK)),
    ];
    let tables = [TORCX_ONLY, SYSEXT_ONLY, NETWORK];
    let member = |table: Option<&[&str]>, n: &str| match table {
        Some(t) => t.contains(&n),
        None => !tables.iter().any(|t| t.contains(&n)),
    };
    let mut out = format!("{head}\n");
    for (title, table) in groups {
        let mine: Vec<&(String, String)> = entries
            .iter()
            .filter(|(name, _)| !name.is_empty() && member(table, name))
            .collect();
        if mine.is_empty() {
            continue;
        }
        out.push_str(&format!("{title}\n"));
        for (_, e) in mine {
            out.push_str(e);
        }
        out.push('\n');
    }
    // The help triggers' own line (no long option name) ends the list.
    for (_, e) in entries.iter().filter(|(n, _)| n.is_empty()) {
        out.push_str(e);
    }
    if out.ends_with('\n') && !tail.is_empty() {
        out.pop();
    }
    out.push_str(tail);
    out
}

/// Each option's lines (`  --name  text`, then lines indented deeper), keyed by its name
/// without dashes; the help triggers' line has an empty name.
pub(crate) fn entries(block: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        let trimmed = line.trim_start();
        let starts = line.len() - trimmed.len() == 2 && trimmed.starts_with('-');
        if starts || out.is_empty() {
            let name = trimmed
                .strip_prefix("--")
                .and_then(|r| r.split_whitespace().next())
                .filter(|n| !n.ends_with(','))
                .unwrap_or_default()
                .to_string();
            out.push((name, String::new()));
        }
        if let Some((_, e)) = out.last_mut() {
            e.push_str(line);
            e.push('\n');
        }
    }
    out
}

/// The closest of `candidates` to `word` (typos: at most a third of its letters wrong, and 3),
/// for a did-you-mean.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, by characters; both are short (option names).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// argh's "Unrecognized argument: X" for `args` (normalised, subcommand first), with the
/// option or command it was probably meant to be.
pub(crate) fn did_you_mean(output: &str, args: &[String]) -> Option<String> {
    let arg = output
        .lines()
        .next()?
        .strip_prefix("Unrecognized argument: ")?;
    let options: Vec<String> = match args.first() {
        Some(sub) if !sub.starts_with('-') && arg.starts_with("--") => {
            let help = crate::cli::Cli::from_args(&["nodestrap"], &[sub.as_str(), "--help"])
                .err()?
                .output;
            let (_, rest) = help.split_once("\nOptions:\n")?;
            entries(rest.split("\n\n").next()?)
                .into_iter()
                .filter(|(n, _)| !n.is_empty())
                .map(|(n, _)| format!("--{n}"))
                .collect()
        }
        _ => crate::cli::COMMANDS.iter().map(|c| c.to_string()).collect(),
    };
    closest(arg, options.iter().map(String::as_str)).map(|c| format!("Did you mean {c}?\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;

    #[test]
    fn the_command_list_is_arghs() {
        let top = Cli::from_args(&["nodestrap"], &["--help"])
            .expect_err("help")
            .output;
        let (_, listed) = top.split_once("\nCommands:\n").unwrap();
        let names: Vec<&str> = listed
            .lines()
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(names, crate::cli::COMMANDS);
    }

    #[test]
    fn typos_find_their_option_and_nothing_else_does() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dym = |arg: &str, a: &[&str]| {
            did_you_mean(&format!("Unrecognized argument: {arg}\n"), &args(a))
        };
        assert_eq!(
            dym("--sysext-ur", &["bootstrap"]).as_deref(),
            Some("Did you mean --sysext-url?\n")
        );
        assert_eq!(
            dym("--kubconfig", &["hook"]).as_deref(),
            Some("Did you mean --kubeconfig?\n")
        );
        assert_eq!(
            dym("bootstra", &["bootstra"]).as_deref(),
            Some("Did you mean bootstrap?\n")
        );
        assert_eq!(dym("--frobnicate", &["bootstrap"]), None);
        assert_eq!(closest("reboot", ["reboot"]), Some("reboot"));
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    fn help(cmd: &str) -> String {
        Cli::from_args(&["nodestrap"], &[cmd, "--help"])
            .expect_err("help")
            .output
    }

    /// Every option argh lists is in the grouped help exactly once, and every name the tables
    /// hold is one of bootstrap's options: the tables cannot drift from the struct.
    #[test]
    fn every_option_once_and_every_table_name_an_option() {
        let raw = help("bootstrap");
        let (_, rest) = raw.split_once("\nOptions:\n").unwrap();
        let names: Vec<String> = entries(rest.split("\n\n").next().unwrap())
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| !n.is_empty())
            .collect();
        assert!(names.len() > 30, "{names:?}");
        let grouped = grouped(&raw);
        let listed: Vec<String> = grouped
            .split("\nExamples:")
            .next()
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("  --"))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect();
        for n in &names {
            let count = listed.iter().filter(|x| *x == n).count();
            assert_eq!(count, 1, "--{n} in\n{grouped}");
        }
        assert_eq!(listed.len(), names.len(), "{grouped}");
        for n in TORCX_ONLY.iter().chain(SYSEXT_ONLY).chain(NETWORK) {
            assert!(names.iter().any(|x| x == n), "table names --{n}");
        }
        for title in [
            "torcx payload",
            "sysext payload",
            "Network",
            "Examples:",
            "Notes:",
        ] {
            assert!(grouped.contains(title), "{title} in\n{grouped}");
        }
        assert!(grouped.contains("  -h, --help, help"), "{grouped}");
    }

    /// What an operator reads first fits a screen, and each option says its default (or that
    /// it has none: a switch, or required with its payload).
    #[test]
    fn usage_fits_a_screen_and_every_option_says_its_default() {
        let raw = help("bootstrap");
        let usage = raw.lines().next().unwrap();
        assert!(usage.len() <= 80, "{usage}");
        let (_, rest) = raw.split_once("\nOptions:\n").unwrap();
        for (name, text) in entries(rest.split("\n\n").next().unwrap()) {
            let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let switch = ["cmdline", "dry-run", ""].contains(&name.as_str());
            assert!(
                switch || flat.contains("default") || flat.contains("required with"),
                "--{name} says no default: {flat}"
            );
        }
    }
}
