//! `cryptblk integrity format|open|close|status` against integritysetup and the kernel:
//!
//! - devices formatted by cryptblk are read by the real `integritysetup dump` (it works on
//!   plain files here), which must agree with cryptblk on every superblock field;
//! - cryptsetup's integrity-compat-test rows (vectors.md §2A): exposed size and the sha256
//!   of the zero-wiped device, per hash, tag size, sector size and key;
//! - images formatted by `integritysetup` + kernel dm-integrity in the lab (dm crate
//!   fixtures; `integritysetup format` itself needs device-mapper, even with `--no-wipe`)
//!   open over NBD, read back the kernel-written pattern, take fio writes with verification,
//!   and verify again after close and reopen;
//! - `status --json` fields and the mismatch counter after a flipped bit;
//! - bad input fails with a message naming the problem and the exit code integritysetup
//!   gives for the same input.

mod common;
use common::*;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn integritysetup_dump(img: &Path) -> Option<BTreeMap<String, String>> {
    let mut c = tool("integritysetup")?;
    Some(dump_fields(&run_ok(c.arg("dump").arg(img), b"")))
}

fn format(img: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_ok(
        cryptblk()
            .args(["integrity", "format", "--batch-mode", "--json"])
            .args(args)
            .arg(img),
        b"",
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("format --json: {e}: {out}"))
}

fn zero_file(path: &Path, len: u64) {
    sparse_file(path, len);
}

#[test]
fn integritysetup_dump_agrees_on_every_field() {
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, [0x42u8; 64]).unwrap();
    let k = key.to_str().unwrap();
    // (arguments, expected tag size, sector size, flags)
    let cases: Vec<(Vec<&str>, &str, &str, &str)> = vec![
        (vec![], "4", "512", "fix_padding fix_hmac"),
        (
            vec!["--integrity", "sha256", "--sector-size", "4096"],
            "32",
            "4096",
            "fix_padding fix_hmac",
        ),
        (
            vec!["--integrity", "xxhash64", "--journal-size", "1048576"],
            "8",
            "512",
            "fix_padding fix_hmac",
        ),
        (
            vec![
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                k,
                "--integrity-key-size",
                "32",
                "--interleave-sectors",
                "8192",
            ],
            "32",
            "512",
            "fix_padding fix_hmac",
        ),
        (
            vec![
                "--integrity",
                "sha1",
                "--tag-size",
                "16",
                "--integrity-legacy-padding",
                "--integrity-legacy-hmac",
                "--no-wipe",
            ],
            "16",
            "512",
            "",
        ),
        (
            vec!["--integrity", "crc32", "--integrity-bitmap-mode"],
            "4",
            "512",
            "fix_padding fix_hmac",
        ),
    ];
    for (args, tag, sector, flags) in cases {
        let img = dir.path().join("dev.img");
        zero_file(&img, 24 << 20);
        let made = format(&img, &args);
        let Some(theirs) = integritysetup_dump(&img) else {
            return;
        };
        let ours = dump_fields(&run_ok(
            cryptblk().args(["integrity", "dump"]).arg(&img),
            b"",
        ));
        assert_eq!(
            ours, theirs,
            "{args:?}: cryptblk and integritysetup dump differ"
        );
        assert_eq!(theirs["integrity_tag_size"], tag, "{args:?}");
        assert_eq!(theirs["sector_size"], sector, "{args:?}");
        assert_eq!(theirs["flags"], flags, "{args:?}");
        assert_eq!(
            theirs["provided_data_sectors"],
            made["provided_data_sectors"].to_string(),
            "{args:?}"
        );
        assert_eq!(
            theirs["journal_sections"],
            made["journal_sections"].to_string(),
            "{args:?}"
        );
        if args.contains(&"--interleave-sectors") {
            assert_eq!(theirs["log2_interleave_sectors"], "13");
        }
        if args.contains(&"--no-wipe") {
            assert_eq!(made["wiped_bytes"], 0);
        } else {
            assert_eq!(
                made["wiped_bytes"].as_u64().unwrap(),
                made["provided_data_sectors"].as_u64().unwrap() * 512
            );
        }
    }
}

fn vectors_md() -> PathBuf {
    let base = std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/cryptsetup-tests"
            ))
        });
    base.join("vectors.md")
}

