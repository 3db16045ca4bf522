//! Helpers of the reencryption tests (`reencrypt_*.rs`): a directory with a key file,
//! strace's fault injection to cut a tool at its Nth write, and cryptsetup's view of a
//! finished volume.

use super::*;
use serde_json::Value;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A throw-away directory holding the passphrase as the key file `key`.
pub struct KeyLab {
    /// The directory (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The key file.
    pub key: PathBuf,
}

impl KeyLab {
    /// A new directory whose key file holds `pass`.
    pub fn new(pass: &[u8]) -> KeyLab {
        let dir = tempdir();
        let key = write_file(dir.path(), "key", pass);
        KeyLab { dir, key }
    }

    /// `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cryptblk reencrypt -q --key-file KEY ARGS`.
    pub fn reencrypt(&self, args: &[&str]) -> Command {
        let mut c = cryptblk();
        c.args(["reencrypt", "-q", "--key-file"])
            .arg(&self.key)
            .args(args);
        c
    }

    /// The served volume's plaintext, read over NBD.
    pub fn read_export(&self, sock: &Path, name: &str) -> Vec<u8> {
        let out = self.path(name);
        run_ok(Command::new("nbdcopy").arg(nbd_uri(sock)).arg(&out), b"");
        std::fs::read(&out).unwrap()
    }
}

/// `CRYPTBLK_REENC_EVERY` (0 when unset): try every Nth write instead of a sample.
pub fn every() -> usize {
    std::env::var("CRYPTBLK_REENC_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kill points to try out of `total` writes: [`every`] apart from the first when set,
/// else about `samples` spread over the run from an offset this run's seed picks
/// ([`super::sweep::sweep_offset`]: over many runs every write is cut), plus its first and
/// last writes.
pub fn kill_points(total: usize, samples: usize) -> Vec<usize> {
    let (step, first) = match every() {
        0 => {
            let step = (total / samples).max(1);
            (step, 1 + super::sweep::sweep_offset(step, total as u64))
        }
        e => (e, 1),
    };
    let mut v: Vec<usize> = (first..=total).step_by(step).collect();
    v.extend([1, 2, total.saturating_sub(1), total]);
    v.retain(|&n| n >= 1 && n <= total);
    v.sort_unstable();
    v.dedup();
    v
}

/// `&str` arguments as `OsStr` ones.
pub fn os<'a>(v: &'a [&'a str]) -> Vec<&'a OsStr> {
    v.iter().map(OsStr::new).collect()
}

/// Number of `syscall` calls `cmd` makes (strace counts them), run in `cwd` (cryptsetup's
/// data-shift encryption writes a temporary header file in the working directory).
pub fn count_writes(cmd: &[&OsStr], syscall: &str, cwd: &Path) -> usize {
    let dir = tempdir();
    let log = dir.path().join("log");
    let out = run(
        tool("strace")
            .unwrap()
            .args(["-f", "-o"])
            .arg(&log)
            .args(["-e", &format!("trace={syscall}")])
            .args(cmd)
            .current_dir(cwd),
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!("{syscall}(")) && !l.contains("resumed"))
        .count()
}

/// Runs `cmd` in `cwd` under strace, killed (SIGKILL) at its `n`th `syscall`. strace's
/// own status is ignored: the state left on disk is what the tests look at.
pub fn killed(cmd: &[&OsStr], syscall: &str, n: usize, cwd: &Path) {
    let inject = format!("inject={syscall}:signal=KILL:when={n}");
    let _ = run(
        tool("strace")
            .unwrap()
            .args(["-f", "-o", "/dev/null", "-e", &format!("trace={syscall}")])
            .args(["-e", &inject])
            .args(cmd)
            .current_dir(cwd),
        b"",
    );
}

/// cryptsetup's `luksDump --dump-json-metadata` of `img`, `None` when it refuses it.
pub fn json_of(img: &Path) -> Option<Value> {
    let out = run(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img),
        b"",
    );
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// True when cryptsetup sees a requirement (a reencryption in progress) on `img`.
pub fn in_progress(img: &Path) -> bool {
    json_of(img).is_some_and(|j| !j["config"]["requirements"].is_null())
}

/// Starts `reencrypt` (`cmd`) on the volume `name` that `served` serves on `sock`,
/// SIGKILLs its daemon at the fraction `at` of the run ([`kill_daemon_at`]), then drops the
/// volume and its socket and checks that `header` was left mid-reencryption.
pub fn kill_served_run(
    name: &str,
    served: Served,
    sock: &Path,
    cmd: &mut Command,
    at: f64,
    header: &Path,
) {
    let pid = status(name)["pid"].as_u64().unwrap() as i32;
    let re = spawn_captured(cmd);
    kill_daemon_at(name, pid, at, re);
    drop(served);
    let _ = std::fs::remove_file(sock);
    assert!(in_progress(header), "killed at {at}: not mid-reencryption");
}

/// Finishes the reencryption of `device` (its header in `header`, or on the device when
/// `None`) with `cryptsetup reencrypt --resume-only` (offline), after `cryptsetup repair`
/// where the resume asks for it; fails unless cryptsetup leaves it finished.
pub fn finish_by_cryptsetup(key: &Path, header: Option<&Path>, device: &Path) {
    let with_header = |c: &mut Command| {
        if let Some(h) = header {
            c.arg("--header").arg(h);
        }
        c.arg("--key-file").arg(key).arg(device);
    };
    let resume = || {
        let mut c = cryptsetup().unwrap();
        c.args(["reencrypt", "--batch-mode", "--resume-only"])
            .arg("--force-offline-reencrypt");
        with_header(&mut c);
        run(&mut c, b"")
    };
    if resume().status.success() {
        return;
    }
    let mut repair = cryptsetup().unwrap();
    repair.args(["repair", "--batch-mode"]);
    with_header(&mut repair);
    run_ok(&mut repair, b"");
    let hdr = header.unwrap_or(device);
    if in_progress(hdr) {
        let out = resume();
        assert!(
            out.status.success(),
            "cryptsetup resume after repair: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!in_progress(hdr), "cryptsetup left it unfinished");
}

/// The data area of `img` decrypted by the independent model with the volume key, cipher
/// and segment cryptsetup reports: `(volume key hex, plaintext)`. cryptsetup must accept
/// the header and the key file.
pub fn plaintext_by_cryptsetup(img: &Path, key: &Path) -> (String, Vec<u8>) {
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"");
    let cipher = dump
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("cipher:"))
        .unwrap()
        .trim()
        .to_string();
    let vk = cryptsetup_volume_key(img, key, &[]).unwrap();
    let (offset, sector) = cryptsetup_luks2_segment(img).unwrap();
    let data = std::fs::read(img).unwrap();
    let plain = independent("decrypt", &cipher, &vk, sector, &data[offset..]);
    (vk, plain)
}

/// One fio run writing and verifying (crc32c) two 2 MiB regions at the start of the export.
pub fn fio_once(dir: &Path, sock: &Path, what: &str) {
    let child = spawn_fio_verify(dir, sock, "online", "2M", 1);
    for job in fio_jobs(child, what) {
        assert_eq!(job["error"], 0, "fio job error {what}: {job}");
        assert!(
            job["read"]["io_bytes"].as_u64().unwrap() > 0,
            "fio verified nothing {what}"
        );
    }
}

/// fio runs (write + verify) one after the other on a thread of their own until stopped.
pub struct FioLoop {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<usize>,
}

impl FioLoop {
    /// Starts the loop; returns once the first run has begun writing.
    pub fn start(dir: &Path, sock: &Path, what: &str) -> FioLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, sock, what) = (dir.to_path_buf(), sock.to_path_buf(), what.to_string());
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut runs = 0;
            while !flag.load(Ordering::SeqCst) {
                fio_once(&dir, &sock, &format!("{what} (run {runs})"));
                runs += 1;
            }
            runs
        });
        std::thread::sleep(Duration::from_millis(300));
        FioLoop { stop, handle }
    }

    /// Lets the current run finish (its errors fail the test); returns the number of runs.
    pub fn finish(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("a fio run failed")
    }
}

