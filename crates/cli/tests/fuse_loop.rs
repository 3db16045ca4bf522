//! The FUSE export as a real block device: losetup, mkfs.ext4, mount, files written, closed,
//! reopened, fsck clean; and the filesystem image, decrypted independently with the volume
//! key cryptsetup reports, is a clean ext4 too.

mod common;
use common::*;

#[test]
fn ext4_on_a_loop_device_over_the_fuse_export() {
    if !can_loop_mount(&[]) {
        return;
    }
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"fuse test key").unwrap();
    let img = dir.path().join("vol.img");
    sparse_file(&img, 64 << 20);
    let fl = FuseLoop::new(dir.path(), "t-fuse");
    let fs = &fl.fs;
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
    let open = || fl.open(&img, &key);
    let disk = fl.disk();

    open();
    let lo = sh("losetup", &[&"-f", &"--show", &"--direct-io=on", &disk])
        .trim()
        .to_string();
    sh("mkfs.ext4", &[&"-q", &lo]);
    sh("mount", &[&lo, fs]);
    std::fs::write(fs.join("hello.txt"), b"hello through cryptblk\n").unwrap();
    let payload = write_pattern(&fs.join("payload.bin"), 5 << 20, 9);
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
    run_ok(cryptblk().args(["close", "t-fuse"]), b"");

    open();
    let lo = sh("losetup", &[&"-f", &"--show", &disk]).trim().to_string();
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("mount", &[&lo, fs]);
    assert_eq!(
        std::fs::read(fs.join("hello.txt")).unwrap(),
        b"hello through cryptblk\n"
    );
    assert!(
        std::fs::read(fs.join("payload.bin")).unwrap() == payload,
        "file content changed"
    );
    sh("umount", &[fs]);
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
