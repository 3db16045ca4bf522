//! `reencrypt --decrypt --header NEW_FILE DEVICE` of a volume whose LUKS2 header is on
//! DEVICE, against cryptsetup 2.6.1 (which exports the header to NEW_FILE, copies the
//! first data-offset bytes of ciphertext to the device start and decrypts forward with
//! `datashift-checksum` resilience under the `online-reencrypt-v3` requirement, the moved
//! first segment last):
//!
//! - cryptblk's `--init-only` metadata is cryptsetup's (salts and digests aside);
//! - cryptsetup runs killed at a write are read by `cryptblk decrypt` and finished by
//!   `cryptblk reencrypt --resume-only`: the device then starts with the plaintext;
//! - cryptblk runs killed at a write are finished by cryptsetup (after `repair` where it
//!   asks), the plaintext intact.
//!
//! The default tests cut a sample of the writes; `every_cut_both_ways` (ignored, about
//! 15 minutes on a loaded 2-CPU machine: `cargo test -p cryptblk --test
//! reencrypt_decrypt_attached -- --ignored`)
//! cuts every one.

mod common;
use common::reenc::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"attached-pass";
const MIB: usize = 1 << 20;
/// The data offset cryptsetup picks for a 16 KiB metadata and 1 MiB keyslots area.
const OFFSET: usize = 2 * MIB;
/// 8 MiB of data: three 2 MiB moving steps, then the moved first segment in place.
const DATA: usize = 8 * MIB;

/// An attached LUKS2 volume (aes-xts-plain64, 4096-byte sectors, data offset 2 MiB) whose
/// data is `plain`, encrypted by the independent model under a known volume key.
fn attached_volume(lab: &Lab, plain: &[u8]) -> PathBuf {
    let img = lab.path("base.img");
    let vk = lab.path("vk");
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(29).wrapping_add(3))
        .collect();
    std::fs::write(&vk, &key).unwrap();
    std::fs::write(&img, vec![0u8; OFFSET + plain.len()]).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(["--sector-size", "4096", "--volume-key-file"])
            .arg(&vk)
            .args([
                "--luks2-metadata-size",
                "16k",
                "--luks2-keyslots-size",
                "1M",
            ])
            .args(FAST)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    assert_eq!(
        cryptsetup_luks2_segment(&img).map(|s| s.0),
        Some(OFFSET),
        "cryptsetup chose another data offset"
    );
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let ct = independent("encrypt", "aes-xts-plain64", &hex, 4096, plain);
    let mut data = std::fs::read(&img).unwrap();
    data[OFFSET..].copy_from_slice(&ct);
    std::fs::write(&img, data).unwrap();
    img
}

type Lab = KeyLab;

/// The copies a run works on.
struct Run {
    img: PathBuf,
    hdr: PathBuf,
}

impl Run {
    fn new(lab: &Lab, base: &Path) -> Run {
        let (img, hdr) = (lab.path("dec.img"), lab.path("dec.hdr"));
        let _ = std::fs::remove_file(&hdr);
        std::fs::copy(base, &img).unwrap();
        Run { img, hdr }
    }

