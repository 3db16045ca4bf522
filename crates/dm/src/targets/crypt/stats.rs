//! Request counters of a crypt target.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, updated with relaxed atomics (they are statistics, not synchronisation).
#[derive(Default)]
pub struct CryptStats {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    discards: AtomicU64,
    flushes: AtomicU64,
    errors: AtomicU64,
    integrity_errors: AtomicU64,
}

/// A copy of [`CryptStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CryptStatsSnapshot {
    /// Completed reads.
    pub reads: u64,
    /// Completed writes.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Discards passed down.
    pub discards: u64,
    /// Flushes.
    pub flushes: u64,
    /// Failed requests.
    pub errors: u64,
    /// Sectors whose authentication tag did not match (`integrity:<n>:aead`; each failed
    /// the read with `EILSEQ`, like the kernel's "INTEGRITY AEAD ERROR").
    pub integrity_errors: u64,
}

impl CryptStats {
    pub(crate) fn read(&self, bytes: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub(crate) fn write(&self, bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub(crate) fn discard(&self, _bytes: u64) {
        self.discards.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn integrity_error(&self) {
        self.integrity_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads all counters.
    pub fn snapshot(&self) -> CryptStatsSnapshot {
        CryptStatsSnapshot {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            discards: self.discards.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            integrity_errors: self.integrity_errors.load(Ordering::Relaxed),
        }
    }
}
