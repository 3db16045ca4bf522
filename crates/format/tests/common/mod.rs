//! Helpers shared by the integration tests: locating and unpacking cryptsetup's test
//! images, running real tools, decrypting payloads through the cipher crate.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where cryptsetup's test images live.
pub fn images_dir() -> PathBuf {
    match std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/cryptsetup-tests"
        )),
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "cryptblk-format-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Decompresses `<images>/<name>` (an `.xz` file) into `dir`, returning the output path.
pub fn unxz(name: &str, dir: &TempDir) -> PathBuf {
    let src = images_dir().join(name);
    assert!(
        src.exists(),
        "test image {} missing (set CRYPTBLK_CRYPTSETUP_TESTS)",
        src.display()
    );
    let out = dir.join(name.trim_end_matches(".xz"));
    let f = std::fs::File::create(&out).unwrap();
    let st = Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .stdout(f)
        .status()
        .expect("xz must be installed");
    assert!(st.success(), "xz -dc {} failed", src.display());
    out
}

/// Unpacks a `.tar.xz` archive from the images directory into `dir`.
pub fn untar(name: &str, dir: &TempDir) {
    let src = images_dir().join(name);
    assert!(src.exists(), "test archive {} missing", src.display());
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(&src)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar must be installed");
    assert!(st.success(), "tar xJf {} failed", src.display());
}

/// The rows of expected.tsv: (case, archive, path, format, extra, secret_kind, secret, expect, value).
pub fn expected_rows() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(images_dir().join("expected.tsv")).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex(&cryptblk_cipher::hash::HashAlgorithm::Sha256.digest(&[b]))
}

pub fn sha1_hex(b: &[u8]) -> String {
    hex(&cryptblk_cipher::hash::HashAlgorithm::Sha1.digest(&[b]))
}

/// Decrypts `data` (whole 512-byte sectors, IV sector 0 at its start) with dm-crypt rules.
pub fn decrypt(spec: &str, key: &[u8], data: &mut [u8]) {
    let c = cryptblk_cipher::open_cipher(spec, key, &cryptblk_cipher::SectorOptions::default())
        .unwrap_or_else(|e| panic!("cipher {spec}: {e}"));
    c.decrypt(0, data).unwrap();
}

/// Fails loudly unless the tool exists or CRYPTBLK_SKIP_<WHAT>=1 is set; returns false to skip.
pub fn require_tool(tool: &str, skip_var: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        return true;
    }
    if std::env::var(skip_var).as_deref() == Ok("1") {
        eprintln!("SKIPPED: {tool} not available and {skip_var}=1");
        return false;
    }
    panic!("{tool} is required for this test (set {skip_var}=1 to skip explicitly)");
}

/// Runs cryptsetup with `args`, returning (exit code, stdout, stderr).
pub fn cryptsetup(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("cryptsetup")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cryptsetup");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cryptsetup luksDump --dump-volume-key` parsed into bytes.
pub fn cryptsetup_volume_key(img: &Path, key_file: &Path) -> Vec<u8> {
    let (rc, out, err) = cryptsetup(&[
        "luksDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        key_file.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "cryptsetup luksDump --dump-volume-key failed: {err}");
    let mut hexs = String::new();
    let mut on = false;
    for line in out.lines() {
        if line.starts_with("MK dump:") {
            on = true;
            hexs.push_str(line.trim_start_matches("MK dump:"));
        } else if on && line.starts_with('\t') {
            hexs.push_str(line);
        } else {
            on = false;
        }
    }
    let clean: String = hexs.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..clean.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&clean[i..i + 2], 16).unwrap())
        .collect()
}

/// The FAT volume serial at 0x27 of a FAT12/16 boot sector, formatted as blkid does.
pub fn fat_serial(boot: &[u8]) -> String {
    let v = u32::from_le_bytes(boot[0x27..0x2b].try_into().unwrap());
    format!("{:04X}-{:04X}", v >> 16, v & 0xffff)
}
