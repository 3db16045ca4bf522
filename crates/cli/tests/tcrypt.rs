//! TrueCrypt/VeraCrypt through the binary: tcryptDump against cryptsetup's, `open --type
//! tcrypt` served over NBD (one cipher, a three-cipher chain stacked as cryptsetup stacks
//! it, a legacy CBC volume), `decrypt --type tcrypt` of chains and hidden volumes, and bad
//! input (wrong passphrase, missing key file, truncated and corrupted headers) with
//! cryptsetup's messages and exit codes. The images are cryptsetup's (TrueCrypt iteration
//! counts: fast).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const PASS: &[u8] = b"aaaaaaaaaaaa\n";

fn images(dir: &Path) -> PathBuf {
    let root = std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/cryptsetup-tests"
            ))
        });
    let tarball = root.join("tcrypt-images.tar.xz");
    assert!(
        tarball.exists(),
        "{} missing (set CRYPTBLK_CRYPTSETUP_TESTS)",
        tarball.display()
    );
    run_ok(
        Command::new("tar")
            .arg("xJSf")
            .arg(&tarball)
            .arg("-C")
            .arg(dir),
        b"",
    );
    dir.join("tcrypt-images")
}

fn blkid_uuid(p: &Path) -> String {
    run_ok(
        Command::new("blkid")
            .args(["-p", "-s", "UUID", "-o", "value"])
            .arg(p),
        b"",
    )
    .trim()
    .to_string()
}

