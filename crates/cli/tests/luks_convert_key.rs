//! `luksConvertKey` against the real cryptsetup: the same conversion of the same header by
//! both tools gives the same keyslot (as cryptsetup's luksDump shows it, salts aside), the
//! converted keyslot still opens with its passphrase in cryptsetup and holds the same
//! volume key, and refusals exit with cryptsetup's codes. One deliberate difference: with
//! `--key-slot` cryptsetup overwrites the keyslot's area in place, cryptblk stays
//! crash-safe and moves it to a free area as without it.

mod common;
use common::*;
use std::path::{Path, PathBuf};

/// cryptsetup's luksDump keyslot section without the random salts.
fn keyslots(img: &Path) -> String {
    let mut c = cryptsetup().unwrap();
    let dump = run_ok(c.arg("luksDump").arg(img), b"");
    let section = dump
        .split("Keyslots:")
        .nth(1)
        .and_then(|s| s.split("Tokens:").next())
        .expect("keyslot section");
    section
        .lines()
        .filter(|l| {
            let t = l.trim();
            !t.starts_with("Salt:")
                && !t
                    .split(' ')
                    .all(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A LUKS2 image by cryptsetup with A in keyslot 0 (PBKDF2-sha512, preferred, CBC area) and
/// B in keyslot 1.
fn image(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let mut c = cryptsetup()?;
    let img = dir.join("vol.img");
    sparse_file(&img, 24 << 20);
    let a = write_file(dir, "a", b"passphrase A");
    let b = write_file(dir, "b", b"passphrase B");
    run_ok(
        c.args(["luksFormat", "--type", "luks2", "--hash", "sha512"])
            .args(FAST)
            .args([
                "--keyslot-cipher",
                "aes-cbc-essiv:sha256",
                "--keyslot-key-size",
                "256",
            ])
            .arg("--key-file")
            .arg(&a)
            .arg(&img),
        b"",
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["config", "--priority", "prefer", "-S", "0"])
            .arg(&img),
        b"",
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .arg("luksAddKey")
            .args(FAST)
            .arg("--key-file")
            .arg(&a)
            .arg(&img)
            .arg(&b),
        b"",
    );
    Some((img, a, b))
}

#[test]
fn conversions_match_cryptsetup() {
    let dir = tempdir();
    let Some((img, a, b)) = image(dir.path()) else {
        return;
    };
    let vk = cryptsetup_volume_key(&img, &a, &[]).unwrap();
    let cases: [(&str, &Path, &[&str]); 3] = [
        (
            "argon2id slot 0",
            &a,
            &[
                "--pbkdf",
                "argon2id",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-memory",
                "32",
                "--pbkdf-parallel",
                "1",
            ],
        ),
        (
            "pbkdf2 sha512 by key slot",
            &b,
            &[
                "--pbkdf",
                "pbkdf2",
                "--hash",
                "sha512",
                "--pbkdf-force-iterations",
                "1234",
                "-S",
                "1",
            ],
        ),
        (
            "argon2i",
            &a,
            &[
                "--pbkdf",
                "argon2i",
                "--pbkdf-force-iterations",
                "5",
                "--pbkdf-memory",
                "64",
                "--pbkdf-parallel",
                "2",
            ],
        ),
    ];
    for (what, key, opts) in cases {
        let theirs = dir.path().join("theirs.img");
        let ours = dir.path().join("ours.img");
        std::fs::copy(&img, &theirs).unwrap();
        std::fs::copy(&img, &ours).unwrap();
        run_ok(
            cryptsetup()
                .unwrap()
                .arg("luksConvertKey")
                .args(opts)
                .arg("--key-file")
                .arg(key)
                .arg(&theirs),
            b"",
        );
        run_ok(
            cryptblk()
                .arg("luksConvertKey")
                .args(opts)
                .arg("--key-file")
                .arg(key)
                .arg(&ours),
            b"",
        );
        // cryptsetup rewrites a keyslot named with -S in place (a crash there loses it);
        // cryptblk always writes the new material to a free area first, so only the area's
        // offset may differ then.
        let in_place = opts.contains(&"-S");
        let strip = |dump: String| -> String {
            dump.lines()
                .filter(|l| !(in_place && l.contains("Area offset:")))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(keyslots(&ours)), strip(keyslots(&theirs)), "{what}");
        for k in [&a, &b] {
            let mut c = cryptsetup().unwrap();
            run_ok(
                c.args(["open", "--test-passphrase", "--key-file"])
                    .arg(k)
                    .arg(&ours),
                b"",
            );
        }
        assert_eq!(
            cryptsetup_volume_key(&ours, key, &[]).unwrap(),
            vk,
            "{what}"
        );
    }
}

#[test]
fn refusals_exit_as_cryptsetup() {
    let dir = tempdir();
    let Some((img, a, _)) = image(dir.path()) else {
        return;
    };
    let bad = write_file(dir.path(), "bad", b"wrong");
    let luks1 = dir.path().join("luks1.img");
    cryptsetup_luks1(&luks1, &a, 8 << 20).unwrap();
    let cases: [(&Path, &Path, &[&str], i32, &str); 3] = [
        (&luks1, &a, &[], 1, "is not a valid LUKS2 device."),
        (&img, &bad, &[], 2, "No key available with this passphrase."),
        (&img, &a, &["-S", "3"], 1, "Keyslot 3 is not active."),
    ];
    for (dev, key, extra, want, msg) in cases {
        let before = std::fs::read(dev).unwrap();
        let theirs = run(
            cryptsetup()
                .unwrap()
                .arg("luksConvertKey")
                .args(FAST)
                .args(extra)
                .arg("--key-file")
                .arg(key)
                .arg(dev),
            b"",
        );
        assert_eq!(exit_code(&theirs), want, "cryptsetup {msg}");
        assert_eq!(
            std::fs::read(dev).unwrap(),
            before,
            "cryptsetup changed {msg}"
        );
        let ours = run(
            cryptblk()
                .arg("luksConvertKey")
                .args(FAST)
                .args(extra)
                .arg("--key-file")
                .arg(key)
                .arg(dev),
            b"",
        );
        let err = String::from_utf8_lossy(&ours.stderr);
        assert_eq!(exit_code(&ours), want, "{msg}: {err}");
        assert!(err.contains(msg), "{msg}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(std::fs::read(dev).unwrap(), before, "{msg}");
    }
}
