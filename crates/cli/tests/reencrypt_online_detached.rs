//! Online LUKS2 reencryption of volumes whose header is detached (`--header`), against
//! cryptsetup 2.6.1 and the independent dm-crypt model:
//!
//! - re-key: a served volume is re-keyed by its daemon while fio writes and verifies
//!   (crc32c) on its NBD export; `close` at about 40% leaves a state cryptsetup finishes
//!   (on a copy) with the data the export served, and cryptblk's `open` serves (both
//!   segments); `reencrypt --resume-only --active-name` finishes it online under fio;
//!   cryptsetup accepts the header and its volume key decrypts the data (independent
//!   model) to what the export served; fio again after a reopen;
//! - decryption (backward, as cryptsetup runs it): the same, ending with the plaintext the
//!   export served on the data device and a header cryptsetup reads as finished;
//! - the daemon SIGKILLed mid-run (re-key and decryption): cryptblk's `open --header`
//!   serves the data of a copy (a cut hotzone recovered first), and `cryptsetup reencrypt
//!   --resume-only` (after `repair` where it asks) finishes it with the data intact.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bytes of data (the whole data device: a detached header leaves data offset 0).
const DATA: usize = 32 << 20;
/// fio writes the first 4 MiB; the rest keeps the pattern.
const FIO_BYTES: usize = 4 << 20;

/// A detached header and its data device.
struct Detached {
    hdr: PathBuf,
    data: PathBuf,
}

impl Detached {
    fn hdr_arg(&self) -> &str {
        self.hdr.to_str().unwrap()
    }

    /// Served over NBD on `sock` as `name`.
    fn open(&self, lab: &KeyLab, name: &str, sock: &Path) -> Served {
        open_nbd(
            &self.data,
            &lab.key,
            name,
            sock,
            &["--header", self.hdr_arg()],
        )
    }

    /// A copy of both files named after `tag`.
    fn copy(&self, lab: &KeyLab, tag: &str) -> Detached {
        let c = Detached {
            hdr: lab.path(&format!("{tag}.hdr")),
            data: lab.path(&format!("{tag}.img")),
        };
        std::fs::copy(&self.hdr, &c.hdr).unwrap();
        std::fs::copy(&self.data, &c.data).unwrap();
        c
    }

    /// Finishes the reencryption with `cryptsetup reencrypt --resume-only` (offline),
    /// after `cryptsetup repair` where the resume asks for it.
    fn finish_by_cryptsetup(&self, lab: &KeyLab) {
        finish_by_cryptsetup(&lab.key, Some(&self.hdr), &self.data);
    }

    /// The data device decrypted by the independent model with the volume key, cipher and
    /// segment cryptsetup reports from the header (so cryptsetup must accept it as a
    /// finished LUKS2 header).
    fn independent_plaintext(&self, lab: &KeyLab) -> Vec<u8> {
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&self.hdr), b"");
        assert!(!dump.contains("reencrypt"), "leftovers:\n{dump}");
        let cipher = dump
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix("cipher:"))
            .unwrap()
            .trim()
            .to_string();
        let vk = cryptsetup_volume_key(&self.hdr, &lab.key, &[]).unwrap();
        let (offset, sector) = cryptsetup_luks2_segment(&self.hdr).unwrap();
        let data = std::fs::read(&self.data).unwrap();
        independent("decrypt", &cipher, &vk, sector, &data[offset..])
    }
}

/// A 32 MiB data device with a detached LUKS2 header by cryptsetup, holding a random
/// pattern written through cryptblk's export; returns it and that plaintext.
fn detached_volume(lab: &KeyLab, served: &str) -> (Detached, Vec<u8>) {
    let v = Detached {
        hdr: lab.path("vol.hdr"),
        data: lab.path("vol.img"),
    };
    sparse_file(&v.data, DATA as u64);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(FAST)
            .arg("--header")
            .arg(&v.hdr)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&v.data),
        b"",
    );
    let sock = lab.path("fill.sock");
    let plain = lab.path("fill.bin");
    let pattern = write_pattern(&plain, DATA, 11);
    let s = v.open(lab, served, &sock);
    run_ok(Command::new("nbdcopy").arg(&plain).arg(nbd_uri(&sock)), b"");
    drop(s);
    std::fs::remove_file(&plain).unwrap();
    (v, pattern)
}

