//! flakey and delay targets.

mod common;

use std::time::{Duration, Instant};

use common::errno;
use cryptblk_dm::{BlockDevice, FlakeyTarget, Mapping, Registry, WriteFailure, WriteFlags};

fn flakey_control(m: &Mapping) -> std::sync::Arc<cryptblk_dm::FlakeyControl> {
    m.with_table(|t| {
        t.entries()[0]
            .target
            .as_any()
            .downcast_ref::<FlakeyTarget>()
            .expect("a flakey target")
            .control()
    })
}

#[test]
fn flakey_fail_after_nth_write_drop_and_error() {
    let reg = Registry::new();
    reg.create("disk", "0 128 linear ram:64K 0").unwrap();
    let m = reg.create("f", "0 128 flakey disk 0 1 0").unwrap();
    let disk = reg.get("disk").unwrap();
    let c = flakey_control(&m);
    c.fail_after_writes(3, WriteFailure::Drop);
    for i in 0..6u8 {
        // All six are acknowledged; only the first three reach the disk.
        m.write_at(u64::from(i) * 512, &[i + 1; 512], WriteFlags::default())
            .unwrap();
    }
    m.flush().unwrap();
    assert_eq!((c.writes_passed(), c.writes_dropped()), (3, 3));
    let mut b = [0u8; 512];
    for i in 0..6u8 {
        disk.read_at(u64::from(i) * 512, &mut b).unwrap();
        let want = if i < 3 { i + 1 } else { 0 };
        assert_eq!(b, [want; 512], "sector {i}");
        // Reads through flakey still work and see what really got written.
        m.read_at(u64::from(i) * 512, &mut b).unwrap();
        assert_eq!(b, [want; 512]);
    }
    c.fail_after_writes(1, WriteFailure::Error);
    m.write_at(0, &[9; 512], WriteFlags::default()).unwrap();
    let e = m
        .write_at(512, &[9; 512], WriteFlags::default())
        .unwrap_err();
    assert_eq!(errno(&e), libc::EIO);
    assert_eq!(errno(&m.flush().unwrap_err()), libc::EIO);
    c.disarm();
    m.write_at(512, &[9; 512], WriteFlags::default()).unwrap();
    m.flush().unwrap();
}

#[test]
fn flakey_down_modes() {
    let reg = Registry::new();
    let disk = reg.create("disk", "0 128 linear ram:64K 0").unwrap();
    disk.write_at(0, &[1u8; 4096], WriteFlags::default())
        .unwrap();
    let mut b = [0u8; 512];

    // No features: everything fails while down.
    let m = reg.create("plain", "0 128 flakey disk 0 0 5").unwrap();
    assert_eq!(errno(&m.read_at(0, &mut b).unwrap_err()), libc::EIO);
    assert_eq!(
        errno(&m.write_at(0, &b, WriteFlags::default()).unwrap_err()),
        libc::EIO
    );
    flakey_control(&m).force_down(Some(false));
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, [1u8; 512]);

    // drop_writes: reads fine, writes vanish.
    let m = reg
        .create("drop", "0 128 flakey disk 0 0 5 1 drop_writes")
        .unwrap();
    m.write_at(0, &[7u8; 512], WriteFlags::default()).unwrap();
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, [1u8; 512]);

    // error_writes.
    let m = reg
        .create("ew", "0 128 flakey disk 0 0 5 1 error_writes")
        .unwrap();
    assert_eq!(
        errno(&m.write_at(0, &b, WriteFlags::default()).unwrap_err()),
        libc::EIO
    );
    m.read_at(0, &mut b).unwrap();

    // error_reads.
    let m = reg
        .create("er", "0 128 flakey disk 0 0 5 1 error_reads")
        .unwrap();
    assert_eq!(errno(&m.read_at(0, &mut b).unwrap_err()), libc::EIO);
    m.write_at(1024, &[2u8; 512], WriteFlags::default())
        .unwrap();
    disk.read_at(1024, &mut b).unwrap();
    assert_eq!(b, [2u8; 512]);

    // corrupt_bio_byte 3 on reads: byte 3 (1-based) replaced by 0xee.
    let m = reg
        .create("cr", "0 128 flakey disk 0 0 5 5 corrupt_bio_byte 3 r 238 0")
        .unwrap();
    let mut big = [0u8; 1024];
    m.read_at(0, &mut big).unwrap();
    assert_eq!(&big[..4], &[1, 1, 0xee, 1]);
    assert!(big[3..].iter().all(|&x| x == 1));
    // ... and on writes: the stored data is corrupted, the caller's buffer is not.
    let m = reg
        .create("cw", "0 128 flakey disk 0 0 5 5 corrupt_bio_byte 1 w 0 0")
        .unwrap();
    let data = [5u8; 512];
    m.write_at(2048, &data, WriteFlags::default()).unwrap();
    assert_eq!(data, [5u8; 512]);
    disk.read_at(2048, &mut b).unwrap();
    assert_eq!(b[0], 0);
    assert!(b[1..].iter().all(|&x| x == 5));
}

#[test]
fn flakey_intervals_follow_the_clock() {
    let reg = Registry::new();
    reg.create("disk", "0 8 linear ram:4K 0").unwrap();
    // Up for 1 s, then down for 1 s.
    let m = reg.create("f", "0 8 flakey disk 0 1 1").unwrap();
    let mut b = [0u8; 512];
    m.read_at(0, &mut b).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(errno(&m.read_at(0, &mut b).unwrap_err()), libc::EIO);
}

#[test]
fn delay_applies_per_class() {
    let reg = Registry::new();
    reg.create("disk", "0 128 linear ram:64K 0").unwrap();
    // Reads delayed 0 ms, writes (and, with six arguments, flushes) delayed 150 ms and
    // redirected 64 sectors further.
    let m = reg.create("d", "0 64 delay disk 0 0 disk 64 150").unwrap();
    let disk = reg.get("disk").unwrap();
    let t = Instant::now();
    m.write_at(0, &[4u8; 512], WriteFlags::default()).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    let mut b = [0u8; 512];
    disk.read_at(64 * 512, &mut b).unwrap();
    assert_eq!(
        b, [4u8; 512],
        "write went to the write device at its offset"
    );
    let t = Instant::now();
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, [0u8; 512], "read comes from the read device");
    assert!(t.elapsed() < Duration::from_millis(150));
    let t = Instant::now();
    m.flush().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    // Three arguments: one delay for everything.
    let m = reg.create("d3", "0 64 delay disk 0 100").unwrap();
    let t = Instant::now();
    m.read_at(0, &mut b).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_eq!(m.table(false), "0 64 delay disk 0 100\n");
}
