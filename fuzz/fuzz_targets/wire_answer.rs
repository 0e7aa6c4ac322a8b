//! What activate reads back from a join service: the HTTP answer framing, the error body, then
//! the join ticket JSON and its validation (PEM and certificate walk of a control-plane ticket).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::activation::exchange::answer_error;
use nodestrap::fuzz::wire_answer;
use nodestrap::activation::wire::Ticket;

// The pin of the tests' CA would need its key; any well-formed pin exercises every check.
const PIN: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fuzz_target!(|data: &[u8]| {
    let Ok((status_line, body)) = wire_answer(&mut &data[..]) else {
        return;
    };
    // The status line is decoded lossily (it can outgrow its bytes); the body cannot.
    assert!(body.len() <= data.len(), "{status_line:?}");
    let _ = answer_error(409, &body);
    let Ok(t) = serde_json::from_slice::<Ticket>(&body) else {
        return;
    };
    let _ = t.validate(PIN);
    let text = serde_json::to_vec(&t).expect("serializes");
    let again: Ticket = serde_json::from_slice(&text).expect("reads back");
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        serde_json::to_value(&t).unwrap()
    );
});
