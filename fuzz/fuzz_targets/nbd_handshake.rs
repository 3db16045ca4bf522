//! Feeds arbitrary client bytes to the NBD server's option phase (greeting, client flags,
//! option haggling, and the requests that follow a successful NBD_OPT_GO), over an
//! in-memory stream against a RAM disk: every input must end in a reply or an error, never
//! a panic, a hang or an unbounded allocation.
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
        let mut config = NbdConfig::unix("/nonexistent/unused.sock");
        config.export_name = "fuzz".to_string();
        NbdHarness::new(disk, config).expect("harness")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = harness().session(data);
});
