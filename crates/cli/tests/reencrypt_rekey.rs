//! `cryptblk reencrypt` (offline LUKS2 re-key) against cryptsetup 2.6, both ways:
//!
//! - a volume cryptblk re-keyed is accepted by `cryptsetup open --test-passphrase`, and the
//!   data decrypts to the original plaintext with the new volume key cryptsetup reports,
//!   through the independent dm-crypt model;
//! - `cryptblk reencrypt --init-only` writes metadata (and the reencryption digest)
//!   cryptsetup's `reencrypt --resume-only` accepts and finishes;
//! - cryptblk killed at its Nth write (strace fault injection on pwrite64) is finished by
//!   cryptsetup (after `repair` where it asks); cryptsetup killed at its Nth write is
//!   finished by `cryptblk reencrypt --resume-only`;
//! - refusals carry cryptsetup's messages and exit codes.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"rekey-pass";
const MIB: usize = 1 << 20;

type Lab = KeyLab;

impl Lab {
    /// A 4 MiB LUKS2 image by cryptsetup (2 MiB metadata, 512-byte sectors) over random
    /// data, with a second keyslot under another passphrase; returns the image and the
    /// data area's plaintext (as cryptsetup's old key decrypts it).
    fn luks2(&self, name: &str) -> Option<(PathBuf, Vec<u8>)> {
        let img = self.path(name);
        write_pattern(&img, 4 * MIB, 11);
        run_ok(
            cryptsetup()?
                .args(["luksFormat", "--type", "luks2", "--sector-size", "512"])
                .args([
                    "--luks2-keyslots-size",
                    "1M",
                    "--luks2-metadata-size",
                    "16k",
                ])
                .args(FAST)
                .arg("--key-file")
                .arg(&self.key)
                .arg(&img),
            b"",
        );
        let other = self.path("other-key");
        std::fs::write(&other, b"other").unwrap();
        run_ok(
            cryptsetup()?
                .arg("luksAddKey")
                // Another KDF than keyslot 0's, so carrying each keyslot's KDF shows.
                .args(["--pbkdf", "argon2id", "--pbkdf-force-iterations", "4"])
                .args(["--pbkdf-memory", "32"])
                .arg("--key-file")
                .arg(&self.key)
                .arg(&img)
                .arg(&other),
            b"",
        );
        let plain = self.plaintext(&img)?;
        Some((img, plain))
    }

    /// The data area's plaintext, decrypted by the independent model with the volume key
    /// and segment parameters cryptsetup reports (so cryptsetup must accept the header).
    fn plaintext(&self, img: &Path) -> Option<Vec<u8>> {
        run_ok(
            cryptsetup()?
                .args(["open", "--test-passphrase", "--key-file"])
                .arg(&self.key)
                .arg(img),
            b"",
        );
        Some(plaintext_by_cryptsetup(img, &self.key).1)
    }

    fn cryptblk_reencrypt(&self, img: &Path, args: &[&str]) -> std::process::Output {
        run(
            cryptblk()
                .args(["reencrypt", "-q", "--key-file"])
                .arg(&self.key)
                .args(args)
                .arg(img),
            b"",
        )
    }
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Re-key with checksum (default), journal with a cipher change, and none with a sector
/// size change: cryptsetup accepts each result and the new key (not the old one) decrypts
/// the original plaintext; the keyslot whose passphrase was not given is gone, as
/// cryptsetup drops it.
#[test]
fn rekeyed_volumes_are_accepted_by_cryptsetup_and_decrypt_independently() {
    let lab = Lab::new(PASS);
    let cases: &[&[&str]] = &[
        &["--key-slot", "0", "--hotzone-size", "256k"],
        &[
            "--key-slot",
            "0",
            "--resilience",
            "journal",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key-size",
            "256",
        ],
        &[
            "--key-slot",
            "0",
            "--resilience",
            "none",
            "--sector-size",
            "4096",
            "--force-offline-reencrypt",
        ],
    ];
    for (i, args) in cases.iter().enumerate() {
        let Some((img, plain)) = lab.luks2(&format!("v{i}.img")) else {
            return;
        };
        let old = cryptsetup_volume_key(&img, &lab.key, &[]).unwrap();
        let out = lab.cryptblk_reencrypt(&img, &[&["--json"], *args].concat());
        ok(&out, &format!("cryptblk reencrypt {args:?}"));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["status"], "finished");
        assert_eq!(summary["bytes"], 2 * MIB as u64);
        let new = cryptsetup_volume_key(&img, &lab.key, &[]).unwrap();
        assert_ne!(old, new, "{args:?}: the volume key did not change");
        assert!(
            lab.plaintext(&img).unwrap() == plain,
            "{args:?}: plaintext differs after the re-key"
        );
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
        assert!(!dump.contains("reencrypt"), "{args:?}: leftovers:\n{dump}");
        assert_eq!(
            dump.matches(": luks2").count(),
            1,
            "{args:?}: one keyslot expected:\n{dump}"
        );
    }
}

