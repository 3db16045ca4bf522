//! The FUSE export as a real block device: losetup, mkfs.ext4, mount, files written, closed,
//! reopened, fsck clean; and the filesystem image, decrypted independently with the volume
//! key cryptsetup reports, is a clean ext4 too.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn sh(cmd: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new(cmd);
    for a in args {
        c.arg(a);
    }
    run_ok(&mut c, b"")
}

struct Cleanup<'a> {
    mnt: &'a Path,
    fs: &'a Path,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.fs).status();
        // Detach whatever loop device still points into our mount.
        if let Ok(out) = Command::new("losetup")
            .args(["-j"])
            .arg(self.mnt.join("disk"))
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(dev) = line.split(':').next() {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }
        let _ = run(cryptblk().args(["close", "t-fuse"]), b"");
    }
}

#[test]
fn ext4_on_a_loop_device_over_the_fuse_export() {
    if !is_root() {
        if std::env::var("CRYPTBLK_SKIP_ROOT").as_deref() == Ok("1") {
            eprintln!("skipping: needs root for losetup/mount (CRYPTBLK_SKIP_ROOT=1)");
            return;
        }
        panic!("this test needs root for losetup and mount (set CRYPTBLK_SKIP_ROOT=1 to skip)");
    }
    for t in [
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
        "fusermount3",
    ] {
        if tool(t).is_none() {
            return;
        }
    }
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"fuse test key").unwrap();
    let img = dir.path().join("vol.img");
    sparse_file(&img, 64 << 20);
    let mnt = dir.path().join("mnt");
    let fs = dir.path().join("fs");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&fs).unwrap();
    let _cleanup = Cleanup { mnt: &mnt, fs: &fs };
    run_ok(
        cryptblk()
            .args([
                "luksFormat",
                "--batch-mode",
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
            ])
            .arg(&key)
            .arg(&img),
        b"",
    );
    let open = || {
        run_ok(
            cryptblk()
                .args(["open", "--key-file"])
                .arg(&key)
                .arg(&img)
                .arg("t-fuse")
                .arg("--fuse")
                .arg(&mnt),
            b"",
        )
    };
    let disk = mnt.join("disk");

    open();
    let lo = sh("losetup", &[&"-f", &"--show", &"--direct-io=on", &disk])
        .trim()
        .to_string();
    sh("mkfs.ext4", &[&"-q", &lo]);
    sh("mount", &[&lo, &fs]);
    std::fs::write(fs.join("hello.txt"), b"hello through cryptblk\n").unwrap();
    let payload = write_pattern(&fs.join("payload.bin"), 5 << 20, 9);
    sh("umount", &[&fs]);
    sh("losetup", &[&"-d", &lo]);
    run_ok(cryptblk().args(["close", "t-fuse"]), b"");

    open();
    let lo = sh("losetup", &[&"-f", &"--show", &disk]).trim().to_string();
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("mount", &[&lo, &fs]);
    assert_eq!(
        std::fs::read(fs.join("hello.txt")).unwrap(),
        b"hello through cryptblk\n"
    );
    assert!(
        std::fs::read(fs.join("payload.bin")).unwrap() == payload,
        "file content changed"
    );
    sh("umount", &[&fs]);
    sh("losetup", &[&"-d", &lo]);
    run_ok(cryptblk().args(["close", "t-fuse"]), b"");

    // Independent check: cryptsetup's volume key + the pyca model give a clean ext4 image.
    let Some(vk) = cryptsetup_volume_key(&img, &key, &[]) else {
        return;
    };
    let (offset, sector) = cryptsetup_luks2_segment(&img).unwrap();
    let raw = std::fs::read(&img).unwrap();
    let plain = independent("decrypt", "aes-xts-plain64", &vk, sector, &raw[offset..]);
    let fs_img = dir.path().join("plain-fs.img");
    std::fs::write(&fs_img, plain).unwrap();
    sh("fsck.ext4", &[&"-fn", &fs_img]);
}
