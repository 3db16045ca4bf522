//! dm-verity FEC (`--fec-device`, `--fec-roots`, `--fec-offset`) against the real
//! veritysetup: the parity cryptblk writes is byte-identical to veritysetup's, each tool
//! corrects the other's volumes within the code's capacity and fails beyond it as
//! veritysetup fails, and overlapping data/hash/FEC areas are refused with veritysetup's
//! messages and exit codes.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const SALT: &str = "9e7457222290f1bac0d42ad2de2d602a87bb871c22ab70ca040bad450578a436";
const UUID: &str = "a60c98d2-ae9b-4865-bfcb-b4e3ace11033";

fn root_hash(format_output: &str) -> String {
    format_output
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .expect("format prints the root hash")
        .trim()
        .to_string()
}

fn veritysetup() -> Command {
    tool("veritysetup").expect("veritysetup is required")
}

fn ours() -> Command {
    let mut c = cryptblk();
    c.arg("verity");
    c
}

/// Runs `format DATA HASH ARGS` with `cmd` (`veritysetup` or `cryptblk verity`); stdout.
fn format(mut cmd: Command, data: &Path, hash: &Path, args: &[String]) -> String {
    run_ok(cmd.arg("format").arg(data).arg(hash).args(args), b"")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x55;
    f.write_all_at(&b, at).unwrap();
}

/// One layout both tools format from identical inputs; `files` are compared byte for byte.
struct Case {
    name: &'static str,
    block: u64,
    data_blocks: u64,
    /// Size of the data image; larger than the data when hash/FEC share it.
    image: u64,
    hash_same: bool,
    fec_same: bool,
    extra: Vec<String>,
}

fn run_case(c: &Case, dir: &Path, tool: &str) -> (String, Vec<Vec<u8>>) {
    let d = dir.join(format!("{}-{tool}", c.name));
    std::fs::create_dir_all(&d).unwrap();
    let data = d.join("data");
    write_pattern(&data, (c.data_blocks * c.block) as usize, 77);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(c.image)
        .unwrap();
    let hash = if c.hash_same {
        data.clone()
    } else {
        d.join("hash")
    };
    let fec = if c.fec_same {
        data.clone()
    } else {
        d.join("fec")
    };
    let mut a = c.extra.clone();
    let bs = c.block.to_string();
    a.extend(args(&[
        "--data-block-size",
        &bs,
        "--hash-block-size",
        &bs,
        "--salt",
        SALT,
        "--uuid",
        UUID,
    ]));
    a.push(format!("--data-blocks={}", c.data_blocks));
    a.push(format!("--fec-device={}", fec.display()));
    let cmd = if tool == "vs" { veritysetup() } else { ours() };
    let out = format(cmd, &data, &hash, &a).replace(&d.display().to_string(), "DIR");
    let mut files: Vec<PathBuf> = vec![data.clone()];
    if !c.hash_same {
        files.push(hash);
    }
    if !c.fec_same {
        files.push(fec);
    }
    (
        out,
        files.iter().map(|f| std::fs::read(f).unwrap()).collect(),
    )
}

#[test]
fn fec_parity_is_byte_identical_to_veritysetup() {
    let dir = tempdir();
    let cases = vec![
        Case {
            name: "separate-roots2",
            block: 4096,
            data_blocks: 40,
            image: 40 * 4096,
            hash_same: false,
            fec_same: false,
            extra: args(&["--fec-roots", "2"]),
        },
        Case {
            name: "separate-roots7-offset",
            block: 4096,
            data_blocks: 300,
            image: 300 * 4096,
            hash_same: false,
            fec_same: false,
            extra: args(&["--fec-roots", "7", "--fec-offset", "8192"]),
        },
        Case {
            name: "roots24-512-nosb",
            block: 512,
            data_blocks: 600,
            image: 600 * 512,
            hash_same: false,
            fec_same: false,
            extra: args(&["--fec-roots", "24", "--no-superblock"]),
        },
        Case {
            name: "hash-in-data-file",
            block: 4096,
            data_blocks: 30,
            image: 40 * 4096,
            hash_same: true,
            fec_same: false,
            extra: args(&["--fec-roots", "5", "--hash-offset", "122880"]),
        },
        Case {
            name: "one-device",
            block: 4096,
            data_blocks: 30,
            image: 150 * 4096,
            hash_same: true,
            fec_same: true,
            extra: args(&[
                "--fec-roots",
                "3",
                "--hash-offset",
                "163840",
                "--fec-offset",
                "409600",
            ]),
        },
    ];
    for c in &cases {
        let (vs_out, vs_files) = run_case(c, dir.path(), "vs");
        let (cb_out, cb_files) = run_case(c, dir.path(), "cb");
        assert_eq!(
            cb_out.replace("cb/", "X/").replace("-cb", "-X"),
            vs_out.replace("vs/", "X/").replace("-vs", "-X"),
            "{}: format output differs",
            c.name
        );
        for (i, (a, b)) in vs_files.iter().zip(&cb_files).enumerate() {
            assert!(a == b, "{}: file {i} differs from veritysetup's", c.name);
        }
    }
}

