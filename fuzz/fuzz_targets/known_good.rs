//! The sysext bootstrap and `nodestrap verify` reading the node's known-good set
//! (`sysext::known_good::KnownGood::from_json`): any bytes are a set or an error, never a panic;
//! a set read is written back as the same set, and its refusals are found by name and digest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::sysext::known_good::KnownGood;

fuzz_target!(|data: &[u8]| {
    let Ok(k) = KnownGood::from_json(data, "known-good.json") else {
        return;
    };
    let text = k.to_json().expect("a set read can be written");
    let again = KnownGood::from_json(&text, "again").expect("a set written can be read");
    assert_eq!(again, k);
    for r in &k.refused {
        assert!(k.refusal(&r.name, &r.digest).is_some());
    }
});