/// Runs cryptblk with `args` and `stdin`: (exit code, stdout, stderr).
fn cb(args: &[&dyn AsRef<std::ffi::OsStr>], stdin: &[u8]) -> (i32, String, String) {
    let mut c = cryptblk();
    for a in args {
        c.arg(a);
    }
    let out = run(&mut c, stdin);
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tcrypt_dump_is_cryptsetups() {
    let Some(_) = cryptsetup() else { return };
    let tmp = tempdir();
    let imgs = images(tmp.path());
    let img = imgs.join("tc_5-sha512-xts-aes");
    let keyed = imgs.join("tck_5-sha512-xts-aes");
    let (k1, k2) = (imgs.join("keyfile1"), imgs.join("keyfile2"));
    let two_keys = [
        "--key-file",
        k1.to_str().unwrap(),
        "--key-file",
        k2.to_str().unwrap(),
    ];
    // The header, the volume key, and a volume with two key files (several --key-file, as
    // cryptsetup takes them for TCRYPT).
    for (img, extra) in [
        (&img, &[][..]),
        (&img, &["--dump-volume-key", "-q"][..]),
        (&keyed, &two_keys[..]),
    ] {
        let mut theirs = cryptsetup().unwrap();
        theirs
            .args(["tcryptDump", "-h", "sha512", "-c", "aes"])
            .args(extra)
            .arg(img);
        let theirs = run_ok(&mut theirs, PASS);
        let mut ours = cryptblk();
        ours.args(["tcryptDump", "-h", "sha512", "-c", "aes"])
            .args(extra)
            .arg(img);
        assert_eq!(run_ok(&mut ours, PASS), theirs, "tcryptDump {extra:?}");
    }
}

#[test]
fn tcrypt_open_over_nbd_and_decrypt() {
    let tmp = tempdir();
    let imgs = images(tmp.path());
    let img = imgs.join("tc_5-sha512-xts-aes");
    let sock = tmp.path().join("nbd.sock");
    run_ok(
        cryptblk()
            .args([
                "open", "--type", "tcrypt", "-r", "-h", "sha512", "-c", "aes",
            ])
            .arg(&img)
            .arg("tc5")
            .arg("--nbd")
            .arg(&sock),
        PASS,
    );
    let served = Served::volume("tc5");
    let st = status("tc5");
    assert_eq!(st["info"]["type"], "TCRYPT", "{st}");
    let via_nbd = tmp.path().join("nbd.img");
    run_ok(
        Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&via_nbd),
        b"",
    );
    drop(served);
    assert_eq!(blkid_uuid(&via_nbd), "DEAD-BABE");
    let out = tmp.path().join("plain.img");
    run_ok(
        cryptblk()
            .args(["decrypt", "--type", "tcrypt", "-h", "sha512", "-c", "aes"])
            .arg(&img)
            .arg(&out),
        PASS,
    );
    assert_eq!(
        sha256(&out),
        sha256(&via_nbd),
        "decrypt and open read the same data"
    );

    // A three-cipher XTS chain and a hidden volume in an LRW chain, offline.
    for (image, pass, extra, uuid) in [
        (
            "tc_5-sha512-xts-serpent-twofish-aes",
            PASS,
            &[][..],
            "DEAD-BABE",
        ),
        (
            "tc_2-ripemd160-lrw-serpent-twofish-aes-hidden",
            &b"bbbbbbbbbbbb\n"[..],
            &["--tcrypt-hidden"][..],
            "CAFE-BABE",
        ),
    ] {
        let _ = std::fs::remove_file(&out);
        run_ok(
            cryptblk()
                .args(["decrypt", "--type", "tcrypt"])
                .args(extra)
                .arg(imgs.join(image))
                .arg(&out),
            pass,
        );
        assert_eq!(blkid_uuid(&out), uuid, "{image}");
    }
    // Chains are served as cryptsetup stacks them (one crypt mapping per cipher, the lower
    // ones <name>_1 and <name>_2 in the same daemon), and a legacy TrueCrypt 1.0 CAST5
    // volume through dm-crypt's cbc-tcw: the NBD export reads as `decrypt` does.
    for (image, opts, name, layers) in [
        ("tc_5-sha512-xts-serpent-twofish-aes", &[][..], "chain", 3),
        (
            "tc_3-ripemd160-xts-aes-twofish-serpent",
            &["-h", "ripemd160"][..],
            "chain3",
            3,
        ),
        (
            "vc_1-sha512-xts-kuznyechik-camellia",
            &["-h", "sha512"][..],
            "vc2",
            2,
        ),
        ("tc_1-sha1-cbc-cast5", &["-h", "sha1"][..], "tc1", 1),
    ] {
        let sock = tmp.path().join(format!("{name}.sock"));
        run_ok(
            cryptblk()
                .args(["open", "--type", "tcrypt", "-r"])
                .args(opts)
                .arg(imgs.join(image))
                .arg(name)
                .arg("--nbd")
                .arg(&sock),
            PASS,
        );
        let served = Served::volume(name);
        let via_nbd = tmp.path().join(format!("{name}.nbd.img"));
        run_ok(
            Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&via_nbd),
            b"",
        );
        let st = status(name);
        assert_eq!(st["info"]["type"], "TCRYPT", "{st}");
        for i in 1..layers {
            let lower = format!("{name}_{i}");
            let (rc, _, err) = cb(&[&"dm", &"status", &lower], b"");
            assert_eq!(rc, 0, "{lower} is served: {err}");
        }
        drop(served);
        if layers > 1 {
            let (rc, _, _) = cb(&[&"dm", &"status", &format!("{name}_1")], b"");
            assert_ne!(rc, 0, "closing {name} removes {name}_1");
        }
        assert_eq!(blkid_uuid(&via_nbd), "DEAD-BABE", "{image}");
        let plain = tmp.path().join(format!("{name}.plain.img"));
        run_ok(
            cryptblk()
                .args(["decrypt", "--type", "tcrypt"])
                .args(opts)
                .arg(imgs.join(image))
                .arg(&plain),
            PASS,
        );
        assert_eq!(
            sha256(&plain),
            sha256(&via_nbd),
            "{image}: NBD reads as decrypt"
        );
        let _ = std::fs::remove_file(&plain);
        let _ = std::fs::remove_file(&via_nbd);
    }
    // The legacy CBC cascades have no dm-crypt mode: refused in one line as by cryptsetup,
    // before anything is served; `decrypt` reads them (its engine is checked against pyca
    // in crates/cipher/tests/tcrypt_cbc_pyca.rs).
    let cascade = imgs.join("tc_2-ripemd160-cbc-aes-twofish-serpent");
    let (rc, _, err) = cb(
        &[
            &"open",
            &"--type",
            &"tcrypt",
            &"-h",
            &"ripemd160",
            &cascade,
            &"legacy",
            &"--nbd",
            &tmp.path().join("legacy.sock"),
        ],
        PASS,
    );
    assert_eq!((rc, err.lines().count()), (1, 1), "{err}");
    assert!(err.contains("legacy mode"), "{err}");
    // (This image's data area is zeros, as cryptsetup ships it: only the size can be checked.)
    let _ = std::fs::remove_file(&out);
    run_ok(
        cryptblk()
            .args(["decrypt", "--type", "tcrypt", "-h", "ripemd160"])
            .arg(&cascade)
            .arg(&out),
        PASS,
    );
    let len = std::fs::metadata(&out).unwrap().len();
    assert_eq!(len, std::fs::metadata(&cascade).unwrap().len() - 512);
}

