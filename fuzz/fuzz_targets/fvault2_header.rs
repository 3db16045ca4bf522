//! Feeds arbitrary bytes to the FileVault2 metadata reader as the start of a device (the rest
//! of a 64 MiB device reads as zeros): the physical volume header, the disk label, the
//! encrypted metadata blocks and their XML, then the dump and, for low iteration counts,
//! the passphrase unlock (the input's first bytes as the passphrase; higher counts would
//! stall the fuzzer in PBKDF2). Garbage must be an error, never a panic or a huge allocation.
#![no_main]

use cryptblk_format::fvault2::Fvault2Header;
use cryptblk_format::hdrio::HeaderIo;
use libfuzzer_sys::fuzz_target;

/// The input at the start of a zero-filled device of `size` bytes.
struct Device<'a> {
    data: &'a [u8],
    size: u64,
}

impl HeaderIo for Device<'_> {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.size)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        for (i, b) in buf.iter_mut().enumerate() {
            let at = offset + i as u64;
            *b = if at < self.data.len() as u64 { self.data[at as usize] } else { 0 };
        }
        Ok(())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
}

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
