//! LUKS2 reencryptions in progress, made by cryptsetup 2.6 (`reencrypt --init-only`, and
//! reencryptions killed at their Nth write by strace's fault injection): cryptblk loads
//! them, dumps them byte for byte as cryptsetup does, refuses the header changes cryptsetup
//! refuses with its message, keeps everything a header backup, restore or erase must keep
//! so that cryptsetup can still finish the reencryption, and reads their plaintext back
//! (the hotzone recovered from its checksums or journal) as an independent model of
//! dm-crypt decrypts it from the original image.

mod common;
use common::reenc::*;
use common::*;
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"reencrypt-pass";
const MIB: usize = 1 << 20;

type Lab = KeyLab;

impl Lab {
    /// A LUKS2 image of `total_mib` MiB (2 MiB header, 512-byte sectors) made by cryptsetup.
    fn luks2(&self, name: &str, total_mib: usize) -> PathBuf {
        let img = self.path(name);
        write_pattern(&img, total_mib * MIB, 7);
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
                .arg(&self.key)
                .arg(&img),
            b"",
        );
        img
    }

    /// `cryptsetup reencrypt --force-offline-reencrypt` on `img` with `args`.
    fn cs_reencrypt(&self, img: &Path, args: &[&str]) -> std::process::Output {
        run(
            cryptsetup()
                .unwrap()
                .args(["reencrypt", "--force-offline-reencrypt", "--key-file"])
                .arg(&self.key)
                .args(FAST)
                .args(args)
                .arg(img),
            b"",
        )
    }

    /// A copy of `base` on which cryptsetup's reencryption was killed at its `n`th write.
    fn killed_at(&self, base: &Path, n: usize, args: &[&str]) -> PathBuf {
        let img = self.path(&format!("killed-{n}.img"));
        std::fs::copy(base, &img).unwrap();
        let inject = format!("inject=write:signal=KILL:when={n}");
        let out = run(
            tool("strace")
                .unwrap()
                .args(["-o", "/dev/null", "-e", "trace=write", "-e", &inject])
                .args(["cryptsetup", "--batch-mode", "reencrypt"])
                .args(["--force-offline-reencrypt", "--key-file"])
                .arg(&self.key)
                .args(FAST)
                .args(args)
                .arg(&img),
            b"",
        );
        // strace reports the kill through its own status; the image state is what counts.
        let _ = out;
        img
    }
}

fn dump_with(cmd: Option<std::process::Command>, img: &Path, json: bool) -> (bool, Vec<u8>) {
    let mut c = cmd.unwrap();
    c.arg("luksDump");
    if json {
        c.arg("--dump-json-metadata");
    }
    let out = run(c.arg(img), b"");
    (out.status.success(), out.stdout)
}

/// luksDump and --dump-json-metadata of both tools agree byte for byte (and both succeed
/// or both fail).
fn assert_same_dump(img: &Path, what: &str) -> bool {
    let mut ok = false;
    for json in [false, true] {
        let (cs_ok, cs) = dump_with(cryptsetup(), img, json);
        let (cb_ok, cb) = dump_with(Some(cryptblk()), img, json);
        assert_eq!(
            cs_ok, cb_ok,
            "{what}: luksDump status differs (json {json})"
        );
        assert!(
            cs == cb,
            "{what}: luksDump differs (json {json}):\n--- cryptsetup\n{}\n--- cryptblk\n{}",
            String::from_utf8_lossy(&cs),
            String::from_utf8_lossy(&cb)
        );
        ok = cs_ok;
    }
    ok
}

fn requirement_of(img: &Path) -> Option<String> {
    let (_, out) = dump_with(cryptsetup(), img, false);
    String::from_utf8_lossy(&out)
        .lines()
        .find_map(|l| l.strip_prefix("Requirements:\t"))
        .map(|r| r.trim().to_string())
}

