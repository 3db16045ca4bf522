//! Recovery-key enrolment as `systemd-cryptenroll --recovery-key` does it: `cryptblk enroll
//! --recovery-key` prints a new modhex key on standard output, adds a keyslot with systemd's
//! parameters and a `systemd-recovery` token. The key opens the volume in cryptsetup, in
//! systemd-cryptenroll (which then enrolls a new passphrase with it), and systemd-cryptenroll
//! `--wipe-slot=recovery` recognises the token and removes it. (The other direction, a key
//! systemd enrolled opening in cryptblk, is `token_unlock.rs`'s `systemd_recovery_key`.)

mod common;
use common::*;
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"the passphrase";

fn image(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let img = dir.join("v.img");
    let k = write_file(dir, "k", PASS);
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    Some((img, k))
}

/// Whether `key` has systemd's recovery-key form: 8 dash-separated groups of 8 modhex
/// characters.
fn is_recovery_key(key: &str) -> bool {
    key.len() == 71
        && key.split('-').count() == 8
        && key
            .split('-')
            .all(|g| g.len() == 8 && g.bytes().all(|c| b"cbdefghijklnrtuv".contains(&c)))
}

#[test]
fn cryptblk_enrolled_recovery_key_opens_in_cryptsetup_and_systemd() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let out = run(
        cryptblk().args(["enroll", "--recovery-key"]).arg(&img),
        PASS,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The key alone on standard output, the words around it on standard error.
    let stdout = String::from_utf8(out.stdout).unwrap();
    let key = stdout.trim_end_matches('\n');
    assert!(is_recovery_key(key) && stdout.ends_with('\n'), "{stdout:?}");
    assert!(!err.contains(key), "{err}");
    assert!(
        err.contains("New recovery key enrolled as key slot 1."),
        "{err}"
    );

    // cryptsetup opens keyslot 1 with it; luksDump shows systemd's token and parameters.
    let out = run(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "-v"])
            .arg(&img),
        key.as_bytes(),
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Key slot 1 unlocked.")
            || e.contains("Key slot 1 unlocked."),
        "{e}"
    );
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    assert!(
        dump.contains("  0: systemd-recovery\n\tKeyslot:    1\n"),
        "{dump}"
    );
    let slot1 = &dump[dump.find("  1: luks2").expect(&dump)..];
    for line in [
        "PBKDF:      pbkdf2",
        "Hash:       sha512",
        "Iterations: 1000",
        "AF hash:    sha512",
    ] {
        assert!(slot1.contains(line), "{line} missing from {slot1}");
    }
    let json = run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "export", "--token-id", "0"])
            .arg(&img),
        b"",
    );
    assert_eq!(json, r#"{"type":"systemd-recovery","keyslots":["1"]}"#);

    // systemd-cryptenroll unlocks with the recovery key and enrolls a new passphrase.
    let Some(mut enroll) = tool("systemd-cryptenroll") else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    run_ok(
        enroll
            .arg("--password")
            .env("PASSWORD", key)
            .env("NEWPASSWORD", "new passphrase")
            .arg(&img),
        b"",
    );
    let out = run(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "--key-slot", "2"])
            .arg(&img),
        b"new passphrase",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // systemd-cryptenroll recognises the token: --wipe-slot=recovery removes slot and token.
    run_ok(
        tool("systemd-cryptenroll")
            .unwrap()
            .arg("--wipe-slot=recovery")
            .env("PASSWORD", std::str::from_utf8(PASS).unwrap())
            .arg(&img),
        b"",
    );
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    assert!(
        !dump.contains("systemd-recovery") && !dump.contains("  1: luks2"),
        "{dump}"
    );
    // The passphrase still opens it.
    cryptsetup_volume_key(&img, &k, &[]).unwrap();
}

#[test]
fn recovery_enrolment_needs_the_passphrase() {
    let dir = tempdir();
    let Some((img, _k)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let before = sha256(&img);
    let out = run(
        cryptblk().args(["enroll", "--recovery-key"]).arg(&img),
        b"wrong",
    );
    assert_eq!(exit_code(&out), 2);
    assert!(out.stdout.is_empty());
    assert_eq!(sha256(&img), before);
}
