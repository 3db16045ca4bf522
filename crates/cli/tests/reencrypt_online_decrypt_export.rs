//! Online `reencrypt --decrypt --header NEW_FILE DEVICE` of a served volume whose LUKS2
//! header is on DEVICE, as cryptsetup 2.6.1 runs it on an active device: the header is
//! exported to NEW_FILE, the first data-offset bytes of ciphertext are moved to the
//! device start while the volume's I/O is held, and the data is decrypted forward
//! (`datashift-checksum`, `online-reencrypt-v3`) while it is served from NEW_FILE.
//! Checked against cryptsetup and the independent dm-crypt model (pyca/cryptography):
//!
//! - fio writes and verifies (crc32c) over NBD through the run; `close` at about 40%
//!   leaves a state cryptsetup finishes (on a copy) with exactly what the export served at
//!   the close at the device start; cryptblk's `open --header NEW_FILE` serves it
//!   mid-reencryption (fio again) and `--resume-only --active-name` finishes it online
//!   under fio, the device then starting with what the export served;
//! - the daemon SIGKILLed at about 30% and 70%: cryptblk's `open --header NEW_FILE` serves
//!   a copy's data, and `cryptsetup reencrypt --resume-only` (after `repair` where it
//!   asks) finishes it with the plaintext (the model's, which the volume was made from)
//!   at the device start.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: usize = 1 << 20;
/// The data offset (`--offset`, with a 16 KiB metadata and a 160 KiB keyslots area for
/// one 256-bit key): the data moves back by it, and it is a step's length (a data shift's
/// hotzone is the shift), so a small one makes many steps.
const OFFSET: usize = 192 << 10;
/// Bytes of data after the header: 512 steps (fewer end before a test can close or kill
/// the run midway on a loaded machine).
const DATA: usize = 96 * MIB;
/// fio writes the first 4 MiB; the rest keeps the pattern.
const FIO_BYTES: usize = 4 << 20;

/// A data device with its LUKS2 header on it, and the header file it is exported to.
struct Attached {
    img: PathBuf,
    hdr: PathBuf,
}

impl Attached {
    fn hdr_arg(&self) -> &str {
        self.hdr.to_str().unwrap()
    }

    /// A copy of the device (and of the exported header when there is one) named after
    /// `tag`.
    fn copy(&self, lab: &KeyLab, tag: &str) -> Attached {
        let c = Attached {
            img: lab.path(&format!("{tag}.img")),
            hdr: lab.path(&format!("{tag}.hdr")),
        };
        std::fs::copy(&self.img, &c.img).unwrap();
        let _ = std::fs::remove_file(&c.hdr);
        if self.hdr.exists() {
            std::fs::copy(&self.hdr, &c.hdr).unwrap();
        }
        c
    }

    /// `cryptblk reencrypt --decrypt --header NEW_FILE IMG` (the header not there yet).
    fn decrypt_cmd(&self, lab: &KeyLab) -> Command {
        let mut c = lab.reencrypt(&["--decrypt", "--header"]);
        c.arg(&self.hdr).arg(&self.img);
        c
    }

    /// Finishes the decryption with `cryptsetup reencrypt --resume-only` (offline), after
    /// `cryptsetup repair` where the resume asks for it.
    fn finish_by_cryptsetup(&self, lab: &KeyLab) {
        finish_by_cryptsetup(&lab.key, Some(&self.hdr), &self.img);
    }

    /// The first `DATA` bytes of the device (where a finished decryption's plaintext is).
    fn device_start(&self) -> Vec<u8> {
        let mut d = std::fs::read(&self.img).unwrap();
        d.truncate(DATA);
        d
    }

    /// Served over NBD on `sock` as `name` mid-reencryption (`open --header NEW_FILE`).
    fn open_exported(&self, lab: &KeyLab, name: &str, sock: &Path) -> Served {
        open_nbd(
            &self.img,
            &lab.key,
            name,
            sock,
            &["--header", self.hdr_arg()],
        )
    }
}

