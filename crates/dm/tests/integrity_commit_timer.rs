//! The integrity target's timers and read-only opens, over a disk with a volatile write
//! cache: writes become durable only when flushed (or written FUA), and "cutting the power"
//! keeps only the durable image.
//!
//! Kernel facts these mirror: tests/integrity_timer_readonly_lab.sh (kernel lab).
//!
//! - `J` mode commits an idle journal `commit_time` ms after the first uncommitted write
//!   (the kernel's `autocommit_timer`): with a short `commit_time` unflushed writes survive a
//!   power cut, with a long one they do not (which shows the test can fail).
//! - `B` mode flushes and cleans the bitmap `bitmap_flush_interval` ms after a region was
//!   marked dirty (the kernel's `bitmap_flush_work`).
//! - A timed commit that fails latches the error: later I/O and flushes fail, no panic.
//! - Dropping a target with an armed or idle timer returns at once.
//! - A read-only target never writes: a committed journal is replayed into memory only,
//!   dirty-bitmap regions are read unchecked, writes fail with `EROFS`.

mod common;

use common::Rng;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, WriteFlags};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DISK: u64 = 2 << 20;

/// A disk with a write cache: `current` is what reads see, `durable` what survives a power
/// cut. Writes land in `current` and are remembered until a flush copies them to `durable`;
/// FUA writes are durable at once.
struct CacheDisk {
    inner: Mutex<CacheState>,
    /// Fail every write and flush with EIO (a dead disk).
    dead: AtomicBool,
    /// Writes attempted.
    writes: AtomicU64,
    /// Flushes attempted.
    flushes: AtomicU64,
}

struct CacheState {
    current: Vec<u8>,
    durable: Vec<u8>,
    unflushed: Vec<(usize, usize)>,
}

impl CacheDisk {
    fn new(image: Vec<u8>) -> Arc<Self> {
        Arc::new(CacheDisk {
            inner: Mutex::new(CacheState {
                current: image.clone(),
                durable: image,
                unflushed: Vec::new(),
            }),
            dead: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        })
    }

    /// What a power cut leaves.
    fn durable(&self) -> Vec<u8> {
        self.inner.lock().unwrap().durable.clone()
    }

    /// What reads see now.
    fn current(&self) -> Vec<u8> {
        self.inner.lock().unwrap().current.clone()
    }
}

impl BlockDevice for CacheDisk {
    fn size(&self) -> u64 {
        self.inner.lock().unwrap().current.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
        let st = self.inner.lock().unwrap();
        let o = offset as usize;
        buf.copy_from_slice(&st.current[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8], f: WriteFlags) -> std::io::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
        let mut st = self.inner.lock().unwrap();
        let o = offset as usize;
        st.current[o..o + buf.len()].copy_from_slice(buf);
        if f.fua {
            st.durable[o..o + buf.len()].copy_from_slice(buf);
        } else {
            st.unflushed.push((o, buf.len()));
        }
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let mut st = self.inner.lock().unwrap();
        let ranges = std::mem::take(&mut st.unflushed);
        for (o, n) in ranges {
            let CacheState {
                current, durable, ..
            } = &mut *st;
            durable[o..o + n].copy_from_slice(&current[o..o + n]);
        }
        Ok(())
    }
}

fn config(mode: IntegrityMode, interval_ms: u32) -> IntegrityConfig {
    IntegrityConfig {
        journal_sectors: Some(800),
        commit_time: interval_ms,
        bitmap_flush_interval: interval_ms,
        ..IntegrityConfig::new(mode, "crc32c")
    }
}

/// A formatted and wiped (all zeros, valid tags) device of `DISK` bytes, durable.
fn formatted(mode: IntegrityMode) -> Vec<u8> {
    formatted_sized(mode, DISK)
}

/// [`formatted`] with `size` bytes.
fn formatted_sized(mode: IntegrityMode, size: u64) -> Vec<u8> {
    let disk = CacheDisk::new(vec![0u8; size as usize]);
    IntegrityTarget::format(disk.clone(), "fmt", None, config(mode, 10000), true).unwrap();
    disk.flush().unwrap();
    disk.durable()
}

/// `count` blocks of 512 bytes of pseudo-random data.
fn data(seed: u64, count: usize) -> Vec<u8> {
    let mut v = vec![0u8; count * 512];
    Rng::new(seed).fill(&mut v);
    v
}

