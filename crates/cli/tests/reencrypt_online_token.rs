//! Online LUKS2 re-key unlocked by a token, and a re-key to a given volume key
//! (`--volume-key-file`), against cryptsetup 2.6.1 and the independent model:
//!
//! - a `luks2-keyring` token (cryptsetup's `token add`, the key placed with keyctl) starts
//!   an online re-key (`--token-only`) while fio writes and verifies (crc32c) over NBD; a
//!   `close` at about 40% leaves a state cryptsetup finishes (on a copy, with the key
//!   file) with the data the export served; the volume reopens by the token
//!   mid-reencryption and `--resume-only --token-only` finishes it online under fio; the
//!   token is assigned to the new keyslot (cryptsetup opens the finished volume by it);
//! - cryptsetup 2.6.1 itself ignores token options in `reencrypt` and asks for a
//!   passphrase (checked, so a later cryptsetup that changes this is noticed);
//! - `--volume-key-file` gives a re-key's new volume key, online as offline: cryptsetup
//!   reports exactly that key afterwards; a file holding the current key is refused as
//!   cryptsetup refuses it ("No data segment parameters changed", exit 1).

mod common;
use common::reenc::*;
use common::*;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
/// fio writes the first 4 MiB; the rest keeps the pattern.
const FIO_BYTES: usize = 4 << 20;
const KEY_DESC: &str = "cryptblk-test:reenc";

/// `sh -c SCRIPT` in a fresh session keyring holding the passphrase of `lab` as
/// [`KEY_DESC`]; `$1` is cryptblk (with this test's runtime directory), `$2` the key file.
fn in_keyring(lab: &KeyLab, script: &str) -> Command {
    let mut c = Command::new("keyctl");
    c.env("CRYPTBLK_RUNTIME_DIR", runtime_dir())
        .args(["session", "-", "sh", "-c"])
        .arg(format!(
            "keyctl padd user {KEY_DESC} @s < \"$2\" >/dev/null || exit 9\n{script}"
        ))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_cryptblk"))
        .arg(&lab.key);
    c
}

/// A 48 MiB LUKS2 volume (32 MiB of data) by cryptsetup with a `luks2-keyring` token on
/// keyslot 0, its data a random pattern written through cryptblk's export.
fn token_volume(lab: &KeyLab, name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let img = lab.path("vol.img");
    cryptsetup_luks2(&img, &lab.key, 48 * MIB).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args([
                "token",
                "add",
                "--key-slot",
                "0",
                "--key-description",
                KEY_DESC,
            ])
            .arg(&img),
        b"",
    );
    let sock = lab.path("fill.sock");
    let plain = lab.path("fill.bin");
    let data = write_pattern(&plain, 32 * MIB as usize, 9);
    let s = open_nbd(&img, &lab.key, name, &sock, &[]);
    run_ok(Command::new("nbdcopy").arg(&plain).arg(nbd_uri(&sock)), b"");
    drop(s);
    (img, data)
}

fn finished_plaintext(lab: &KeyLab, img: &Path) -> Vec<u8> {
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"");
    assert!(!dump.contains("reencrypt"), "leftovers:\n{dump}");
    plaintext_by_cryptsetup(img, &lab.key).1
}

