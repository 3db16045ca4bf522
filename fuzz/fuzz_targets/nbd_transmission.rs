//! Feeds arbitrary requests to the NBD server's transmission phase over an in-memory
//! stream against a RAM disk. The first byte chooses what the handshake would have
//! negotiated (bit 0: structured replies, bit 1: block-size agreement, bit 2: the
//! base:allocation context); the rest is the client's request stream.
#![no_main]

use std::sync::{Arc, OnceLock};

use cryptblk_dm::RamDisk;
use cryptblk_export::nbd::NbdHarness;
use cryptblk_export::NbdConfig;
use libfuzzer_sys::fuzz_target;

fn harness() -> &'static NbdHarness {
    static HARNESS: OnceLock<NbdHarness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let disk = Arc::new(RamDisk::new(1 << 20).expect("RAM disk"));
        let config = NbdConfig::unix("/nonexistent/unused.sock");
        NbdHarness::new(disk, config).expect("harness")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&negotiated, requests)) = data.split_first() else {
        return;
    };
    let _ = harness().requests(
        negotiated & 1 != 0,
        negotiated & 2 != 0,
        negotiated & 4 != 0,
        requests,
    );
});