/// `--init-only` by cryptblk, `--resume-only` by cryptsetup: cryptsetup verifies the
/// reencryption digest cryptblk wrote (it refuses the metadata otherwise) and finishes.
#[test]
fn cryptblk_init_only_is_finished_by_cryptsetup() {
    let lab = Lab::new(PASS);
    let Some((img, plain)) = lab.luks2("init.img") else {
        return;
    };
    ok(
        &lab.cryptblk_reencrypt(&img, &["--key-slot", "0", "--init-only"]),
        "init-only",
    );
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    assert!(dump.contains("online-reencrypt-v2"), "{dump}");
    let out = run(
        cryptsetup()
            .unwrap()
            .args(["reencrypt", "--resume-only", "--force-offline-reencrypt"])
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    ok(&out, "cryptsetup reencrypt --resume-only");
    assert!(lab.plaintext(&img).unwrap() == plain);
    // And a second init-only is refused as cryptsetup refuses it.
    ok(
        &lab.cryptblk_reencrypt(&img, &["--init-only"]),
        "a new init-only on the finished volume",
    );
    let cb = lab.cryptblk_reencrypt(&img, &["--init-only"]);
    assert_eq!(cb.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&cb.stderr)
        .contains("LUKS2 reencryption already initialized. Aborting operation."));
}

/// cryptblk killed at a sample of its writes (every third pwrite64), finished by
/// cryptsetup: the plaintext survives every cut.
#[test]
fn cryptblk_killed_at_its_writes_is_finished_by_cryptsetup() {
    let lab = Lab::new(PASS);
    let Some((base, plain)) = lab.luks2("base.img") else {
        return;
    };
    let Some(_) = tool("strace") else { return };
    let mut killed = 0;
    for n in (1..=40).step_by(3) {
        let img = lab.path("cut.img");
        std::fs::copy(&base, &img).unwrap();
        let inject = format!("inject=pwrite64:signal=KILL:when={n}");
        let out = run(
            tool("strace")
                .unwrap()
                .args([
                    "-f",
                    "-o",
                    "/dev/null",
                    "-e",
                    "trace=pwrite64",
                    "-e",
                    &inject,
                ])
                .arg(env!("CARGO_BIN_EXE_cryptblk"))
                .args([
                    "reencrypt",
                    "-q",
                    "--key-slot",
                    "0",
                    "--hotzone-size",
                    "512k",
                ])
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
        if out.status.success() {
            // Fewer writes than n: the run finished.
            break;
        }
        killed += 1;
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
        if dump.contains("online-reencrypt") {
            let resume = || {
                run(
                    cryptsetup()
                        .unwrap()
                        .args(["reencrypt", "--resume-only", "--force-offline-reencrypt"])
                        .arg("--key-file")
                        .arg(&lab.key)
                        .arg(&img),
                    b"",
                )
            };
            if !resume().status.success() {
                ok(
                    &run(
                        cryptsetup()
                            .unwrap()
                            .args(["repair", "--key-file"])
                            .arg(&lab.key)
                            .arg(&img),
                        b"",
                    ),
                    "cryptsetup repair",
                );
                let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
                if dump.contains("online-reencrypt") {
                    ok(&resume(), "cryptsetup resume after repair");
                }
            }
        }
        assert!(
            lab.plaintext(&img).unwrap() == plain,
            "cryptblk killed at pwrite {n}: plaintext lost"
        );
    }
    assert!(killed >= 8, "only {killed} kills");
}

/// cryptsetup killed at a sample of its writes (checksum and journal), finished by
/// `cryptblk reencrypt --resume-only`: cryptsetup accepts the header and the new key
/// decrypts the original plaintext independently.
#[test]
fn cryptsetup_killed_at_its_writes_is_finished_by_cryptblk() {
    let lab = Lab::new(PASS);
    let Some((base, plain)) = lab.luks2("base.img") else {
        return;
    };
    let Some(_) = tool("strace") else { return };
    let mut resumed = 0;
    for resilience in ["checksum", "journal"] {
        for n in (5..=95).step_by(6) {
            let img = lab.path("cut.img");
            std::fs::copy(&base, &img).unwrap();
            let inject = format!("inject=write:signal=KILL:when={n}");
            run(
                tool("strace")
                    .unwrap()
                    .args(["-o", "/dev/null", "-e", "trace=write", "-e", &inject])
                    .args(["cryptsetup", "--batch-mode", "reencrypt"])
                    .args(["--force-offline-reencrypt", "--key-slot", "0"])
                    .args(["--hotzone-size", "512k", "--resilience", resilience])
                    .arg("--key-file")
                    .arg(&lab.key)
                    .arg(&img),
                b"",
            );
            let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
            if !dump.contains("online-reencrypt") {
                continue;
            }
            let out = lab.cryptblk_reencrypt(&img, &["--resume-only"]);
            ok(
                &out,
                &format!("{resilience}: cryptblk resume after cut {n}"),
            );
            resumed += 1;
            assert!(
                lab.plaintext(&img).unwrap() == plain,
                "{resilience}: cryptsetup killed at write {n}: plaintext lost"
            );
        }
    }
    assert!(resumed >= 20, "only {resumed} states resumed");
}

/// Refusals as cryptsetup's: --resume-only without a reencryption, a key file with two
/// active keyslots and no --key-slot (same exit code as cryptsetup, same message), and a
/// volume some process holds (exit 5, cryptsetup's busy message).
#[test]
fn refusals_carry_cryptsetups_messages_and_codes() {
    let lab = Lab::new(PASS);
    let Some((img, _)) = lab.luks2("r.img") else {
        return;
    };
    let cases: &[(&[&str], &str)] = &[
        (&["--resume-only"], "Device reencryption not in progress."),
        (
            &[],
            "Key file can be used only with --key-slot or with exactly one key slot active.",
        ),
    ];
    for (args, msg) in cases {
        let cs = run(
            cryptsetup()
                .unwrap()
                .args(["reencrypt", "--force-offline-reencrypt", "--key-file"])
                .arg(&lab.key)
                .args(*args)
                .arg(&img),
            b"",
        );
        let cb = lab.cryptblk_reencrypt(&img, args);
        assert_eq!(cb.status.code(), cs.status.code(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&cs.stderr).contains(msg)
                && String::from_utf8_lossy(&cb.stderr).contains(msg),
            "{args:?}: cryptsetup: {} cryptblk: {}",
            String::from_utf8_lossy(&cs.stderr),
            String::from_utf8_lossy(&cb.stderr)
        );
    }
    let _held = cryptblk_volume::lock::DataLock::take(&img, true).unwrap();
    let cb = lab.cryptblk_reencrypt(&img, &["--key-slot", "0"]);
    assert_eq!(cb.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&cb.stderr).contains("is in use"));
}