/// One non-inline row of vectors.md §2A.
struct Row {
    alg: String,
    tag_size: u32,
    sector: u32,
    key_size: Option<u32>,
    sha256: String,
    sectors: u64,
}

fn section_2a() -> Vec<Row> {
    let text = std::fs::read_to_string(vectors_md())
        .unwrap_or_else(|e| panic!("{}: {e}", vectors_md().display()));
    let start = text
        .find("### A. integritysetup")
        .expect("vectors.md has §2A");
    let section = &text[start
        ..text[start..]
            .find("### B.")
            .map_or(text.len(), |e| start + e)];
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")) {
        let c: Vec<&str> = line.split('|').map(str::trim).collect();
        // | alg | dm name | tag | reported | sector | extra | sha | sectors |
        if c.len() < 9 || c[1] == "--integrity" || c[1].starts_with("---") {
            continue;
        }
        let extra = c[6];
        if extra.contains("inline") {
            continue; // needs an integrity device under the integrity device
        }
        let key_size = extra
            .strip_prefix("$KEY_FILE ")
            .map(|k| k.trim().parse().unwrap());
        rows.push(Row {
            alg: c[1].to_string(),
            tag_size: c[3].parse().unwrap(),
            sector: c[5].parse().unwrap(),
            key_size,
            sha256: c[7].trim_matches('`').to_string(),
            sectors: c[8].parse().unwrap(),
        });
    }
    rows
}

#[test]
fn cryptsetup_integrity_compat_rows() {
    let rows = section_2a();
    assert!(rows.len() >= 10, "only {} rows parsed", rows.len());
    let dir = tempdir();
    let key = dir.path().join("key");
    let key_bytes: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    std::fs::write(&key, &key_bytes).unwrap();
    for r in rows {
        let img = dir.path().join("dev.img");
        // integrity-compat-test: 32 MiB of zeros.
        zero_file(&img, 32 << 20);
        let tag = r.tag_size.to_string();
        let sector = r.sector.to_string();
        let ks = r.key_size.map(|k| k.to_string());
        let mut args = vec![
            "--integrity-legacy-padding",
            "--integrity",
            &r.alg,
            "--sector-size",
            &sector,
        ];
        if r.tag_size != 0 {
            args.extend(["--tag-size", &tag]);
        }
        if let Some(ks) = &ks {
            args.extend(["--integrity-key-file", key.to_str().unwrap()]);
            args.extend(["--integrity-key-size", ks]);
        }
        let made = format(&img, &args);
        let what = format!("{} tag {} sector {}", r.alg, r.tag_size, r.sector);
        assert_eq!(
            made["provided_data_sectors"].as_u64(),
            Some(r.sectors),
            "{what}: exposed size"
        );
        if let Some(theirs) = integritysetup_dump(&img) {
            assert_eq!(
                theirs["provided_data_sectors"],
                r.sectors.to_string(),
                "{what}"
            );
        }
        // Read the whole exposed device through the integrity target (every tag checked)
        // and hash it: cryptsetup's expected sha256 of the mapped device.
        let dev: Arc<dyn BlockDevice> =
            Arc::new(FileBacking::open(&img, FileOptions::default()).unwrap());
        let mut cfg = IntegrityConfig::new(
            IntegrityMode::Journal,
            &cryptblk_dm::targets::integrity::hash::kernel_name(&r.alg),
        );
        cfg.block_size = r.sector;
        cfg.tag_size = (r.tag_size != 0).then_some(r.tag_size);
        cfg.internal_hash_key = r
            .key_size
            .map(|k| cryptblk_cipher::SecretBytes::from_slice(&key_bytes[..k as usize]));
        let t = IntegrityTarget::open(dev, "dev", None, cfg, None).unwrap();
        let mut data = vec![0u8; t.size() as usize];
        t.read_at(0, &mut data)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            hex::encode(HashAlgorithm::Sha256.digest(&[&data])),
            r.sha256,
            "{what}: sha256 of the mapped device"
        );
    }
}

fn dm_fixture(name: &str, dir: &Path) -> PathBuf {
    let src = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dm/tests/integrity_fixtures"
    ))
    .join(format!("{name}.img.xz"));
    let dst = dir.join(format!("{name}.img"));
    unxz(&src, &dst);
    dst
}

