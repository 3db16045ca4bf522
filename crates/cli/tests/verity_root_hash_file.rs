//! veritysetup's `--root-hash-file` and its options-before-the-action order, against the
//! real veritysetup: a file either tool writes is the same bytes and opens the other's
//! tree, and `cryptblk verity --opt ... format` parses as `veritysetup --opt ... format`.

mod common;
use common::*;
use std::process::Command;

#[test]
fn root_hash_files_interoperate_with_veritysetup() {
    let dir = tempdir();
    let data = dir.path().join("data.img");
    write_pattern(&data, 1 << 20, 7);
    let (vs_hash, vs_file) = (dir.path().join("vs.hash"), dir.path().join("vs.roothash"));
    let (cb_hash, cb_file) = (dir.path().join("cb.hash"), dir.path().join("cb.roothash"));
    let salt = ["--salt", "0011223344"];

    // veritysetup writes its file; cryptblk (options before the action, as veritysetup
    // takes them) writes the same bytes for the same tree.
    run_ok(
        tool("veritysetup")
            .expect("veritysetup")
            .args(salt)
            .arg(format!("--root-hash-file={}", vs_file.display()))
            .arg("format")
            .arg(&data)
            .arg(&vs_hash),
        b"",
    );
    run_ok(
        cryptblk()
            .arg("verity")
            .args(salt)
            .arg("--root-hash-file")
            .arg(&cb_file)
            .arg("format")
            .arg(&data)
            .arg(&cb_hash),
        b"",
    );
    let theirs = std::fs::read(&vs_file).unwrap();
    assert_eq!(std::fs::read(&cb_file).unwrap(), theirs);
    assert_eq!(theirs.len(), 64, "hex sha256, no newline");

    // Each tool verifies the other's tree from the other's file, with no positional hash.
    run_ok(
        cryptblk()
            .args(["verity", "verify", "--root-hash-file"])
            .arg(&vs_file)
            .arg(&data)
            .arg(&vs_hash),
        b"",
    );
    run_ok(
        Command::new("veritysetup")
            .args(["verify", "--root-hash-file"])
            .arg(&cb_file)
            .arg(&data)
            .arg(&cb_hash),
        b"",
    );

    // A wrong root hash in the file fails in both.
    let bad = write_file(dir.path(), "bad.roothash", &[b'a'; 64]);
    for mut c in [
        {
            let mut c = cryptblk();
            c.args(["verity", "verify"]);
            c
        },
        Command::new("veritysetup"),
    ] {
        if c.get_program() == "veritysetup" {
            c.arg("verify");
        }
        let out = run(
            c.arg("--root-hash-file").arg(&bad).arg(&data).arg(&vs_hash),
            b"",
        );
        assert_ne!(out.status.code(), Some(0), "{c:?}");
    }
    // Neither a root hash nor a file: a usage error (exit 1), in one line.
    let out = run(
        cryptblk()
            .args(["verity", "verify"])
            .arg(&data)
            .arg(&vs_hash),
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
