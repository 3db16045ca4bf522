//! `open` without an export option makes a device, as cryptsetup does (issue 28 item 5,
//! issue 29 item 2): this host has no ublk, so the volume is served over NBD on
//! `<runtime dir>/NAME.sock`; that path is the volume's stable name, which `status` prints
//! where cryptsetup prints `/dev/mapper/NAME` and `status --json` carries as
//! `device_path`. The plaintext read over that socket by qemu-img is the one the independent
//! dm-crypt model encrypted with cryptsetup's volume key into a cryptsetup-made volume.
//! (The ublk choice, where /dev/ublk-control is usable, is unit-tested in
//! src/actions/serving.rs; it cannot run here.)

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

/// Runs `cmd` to completion (60 s at most, then killed and failed).
fn run_timed(cmd: &mut Command) -> std::process::Output {
    let mut child = spawn_captured(cmd);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn open_without_export_serves_nbd_at_the_runtime_socket_that_status_names() {
    assert!(
        !Path::new("/dev/ublk-control").exists(),
        "this test is for a host without ublk (it would serve /dev/cryptblk/NAME)"
    );
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let key = write_file(dir.path(), "key", b"default export key");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is needed");

    // Known plaintext, encrypted into the data area by the independent model with the key
    // cryptsetup reports.
    let vk = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    let (offset, sector) = cryptsetup_luks2_segment(&img).unwrap();
    let plain = write_pattern(&dir.path().join("plain"), 256 << 10, 28);
    let ct = independent("encrypt", "aes-xts-plain64", &vk, sector, &plain);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &ct, offset as u64).unwrap();
    drop(f);

    let name = "t-default-export";
    let out = run(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(name),
        b"",
    );
    assert!(
        out.status.success(),
        "open without an export option: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _served = Served::volume(name);
    let sock = runtime_dir().join(format!("{name}.sock"));
    assert!(sock.exists(), "NBD socket at {}", sock.display());

    // cryptsetup's first status line, naming the socket; the JSON carries it too.
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert_eq!(
        text.lines().next().unwrap_or_default(),
        format!("{} is active.", sock.display()),
        "status:\n{text}"
    );
    assert!(!text.contains("/dev/mapper/"), "status:\n{text}");
    assert_eq!(
        status(name)["device_path"].as_str(),
        Some(sock.to_str().unwrap())
    );

    // qemu-img reads the plaintext over the socket.
    let copy = dir.path().join("copy.raw");
    let out = run_timed(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(nbd_uri(&sock))
            .arg(&copy),
    );
    assert!(
        out.status.success(),
        "qemu-img convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read(&copy).unwrap();
    assert_eq!(got.len(), (32 << 20) - offset, "the volume's size");
    assert!(
        got[..plain.len()] == plain[..],
        "plaintext over the default NBD socket"
    );

    // close removes the socket (the name is free again).
    run_ok(cryptblk().args(["close", name]), b"");
    assert!(!sock.exists(), "socket left after close");
}

#[test]
fn status_names_the_export_where_cryptsetup_names_dev_mapper() {
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let key = write_file(dir.path(), "key", b"status path key");
    cryptblk_luks2(&img, &key, 32 << 20);
    let name = "t-status-path";
    let sock = dir.path().join("explicit.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert_eq!(
        text.lines().next().unwrap_or_default(),
        format!("{} is active.", sock.display()),
        "status:\n{text}"
    );
    assert_eq!(
        status(name)["device_path"].as_str(),
        Some(sock.to_str().unwrap())
    );
    // A suspended volume says so as cryptsetup does: " (suspended)" after the mode.
    run_ok(cryptblk().args(["luksSuspend", name]), b"");
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert!(
        text.lines()
            .any(|l| l == "  mode:    read/write (suspended)"),
        "status of a suspended volume:\n{text}"
    );
    run_ok(
        cryptblk()
            .args(["luksResume", "--key-file"])
            .arg(&key)
            .arg(name),
        b"",
    );
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert!(
        text.lines().any(|l| l == "  mode:    read/write"),
        "status after resume:\n{text}"
    );
}