    fn cryptsetup_cmd(&self, lab: &Lab) -> Vec<String> {
        [
            "cryptsetup",
            "--batch-mode",
            "reencrypt",
            "--decrypt",
            "--force-offline-reencrypt",
            "--header",
            self.hdr.to_str().unwrap(),
            "--key-file",
            lab.key.to_str().unwrap(),
            self.img.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    }

    fn cryptblk_cmd(&self, lab: &Lab) -> Vec<String> {
        [
            env!("CARGO_BIN_EXE_cryptblk"),
            "reencrypt",
            "-q",
            "--decrypt",
            "--header",
            self.hdr.to_str().unwrap(),
            "--key-file",
            lab.key.to_str().unwrap(),
            self.img.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// True when the device still starts with a LUKS2 header (the export was cut before
    /// the signatures were wiped).
    fn device_is_luks(&self) -> bool {
        std::fs::read(&self.img).unwrap()[..6] == *b"LUKS\xba\xbe"
    }

    /// The header file, when it is a whole LUKS2 header cryptsetup reads.
    fn header_json(&self) -> Option<Value> {
        self.hdr.exists().then(|| json_of(&self.hdr)).flatten()
    }

    /// The data as the finished header places it: cryptsetup reads the header, which has
    /// no requirement left and one linear segment; returns the `DATA` bytes there.
    fn final_plaintext(&self) -> Vec<u8> {
        let j = self
            .header_json()
            .expect("cryptsetup reads the final header");
        assert!(
            j["config"]["requirements"].is_null(),
            "still in progress: {j}"
        );
        let seg = &j["segments"]["0"];
        assert_eq!(seg["type"], "linear", "{j}");
        let off: usize = seg["offset"].as_str().unwrap().parse().unwrap();
        std::fs::read(&self.img).unwrap()[off..off + DATA].to_vec()
    }

    /// Starts over from a cut that recorded no reencryption: the header file is then
    /// missing, partial, or the original header (the data from the offset on untouched).
    fn restart_args(&self) -> Vec<&'static str> {
        if self.device_is_luks() {
            // Cut while exporting: the device is whole; the file is not needed.
            let _ = std::fs::remove_file(&self.hdr);
        }
        vec![]
    }
}

fn str_args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// cryptsetup's run killed at its `n`th write; cryptblk reads the state (when a
/// reencryption was recorded) and finishes it. Returns true when the state was mid-run.
fn cryptsetup_cut_finished_by_cryptblk(lab: &Lab, base: &Path, plain: &[u8], n: usize) -> bool {
    let r = Run::new(lab, base);
    let cmd = r.cryptsetup_cmd(lab);
    killed(&os(&str_args(&cmd)), "write", n, lab.dir.path());
    let mid = r.header_json().is_some() && in_progress(&r.hdr);
    if mid {
        let out = lab.path("out");
        run_ok(
            cryptblk()
                .args(["decrypt", "--header"])
                .arg(&r.hdr)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&r.img)
                .arg(&out),
            b"",
        );
        assert!(
            std::fs::read(&out).unwrap() == plain,
            "cryptsetup cut at write {n}: cryptblk reads the interrupted decryption wrong"
        );
        run_ok(
            cryptblk()
                .args(["reencrypt", "-q", "--resume-only", "--header"])
                .arg(&r.hdr)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&r.img),
            b"",
        );
    } else if r
        .header_json()
        .is_none_or(|j| j["segments"]["0"]["type"] != "linear")
    {
        r.restart_args();
        run_ok(
            cryptblk()
                .args(["reencrypt", "-q", "--decrypt", "--header"])
                .arg(&r.hdr)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&r.img),
            b"",
        );
    }
    assert!(
        r.final_plaintext() == plain,
        "cryptsetup cut at write {n}, finished by cryptblk: plaintext lost"
    );
    mid
}

