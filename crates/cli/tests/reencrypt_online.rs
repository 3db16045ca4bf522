//! Online LUKS2 reencryption and opening a volume mid-reencryption, against cryptsetup 2.6
//! and the independent dm-crypt model:
//!
//! - a served volume is re-keyed by its daemon while fio writes and verifies (crc32c) on
//!   its NBD export, runs after run, from before the re-key starts until after it ends,
//!   and again after a reopen: zero errors; the data fio does not touch is unchanged;
//!   cryptsetup accepts the finished header and its volume key decrypts the image
//!   (independent model) to exactly what the export served;
//! - `close` halfway leaves a header cryptblk's `open` serves (both segments) under fio,
//!   and `reencrypt --resume-only` finishes online;
//! - a daemon killed (SIGKILL) mid-run leaves a state that `cryptsetup reencrypt
//!   --resume-only` (after `repair` where it asks) and cryptblk's offline resume finish;
//! - volumes cryptsetup was reencrypting when killed (strace fault injection) are opened
//!   by cryptblk (hotzone recovered) and read back their plaintext over NBD.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

type Lab = KeyLab;

impl Lab {
    /// The data area of `img` decrypted by the independent model with the volume key and
    /// segment cryptsetup reports (so cryptsetup must accept the header as finished).
    fn independent_plaintext(&self, img: &Path) -> Vec<u8> {
        run_ok(
            cryptsetup()
                .unwrap()
                .args(["open", "--test-passphrase", "--key-file"])
                .arg(&self.key)
                .arg(img),
            b"",
        );
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"");
        assert!(!dump.contains("reencrypt"), "leftovers:\n{dump}");
        plaintext_by_cryptsetup(img, &self.key).1
    }
}

/// A 48 MiB LUKS2 volume by cryptsetup (32 MiB of data) whose data area holds a random
/// pattern written through cryptblk's export; returns the image and that plaintext.
fn patterned_volume(lab: &Lab, name: &str, served: &str) -> (PathBuf, Vec<u8>) {
    let img = lab.path(name);
    cryptsetup_luks2(&img, &lab.key, 48 * MIB).unwrap();
    let sock = lab.path("fill.sock");
    let plain = lab.path("fill.bin");
    let data = write_pattern(&plain, 32 * MIB as usize, 7);
    let _s = open_nbd(&img, &lab.key, served, &sock, &[]);
    run_ok(Command::new("nbdcopy").arg(&plain).arg(nbd_uri(&sock)), b"");
    drop(_s);
    (img, data)
}

#[test]
fn online_rekey_under_fio_then_reopen() {
    if !tools() {
        return;
    }
    let lab = Lab::new(b"online pass");
    let name = "t-reenc-online";
    let (img, before_plain) = patterned_volume(&lab, "vol.img", name);
    let old_key = cryptsetup_volume_key(&img, &lab.key, &[]).unwrap();
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&img, &lab.key, name, &sock, &[]);
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the online re-key");
    let mut re = spawn_captured(
        lab.reencrypt(&["--hotzone-size", "256k", "--json"])
            .arg(&img),
    );
    let seen = watch(name, &mut re, |_| false);
    let out = re.wait_with_output().unwrap();
    // fio ran from before the re-key began until after it ended.
    let runs = fio.finish();
    assert!(
        out.status.success(),
        "online reencrypt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "finished");
    assert_eq!(summary["online"], true);
    assert_eq!(summary["data_size"], 32 * MIB);
    assert!(summary["steps"].as_u64().unwrap() >= 100, "{summary}");
    assert!(
        !seen.is_empty(),
        "status never showed the run ({runs} fio runs)"
    );
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "finished", "{st}");
    assert_eq!(st["table"].as_str().unwrap().lines().count(), 1, "{st}");
    let served_plain = lab.read_export(&sock, "after.bin");
    // fio wrote the first 4 MiB; the rest is the pattern written before.
    assert!(
        served_plain[4 * MIB as usize..] == before_plain[4 * MIB as usize..],
        "data outside fio's regions changed"
    );
    drop(served);
    // The daemon's log tells the run: its start, a line per tenth (not one per step: 128
    // steps here), and cryptsetup's final line with the bytes this run wrote.
    let log = std::fs::read_to_string(runtime_dir().join(format!("{name}.log"))).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("{name}: reencryption ")))
        .collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.contains("reencryption started (forward, hotzone 256 KiB")),
        "{log}"
    );
    let progress = lines
        .iter()
        .filter(|l| l.contains("reencryption Progress: "))
        .count();
    assert!(
        (1..=12).contains(&progress),
        "{progress} progress lines:\n{log}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("reencryption Finished, time ")
                && l.contains("   32 MiB written, speed ")),
        "{log}"
    );
    assert!(
        lab.independent_plaintext(&img) == served_plain,
        "the new key does not decrypt what the export served"
    );
    let new_key = cryptsetup_volume_key(&img, &lab.key, &[]).unwrap();
    assert_ne!(old_key, new_key, "the volume key did not change");
    // Reopened: fio again.
    let _again = open_nbd(&img, &lab.key, name, &sock, &[]);
    fio_once(lab.dir.path(), &sock, "after a reopen");
    eprintln!(
        "online re-key: {} steps under {runs} fio runs, progress seen at {:?}",
        summary["steps"],
        seen.iter().map(|f| (f * 100.0) as u32).collect::<Vec<_>>()
    );
}

