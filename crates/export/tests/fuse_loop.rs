//! The FUSE export against the kernel: file I/O through the VFS, a loop device with direct
//! I/O on the exported file, ext4 made and checked by e2fsprogs, fio with verification.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, require_tool, run, run_text, MemDisk, TempDir};
use cryptblk_export::{FuseConfig, FuseExport};

const MIB: u64 = 1 << 20;

fn fuse_available() -> bool {
    if Path::new("/dev/fuse").exists() {
        return true;
    }
    if std::env::var("CRYPTBLK_SKIP_FUSE").as_deref() == Ok("1") {
        eprintln!("SKIPPED: /dev/fuse is missing and CRYPTBLK_SKIP_FUSE=1");
        return false;
    }
    panic!("/dev/fuse is required (or set CRYPTBLK_SKIP_FUSE=1 to skip explicitly)");
}

fn loop_available() -> bool {
    if !fuse_available() || !require_tool("losetup", "LOSETUP") {
        return false;
    }
    if Path::new("/dev/loop-control").exists() {
        return true;
    }
    if std::env::var("CRYPTBLK_SKIP_LOOP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: /dev/loop-control is missing and CRYPTBLK_SKIP_LOOP=1");
        return false;
    }
    panic!("/dev/loop-control is required (or set CRYPTBLK_SKIP_LOOP=1 to skip explicitly)");
}

fn mount_export(disk: &Arc<MemDisk>, dir: &Path) -> FuseExport {
    FuseExport::mount(disk.clone(), FuseConfig::new(dir)).expect("FUSE mount")
}

/// A loop device detached on drop.
struct LoopDev(String);

impl LoopDev {
    fn attach(file: &Path) -> LoopDev {
        let dev = run_text(
            Command::new("losetup")
                .args(["-f", "--show", "--direct-io=on"])
                .arg(file),
        );
        let dev = LoopDev(dev.trim().to_string());
        let dio = run_text(
            Command::new("losetup")
                .args(["--list", "--noheadings", "-O", "DIO"])
                .arg(&dev.0),
        );
        assert_eq!(
            dio.trim(),
            "1",
            "{} did not get direct I/O on the FUSE file",
            dev.0
        );
        dev
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// A mounted file system unmounted on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn mount(dev: &str, at: &Path, opts: &str) -> Mounted {
        run(Command::new("mount").args(["-o", opts]).arg(dev).arg(at));
        Mounted(at.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Unmounts the export, retrying while the kernel still holds the file (a detached loop
/// device lets go of it asynchronously).
fn unmount_export(export: &mut FuseExport) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match export.unmount() {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("unmount not yet possible: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("unmount failed: {e}"),
        }
    }
}

fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: plain system call on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn file_io_through_the_kernel_matches_the_device() {
    if !fuse_available() {
        return;
    }
    let dir = TempDir::new("fuse-io");
    // 4096-byte logical blocks: every unaligned FUSE request needs read-modify-write.
    let disk = MemDisk::new(8 * MIB, 4096);
    let mut model = pattern(20, 8 * MIB as usize);
    disk.fill(&model);
    let mut export = mount_export(&disk, dir.path());
    assert_eq!(
        export.file_path(),
        dir.path().canonicalize().unwrap().join("disk")
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["disk".to_string()]);
    assert_eq!(
        std::fs::metadata(export.file_path()).unwrap().len(),
        8 * MIB
    );

    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(export.file_path())
        .unwrap();
    let mut rng = pattern(21, 8000);
    for i in 0..300usize {
        let r = u64::from_le_bytes(rng[(i % 1000) * 8..(i % 1000) * 8 + 8].try_into().unwrap());
        let offset = r % (8 * MIB - 300_000);
        let len = 1 + ((r >> 40) % 300_000) as usize;
        if i % 2 == 0 {
            let data = pattern(1000 + i as u64, len);
            file.write_all_at(&data, offset).unwrap();
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
        } else {
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, offset).unwrap();
            assert!(
                buf == model[offset as usize..offset as usize + len],
                "read {offset}+{len} differs"
            );
        }
        if i == 500 {
            rng = pattern(22, 8000);
        }
    }
    assert!(
        disk.snapshot() == model,
        "device differs from the model after file writes"
    );

    // Hole punching and range zeroing must read back as zeros (not as discarded data).
    fallocate(
        &file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        10_000,
        50_000,
    )
    .unwrap();
    model[10_000..60_000].fill(0);
    fallocate(
        &file,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        3 * MIB,
        2 * MIB + 123,
    )
    .unwrap();
    model[3 * MIB as usize..(5 * MIB + 123) as usize].fill(0);
    assert!(disk.snapshot() == model, "fallocate results differ");
    // Growing the file is impossible.
    assert!(fallocate(&file, 0, 8 * MIB - 4096, 8192).is_err());

    // Writes at the end fail like on a block device; a straddling write is shortened.
    let err = file.write_at(&[1u8; 10], 8 * MIB).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(file.write_at(&[2u8; 1000], 8 * MIB - 100).unwrap(), 100);
    model[(8 * MIB - 100) as usize..].fill(2);
    let mut tail = vec![0u8; 1000];
    assert_eq!(file.read_at(&mut tail, 8 * MIB - 100).unwrap(), 100);
    assert_eq!(tail[..100], [2u8; 100]);

    let flushes = disk.flushes.load(Ordering::SeqCst);
    file.sync_all().unwrap();
    assert!(
        disk.flushes.load(Ordering::SeqCst) > flushes,
        "fsync must flush the device"
    );
    drop(file);
    assert!(disk.snapshot() == model);
    unmount_export(&mut export);
    assert!(
        !dir.join("disk").exists(),
        "the mount is gone after unmount"
    );
}

#[test]
fn ext4_on_a_loop_device_survives_an_export_restart() {
    if !loop_available()
        || !require_tool("mkfs.ext4", "MKFS_EXT4")
        || !require_tool("fsck.ext4", "FSCK_EXT4")
    {
        return;
    }
    let dir = TempDir::new("fuse-ext4");
    let fuse_dir = dir.join("fuse");
    let fs_dir = dir.join("fs");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&fs_dir).unwrap();
    let disk = MemDisk::new(96 * MIB, 512);
    let files: Vec<(String, Vec<u8>)> = (0..12u64)
        .map(|i| {
            (
                format!("file{i}.bin"),
                pattern(300 + i, (i as usize + 1) * 150_000 + 77),
            )
        })
        .collect();
    {
        let mut export = mount_export(&disk, &fuse_dir);
        {
            let lo = LoopDev::attach(export.file_path());
            run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.0));
            let _m = Mounted::mount(&lo.0, &fs_dir, "rw");
            for (name, data) in &files {
                std::fs::write(fs_dir.join(name), data).unwrap();
            }
            std::fs::create_dir(fs_dir.join("sub")).unwrap();
            std::fs::write(fs_dir.join("sub/small"), b"hello").unwrap();
            run(&mut Command::new("sync"));
        }
        unmount_export(&mut export);
    }
    assert!(disk.snapshot().iter().any(|&b| b != 0));
    // A new export on the same backing data: the file system must be intact.
    let mut export = mount_export(&disk, &fuse_dir);
    {
        let lo = LoopDev::attach(export.file_path());
        let fsck = Command::new("fsck.ext4")
            .args(["-f", "-n"])
            .arg(&lo.0)
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "fsck.ext4 -fn found problems:\n{}{}",
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        );
        let _m = Mounted::mount(&lo.0, &fs_dir, "ro");
        for (name, data) in &files {
            assert!(
                std::fs::read(fs_dir.join(name)).unwrap() == *data,
                "{name} differs after restart"
            );
        }
        assert_eq!(std::fs::read(fs_dir.join("sub/small")).unwrap(), b"hello");
    }
    unmount_export(&mut export);
}