/// Reopens `image` (read-write, replaying) and reads `len` bytes at `offset`.
fn reopen_and_read(image: Vec<u8>, mode: IntegrityMode, offset: u64, len: usize) -> Vec<u8> {
    let disk = CacheDisk::new(image);
    let t = IntegrityTarget::open(disk, "reopen", None, config(mode, 10000), None).unwrap();
    let mut buf = vec![0u8; len];
    t.read_at(offset, &mut buf).unwrap();
    buf
}

/// Waits until `cond` holds (a loaded machine may run the timer thread late), at most
/// 10 s; returns whether it held. Nothing but the timer can make the conditions used here
/// true: the tests issue no flush. (The 400 ms waits of the negative cases are not
/// synchronization: they are the window in which a timer that must not fire gets its
/// chance to.)
fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes 24 blocks at sector 64 without flushing, waits (see [`wait_for`]; exactly
/// 400 ms when `expect_commit` is false) for the disk to change, cuts the power, reopens:
/// returns whether the blocks survived (they are either all there or all zero).
fn journal_survives(commit_time: u32, expect_commit: bool) -> bool {
    let disk = CacheDisk::new(formatted(IntegrityMode::Journal));
    let cfg = config(IntegrityMode::Journal, commit_time);
    let t = IntegrityTarget::open(disk.clone(), "timer", None, cfg, None).unwrap();
    let before = disk.durable();
    let d = data(commit_time as u64, 24);
    t.write_at(64 * 512, &d, WriteFlags::default()).unwrap();
    if expect_commit {
        // Any durable change is the timer's commit (journal first, so a cut anywhere
        // after it still replays the blocks).
        wait_for(|| disk.durable() != before);
    } else {
        std::thread::sleep(Duration::from_millis(400));
    }
    let image = disk.durable();
    drop(t);
    let got = reopen_and_read(image, IntegrityMode::Journal, 64 * 512, d.len());
    if got == d {
        true
    } else {
        assert!(
            got.iter().all(|&b| b == 0),
            "after the cut the blocks are neither old nor new"
        );
        false
    }
}

#[test]
fn journal_commit_timer_makes_idle_writes_durable() {
    assert!(
        journal_survives(100, true),
        "commit_time:100: unflushed journal writes were not committed by the timer"
    );
}

#[test]
fn journal_without_timer_expiry_loses_unflushed_writes() {
    // The same workload, but the timer cannot have fired: the writes exist only in the
    // in-memory journal, so the power cut loses them (what the kernel does too).
    assert!(
        !journal_survives(60000, false),
        "commit_time:60000: unflushed writes reached the disk without a flush or timer"
    );
}

#[test]
fn journal_timer_rearms_after_each_commit() {
    let disk = CacheDisk::new(formatted(IntegrityMode::Journal));
    let t = IntegrityTarget::open(
        disk.clone(),
        "rearm",
        None,
        config(IntegrityMode::Journal, 50),
        None,
    )
    .unwrap();
    for round in 0..3u64 {
        let d = data(100 + round, 8);
        let at = (200 + round * 16) * 512;
        let before = disk.durable();
        t.write_at(at, &d, WriteFlags::default()).unwrap();
        wait_for(|| disk.durable() != before);
        let got = reopen_and_read(disk.durable(), IntegrityMode::Journal, at, d.len());
        assert_eq!(got, d, "round {round}: write not committed by the timer");
    }
    // The device keeps working after timed commits.
    let mut buf = vec![0u8; 8 * 512];
    t.read_at(200 * 512, &mut buf).unwrap();
    assert_eq!(buf, data(100, 8));
}

#[test]
fn failed_timed_commit_fails_later_io() {
    let disk = CacheDisk::new(formatted(IntegrityMode::Journal));
    let t = IntegrityTarget::open(
        disk.clone(),
        "fail",
        None,
        config(IntegrityMode::Journal, 50),
        None,
    )
    .unwrap();
    t.write_at(0, &data(5, 4), WriteFlags::default()).unwrap();
    let writes = disk.writes.load(Ordering::SeqCst);
    disk.dead.store(true, Ordering::SeqCst);
    // Only reads probe: a flush would commit (and fail) by itself.
    let mut probe = vec![0u8; 512];
    wait_for(|| t.read_at(0, &mut probe).is_err());
    assert!(
        disk.writes.load(Ordering::SeqCst) > writes,
        "the timer never tried to commit"
    );
    let mut buf = vec![0u8; 512];
    let r = t.read_at(0, &mut buf);
    assert_eq!(
        r.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO)),
        "a read after a failed timed commit must fail"
    );
    assert_eq!(
        t.flush().map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO))
    );
    assert!(t
        .write_at(4096, &data(6, 1), WriteFlags::default())
        .is_err());
}

