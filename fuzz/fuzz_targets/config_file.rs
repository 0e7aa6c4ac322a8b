//! The bootstrap config file (`key=value` lines): settings are known, unique, and survive
//! being written back quoted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::cli::settings::KEYS;
use nodestrap::fuzz::config_file;

fuzz_target!(|text: &str| {
    let Ok(settings) = config_file(text, "bootstrap.conf") else {
        return;
    };
    for (i, (k, _)) in settings.iter().enumerate() {
        assert!(KEYS.contains(k), "{k} is a bootstrap option");
        assert!(!settings[..i].iter().any(|(x, _)| x == k), "{k} once");
    }
    let written: String = settings
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\"\n"))
        .collect();
    let again = config_file(&written, "rewritten").expect("rewritten file parses");
    assert_eq!(again, settings);
});