/// cryptblk's run killed at its `n`th pwrite64; cryptsetup finishes it (after `repair`
/// when its resume refuses). Returns true when the state was mid-run.
fn cryptblk_cut_finished_by_cryptsetup(lab: &Lab, base: &Path, plain: &[u8], n: usize) -> bool {
    let r = Run::new(lab, base);
    let cmd = r.cryptblk_cmd(lab);
    killed(&os(&str_args(&cmd)), "pwrite64", n, lab.dir.path());
    let mid = r.header_json().is_some() && in_progress(&r.hdr);
    let cs = |args: &[&str]| {
        run(
            cryptsetup()
                .unwrap()
                .args(args)
                .arg("--header")
                .arg(&r.hdr)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&r.img),
            b"",
        )
    };
    let resume = [
        "reencrypt",
        "--batch-mode",
        "--resume-only",
        "--force-offline-reencrypt",
    ];
    if mid {
        if !cs(&resume).status.success() {
            let rep = cs(&["repair", "--batch-mode"]);
            assert!(rep.status.success(), "cut {n}: cryptsetup repair: {rep:?}");
            if in_progress(&r.hdr) {
                let out = cs(&resume);
                assert!(out.status.success(), "cut {n}: cryptsetup resume: {out:?}");
            }
        }
    } else if r
        .header_json()
        .is_none_or(|j| j["segments"]["0"]["type"] != "linear")
    {
        if !r.device_is_luks() && r.header_json().is_some() {
            // The export was whole and the signatures wiped: cryptsetup 2.6.1 decrypts a
            // detached header only with data offset 0, so the header goes back on the
            // device (over the partial copy; the data from the offset on is untouched).
            let out = run(
                cryptsetup()
                    .unwrap()
                    .args(["luksHeaderRestore", "--batch-mode", "--header-backup-file"])
                    .arg(&r.hdr)
                    .arg(&r.img),
                b"",
            );
            assert!(out.status.success(), "cut {n}: luksHeaderRestore: {out:?}");
        }
        r.restart_args();
        let out = cs(&[
            "reencrypt",
            "--batch-mode",
            "--decrypt",
            "--force-offline-reencrypt",
        ]);
        assert!(out.status.success(), "cut {n}: cryptsetup restart: {out:?}");
    }
    assert!(
        r.final_plaintext() == plain,
        "cryptblk cut at pwrite {n}, finished by cryptsetup: plaintext lost"
    );
    mid
}

/// Writes of a whole run of `cmd` (on fresh copies).
fn writes_of(lab: &Lab, base: &Path, cryptsetup_side: bool) -> usize {
    let r = Run::new(lab, base);
    let (cmd, call) = if cryptsetup_side {
        (r.cryptsetup_cmd(lab), "write")
    } else {
        (r.cryptblk_cmd(lab), "pwrite64")
    };
    count_writes(&os(&str_args(&cmd)), call, lab.dir.path())
}

fn setup() -> Option<(Lab, Vec<u8>, PathBuf)> {
    if cryptsetup().is_none() || tool("strace").is_none() {
        return None;
    }
    let lab = Lab::new(PASS);
    let plain = write_pattern(&lab.path("pattern"), DATA, 9);
    let base = attached_volume(&lab, &plain);
    Some((lab, plain, base))
}

/// Whole runs both ways: each tool's finished volume starts with the plaintext and its
/// header file has no keyslot left (cryptsetup's final state), and cryptblk's
/// `--init-only` header is cryptsetup's.
#[test]
fn attached_decryption_metadata_and_result_are_cryptsetups() {
    let Some((lab, plain, base)) = setup() else {
        return;
    };
    let mut init = Vec::new();
    for cryptsetup_side in [true, false] {
        let r = Run::new(&lab, &base);
        let mut cmd = if cryptsetup_side {
            r.cryptsetup_cmd(&lab)
        } else {
            r.cryptblk_cmd(&lab)
        };
        cmd.insert(3, "--init-only".into());
        let out = run(std::process::Command::new(&cmd[0]).args(&cmd[1..]), b"");
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        let j = json_of(&r.hdr).expect("cryptsetup reads the exported header");
        init.push(normalized(j));
        assert!(
            !r.device_is_luks(),
            "the LUKS2 signature is left on the device"
        );
        // The first data-offset bytes of ciphertext now start the device.
        let data = std::fs::read(&r.img).unwrap();
        assert!(data[..OFFSET] == data[OFFSET..2 * OFFSET]);
        let out = run(
            cryptblk()
                .args(["reencrypt", "-q", "--resume-only", "--header"])
                .arg(&r.hdr)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&r.img),
            b"",
        );
        assert!(out.status.success(), "{out:?}");
        assert!(r.final_plaintext() == plain, "plaintext lost");
        let j = r.header_json().unwrap();
        assert_eq!(j["keyslots"], serde_json::json!({}), "{j}");
        assert_eq!(j["segments"]["0"]["offset"], "0", "{j}");
        // The old ciphertext left after the plaintext is wiped (cryptsetup with random
        // bytes, cryptblk with zeros).
        let data = std::fs::read(&r.img).unwrap();
        let old = std::fs::read(&base).unwrap();
        assert!(data[DATA..] != old[DATA..], "tail not wiped");
    }
    assert_eq!(
        init[0], init[1],
        "cryptblk's --init-only metadata differs from cryptsetup's"
    );
    // A second export over an existing file is a detached decryption, not an export; an
    // export with a wrong passphrase leaves nothing behind.
    let r = Run::new(&lab, &base);
    let wrong = write_file(lab.dir.path(), "wrong", b"wrong");
    let out = run(
        cryptblk()
            .args(["reencrypt", "-q", "--decrypt", "--header"])
            .arg(&r.hdr)
            .arg("--key-file")
            .arg(&wrong)
            .arg(&r.img),
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!r.hdr.exists(), "an empty header file was left behind");
    assert!(std::fs::read(&r.img).unwrap() == std::fs::read(&base).unwrap());
}