fn fio_job(sock: &Path, verify_only: bool) -> Command {
    let mut fio = Command::new("fio");
    fio.args([
        "--name=int",
        "--ioengine=nbd",
        &format!("--uri={}", nbd_uri(sock)),
        "--rw=write",
        "--bs=4k",
        "--offset=1M",
        "--size=1M",
        "--iodepth=4",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        "--output-format=json",
    ]);
    if verify_only {
        fio.arg("--verify_only=1");
    }
    fio
}

/// (image, open arguments, what the kernel wrote at offset 0 if anything)
type Case<'a> = (PathBuf, Vec<&'a str>, Option<Vec<u8>>);

#[test]
fn kernel_and_cryptblk_devices_serve_over_nbd_with_fio_verify() {
    let (Some(_), Some(_)) = (tool("fio"), tool("nbdcopy")) else {
        return;
    };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let k = key.to_str().unwrap();
    let own = dir.path().join("own.img");
    zero_file(&own, 16 << 20);
    format(
        &own,
        &[
            "--integrity",
            "hmac-sha256",
            "--integrity-key-file",
            k,
            "--integrity-key-size",
            "32",
        ],
    );
    let keyed = [
        "--integrity",
        "hmac-sha256",
        "--integrity-key-file",
        k,
        "--integrity-key-size",
        "32",
    ];
    // lab-guest.sh wrote the pattern into k-sha256, then its last 8 KiB over its first.
    let mut tail_over_head = lab_pattern();
    let tail = tail_over_head[(256 << 10) - 8192..].to_vec();
    tail_over_head[..8192].copy_from_slice(&tail);
    // (image, open arguments, what the kernel wrote at 0)
    let cases: Vec<Case> = vec![
        (
            dm_fixture("h-xxhash64", dir.path()),
            vec!["--integrity", "xxhash64"],
            Some(lab_pattern()),
        ),
        (
            dm_fixture("k-sha256", dir.path()),
            vec!["--integrity", "sha256"],
            Some(tail_over_head),
        ),
        (own.clone(), keyed.to_vec(), None),
        (
            own.clone(),
            [
                &keyed[..],
                &[
                    "--integrity-bitmap-mode",
                    "--bitmap-sectors-per-bit",
                    "65536",
                    "--bitmap-flush-time",
                    "500",
                ],
            ]
            .concat(),
            None,
        ),
        (
            own,
            [&keyed[..], &["--integrity-no-journal"]].concat(),
            None,
        ),
    ];
    let sock = dir.path().join("i.sock");
    for (n, (img, args, pattern)) in cases.into_iter().enumerate() {
        let name = format!("t-int-{n}");
        {
            let _s = integrity_open_nbd(&img, &name, &sock, &args);
            if let Some(want) = &pattern {
                let out = dir.path().join("out.bin");
                run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
                let got = std::fs::read(&out).unwrap();
                assert!(
                    got[..256 << 10] == want[..],
                    "{name}: kernel-written pattern differs"
                );
            }
            let mut fio = fio_job(&sock, false);
            run_ok(fio.current_dir(dir.path()), b"");
        }
        // Closed (journal committed); the superblock is still one integritysetup reads.
        if let Some(d) = integritysetup_dump(&img) {
            assert!(d.contains_key("provided_data_sectors"), "{name}");
        }
        let _s = integrity_open_nbd(&img, &name, &sock, &args);
        let mut fio = fio_job(&sock, true);
        let out = run_ok(fio.current_dir(dir.path()), b"");
        assert!(out.contains("\"error\" : 0"), "{name}: {out}");
        let st: serde_json::Value = serde_json::from_str(
            run_ok(
                cryptblk().args(["integrity", "status", "--json", &name]),
                b"",
            )
            .trim(),
        )
        .unwrap();
        assert_eq!(st["failures"], 0, "{name}: {st}");
    }
}