#[test]
fn init_only_headers_of_every_kind_dump_like_cryptsetup() {
    assert!(
        cryptsetup().is_some(),
        "cryptsetup is required (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 6);
    for resilience in ["checksum", "journal", "none"] {
        let img = lab.path(&format!("{resilience}.img"));
        std::fs::copy(&base, &img).unwrap();
        let out = lab.cs_reencrypt(
            &img,
            &[
                "--init-only",
                "--resilience",
                resilience,
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
            ],
        );
        assert!(out.status.success(), "{out:?}");
        assert_eq!(requirement_of(&img).as_deref(), Some("online-reencrypt-v2"));
        assert!(assert_same_dump(&img, resilience));
    }

    // Encryption in place with a data shift (backward, linear segments, moved segment).
    let enc = lab.path("encrypt.img");
    write_pattern(&enc, 6 * MIB, 3);
    let out = run(
        cryptsetup()
            .unwrap()
            .args(["reencrypt", "--encrypt", "--type", "luks2", "--init-only"])
            .args(["--force-offline-reencrypt", "--reduce-device-size", "4M"])
            .args(FAST)
            .arg("--key-file")
            .arg(&lab.key)
            .arg(&enc),
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(assert_same_dump(&enc, "encrypt datashift"));

    // Decryption to a detached header (datashift-checksum, linear backup-final).
    let dec = lab.path("decrypt.img");
    std::fs::copy(&base, &dec).unwrap();
    let hdr = lab.path("decrypt.hdr");
    let out = lab.cs_reencrypt(
        &dec,
        &[
            "--decrypt",
            "--init-only",
            "--header",
            hdr.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(assert_same_dump(&hdr, "decrypt to a detached header"));
}

#[test]
fn killed_reencryptions_dump_like_cryptsetup_at_every_write() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "cryptsetup and strace are required (scripts/install-deps.sh installs them)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    // 3 MiB of data in 1 MiB hotzones. Seen with these options: writes 1-18 initialise
    // (the new keyslot, then header updates of six writes each: per copy the binary header,
    // the JSON area, the binary header again with its checksum); each hotzone then takes 14
    // (its checksums, the header naming it, its data, the header after it), so kills at
    // 19-25 leave hotzone 1 named in the header, 19-22 with its old data, 23-25 with its
    // new data; the last writes wipe the old keyslot and the resilience area.
    let args = ["--hotzone-size", "1M"];
    let mut mid = 0;
    for n in [
        1, 3, 9, 14, 15, 16, 19, 22, 23, 25, 28, 29, 36, 43, 57, 60, 64, 70,
    ] {
        let img = lab.killed_at(&base, n, &args);
        if requirement_of(&img).is_some() {
            mid += 1;
        }
        assert_same_dump(&img, &format!("killed at write {n}"));
        std::fs::remove_file(&img).unwrap();
    }
    assert!(mid >= 12, "only {mid} states were mid-reencryption");
}

#[test]
fn header_changes_are_refused_as_cryptsetup_refuses_them_and_erase_keeps_the_reencryption() {
    assert!(
        cryptsetup().is_some(),
        "cryptsetup is required (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    let out = lab.cs_reencrypt(&base, &["--init-only"]);
    assert!(out.status.success(), "{out:?}");

    // Changes cryptsetup refuses: same exit code, same message.
    let new_key = lab.path("new-key");
    std::fs::write(&new_key, b"other").unwrap();
    let refused: [&[&str]; 3] = [
        &["config", "--label", "x"],
        &["luksUUID", "--uuid", "11111111-2222-3333-4444-555555555555"],
        &[
            "luksAddKey",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ],
    ];
    for args in refused {
        let run_tool = |mut c: std::process::Command| {
            let img = lab.path("refused.img");
            std::fs::copy(&base, &img).unwrap();
            c.args(args).arg("--key-file").arg(&lab.key).arg(&img);
            if args[0] == "luksAddKey" {
                c.arg(&new_key);
            } else {
                c.arg("--batch-mode");
            }
            let out = run(&mut c, b"");
            let same = std::fs::read(&img).unwrap() == std::fs::read(&base).unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).to_string(),
                same,
            )
        };
        let (cs_code, cs_err, cs_same) = run_tool(cryptsetup().unwrap());
        let (cb_code, cb_err, cb_same) = run_tool(cryptblk());
        assert_eq!(cs_code, cb_code, "{args:?}: {cs_err} / {cb_err}");
        assert!(cs_same && cb_same, "{args:?} changed the image");
        let msg = "Operation incompatible with device marked for LUKS2 reencryption. Aborting.";
        assert!(cs_err.contains(msg), "{cs_err}");
        assert!(cb_err.contains(msg), "{cb_err}");
    }

    // luksErase: both tools drop the passphrase keyslots and keep the reencrypt keyslot.
    let erased = |c: std::process::Command, name: &str| {
        let img = lab.path(name);
        std::fs::copy(&base, &img).unwrap();
        let mut c = c;
        run_ok(c.args(["luksErase", "--batch-mode"]).arg(&img), b"");
        let (_, json) = dump_with(cryptsetup(), &img, true);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        (img, v)
    };
    let (cs_img, cs_json) = erased(cryptsetup().unwrap(), "cs-erased.img");
    let (cb_img, cb_json) = erased(cryptblk(), "cb-erased.img");
    assert_eq!(cs_json, cb_json);
    assert_eq!(cb_json["keyslots"].as_object().unwrap().len(), 1);
    assert_eq!(cb_json["keyslots"]["2"]["type"], "reencrypt");
    assert!(assert_same_dump(&cb_img, "erased by cryptblk"));
    assert!(assert_same_dump(&cs_img, "erased by cryptsetup"));
}

#[test]
fn a_killed_reencryption_survives_cryptblk_header_backup_and_restore() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "cryptsetup and strace are required (scripts/install-deps.sh installs them)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    let (_, plain_before) = plaintext_by_cryptsetup(&base, &lab.key);
    // Killed at the second hotzone's data write: the header names the hotzone.
    let img = lab.killed_at(&base, 36, &["--hotzone-size", "1M"]);
    let (_, json) = dump_with(cryptsetup(), &img, true);
    assert!(String::from_utf8_lossy(&json).contains("in-reencryption"));
    assert!(requirement_of(&img).is_some());

    let backup = lab.path("backup.bin");
    run_ok(
        cryptblk()
            .args(["luksHeaderBackup", "--header-backup-file"])
            .arg(&backup)
            .arg(&img),
        b"",
    );
    // Spoil the header, restore it with cryptblk, let cryptsetup finish the job.
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[..4096].fill(0);
    bytes[16384..16384 + 4096].fill(0);
    std::fs::write(&img, &bytes).unwrap();
    run_ok(
        cryptblk()
            .args(["luksHeaderRestore", "--batch-mode", "--header-backup-file"])
            .arg(&backup)
            .arg(&img),
        b"",
    );
    assert!(assert_same_dump(&img, "restored"));
    // cryptsetup wants its reencryption recovery (the hotzone) run by `repair` first.
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["repair", "--key-file"])
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    let out = lab.cs_reencrypt(&img, &["--resume-only"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(requirement_of(&img), None);
    let (_, plain_after) = plaintext_by_cryptsetup(&img, &lab.key);
    assert!(
        plain_before == plain_after,
        "data changed across the reencryption"
    );
}

#[test]
fn interrupted_reencryptions_read_back_their_plaintext() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "cryptsetup and strace are required (scripts/install-deps.sh installs them)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    let (_, plain) = plaintext_by_cryptsetup(&base, &lab.key);
    let hz = ["--hotzone-size", "1M"];
    let cases: [(&str, Vec<&str>, &[usize]); 4] = [
        ("checksum", hz.to_vec(), &[18, 19, 22, 23, 26, 37]),
        (
            "journal",
            [&hz[..], &["--resilience", "journal"]].concat(),
            &[19, 22, 23, 25],
        ),
        (
            "cipher change",
            [
                &hz[..],
                &["--cipher", "aes-cbc-essiv:sha256", "--key-size", "256"],
            ]
            .concat(),
            &[19, 22, 23, 25],
        ),
        (
            "sector size change",
            [&hz[..], &["--sector-size", "4096"]].concat(),
            &[19, 22, 23, 25],
        ),
    ];
    for (what, args, kills) in cases {
        let mut hotzones = 0;
        for &n in kills {
            let img = lab.killed_at(&base, n, &args);
            let (_, json) = dump_with(cryptsetup(), &img, true);
            if String::from_utf8_lossy(&json).contains("in-reencryption") {
                hotzones += 1;
            }
            let out = lab.path("plain.out");
            run_ok(
                cryptblk()
                    .args(["decrypt", "--key-file"])
                    .arg(&lab.key)
                    .arg(&img)
                    .arg(&out),
                b"",
            );
            let got = std::fs::read(&out).unwrap();
            assert!(
                got == plain,
                "{what}, killed at write {n}: plaintext differs ({} bytes read)",
                got.len()
            );
            std::fs::remove_file(&img).unwrap();
        }
        assert!(hotzones >= 3, "{what}: only {hotzones} cuts left a hotzone");
    }

    // A wrong passphrase is refused with cryptsetup's exit code.
    let img = lab.killed_at(&base, 22, &hz);
    let wrong = lab.path("wrong");
    std::fs::write(&wrong, b"wrong").unwrap();
    let out = run(
        cryptblk()
            .args(["decrypt", "--key-file"])
            .arg(&wrong)
            .arg(&img)
            .arg(lab.path("never.out")),
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Activation recovers a cut hotzone first (reencrypt_online.rs serves such volumes);
    // read-only it cannot, which is refused in one line with nothing written, as
    // cryptsetup asks for repair. The passphrase test passes, as in cryptsetup.
    let before = std::fs::read(&img).unwrap();
    let out = run(
        cryptblk()
            .args(["open", "--readonly", "--key-file"])
            .arg(&lab.key)
            .arg(&img)
            .args(["reenc-never", "--nbd"])
            .arg(lab.path("never.sock")),
        b"",
    );
    if out.status.success() {
        run(cryptblk().args(["close", "reenc-never"]), b"");
    }
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Device requires reencryption recovery. Run repair first."),
        "{err}"
    );
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused open wrote"
    );
    for mut c in [cryptblk(), cryptsetup().unwrap()] {
        run_ok(
            c.args(["open", "--test-passphrase", "--key-file"])
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
    }
}

#[test]
fn repair_recovers_a_cut_step_as_cryptsetup_repair_does_and_cryptsetup_resumes() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "cryptsetup and strace are required (scripts/install-deps.sh installs them)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    let (_, plain) = plaintext_by_cryptsetup(&base, &lab.key);
    let hz = ["--hotzone-size", "1M"];
    let journal = [&hz[..], &["--resilience", "journal"]].concat();
    // Hotzone 1 with old data (22) and new data (23), checksum and journal.
    for (what, args, n) in [
        ("checksum old", hz.to_vec(), 22),
        ("checksum new", hz.to_vec(), 23),
        ("journal new", journal.clone(), 23),
    ] {
        let img = lab.killed_at(&base, n, &args);
        let theirs = lab.path("theirs.img");
        std::fs::copy(&img, &theirs).unwrap();
        run_ok(
            cryptsetup()
                .unwrap()
                .args(["repair", "--key-file"])
                .arg(&lab.key)
                .arg(&theirs),
            b"",
        );
        run_ok(
            cryptblk()
                .args(["repair", "--batch-mode", "--key-file"])
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
        let (_, ours_json) = dump_with(cryptsetup(), &img, true);
        let (_, theirs_json) = dump_with(cryptsetup(), &theirs, true);
        assert!(
            ours_json == theirs_json,
            "{what}: metadata after repair differs"
        );
        let (ours, theirs_data) = (
            std::fs::read(&img).unwrap(),
            std::fs::read(&theirs).unwrap(),
        );
        assert!(
            ours[2 * MIB..] == theirs_data[2 * MIB..],
            "{what}: data after repair differs"
        );
        let out = lab.cs_reencrypt(&img, &["--resume-only"]);
        assert!(out.status.success(), "{what}: {out:?}");
        assert_eq!(requirement_of(&img), None, "{what}");
        let (_, after) = plaintext_by_cryptsetup(&img, &lab.key);
        assert!(after == plain, "{what}: plaintext changed");
    }

    // The last hotzone: cryptblk's repair, as cryptsetup's, also finishes the reencryption
    // (in one header write, so no header names only new data with the requirement set).
    let img = lab.killed_at(&base, 51, &hz);
    let (_, json) = dump_with(cryptsetup(), &img, true);
    assert!(String::from_utf8_lossy(&json).contains("in-reencryption"));
    run_ok(
        cryptblk()
            .args(["repair", "--batch-mode", "--key-file"])
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    assert_eq!(requirement_of(&img), None);
    let (_, after) = plaintext_by_cryptsetup(&img, &lab.key);
    assert!(after == plain, "last hotzone: plaintext changed");
}

#[test]
fn cryptblk_repair_cut_at_every_write_is_recovered_again() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "cryptsetup and strace are required (scripts/install-deps.sh installs them)"
    );
    let lab = Lab::new(PASS);
    let base = lab.luks2("base.img", 5);
    let (_, plain) = plaintext_by_cryptsetup(&base, &lab.key);
    // Hotzone 1 cut with its new data written: the recovery rewrites it.
    let cut = lab.killed_at(&base, 23, &["--hotzone-size", "1M"]);
    let img = lab.path("cut-repair.img");
    // An uncut repair, traced, tells how many writes it makes (the hotzone, then the two
    // header copies: a sound header is not rewritten first); each of them is cut below.
    std::fs::copy(&cut, &img).unwrap();
    let trace = lab.path("repair.trace");
    run_ok(
        tool("strace")
            .unwrap()
            .args(["-f", "-e", "trace=pwrite64", "-o"])
            .arg(&trace)
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .args(["repair", "--batch-mode", "--key-file"])
            .arg(&lab.key)
            .arg(&img),
        b"",
    );
    let writes = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|l| l.contains("pwrite64(") && !l.contains("= -1"))
        .count();
    assert!(
        writes >= 3,
        "repair writes the hotzone and both header copies: {writes} writes"
    );
    for n in 1..=writes {
        std::fs::copy(&cut, &img).unwrap();
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
                .args(["repair", "--batch-mode", "--key-file"])
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
        assert!(!out.status.success(), "write {n} was not cut");
        let read = lab.path("read.out");
        run_ok(
            cryptblk()
                .args(["decrypt", "--key-file"])
                .arg(&lab.key)
                .arg(&img)
                .arg(&read),
            b"",
        );
        assert!(
            std::fs::read(&read).unwrap() == plain,
            "cut at write {n}: read differs"
        );
        run_ok(
            cryptblk()
                .args(["repair", "--batch-mode", "--key-file"])
                .arg(&lab.key)
                .arg(&img),
            b"",
        );
        let out = lab.cs_reencrypt(&img, &["--resume-only"]);
        assert!(out.status.success(), "cut at write {n}: {out:?}");
        let (_, after) = plaintext_by_cryptsetup(&img, &lab.key);
        assert!(after == plain, "cut at write {n}: plaintext lost");
    }
}