/// The metadata with what is random in it blanked (salts, digests, calibrated iterations,
/// the UUID).
fn normalized(mut j: Value) -> Value {
    if let Some(ks) = j["keyslots"].as_object_mut() {
        for k in ks.values_mut() {
            if k["kdf"].is_object() {
                k["kdf"]["salt"] = Value::Null;
            }
        }
    }
    if let Some(d) = j["digests"].as_object_mut() {
        for v in d.values_mut() {
            v["salt"] = Value::Null;
            v["digest"] = Value::Null;
            v["iterations"] = Value::Null;
        }
    }
    j
}

/// cryptsetup killed at a sample of its writes, each finished by cryptblk; cryptblk
/// killed at a sample of its writes, each finished by cryptsetup.
#[test]
fn cut_runs_are_finished_by_the_other_tool() {
    let Some((lab, plain, base)) = setup() else {
        return;
    };
    for cryptsetup_side in [true, false] {
        let total = writes_of(&lab, &base, cryptsetup_side);
        assert!(total > 15, "only {total} writes");
        let (mut cuts, mut mid) = (0, 0);
        for n in kill_points(total, 5) {
            let was_mid = if cryptsetup_side {
                cryptsetup_cut_finished_by_cryptblk(&lab, &base, &plain, n)
            } else {
                cryptblk_cut_finished_by_cryptsetup(&lab, &base, &plain, n)
            };
            cuts += 1;
            mid += usize::from(was_mid);
        }
        eprintln!(
            "{} cut at {cuts} of {total} writes ({mid} mid-run), finished by the other: 0 bytes lost",
            if cryptsetup_side { "cryptsetup" } else { "cryptblk" }
        );
        assert!(mid >= 3, "only {mid} cuts left a reencryption in progress");
    }
}

/// Every write of both tools' runs cut (clean cuts) and finished by the other tool.
/// Long: run with `--ignored`.
#[test]
#[ignore]
fn every_cut_both_ways() {
    let Some((lab, plain, base)) = setup() else {
        return;
    };
    for cryptsetup_side in [true, false] {
        let total = writes_of(&lab, &base, cryptsetup_side);
        let mut mid = 0;
        for n in 1..=total {
            eprintln!(
                "{} cut at write {n} of {total}",
                if cryptsetup_side {
                    "cryptsetup"
                } else {
                    "cryptblk"
                }
            );
            mid += usize::from(if cryptsetup_side {
                cryptsetup_cut_finished_by_cryptblk(&lab, &base, &plain, n)
            } else {
                cryptblk_cut_finished_by_cryptsetup(&lab, &base, &plain, n)
            });
        }
        eprintln!(
            "{}: all {total} cuts finished by the other tool ({mid} mid-run), 0 bytes lost",
            if cryptsetup_side {
                "cryptsetup"
            } else {
                "cryptblk"
            }
        );
    }
}
