//! loop-AES (`open --type loopaes`, `loopaesOpen`, `decrypt --type loopaes`) against an
//! independent model (tests/independent/loopaes.py: the documented key file rules and
//! dm-crypt's lmk IV on pyca/cryptography and hashlib, its own MD5 compression checked
//! against hashlib): single-key, multi-key v2 (64 keys) and v3 (65 keys), `--offset`,
//! `--skip`, `--key-size`, `--hash`, the key file from standard input; data the model
//! encrypted reads back through `decrypt` and the NBD export, data written through the NBD
//! export decrypts in the model, and the table key is the model's. Malformed key files and
//! options fail with one line and cryptsetup's exit code. The kernel's own dm-crypt is the
//! judge in tests/lab/loopaes.sh (crates/cli/tests/lab.rs).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A bad key file case: name, key file bytes, extra arguments, exit code, expected message.
type BadKeyFile<'a> = (&'a str, Vec<u8>, Vec<&'a str>, i32, &'a str);
fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/loopaes.py")
}

/// A key file of `n` distinct lines of `len` printable characters.
fn keyfile(n: usize, len: usize, salt: u8) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..n {
        for j in 0..len {
            v.push(b'!' + ((i * 31 + j * 7 + salt as usize) % 90) as u8);
        }
        v.push(b'\n');
    }
    v
}

/// Runs the model: `op` (encrypt|decrypt|key) with `args`, `input` on stdin.
fn run_model(op: &str, key: &Path, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut c = Command::new("python3");
    c.arg(model()).arg(op).arg(key).args(args);
    if op != "key" {
        c.args(["-", "-"]);
    }
    let out = run(&mut c, input);
    assert!(
        out.status.success(),
        "model {op} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

struct Case {
    keys: usize,
    /// cryptblk options besides the key file.
    opts: &'static [&'static str],
    /// The model's options (key size in bytes, hash, IV skip).
    model: &'static [&'static str],
    /// Data offset in sectors.
    offset: usize,
}

const CASES: &[Case] = &[
    Case {
        keys: 1,
        opts: &[],
        model: &["--key-size", "32"],
        offset: 0,
    },
    // --offset 8 without --skip: IVs count from the offset, as in cryptsetup.
    Case {
        keys: 64,
        opts: &["--key-size", "128", "--offset", "8"],
        model: &["--key-size", "16", "--skip", "8"],
        offset: 8,
    },
    Case {
        keys: 65,
        opts: &["--offset", "8", "--skip", "3", "--hash", "sha384"],
        model: &["--key-size", "32", "--skip", "3", "--hash", "sha384"],
        offset: 8,
    },
    Case {
        keys: 65,
        opts: &["-s", "192"],
        model: &["--key-size", "24"],
        offset: 0,
    },
];

#[test]
fn model_volumes_read_and_write_through_cryptblk() {
    let dir = tempdir();
    let nbd = tool("nbdcopy").is_some();
    for (i, case) in CASES.iter().enumerate() {
        let tag = format!("{} keys {:?}", case.keys, case.opts);
        let key = write_file(
            dir.path(),
            &format!("k{i}"),
            &keyfile(case.keys, 24 + i, i as u8),
        );
        // Junk before the data area: --offset must skip it.
        let plain = write_pattern(&dir.path().join("plain"), 96 << 10, i as u64 + 1);
        let junk = vec![0xa5u8; case.offset * 512];
        let cipher = run_model("encrypt", &key, case.model, &plain);
        let img = dir.path().join(format!("img{i}"));
        std::fs::write(&img, [junk.clone(), cipher].concat()).unwrap();

        // decrypt --type loopaes reads what the model wrote.
        let out = dir.path().join(format!("out{i}"));
        run_ok(
            cryptblk()
                .args(["decrypt", "-q", "--type", "loopaes", "--key-file"])
                .arg(&key)
                .args(case.opts)
                .arg(&img)
                .arg(&out),
            b"",
        );
        assert!(
            std::fs::read(&out).unwrap() == plain,
            "{tag}: decrypt differs"
        );

        // The served volume (key file from standard input, the old action name for one
        // case): same data; its table key is the model's.
        let name = format!("la{i}");
        let sock = dir.path().join(format!("s{i}"));
        let action: &[&str] = if i % 2 == 0 {
            &["loopaesOpen"]
        } else {
            &["open", "--type", "loopaes"]
        };
        run_ok(
            cryptblk()
                .args(action)
                .args(["--key-file", "-"])
                .args(case.opts)
                .arg(&img)
                .arg(&name)
                .arg("--nbd")
                .arg(&sock),
            &std::fs::read(&key).unwrap(),
        );
        let _served = Served::volume(name.clone());
        let table = run_ok(cryptblk().args(["dm", "table", "--showkeys", &name]), b"");
        let want = String::from_utf8(run_model("key", &key, case.model, b"")).unwrap();
        let mut want = want.split_whitespace();
        let words: Vec<&str> = table.split_whitespace().collect();
        assert_eq!(words[3], want.next().unwrap(), "{tag}: {table}");
        assert_eq!(words[4], want.next().unwrap(), "{tag}: table key");
        let skip = case.model.iter().position(|&o| o == "--skip");
        let skip = skip.map_or("0", |p| case.model[p + 1]);
        assert_eq!(
            (words[5], words[7]),
            (skip, &*case.offset.to_string()),
            "{tag}"
        );
        let status = status(&name);
        assert_eq!(status["info"]["type"], "LOOPAES", "{status}");
        if !nbd {
            continue;
        }
        let copy = dir.path().join("copy");
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&copy), b"");
        assert!(
            std::fs::read(&copy).unwrap() == plain,
            "{tag}: NBD read differs"
        );
        // Writes through the export decrypt in the model.
        let new = write_pattern(&dir.path().join("new"), 96 << 10, 100 + i as u64);
        run_ok(
            Command::new("nbdcopy")
                .arg(dir.path().join("new"))
                .arg(nbd_uri(&sock)),
            b"",
        );
        drop(_served);
        let written = std::fs::read(&img).unwrap();
        assert!(
            written[..junk.len()] == junk[..],
            "{tag}: offset area changed"
        );
        let back = run_model("decrypt", &key, case.model, &written[junk.len()..]);
        assert!(back == new, "{tag}: model cannot read what cryptblk wrote");
    }
}

