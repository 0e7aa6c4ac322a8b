//! A sysext source's SHA256SUMS (`Sums::parse`): any input is refused or parsed within its
//! budget, and every entry it keeps is a bare file name with a SHA-256 that images of it carry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::sysext::sums::{Sums, Version, MAX_LINES};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = Sums::parse(data, "fuzz/SHA256SUMS") else {
        return;
    };
    assert!(s.entries.len() + s.best_before.len() <= MAX_LINES);
    for e in &s.entries {
        assert!(!e.file.is_empty() && !e.file.contains('/') && !e.file.starts_with("BEST-BEFORE-"));
        assert_eq!(e.digest.hex.len(), 64);
    }
    for d in &s.best_before {
        // A kept date is a real one, written back the same way.
        assert!(data.windows(10).any(|w| w == d.to_string().as_bytes()));
        let _ = s.check_fresh(d.epoch_secs(), "fuzz");
    }
    for name in ["kubernetes", "containerd"] {
        for i in s.images(name, "x86-64") {
            assert!(i.file.starts_with(name) && i.file.ends_with("-x86-64.raw"));
            assert_eq!(Version::parse(&i.label()), Some(i.version.clone()));
        }
    }
});
