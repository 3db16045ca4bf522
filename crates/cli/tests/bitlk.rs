//! BitLocker through the binary, against cryptsetup 2.6 on its own test images: `bitlkDump`
//! output and exit codes identical, bad input refused with cryptsetup's exit code, and the
//! unlocked volume read identically through NBD, FUSE and `decrypt` (the image's expected
//! device sha256 from cryptsetup's test suite).

mod common;

use common::{cryptblk, cryptsetup, nbd_uri, run, run_ok, sha256, tempdir, tool, Served};
use std::path::{Path, PathBuf};
use std::process::Command;

/// bitlk-aes-xts-128.img: the device hash after unlocking (cryptsetup's images.conf).
const XTS128_SHA256: &str = "674e3a976927fd62f3fc26df2c695cac75b8d364e3b45393717efa971f16db0f";
const XTS128_RP: &str = "235818-357951-253979-013365-241120-245575-342914-591910";
/// bitlk-aes-xts-128-startup-key.img and its .BEK file.
const SK_SHA256: &str = "bbb68369d8f7badb2c2330349d9d0cf12e68f54eece25e718d2bb13feba23f7a";

fn images(dir: &Path) -> Option<PathBuf> {
    cryptsetup()?;
    common::unpack_cryptsetup_images("bitlk", dir);
    Some(dir.join("bitlk-images"))
}

/// (exit code, stdout) of `cmd` with `stdin`.
fn out(cmd: &mut Command, stdin: &[u8]) -> (i32, String) {
    let o = run(cmd.env("TZ", "UTC"), stdin);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

#[test]
fn dump_and_refusals_match_cryptsetup() {
    let dir = tempdir();
    let Some(d) = images(dir.path()) else { return };
    for name in [
        "bitlk-aes-cbc-elephant-256.img",
        "bitlk-togo-aes-xts-128.img",
        "bitlk-aes-xts-128-startup-key.img",
        "bitlk-aes-xts-128-4k.img",
    ] {
        let img = d.join(name);
        let ours = out(cryptblk().arg("bitlkDump").arg(&img), b"");
        let theirs = out(Command::new("cryptsetup").arg("bitlkDump").arg(&img), b"");
        assert_eq!(ours, theirs, "{name}");
    }
    // A truncated volume, a file that is no BitLocker volume, a missing one.
    let trunc = dir.path().join("trunc.img");
    let head = std::fs::read(d.join("bitlk-aes-xts-128.img"))
        .map(|mut v| {
            v.truncate(35213312 + 100);
            v
        })
        .unwrap();
    std::fs::write(&trunc, head).unwrap();
    let not = dir.path().join("not.img");
    std::fs::write(&not, vec![0u8; 1 << 20]).unwrap();
    let xts = d.join("bitlk-aes-xts-128.img");
    let eow = d.join("bitlk-aes-xts-128-eow.img");
    let missing = dir.path().join("missing.img");
    let vk = dir.path().join("vk");
    std::fs::write(&vk, [7u8; 32]).unwrap();
    let short_vk = dir.path().join("short-vk");
    std::fs::write(&short_vk, [7u8; 5]).unwrap();
    let cases: Vec<(Vec<&std::ffi::OsStr>, &[u8])> = vec![
        (vec!["bitlkDump".as_ref(), trunc.as_os_str()], b""),
        (vec!["bitlkDump".as_ref(), not.as_os_str()], b""),
        (vec!["bitlkDump".as_ref(), missing.as_os_str()], b""),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--test-passphrase".as_ref(),
                xts.as_os_str(),
            ],
            b"anacondA",
        ),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--test-passphrase".as_ref(),
                xts.as_os_str(),
            ],
            b"235818-357951-253979-013365-241120-245575-342914-591911",
        ),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--test-passphrase".as_ref(),
                "--key-file".as_ref(),
                missing.as_os_str(),
                xts.as_os_str(),
            ],
            b"",
        ),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--test-passphrase".as_ref(),
                eow.as_os_str(),
            ],
            b"anaconda",
        ),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--test-passphrase".as_ref(),
                "--volume-key-file".as_ref(),
                vk.as_os_str(),
                xts.as_os_str(),
            ],
            b"",
        ),
        (
            vec![
                "open".as_ref(),
                "--type".as_ref(),
                "bitlk".as_ref(),
                "--volume-key-file".as_ref(),
                short_vk.as_os_str(),
                xts.as_os_str(),
                "x".as_ref(),
            ],
            b"",
        ),
    ];
    for (args, stdin) in &cases {
        let ours = run(cryptblk().args(args), stdin);
        let theirs = run(Command::new("cryptsetup").args(args), stdin);
        let (oc, tc) = (ours.status.code(), theirs.status.code());
        assert_eq!(oc, tc, "{args:?}: exit code");
        assert_ne!(oc, Some(0), "{args:?}");
        let err = String::from_utf8_lossy(&ours.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, got {err:?}");
        assert!(!err.contains("panicked"), "{args:?}");
    }
    // Right secrets: passphrase, recovery password, startup key file.
    for (args, stdin) in [
        (vec![xts.as_os_str()], &b"anaconda"[..]),
        (vec![xts.as_os_str()], XTS128_RP.as_bytes()),
    ] {
        let (c, _) = out(
            cryptblk()
                .args(["open", "--type", "bitlk", "--test-passphrase"])
                .args(&args),
            stdin,
        );
        assert_eq!(c, 0);
    }
}

