//! cryptsetup's command-line habits that its own test suite (compat-test's expect scripts)
//! waits for, compared with cryptsetup 2.6.1: `-v` ends with "Command successful." or
//! "Command failed with code -N (...)." on standard output; a passphrase typed on a
//! terminal is asked for again after a wrong one, up to `-T/--tries` times (3 by default),
//! while piped input is read once; `luksResume` of a volume opened with a detached header
//! needs `--header`, as cryptsetup reads the header from the data device otherwise.
//! Issue 25.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn cs() -> Command {
    tool("cryptsetup").expect("cryptsetup")
}

fn luks2(dir: &Path, key: &Path) -> std::path::PathBuf {
    let img = dir.join("vol.img");
    sparse_file(&img, 24 << 20);
    run_ok(
        cs().args(["-q", "luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(key)
            .arg(&img),
        b"",
    );
    img
}

#[test]
fn verbose_ends_with_cryptsetups_verdict_line() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"verbose key");
    let wrong = write_file(d, "wrong", b"not the key");
    let img = luks2(d, &key);
    let missing = d.join("missing.img");
    let cases: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec!["luksDump".as_ref(), img.as_os_str()],
        vec!["luksDump".as_ref(), missing.as_os_str()],
        vec!["isLuks".as_ref(), img.as_os_str()],
        vec!["isLuks".as_ref(), key.as_os_str()],
        vec![
            "open".as_ref(),
            "--test-passphrase".as_ref(),
            "--key-file".as_ref(),
            key.as_os_str(),
            img.as_os_str(),
        ],
        vec![
            "open".as_ref(),
            "--test-passphrase".as_ref(),
            "--key-file".as_ref(),
            wrong.as_os_str(),
            img.as_os_str(),
        ],
    ];
    for args in cases {
        let mut last = Vec::new();
        for mut t in [cs(), cryptblk()] {
            let out = run(t.arg("-v").args(&args), b"");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            last.push((
                exit_code(&out),
                stdout.lines().last().unwrap_or_default().to_string(),
            ));
        }
        assert_eq!(last[1], last[0], "{args:?}");
        assert!(last[0].1.starts_with("Command "), "{args:?}: {:?}", last[0]);
    }
    // Without -v neither prints it.
    let out = run(cryptblk().arg("isLuks").arg(&img), b"");
    assert!(out.stdout.is_empty());
}

/// `open --test-passphrase` on a terminal, answered with `wrong` passphrases: the output
/// and exit code.
fn typed(t: Command, img: &Path, extra: &[&str], wrong: usize) -> PtyRun {
    let mut t = t;
    let prompt = format!("Enter passphrase for {}: ", img.display());
    let steps: Vec<PtyStep> = (0..wrong)
        .map(|_| PtyStep {
            prompt: &prompt,
            answer: "wrong passphrase",
            secret: true,
        })
        .collect();
    run_on_pty(
        t.args(["open", "--test-passphrase"]).args(extra).arg(img),
        &steps,
    )
}

#[test]
fn a_passphrase_typed_on_a_terminal_is_asked_for_tries_times() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"right passphrase");
    let img = luks2(d, &key);
    for (extra, tries) in [(vec!["-T", "2"], 2), (vec![], 3), (vec!["--tries=1"], 1)] {
        for (who, t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
            let r = typed(t, &img, &extra, tries);
            assert_eq!(r.code, 2, "{who} {extra:?}: {}", r.output);
            assert_eq!(
                r.output
                    .matches("No key available with this passphrase.")
                    .count(),
                tries,
                "{who} {extra:?}: {}",
                r.output
            );
            assert_eq!(
                r.output.matches("Enter passphrase for").count(),
                tries,
                "{who} {extra:?}: {}",
                r.output
            );
        }
    }
    // A wrong one, then the right one: opened on the second try.
    for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let prompt = format!("Enter passphrase for {}: ", img.display());
        let r = run_on_pty(
            t.args(["open", "-v", "--test-passphrase"]).arg(&img),
            &[
                PtyStep {
                    prompt: &prompt,
                    answer: "wrong passphrase",
                    secret: true,
                },
                PtyStep {
                    prompt: &prompt,
                    answer: "right passphrase",
                    secret: true,
                },
            ],
        );
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        assert!(
            r.output.contains("Key slot 0 unlocked."),
            "{who}: {}",
            r.output
        );
        assert!(
            r.output.contains("Command successful."),
            "{who}: {}",
            r.output
        );
    }
    // Piped input is read once, whatever -T says.
    for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let out = run(
            t.args(["open", "--test-passphrase", "-T", "3"]).arg(&img),
            b"wrong\nright passphrase\n",
        );
        assert_eq!(exit_code(&out), 2, "{who}");
    }
}

#[test]
fn resume_of_a_detached_header_volume_needs_the_header() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"detached key");
    let data = d.join("data.img");
    sparse_file(&data, 16 << 20);
    let hdr = d.join("hdr.img");
    run_ok(
        cryptblk()
            .args(["-q", "luksFormat", "--type", "luks2", "--header"])
            .arg(&hdr)
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&data),
        b"",
    );
    let name = "t-resume-detached";
    let sock = d.join("nbd.sock");
    let _served = open_nbd(
        &data,
        &key,
        name,
        &sock,
        &["--header", hdr.to_str().unwrap()],
    );
    run_ok(cryptblk().args(["luksSuspend", name]), b"");
    let (rc, err) = code(
        cryptblk()
            .args(["luksResume", name, "--key-file"])
            .arg(&key),
    );
    assert_eq!(rc, 1, "{err}");
    assert_eq!(
        err,
        format!("{name} is not active LUKS device name or header is missing.\n")
    );
    assert_eq!(status(name)["suspended"], true);
    run_ok(
        cryptblk()
            .args(["luksResume", name, "--header"])
            .arg(&hdr)
            .arg("--key-file")
            .arg(&key),
        b"",
    );
    assert_eq!(status(name)["suspended"], false);
}
