//! A regular file or a block device as a backing, accessed with positioned I/O.
//!
//! Buffered by default; with [`FileOptions::direct`] the file is opened `O_DIRECT` and
//! requests whose buffers are not suitably aligned go through an aligned per-thread bounce
//! buffer. Flush is `fdatasync`; FUA writes use `RWF_DSYNC`; discard punches holes in files
//! and issues `BLKDISCARD` on block devices.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;

// Block-layer ioctls (linux/fs.h); not all are exported by the libc crate.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Memory alignment used for `O_DIRECT` buffers (covers every logical block size).
const DIRECT_ALIGN: usize = 4096;

/// How to open a file backing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Bypass the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Open read-only; writes fail with `EROFS`.
    pub read_only: bool,
}

/// A file or block device.
pub struct FileBacking {
    file: File,
    path: PathBuf,
    size: u64,
    block_device: bool,
    options: FileOptions,
    logical_block_size: u32,
}

impl FileBacking {
    /// Opens `path`. The size is the file's length (rounded down to whole sectors) or the
    /// block device's size, fixed at open time as a kernel block device's is.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> io::Result<Self> {
        let path = path.as_ref();
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        if options.direct {
            open.custom_flags(libc::O_DIRECT);
        }
        let file = open.open(path)?;
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let (size, lbs) = if block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut lbs: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int through the pointer.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut lbs) } != 0 {
                lbs = SECTOR_SIZE as libc::c_int;
            }
            (size, lbs.max(SECTOR_SIZE as libc::c_int) as u32)
        } else if meta.is_file() {
            (meta.len(), SECTOR_SIZE as u32)
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        };
        Ok(FileBacking {
            file,
            path: path.to_path_buf(),
            size: size - size % SECTOR_SIZE,
            block_device,
            options,
            logical_block_size: lbs,
        })
    }

    /// The path this backing was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True if the backing bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.options.direct
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        let lbs = u64::from(self.logical_block_size);
        if !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    /// A discard-like range operation after the checks every one shares (writable, in
    /// range, block-aligned; an empty range is done): `ioctl` on a block device, else
    /// `fallocate(mode | KEEP_SIZE)` on a file. Returns the syscall's result (0: done), so
    /// a caller may fall back where the file system lacks `mode`.
    fn range_op(&self, offset: u64, len: u64, ioctl: libc::c_ulong, mode: i32) -> io::Result<i32> {
        if self.options.read_only {
            return Err(errno(libc::EROFS));
        }
        self.check(offset, len)?;
        if len == 0 {
            return Ok(0);
        }
        let fd = self.file.as_raw_fd();
        Ok(if self.block_device {
            let range = [offset, len];
            // SAFETY: BLKDISCARD and BLKZEROOUT read two u64s (start, length).
            unsafe { libc::ioctl(fd, ioctl, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on an owned fd.
            unsafe {
                libc::fallocate(
                    fd,
                    mode | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        })
    }

    fn needs_bounce(&self, ptr: *const u8) -> bool {
        self.options.direct && !(ptr as usize).is_multiple_of(DIRECT_ALIGN)
    }

    fn pwrite_all(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        if !flags.fua {
            return self.file.write_all_at(buf, offset);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let iov = libc::iovec {
                iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                iov_len: buf.len() - done,
            };
            // SAFETY: iov points into `buf`, valid for the call.
            let n = unsafe {
                libc::pwritev2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    (offset + done as u64) as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    // Old kernel without RWF_DSYNC: write, then make it durable.
                    self.file.write_all_at(&buf[done..], offset + done as u64)?;
                    return self.file.sync_data();
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(errno(libc::EIO));
            }
            done += n as usize;
        }
        Ok(())
    }
}

impl BlockDevice for FileBacking {
    fn size(&self) -> u64 {
        self.size
    }

    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        if self.needs_bounce(buf.as_ptr()) {
            return with_bounce(buf.len(), |bounce| {
                self.file.read_exact_at(bounce, offset)?;
                buf.copy_from_slice(bounce);
                Ok(())
            });
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        if self.options.read_only {
            return Err(errno(libc::EROFS));
        }
        self.check(offset, buf.len() as u64)?;
        if self.needs_bounce(buf.as_ptr()) {
            return with_bounce(buf.len(), |bounce| {
                bounce.copy_from_slice(buf);
                self.pwrite_all(offset, bounce, flags)
            });
        }
        self.pwrite_all(offset, buf, flags)
    }

    fn flush(&self) -> io::Result<()> {
        if self.options.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.range_op(offset, len, BLKDISCARD, libc::FALLOC_FL_PUNCH_HOLE)? {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.range_op(offset, len, BLKZEROOUT, libc::FALLOC_FL_ZERO_RANGE)? == 0 {
            return Ok(());
        }
        // Filesystems without ZERO_RANGE: write zeros the slow way.
        let mut done = 0u64;
        with_bounce(len.min(1 << 20) as usize, |chunk| {
            chunk.fill(0);
            while done < len {
                let n = (len - done).min(chunk.len() as u64) as usize;
                self.pwrite_all(offset + done, &chunk[..n], WriteFlags::default())?;
                done += n as u64;
            }
            Ok(())
        })
    }
}

/// A heap buffer aligned for `O_DIRECT`.
struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
}

impl AlignedBuf {
    fn layout(cap: usize) -> Layout {
        // DIRECT_ALIGN is a power of two and cap is non-zero; this cannot fail.
        Layout::from_size_align(cap, DIRECT_ALIGN).unwrap_or_else(|_| unreachable!())
    }

    fn ensure(&mut self, len: usize) {
        if self.cap >= len {
            return;
        }
        self.release();
        let cap = len.next_power_of_two().max(DIRECT_ALIGN);
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(Self::layout(cap)) };
        if ptr.is_null() {
            alloc::handle_alloc_error(Self::layout(cap));
        }
        self.ptr = ptr;
        self.cap = cap;
    }

    fn release(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated in `ensure` with this layout.
            unsafe { alloc::dealloc(self.ptr, Self::layout(self.cap)) };
            self.ptr = std::ptr::null_mut();
            self.cap = 0;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.release();
    }
}

thread_local! {
    static BOUNCE: RefCell<AlignedBuf> = const {
        RefCell::new(AlignedBuf { ptr: std::ptr::null_mut(), cap: 0 })
    };
}

/// Runs `f` on a per-thread aligned buffer of `len` bytes, reused across calls.
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> io::Result<R>) -> io::Result<R> {
    BOUNCE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut b) => {
            b.ensure(len);
            // SAFETY: ensure() made ptr valid for at least len bytes, exclusively ours.
            let slice = unsafe { std::slice::from_raw_parts_mut(b.ptr, len) };
            f(slice)
        }
        Err(_) => {
            // Re-entered (a stacked file backing): fall back to a fresh buffer.
            let mut b = AlignedBuf {
                ptr: std::ptr::null_mut(),
                cap: 0,
            };
            b.ensure(len);
            // SAFETY: as above, for the local buffer.
            let slice = unsafe { std::slice::from_raw_parts_mut(b.ptr, len) };
            f(slice)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(len: u64) -> (PathBuf, File) {
        // A file straight in the temp dir (removed by the test) leaves nothing behind.
        let path = std::env::temp_dir().join(format!(
            "cryptblk-dm-file-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let f = File::create(&path).unwrap();
        f.set_len(len).unwrap();
        (path, f)
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn buffered_and_direct_round_trip() {
        let (path, _f) = temp_file(1 << 20);
        for direct in [false, true] {
            let dev = match FileBacking::open(
                &path,
                FileOptions {
                    direct,
                    read_only: false,
                },
            ) {
                Ok(d) => d,
                // tmpfs has no O_DIRECT; that is the filesystem, not us.
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => continue,
                Err(e) => panic!("open: {e}"),
            };
            assert_eq!(dev.size(), 1 << 20);
            // An odd offset into a Vec makes the buffer misaligned, forcing the bounce path.
            let mut data = vec![0u8; 4096 + 1];
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i * 7 + direct as usize) as u8;
            }
            dev.write_at(8192, &data[1..], WriteFlags { fua: true })
                .unwrap();
            let mut back = vec![0u8; 4096 + 1];
            dev.read_at(8192, &mut back[1..]).unwrap();
            assert_eq!(back[1..], data[1..]);
            dev.flush().unwrap();
            assert_eq!(
                dev.read_at(1 << 20, &mut back[..512])
                    .unwrap_err()
                    .raw_os_error(),
                Some(libc::EIO)
            );
        }
        let dev = FileBacking::open(&path, FileOptions::default()).unwrap();
        dev.discard(8192, 4096).unwrap();
        let mut back = vec![1u8; 4096];
        dev.read_at(8192, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        dev.write_at(12288, &[0x5a; 4096], WriteFlags::default())
            .unwrap();
        dev.write_zeroes(12288, 4096).unwrap();
        back.fill(1);
        dev.read_at(12288, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(
            dev.discard(100, 4096).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let ro = FileBacking::open(
            &path,
            FileOptions {
                direct: false,
                read_only: true,
            },
        )
        .unwrap();
        assert_eq!(
            ro.write_at(0, &back, WriteFlags::default())
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EROFS)
        );
        for op in [FileBacking::discard, FileBacking::write_zeroes] {
            assert_eq!(
                op(&ro, 0, 4096).unwrap_err().raw_os_error(),
                Some(libc::EROFS)
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}
