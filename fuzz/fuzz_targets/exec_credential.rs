//! The output of a kubeconfig `exec` credential plugin (an `ExecCredential`, JSON): refused or
//! read, never a panic; a credential read is never empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::net::kube::fuzz_parse_exec_output;

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = fuzz_parse_exec_output(data, 1_800_000_000) {
        assert!(n > 0, "an empty credential was accepted");
    }
});
