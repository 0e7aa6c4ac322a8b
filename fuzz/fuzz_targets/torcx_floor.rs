//! The torcx bootstrap and the hook reading the node's torcx version floor
//! (`StateFile::from_json` of `torcx::floor::TorcxFloor`): any bytes are floors or an error, never a panic;
//! floors read are written back as the same floors, and a lower version never lowers a floor
//! without the downgrade flag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::state_file::StateFile;
use nodestrap::torcx::floor::TorcxFloor;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = TorcxFloor::from_json(data, "torcx-floor.json") else {
        return;
    };
    let text = f.to_json().expect("floors read can be written");
    let again = TorcxFloor::from_json(&text, "again").expect("floors written can be read");
    assert_eq!(again, f);
    let mut f = f;
    for x in f.floor.clone().iter() {
        if let Some((v, _)) = f.floor.of(&x.name) {
            let lower = nodestrap::node::floor::Version(vec![0]);
            f.floor.staged(&x.name, &lower, "0", "t", false);
            assert_eq!(f.floor.of(&x.name).map(|(y, _)| y), Some(v));
        }
    }
});
