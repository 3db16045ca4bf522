//! Feeds arbitrary bytes to the verity superblock parser and what is built on a parsed
//! superblock (tree geometry, `veritysetup dump` text, a whole-device verify over the input
//! itself): garbage must be an error, never a panic, a loop or an unbounded allocation.
#![no_main]

use cryptblk_format::hdrio::MemIo;
use cryptblk_format::verity::{self, VeritySuperblock};
use libfuzzer_sys::fuzz_target;

/// Largest data area verified per input, so one input cannot hash for minutes.
const MAX_VERIFIED_BYTES: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(sb) = VeritySuperblock::parse(data) else {
        return;
    };
    // Whatever is accepted must serialise and re-parse to the same superblock.
    if let Ok(bytes) = sb.to_bytes() {
        assert_eq!(VeritySuperblock::parse(&bytes).expect("re-parse"), sb);
    }
    let _ = sb.uuid_string();
    let _ = verity::dump(&sb, "fuzz", 0);
    let Ok(params) = sb.params(0) else {
        return;
    };
    let Ok(geometry) = params.geometry() else {
        return;
    };
    let _ = geometry.hash_blocks();
    let _ = geometry.hash_device_end();
    let data_bytes = sb.data_blocks.saturating_mul(u64::from(sb.data_block_size));
    if data_bytes <= MAX_VERIFIED_BYTES {
        // The input is both the data and the hash device (superblock at offset 0).
        let dev = MemIo::new(data.to_vec());
        let _ = verity::verify(&dev, &dev, &params, &[0u8; 32]);
    }
});
