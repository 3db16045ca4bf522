//! A write-through cache of tag (metadata) buffers, the userspace counterpart of the
//! kernel's dm-bufio buffers of `buffer_sectors` sectors.
//!
//! Without it every direct/bitmap write read the tag sector back before patching it, and
//! every read fetched its tags from the device. Buffers are aligned to the start of their
//! metadata run (so a buffer never covers data sectors) and are at most 128 sectors, so a
//! `u128` records which sectors a request changed. Changes are patched into the buffers
//! and [`TagCache::flush`] writes exactly the changed sectors (contiguous ones as one write,
//! in device order) before the operation that made them returns: the device sees the same
//! writes as without the cache, which keeps crash behaviour unchanged.
//!
//! Coherence: the cache lives behind the target's state lock and every tag write of the
//! target goes through it (direct writes, journal commits and replay, recalculation), so
//! it always equals the device. A failed write or read drops the affected buffers, so
//! they are read again next time.

use std::collections::{HashMap, VecDeque};
use std::io;

use super::U64Map;
use crate::device::{BlockDevice, WriteFlags};

/// One cached buffer: its bytes and which of its sectors changed since the last flush.
struct TagBuf {
    data: Box<[u8]>,
    dirty: u128,
}

/// The metadata run a tag position belongs to: `(start byte, length in bytes)` on the
/// metadata device. Tags of one run are contiguous; buffers never cross a run's end.
pub type TagRun = (u64, u64);

/// Cached tag buffers keyed by their first byte on the metadata device.
pub struct TagCache {
    buf_bytes: u64,
    limit: usize,
    bufs: U64Map<TagBuf>,
    /// Insertion order, for eviction.
    fifo: VecDeque<u64>,
    /// Buffers with unflushed changes.
    dirty: Vec<u64>,
}

impl TagCache {
    /// A cache of buffers of `1 << log2_buffer_sectors` sectors (at most 128), holding at
    /// most about `limit_bytes`.
    pub fn new(log2_buffer_sectors: u8, limit_bytes: u64) -> TagCache {
        let buf_bytes = 512u64 << log2_buffer_sectors.min(7);
        TagCache {
            buf_bytes,
            limit: ((limit_bytes / buf_bytes) as usize).max(16),
            bufs: HashMap::default(),
            fifo: VecDeque::new(),
            dirty: Vec::new(),
        }
    }

    /// The buffer holding byte `pos` of `run`: its first byte and length.
    fn buffer_of(&self, run: TagRun, pos: u64) -> (u64, u64) {
        let key = run.0 + (pos - run.0) / self.buf_bytes * self.buf_bytes;
        (key, self.buf_bytes.min(run.0 + run.1 - key))
    }

    /// The buffer at `key` (`len` bytes), read from `dev` on a miss.
    fn load(&mut self, dev: &dyn BlockDevice, key: u64, len: u64) -> io::Result<&mut TagBuf> {
        if !self.bufs.contains_key(&key) {
            let mut data = vec![0u8; len as usize].into_boxed_slice();
            dev.read_at(key, &mut data)?;
            self.evict();
            self.bufs.insert(key, TagBuf { data, dirty: 0 });
            self.fifo.push_back(key);
        }
        Ok(self.bufs.get_mut(&key).expect("present or inserted above"))
    }

    /// Makes room for one buffer, dropping the oldest clean ones.
    fn evict(&mut self) {
        let mut tries = self.fifo.len();
        while self.bufs.len() >= self.limit && tries > 0 {
            tries -= 1;
            let Some(k) = self.fifo.pop_front() else {
                break;
            };
            match self.bufs.get(&k) {
                Some(b) if b.dirty != 0 => self.fifo.push_back(k),
                Some(_) => {
                    self.bufs.remove(&k);
                }
                None => {}
            }
        }
    }

