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
//! - the other direction, with volumes whose flags cryptsetup 2.6.1 stored in the kernel lab
//!   (fixtures/luks2-persistent, see its README): cryptblk applies the stored flags as the
//!   kernel was given them, and the same steps in cryptblk leave the same JSON metadata as
//!   cryptsetup's; refusals and LUKS1's message are the ones cryptsetup printed there.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// Discards, to be stored: refused on integrity volumes, not storable on LUKS1.
const STORE_DISCARDS: &[&str] = &["--persistent", "--allow-discards"];

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

fn cs_accepts_passphrase_if_present(img: &Path, key: &Path) {
    if cryptsetup().is_some() {
        cs_accepts_passphrase(img, key);
    }
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

/// `cryptblk status --json MAP`.
fn status_json(map: &str) -> Value {
    serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", map]), b"")).unwrap()
}

/// Opens IMG as MAP with EXTRA, returns what `probe` sees of the mapping, and closes it.
fn probe_open<T>(
    img: &Path,
    key: &Path,
    map: &str,
    sock: &Path,
    extra: &[&str],
    probe: fn(&str) -> T,
) -> T {
    let served = open_nbd(img, key, map, sock, extra);
    let seen = probe(map);
    drop(served);
    seen
}

/// The crypt table's flags of a served mapping (`status --json`; the sector size, which
/// cryptsetup picks for the image, left out).
fn table_options(map: &str) -> Vec<String> {
    let st = status_json(map);
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

/// The dm-integrity mode (J journal, D direct, ...) of the lower table of a served
/// LUKS2 --integrity mapping.
fn integrity_mode(map: &str) -> String {
    let st = status_json(map);
    let lower = st["info"]["lower"][0]["table"].as_str().unwrap();
    lower.split_whitespace().nth(6).unwrap().to_string()
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

/// The crypt table of a served mapping after its 8th field ("N opt.."), as the lab's guest
/// script took it from `dmsetup table`.
fn table_tail(map: &str) -> String {
    let st = status_json(map);
    let t = st["table"].as_str().unwrap().split_whitespace().skip(8);
    t.collect::<Vec<_>>().join(" ")
}

fn lab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/luks2-persistent")
}

/// A fact the lab recorded (kernel.txt: "key: value").
fn lab_fact(key: &str) -> String {
    let txt = std::fs::read_to_string(lab().join("kernel.txt")).unwrap();
    txt.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in kernel.txt"))
        .trim()
        .to_string()
}

fn lab_json(step: &str, dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{step}.json"))).unwrap())
        .unwrap()
}

/// Unpacks the lab's images and JSON dumps into `dir`; returns the key file.
fn unpack_lab(dir: &Path) -> PathBuf {
    run_ok(
        std::process::Command::new("tar")
            .arg("-xJf")
            .arg(lab().join("images.tar.xz"))
            .arg("-C")
            .arg(dir),
        b"",
    );
    let key = dir.join("fixture.key");
    std::fs::write(&key, b"cryptblk-persistent-fixture-key").unwrap();
    key
}

/// The LUKS2 JSON metadata of `img` as cryptsetup reads it (cryptblk's own parser when
/// cryptsetup is skipped).
fn json_of(img: &Path) -> Value {
    let out = match cryptsetup() {
        Some(mut cs) => run_ok(cs.args(["luksDump", "--dump-json-metadata"]).arg(img), b""),
        None => run_ok(
            cryptblk()
                .args(["luksDump", "--dump-json-metadata"])
                .arg(img),
            b"",
        ),
    };
    serde_json::from_str(&out).unwrap()
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
    let options_with = |extra: &[&str]| probe_open(&img, &key, &map, &sock, extra, table_options);

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
    // cryptsetup 2.6's flags line, to the trailing space it leaves after all but the last.
    assert!(
        status
            .lines()
            .any(|l| l == "  flags:   discards no_read_workqueue "),
        "{status}"
    );
    assert!(status.contains("\n  type:    LUKS2\n"), "{status}");
    drop(served);
    // Given flags are added to the stored ones.
    assert_eq!(
        options_with(&["--perf-same_cpu_crypt"]),
        ["allow_discards", "same_cpu_crypt", "no_read_workqueue"]
    );
    assert_eq!(cs_epoch(&img), epoch + 1, "plain opens write nothing");

    // --persistent replaces the set: only the given flags are used and stored.
    assert_eq!(
        options_with(&["--persistent", "--perf-no_write_workqueue"]),
        ["no_write_workqueue"]
    );
    assert_eq!(cs_flags_line(&img), ["Flags:", "no-write-workqueue"]);

    // --persistent with no flag clears them (an empty array, as cryptsetup writes).
    assert_eq!(
        options_with(&["--persistent"]),
        ["no_read_workqueue", "no_write_workqueue"],
        "cryptblk's inline default"
    );
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
    let mode_with = |extra: &[&str]| probe_open(&img, &key, &map, &sock, extra, integrity_mode);

    assert_eq!(mode_with(&[]), "J");
    assert_eq!(mode_with(&["--persistent", "--integrity-no-journal"]), "D");
    if cryptsetup().is_some() {
        assert_eq!(cs_flags_line(&img), ["Flags:", "no-journal"]);
        cs_accepts_passphrase(&img, &key);
    }
    // A later open without the option: direct mode from the stored flag.
    assert_eq!(mode_with(&[]), "D");
    // cryptsetup refuses discards on integrity volumes; so does cryptblk, and stores nothing.
    let (out, _cleanup) = try_open(&img, &key, &map, &sock, STORE_DISCARDS);
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
    for kind in ["luks", "plain"] {
        let args = |c: &mut std::process::Command| {
            c.args(["open", "--type", kind, "--test-passphrase", "--persistent"])
                .arg("--key-file")
                .arg(&key)
                .arg(&img);
        };
        let mut theirs = cryptsetup().unwrap();
        args(&mut theirs);
        let theirs = run(&mut theirs, b"");
        let mut ours = cryptblk();
        args(&mut ours);
        let ours = run(&mut ours, b"");
        assert_eq!(ours.status.code(), theirs.status.code(), "{kind}");
        assert_eq!(ours.status.code(), Some(1), "{kind}");
        let msg = "Option --persistent is not allowed with --test-passphrase.";
        assert!(
            String::from_utf8_lossy(&theirs.stderr).contains(msg),
            "{kind}"
        );
        assert!(
            String::from_utf8_lossy(&ours.stderr).contains(msg),
            "{kind}"
        );
    }
    // The message cryptsetup printed in the lab too.
    let lab_err = std::fs::read_to_string(lab().join("test-passphrase.stderr")).unwrap();
    assert!(lab_err
        .ends_with("cryptsetup: Option --persistent is not allowed with --test-passphrase.\n"));
    assert_eq!(lab_fact("test_passphrase_persistent_rc"), "1");
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
    let (out, served) = try_open(&img, &key, &map, &sock, STORE_DISCARDS);
    // What cryptsetup 2.6.1 did in the lab: active, two messages, exit 0, header unchanged.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code().unwrap().to_string(),
        lab_fact("luks1_open_persistent_rc"),
        "{err}"
    );
    assert_eq!(lab_fact("luks1_active"), "yes");
    assert_eq!(
        err,
        std::fs::read_to_string(lab().join("luks1.stderr")).unwrap()
    );
    // The kernel got "1 allow_discards"; cryptblk adds its inline default.
    assert_eq!(lab_fact("luks1_open_persistent"), "1 allow_discards");
    assert_eq!(
        table_options(&map),
        ["allow_discards", "no_read_workqueue", "no_write_workqueue"]
    );
    drop(served);
    assert_eq!(lab_fact("luks1_header_unchanged"), "yes");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "LUKS1 header untouched"
    );
    cs_accepts_passphrase(&img, &key);
}

