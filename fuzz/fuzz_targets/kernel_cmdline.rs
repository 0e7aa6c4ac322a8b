//! `nodestrap.<key>=<value>` kernel arguments among everyone else's: settings are known,
//! unique, and survive being written back as quoted arguments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::cli::settings::KEYS;
use nodestrap::fuzz::kernel_cmdline;

fuzz_target!(|text: &str| {
    let Ok(settings) = kernel_cmdline(text) else {
        return;
    };
    for (i, (k, _)) in settings.iter().enumerate() {
        assert!(KEYS.contains(k), "{k} is a bootstrap option");
        assert!(!settings[..i].iter().any(|(x, _)| x == k), "{k} once");
    }
    // The kernel has no escape for a quote inside a quoted value: only the others round-trip.
    if settings.iter().all(|(_, v)| !v.contains('"')) {
        let written: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("nodestrap.{k}=\"{v}\""))
            .collect();
        let again = kernel_cmdline(&written.join(" ")).expect("rewritten arguments parse");
        assert_eq!(again, settings);
    }
});
