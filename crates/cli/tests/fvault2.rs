//! FileVault2 through the binary, against cryptsetup 2.6: `fvault2Dump` output (with and
//! without the volume key) and exit codes identical on cryptsetup's test image and on
//! synthetic volumes built by an independent pyca/cryptography model
//! (tests/independent/fvault2.py); bad input refused with cryptsetup's exit code and one
//! line; the unlocked volume read identically through `decrypt`, NBD and FUSE (the image's
//! expected device sha256 from cryptsetup's test suite, the model's plaintext).

mod common;

use common::{cryptblk, cryptsetup, nbd_uri, run, run_ok, sha256, tempdir, tool, Served};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

const PASS: &str = "heslo123";
/// sha256 of the unlocked logical volume (cryptsetup's fvault2-compat-test).
const DEVICE_SHA256: &str = "2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18";

/// The extracted test image, or `None` when cryptsetup is missing and skipping was asked.
fn image(dir: &Path) -> Option<PathBuf> {
    cryptsetup()?;
    common::unpack_cryptsetup_images("fvault2", dir);
    Some(dir.join("fvault2-images/small"))
}

/// A synthetic volume from the independent model: (image, plaintext, volume key hex).
fn synthetic(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, PathBuf, String) {
    let img = dir.join(format!("{name}.img"));
    let plain = dir.join(format!("{name}.plain"));
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/fvault2.py");
    let vk = run_ok(
        Command::new("python3")
            .arg(model)
            .arg(&img)
            .arg(&plain)
            .args(args),
        b"",
    );
    (img, plain, vk.trim().to_string())
}

/// (exit code, stdout) of `cmd` with `stdin`.
fn out(cmd: &mut Command, stdin: &[u8]) -> (i32, String) {
    let o = run(cmd, stdin);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// A sparse copy of `src` with `f` applied to it.
fn variant(src: &Path, dst: &Path, f: impl FnOnce(&std::fs::File)) -> PathBuf {
    run_ok(
        Command::new("cp").arg("--sparse=always").arg(src).arg(dst),
        b"",
    );
    let file = std::fs::OpenOptions::new().write(true).open(dst).unwrap();
    f(&file);
    dst.to_path_buf()
}

fn flip(at: u64) -> impl FnOnce(&std::fs::File) {
    move |f| {
        use std::os::unix::fs::FileExt;
        // The handle is write-only: the byte is read through another one.
        let mut b = [0u8];
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f));
        std::fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut b, at)
            .unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
    }
}

