//! `ram:<size>`: a RAM disk (the kernel's brd), allocated lazily in chunks.
//!
//! A chunk is allocated on its first write, so a 4 GiB disk costs nothing until used; reads
//! of never-written chunks return zeros. Every chunk has its own lock, so threads working on
//! different chunks never contend (brd gets the same effect from per-page radix-tree slots).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::device::{check_range, BlockDevice, CopyTransform, WriteFlags};

/// Smallest chunk: large enough that per-chunk locking is cheap, small enough that sparse
/// use stays sparse.
const MIN_CHUNK_SHIFT: u32 = 16;
/// Cap on the number of chunk slots, so huge disks keep a small index.
const MAX_CHUNKS: u64 = 1 << 20;

/// Transformed requests must start on this boundary for chunk edges (multiples of the
/// chunk size) to fall on the 4 KiB steps [`CopyTransform`] promises.
const TRANSFORM_ALIGN: u64 = 4096;

type Chunk = RwLock<Option<Box<[u8]>>>;

/// A sparse, thread-safe RAM disk.
pub struct RamDisk {
    size: u64,
    chunk_shift: u32,
    chunks: Box<[Chunk]>,
    allocated_chunks: AtomicU64,
}

impl RamDisk {
    /// Creates a RAM disk of `size` bytes (a multiple of 512); no memory is committed yet.
    pub fn new(size: u64) -> io::Result<Self> {
        if size == 0 || !size.is_multiple_of(crate::SECTOR_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("RAM disk size {size} is not a non-zero multiple of 512"),
            ));
        }
        let mut chunk_shift = MIN_CHUNK_SHIFT;
        while size.div_ceil(1 << chunk_shift) > MAX_CHUNKS {
            chunk_shift += 1;
        }
        let count = size.div_ceil(1 << chunk_shift) as usize;
        let chunks = (0..count).map(|_| RwLock::new(None)).collect();
        Ok(RamDisk {
            size,
            chunk_shift,
            chunks,
            allocated_chunks: AtomicU64::new(0),
        })
    }

    /// Bytes of memory currently committed to data.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_chunks.load(Ordering::Relaxed) << self.chunk_shift
    }

    fn chunk_size(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// Length in bytes of chunk `index` (the last one may be short).
    fn chunk_len(&self, index: usize) -> usize {
        let start = (index as u64) << self.chunk_shift;
        (self.size - start).min(self.chunk_size()) as usize
    }

    fn read_chunk(&self, index: usize) -> RwLockReadGuard<'_, Option<Box<[u8]>>> {
        // A poisoned lock only means another thread panicked mid-copy; the bytes are still
        // memory, so carry on rather than failing every later request.
        self.chunks[index].read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_chunk(&self, index: usize) -> RwLockWriteGuard<'_, Option<Box<[u8]>>> {
        self.chunks[index]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The memory of chunk `index` (locked for writing as `chunk`), allocated if needed.
    fn allocate<'c>(&self, chunk: &'c mut Option<Box<[u8]>>, index: usize) -> &'c mut [u8] {
        chunk.get_or_insert_with(|| {
            self.allocated_chunks.fetch_add(1, Ordering::Relaxed);
            // vec![0; n] uses calloc: fresh pages stay untouched until written.
            vec![0u8; self.chunk_len(index)].into_boxed_slice()
        })
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_request)` for each chunk piece of a
    /// request.
    fn for_each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
    ) {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let index = (pos >> self.chunk_shift) as usize;
            let within = (pos & (self.chunk_size() - 1)) as usize;
            let n = (self.chunk_len(index) - within).min((len - done) as usize);
            f(index, within, done as usize..done as usize + n);
            done += n as u64;
        }
    }

    /// Zeroes a range, freeing chunks it covers entirely.
    fn zero_range(&self, offset: u64, len: u64) {
        self.for_each_piece(offset, len, |index, within, range| {
            let mut chunk = self.write_chunk(index);
            if range.len() == self.chunk_len(index) {
                if chunk.take().is_some() {
                    self.allocated_chunks.fetch_sub(1, Ordering::Relaxed);
                }
            } else if let Some(data) = chunk.as_mut() {
                data[within..within + range.len()].fill(0);
            }
        });
    }
}

impl BlockDevice for RamDisk {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |index, within, range| {
            let chunk = self.read_chunk(index);
            match chunk.as_ref() {
                Some(data) => {
                    buf[range.clone()].copy_from_slice(&data[within..within + range.len()])
                }
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |index, within, range| {
            let mut chunk = self.write_chunk(index);
            let data = self.allocate(&mut chunk, index);
            data[within..within + range.len()].copy_from_slice(&buf[range]);
        });
        Ok(())
    }

    /// One pass: data is transformed straight out of the chunks into `buf`.
    fn read_transformed(
        &self,
        offset: u64,
        buf: &mut [u8],
        t: &dyn CopyTransform,
    ) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        if !offset.is_multiple_of(TRANSFORM_ALIGN) {
            // Chunk boundaries would not fall on 4 KiB steps of the request.
            self.read_at(offset, buf)?;
            return t.in_place(0, buf);
        }
        let mut result = Ok(());
        self.for_each_piece(offset, buf.len() as u64, |index, within, range| {
            if result.is_err() {
                return;
            }
            let chunk = self.read_chunk(index);
            let pos = range.start;
            result = match chunk.as_ref() {
                Some(data) => t.copy(pos, &data[within..within + range.len()], &mut buf[range]),
                None => {
                    buf[range.clone()].fill(0);
                    t.in_place(pos, &mut buf[range])
                }
            };
        });
        result
    }

    /// One pass: `t(buf)` is written straight into the chunks.
    fn write_transformed(
        &self,
        offset: u64,
        buf: &mut [u8],
        t: &dyn CopyTransform,
        flags: WriteFlags,
    ) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        if !offset.is_multiple_of(TRANSFORM_ALIGN) {
            t.in_place(0, buf)?;
            return self.write_at(offset, buf, flags);
        }
        let mut result = Ok(());
        self.for_each_piece(offset, buf.len() as u64, |index, within, range| {
            if result.is_err() {
                return;
            }
            let mut chunk = self.write_chunk(index);
            let data = self.allocate(&mut chunk, index);
            let pos = range.start;
            result = t.copy(
                pos,
                &buf[range.clone()],
                &mut data[within..within + range.len()],
            );
        });
        result
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_allocation_and_zero_reads() {
        let disk = RamDisk::new(4 << 30).unwrap();
        assert_eq!(disk.allocated_bytes(), 0);
        let mut buf = vec![0xffu8; 8192];
        disk.read_at(1 << 30, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        // A write straddling a chunk boundary allocates exactly two chunks.
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let off = (1 << 16) - 4096;
        disk.write_at(off, &data, WriteFlags::default()).unwrap();
        assert_eq!(disk.allocated_bytes(), 2 << 16);
        disk.read_at(off, &mut buf).unwrap();
        assert_eq!(buf, data);
        // Discarding a whole chunk frees it; a partial discard zeroes in place.
        disk.discard(0, 1 << 16).unwrap();
        assert_eq!(disk.allocated_bytes(), 1 << 16);
        disk.read_at(off, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert_eq!(buf[4096..], data[4096..]);
    }

    /// Adds the byte's position in the request, so a wrong `pos` shows.
    struct AddPos;

    impl CopyTransform for AddPos {
        fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = b.wrapping_add((pos + i) as u8);
            }
            Ok(())
        }
    }

    /// The one-pass paths equal copying then transforming, over written and never-written
    /// chunks, at aligned (one-pass) and unaligned (fallback) offsets.
    #[test]
    fn transformed_io_equals_copy_then_transform() {
        let disk = RamDisk::new(1 << 20).unwrap();
        let data: Vec<u8> = (0..200_704u32).map(|i| (i % 253) as u8).collect();
        disk.write_at(4096, &data, WriteFlags::default()).unwrap();
        for offset in [0u64, 4096, 61440, 512, 66048] {
            let mut expect = vec![0u8; 196_608];
            disk.read_at(offset, &mut expect).unwrap();
            AddPos.in_place(0, &mut expect).unwrap();
            let mut got = vec![0xffu8; expect.len()];
            disk.read_transformed(offset, &mut got, &AddPos).unwrap();
            assert_eq!(got, expect, "read at {offset}");
            let mut buf = data[..expect.len()].to_vec();
            let dst = 1 << 19;
            disk.write_transformed(dst + offset, &mut buf, &AddPos, WriteFlags::default())
                .unwrap();
            let mut want = data[..expect.len()].to_vec();
            AddPos.in_place(0, &mut want).unwrap();
            disk.read_at(dst + offset, &mut buf).unwrap();
            assert_eq!(buf, want, "write at {offset}");
        }
        let mut past = vec![0u8; 4096];
        let e = disk
            .read_transformed(1 << 20, &mut past, &AddPos)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn bounds_and_alignment() {
        let disk = RamDisk::new(1 << 20).unwrap();
        let mut buf = vec![0u8; 512];
        let e = disk.read_at((1 << 20) - 256, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = disk.read_at(1 << 20, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        let e = disk
            .write_at(1 << 20, &buf, WriteFlags::default())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(disk.allocated_bytes(), 0);
        assert!(RamDisk::new(1000).is_err());
    }
}
