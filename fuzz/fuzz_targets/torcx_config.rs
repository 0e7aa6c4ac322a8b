//! torcx's configuration file (`torcx::layout::Layout::parse`): any bytes are either refused,
//! saying torcx would not start with them, or give a layout whose every store path is absolute
//! and clean (nodestrap stages into them), never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = nodestrap::fuzz::torcx_config(data) {
        assert!(e.contains("torcx would not start"), "{e}");
    }
});