#[test]
fn status_reports_fields_and_counts_mismatches() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let img = dir.path().join("s.img");
    zero_file(&img, 16 << 20);
    let made = format(&img, &["--journal-size", "262144"]);
    // Flip one bit in the data of logical sector 100.
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileBacking::open(&img, FileOptions::default()).unwrap());
    let phys = IntegrityTarget::open(
        dev,
        "s",
        None,
        IntegrityConfig::new(IntegrityMode::Recovery, "crc32c"),
        None,
    )
    .unwrap()
    .layout()
    .data_sector(100)
        * 512;
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x01], phys + 3).unwrap();
    drop(f);

    let sock = dir.path().join("s.sock");
    let _s = integrity_open_nbd(&img, "t-int-st", &sock, &[]);
    let st = |json: bool| {
        let mut c = cryptblk();
        c.args(["integrity", "status", "t-int-st"]);
        if json {
            c.arg("--json");
        }
        run_ok(&mut c, b"")
    };
    let v: serde_json::Value = serde_json::from_str(st(true).trim()).unwrap();
    assert_eq!(v["type"], "INTEGRITY");
    assert_eq!(v["tag_size"], 4);
    assert_eq!(v["integrity"], "crc32c");
    assert_eq!(v["sector_size"], 512);
    assert_eq!(v["interleave_sectors"], 32768);
    assert_eq!(v["size"], made["provided_data_sectors"]);
    assert_eq!(v["mode"], "read/write");
    assert_eq!(v["journal_mode"], "journal");
    // The journal is whole sections: at most the requested size (the kernel reports
    // the same rounded figure).
    let journal = v["journal_size"].as_u64().unwrap();
    assert!(
        journal > 0 && journal <= 262144 && journal.is_multiple_of(512),
        "{v}"
    );
    assert_eq!(v["journal_watermark"], 50);
    assert_eq!(v["journal_commit_time"], 10000);
    assert_eq!(v["failures"], 0);
    assert!(
        std::fs::canonicalize(&img).unwrap() == Path::new(v["device"].as_str().unwrap()),
        "{v}"
    );

    // Reading the device hits the flipped block: the client sees an error, the counter one.
    let out = run(
        Command::new("nbdcopy")
            .arg(nbd_uri(&sock))
            .arg(dir.path().join("x.bin")),
        b"",
    );
    assert!(!out.status.success(), "reading a corrupted block succeeded");
    let v: serde_json::Value = serde_json::from_str(st(true).trim()).unwrap();
    assert!(v["failures"].as_u64().unwrap() >= 1, "{v}");
    let text = st(false);
    assert!(
        text.starts_with(&format!("{} is active.\n", sock.display())),
        "{text}"
    );
    for line in [
        "  type:    INTEGRITY\n",
        "  tag size: 4\n",
        "  integrity: crc32c\n",
        "  sector size:  512 bytes\n",
        "  interleave sectors: 32768\n",
        "  mode:    read/write\n",
        "  journal watermark: 50%\n",
        "  journal commit time: 10000 ms\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("  failures: 0\n"), "{text}");
    assert!(
        text.contains(&format!("  journal size: {journal} bytes\n")),
        "{text}"
    );
    drop(_s);

    // Recovery mode (-R): no tag checks, read-only; the corrupted block reads.
    let _r = integrity_open_nbd(&img, "t-int-rec", &sock, &["--integrity-recovery-mode"]);
    run_ok(
        Command::new("nbdcopy")
            .arg(nbd_uri(&sock))
            .arg(dir.path().join("y.bin")),
        b"",
    );
    let v: serde_json::Value = serde_json::from_str(
        run_ok(
            cryptblk().args(["integrity", "status", "--json", "t-int-rec"]),
            b"",
        )
        .trim(),
    )
    .unwrap();
    assert_eq!(v["journal_mode"], "recovery", "{v}");
    assert_eq!(v["recovery"], true);
    assert_eq!(v["mode"], "readonly");
}