#[test]
fn dump_and_refusals_match_cryptsetup() {
    let dir = tempdir();
    let Some(img) = image(dir.path()) else { return };
    let d = dir.path();
    let (syn, _, syn_vk) = synthetic(d, "syn", &[]);
    let (syn2, _, syn2_vk) = synthetic(
        d,
        "syn2",
        &[
            "--shuffle",
            "--seed",
            "7",
            "--block-size",
            "512",
            "--lv-block",
            "200",
            "--lv-size",
            "300000",
            "--iterations",
            "2000",
            "--passphrase",
            "p \u{e4}",
        ],
    );
    // Truncated inside the logical volume: the metadata is whole, so both dump it.
    let short = variant(&img, &d.join("short.img"), |f| {
        f.set_len(100_000_000).unwrap()
    });

    // Dumps, without and with the volume key.
    for (dev, pass, vk) in [
        (&img, PASS, Some("20 73 4d 33 89 21 27 74 d7 61 0c 29 d7 32 88 09 16 f3 be 14 c4 b1 2a c7 aa f0 7e 5c cc 77 b3 19 ")),
        (&syn, "synthetic", None),
        (&syn2, "p \u{e4}", None),
        (&short, PASS, None),
    ] {
        let ours = out(cryptblk().arg("fvault2Dump").arg(dev), b"");
        let theirs = out(Command::new("cryptsetup").arg("fvault2Dump").arg(dev), b"");
        assert_eq!(ours, theirs, "{}", dev.display());
        assert_eq!(ours.0, 0);
        let ours = out(
            cryptblk().args(["fvault2Dump", "--dump-volume-key"]).arg(dev),
            pass.as_bytes(),
        );
        let theirs = out(
            Command::new("cryptsetup")
                .args(["fvault2Dump", "--dump-volume-key"])
                .arg(dev),
            pass.as_bytes(),
        );
        assert_eq!(ours, theirs, "{}: --dump-volume-key", dev.display());
        if let Some(vk) = vk {
            assert!(ours.1.ends_with(&format!("Volume key:       \t{vk}\n")));
        }
    }
    // The model's volume keys are what both tools report.
    for (dev, pass, vk) in [(&syn, "synthetic", &syn_vk), (&syn2, "p \u{e4}", &syn2_vk)] {
        let (c, text) = out(
            cryptblk()
                .args(["fvault2Dump", "--dump-volume-key"])
                .arg(dev),
            pass.as_bytes(),
        );
        assert_eq!(c, 0);
        let shown: String = text
            .lines()
            .last()
            .unwrap()
            .trim_start_matches("Volume key:")
            .split_whitespace()
            .collect();
        assert_eq!(&shown, vk);
    }
    // --volume-key-file: the same key stored, the same text, and an existing file refused.
    let (ours_vk, theirs_vk) = (d.join("ours.vk"), d.join("theirs.vk"));
    let ours = out(
        cryptblk()
            .args(["fvault2Dump", "--dump-volume-key", "--volume-key-file"])
            .arg(&ours_vk)
            .arg(&img),
        PASS.as_bytes(),
    );
    let theirs = out(
        Command::new("cryptsetup")
            .args(["fvault2Dump", "--dump-volume-key", "--volume-key-file"])
            .arg(&theirs_vk)
            .arg(&img),
        PASS.as_bytes(),
    );
    assert_eq!(ours, theirs);
    assert_eq!(
        std::fs::read(&ours_vk).unwrap(),
        std::fs::read(&theirs_vk).unwrap()
    );

    // Bad input: identical exit codes, one line from cryptblk, no panic.
    let trunc = variant(&img, &d.join("trunc.img"), |f| {
        f.set_len(8_400_000).unwrap()
    });
    let bad_pv = variant(&img, &d.join("bad-pv.img"), flip(200));
    let bad_label = variant(&img, &d.join("bad-label.img"), flip(4096 + 300));
    let bad_md = variant(&img, &d.join("bad-md.img"), flip(8_392_704 + 8192 + 1000));
    let zeros = d.join("zeros.img");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let tiny = d.join("tiny.img");
    std::fs::write(&tiny, [0u8; 100]).unwrap();
    let missing = d.join("missing.img");
    let short_vk = d.join("short.vk");
    std::fs::write(&short_vk, [7u8; 16]).unwrap();
    let dump = |dev: &Path| -> Vec<std::ffi::OsString> {
        vec!["fvault2Dump".into(), dev.as_os_str().to_owned()]
    };
    let test = |extra: &[&OsStr]| -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec![
            "open".into(),
            "--type".into(),
            "fvault2".into(),
            "--test-passphrase".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_os_string()));
        v.push(img.as_os_str().to_owned());
        v
    };
    let cases: Vec<(Vec<std::ffi::OsString>, &[u8])> = vec![
        (dump(&trunc), b""),
        (dump(&bad_pv), b""),
        (dump(&bad_label), b""),
        (dump(&bad_md), b""),
        (dump(&zeros), b""),
        (dump(&tiny), b""),
        (dump(&missing), b""),
        (test(&[]), b"heslo124"),
        (test(&[]), b""),
        (test(&["--key-file".as_ref(), missing.as_os_str()]), b""),
        (
            test(&["--volume-key-file".as_ref(), theirs_vk.as_os_str()]),
            b"",
        ),
        (
            test(&["--volume-key-file".as_ref(), short_vk.as_os_str()]),
            b"",
        ),
        (
            vec![
                "open".into(),
                "--type".into(),
                "fvault2".into(),
                "--test-passphrase".into(),
                trunc.as_os_str().to_owned(),
            ],
            PASS.as_bytes(),
        ),
        (
            vec![
                "open".into(),
                "--type".into(),
                "fvault2".into(),
                "--volume-key-file".into(),
                short_vk.as_os_str().to_owned(),
                img.as_os_str().to_owned(),
                "t-fvault2-x".into(),
            ],
            b"",
        ),
        (
            vec![
                "fvault2Dump".into(),
                "--dump-volume-key".into(),
                img.as_os_str().to_owned(),
            ],
            b"wrong",
        ),
        (
            vec![
                "fvault2Dump".into(),
                "--dump-volume-key".into(),
                "--volume-key-file".into(),
                theirs_vk.as_os_str().to_owned(),
                img.as_os_str().to_owned(),
            ],
            PASS.as_bytes(),
        ),
    ];
    for (args, stdin) in &cases {
        let ours = run(cryptblk().args(args), stdin);
        let theirs = run(Command::new("cryptsetup").args(args), stdin);
        let (oc, tc) = (ours.status.code(), theirs.status.code());
        assert_eq!(oc, tc, "{args:?}: exit code");
        assert_ne!(oc, Some(0), "{args:?}");
        assert!(ours.stdout.is_empty(), "{args:?}: nothing on stdout");
        let err = String::from_utf8_lossy(&ours.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, got {err:?}");
        assert!(!err.contains("panicked"), "{args:?}");
    }
    // The damaged copies were only read.
    assert_eq!(std::fs::metadata(&trunc).unwrap().len(), 8_400_000);

    // Right passphrase, on standard input and from a key file.
    let key = d.join("key");
    std::fs::write(&key, PASS).unwrap();
    for (extra, stdin) in [
        (vec![], PASS.as_bytes()),
        (vec!["--key-file".as_ref(), key.as_os_str()], &b""[..]),
    ] {
        let args = test(&extra);
        let ours = out(cryptblk().args(&args), stdin);
        let theirs = out(Command::new("cryptsetup").args(&args), stdin);
        assert_eq!(ours, theirs, "{args:?}");
        assert_eq!(ours.0, 0, "{args:?}");
    }
}