#[test]
fn drop_with_armed_or_idle_timer_is_prompt() {
    let image = formatted(IntegrityMode::Journal);
    for (what, write) in [("idle", false), ("armed", true)] {
        let disk = CacheDisk::new(image.clone());
        let t = IntegrityTarget::open(
            disk.clone(),
            "drop",
            None,
            config(IntegrityMode::Journal, 60000),
            None,
        )
        .unwrap();
        if write {
            t.write_at(0, &data(9, 2), WriteFlags::default()).unwrap();
        }
        let start = Instant::now();
        drop(t);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "dropping a target with an {what} 60 s timer took {took:?}"
        );
    }
}

/// Whether any bit of the on-disk bitmap (at the journal area) is set in `image`.
fn bitmap_dirty(image: &[u8], journal_offset: u64) -> bool {
    image[journal_offset as usize..journal_offset as usize + 4096]
        .iter()
        .any(|&b| b != 0)
}

#[test]
fn bitmap_flush_interval_cleans_the_bitmap() {
    let image = formatted(IntegrityMode::Bitmap);
    for (interval, expect_clean) in [(100u32, true), (60000, false)] {
        let disk = CacheDisk::new(image.clone());
        let t = IntegrityTarget::open(
            disk.clone(),
            "bitmap",
            None,
            config(IntegrityMode::Bitmap, interval),
            None,
        )
        .unwrap();
        let joff = t.layout().journal_offset();
        assert!(!bitmap_dirty(&disk.durable(), joff), "fresh bitmap dirty");
        let d = data(interval as u64, 16);
        t.write_at(128 * 512, &d, WriteFlags::default()).unwrap();
        // Marking the region dirty is durable before the data write.
        assert!(bitmap_dirty(&disk.durable(), joff), "write did not dirty");
        if expect_clean {
            wait_for(|| !bitmap_dirty(&disk.durable(), joff));
        } else {
            std::thread::sleep(Duration::from_millis(400));
        }
        let durable = disk.durable();
        assert_eq!(
            !bitmap_dirty(&durable, joff),
            expect_clean,
            "bitmap_flush_interval:{interval}: bitmap clean should be {expect_clean}"
        );
        drop(t);
        let got = reopen_and_read(durable, IntegrityMode::Bitmap, 128 * 512, d.len());
        if expect_clean {
            assert_eq!(
                got, d,
                "flushed by the timer, the data must survive the cut"
            );
        } else {
            assert!(got.iter().all(|&b| b == 0), "unflushed data survived");
        }
    }
}

/// A journal that holds committed sections not yet written home: the power is cut
/// during the commit's home writes.
fn image_with_committed_journal(d: &[u8], at: u64) -> Vec<u8> {
    let disk = CacheDisk::new(formatted(IntegrityMode::Journal));
    let t = IntegrityTarget::open(
        disk.clone(),
        "commit",
        None,
        config(IntegrityMode::Journal, 60000),
        None,
    )
    .unwrap();
    t.write_at(at, d, WriteFlags::default()).unwrap();
    // Commit, then splice: the journal area after the commit, everything else from
    // before it — exactly the disk after the journal write and before the home writes.
    let before = disk.durable();
    t.flush().unwrap();
    let after = disk.durable();
    let l = t.layout().clone();
    drop(t);
    let (js, je) = (
        l.journal_offset() as usize,
        l.journal_offset() as usize + l.journal_bytes(),
    );
    let mut img = before;
    img[js..je].copy_from_slice(&after[js..je]);
    img
}

