//! Progress and the end of long operations as cryptsetup reports them, with no terminal:
//! the `Finished, time ..., N MiB written, speed ...` line with the run's real figures, JSON
//! lines with `--progress-json`, silence in batch mode; and the quiet end of a command whose
//! reader closed the pipe, and cryptsetup's order of checks in `luksFormat`.

mod common;

use common::{cryptblk, cryptsetup, run, sha256, tempdir, FAST};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// `Finished, time MMmSSs, N MiB written, speed X.Y UNIT/s` parsed: seconds, MiB, bytes/s.
fn parse_finished(line: &str) -> Option<(u64, u64, f64)> {
    let rest = line.strip_prefix("Finished, time ")?;
    let (time, rest) = rest.split_once(", ")?;
    let (m, s) = time.strip_suffix('s')?.split_once('m')?;
    let secs = m.parse::<u64>().ok()? * 60 + s.parse::<u64>().ok()?;
    let (written, speed) = rest.split_once(", ")?;
    let mib = written
        .trim_start()
        .strip_suffix(" MiB written")?
        .parse()
        .ok()?;
    let speed = speed.strip_prefix("speed ")?.strip_suffix("/s")?;
    let (v, unit) = speed.trim_start().split_once(' ')?;
    let mult = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        _ => return None,
    };
    Some((secs, mib, v.parse::<f64>().ok()? * mult))
}

fn finished_lines(stdout: &str) -> Vec<(u64, u64, f64)> {
    // cryptsetup clears its progress line with "\e[2K\r" before the final one.
    stdout
        .split(['\n', '\r'])
        .filter_map(|l| parse_finished(l.trim_start_matches("\x1b[2K")))
        .collect()
}

fn reencrypt(tool: &mut Command, img: &Path, key: &Path, extra: &[&str]) -> (String, f64) {
    tool.args(["reencrypt", "--force-offline-reencrypt"])
        .args(FAST)
        .args(extra)
        .arg("--key-file")
        .arg(key)
        .arg(img);
    let t0 = Instant::now();
    let out = run(tool, b"");
    let wall = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tool:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, wall)
}

/// A piped re-key of 256 MiB ends with one `Finished` line whose figures are the run's: the
/// data size written, a time no longer than the run, a speed that fits both; cryptsetup's
/// own line on a copy has the same shape and size.
#[test]
fn reencrypt_without_a_terminal_ends_with_cryptsetups_finished_line() {
    let dir = tempdir();
    let key = common::write_file(dir.path(), "key", b"progress pass");
    let img = dir.path().join("a.img");
    common::cryptsetup_luks2(&img, &key, 256 << 20).unwrap();
    let copy = dir.path().join("b.img");
    std::fs::copy(&img, &copy).unwrap();
    // The data segment: 256 MiB less the 16 MiB LUKS2 header.
    let data_mib = 240;

    let mut ours = cryptblk();
    let (stdout, wall) = reencrypt(&mut ours, &img, &key, &[]);
    let lines = finished_lines(&stdout);
    assert_eq!(lines.len(), 1, "one Finished line: {stdout:?}");
    let (secs, mib, speed) = lines[0];
    assert_eq!(mib, data_mib, "{stdout:?}");
    assert!(secs as f64 <= wall + 1.0, "time {secs}s > run {wall:.1}s");
    // The run moved the data in at most `wall` seconds, so the reported speed is at least
    // what that allows (the first step, before the clock starts, aside): the old bar said
    // 2.88 MiB/s for a 2.3 s run of 1 GiB.
    let floor = ((data_mib - 1) << 20) as f64 / wall;
    assert!(
        speed >= floor * 0.9,
        "speed {speed:.0} B/s < {floor:.0} B/s"
    );

    let mut theirs = cryptsetup().unwrap();
    theirs.args_clear_batch();
    let (stdout, _) = reencrypt(&mut theirs, &copy, &key, &[]);
    let lines = finished_lines(&stdout);
    assert_eq!(lines.len(), 1, "cryptsetup: {stdout:?}");
    assert_eq!(lines[0].1, data_mib);
}