#[test]
fn served_and_decrypted_bytes_are_the_volume() {
    let dir = tempdir();
    let Some(d) = images(dir.path()) else { return };
    let xts = d.join("bitlk-aes-xts-128.img");
    // decrypt with the volume key cryptsetup stores.
    let vk = dir.path().join("vk");
    let (c, _) = out(
        Command::new("cryptsetup")
            .args(["bitlkDump", "-q", "--dump-volume-key", "--volume-key-file"])
            .arg(&vk)
            .arg(&xts),
        b"anaconda",
    );
    assert_eq!(c, 0);
    let plain = dir.path().join("plain.img");
    run_ok(
        cryptblk()
            .args(["decrypt", "--type", "bitlk", "--volume-key-file"])
            .arg(&vk)
            .arg(&xts)
            .arg(&plain),
        b"",
    );
    assert_eq!(sha256(&plain), XTS128_SHA256);
    std::fs::remove_file(&plain).unwrap();

    // NBD, unlocked by the recovery password.
    if tool("nbdcopy").is_some() {
        let sock = dir.path().join("nbd.sock");
        run_ok(
            cryptblk()
                .args(["open", "--type", "bitlk"])
                .arg(&xts)
                .arg("t-bitlk-nbd")
                .arg("--nbd")
                .arg(&sock),
            XTS128_RP.as_bytes(),
        );
        let _served = Served::volume("t-bitlk-nbd");
        let copy = dir.path().join("nbd.img");
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&copy), b"");
        assert_eq!(sha256(&copy), XTS128_SHA256);
        std::fs::remove_file(&copy).unwrap();
    }

    // FUSE, unlocked by the startup key file.
    if Path::new("/dev/fuse").exists() {
        let sk = d.join("bitlk-aes-xts-128-startup-key.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run_ok(
            cryptblk()
                .args(["open", "--type", "bitlk", "--key-file"])
                .arg(d.join("4381F759-C4F8-4DE0-BB61-FC33A831BDA5.BEK"))
                .arg(&sk)
                .arg("t-bitlk-fuse")
                .arg("--fuse")
                .arg(&mnt),
            b"",
        );
        let _served = Served::volume("t-bitlk-fuse");
        assert_eq!(sha256(&mnt.join("disk")), SK_SHA256);
    }
}