/// An attached LUKS2 volume by cryptsetup (aes-xts-plain64 with a 256-bit key,
/// 4096-byte sectors, data offset 192 KiB, a known volume key) whose data is a random pattern encrypted by the
/// independent model; returns it and the pattern.
fn attached_volume(lab: &KeyLab) -> (Attached, Vec<u8>) {
    let v = Attached {
        img: lab.path("vol.img"),
        hdr: lab.path("vol.hdr"),
    };
    let plain = write_pattern(&lab.path("pattern"), DATA, 17);
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(41).wrapping_add(7))
        .collect();
    let vk = write_file(lab.dir.path(), "vk", &key);
    std::fs::write(&v.img, vec![0u8; OFFSET + DATA]).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(["--sector-size", "4096", "--volume-key-file"])
            .arg(&vk)
            .args(["--luks2-metadata-size", "16k"])
            .args(["--key-size", "256", "--luks2-keyslots-size", "160k"])
            .args(["--offset", &(OFFSET / 512).to_string()])
            .args(FAST)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&v.img),
        b"",
    );
    assert_eq!(
        cryptsetup_luks2_segment(&v.img).map(|s| s.0),
        Some(OFFSET),
        "cryptsetup chose another data offset"
    );
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let ct = independent("encrypt", "aes-xts-plain64", &hex, 4096, &plain);
    let mut data = std::fs::read(&v.img).unwrap();
    data[OFFSET..].copy_from_slice(&ct);
    std::fs::write(&v.img, data).unwrap();
    (v, plain)
}

/// The exported header is cryptsetup's forward data-shift decryption.
fn assert_cryptsetups_metadata(hdr: &Path) {
    let js = json_of(hdr).expect("cryptsetup reads the exported header");
    assert_eq!(
        js["config"]["requirements"]["mandatory"],
        serde_json::json!(["online-reencrypt-v3"]),
        "{js}"
    );
    let ks = js["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .cloned()
        .unwrap();
    assert_eq!(ks["mode"], "decrypt", "{ks}");
    assert_eq!(ks["direction"], "forward", "{ks}");
    assert_eq!(ks["area"]["type"], "datashift-checksum", "{ks}");
    assert_eq!(ks["area"]["shift_size"], OFFSET.to_string(), "{ks}");
    let moved =
        js["segments"].as_object().unwrap().values().any(|s| {
            s["flags"] == serde_json::json!(["backup-moved-segment"]) && s["offset"] == "0"
        });
    assert!(moved, "no moved segment at the device start: {js}");
}

#[test]
fn attached_decrypt_online_under_fio_close_resume_reopen() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"export decrypt pass");
    let name = "t-reenc-exp-dec";
    let (v, pattern) = attached_volume(&lab);
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&v.img, &lab.key, name, &sock, &[]);
    assert!(lab.read_export(&sock, "before.bin") == pattern);
    let at_close = close_midway(&lab, &v.hdr, name, &sock, v.decrypt_cmd(&lab));
    drop(served);
    assert!(at_close[FIO_BYTES..] == pattern[FIO_BYTES..]);
    assert_cryptsetups_metadata(&v.hdr);
    let out = run(cryptsetup().unwrap().arg("isLuks").arg(&v.img), b"");
    assert!(
        !out.status.success(),
        "the LUKS2 signature is left on the device"
    );
    // cryptsetup finishes a copy: the plaintext served at the close starts the device.
    let copy = v.copy(&lab, "cs");
    copy.finish_by_cryptsetup(&lab);
    assert!(
        copy.device_start() == at_close,
        "cryptsetup's resume of the closed decryption lost data"
    );
    // cryptblk serves it mid-reencryption from the exported header and finishes online.
    let served = v.open_exported(&lab, name, &sock);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    assert!(lab.read_export(&sock, "reopen.bin") == at_close);
    fio_once(lab.dir.path(), &sock, "on the volume opened mid-decryption");
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the resumed decryption");
    let mut re = spawn_captured(&mut lab.reencrypt(&[
        "--resume-only",
        "--header",
        v.hdr_arg(),
        "--active-name",
        name,
    ]));
    watch(name, &mut re, |_| false);
    let out = re.wait_with_output().unwrap();
    let runs = fio.finish();
    assert!(
        out.status.success(),
        "online resume failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "finished", "{st}");
    fio_once(lab.dir.path(), &sock, "after the resumed decryption");
    let after = lab.read_export(&sock, "after.bin");
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    drop(served);
    eprintln!("resumed online under {runs} fio runs");
    assert!(
        v.device_start() == after,
        "the device does not start with the plaintext the export served"
    );
    let js = json_of(&v.hdr).expect("cryptsetup refuses the finished header");
    assert!(js["config"]["requirements"].is_null(), "{js}");
    assert_eq!(js["segments"]["0"]["type"], "linear", "{js}");
    assert_eq!(js["segments"]["0"]["offset"], "0", "{js}");
}

