//! Helpers of the reencryption tests (`reencrypt_*.rs`): a directory with a key file,
//! strace's fault injection to cut a tool at its Nth write, and cryptsetup's view of a
//! finished volume.

use super::*;
use serde_json::Value;
use std::ffi::OsStr;

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
}

/// `CRYPTBLK_REENC_EVERY` (0 when unset): try every Nth write instead of a sample.
pub fn every() -> usize {
    std::env::var("CRYPTBLK_REENC_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kill points to try out of `total` writes: [`every`] apart when set, else about
/// `samples` spread over the run plus its first and last writes.
pub fn kill_points(total: usize, samples: usize) -> Vec<usize> {
    let step = match every() {
        0 => (total / samples).max(1),
        e => e,
    };
    let mut v: Vec<usize> = (1..=total).step_by(step).collect();
    v.extend([2, total.saturating_sub(1), total]);
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
