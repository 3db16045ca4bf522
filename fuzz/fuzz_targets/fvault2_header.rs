//! Feeds arbitrary bytes to the FileVault2 metadata reader as the start of a device (the rest
//! of a 64 MiB device reads as zeros): the physical volume header, the disk label, the
//! encrypted metadata blocks and their XML, then the dump and, for low iteration counts,
//! the passphrase unlock (the input's first bytes as the passphrase; higher counts would
//! stall the fuzzer in PBKDF2). Garbage must be an error, never a panic or a huge allocation.
#![no_main]

use cryptblk_format::fvault2::Fvault2Header;
use libfuzzer_sys::fuzz_target;

#[path = "zero_device.rs"]
mod zero_device;
use zero_device::Device;

fuzz_target!(|data: &[u8]| {
    let dev = Device { data, size: 64 << 20 };
    let _ = Fvault2Header::probe(&dev);
    if let Ok(h) = Fvault2Header::read(&dev) {
        let _ = h.dump("fuzz");
        if h.pbkdf2_iterations <= 16 {
            let _ = h.unlock(&data[..data.len().min(16)]);
            let _ = h.unlock(b"synthetic");
        }
    }
});
