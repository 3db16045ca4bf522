//! `verity verify` of a tree without a superblock (veritysetup's `--no-superblock` with the
//! tree's parameters on the command line), and of one device holding data and tree with
//! `--data-blocks` and `--root-hash-file` (verity-compat-test's "one device offset" runs),
//! against the real veritysetup: the same verdicts and exit codes, intact and corrupted.
//! Issue 25.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn vs() -> Command {
    tool("veritysetup").expect("veritysetup")
}

fn cb() -> Command {
    let mut c = cryptblk();
    c.arg("verity");
    c
}

fn verify(mut t: Command, args: &[&str], data: &Path, hash: &Path, root: Option<&str>) -> i32 {
    let out = run(
        t.arg("verify").args(args).arg(data).arg(hash).args(root),
        b"",
    );
    exit_code(&out)
}

fn root_of(format_output: &str) -> String {
    format_output
        .lines()
        .find(|l| l.starts_with("Root hash:"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string()
}

#[test]
fn a_tree_without_superblock_verifies_as_veritysetup_verifies_it() {
    let dir = tempdir();
    let d = dir.path();
    let data = d.join("data.img");
    write_pattern(&data, 1 << 20, 3);
    let hash = d.join("hash.img");
    let params = [
        "--no-superblock",
        "--format=1",
        "--data-block-size=1024",
        "--hash-block-size=1024",
        "--hash=sha256",
        "--salt=e48da609055204e89ae53b655ca2216dd983cf3cb829f34f63a297d106d53e2d",
    ];
    let out = run_ok(vs().arg("format").args(params).arg(&data).arg(&hash), b"");
    let root = root_of(&out);
    for (who, t) in [("veritysetup", vs()), ("cryptblk", cb())] {
        assert_eq!(verify(t, &params, &data, &hash, Some(&root)), 0, "{who}");
    }
    // A wrong salt is another tree.
    let mut other = params.to_vec();
    other[5] = "--salt=00";
    for (who, t) in [("veritysetup", vs()), ("cryptblk", cb())] {
        assert_ne!(verify(t, &other, &data, &hash, Some(&root)), 0, "{who}");
    }
    // One flipped data byte fails both.
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[5000] ^= 1;
    std::fs::write(&data, bytes).unwrap();
    for (who, t) in [("veritysetup", vs()), ("cryptblk", cb())] {
        assert_ne!(verify(t, &params, &data, &hash, Some(&root)), 0, "{who}");
    }
}

#[test]
fn one_device_with_data_blocks_and_a_root_hash_file_verifies() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("one.img");
    write_pattern(&img, 10 << 20, 4);
    let rh = d.join("root.hex");
    let common = [
        "--hash-offset",
        "8388608",
        "--data-blocks=16384",
        "--data-block-size=512",
        "--hash-block-size=512",
    ];
    run_ok(
        vs().arg("format")
            .args(common)
            .arg(format!("--root-hash-file={}", rh.display()))
            .arg(&img)
            .arg(&img),
        b"",
    );
    let file = format!("--root-hash-file={}", rh.display());
    let args = ["--hash-offset", "8388608", "--data-blocks=16384", &file];
    for (who, t) in [("veritysetup", vs()), ("cryptblk", cb())] {
        assert_eq!(verify(t, &args, &img, &img, None), 0, "{who}");
    }
}
