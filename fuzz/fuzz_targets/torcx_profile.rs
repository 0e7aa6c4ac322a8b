//! torcx profiles (`profile-manifest-v0/v1` JSON): what parsed is written back (as bootstrap
//! does when it sets an image) and reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::torcx::store::Profile;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Profile::parse(data, "profile.json") else {
        return;
    };
    let text = serde_json::to_vec(&p).expect("a profile serializes");
    let again = Profile::parse(&text, "rewritten").expect("a written profile parses");
    assert_eq!(again.kind, p.kind);
    assert_eq!(again.value.images, p.value.images);
    for i in &p.value.images {
        assert!(again.reference(&i.name).is_some());
    }
});