/// A 4 KiB-block volume with separate hash and FEC files made by `maker`; its root hash.
fn volume(maker: &str, dir: &Path, roots: &str) -> (PathBuf, PathBuf, PathBuf, String) {
    let data = dir.join(format!("{maker}.data"));
    let hash = dir.join(format!("{maker}.hash"));
    let fec = dir.join(format!("{maker}.fec"));
    write_pattern(&data, 64 * 4096, 5);
    let cmd = if maker == "vs" { veritysetup() } else { ours() };
    let out = format(
        cmd,
        &data,
        &hash,
        &[
            format!("--fec-device={}", fec.display()),
            format!("--fec-roots={roots}"),
            format!("--salt={SALT}"),
        ],
    );
    (data, hash, fec, root_hash(&out))
}

fn verify(mut cmd: Command, v: &(PathBuf, PathBuf, PathBuf, String), roots: &str) -> (i32, String) {
    code(
        cmd.arg("verify")
            .arg(&v.0)
            .arg(&v.1)
            .arg(&v.3)
            .arg(format!("--fec-device={}", v.2.display()))
            .arg(format!("--fec-roots={roots}")),
    )
}

#[test]
fn each_tool_corrects_the_others_fec_within_capacity_only() {
    let dir = tempdir();
    for maker in ["vs", "cb"] {
        // roots 4 corrects 2 bytes per codeword; one round, so codeword b holds byte b of
        // every block: corrupted bytes at distinct in-block offsets are one error each.
        let v = volume(maker, dir.path(), "4");
        let pristine = std::fs::read(&v.0).unwrap();
        for at in [5u64, 4096 * 3 + 17, 4096 * 10 + 200, 4096 * 63 + 4095] {
            flip(&v.0, at);
        }
        // The tree alone refuses the corrupted data.
        let (rc, _) = code(ours().arg("verify").arg(&v.0).arg(&v.1).arg(&v.3));
        assert_ne!(rc, 0, "{maker}: corruption not seen without FEC");
        let (vs_rc, vs_err) = verify(veritysetup(), &v, "4");
        assert_eq!(vs_rc, 0, "{maker}: veritysetup failed: {vs_err}");
        assert!(vs_err.contains("Found 4 repairable errors with FEC device."));
        let (cb_rc, cb_err) = verify(ours(), &v, "4");
        assert_eq!(cb_rc, 0, "{maker}: cryptblk did not correct: {cb_err}");
        assert!(
            cb_err.contains("Found 4 repairable errors with FEC device."),
            "{cb_err}"
        );
        // verify only reads: the image stays as corrupted.
        assert_ne!(std::fs::read(&v.0).unwrap(), pristine);

        // A corrupted hash block is corrected too.
        std::fs::write(&v.0, &pristine).unwrap();
        flip(&v.1, 4096 + 100);
        assert_eq!(verify(veritysetup(), &v, "4").0, 0);
        let (cb_rc, cb_err) = verify(ours(), &v, "4");
        assert_eq!(cb_rc, 0, "{maker}: hash corruption not corrected: {cb_err}");
        flip(&v.1, 4096 + 100);

        // Three whole blocks overwritten: three errors in (almost) every codeword, beyond
        // the two that roots 4 corrects, so some codewords cannot be decoded.
        {
            use std::os::unix::fs::FileExt;
            let junk = write_pattern(&dir.path().join("junk"), 4096, 99);
            let f = std::fs::OpenOptions::new().write(true).open(&v.0).unwrap();
            for blk in [1u64, 20, 40] {
                f.write_all_at(&junk, blk * 4096).unwrap();
            }
        }
        let (vs_rc, vs_err) = verify(veritysetup(), &v, "4");
        let (cb_rc, cb_err) = verify(ours(), &v, "4");
        assert_ne!(
            vs_rc, 0,
            "veritysetup corrected the uncorrectable: {vs_err}"
        );
        assert_eq!(
            cb_rc, vs_rc,
            "{maker}: exit code differs: {cb_err} / {vs_err}"
        );
        assert!(
            cb_err.contains("Errors cannot be repaired with FEC device."),
            "{cb_err}"
        );

        // A wrong root hash is refused even when FEC finds nothing to correct.
        std::fs::write(&v.0, &pristine).unwrap();
        let mut bad = v.clone();
        bad.3 = format!("abcdef{}", &v.3[6..]);
        let (vs_rc, _) = verify(veritysetup(), &bad, "4");
        let (cb_rc, cb_err) = verify(ours(), &bad, "4");
        assert_ne!(vs_rc, 0);
        assert_eq!(cb_rc, vs_rc, "{maker}: wrong root hash: {cb_err}");
    }
}