#[test]
fn bad_input_names_the_problem_with_integritysetups_exit_code() {
    let Some(_) = tool("integritysetup") else {
        return;
    };
    let dir = tempdir();
    let img = dir.path().join("b.img");
    zero_file(&img, 8 << 20);
    let key = dir.path().join("key");
    std::fs::write(&key, [1u8; 32]).unwrap();
    let k = key.to_str().unwrap();
    let missing = dir.path().join("missing.img");
    let m = missing.to_str().unwrap();
    let i = img.to_str().unwrap();
    // (arguments after the action, words the message must contain)
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec!["format", "--integrity", "nosuchhash", i],
            &["nosuchhash"],
        ),
        (
            vec![
                "format",
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                k,
                i,
            ],
            &["key file", "key size"],
        ),
        (
            vec![
                "format",
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                k,
                "--integrity-key-size",
                "5000",
                i,
            ],
            &["5000", "4096"],
        ),
        (
            vec![
                "format",
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                k,
                "--integrity-key-size",
                "64",
                i,
            ],
            &["64", "keyfile"],
        ),
        (
            vec!["open", i, "t-int-bad"],
            &["not a valid INTEGRITY device"],
        ),
        (
            vec!["open", "--integrity", "nosuchhash", i, "t-int-bad"],
            &["nosuchhash"],
        ),
        (vec!["format", m], &["missing.img"]),
    ];
    // Not active: cryptsetup's ENODEV, exit 4 (integritysetup here cannot even reach
    // device-mapper, so its own exit code says nothing).
    let out = run(
        cryptblk().args(["integrity", "status", "t-int-nosuch"]),
        b"",
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("t-int-nosuch"));
    for (args, words) in cases {
        let ours = run(
            cryptblk()
                .args(["integrity", "--batch-mode"])
                .args(&args)
                .args(if args[0] == "open" {
                    vec!["--nbd", "/nonexistent/x.sock"]
                } else {
                    vec![]
                }),
            b"",
        );
        let theirs = run(
            Command::new("integritysetup")
                .arg("--batch-mode")
                .args(&args),
            b"",
        );
        let msg = String::from_utf8_lossy(&ours.stderr);
        assert!(!ours.status.success(), "{args:?} succeeded");
        for w in words {
            assert!(msg.contains(w), "{args:?}: message {msg:?} lacks {w:?}");
        }
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{args:?}: exit code differs from integritysetup's ({})",
            String::from_utf8_lossy(&theirs.stderr)
        );
    }
}

/// `veritysetup dump` as field -> value (`Salt:` etc., tabs and spaces trimmed).
fn verity_dump_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

#[test]
fn verity_status_and_close_on_a_veritysetup_tree() {
    let (Some(mut vs), Some(_)) = (tool("veritysetup"), tool("nbdcopy")) else {
        return;
    };
    let dir = tempdir();
    let data = dir.path().join("data.img");
    let want = write_pattern(&data, 4 << 20, 9);
    let hash = dir.path().join("data.hash");
    let out = run_ok(vs.arg("format").arg(&data).arg(&hash), b"");
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim()
        .to_string();
    let dump = verity_dump_fields(&run_ok(
        Command::new("veritysetup").arg("dump").arg(&hash),
        b"",
    ));
    let sock = dir.path().join("v.sock");
    run_ok(
        cryptblk()
            .args(["verity", "open"])
            .arg(&data)
            .arg("t-ver-st")
            .arg(&hash)
            .arg(&root)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let served = Served::integrity("t-ver-st");
    let copy = dir.path().join("copy.bin");
    run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&copy), b"");
    assert!(std::fs::read(&copy).unwrap() == want, "verity read differs");
    let v: serde_json::Value = serde_json::from_str(
        run_ok(
            cryptblk().args(["verity", "status", "--json", "t-ver-st"]),
            b"",
        )
        .trim(),
    )
    .unwrap();
    assert_eq!(v["type"], "VERITY");
    assert_eq!(v["status"], "verified");
    assert_eq!(v["root_hash"], root);
    assert_eq!(v["salt"], dump["Salt"], "{v}");
    assert_eq!(v["hash_name"], dump["Hash algorithm"]);
    assert_eq!(v["hash_type"].to_string(), dump["Hash type"]);
    assert_eq!(v["data_block"].to_string(), dump["Data block size"]);
    assert_eq!(v["hash_block"].to_string(), dump["Hash block size"]);
    assert_eq!(
        v["size"].as_u64().unwrap() / 8,
        dump["Data blocks"].parse::<u64>().unwrap(),
        "size in sectors vs data blocks"
    );
    assert_eq!(v["mode"], "readonly");
    let text = run_ok(cryptblk().args(["verity", "status", "t-ver-st"]), b"");
    assert!(
        text.starts_with(&format!("{} is active.\n", sock.display())),
        "{text}"
    );
    assert!(text.contains(&format!("  root hash:   {root}\n")), "{text}");
    // close ends the daemon: status then reports the device as inactive (exit 4).
    run_ok(cryptblk().args(["verity", "close", "t-ver-st"]), b"");
    std::mem::forget(served);
    let out = run(cryptblk().args(["verity", "status", "t-ver-st"]), b"");
    assert_eq!(out.status.code(), Some(4));
}
