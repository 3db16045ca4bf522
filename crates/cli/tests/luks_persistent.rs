//! cryptsetup's `--persistent` through the CLI, judged by the real cryptsetup:
//! - `cryptblk open/refresh --persistent` on a cryptsetup-made LUKS2 volume stores the given
//!   activation flags in the header: cryptsetup's luksDump prints them (and the same dump as
//!   cryptblk's), its JSON holds them, the epoch grew by one, and cryptsetup still accepts
//!   the passphrase;
//! - stored flags apply to a later plain `open`/`refresh`, `--persistent` replaces (and with
//!   no flag clears) them, and `--persistent` alone ignores them, as cryptsetup does;
//! - LUKS2 `--integrity`: a stored `no-journal` opens dm-integrity in direct mode;
//! - refused combinations fail as cryptsetup fails; LUKS1 is activated with cryptsetup's
//!   "cannot make flags persistent" message and exit status 0.
//!
//! cryptsetup itself cannot store flags here (no device-mapper to activate with), so the
//! direction "flags cryptsetup stored, cryptblk applies" is covered by the flags being read
//! from the JSON cryptsetup's luksDump shows and by format-crate tests on cryptsetup images.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// A LUKS volume made by cryptsetup (key in `key`), on a 24 MiB sparse file.
fn cryptsetup_volume(
    dir: &Path,
    name: &str,
    version: &str,
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let mut cs = cryptsetup()?;
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&key, b"persistent flags passphrase").unwrap();
    let img = dir.join(format!("{name}.img"));
    sparse_file(&img, 24 << 20);
    run_ok(
        cs.args(["luksFormat", "--type", version])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    Some((img, key))
}

/// cryptsetup's luksDump of `img`.
fn cs_dump(img: &Path) -> String {
    run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"")
}