#[test]
fn dump_shows_fec_fields_as_veritysetup() {
    let dir = tempdir();
    let v = volume("vs", dir.path(), "6");
    let dump = |mut c: Command| {
        run_ok(
            c.arg("dump")
                .arg(&v.1)
                .arg(format!("--fec-device={}", v.2.display()))
                .arg("--fec-roots=6"),
            b"",
        )
    };
    let theirs = dump(veritysetup());
    assert!(theirs.contains("FEC RS roots:"), "{theirs}");
    assert_eq!(dump(ours()), theirs);
}

#[test]
fn overlapping_areas_are_refused_as_veritysetup_refuses_them() {
    let dir = tempdir();
    let img = dir.path().join("img");
    let hash = dir.path().join("hash");
    let fresh = |len: u64| {
        let _ = std::fs::remove_file(&img);
        sparse_file(&img, len);
    };
    let i = img.display().to_string();
    let h = hash.display().to_string();
    let cases: Vec<(u64, Vec<String>, &str)> = vec![
        // No --data-blocks: the data is the whole file, so the hash offset lies inside it.
        (
            2097152,
            args(&["--hash-offset=1433600", "format", &i, &i]),
            "Data area overlaps with hash area.",
        ),
        (
            2097152,
            args(&[
                "--data-block-size=4096",
                "--hash-block-size=4096",
                "--data-blocks=350",
                "--hash-offset=1228800",
                "format",
                &i,
                &i,
            ]),
            "Data area overlaps with hash area.",
        ),
        (
            2097152,
            args(&[
                "format",
                &i,
                &h,
                "--data-block-size=4096",
                "--hash-block-size=4096",
                "--data-blocks=350",
                &format!("--fec-device={i}"),
                "--fec-offset=1228800",
            ]),
            "Data area overlaps with FEC area.",
        ),
        (
            10240000,
            args(&[
                "format",
                &i,
                &i,
                "--data-block-size=512",
                "--hash-block-size=512",
                "--data-blocks=400",
                &format!("--fec-device={i}"),
                "--fec-offset=256512",
                "--hash-offset=256000",
            ]),
            "Hash area overlaps with FEC area.",
        ),
    ];
    for (len, a, msg) in &cases {
        fresh(*len);
        let _ = std::fs::remove_file(&hash);
        let (vs_rc, vs_err) = code(veritysetup().args(a));
        assert!(vs_err.contains(msg), "veritysetup said {vs_err}");
        let before = std::fs::read(&img).unwrap();
        fresh(*len);
        let _ = std::fs::remove_file(&hash);
        let (cb_rc, cb_err) = code(ours().args(a));
        assert_eq!(cb_rc, vs_rc, "{a:?}: {cb_err}");
        assert!(cb_err.contains(msg), "{a:?}: cryptblk said {cb_err}");
        assert_eq!(cb_err.lines().count(), 1, "one error line: {cb_err}");
        assert!(
            std::fs::read(&img).unwrap() == before,
            "{a:?}: image changed"
        );
    }
}

#[test]
fn open_with_fec_serves_corrected_data_of_a_veritysetup_volume() {
    tool("nbdcopy").expect("nbdcopy is required");
    let dir = tempdir();
    let v = volume("vs", dir.path(), "4");
    let pristine = std::fs::read(&v.0).unwrap();
    // Two bad bytes in each of blocks 3 and 50 (distinct codewords) and one in the tree.
    for at in [
        3 * 4096 + 1,
        3 * 4096 + 2000,
        50 * 4096 + 10,
        50 * 4096 + 4000,
    ] {
        flip(&v.0, at);
    }
    flip(&v.1, 4096 + 64);
    let sock = dir.path().join("v.sock");
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let open = |name: &str, fec: bool| {
        let mut c = ours();
        c.arg("open").arg(&v.0).arg(name).arg(&v.1).arg(&v.3);
        if fec {
            c.arg(format!("--fec-device={}", v.2.display()))
                .arg("--fec-roots=4");
        }
        run_ok(c.arg("--nbd").arg(&sock), b"");
        Served::volume(name)
    };
    {
        let _served = open("t-vfec", true);
        let out = dir.path().join("out.img");
        let copied = run(Command::new("nbdcopy").arg(&uri).arg(&out), b"");
        let status = run_ok(cryptblk().args(["dm", "status", "t-vfec"]), b"");
        assert!(
            copied.status.success(),
            "{}",
            String::from_utf8_lossy(&copied.stderr)
        );
        assert!(
            std::fs::read(&out).unwrap() == pristine,
            "corrected data differs"
        );
        // Kernel status: V (no uncorrectable block) and the count of corrected blocks.
        assert!(status.trim_end().ends_with("verity V 3"), "{status}");
    }
    // Without FEC (and the tree block repaired, so that the root hash check at open
    // passes) the corrupted data blocks fail to read.
    flip(&v.1, 4096 + 64);
    let _served = open("t-vnofec", false);
    let bad = run(
        Command::new("nbdcopy")
            .arg(&uri)
            .arg(dir.path().join("bad.img")),
        b"",
    );
    assert!(!bad.status.success(), "corrupted blocks read without FEC");
}
