//! The first hotzone of a re-key is the one cryptsetup 2.6 picks: for each set of options,
//! cryptsetup's `reencrypt` is killed at its first data sync (the hotzone rewritten, the
//! header still naming it) and cryptblk's at its first data write (the header naming the
//! hotzone written); cryptsetup's `luksDump --dump-json-metadata` must show the same
//! segments for both (offsets, sizes, flags; the `in-reencryption` segment is the hotzone).
//!
//! Cases: the default checksum hotzone (as many checksum blocks as the keyslot area holds
//! hashes of, capped at 1 GiB: the whole 1 GiB with a 16 MiB header, which cryptblk hashes
//! and rewrites in chunks), a 65 MiB checksum hotzone (1 MiB keyslots area), the journal
//! hotzone (the area's length), and `--hotzone-size` with checksum and journal.
//! Resilience `none` writes no header per hotzone, so a cut run shows nothing to compare.
//! `--hotzone-size` is taken in whole 512-byte sectors as cryptsetup takes it (4 MiB + 511
//! is 4 MiB, 511 is no limit).
//!
//! `hotzone_size_refusals_are_cryptsetups`: a `--hotzone-size` that is not a multiple of
//! the zone alignment (the largest of the device block and both sector sizes) is refused
//! by both tools with the same two lines and exit 1, after the reencryption is initialized
//! (both headers then hold the same segments and requirement); `--init-only` ignores it.

mod common;
use common::reenc::*;
use common::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;

const PASS: &[u8] = b"hotzone-pass";

/// cryptblk's writes up to and including its first data write of a re-key with one
/// keyslot: the new keyslot's area, its header (2 copies), the reencryption header (2),
/// the resilience data (1), the header naming the hotzone (2), then the hotzone.
const CRYPTBLK_FIRST_DATA_WRITE: usize = 9;

/// The `segments` object of `img` as cryptsetup dumps it.
fn segments(img: &Path) -> Value {
    json_of(img).expect("cryptsetup reads the header")["segments"].clone()
}

/// Formats a `mib` MiB sparse image at `img` with `format` options.
fn format(lab: &KeyLab, img: &Path, mib: u64, format: &[&str]) {
    sparse_file(img, mib << 20);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "-q", "--type", "luks2"])
            .args(FAST)
            .args(format)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(img),
        b"",
    );
}

fn case(lab: &KeyLab, name: &str, mib: u64, fmt: &[&str], args: &[&str]) {
    let cs = lab.path(&format!("{name}-cs.img"));
    let cb = lab.path(&format!("{name}-cb.img"));
    format(lab, &cs, mib, fmt);
    std::fs::copy(&cs, &cb).unwrap();
    let key = lab.key.to_str().unwrap();
    let mut cs_cmd = vec!["cryptsetup", "reencrypt", "-q", "--force-offline-reencrypt"];
    cs_cmd.extend(FAST);
    cs_cmd.extend(["--key-file", key]);
    cs_cmd.extend(args);
    cs_cmd.push(cs.to_str().unwrap());
    killed(&os(&cs_cmd), "fdatasync", 1, lab.dir.path());
    let bin = env!("CARGO_BIN_EXE_cryptblk");
    let mut cb_cmd = vec![bin, "reencrypt", "-q"];
    cb_cmd.extend(FAST);
    cb_cmd.extend(["--key-file", key]);
    cb_cmd.extend(args);
    cb_cmd.push(cb.to_str().unwrap());
    let cb_os: Vec<&OsStr> = os(&cb_cmd);
    killed(
        &cb_os,
        "pwrite64",
        CRYPTBLK_FIRST_DATA_WRITE,
        lab.dir.path(),
    );
    let (a, b) = (segments(&cs), segments(&cb));
    let hotzone = a
        .as_object()
        .and_then(|m| {
            m.values()
                .find(|s| s["flags"].to_string().contains("in-reencryption"))
        })
        .map(|s| s["size"].clone());
    assert!(
        hotzone.is_some(),
        "{name}: cryptsetup was not cut inside its first hotzone: {a}"
    );
    assert_eq!(a, b, "{name}: cryptblk's segments differ from cryptsetup's");
    eprintln!(
        "{name}: both tools' first hotzone is {} bytes",
        hotzone.unwrap()
    );
    std::fs::remove_file(&cs).unwrap();
    std::fs::remove_file(&cb).unwrap();
}

#[test]
fn first_hotzone_has_cryptsetups_size() {
    if cryptsetup().is_none() || tool("strace").is_none() {
        eprintln!("skipped: needs cryptsetup and strace");
        return;
    }
    // RAM-backed when possible: the default checksum case writes 1 GiB per tool.
    let dir = tempfile::Builder::new()
        .prefix("cryptblk-hotzone.")
        .tempdir_in("/dev/shm")
        .unwrap_or_else(|_| tempdir());
    let key = write_file(dir.path(), "key", PASS);
    let lab = KeyLab { dir, key };
    let s4k = ["--sector-size", "4096"];
    case(
        &lab,
        "checksum-default",
        1100,
        &s4k,
        &["--resilience", "checksum"],
    );
    case(
        &lab,
        "checksum-1M-area",
        256,
        &["--sector-size", "4096", "--luks2-keyslots-size", "1M"],
        &["--resilience", "checksum"],
    );
    case(
        &lab,
        "journal-default",
        256,
        &s4k,
        &["--resilience", "journal"],
    );
    case(
        &lab,
        "journal-4M",
        256,
        &s4k,
        &["--resilience", "journal", "--hotzone-size", "4M"],
    );
    // cryptsetup's command line takes whole sectors: 4 MiB + 511 bytes is 4 MiB.
    case(
        &lab,
        "journal-4M+511",
        256,
        &s4k,
        &["--resilience", "journal", "--hotzone-size", "4194815"],
    );
    // Less than a sector is no limit at all: the 65 MiB hotzone of the 1 MiB area.
    case(
        &lab,
        "checksum-1M-area-511",
        256,
        &["--sector-size", "4096", "--luks2-keyslots-size", "1M"],
        &["--resilience", "checksum", "--hotzone-size", "511"],
    );
    case(
        &lab,
        "checksum-10M-512",
        256,
        &["--sector-size", "512"],
        &["--resilience", "checksum", "--hotzone-size", "10M"],
    );
}