#[test]
fn fio_direct_psync_with_verify_on_the_loop_device() {
    if !loop_available() || !require_tool("fio", "FIO") {
        return;
    }
    let dir = TempDir::new("fuse-fio");
    let disk = MemDisk::new(48 * MIB, 512);
    let mut export = mount_export(&disk, dir.path());
    {
        let lo = LoopDev::attach(export.file_path());
        let fio = |engine: &str, extra: &[&str]| {
            let mut cmd = Command::new("fio");
            cmd.args([
                "--name=loop-verify",
                "--direct=1",
                "--rw=randrw",
                "--bs=4k",
                "--size=32M",
            ])
            .arg(format!("--ioengine={engine}"))
            .args([
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--randseed=99",
            ])
            .current_dir(std::env::temp_dir())
            .arg(format!("--filename={}", lo.0))
            .args(extra);
            cmd
        };
        run(&mut fio("psync", &["--do_verify=1"]));
        // Same workload, queued through libaio, and a verify-only pass afterwards.
        run(&mut fio(
            "libaio",
            &["--iodepth=16", "--do_verify=1", "--randseed=7"],
        ));
        run(&mut fio(
            "libaio",
            &["--iodepth=16", "--verify_only", "--randseed=7"],
        ));
        // The data really is on the device: corrupt the verified blocks behind the loop
        // device's back and fio must notice (direct I/O reads bypass any cache).
        let mut snap = disk.snapshot();
        let mut corrupted = 0;
        for block in snap
            .chunks_mut(4096)
            .filter(|b| b[0] == 0xca && b[1] == 0xac)
        {
            block[200] ^= 0x5a;
            corrupted += 1;
        }
        assert!(corrupted > 0, "no fio verify headers on the device");
        disk.fill(&snap);
        let out = fio("libaio", &["--iodepth=16", "--verify_only", "--randseed=7"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "fio missed a corrupted block");
    }
    unmount_export(&mut export);
}