    /// Visits the pieces of `pos..pos+len` buffer by buffer: `f(buffer, offset in buffer,
    /// offset in the caller's slice, length)`.
    fn each_piece(
        &mut self,
        dev: &dyn BlockDevice,
        run: TagRun,
        pos: u64,
        len: usize,
        mut f: impl FnMut(&mut TagBuf, usize, usize, usize),
    ) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            let p = pos + done as u64;
            let (key, blen) = self.buffer_of(run, p);
            let at = (p - key) as usize;
            let n = (blen as usize - at).min(len - done);
            let r = self.load(dev, key, blen);
            let buf = match r {
                Ok(b) => b,
                Err(e) => {
                    self.discard_dirty();
                    return Err(e);
                }
            };
            f(buf, at, done, n);
            done += n;
        }
        Ok(())
    }

    /// Copies the tag bytes at `pos` (within `run`) into `out`.
    pub fn read(
        &mut self,
        dev: &dyn BlockDevice,
        run: TagRun,
        pos: u64,
        out: &mut [u8],
    ) -> io::Result<()> {
        self.each_piece(dev, run, pos, out.len(), |b, at, o, n| {
            out[o..o + n].copy_from_slice(&b.data[at..at + n]);
        })
    }

    /// Patches `tags` in at `pos` (within `run`); [`TagCache::flush`] writes them out.
    pub fn write(
        &mut self,
        dev: &dyn BlockDevice,
        run: TagRun,
        pos: u64,
        tags: &[u8],
    ) -> io::Result<()> {
        let mut done = 0usize;
        while done < tags.len() {
            let p = pos + done as u64;
            let (key, blen) = self.buffer_of(run, p);
            let at = (p - key) as usize;
            let n = (blen as usize - at).min(tags.len() - done);
            let b = match self.load(dev, key, blen) {
                Ok(b) => b,
                Err(e) => {
                    self.discard_dirty();
                    return Err(e);
                }
            };
            b.data[at..at + n].copy_from_slice(&tags[done..done + n]);
            let (first, last) = (at / 512, (at + n - 1) / 512);
            let ones = last - first + 1;
            let mask = if ones >= 128 {
                u128::MAX
            } else {
                ((1u128 << ones) - 1) << first
            };
            let was_clean = b.dirty == 0;
            b.dirty |= mask;
            if was_clean {
                self.dirty.push(key);
            }
            done += n;
        }
        Ok(())
    }

    /// Writes every changed sector (contiguous ones together, in device order).
    pub fn flush(&mut self, dev: &dyn BlockDevice) -> io::Result<()> {
        self.dirty.sort_unstable();
        let keys = std::mem::take(&mut self.dirty);
        for (idx, &key) in keys.iter().enumerate() {
            let Some(b) = self.bufs.get_mut(&key) else {
                continue;
            };
            let mut bits = b.dirty;
            b.dirty = 0;
            let mut r = Ok(());
            while bits != 0 && r.is_ok() {
                let first = bits.trailing_zeros() as usize;
                let ones = (bits >> first).trailing_ones() as usize;
                let bytes = &b.data[first * 512..(first + ones) * 512];
                r = dev.write_at(key + first as u64 * 512, bytes, WriteFlags::default());
                bits = if first + ones >= 128 {
                    0
                } else {
                    bits & !(((1u128 << ones) - 1) << first)
                };
            }
            if let Err(e) = r {
                // What is on the device is unknown now: drop this and the unwritten buffers.
                for k in &keys[idx..] {
                    self.bufs.remove(k);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Drops buffers holding changes that were not written (after an error).
    pub fn discard_dirty(&mut self) {
        for k in std::mem::take(&mut self.dirty) {
            self.bufs.remove(&k);
        }
        // Buffers dirtied by a failed operation but not yet recorded as such.
        self.bufs.retain(|_, b| b.dirty == 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::ram::RamDisk;
    use std::sync::Mutex;

    /// A RAM disk that records the sectors written to it and can be told to fail writes.
    struct Recording {
        disk: RamDisk,
        written: Mutex<Vec<u64>>,
        fail_writes: std::sync::atomic::AtomicBool,
    }

    impl BlockDevice for Recording {
        fn size(&self) -> u64 {
            self.disk.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.disk.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
            if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let first = offset / 512;
            let mut w = self.written.lock().unwrap();
            w.extend(first..first + buf.len() as u64 / 512);
            self.disk.write_at(offset, buf, flags)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Random patches (some crossing buffer ends) against a plain byte array: after every
    /// flush the device equals the array, exactly the touched sectors were written, and
    /// bytes outside the run are never written. Small buffers and a small limit make
    /// eviction happen all the time.
    #[test]
    fn patches_reach_the_device_exactly() {
        let dev = Recording {
            disk: RamDisk::new(4 << 20).unwrap(),
            written: Mutex::new(Vec::new()),
            fail_writes: false.into(),
        };
        // Something other than zeros on the device first.
        let mut shadow: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
        dev.disk
            .write_at(0, &shadow, WriteFlags::default())
            .unwrap();
        // A run of 300 sectors starting at sector 100 (not buffer aligned, nor a whole
        // number of 8-sector buffers).
        let run: TagRun = (100 * 512, 300 * 512);
        let mut cache = TagCache::new(3, 0);
        let mut x = 0x1234_5678_9abc_def1u64;
        for round in 0..300 {
            let mut touched = std::collections::BTreeSet::new();
            for _ in 0..1 + xorshift(&mut x) % 4 {
                let len = 1 + (xorshift(&mut x) % 1500) as usize;
                let at = run.0 + xorshift(&mut x) % (run.1 - len as u64);
                let bytes: Vec<u8> = (0..len).map(|_| xorshift(&mut x) as u8).collect();
                cache.write(&dev, run, at, &bytes).unwrap();
                shadow[at as usize..at as usize + len].copy_from_slice(&bytes);
                touched.extend(at / 512..=(at + len as u64 - 1) / 512);
            }
            dev.written.lock().unwrap().clear();
            cache.flush(&dev).unwrap();
            let mut written = std::mem::take(&mut *dev.written.lock().unwrap());
            written.sort_unstable();
            let len = written.len();
            written.dedup();
            assert_eq!(len, written.len(), "round {round}: a sector written twice");
            assert_eq!(
                written,
                touched.into_iter().collect::<Vec<_>>(),
                "round {round}"
            );
            let mut now = vec![0u8; shadow.len()];
            dev.disk.read_at(0, &mut now).unwrap();
            assert!(
                now == shadow,
                "round {round}: device differs from the model"
            );
            // Reads through the cache agree too.
            let at = run.0 + xorshift(&mut x) % (run.1 - 4096);
            let mut got = vec![0u8; 4096];
            cache.read(&dev, run, at, &mut got).unwrap();
            assert_eq!(got, shadow[at as usize..at as usize + 4096]);
        }
        assert!(
            cache.bufs.len() <= 16 + 1,
            "eviction keeps the cache bounded"
        );
    }

    /// A failed flush leaves nothing stale behind: the buffers are read again.
    #[test]
    fn failed_writes_drop_the_buffers() {
        let dev = Recording {
            disk: RamDisk::new(1 << 20).unwrap(),
            written: Mutex::new(Vec::new()),
            fail_writes: false.into(),
        };
        let run: TagRun = (0, 64 * 512);
        let mut cache = TagCache::new(7, 1 << 20);
        cache.write(&dev, run, 1000, &[1u8; 100]).unwrap();
        dev.fail_writes
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(cache.flush(&dev).is_err());
        dev.fail_writes
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let mut got = [9u8; 100];
        cache.read(&dev, run, 1000, &mut got).unwrap();
        assert_eq!(got, [0u8; 100], "the unwritten patch is not served");
        assert!(cache.dirty.is_empty());
    }
}
