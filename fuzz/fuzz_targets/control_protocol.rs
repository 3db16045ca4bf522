//! Feeds arbitrary lines to the daemon's control request parser (the versioned envelope and
//! every request inside it): anything but a well-formed request of this protocol version
//! must be an error answer, never a panic; an accepted request must encode back to a line
//! that decodes to the same request.
#![no_main]

use cryptblk_volume::control::protocol::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    match Request::decode(line) {
        Ok(req) => {
            let again = Request::decode(&req.encode()).expect("an encoded request decodes");
            assert_eq!(again, req);
            let _ = format!("{req:?}");
        }
        Err(answer) => {
            // The refusal is sent back on the wire: it must encode as one line.
            let wire = answer.encode();
            assert_eq!(wire.matches('\n').count(), 1, "one answer line: {wire:?}");
        }
    }
});
