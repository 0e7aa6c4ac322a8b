//! The sysext bootstrap and `nodestrap verify` reading the node's known-good set
//! (`StateFile::from_json` of `sysext::known_good::KnownGood`): any bytes are a set or an error, never a panic;
//! a set read is written back as the same set, its refusals are found by name and digest, and
//! a lower version never lowers a floor without the downgrade flag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::state_file::StateFile;
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
    // The floor only rises through `staged`, whatever the file held.
    let mut k = k;
    for f in k.floor.clone().iter() {
        if let Some((v, _)) = k.floor.of(&f.name) {
            let lower = nodestrap::sysext::sums::Version(vec![0]);
            k.floor.staged(&f.name, &lower, "0", "t", false);
            assert_eq!(k.floor.of(&f.name).map(|(x, _)| x), Some(v));
        }
    }
});