/// `-q` prints no progress (as cryptsetup); `--progress-json` prints cryptsetup's objects,
/// the last one complete.
#[test]
fn batch_mode_is_silent_and_progress_json_is_cryptsetups() {
    let dir = tempdir();
    let key = common::write_file(dir.path(), "key", b"progress pass");
    let img = dir.path().join("a.img");
    common::cryptsetup_luks2(&img, &key, 64 << 20).unwrap();

    let (stdout, _) = reencrypt(&mut cryptblk(), &img, &key, &["-q"]);
    assert_eq!(stdout, "", "batch mode prints nothing");

    let (ours, _) = reencrypt(&mut cryptblk(), &img, &key, &["-q", "--progress-json"]);
    let (theirs, _) = reencrypt(&mut cryptsetup().unwrap(), &img, &key, &["--progress-json"]);
    let keys = |text: &str| -> (Vec<String>, serde_json::Value) {
        let last: serde_json::Value =
            serde_json::from_str(text.lines().last().expect("a JSON line")).unwrap();
        let mut k: Vec<String> = last.as_object().unwrap().keys().cloned().collect();
        k.sort();
        (k, last)
    };
    let (ours_keys, ours_last) = keys(&ours);
    let (theirs_keys, theirs_last) = keys(&theirs);
    assert_eq!(ours_keys, theirs_keys, "ours {ours:?}\ntheirs {theirs:?}");
    assert_eq!(ours_last["device_bytes"], theirs_last["device_bytes"]);
    assert_eq!(ours_last["device_size"], theirs_last["device_size"]);
    assert_eq!(ours_last["device_bytes"], ours_last["device_size"]);
    assert_eq!(ours_last["eta_ms"], "0");
}

/// `cryptblk decrypt KEY IMG -` into a pipe whose reader is gone; stderr into the same pipe
/// (`2>&1 | head`) or kept.
fn decrypt_into_closed_pipe(key: &Path, img: &Path, stderr_too: bool) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let stderr = if stderr_too {
        Stdio::from(writer.try_clone().unwrap())
    } else {
        Stdio::piped()
    };
    cryptblk()
        .args(["decrypt", "--key-file"])
        .arg(key)
        .arg(img)
        .arg("-")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(stderr)
        .output()
        .unwrap()
}

/// `decrypt VOL - | head -c 100` (stderr too): no panic, no message, and the command ends as
/// `cat` does when its reader goes, by SIGPIPE.
#[test]
fn decrypt_into_a_closed_pipe_ends_quietly_by_sigpipe() {
    let dir = tempdir();
    let key = common::write_file(dir.path(), "key", b"progress pass");
    let img = dir.path().join("a.img");
    common::cryptsetup_luks2(&img, &key, 64 << 20).unwrap();
    let out = decrypt_into_closed_pipe(&key, &img, true);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
    // With stderr kept: nothing said about the pipe.
    let out = decrypt_into_closed_pipe(&key, &img, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// `luksFormat` checks the device before it asks anything, as cryptsetup: a missing device
/// is exit 4 with cryptsetup's line, even with nothing on standard input.
#[test]
fn luks_format_checks_the_device_first() {
    let dir = tempdir();
    let missing = dir.path().join("missing.img");
    for mut tool in [cryptblk(), cryptsetup().unwrap()] {
        let out = run(tool.arg("luksFormat").arg(&missing), b"");
        assert_eq!(out.status.code(), Some(4), "{tool:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            format!(
                "Device {} does not exist or access denied.",
                missing.display()
            ),
            "{tool:?}"
        );
        assert!(!missing.exists());
    }
    // An existing image with nothing to read: refused at the passphrase, image untouched.
    let img = dir.path().join("empty.img");
    common::sparse_file(&img, 32 << 20);
    let before = sha256(&img);
    for mut tool in [cryptblk(), cryptsetup().unwrap()] {
        let out = run(tool.args(["-q", "luksFormat"]).arg(&img), b"");
        assert_eq!(out.status.code(), Some(1), "{tool:?}");
        assert_eq!(sha256(&img), before, "{tool:?}");
    }
}

/// cryptsetup's `--batch-mode` from [`common::cryptsetup`] also silences its progress; the
/// comparison wants the progress.
trait ClearBatch {
    fn args_clear_batch(&mut self);
}

impl ClearBatch for Command {
    fn args_clear_batch(&mut self) {
        let prog = self.get_program().to_owned();
        *self = Command::new(prog);
    }
}
