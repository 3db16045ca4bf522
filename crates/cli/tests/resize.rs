//! `resize` of a served volume: ext4 grown with resize2fs on a loop device over the FUSE
//! export after the image file grew (the independently decrypted image is a clean ext4 of
//! the new size, and the size agrees with the LUKS2 `dynamic` segment rule: the file's size
//! less cryptsetup's data offset); over NBD, new connections see the new size (nbdinfo) and
//! the data stays; refusals exit 1 with cryptsetup's messages.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn grow(img: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// `resize NAME --json --key-file KEY EXTRA..`: a LUKS2 volume opened without
/// `--disable-keyring` needs its key to resize, as with cryptsetup.
fn resize_json(name: &str, key: &Path, extra: &[&str]) -> serde_json::Value {
    let out = run_ok(
        cryptblk()
            .args(["resize", name, "--json", "--key-file"])
            .arg(key)
            .args(extra),
        b"",
    );
    serde_json::from_str(&out).unwrap()
}

#[test]
fn resize2fs_grows_ext4_on_a_loop_over_the_fuse_export() {
    if !can_loop_mount(&["resize2fs"]) {
        return;
    }
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"resize test key").unwrap();
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks2(&img, &key, 32 << 20) else {
        return;
    };
    let name = "t-resize-fuse";
    let fl = FuseLoop::new(dir.path(), name);
    let fs = &fl.fs;
    fl.open(&img, &key);
    let disk = fl.disk();
    let (offset, sector) = cryptsetup_luks2_segment(&img).unwrap();
    assert_eq!(
        std::fs::metadata(&disk).unwrap().len(),
        (32 << 20) - offset as u64
    );
    let lo = sh("losetup", &[&"-f", &"--show", &disk]).trim().to_string();
    sh("mkfs.ext4", &[&"-q", &lo]);
    sh("mount", &[&lo, fs]);
    let payload = write_pattern(&fs.join("payload.bin"), 3 << 20, 5);
    sh("umount", &[fs]);

    grow(&img, 64 << 20);
    let r = resize_json(name, &key, &[]);
    // The LUKS2 `dynamic` segment follows the device: its size less the data offset.
    let want = ((64u64 << 20) - offset as u64) / 512;
    assert_eq!(r["old_sectors"], ((32u64 << 20) - offset as u64) / 512);
    assert_eq!(r["new_sectors"], want);
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), want * 512);
    sh("losetup", &[&"-c", &lo]);
    let lo_size: u64 = sh("blockdev", &[&"--getsize64", &lo])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(lo_size, want * 512);
    // resize2fs wants a check newer than the last mount (which may fall in a later second
    // than mkfs on a busy machine), as the resize2fs procedure asks anyway; a clean
    // filesystem exits 0 here, any repair would fail the test.
    sh("e2fsck", &[&"-fp", &lo]);
    sh("resize2fs", &[&lo]);
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("mount", &[&lo, fs]);
    assert!(
        std::fs::read(fs.join("payload.bin")).unwrap() == payload,
        "file changed by the resize"
    );
    // More than the whole filesystem held before the resize.
    write_pattern(&fs.join("more.bin"), 20 << 20, 6);
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
    run_ok(cryptblk().args(["close", name]), b"");

    // cryptsetup's view: the header still says the segment follows the device, and with
    // its volume key the independently decrypted image is a clean ext4 filling it.
    let mut dump = cryptsetup().unwrap();
    let dump = run_ok(dump.arg("luksDump").arg(&img), b"");
    assert!(dump.contains("length: (whole device)"), "{dump}");
    let vk = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    let raw = std::fs::read(&img).unwrap();
    let plain = independent("decrypt", "aes-xts-plain64", &vk, sector, &raw[offset..]);
    let fs_img = dir.path().join("plain-fs.img");
    std::fs::write(&fs_img, plain).unwrap();
    sh("fsck.ext4", &[&"-fn", &fs_img]);
    let info = sh("dumpe2fs", &[&"-h", &fs_img]);
    let field = |k: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(field("Block count:") * field("Block size:"), want * 512);
}

fn nbd_size(sock: &Path) -> u64 {
    let out = run_ok(
        Command::new("nbdinfo").arg("--size").arg(nbd_uri(sock)),
        b"",
    );
    out.trim().parse().unwrap()
}

#[test]
fn nbd_clients_see_the_new_size_and_refusals_match_cryptsetup() {
    let Some(_) = tool("nbdinfo") else { return };
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"resize test key").unwrap();
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks2(&img, &key, 24 << 20) else {
        return;
    };
    let (offset, _) = cryptsetup_luks2_segment(&img).unwrap();
    let name = "t-resize-nbd";
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    let full = |len: u64| len - offset as u64;
    assert_eq!(nbd_size(&sock), full(24 << 20));
    let data_path = dir.path().join("data.bin");
    let data = write_pattern(&data_path, 1 << 20, 3);
    run_ok(
        Command::new("nbdcopy").arg(&data_path).arg(nbd_uri(&sock)),
        b"",
    );

    grow(&img, 40 << 20);
    let r = resize_json(name, &key, &[]);
    assert_eq!(r["new_sectors"], full(40 << 20) / 512);
    assert_eq!(nbd_size(&sock), full(40 << 20));

    // Shrink to 4 MiB, then by bytes to 2 MiB.
    resize_json(name, &key, &["--size", "8192"]);
    assert_eq!(nbd_size(&sock), 4 << 20);
    resize_json(name, &key, &["--device-size", "2097152"]);
    assert_eq!(nbd_size(&sock), 2 << 20);

    let refusals: [(&[&str], &str); 3] = [
        (&["--size", "999999999"], "is too small."),
        (
            &["--size", "8", "--device-size", "4096"],
            "Options --device-size and --size cannot be combined.",
        ),
        (
            &["--device-size", "1000"],
            "Device size must be multiple of 512 bytes sector.",
        ),
    ];
    for (extra, msg) in refusals {
        let out = run(
            cryptblk()
                .args(["resize", name, "--key-file"])
                .arg(&key)
                .args(extra),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(msg), "{extra:?}: {err}");
        assert_eq!(nbd_size(&sock), 2 << 20, "{extra:?} changed the size");
    }

    // Back to the whole device: the data written before is still there.
    resize_json(name, &key, &["--size", "0"]);
    assert_eq!(nbd_size(&sock), full(40 << 20));
    let back = dir.path().join("back.bin");
    run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&back), b"");
    let back = std::fs::read(&back).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "data changed by the resizes"
    );

    let out = run(cryptblk().args(["resize", "t-resize-none"]), b"");
    assert_eq!(out.status.code(), Some(4));
}
