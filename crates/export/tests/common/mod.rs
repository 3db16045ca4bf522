//! Shared helpers of the export tests: an in-memory device, temp dirs, tool checks.
#![allow(dead_code)]

pub mod nbd_client;

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cryptblk_dm::device::{check_range, BlockDevice, WriteFlags};

/// A RAM disk obeying the BlockDevice contract strictly (alignment to its logical block
/// size, EIO past the end), with an optional range that fails reads with EIO.
pub struct MemDisk {
    data: RwLock<Vec<u8>>,
    block: u32,
    pub fail_reads: RwLock<Option<(u64, u64)>>,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
}

impl MemDisk {
    pub fn new(size: u64, block: u32) -> Arc<MemDisk> {
        Arc::new(MemDisk {
            data: RwLock::new(vec![0u8; size as usize]),
            block,
            fail_reads: RwLock::new(None),
            flushes: AtomicU64::new(0),
            discards: AtomicU64::new(0),
        })
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().unwrap().clone()
    }

    /// Changes the size, as a table reload does to a mapping: kept bytes stay, new ones
    /// read as zeros.
    pub fn resize(&self, size: u64) {
        self.data.write().unwrap().resize(size as usize, 0);
    }

    pub fn fill(&self, bytes: &[u8]) {
        self.data.write().unwrap().copy_from_slice(bytes);
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        let b = u64::from(self.block);
        if !offset.is_multiple_of(b) || !len.is_multiple_of(b) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

impl BlockDevice for MemDisk {
    fn size(&self) -> u64 {
        self.data.read().unwrap().len() as u64
    }

    fn logical_block_size(&self) -> u32 {
        self.block
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        if let Some((start, len)) = *self.fail_reads.read().unwrap() {
            if offset < start + len && start < offset + buf.len() as u64 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        let data = self.data.read().unwrap();
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let mut data = self.data.write().unwrap();
        data[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.discards.fetch_add(1, Ordering::SeqCst);
        // Discarded data reads back as a recognisable non-zero pattern, so a test can tell
        // "discarded" apart from "zeroed".
        let mut data = self.data.write().unwrap();
        data[offset as usize..(offset + len) as usize].fill(0xdd);
        Ok(())
    }
}

/// A directory under /tmp removed (best effort) on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "cryptblk-export-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
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

/// Deterministic pseudo-random bytes (xorshift64*), so failures are reproducible.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Whether `tool` can be run. A missing tool fails the test unless CRYPTBLK_SKIP_<WHAT>=1.
pub fn require_tool(tool: &str, what: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if found {
        return true;
    }
    let var = format!("CRYPTBLK_SKIP_{what}");
    if std::env::var(&var).as_deref() == Ok("1") {
        eprintln!("SKIPPED: {tool} is missing and {var}=1");
        return false;
    }
    panic!("{tool} is required by this test (install it, or set {var}=1 to skip explicitly)");
}

/// Runs a command and fails the test with its output when it exits non-zero.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Like `run`, returning stdout as text.
pub fn run_text(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}