#[test]
fn token_started_online_rekey_under_fio_close_resume() {
    if !tools() || tool("keyctl").is_none() {
        return;
    }
    let lab = KeyLab::new(b"token reenc pass");
    let name = "t-reenc-token";
    let (img, pattern) = token_volume(&lab, name);
    let img_s = img.to_str().unwrap();
    // cryptsetup 2.6.1 reads a passphrase in `reencrypt` whatever the token options say.
    let out = run(
        &mut in_keyring(
            &lab,
            &format!(
                "cryptsetup reencrypt --batch-mode --token-only --init-only \
                 --force-offline-reencrypt {img_s} </dev/null"
            ),
        ),
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(!in_progress(&img));
    let old_key = cryptsetup_volume_key(&img, &lab.key, &[]).unwrap();
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&img, &lab.key, name, &sock, &[]);
    // No key file and no passphrase on stdin: only the token can start it.
    let mut start = in_keyring(
        &lab,
        &format!("exec \"$1\" reencrypt -q --token-only --hotzone-size 64k {img_s} </dev/null"),
    );
    start.stdin(std::process::Stdio::null());
    let at_close = close_midway(&lab, &img, name, &sock, start);
    drop(served);
    assert!(at_close[FIO_BYTES..] == pattern[FIO_BYTES..]);
    let copy = lab.path("cs.img");
    std::fs::copy(&img, &copy).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["reencrypt", "--batch-mode", "--resume-only"])
            .args(["--force-offline-reencrypt", "--key-file"])
            .arg(&lab.key)
            .arg(&copy),
        b"",
    );
    assert!(
        finished_plaintext(&lab, &copy) == at_close,
        "cryptsetup's resume of the closed volume lost data"
    );
    std::fs::remove_file(&copy).unwrap();
    // Reopened by the token mid-reencryption, resumed online by it under fio.
    run_ok(
        &mut in_keyring(
            &lab,
            &format!(
                "exec \"$1\" open --token-only {img_s} {name} --nbd {} </dev/null",
                sock.display()
            ),
        ),
        b"",
    );
    let served = Served::volume(name);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    fio_once(
        lab.dir.path(),
        &sock,
        "on the volume opened mid-reencryption",
    );
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the resumed re-key");
    let out = run(
        &mut in_keyring(
            &lab,
            &format!("exec \"$1\" reencrypt -q --resume-only --token-only {img_s} </dev/null"),
        ),
        b"",
    );
    fio.finish();
    assert!(
        out.status.success(),
        "online resume by token failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fio_once(lab.dir.path(), &sock, "after the resumed re-key");
    let after = lab.read_export(&sock, "after.bin");
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    drop(served);
    assert!(
        finished_plaintext(&lab, &img) == after,
        "the new key does not decrypt what the export served"
    );
    assert_ne!(cryptsetup_volume_key(&img, &lab.key, &[]).unwrap(), old_key);
    // The token follows the passphrase to the new keyslot: cryptsetup opens by it.
    let out = run_ok(
        &mut in_keyring(
            &lab,
            &format!("cryptsetup open --test-passphrase --token-only {img_s} && echo opened"),
        ),
        b"",
    );
    assert!(out.contains("opened"), "{out}");
}

#[test]
fn volume_key_file_is_the_new_key_online() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"vk file pass");
    let name = "t-reenc-vkfile";
    let img = lab.path("vol.img");
    cryptsetup_luks2(&img, &lab.key, 24 * MIB).unwrap();
    let plain_before = plaintext_by_cryptsetup(&img, &lab.key).1;
    let current = lab.path("current.key");
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "-q", "--dump-volume-key", "--volume-key-file"])
            .arg(&current)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    // The current key: both tools refuse, nothing changes.
    for c in [&mut cryptsetup().unwrap(), &mut cryptblk()] {
        let out = run(
            c.args(["reencrypt", "--batch-mode", "--force-offline-reencrypt"])
                .arg("--volume-key-file")
                .arg(&current)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("No data segment parameters changed. Reencryption aborted."),
            "{err}"
        );
    }
    assert!(!in_progress(&img));
    // A new key, online.
    let new = lab.path("new.key");
    let new_hex: String = (0u8..64)
        .map(|i| format!("{:02x}", i.wrapping_mul(37) ^ 0x5a))
        .collect();
    std::fs::write(&new, hex_bytes(&new_hex)).unwrap();
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&img, &lab.key, name, &sock, &[]);
    let mut re = lab.reencrypt(&["--hotzone-size", "256k", "--volume-key-file"]);
    re.arg(&new).arg(&img);
    let out = run(&mut re, b"");
    assert!(out.status.success(), "{out:?}");
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "finished", "{st}");
    let served_plain = lab.read_export(&sock, "after.bin");
    drop(served);
    assert!(served_plain == plain_before);
    let (vk, plain) = plaintext_by_cryptsetup(&img, &lab.key);
    assert_eq!(vk, new_hex, "cryptsetup reports another volume key");
    assert!(
        plain == plain_before,
        "the given key does not decrypt the data"
    );
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}
