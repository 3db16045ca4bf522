//! Online encryption with a data shift (`--encrypt --reduce-device-size`), which
//! cryptsetup 2.6.1 runs backward: initialised offline (`--init-only`), the device opened
//! mid-encryption (its plaintext served through the header's moved segment and the rest),
//! then encrypted online by the daemon as cryptsetup's man page shows it (`reencrypt
//! --resume-only DEVICE` or `--active-name NAME`). Checked against cryptsetup and the
//! independent model:
//!
//! - fio writes and verifies (crc32c) on the NBD export through the run, a `close` at
//!   about 40%, the reopen of the half-encrypted device and the online resume to the end,
//!   and after a reopen of the finished volume: zero errors;
//! - cryptsetup finishes a copy of the closed volume with the data the export served;
//!   cryptsetup accepts the finished header and its volume key decrypts the device to what
//!   the export served;
//! - the daemon SIGKILLed mid-run leaves a state `cryptsetup reencrypt --resume-only`
//!   finishes with the data intact.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};

/// The plain device of the run under fio (large enough that a run of 256 KiB steps lasts
/// past fio's stop at the close); the kill test's is smaller.
const DEVICE: usize = 128 << 20;
const KILL_DEVICE: usize = 32 << 20;
/// `--reduce-device-size`: the data moves by half of it (256 KiB, the hotzone of every
/// step: about 500 steps), the header takes that (it fits with a 256-bit key).
const REDUCE: usize = 512 << 10;
/// fio writes the first 4 MiB; the rest keeps the pattern.
const FIO_BYTES: usize = 4 << 20;

/// A plain device of `size` bytes holding a random pattern in all but its last
/// [`REDUCE`] bytes (the volume's data), initialised for encryption with a data shift by
/// cryptblk (`--init-only`); returns it and the pattern.
fn initialised(lab: &KeyLab, name: &str, size: usize) -> (PathBuf, Vec<u8>) {
    let dev = lab.path(name);
    let mut pattern = write_pattern(&dev, size, 5);
    pattern.truncate(size - REDUCE);
    run_ok(
        lab.reencrypt(&["--encrypt", "--init-only", "--reduce-device-size", "512k"])
            .args(["--key-size", "256"])
            .args(FAST)
            .arg(&dev),
        b"",
    );
    assert!(in_progress(&dev));
    (dev, pattern)
}

/// The first `len` bytes of data of the finished `dev` decrypted by the independent model
/// with cryptsetup's volume key (cryptsetup must accept the header as finished).
fn independent_plaintext(lab: &KeyLab, dev: &Path, len: usize) -> Vec<u8> {
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(dev), b"");
    assert!(!dump.contains("reencrypt"), "leftovers:\n{dump}");
    let mut plain = plaintext_by_cryptsetup(dev, &lab.key).1;
    plain.truncate(len);
    plain
}

#[test]
fn datashift_encryption_online_under_fio_close_resume_reopen() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"online encrypt pass");
    let name = "t-reenc-enc";
    let (dev, pattern) = initialised(&lab, "plain.img", DEVICE);
    let sock = lab.path("nbd.sock");
    // Opened mid-encryption: all plaintext, served from the moved segment and the rest.
    let served = open_nbd(&dev, &lab.key, name, &sock, &[]);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    assert_eq!(st["size"].as_u64().unwrap(), pattern.len() as u64, "{st}");
    assert!(lab.read_export(&sock, "init.bin") == pattern);
    let mut cmd = lab.reencrypt(&["--resume-only"]);
    cmd.arg(&dev);
    let at_close = close_midway(&lab, &dev, name, &sock, cmd);
    drop(served);
    assert!(at_close[FIO_BYTES..] == pattern[FIO_BYTES..]);
    let js = json_of(&dev).unwrap();
    let ks = js["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .unwrap()
        .clone();
    assert_eq!(ks["direction"], "backward", "{js}");
    assert_eq!(ks["area"]["type"], "datashift", "{js}");
    // cryptsetup finishes a copy of the closed volume with the data the export served.
    let copy = lab.path("cs.img");
    std::fs::copy(&dev, &copy).unwrap();
    finish_by_cryptsetup(&lab.key, None, &copy);
    assert!(
        independent_plaintext(&lab, &copy, pattern.len()) == at_close,
        "cryptsetup's resume of the closed encryption lost data"
    );
    std::fs::remove_file(&copy).unwrap();
    // Reopened half-encrypted: both sides served; resumed online by --active-name.
    let served = open_nbd(&dev, &lab.key, name, &sock, &[]);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    assert!(st["reencryption"]["done"].as_u64().unwrap() > 0, "{st}");
    fio_once(lab.dir.path(), &sock, "on the device opened mid-encryption");
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the resumed encryption");
    let mut re = spawn_captured(&mut lab.reencrypt(&["--resume-only", "--active-name", name]));
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
    fio_once(lab.dir.path(), &sock, "after the online encryption");
    let after = lab.read_export(&sock, "after.bin");
    assert!(after[FIO_BYTES..] == pattern[FIO_BYTES..]);
    drop(served);
    assert!(
        independent_plaintext(&lab, &dev, pattern.len()) == after,
        "the volume key does not decrypt what the export served"
    );
    let _again = open_nbd(&dev, &lab.key, name, &sock, &[]);
    fio_once(lab.dir.path(), &sock, "after a reopen");
    eprintln!("online encryption resumed under {runs} fio runs");
}

