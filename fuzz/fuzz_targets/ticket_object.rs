//! join-service's ticket record in the cluster (a ConfigMap as the API server returns it): read
//! strictly, judged by the rule without overflow at any time, written back and read the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::fuzz::ticket_object;

fuzz_target!(|data: &[u8]| {
    let _ = ticket_object(data);
});
