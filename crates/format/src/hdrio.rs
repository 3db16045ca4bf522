//! Header device access: a minimal positional-I/O trait for metadata updates, with a file
//! implementation, an in-memory one, and a fault-injecting wrapper for crash-safety tests.
//!
//! Metadata code writes through [`HeaderIo`] only, so a test can stop the sequence of writes
//! at any point ([`FaultyIo`]) — optionally tearing the interrupted write at a 512-byte
//! boundary — and then check the volume still opens with either the old or the new keys.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

/// Positional reads and writes on the device (or detached header file) holding metadata.
pub trait HeaderIo {
    /// Current size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; reading past the end is an `UnexpectedEof` error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (files grow as needed).
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes completed writes durable (a write barrier between dependent updates).
    fn sync(&self) -> io::Result<()>;
}

impl HeaderIo for File {
    fn size(&self) -> io::Result<u64> {
        // Seeking works for block devices, whose metadata length is 0.
        let mut f = self;
        f.seek(SeekFrom::End(0))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

impl<T: HeaderIo + ?Sized> HeaderIo for &T {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(offset, buf)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
}

impl<T: HeaderIo + ?Sized> HeaderIo for Box<T> {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(offset, buf)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
}

/// A growable in-memory device (tests, header backups assembled in memory).
#[derive(Debug, Default)]
pub struct MemIo {
    data: Mutex<Vec<u8>>,
}

impl MemIo {
    /// A device holding `data`.
    pub fn new(data: Vec<u8>) -> Self {
        MemIo {
            data: Mutex::new(data),
        }
    }

    /// A zero-filled device of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::new(vec![0; len])
    }

    /// A copy of the current contents.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// The contents, consuming the device.
    pub fn into_inner(self) -> Vec<u8> {
        self.data.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic elsewhere cannot leave the bytes inconsistent; keep going.
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl HeaderIo for MemIo {
    fn size(&self) -> io::Result<u64> {
        Ok(self.lock().len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.lock();
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= data.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut data = self.lock();
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = start
            .checked_add(buf.len())
            .ok_or(io::ErrorKind::InvalidInput)?;
        if end > data.len() {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// How a [`FaultyIo`] misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Index (0-based) of the write that fails; it and every later write fail (the machine
    /// "crashed" there). `None`: never fail.
    pub fail_write: Option<usize>,
    /// When the failing write is reached, first apply this many of its leading 512-byte
    /// sectors (a torn write), then fail.
    pub torn_sectors: usize,
}

/// Wraps a device and injects a crash at a chosen write.
#[derive(Debug)]
pub struct FaultyIo<D> {
    inner: D,
    plan: FaultPlan,
    writes: Mutex<usize>,
}

impl<D: HeaderIo> FaultyIo<D> {
    /// Wraps `inner` with `plan`.
    pub fn new(inner: D, plan: FaultPlan) -> Self {
        FaultyIo {
            inner,
            plan,
            writes: Mutex::new(0),
        }
    }

    /// Number of `write_at` calls seen so far (including failed ones).
    pub fn writes_attempted(&self) -> usize {
        *self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The wrapped device.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// The wrapped device, borrowed.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: HeaderIo> HeaderIo for FaultyIo<D> {
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut count = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let index = *count;
        *count += 1;
        match self.plan.fail_write {
            Some(n) if index == n => {
                let torn = (self.plan.torn_sectors * 512).min(buf.len());
                if torn > 0 {
                    self.inner.write_at(offset, &buf[..torn])?;
                }
                Err(io::Error::other(format!(
                    "injected failure at write {index}"
                )))
            }
            Some(n) if index > n => Err(io::Error::other(format!(
                "device gone after injected failure at write {n}"
            ))),
            _ => self.inner.write_at(offset, buf),
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_io_reads_back_and_grows() {
        let m = MemIo::zeroed(4);
        m.write_at(2, b"abcd").unwrap();
        assert_eq!(m.size().unwrap(), 6);
        let mut b = [0u8; 4];
        m.read_at(2, &mut b).unwrap();
        assert_eq!(&b, b"abcd");
        assert!(m.read_at(4, &mut b).is_err());
    }

    #[test]
    fn faulty_io_tears_then_fails_everything_after() {
        let f = FaultyIo::new(
            MemIo::zeroed(2048),
            FaultPlan {
                fail_write: Some(1),
                torn_sectors: 1,
            },
        );
        f.write_at(0, &[1; 512]).unwrap();
        assert!(f.write_at(512, &[2; 1024]).is_err());
        assert!(f.write_at(0, &[3; 512]).is_err());
        let data = f.into_inner().into_inner();
        assert_eq!(&data[..512], &[1; 512][..]);
        assert_eq!(&data[512..1024], &[2; 512][..]);
        assert_eq!(&data[1024..1536], &[0; 512][..]);
    }

    #[test]
    fn file_io_round_trips() {
        let path = std::env::temp_dir().join(format!("cryptblk-hdrio-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        HeaderIo::write_at(&f, 1000, b"xyz").unwrap();
        assert_eq!(HeaderIo::size(&f).unwrap(), 1003);
        let mut b = [0u8; 3];
        HeaderIo::read_at(&f, 1000, &mut b).unwrap();
        assert_eq!(&b, b"xyz");
        f.sync().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