#[test]
fn read_only_replays_the_journal_into_memory_and_never_writes() {
    let d = data(77, 40);
    let at = 300 * 512;
    let img = image_with_committed_journal(&d, at);
    // The home location still holds zeros: the journal is needed.
    {
        let disk = CacheDisk::new(img.clone());
        let cfg = IntegrityConfig {
            mode: IntegrityMode::Recovery,
            ..config(IntegrityMode::Journal, 10000)
        };
        let t = IntegrityTarget::open(disk, "r", None, cfg, None).unwrap();
        let mut buf = vec![0u8; d.len()];
        t.read_at(at, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "home area already updated");
    }
    let disk = CacheDisk::new(img.clone());
    let cfg = IntegrityConfig {
        read_only: true,
        ..config(IntegrityMode::Journal, 100)
    };
    let t = IntegrityTarget::open(disk.clone(), "ro", None, cfg, None).unwrap();
    assert!(t.is_read_only());
    let mut buf = vec![0u8; d.len()];
    t.read_at(at, &mut buf).unwrap();
    assert_eq!(
        buf, d,
        "read-only open did not replay the journal into memory"
    );
    // Partially overlapping read: journaled and home blocks mixed.
    let mut buf2 = vec![0u8; 20 * 512];
    t.read_at(at - 10 * 512, &mut buf2).unwrap();
    assert!(buf2[..10 * 512].iter().all(|&b| b == 0));
    assert_eq!(&buf2[10 * 512..], &d[..10 * 512]);
    assert_eq!(
        t.write_at(0, &data(1, 1), WriteFlags::default())
            .map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS))
    );
    t.flush().unwrap();
    t.close().unwrap();
    // Not synchronization: the window (over twice the 100 ms commit time) in which a commit
    // timer that a read-only target must not have would write.
    std::thread::sleep(Duration::from_millis(250));
    drop(t);
    assert_eq!(
        disk.writes.load(Ordering::SeqCst),
        0,
        "read-only target wrote"
    );
    assert!(disk.current() == img, "read-only target changed the disk");
    // The journal is still there for a read-write open.
    assert_eq!(
        reopen_and_read(img, IntegrityMode::Journal, at, d.len()),
        d,
        "read-write replay after the read-only open"
    );
}

#[test]
fn read_only_refuses_to_format_a_blank_device() {
    let disk = CacheDisk::new(vec![0u8; DISK as usize]);
    let cfg = IntegrityConfig {
        read_only: true,
        ..config(IntegrityMode::Journal, 10000)
    };
    let r = IntegrityTarget::open(disk.clone(), "blank", None, cfg, None);
    assert!(r.is_err(), "a read-only table formatted a blank device");
    assert_eq!(disk.writes.load(Ordering::SeqCst), 0);
}

#[test]
fn read_only_dirty_bitmap_regions_are_read_unchecked() {
    // A bitmap-mode device that crashed with region 0 dirty; a byte of a block there and
    // one in a clean region are then corrupted. (24 MiB: more than one bitmap region of
    // 2^15 sectors.)
    let disk = CacheDisk::new(formatted_sized(IntegrityMode::Bitmap, 24 << 20));
    let t = IntegrityTarget::open(
        disk.clone(),
        "b",
        None,
        config(IntegrityMode::Bitmap, 60000),
        None,
    )
    .unwrap();
    let l = t.layout().clone();
    t.write_at(8 * 512, &data(3, 8), WriteFlags::default())
        .unwrap();
    let mut img = disk.current();
    drop(t);
    let provided = l.provided_data_sectors;
    assert!(
        provided > 1 << 15,
        "device too small for two bitmap regions"
    );
    let dirty_sector = 9u64;
    let clean_sector = provided - 1;
    img[(l.data_sector(dirty_sector) * 512 + 7) as usize] ^= 0x40;
    img[(l.data_sector(clean_sector) * 512 + 7) as usize] ^= 0x40;

    let disk = CacheDisk::new(img.clone());
    let cfg = IntegrityConfig {
        read_only: true,
        ..config(IntegrityMode::Bitmap, 100)
    };
    let t = IntegrityTarget::open(disk.clone(), "ro", None, cfg, None).unwrap();
    let mut buf = vec![0u8; 512];
    t.read_at(dirty_sector * 512, &mut buf)
        .expect("a dirty region (its tags would be recalculated) must read");
    assert_eq!(
        t.read_at(clean_sector * 512, &mut buf)
            .map_err(|e| e.raw_os_error()),
        Err(Some(libc::EILSEQ)),
        "a clean region must still be verified"
    );
    drop(t);
    assert_eq!(
        disk.writes.load(Ordering::SeqCst),
        0,
        "read-only target wrote"
    );
    assert!(disk.current() == img);
}
