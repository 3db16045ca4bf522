//! The fuzz input as the start of a zero-filled device: what the header fuzz targets read
//! their format from (bitlk_header, fvault2_header).

use cryptblk_format::hdrio::HeaderIo;

/// The input at the start of a zero-filled device of `size` bytes.
pub struct Device<'a> {
    /// The device's first bytes.
    pub data: &'a [u8],
    /// The device's size in bytes.
    pub size: u64,
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