/// Opens `v` mid-reencryption (both segments served), runs fio on it, then resumes the
/// reencryption online by `--active-name` under fio to its end; returns what the export
/// serves afterwards (the volume stays open).
fn reopen_and_resume(lab: &KeyLab, v: &Detached, name: &str, sock: &Path) -> (Served, Vec<u8>) {
    let served = v.open(lab, name, sock);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    assert!(st["reencryption"]["done"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["table"].as_str().unwrap().lines().count(), 2, "{st}");
    fio_once(
        lab.dir.path(),
        sock,
        "on the volume opened mid-reencryption",
    );
    let fio = FioLoop::start(lab.dir.path(), sock, "during the resumed reencryption");
    let mut re = spawn_captured(&mut lab.reencrypt(&[
        "--resume-only",
        "--hotzone-size",
        "1M",
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
    assert_eq!(st["table"].as_str().unwrap().lines().count(), 1, "{st}");
    fio_once(lab.dir.path(), sock, "after the resumed reencryption");
    eprintln!("resumed online under {runs} fio runs");
    (served, lab.read_export(sock, "after.bin"))
}

#[test]
fn detached_rekey_online_under_fio_close_resume_reopen() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"detached rekey pass");
    let name = "t-reenc-det-rekey";
    let (v, pattern) = detached_volume(&lab, name);
    let old_key = cryptsetup_volume_key(&v.hdr, &lab.key, &[]).unwrap();
    let sock = lab.path("nbd.sock");
    let served = v.open(&lab, name, &sock);
    let mut cmd = lab.reencrypt(&["--hotzone-size", "64k", "--header", v.hdr_arg()]);
    cmd.arg(&v.data);
    let at_close = close_midway(&lab, &v.hdr, name, &sock, cmd);
    drop(served);
    assert!(at_close[FIO_BYTES..] == pattern[FIO_BYTES..]);
    // cryptsetup finishes a copy of the closed volume with the data intact.
    let copy = v.copy(&lab, "cs");
    copy.finish_by_cryptsetup(&lab);
    assert!(
        copy.independent_plaintext(&lab) == at_close,
        "cryptsetup's resume of the closed volume lost data"
    );
    // cryptblk serves it mid-reencryption and finishes it online.
    let (served, after) = reopen_and_resume(&lab, &v, name, &sock);
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    drop(served);
    assert!(
        v.independent_plaintext(&lab) == after,
        "the new key does not decrypt what the export served"
    );
    let new_key = cryptsetup_volume_key(&v.hdr, &lab.key, &[]).unwrap();
    assert_ne!(old_key, new_key, "the volume key did not change");
    // Reopened: fio again.
    let _again = v.open(&lab, name, &sock);
    fio_once(lab.dir.path(), &sock, "after a reopen");
}

#[test]
fn detached_decrypt_online_under_fio_close_resume() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"detached decrypt pass");
    let name = "t-reenc-det-dec";
    let (v, pattern) = detached_volume(&lab, name);
    let sock = lab.path("nbd.sock");
    let served = v.open(&lab, name, &sock);
    // cryptsetup's form: --decrypt --header H --active-name NAME.
    let at_close = close_midway(
        &lab,
        &v.hdr,
        name,
        &sock,
        lab.reencrypt(&[
            "--decrypt",
            "--hotzone-size",
            "64k",
            "--header",
            v.hdr_arg(),
            "--active-name",
            name,
        ]),
    );
    drop(served);
    assert!(at_close[FIO_BYTES..] == pattern[FIO_BYTES..]);
    let js = json_of(&v.hdr).unwrap();
    assert_eq!(
        js["keyslots"]
            .as_object()
            .unwrap()
            .values()
            .find(|k| k["type"] == "reencrypt")
            .unwrap()["direction"],
        "backward",
        "{js}"
    );
    // cryptsetup finishes a copy: the plaintext is on the device.
    let copy = v.copy(&lab, "cs");
    copy.finish_by_cryptsetup(&lab);
    assert!(
        std::fs::read(&copy.data).unwrap() == at_close,
        "cryptsetup's resume of the closed decryption lost data"
    );
    let (served, after) = reopen_and_resume(&lab, &v, name, &sock);
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    let st = status(name);
    assert!(
        st["table"].as_str().unwrap().contains(" linear "),
        "a finished decryption is served as plaintext: {st}"
    );
    drop(served);
    assert!(
        std::fs::read(&v.data).unwrap() == after,
        "the device does not hold the plaintext the export served"
    );
    // cryptsetup reads the header as a finished decryption (no requirement, no crypt
    // segment left).
    let js = json_of(&v.hdr).expect("cryptsetup refuses the finished header");
    assert!(js["config"]["requirements"].is_null(), "{js}");
    assert_eq!(js["segments"]["0"]["type"], "linear", "{js}");
}

/// The daemon SIGKILLed at 30% and 70% of a detached re-key and a detached decryption:
/// cryptblk's `open --header` serves a copy's data (recovering a cut hotzone first), and
/// `cryptsetup reencrypt --resume-only` (after `repair` where it asks) finishes each with
/// the data intact.
#[test]
fn killed_detached_runs_are_finished_by_cryptsetup() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"detached kill pass");
    let name = "t-reenc-det-kill";
    let (base, pattern) = detached_volume(&lab, name);
    let mut kills = 0;
    let mut recovered = 0;
    for (decrypt, at) in [(false, 0.3), (false, 0.7), (true, 0.3), (true, 0.7)] {
        let v = base.copy(&lab, "cut");
        let sock = lab.path("nbd.sock");
        let served = v.open(&lab, name, &sock);
        let mut args = vec!["--hotzone-size", "64k", "--header", v.hdr_arg()];
        if decrypt {
            args.push("--decrypt");
        }
        let mut cmd = lab.reencrypt(&args);
        cmd.arg(&v.data);
        kill_served_run(name, served, &sock, &mut cmd, at, &v.hdr);
        // cryptblk opens a copy (recovering a cut hotzone from the detached header's
        // resilience data first) and serves the data.
        let c = v.copy(&lab, "cb");
        if json_of(&c.hdr)
            .unwrap()
            .to_string()
            .contains("in-reencryption")
        {
            recovered += 1;
        }
        let s = c.open(&lab, name, &sock);
        assert!(
            lab.read_export(&sock, "cut.bin") == pattern,
            "killed at {at} (decrypt: {decrypt}): cryptblk serves other data"
        );
        drop(s);
        v.finish_by_cryptsetup(&lab);
        let plain = if decrypt {
            std::fs::read(&v.data).unwrap()
        } else {
            v.independent_plaintext(&lab)
        };
        assert!(
            plain == pattern,
            "killed at {at} (decrypt: {decrypt}), finished by cryptsetup: data lost"
        );
        kills += 1;
    }
    assert_eq!(kills, 4);
    eprintln!("4 killed runs served by cryptblk ({recovered} with a cut hotzone) and finished by cryptsetup");
}
