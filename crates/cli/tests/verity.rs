//! `cryptblk verity` against the real veritysetup: trees made by either verify with the
//! other, tampering is caught, and an open volume serves verified data and EIO on corruption.

mod common;
use common::*;
use std::process::Command;

fn root_hash(format_output: &str) -> String {
    format_output
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .expect("format prints the root hash")
        .trim()
        .to_string()
}

#[test]
fn verity_trees_interoperate_with_veritysetup() {
    let Some(mut vs) = tool("veritysetup") else {
        return;
    };
    let dir = tempdir();
    let data = dir.path().join("data.img");
    write_pattern(&data, 8 << 20, 41);

    // veritysetup's tree verifies with cryptblk; the dumps agree.
    let vs_hash = dir.path().join("vs.hash");
    let out = run_ok(vs.arg("format").arg(&data).arg(&vs_hash), b"");
    let vs_root = root_hash(&out);
    run_ok(
        cryptblk()
            .args(["verity", "verify"])
            .arg(&data)
            .arg(&vs_hash)
            .arg(&vs_root),
        b"",
    );
    let ours = run_ok(cryptblk().args(["verity", "dump"]).arg(&vs_hash), b"");
    let theirs = run_ok(Command::new("veritysetup").arg("dump").arg(&vs_hash), b"");
    assert_eq!(ours, theirs, "verity dump differs from veritysetup dump");

    // cryptblk's tree (sha512, 1 KiB hash blocks, fixed salt) passes veritysetup verify.
    let cb_hash = dir.path().join("cb.hash");
    let out = run_ok(
        cryptblk()
            .args([
                "verity",
                "format",
                "--hash",
                "sha512",
                "--hash-block-size",
                "1024",
                "--salt",
                "00112233",
            ])
            .arg(&data)
            .arg(&cb_hash),
        b"",
    );
    let cb_root = root_hash(&out);
    run_ok(
        Command::new("veritysetup")
            .arg("verify")
            .arg(&data)
            .arg(&cb_hash)
            .arg(&cb_root),
        b"",
    );

    // A wrong root hash and a flipped data bit both fail, in both tools.
    let wrong = format!(
        "{}{}",
        if cb_root.starts_with('0') { "1" } else { "0" },
        &cb_root[1..]
    );
    assert_eq!(
        run(
            cryptblk()
                .args(["verity", "verify"])
                .arg(&data)
                .arg(&cb_hash)
                .arg(&wrong),
            b""
        )
        .status
        .code(),
        Some(1)
    );
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"X", 3 << 20).unwrap();
    drop(f);
    assert_eq!(
        run(
            cryptblk()
                .args(["verity", "verify"])
                .arg(&data)
                .arg(&cb_hash)
                .arg(&cb_root),
            b""
        )
        .status
        .code(),
        Some(1)
    );
    assert!(!run(
        Command::new("veritysetup")
            .arg("verify")
            .arg(&data)
            .arg(&cb_hash)
            .arg(&cb_root),
        b""
    )
    .status
    .success());
}

#[test]
fn open_verity_serves_checked_data_and_fails_reads_of_tampered_blocks() {
    let Some(_) = tool("nbdcopy") else { return };
    let Some(mut vs) = tool("veritysetup") else {
        return;
    };
    let dir = tempdir();
    let data = dir.path().join("data.img");
    let content = write_pattern(&data, 4 << 20, 42);
    let hash = dir.path().join("h.img");
    let root = root_hash(&run_ok(vs.arg("format").arg(&data).arg(&hash), b""));
    let sock = dir.path().join("v.sock");
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let open = || {
        run_ok(
            cryptblk()
                .args(["verity", "open"])
                .arg(&data)
                .arg("t-verity")
                .arg(&hash)
                .arg(&root)
                .arg("--nbd")
                .arg(&sock),
            b"",
        )
    };
    open();
    let out = dir.path().join("out.img");
    let copied = run(Command::new("nbdcopy").arg(&uri).arg(&out), b"");
    run_ok(cryptblk().args(["close", "t-verity"]), b"");
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    assert!(
        std::fs::read(&out).unwrap() == content,
        "verified data differs"
    );

    // Flip one byte in block 100: reading that block must fail, not return the bad data.
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\xff", 100 * 4096 + 7).unwrap();
    drop(f);
    open();
    let bad = run(
        Command::new("nbdcopy")
            .arg(&uri)
            .arg(dir.path().join("bad.img")),
        b"",
    );
    let status = run_ok(cryptblk().args(["dm", "status", "t-verity"]), b"");
    run_ok(cryptblk().args(["close", "t-verity"]), b"");
    assert!(
        !bad.status.success(),
        "a read of a tampered block succeeded"
    );
    assert!(
        status.contains(" C"),
        "verity status should report corruption: {status}"
    );
    // A wrong root hash is refused before anything is served.
    let wrong = format!(
        "{}{}",
        if root.starts_with('0') { "1" } else { "0" },
        &root[1..]
    );
    let r = run(
        cryptblk()
            .args(["verity", "open"])
            .arg(&data)
            .arg("t-verity2")
            .arg(&hash)
            .arg(&wrong)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    assert_eq!(r.status.code(), Some(1));
}

#[test]
fn integrity_dump_matches_integritysetup_on_kernel_made_images() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dm/tests/integrity_fixtures");
    let dir = tempdir();
    let mut checked = 0;
    for name in ["k-sha256", "k-crc32c-4k", "k-legacy"] {
        let img = dir.path().join(format!("{name}.img"));
        let out = Command::new("xz")
            .arg("-dc")
            .arg(fixtures.join(format!("{name}.img.xz")))
            .output()
            .unwrap();
        assert!(out.status.success(), "cannot decompress {name}");
        std::fs::write(&img, out.stdout).unwrap();
        // The .dump files are integritysetup's own output for these kernel-made images.
        let expected = std::fs::read_to_string(fixtures.join(format!("{name}.dump"))).unwrap();
        let ours = run_ok(cryptblk().args(["integrity", "dump"]).arg(&img), b"");
        assert_eq!(
            ours, expected,
            "{name}: integrity dump differs from integritysetup"
        );
        checked += 1;
    }
    assert_eq!(checked, 3);
}