#[test]
fn tcrypt_bad_input() {
    let tmp = tempdir();
    let imgs = images(tmp.path());
    let img = imgs.join("tc_5-sha512-xts-aes");
    let dump = |dev: &Path, extra: &[&str], stdin: &[u8]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"tcryptDump", &"-h", &"sha512"];
        for e in extra {
            args.push(e);
        }
        args.push(&dev);
        cb(&args, stdin)
    };
    let no_header = "No device header detected with this passphrase.\n";

    let (rc, out, err) = dump(&img, &[], b"aaaaaaaaaaab\n");
    assert_eq!((rc, out.as_str(), err.as_str()), (2, "", no_header));

    let (rc, _, err) = dump(&img, &["--key-file", "/nonexistent/key"], PASS);
    assert_eq!((rc, err.as_str()), (1, "Failed to open key file.\n"));

    let (rc, _, err) = dump(&tmp.path().join("missing"), &[], PASS);
    assert_eq!(rc, 4, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // A header cut short, and one with a flipped byte in its encrypted part.
    let data = std::fs::read(&img).unwrap();
    let cut = write_file(tmp.path(), "cut", &data[..300]);
    assert_eq!(dump(&cut, &[], PASS).2, no_header);
    assert_eq!(dump(&cut, &[], PASS).0, 2);
    let mut bad = data.clone();
    bad[200] ^= 1;
    let bad = write_file(tmp.path(), "bad", &bad);
    let (rc, _, err) = dump(&bad, &[], PASS);
    assert_eq!((rc, err.as_str()), (2, no_header));

    // Options cryptsetup refuses.
    let (rc, _, err) = dump(&img, &["-c", "nosuchcipher"], PASS);
    assert_eq!((rc, err.lines().count()), (1, 1), "{err}");
    let (rc, _, err) = dump(&img, &["--veracrypt-pim", "5", "--disable-veracrypt"], PASS);
    assert_eq!((rc, err.lines().count()), (1, 1), "{err}");
    // Several key files only for TCRYPT, as in cryptsetup.
    let (rc, _, err) = cb(
        &[
            &"open",
            &"-d",
            &"a",
            &"-d",
            &"b",
            &img,
            &"--test-passphrase",
        ],
        PASS,
    );
    assert_eq!(
        (rc, err.as_str()),
        (1, "Only one --key-file argument is allowed.\n")
    );
    // An unknown hash finds no header, as in cryptsetup.
    let (rc, _, err) = cb(&[&"tcryptDump", &"-h", &"nosuchhash", &img], PASS);
    assert_eq!((rc, err.as_str()), (2, no_header));
}