/// The whole decryption in one online run: the data reads back unchanged mid-run, then
/// fio writes and verifies to the end; `status` names the exported header while it runs,
/// and the device ends up starting with what the export served.
#[test]
fn attached_decrypt_online_whole_run_under_fio() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"export whole pass");
    let name = "t-reenc-exp-whole";
    let (v, pattern) = attached_volume(&lab);
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&v.img, &lab.key, name, &sock, &[]);
    let mut re = spawn_captured(&mut v.decrypt_cmd(&lab));
    // Untouched by fio, all of the data reads back while the run goes on (the first
    // data-offset bytes from their moved copy, the rest from either side).
    let mut header_seen = false;
    let seen = watch(name, &mut re, |f| {
        header_seen |= status(name)["info"]["header"].as_str() == Some(v.hdr_arg());
        f >= 0.1 && header_seen
    });
    assert!(!seen.is_empty(), "status never showed the run");
    assert!(header_seen, "status never named the exported header");
    assert!(
        lab.read_export(&sock, "during.bin") == pattern,
        "the volume serves other data mid-decryption"
    );
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the decryption");
    watch(name, &mut re, |_| false);
    let out = re.wait_with_output().unwrap();
    let runs = fio.finish();
    assert!(
        out.status.success(),
        "online decryption failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "finished", "{st}");
    fio_once(lab.dir.path(), &sock, "after the decryption");
    let after = lab.read_export(&sock, "after.bin");
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    drop(served);
    eprintln!("decrypted online under {runs} fio runs");
    assert!(
        v.device_start() == after,
        "the device does not start with the plaintext the export served"
    );
    let js = json_of(&v.hdr).expect("cryptsetup refuses the finished header");
    assert!(js["config"]["requirements"].is_null(), "{js}");
}

/// The daemon SIGKILLed at 30% and 70% of the online decryption: cryptblk's `open
/// --header NEW_FILE` serves a copy's data (recovering a cut hotzone first), and
/// `cryptsetup reencrypt --resume-only` (after `repair` where it asks) finishes each with
/// the model's plaintext at the device start.
#[test]
fn killed_attached_decryptions_are_finished_by_cryptsetup() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"export kill pass");
    let name = "t-reenc-exp-kill";
    let (base, pattern) = attached_volume(&lab);
    let mut recovered = 0;
    for at in [0.3, 0.7] {
        let v = base.copy(&lab, "cut");
        let sock = lab.path("nbd.sock");
        let served = open_nbd(&v.img, &lab.key, name, &sock, &[]);
        kill_served_run(name, served, &sock, &mut v.decrypt_cmd(&lab), at, &v.hdr);
        let c = v.copy(&lab, "cb");
        if json_of(&c.hdr)
            .unwrap()
            .to_string()
            .contains("in-reencryption")
        {
            recovered += 1;
        }
        let s = c.open_exported(&lab, name, &sock);
        assert!(
            lab.read_export(&sock, "cut.bin") == pattern,
            "killed at {at}: cryptblk serves other data"
        );
        drop(s);
        v.finish_by_cryptsetup(&lab);
        assert!(
            v.device_start() == pattern,
            "killed at {at}, finished by cryptsetup: data lost"
        );
    }
    eprintln!("2 killed runs served by cryptblk ({recovered} with a cut hotzone) and finished by cryptsetup");
}

/// Refusals leave the served volume and its device as they were: a wrong passphrase (exit
/// 2) and `--init-only` (exit 1) create no header file and keep the LUKS2 header on the
/// device; the export still serves the model's plaintext.
#[test]
fn refused_online_exports_change_nothing() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"export refuse pass");
    let name = "t-reenc-exp-refuse";
    let (v, pattern) = attached_volume(&lab);
    let before = std::fs::read(&v.img).unwrap();
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&v.img, &lab.key, name, &sock, &[]);
    let wrong = write_file(lab.dir.path(), "wrong", b"not the passphrase");
    let mut cmd = cryptblk();
    cmd.args(["reencrypt", "-q", "--decrypt", "--key-file"])
        .arg(&wrong)
        .arg("--header")
        .arg(&v.hdr)
        .arg(&v.img);
    assert_eq!(code(&mut cmd).0, 2, "wrong passphrase");
    let mut cmd = v.decrypt_cmd(&lab);
    cmd.arg("--init-only");
    assert_eq!(code(&mut cmd).0, 1, "--init-only");
    assert!(!v.hdr.exists(), "a refused export left {}", v.hdr.display());
    assert!(lab.read_export(&sock, "served.bin") == pattern);
    drop(served);
    assert!(
        std::fs::read(&v.img).unwrap() == before,
        "a refused export changed the device"
    );
}
