//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// Deterministic xorshift64* generator (tests must be reproducible).
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A fresh temporary directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cryptblk-dm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The independent pyca/cryptography dm-crypt model shipped with the repository.
pub fn dmcrypt_py() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/independent/dmcrypt.py"
    ))
}

/// Fails loudly unless python3 with `cryptography` is present or CRYPTBLK_SKIP_PYCA=1.
pub fn require_pyca() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CRYPTBLK_SKIP_PYCA").as_deref() == Ok("1") {
            eprintln!("SKIPPED: python3 cryptography missing and CRYPTBLK_SKIP_PYCA=1");
            return false;
        }
        panic!("python3 with pyca/cryptography is required (set CRYPTBLK_SKIP_PYCA=1 to skip)");
    }
    true
}

pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

pub const KEY64: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

/// A plain in-memory disk, independent of the crate's own backings (so tests of targets
/// do not rest on the code they test).
pub struct MemDisk(pub std::sync::Mutex<Vec<u8>>);

impl MemDisk {
    /// A zeroed disk of `len` bytes.
    pub fn new(len: u64) -> std::sync::Arc<MemDisk> {
        Self::from_image(vec![0u8; len as usize])
    }

    /// A disk holding `image`.
    pub fn from_image(image: Vec<u8>) -> std::sync::Arc<MemDisk> {
        std::sync::Arc::new(MemDisk(std::sync::Mutex::new(image)))
    }

    /// Flips the bits of `mask` in the byte at `at`.
    pub fn flip(&self, at: u64, mask: u8) {
        self.0.lock().unwrap()[at as usize] ^= mask;
    }

    /// A copy of the whole disk.
    pub fn image(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl cryptblk_dm::BlockDevice for MemDisk {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
        let d = self.0.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(
        &self,
        offset: u64,
        buf: &[u8],
        _f: cryptblk_dm::WriteFlags,
    ) -> std::io::Result<()> {
        cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
        self.0.lock().unwrap()[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Power cut after a number of writes: passes the first `budget` writes through; the next
/// one is dropped or, if `torn`, half of its sectors land; every later write and flush
/// fails like a dead disk.
pub struct CrashDisk {
    pub inner: std::sync::Arc<MemDisk>,
    pub budget: std::sync::atomic::AtomicI64,
    pub torn: bool,
    /// Writes attempted so far (to know how many crash points a workload has).
    pub writes: std::sync::atomic::AtomicU64,
}

impl CrashDisk {
    /// A disk over `inner` that dies at write number `budget` (0-based).
    pub fn new(inner: std::sync::Arc<MemDisk>, budget: i64, torn: bool) -> std::sync::Arc<Self> {
        std::sync::Arc::new(CrashDisk {
            inner,
            budget: std::sync::atomic::AtomicI64::new(budget),
            torn,
            writes: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

impl cryptblk_dm::BlockDevice for CrashDisk {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8], f: cryptblk_dm::WriteFlags) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        self.writes.fetch_add(1, Ordering::SeqCst);
        let left = self.budget.fetch_sub(1, Ordering::SeqCst);
        if left > 0 {
            return self.inner.write_at(offset, buf, f);
        }
        if left == 0 && self.torn && buf.len() > 512 {
            let half = buf.len() / 512 / 2 * 512;
            self.inner.write_at(offset, &buf[..half], f)?;
        }
        Err(std::io::Error::from_raw_os_error(libc::EIO))
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.budget.load(std::sync::atomic::Ordering::SeqCst) < 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// Folder `tests/<set>` of committed fixtures (images made in the kernel lab, with the
/// scripts that made them).
pub fn fixture_dir(set: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(set)
}

/// The text of `tests/<set>/<file>` (a table, dump or verdict file the lab recorded).
pub fn fixture_text(set: &str, file: &str) -> String {
    let p = fixture_dir(set).join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Decompresses `tests/<set>/<name>.img.xz` to `<dir>/<name>.img` and returns its path.
pub fn unpack_fixture(set: &str, name: &str, dir: &std::path::Path) -> PathBuf {
    let src = fixture_dir(set).join(format!("{name}.img.xz"));
    let dst = dir.join(format!("{name}.img"));
    let out = std::process::Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .output()
        .expect("xz must be installed");
    assert!(
        out.status.success(),
        "xz -dc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&dst, out.stdout).unwrap();
    dst
}

/// `len` bytes of xorshift64 output from `seed`, little endian: the pattern the lab
/// scripts write through kernel mappings.
pub fn xorshift_pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `p` opened as a file backing with default options.
pub fn open_file(p: &std::path::Path) -> std::sync::Arc<dyn cryptblk_dm::BlockDevice> {
    std::sync::Arc::new(
        cryptblk_dm::FileBacking::open(p, cryptblk_dm::FileOptions::default()).unwrap(),
    )
}

/// Passes `budget` writes, then fails everything: leaves committed journal entries that
/// were never written home.
pub struct CutDisk {
    pub inner: std::sync::Arc<dyn cryptblk_dm::BlockDevice>,
    pub budget: std::sync::atomic::AtomicI64,
}

impl cryptblk_dm::BlockDevice for CutDisk {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8], f: cryptblk_dm::WriteFlags) -> std::io::Result<()> {
        if self
            .budget
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            > 0
        {
            return self.inner.write_at(offset, buf, f);
        }
        Err(std::io::Error::from_raw_os_error(libc::EIO))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