/// Runs `tool reencrypt -q ARGS img` with the lab's key file to its end: (exit code, stderr).
fn reencrypt_with(lab: &KeyLab, tool: &str, args: &[&str], img: &Path) -> (i32, String) {
    let mut cmd = if tool == "cryptsetup" {
        let mut c = cryptsetup().unwrap();
        c.arg("reencrypt");
        c.arg("--force-offline-reencrypt");
        c
    } else {
        let mut c = cryptblk();
        c.arg("reencrypt");
        c
    };
    cmd.arg("-q")
        .args(FAST)
        .arg("--key-file")
        .arg(&lab.key)
        .args(args)
        .arg(img);
    code(&mut cmd)
}

/// Both tools run `steps` in turn (each `(args, refused)`) on their own copy of a `mib` MiB
/// image (`fmt` options for luksFormat, or a plain image when `fmt` is `None`); each step
/// must end alike in both (exit code, stderr; exit 1 and a refusal when `refused`), and
/// the headers must show the same segments and requirements afterwards.
fn refusal(lab: &KeyLab, name: &str, mib: u64, fmt: Option<&[&str]>, steps: &[(&[&str], bool)]) {
    let cs = lab.path(&format!("{name}-cs.img"));
    let cb = lab.path(&format!("{name}-cb.img"));
    match fmt {
        Some(f) => format(lab, &cs, mib, f),
        None => sparse_file(&cs, mib << 20),
    }
    std::fs::copy(&cs, &cb).unwrap();
    for (args, refused) in steps {
        let (a, b) = (
            reencrypt_with(lab, "cryptsetup", args, &cs),
            reencrypt_with(lab, "cryptblk", args, &cb),
        );
        eprintln!("{name} {args:?}: cryptsetup {a:?}, cryptblk {b:?}");
        assert_eq!(
            a.0,
            if *refused { 1 } else { 0 },
            "{name}: cryptsetup {a:?}"
        );
        assert_eq!(a, b, "{name} {args:?}: cryptblk ends unlike cryptsetup");
    }
    let (a, b) = (json_of(&cs).unwrap(), json_of(&cb).unwrap());
    assert_eq!(a["segments"], b["segments"], "{name}: segments differ");
    assert_eq!(
        a["config"]["requirements"], b["config"]["requirements"],
        "{name}: requirements differ"
    );
    std::fs::remove_file(&cs).unwrap();
    std::fs::remove_file(&cb).unwrap();
}

#[test]
fn hotzone_size_refusals_are_cryptsetups() {
    if cryptsetup().is_none() {
        eprintln!("skipped: needs cryptsetup");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("cryptblk-hotzone.")
        .tempdir_in("/dev/shm")
        .unwrap_or_else(|_| tempdir());
    let key = write_file(dir.path(), "key", PASS);
    let lab = KeyLab { dir, key };
    let s4k: &[&str] = &["--sector-size", "4096"];
    // 2000 bytes are 1536 (3 sectors), not a multiple of the 4096-byte sectors.
    refusal(
        &lab,
        "rekey-2000",
        20,
        Some(s4k),
        &[(&["--hotzone-size", "2000"], true)],
    );
    refusal(
        &lab,
        "journal-6144",
        20,
        Some(s4k),
        &[(&["--resilience", "journal", "--hotzone-size", "6144"], true)],
    );
    // New 512-byte sectors: the 4096-byte device block (the filesystem's) still rules.
    refusal(
        &lab,
        "sector512-2048",
        20,
        Some(&["--sector-size", "512"]),
        &[(&["--sector-size", "512", "--hotzone-size", "2048"], true)],
    );
    refusal(
        &lab,
        "none-4M-512",
        20,
        Some(s4k),
        &[(&["--resilience", "none", "--hotzone-size", "4194816"], true)],
    );
    // --init-only does not look at the size; the resume that would use it refuses it.
    refusal(
        &lab,
        "init-then-resume",
        20,
        Some(s4k),
        &[
            (&["--init-only", "--hotzone-size", "2000"], false),
            (&["--resume-only", "--hotzone-size", "2000"], true),
        ],
    );
    // Data-shift encryption (whose hotzone is the shift) checks it too.
    refusal(
        &lab,
        "encrypt-datashift",
        20,
        None,
        &[(
            &[
                "--encrypt",
                "--reduce-device-size",
                "8M",
                "--hotzone-size",
                "2000",
            ],
            true,
        )],
    );
}
