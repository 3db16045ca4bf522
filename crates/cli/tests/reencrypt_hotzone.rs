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
    case(
        &lab,
        "checksum-10M-512",
        256,
        &["--sector-size", "512"],
        &["--resilience", "checksum", "--hotzone-size", "10M"],
    );
}
