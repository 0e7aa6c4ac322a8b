//! containerd's `hosts.toml` (registry mirrors): the TOML reader over `toml_parser`'s grammar and
//! the hosts read from it. Read or refused, never a panic or a hang; hosts keep containerd's
//! order and shape.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        nodestrap::fuzz::hosts_toml(text)
    }
});