#[test]
fn served_and_decrypted_bytes_are_the_volume() {
    let dir = tempdir();
    let Some(img) = image(dir.path()) else { return };
    let d = dir.path();
    let key = d.join("key");
    std::fs::write(&key, PASS).unwrap();

    // decrypt with the passphrase from a key file.
    let plain = d.join("plain.img");
    run_ok(
        cryptblk()
            .args(["decrypt", "--type", "fvault2", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(&plain),
        b"",
    );
    assert_eq!(sha256(&plain), DEVICE_SHA256);
    std::fs::remove_file(&plain).unwrap();

    // decrypt a synthetic volume with the volume key cryptsetup stores: the model's plaintext.
    let (syn, syn_plain, _) = synthetic(
        d,
        "syn",
        &[
            "--shuffle",
            "--block-size",
            "512",
            "--lv-block",
            "120",
            "--lv-size",
            "524288",
        ],
    );
    let vk = d.join("syn.vk");
    run_ok(
        Command::new("cryptsetup")
            .args(["fvault2Dump", "--dump-volume-key", "--volume-key-file"])
            .arg(&vk)
            .arg(&syn),
        b"synthetic",
    );
    let out = d.join("syn.out");
    run_ok(
        cryptblk()
            .args(["decrypt", "--type", "fvault2", "--volume-key-file"])
            .arg(&vk)
            .arg(&syn)
            .arg(&out),
        b"",
    );
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&syn_plain).unwrap());

    // A logical volume that runs past the end of the device is refused, as cryptsetup's
    // activation refuses it (exit 1), offline and served.
    let short = d.join("short.img");
    run_ok(
        Command::new("cp")
            .arg("--sparse=always")
            .arg(&img)
            .arg(&short),
        b"",
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap()
        .set_len(100_000_000)
        .unwrap();
    let sock = d.join("short.sock");
    for args in [
        vec![
            "decrypt".into(),
            "--type".into(),
            "fvault2".into(),
            short.as_os_str().to_owned(),
            d.join("x").into_os_string(),
        ],
        vec![
            "open".into(),
            "--type".into(),
            "fvault2".into(),
            short.as_os_str().to_owned(),
            "t-fvault2-short".into(),
            "--nbd".into(),
            sock.as_os_str().to_owned(),
        ],
    ] {
        let o = run(cryptblk().args(&args), PASS.as_bytes());
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("is too small"), "{err}");
    }
    assert!(!d.join("x").exists() && !sock.exists());

    // NBD, unlocked by the passphrase on standard input; read-write as cryptsetup maps it.
    if tool("nbdcopy").is_some() {
        let sock = d.join("nbd.sock");
        run_ok(
            cryptblk()
                .args(["open", "--type", "fvault2"])
                .arg(&img)
                .arg("t-fvault2-nbd")
                .arg("--nbd")
                .arg(&sock),
            PASS.as_bytes(),
        );
        let _served = Served::volume("t-fvault2-nbd");
        let st = common::status("t-fvault2-nbd");
        assert_eq!(st["readonly"], false, "{st}");
        let copy = d.join("nbd.img");
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&copy), b"");
        assert_eq!(sha256(&copy), DEVICE_SHA256);
        std::fs::remove_file(&copy).unwrap();
    }

    // FUSE, read-only with --readonly, unlocked by the key file.
    if Path::new("/dev/fuse").exists() {
        let mnt = d.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run_ok(
            cryptblk()
                .args(["open", "--type", "fvault2", "--readonly", "--key-file"])
                .arg(&key)
                .arg(&img)
                .arg("t-fvault2-fuse")
                .arg("--fuse")
                .arg(&mnt),
            b"",
        );
        let _served = Served::volume("t-fvault2-fuse");
        let st = common::status("t-fvault2-fuse");
        assert_eq!(st["readonly"], true, "{st}");
        assert_eq!(sha256(&mnt.join("disk")), DEVICE_SHA256);
    }
}