/// The keyslots of a dump without salts and digests: what a re-key must reproduce.
fn keyslot_shape(img: &Path) -> serde_json::Value {
    let out = run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img),
        b"",
    );
    let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for ks in v["keyslots"].as_object_mut().unwrap().values_mut() {
        ks["kdf"].as_object_mut().unwrap().remove("salt");
    }
    for d in v["digests"].as_object_mut().unwrap().values_mut() {
        let o = d.as_object_mut().unwrap();
        o.remove("salt");
        o.remove("digest");
    }
    serde_json::json!({"keyslots": v["keyslots"], "digests": v["digests"], "config": v["config"]})
}

/// Without --key-slot every keyslot is carried over (one passphrase per keyslot on standard
/// input, as cryptsetup asks for them), each with its old KDF: the keyslots and digests
/// equal those cryptsetup makes from the same image, and both passphrases open the result.
#[test]
fn every_keyslot_is_carried_over_with_its_kdf_as_cryptsetup_does() {
    let lab = Lab::new(PASS);
    let Some((img, plain)) = lab.luks2("all.img") else {
        return;
    };
    let theirs = lab.path("theirs.img");
    std::fs::copy(&img, &theirs).unwrap();
    let stdin = b"rekey-pass\nother\n";
    ok(
        &run(
            cryptblk()
                .args(["reencrypt", "-q", "--hotzone-size", "1M"])
                .arg(&img),
            stdin,
        ),
        "cryptblk reencrypt",
    );
    ok(
        &run(
            cryptsetup()
                .unwrap()
                .args(["reencrypt", "--force-offline-reencrypt"])
                .arg(&theirs),
            stdin,
        ),
        "cryptsetup reencrypt",
    );
    assert_eq!(keyslot_shape(&img), keyslot_shape(&theirs));
    assert!(lab.plaintext(&img).unwrap() == plain);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "--key-file", "-"])
            .arg(&img),
        b"other",
    );
}
