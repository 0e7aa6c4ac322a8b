//! A run reading what the run before left of a server's load (`net::handover::parse`, the run
//! folder's `retry-*.json`): any bytes are a load or nothing, never a panic; a load read is
//! written back and reads as the same load.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::net::handover;

const SERVER: &str = "https://10.0.0.1:6443";

fuzz_target!(|data: &[u8]| {
    let now = (std::time::Instant::now(), std::time::SystemTime::now());
    let Some(load) = handover::parse(data, SERVER, now) else {
        return;
    };
    let bytes = handover::to_bytes(&load, SERVER, now);
    let again = handover::parse(&bytes, SERVER, now).expect("a load written can be read");
    let (a, b) = (
        handover::to_bytes(&again, SERVER, now),
        handover::to_bytes(&load, SERVER, now),
    );
    // The moment goes through the wall clock and back: equal within a millisecond.
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_slice(&a).unwrap(), serde_json::from_slice(&b).unwrap());
    assert_eq!(a["streak"], b["streak"]);
    assert_eq!(a["last"], b["last"]);
    match (a["not-before"].as_f64(), b["not-before"].as_f64()) {
        (Some(x), Some(y)) => assert!((x - y).abs() < 1e-3, "{x} {y}"),
        (x, y) => assert_eq!(x, y),
    }
});