#[test]
fn flags_cryptsetup_stored_apply_as_the_kernel_got_them() {
    let dir = tempdir();
    let key = unpack_lab(dir.path());
    let img = dir.path().join("open-persistent.img");
    if let Some(mut cs) = cryptsetup() {
        let theirs = run_ok(cs.arg("luksDump").arg(&img), b"");
        assert_eq!(run_ok(cryptblk().arg("luksDump").arg(&img), b""), theirs);
        assert!(
            theirs.contains("Flags:       \tallow-discards same-cpu-crypt no-write-workqueue \n")
        );
    }
    let sock = dir.path().join("k.sock");
    let map = map_name("k");
    let tail_with =
        |img: &Path, extra: &[&str]| probe_open(img, &key, &map, &sock, extra, table_tail);
    // Stored perf flags: exactly the kernel's table (cryptsetup's meaning, no inline default).
    assert_eq!(
        tail_with(&img, &[]),
        lab_fact("plain_open_after_open_persistent")
    );
    let served = open_nbd(&img, &key, &map, &sock, &["--perf-submit_from_crypt_cpus"]);
    assert_eq!(
        table_tail(&map),
        lab_fact("extra_flag_open_after_open_persistent")
    );
    run_ok(
        cryptblk().args(["refresh", "--persistent", "--perf-no_read_workqueue", &map]),
        b"",
    );
    assert_eq!(table_tail(&map), lab_fact("refresh_persistent"));
    run_ok(cryptblk().args(["refresh", &map]), b"");
    assert_eq!(
        table_tail(&map),
        lab_fact("plain_refresh_after_refresh_persistent")
    );
    drop(served);
    // Same volume, same step: the same metadata as cryptsetup wrote (flags and all).
    assert_eq!(json_of(&img), lab_json("refresh-persistent", dir.path()));
    cs_accepts_passphrase_if_present(&img, &key);

    // From cryptsetup's refresh result back to its open --persistent result.
    let img = dir.path().join("refresh-persistent.img");
    assert_eq!(
        tail_with(
            &img,
            &[
                "--persistent",
                "--allow-discards",
                "--perf-same_cpu_crypt",
                "--perf-no_write_workqueue",
            ]
        ),
        lab_fact("open_persistent")
    );
    assert_eq!(json_of(&img), lab_json("open-persistent", dir.path()));
    // --persistent alone: cleared as cryptsetup clears ("flags": []). The kernel then got no
    // option at all; cryptblk serves its inline default (the one documented difference).
    let served = open_nbd(&img, &key, &map, &sock, &["--persistent"]);
    assert_eq!(lab_fact("open_persistent_no_flags"), "");
    assert_eq!(table_tail(&map), "2 no_read_workqueue no_write_workqueue");
    drop(served);
    assert_eq!(json_of(&img), lab_json("cleared", dir.path()));
}