/// The words of cryptsetup's "Flags:" line.
fn cs_flags_line(img: &Path) -> Vec<String> {
    let dump = cs_dump(img);
    dump.lines()
        .find(|l| l.starts_with("Flags:"))
        .unwrap_or_else(|| panic!("no Flags line:\n{dump}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `config.flags` of the JSON metadata cryptsetup reads.
fn cs_json_flags(img: &Path) -> Value {
    let out = run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img),
        b"",
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    v["config"]["flags"].clone()
}

fn cs_epoch(img: &Path) -> u64 {
    let dump = cs_dump(img);
    dump.lines()
        .find_map(|l| l.strip_prefix("Epoch:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn cs_accepts_passphrase(img: &Path, key: &Path) {
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(key)
            .arg(img),
        b"",
    );
}

/// The crypt table's flags of a served mapping (`status --json`; the sector size, which
/// cryptsetup picks for the image, left out).
fn table_options(map: &str) -> Vec<String> {
    let st: Value =
        serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", map]), b"")).unwrap();
    let table = st["table"].as_str().unwrap().to_string();
    let words: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(words[2], "crypt", "{table}");
    match words.get(8) {
        Some(n) => {
            let n: usize = n.parse().unwrap();
            words[9..9 + n]
                .iter()
                .filter(|w| !w.starts_with("sector_size:"))
                .map(|w| w.to_string())
                .collect()
        }
        None => Vec::new(),
    }
}

fn lower_table(map: &str) -> String {
    let st: Value =
        serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", map]), b"")).unwrap();
    st["info"]["lower"][0]["table"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `cryptblk open --key-file KEY EXTRA.. IMG MAP --nbd SOCK` whatever its outcome; the
/// mapping (if any) is closed when the second value drops.
fn try_open(
    img: &Path,
    key: &Path,
    map: &str,
    sock: &Path,
    extra: &[&str],
) -> (std::process::Output, Served) {
    let out = run(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(key)
            .args(extra)
            .arg(img)
            .arg(map)
            .arg("--nbd")
            .arg(sock),
        b"",
    );
    (out, Served::volume(map))
}

fn map_name(tag: &str) -> String {
    format!("cbpers-{tag}-{}", std::process::id() % 10000)
}

#[test]
fn open_persistent_stores_flags_that_cryptsetup_reads() {
    let dir = tempdir();
    let Some((img, key)) = cryptsetup_volume(dir.path(), "a", "luks2") else {
        return;
    };
    assert_eq!(cs_flags_line(&img), ["Flags:", "(no", "flags)"]);
    let epoch = cs_epoch(&img);
    let sock = dir.path().join("a.sock");
    let map = map_name("a");

    let served = open_nbd(
        &img,
        &key,
        &map,
        &sock,
        &[
            "--persistent",
            "--allow-discards",
            "--perf-no_read_workqueue",
        ],
    );
    // This activation: exactly the given flags, with cryptsetup's meaning (writes queued).
    assert_eq!(table_options(&map), ["allow_discards", "no_read_workqueue"]);
    drop(served);

    // cryptsetup reads what cryptblk stored, in its order and spelling.
    assert_eq!(
        cs_flags_line(&img),
        ["Flags:", "allow-discards", "no-read-workqueue"]
    );
    assert!(
        cs_dump(&img).contains("Flags:       \tallow-discards no-read-workqueue \n"),
        "{}",
        cs_dump(&img)
    );
    assert_eq!(
        cs_json_flags(&img),
        serde_json::json!(["allow-discards", "no-read-workqueue"])
    );
    assert_eq!(cs_epoch(&img), epoch + 1, "one metadata update");
    assert_eq!(
        run_ok(cryptblk().arg("luksDump").arg(&img), b""),
        cs_dump(&img)
    );
    cs_accepts_passphrase(&img, &key);

    // A later open without options uses the stored flags.
    let served = open_nbd(&img, &key, &map, &sock, &[]);
    assert_eq!(table_options(&map), ["allow_discards", "no_read_workqueue"]);
    let status = run_ok(cryptblk().args(["status", &map]), b"");
    assert!(
        status.contains("pipeline:    read inline, write queued"),
        "{status}"
    );
    drop(served);
    // Given flags are added to the stored ones.
    let served = open_nbd(&img, &key, &map, &sock, &["--perf-same_cpu_crypt"]);
    assert_eq!(
        table_options(&map),
        ["allow_discards", "same_cpu_crypt", "no_read_workqueue"]
    );
    drop(served);
    assert_eq!(cs_epoch(&img), epoch + 1, "plain opens write nothing");

    // --persistent replaces the set: only the given flags are used and stored.
    let served = open_nbd(
        &img,
        &key,
        &map,
        &sock,
        &["--persistent", "--perf-no_write_workqueue"],
    );
    assert_eq!(table_options(&map), ["no_write_workqueue"]);
    drop(served);
    assert_eq!(cs_flags_line(&img), ["Flags:", "no-write-workqueue"]);

    // --persistent with no flag clears them (an empty array, as cryptsetup writes).
    let served = open_nbd(&img, &key, &map, &sock, &["--persistent"]);
    assert_eq!(
        table_options(&map),
        ["no_read_workqueue", "no_write_workqueue"],
        "cryptblk's inline default"
    );
    drop(served);
    assert_eq!(cs_flags_line(&img), ["Flags:", "(no", "flags)"]);
    assert_eq!(cs_json_flags(&img), serde_json::json!([]));
    assert_eq!(cs_epoch(&img), epoch + 3);
    cs_accepts_passphrase(&img, &key);
}

#[test]
fn refresh_persistent_stores_flags_and_plain_refresh_keeps_them() {
    let dir = tempdir();
    let Some((img, key)) = cryptsetup_volume(dir.path(), "r", "luks2") else {
        return;
    };
    let sock = dir.path().join("r.sock");
    let map = map_name("r");
    let served = open_nbd(&img, &key, &map, &sock, &[]);
    // From another working directory: refresh finds the header the volume was opened from.
    run_ok(
        cryptblk().current_dir("/").args([
            "refresh",
            "--persistent",
            "--perf-same_cpu_crypt",
            &map,
        ]),
        b"",
    );
    assert_eq!(table_options(&map), ["same_cpu_crypt"]);
    assert_eq!(cs_flags_line(&img), ["Flags:", "same-cpu-crypt"]);
    // Without options, refresh still applies the stored flag (cryptsetup's rule).
    run_ok(cryptblk().args(["refresh", &map]), b"");
    assert_eq!(table_options(&map), ["same_cpu_crypt"]);
    run_ok(
        cryptblk().args(["refresh", "--perf-no_write_workqueue", &map]),
        b"",
    );
    assert_eq!(
        table_options(&map),
        ["same_cpu_crypt", "no_write_workqueue"]
    );
    // Refused: the journal of a live integrity layer cannot change.
    let out = run(
        cryptblk().args(["refresh", "--persistent", "--integrity-no-journal", &map]),
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    drop(served);
    assert_eq!(cs_flags_line(&img), ["Flags:", "same-cpu-crypt"]);
    cs_accepts_passphrase(&img, &key);
}

#[test]
fn integrity_no_journal_is_stored_as_no_journal() {
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"integrity persistent").unwrap();
    let img = dir.path().join("i.img");
    sparse_file(&img, 32 << 20);
    run_ok(
        luks_format_integrity("aes-xts-plain64", "hmac-sha256")
            .args(["--integrity-no-wipe", "-s", "512"])
            .args(FAST)
            .arg("-d")
            .arg(&key)
            .arg(&img),
        b"",
    );
    let sock = dir.path().join("i.sock");
    let map = map_name("i");
    let mode = |map: &str| {
        lower_table(map)
            .split_whitespace()
            .nth(6)
            .unwrap()
            .to_string()
    };

    let served = open_nbd(&img, &key, &map, &sock, &[]);
    assert_eq!(mode(&map), "J");
    drop(served);
    let served = open_nbd(
        &img,
        &key,
        &map,
        &sock,
        &["--persistent", "--integrity-no-journal"],
    );
    assert_eq!(mode(&map), "D");
    drop(served);
    if cryptsetup().is_some() {
        assert_eq!(cs_flags_line(&img), ["Flags:", "no-journal"]);
        cs_accepts_passphrase(&img, &key);
    }
    // A later open without the option: direct mode from the stored flag.
    let served = open_nbd(&img, &key, &map, &sock, &[]);
    assert_eq!(mode(&map), "D");
    drop(served);
    // cryptsetup refuses discards on integrity volumes; so does cryptblk, and stores nothing.
    let (out, _cleanup) = try_open(
        &img,
        &key,
        &map,
        &sock,
        &["--persistent", "--allow-discards"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Discard/TRIM is not supported."));
    if cryptsetup().is_some() {
        assert_eq!(cs_flags_line(&img), ["Flags:", "no-journal"]);
    }
}

#[test]
fn persistent_with_test_passphrase_is_refused_like_cryptsetup() {
    let dir = tempdir();
    let Some((img, key)) = cryptsetup_volume(dir.path(), "t", "luks2") else {
        return;
    };
    let args = |c: &mut std::process::Command| {
        c.args(["open", "--test-passphrase", "--persistent", "--key-file"])
            .arg(&key)
            .arg(&img);
    };
    let mut theirs = cryptsetup().unwrap();
    args(&mut theirs);
    let theirs = run(&mut theirs, b"");
    let mut ours = cryptblk();
    args(&mut ours);
    let ours = run(&mut ours, b"");
    assert_eq!(ours.status.code(), theirs.status.code());
    assert_eq!(ours.status.code(), Some(1));
    let msg = "Option --persistent is not allowed with --test-passphrase.";
    assert!(String::from_utf8_lossy(&theirs.stderr).contains(msg));
    assert!(String::from_utf8_lossy(&ours.stderr).contains(msg));
}

#[test]
fn luks1_is_activated_but_flags_are_not_stored() {
    let dir = tempdir();
    let Some((img, key)) = cryptsetup_volume(dir.path(), "l1", "luks1") else {
        return;
    };
    let before = std::fs::read(&img).unwrap();
    let sock = dir.path().join("l1.sock");
    let map = map_name("l1");
    let (out, served) = try_open(
        &img,
        &key,
        &map,
        &sock,
        &["--persistent", "--allow-discards"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("This operation is supported only for LUKS2 device.")
            && err.contains("Device activated but cannot make flags persistent."),
        "{err}"
    );
    assert_eq!(
        table_options(&map),
        ["allow_discards", "no_read_workqueue", "no_write_workqueue"]
    );
    drop(served);
    assert!(
        std::fs::read(&img).unwrap() == before,
        "LUKS1 header untouched"
    );
    cs_accepts_passphrase(&img, &key);
}