#[test]
fn close_halfway_then_open_and_resume_online() {
    if !tools() {
        return;
    }
    let lab = Lab::new(b"halfway pass");
    let name = "t-reenc-half";
    let (img, before_plain) = patterned_volume(&lab, "vol.img", name);
    let sock = lab.path("nbd.sock");
    let served = open_nbd(&img, &lab.key, name, &sock, &[]);
    let fio = FioLoop::start(lab.dir.path(), &sock, "before the close");
    let mut re = spawn_captured(lab.reencrypt(&["--hotzone-size", "64k"]).arg(&img));
    let seen = watch(name, &mut re, |f| f >= 0.3);
    assert!(!seen.is_empty(), "status never showed the run");
    fio.finish();
    // fio is done: what the export serves now is what the closed volume must hold.
    let at_close = lab.read_export(&sock, "at-close.bin");
    run_ok(cryptblk().args(["close", name]), b"");
    let out = re.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was interrupted"), "{err}");
    drop(served);
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    assert!(
        dump.contains("online-reencrypt"),
        "closed before the end was not mid-reencryption:\n{dump}"
    );
    // cryptsetup finishes a copy of the closed volume with the data intact.
    let copy = lab.path("cryptsetup.img");
    std::fs::copy(&img, &copy).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["reencrypt", "--resume-only", "--force-offline-reencrypt"])
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&copy),
        b"",
    );
    assert!(
        lab.independent_plaintext(&copy) == at_close,
        "cryptsetup's resume of the closed volume lost data"
    );
    std::fs::remove_file(&copy).unwrap();
    // cryptblk serves it mid-reencryption (both segments), fio again.
    let served = open_nbd(&img, &lab.key, name, &sock, &[]);
    let st = status(name);
    assert_eq!(st["reencryption"]["state"], "paused", "{st}");
    assert!(st["reencryption"]["done"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["table"].as_str().unwrap().lines().count(), 2, "{st}");
    fio_once(
        lab.dir.path(),
        &sock,
        "on the volume opened mid-reencryption",
    );
    let fio = FioLoop::start(lab.dir.path(), &sock, "during the resumed re-key");
    let mut re = spawn_captured(
        lab.reencrypt(&["--resume-only", "--hotzone-size", "1M"])
            .arg(&img),
    );
    watch(name, &mut re, |_| false);
    let out = re.wait_with_output().unwrap();
    fio.finish();
    assert!(
        out.status.success(),
        "online resume failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fio_once(lab.dir.path(), &sock, "after the resumed reencryption");
    let served_plain = lab.read_export(&sock, "after.bin");
    assert!(served_plain[4 * MIB as usize..] == before_plain[4 * MIB as usize..]);
    drop(served);
    assert!(
        lab.independent_plaintext(&img) == served_plain,
        "the new key does not decrypt what the export served"
    );
}

/// The daemon SIGKILLed at several points of an online run: cryptsetup (after `repair`
/// where it asks) and cryptblk's offline resume both finish it with the data intact.
#[test]
fn daemon_killed_mid_run_is_finished_by_cryptsetup_and_cryptblk() {
    if !tools() {
        return;
    }
    let lab = Lab::new(b"killed pass");
    let name = "t-reenc-kill";
    let (base, plain) = patterned_volume(&lab, "base.img", name);
    let mut kills = 0;
    for (i, at) in [0.2, 0.5, 0.8].into_iter().enumerate() {
        let img = lab.path("cut.img");
        std::fs::copy(&base, &img).unwrap();
        let sock = lab.path("nbd.sock");
        let served = open_nbd(&img, &lab.key, name, &sock, &[]);
        let resilience = ["checksum", "journal", "checksum"][i];
        // 512 steps: the run must not end between the status that triggers the kill and
        // the kill itself (on a loaded machine the test may wait that long for a CPU).
        let mut cmd = lab.reencrypt(&["--hotzone-size", "64k", "--resilience", resilience]);
        cmd.arg(&img);
        kill_served_run(name, served, &sock, &mut cmd, at, &img);
        kills += 1;
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
        assert!(dump.contains("online-reencrypt"), "{dump}");
        // cryptblk offline on one copy, cryptsetup on the other.
        let copy = lab.path("cut-cryptblk.img");
        std::fs::copy(&img, &copy).unwrap();
        run_ok(
            lab.reencrypt(&["--resume-only", "--force-offline-reencrypt"])
                .arg(&copy),
            b"",
        );
        assert!(
            lab.independent_plaintext(&copy)[..] == plain[..],
            "killed at {at} ({resilience}), resumed by cryptblk: plaintext lost"
        );
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
            run_ok(
                cryptsetup()
                    .unwrap()
                    .args(["repair", "--key-file"])
                    .arg(&lab.key)
                    .arg(&img),
                b"",
            );
            let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
            if dump.contains("online-reencrypt") {
                let out = resume();
                assert!(
                    out.status.success(),
                    "cryptsetup resume after repair: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        assert!(
            lab.independent_plaintext(&img)[..] == plain[..],
            "killed at {at} ({resilience}), resumed by cryptsetup: plaintext lost"
        );
    }
    assert_eq!(kills, 3);
}

/// cryptsetup killed at a sample of its writes (checksum and journal): cryptblk opens the
/// volume (recovering a cut hotzone) and serves its plaintext; one of them is then
/// finished online and cryptsetup accepts it.
#[test]
fn cryptsetup_interrupted_volumes_open_and_serve_their_plaintext() {
    if !tools() {
        return;
    }
    let Some(_) = tool("strace") else { return };
    let lab = Lab::new(b"interrupted pass");
    let base = lab.path("base.img");
    write_pattern(&base, 6 * MIB as usize, 3);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--type", "luks2", "--sector-size", "512"])
            .args([
                "--luks2-keyslots-size",
                "1M",
                "--luks2-metadata-size",
                "16k",
            ])
            .args(FAST)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&base),
        b"",
    );
    let (offset, sector) = cryptsetup_luks2_segment(&base).unwrap();
    let key = cryptsetup_volume_key(&base, &lab.key, &[]).unwrap();
    let data = std::fs::read(&base).unwrap();
    let plain = independent("decrypt", "aes-xts-plain64", &key, sector, &data[offset..]);
    let name = "t-reenc-cs";
    let mut opened = 0;
    let mut recovered = 0;
    for resilience in ["checksum", "journal"] {
        for n in (8..=80).step_by(12) {
            let img = lab.path("cut.img");
            std::fs::copy(&base, &img).unwrap();
            let inject = format!("inject=write:signal=KILL:when={n}");
            run(
                tool("strace")
                    .unwrap()
                    .args(["-o", "/dev/null", "-e", "trace=write", "-e", &inject])
                    .args(["cryptsetup", "--batch-mode", "reencrypt"])
                    .args(["--force-offline-reencrypt", "--hotzone-size", "512k"])
                    .args(["--resilience", resilience])
                    .arg("--key-file")
                    .arg(&lab.key)
                    .arg(&img),
                b"",
            );
            let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
            if !dump.contains("online-reencrypt") {
                continue;
            }
            if dump.contains("in-reencryption") {
                recovered += 1;
            }
            let sock = lab.path("nbd.sock");
            let served = open_nbd(&img, &lab.key, name, &sock, &[]);
            let got = lab.read_export(&sock, "read.bin");
            assert!(
                got == plain,
                "cryptsetup killed at write {n} ({resilience}): cryptblk serves other data"
            );
            opened += 1;
            if opened == 3 {
                // Finish this one online; cryptsetup must accept it.
                run_ok(lab.reencrypt(&["--resume-only"]).arg(&img), b"");
                assert!(lab.read_export(&sock, "read2.bin") == plain);
                drop(served);
                assert!(lab.independent_plaintext(&img) == plain);
            }
        }
    }
    assert!(opened >= 6, "only {opened} interrupted volumes");
    assert!(recovered >= 1, "no cut hotzone was recovered at open");
    eprintln!("{opened} cryptsetup-interrupted volumes served, {recovered} with a cut hotzone");
}