#[test]
fn integrity_flags_and_refusals_match_the_lab() {
    let dir = tempdir();
    let key = unpack_lab(dir.path());
    let img = dir.path().join("integrity-no-journal.img");
    let sock = dir.path().join("n.sock");
    let map = map_name("n");
    let mode_with = |extra: &[&str]| probe_open(&img, &key, &map, &sock, extra, integrity_mode);
    // no-journal stored by cryptsetup: direct mode, as the kernel was given.
    assert_eq!(
        mode_with(&[]),
        lab_fact("integrity_plain_open_after_persistent_mode")
    );
    // Discards: refused with cryptsetup's message and status, nothing stored.
    let (out, served) = try_open(&img, &key, &map, &sock, STORE_DISCARDS);
    drop(served);
    assert_eq!(
        out.status.code().unwrap().to_string(),
        lab_fact("integrity_discards_rc")
    );
    let theirs = std::fs::read_to_string(lab().join("integrity-discards.stderr")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), theirs);
    assert_eq!(
        json_of(&img),
        lab_json("integrity-after-discards", dir.path())
    );
    // Clearing and storing again gives cryptsetup's metadata back.
    assert_eq!(
        mode_with(&["--persistent"]),
        lab_fact("integrity_plain_open_mode")
    );
    assert_eq!(
        mode_with(&["--persistent", "--integrity-no-journal"]),
        lab_fact("integrity_open_persistent_mode")
    );
    assert_eq!(json_of(&img), lab_json("integrity-no-journal", dir.path()));
}

/// Plain volumes store nothing, but their refresh also sets discards as given (the lab's
/// `refresh_persistent` step shows cryptsetup dropping a live `allow_discards`).
#[test]
fn plain_refresh_sets_discards_as_given() {
    let dir = tempdir();
    let key = dir.path().join("plain.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 4 << 20);
    let sock = dir.path().join("p.sock");
    let map = map_name("p");
    let plain = ["--type", "plain", "--persistent", "--allow-discards"];
    let served = open_nbd(&img, &key, &map, &sock, &plain);
    assert_eq!(
        table_options(&map),
        ["allow_discards", "no_read_workqueue", "no_write_workqueue"]
    );
    run_ok(
        cryptblk().args(["refresh", "--perf-same_cpu_crypt", &map]),
        b"",
    );
    assert_eq!(table_options(&map), ["same_cpu_crypt"]);
    run_ok(cryptblk().args(["refresh", "--allow-discards", &map]), b"");
    assert_eq!(
        table_options(&map),
        ["allow_discards", "no_read_workqueue", "no_write_workqueue"]
    );
    drop(served);
    assert!(
        std::fs::read(&img).unwrap().iter().all(|&b| b == 0),
        "nothing written to a plain device"
    );
}