/// Polls `status` of `name` until `child` exits or `stop_when` says so with the fraction
/// done; returns the fractions seen while the run was going.
pub fn watch(
    name: &str,
    child: &mut std::process::Child,
    mut stop_when: impl FnMut(f64) -> bool,
) -> Vec<f64> {
    let mut seen = Vec::new();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(100),
            "the reencryption did not end"
        );
        let out = run(cryptblk().args(["status", "--json", name]), b"");
        if let Ok(st) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            let r = &st["reencryption"];
            if r["state"] == "running" {
                let f = r["done"].as_f64().unwrap() / r["total"].as_f64().unwrap();
                seen.push(f);
                if stop_when(f) {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

/// Waits until `status` of `name` shows at least `at` of a running reencryption done, then
/// kills the daemon `pid` that serves it (SIGKILL: a crash) and reaps the command `re`.
pub fn kill_daemon_at(name: &str, pid: i32, at: f64, re: std::process::Child) {
    let start = Instant::now();
    loop {
        let st = status(name);
        let r = &st["reencryption"];
        if r["state"] == "running"
            && r["done"].as_f64().unwrap() / r["total"].as_f64().unwrap() >= at
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no progress: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) of a daemon the calling test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = re.wait_with_output();
}

pub fn tools() -> bool {
    ["fio", "nbdcopy", "cryptsetup", "python3"]
        .iter()
        .all(|t| tool(t).is_some())
}

/// Starts `cmd` (an online reencryption of `name`) under fio, closes the volume once
/// `status` shows at least `at` done, and returns what the export served at the close.
/// The reencryption must end interrupted (exit 1) with the header mid-reencryption.
pub fn close_midway(
    lab: &KeyLab,
    header: &Path,
    name: &str,
    sock: &Path,
    mut cmd: Command,
) -> Vec<u8> {
    let fio = FioLoop::start(lab.dir.path(), sock, "before the close");
    let mut re = spawn_captured(&mut cmd);
    let seen = watch(name, &mut re, |f| f >= 0.4);
    assert!(!seen.is_empty(), "status never showed the run");
    fio.finish();
    // fio is done: what the export serves now is what the closed volume must hold.
    let at_close = lab.read_export(sock, "at-close.bin");
    run_ok(cryptblk().args(["close", name]), b"");
    let out = re.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was interrupted"), "{err}");
    assert!(
        in_progress(header),
        "closed before the end was not mid-reencryption"
    );
    at_close
}
