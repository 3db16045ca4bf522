//! Shared helpers for the LUKS2 integration tests (included with `mod luks2_common;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cryptsetup test-image folder (env CRYPTBLK_CRYPTSETUP_TESTS or the shared default).
pub fn tests_dir() -> PathBuf {
    std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/cryptsetup-tests"
            ))
        })
}

/// A fresh, uniquely named scratch directory (removed on drop).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "cryptblk-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Decompresses `<tests>/<name>` (an .xz file) to `dest`.
pub fn unxz(name: &str, dest: &Path) {
    let src = tests_dir().join(name);
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running xz on {}: {e}", src.display()));
    assert!(out.status.success(), "xz -dc {} failed", src.display());
    std::fs::write(dest, out.stdout).unwrap();
}

/// Unpacks a .tar.xz from the test folder into `dir`.
pub fn untar(name: &str, dir: &Path) {
    let src = tests_dir().join(name);
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(&src)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap_or_else(|e| panic!("running tar on {}: {e}", src.display()));
    assert!(st.success(), "tar xJf {} failed", src.display());
}

/// True when the real cryptsetup binary is usable; panics unless the skip is explicit.
pub fn have_cryptsetup() -> bool {
    let ok = Command::new("cryptsetup")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CRYPTBLK_SKIP_CRYPTSETUP").as_deref() == Ok("1") {
            eprintln!("cryptsetup missing: skipped because CRYPTBLK_SKIP_CRYPTSETUP=1");
            return false;
        }
        panic!("cryptsetup is required (set CRYPTBLK_SKIP_CRYPTSETUP=1 to skip explicitly)");
    }
    true
}

/// Runs cryptsetup with `args`, feeding `stdin`; returns (exit code, stdout, stderr).
pub fn cryptsetup(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new("cryptsetup")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cryptsetup");
    {
        let mut si = child.stdin.take().unwrap();
        let _ = si.write_all(stdin);
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Opens a file read-write.
pub fn open_rw(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}
