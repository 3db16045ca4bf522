//! Feeds arbitrary server bytes to the NBD client backing's reply reader (the code a
//! connection's reader thread runs) for three requests in flight: a 4 KiB read at 4 KiB
//! (handle 1), a write (handle 2) and a 512-byte read at 0 (handle 3). The first byte's
//! bit 0 says whether structured replies were negotiated; the rest is the server's stream.
//! Besides not panicking, a read that succeeds must have exactly its length of data.
#![no_main]

use cryptblk_dm::backing::nbd::parse_replies;
use cryptblk_dm::backing::nbd::proto::{CMD_READ, CMD_WRITE};
use libfuzzer_sys::fuzz_target;

const REQUESTS: [(u16, u64, u32); 3] = [
    (CMD_READ, 4096, 4096),
    (CMD_WRITE, 0, 512),
    (CMD_READ, 0, 512),
];

fuzz_target!(|data: &[u8]| {
    let Some((&negotiated, stream)) = data.split_first() else {
        return;
    };
    let parsed = parse_replies(negotiated & 1 != 0, &REQUESTS, stream);
    for (outcome, (cmd, _, len)) in parsed.outcomes.iter().zip(REQUESTS) {
        if let Some(Ok(d)) = outcome {
            let want = if cmd == CMD_READ { len as usize } else { 0 };
            assert_eq!(d.len(), want, "a successful reply with the wrong length");
        }
    }
});