#[test]
fn bad_key_files_and_options_fail_like_cryptsetup() {
    let dir = tempdir();
    let img = dir.path().join("img");
    sparse_file(&img, 1 << 20);
    let good = write_file(dir.path(), "good", &keyfile(64, 20, 0));
    let mut short_line = keyfile(64, 20, 0);
    short_line.remove(0);
    let mut unterminated = keyfile(1, 20, 0);
    unterminated.pop();
    let incompatible = "Incompatible loop-AES keyfile detected.";
    let cases: Vec<BadKeyFile> = vec![
        ("2 keys", keyfile(2, 20, 0), vec![], 1, incompatible),
        ("63 keys", keyfile(63, 20, 0), vec![], 1, incompatible),
        ("66 keys", keyfile(66, 20, 0), vec![], 1, incompatible),
        ("short line", short_line, vec![], 1, incompatible),
        ("unterminated", unterminated, vec![], 1, incompatible),
        ("empty", Vec::new(), vec![], 1, incompatible),
        (
            "gpg",
            b"-----BEGIN PGP MESSAGE-----\n\nhQEMA\n-----END PGP MESSAGE-----\n".to_vec(),
            vec![],
            1,
            "GPG",
        ),
        (
            "key size without hash",
            keyfile(1, 20, 0),
            vec!["--key-size", "512"],
            1,
            "Key processing error (using hash [none]).",
        ),
        (
            "hash too short",
            keyfile(1, 20, 0),
            vec!["--hash", "sha1"],
            1,
            "Key processing error (using hash sha1).",
        ),
        (
            "key size not bytes",
            keyfile(1, 20, 0),
            vec!["--key-size", "100"],
            1,
            "multiple of 8",
        ),
        (
            "test passphrase",
            keyfile(1, 20, 0),
            vec!["--test-passphrase"],
            1,
            "--test-passphrase",
        ),
    ];
    for (what, contents, extra, want_code, want_msg) in cases {
        let key = write_file(dir.path(), "key", &contents);
        for action in [
            &["open", "--type", "loopaes"][..],
            &["decrypt", "--type", "loopaes"][..],
        ] {
            if what == "test passphrase" && action[0] == "decrypt" {
                // decrypt has no --test-passphrase: only open refuses it.
                continue;
            }
            let target = if action[0] == "open" {
                PathBuf::from("x")
            } else {
                dir.path().join("out")
            };
            let out = run(
                cryptblk()
                    .args(action)
                    .arg("--key-file")
                    .arg(&key)
                    .args(&extra)
                    .arg(&img)
                    .arg(&target)
                    .args(if action[0] == "open" {
                        &["--nbd", "/nonexistent/x.sock"][..]
                    } else {
                        &[]
                    }),
                b"",
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(exit_code(&out), want_code, "{what} {action:?}: {err}");
            assert!(err.contains(want_msg), "{what} {action:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
    }
    assert!(
        !dir.path().join("out").exists(),
        "a failed decrypt left its output"
    );

    // Missing key file, missing --key-file, missing device.
    let (rc, err) = code(
        cryptblk()
            .args(["open", "--type", "loopaes", "--key-file"])
            .arg(dir.path().join("nope"))
            .arg(&img)
            .args(["x", "--nbd", "/nonexistent/x.sock"]),
    );
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("key file"), "{err}");
    let (rc, err) = code(cryptblk().arg("loopaesOpen").arg(&img).arg("x"));
    assert_eq!((rc, err.trim()), (1, "Option --key-file is required."));
    let (rc, err) = code(
        cryptblk()
            .args(["loopaesOpen", "--key-file"])
            .arg(&good)
            .arg(dir.path().join("nodev"))
            .args(["x", "--nbd", "/nonexistent/x.sock"]),
    );
    assert_eq!(rc, 4, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    // The image is untouched by all of it.
    assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 0));
}
