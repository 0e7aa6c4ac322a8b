//! What an init server or join service reads from a node: the HTTP request framing, then the
//! ticket request and the init request JSON and its validation. A request that parsed
//! serializes and reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::activation::exchange::read_request;
use nodestrap::activation::wire::{as_flag, InitRequest, TicketRequest};

fuzz_target!(|data: &[u8]| {
    let Ok(req) = read_request(&mut &data[..]) else {
        return;
    };
    assert!(req.body.len() <= data.len());
    if let Ok(t) = TicketRequest::parse(&req.body) {
        let text = serde_json::to_vec(&t).expect("serializes");
        assert_eq!(TicketRequest::parse(&text), Ok(t), "reads back");
    }
    let Ok(init) = serde_json::from_slice::<InitRequest>(&req.body) else {
        return;
    };
    if let Err(m) = init.validate() {
        // init-cluster repeats the message under the flag's name.
        let _ = as_flag(&m);
    }
    let text = serde_json::to_vec(&init).expect("serializes");
    let again: InitRequest = serde_json::from_slice(&text).expect("reads back");
    assert_eq!(
        serde_json::to_value(&again).unwrap(),
        serde_json::to_value(&init).unwrap()
    );
});