/// The daemon SIGKILLed at 20%, 50% and 80% of an online encryption: cryptsetup
/// finishes each with the data intact.
#[test]
fn killed_online_encryption_is_finished_by_cryptsetup() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"online encrypt kill pass");
    let name = "t-reenc-enc-kill";
    let (base, pattern) = initialised(&lab, "base.img", KILL_DEVICE);
    for at in [0.2, 0.5, 0.8] {
        let dev = lab.path("cut.img");
        std::fs::copy(&base, &dev).unwrap();
        let sock = lab.path("nbd.sock");
        let served = open_nbd(&dev, &lab.key, name, &sock, &[]);
        let mut cmd = lab.reencrypt(&["--resume-only"]);
        cmd.arg(&dev);
        kill_served_run(name, served, &sock, &mut cmd, at, &dev);
        finish_by_cryptsetup(&lab.key, None, &dev);
        assert!(
            independent_plaintext(&lab, &dev, pattern.len()) == pattern,
            "killed at {at}, finished by cryptsetup: data lost"
        );
    }
}

/// The activation options of each crypt line of `table` (words after the option count,
/// without the `sector_size:` format option); linear lines give nothing.
fn crypt_options(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(2) == Some(&"crypt")).then(|| {
                let n: usize = w.get(8).and_then(|n| n.parse().ok()).unwrap_or(0);
                w[9..9 + n]
                    .iter()
                    .filter(|o| !o.starts_with("sector_size:"))
                    .map(|o| o.to_string())
                    .collect()
            })
        })
        .collect()
}

/// An encryption started from an all-linear table keeps `open`'s activation flags
/// (`--allow-discards`, the pipeline as `--perf-same_cpu_crypt` chose it) in every crypt
/// line the run serves, as cryptsetup keeps the dm device's flags across its reloads: the
/// live table's crypt lines before (none), during (each table seen) and after the run
/// carry the flags a plain `open` of the finished volume with the same options gives.
#[test]
fn activation_flags_survive_an_encryption_from_an_all_linear_table() {
    if !tools() {
        return;
    }
    let lab = KeyLab::new(b"online encrypt flags pass");
    let name = "t-reenc-enc-flags";
    let (dev, _) = initialised(&lab, "flags.img", KILL_DEVICE);
    let sock = lab.path("nbd.sock");
    let opts = ["--allow-discards", "--perf-same_cpu_crypt"];
    let served = open_nbd(&dev, &lab.key, name, &sock, &opts);
    let table = |st: &serde_json::Value| st["table"].as_str().unwrap().to_string();
    let before = table(&status(name));
    eprintln!("before:\n{before}");
    assert!(
        crypt_options(&before).is_empty(),
        "not all linear:\n{before}"
    );
    let mut re = spawn_captured(lab.reencrypt(&["--resume-only"]).arg(&dev));
    let mut during = Vec::new();
    while re.try_wait().unwrap().is_none() {
        let st = status(name);
        if st["reencryption"]["state"] == "running" {
            during.extend(crypt_options(&table(&st)));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = re.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "online encryption failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after_st = status(name);
    let after = crypt_options(&table(&after_st));
    let text = run_ok(cryptblk().args(["status", name]), b"");
    eprintln!("after: {}\n{text}", table(&after_st));
    drop(served);
    // What open gives the finished volume with the same options.
    let _again = open_nbd(&dev, &lab.key, name, &sock, &opts);
    let reference = crypt_options(&table(&status(name)));
    assert_eq!(reference.len(), 1, "{reference:?}");
    let want = &reference[0];
    assert!(
        want.contains(&"allow_discards".to_string())
            && want.contains(&"same_cpu_crypt".to_string()),
        "open did not apply the options: {want:?}"
    );
    assert!(!during.is_empty(), "no crypt line seen during the run");
    eprintln!(
        "{} crypt lines seen during the run, flags of the first: {:?}",
        during.len(),
        during[0]
    );
    for d in &during {
        assert_eq!(d, want, "a table during the run lost open's flags");
    }
    assert_eq!(after, reference, "the finished table lost open's flags");
    assert!(text.contains("flags:   discards same_cpu_crypt"), "{text}");
}
