//! Feeds arbitrary bytes to the BitLocker header parser as the start of a device (the rest
//! of a 64 MiB device reads as zeros), then to what is built on an accepted header: the dump,
//! the clear-key unlock and the startup-key unlock with the input itself as the `.BEK` file
//! (the passphrase paths are left out: a million SHA-256 rounds per run would stall the
//! fuzzer, and they only hash). Garbage must be an error, never a panic or a huge allocation.
#![no_main]

use cryptblk_format::bitlk::{BitlkHeader, BitlkKey};
use libfuzzer_sys::fuzz_target;

#[path = "zero_device.rs"]
mod zero_device;
use zero_device::Device;

fuzz_target!(|data: &[u8]| {
    let dev = Device { data, size: 64 << 20 };
    let _ = BitlkHeader::probe(&dev);
    if let Ok(h) = BitlkHeader::read(&dev) {
        let _ = h.dump("fuzz");
        let _ = h.unlock(&BitlkKey::None);
        let _ = h.unlock(&BitlkKey::Secret(data));
    }
});
