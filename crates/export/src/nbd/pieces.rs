//! Large requests in pieces, so one piece's device I/O (and its crypto, for a crypt table)
//! overlaps the transfer of another: a large read's first pieces are sent while helpers
//! still decrypt the later ones; a large write's first pieces are encrypted and written
//! while the rest is still arriving from the client.
//!
//! Any thread may run any piece: pieces are claimed from a counter, so a thread that waits
//! for the whole request (the connection's worker) claims and runs the pieces no helper has
//! started, and only ever waits for a piece another thread is running. A helper job that
//! the pool starts late finds nothing to claim and ends; no thread waits for a job that may
//! sit queued behind others, so a busy pool cannot deadlock.
//!
//! Piece boundaries fall on multiples of [`PIECE`] in device offsets, so only the first and
//! last piece of an unaligned request touch a partial block, never two pieces one block.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use cryptblk_dm::device::WriteFlags;

use crate::aligned::AlignedIo;

/// Size of a piece (in device offsets; the first and last may be shorter). Large enough that
/// a piece's crypto dwarfs the hand-off (a few microseconds), small enough that a 1 MiB
/// request has several pieces to overlap.
pub(crate) const PIECE: usize = 128 << 10;

/// Requests from this size up are done in pieces by default (at least two pieces); 0: never.
///
/// Off by default, from `scripts/nbd-overlap-ab.sh` (crypt aes-xts-plain64, 4096-byte
/// sectors, randrw, A with pieces at 256 KiB, B without, 7 alternating rounds of 2 s, the
/// median A/B of bandwidth) on this project's 2-core machine at load 14: 1 MiB QD1 read 0.42
/// and write 0.49 (B faster in 7 rounds of 7), 256 KiB QD1 0.48/0.45, 1 MiB QD4 0.88/0.75.
/// A piece that a helper claimed is waited for by the request's thread, and on busy cores
/// the helper is preempted for whole time slices; without pieces a lone request now runs on
/// the connection's reader with no hand-off at all. Overlap can only win with an idle core
/// to spare, which the bench cannot count on; `CRYPTBLK_NBD_OVERLAP_MIN=262144` turns it on
/// to measure that case.
pub(crate) const DEFAULT_OVERLAP_MIN: usize = 0;

/// What each piece does.
#[derive(Clone, Copy)]
pub(crate) enum PieceOp {
    /// Read the piece's bytes from the device into the buffer.
    Read,
    /// Write the buffer's bytes to the device (the buffer may be clobbered).
    Write(WriteFlags),
}

/// Progress shared by the threads working on one request.
struct Progress {
    /// Per piece: `None` until it has run, then its result (taken when consumed).
    results: Vec<Option<io::Result<()>>>,
    /// Set when pieces will never become available (a write's payload stopped arriving).
    aborted: bool,
}

/// One request's buffer and pieces.
pub(crate) struct Pieces {
    /// The buffer, owned (freed in `Drop`); pieces are disjoint ranges of it, each written
    /// by the one thread that claimed the piece.
    base: *mut u8,
    len: usize,
    /// Device offset of the buffer's first byte.
    offset: u64,
    op: PieceOp,
    count: usize,
    /// Next piece to claim.
    next: AtomicUsize,
    /// Pieces that may be claimed: all of a read's; a write's as they arrive.
    available: AtomicUsize,
    progress: Mutex<Progress>,
    changed: Condvar,
}

// SAFETY: the raw buffer is only touched through disjoint per-piece ranges, each by the
// thread that claimed that piece (the claim counter hands out each index once), or read by
// the consumer after the piece's completion was published under `progress`'s lock.
unsafe impl Send for Pieces {}
// SAFETY: as above.
unsafe impl Sync for Pieces {}

impl Pieces {
    /// A request of `len` bytes at device `offset`; a read's pieces are all available at
    /// once, a write's as [`Pieces::arrived`] says.
    pub(crate) fn new(offset: u64, len: usize, op: PieceOp) -> Self {
        let buf = vec![0u8; len].into_boxed_slice();
        let base = Box::into_raw(buf) as *mut u8;
        let head = PIECE - (offset % PIECE as u64) as usize;
        let count = if len <= head {
            1
        } else {
            1 + (len - head).div_ceil(PIECE)
        };
        let available = match op {
            PieceOp::Read => count,
            PieceOp::Write(_) => 0,
        };
        Pieces {
            base,
            len,
            offset,
            op,
            count,
            next: AtomicUsize::new(0),
            available: AtomicUsize::new(available),
            progress: Mutex::new(Progress {
                results: (0..count).map(|_| None).collect(),
                aborted: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// Number of pieces.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Byte range of piece `k` within the buffer.
    pub(crate) fn range(&self, k: usize) -> std::ops::Range<usize> {
        let head = PIECE - (self.offset % PIECE as u64) as usize;
        let start = if k == 0 { 0 } else { head + (k - 1) * PIECE };
        let end = if k == 0 { head } else { start + PIECE };
        start.min(self.len)..end.min(self.len)
    }

    /// Device offset of piece `k`.
    pub(crate) fn offset_of(&self, k: usize) -> u64 {
        self.offset + self.range(k).start as u64
    }

    /// Piece `k`'s bytes, for the one thread that owns it now: the claimer while it runs,
    /// the receiver of a write before it is made available.
    ///
    /// # Safety
    /// The caller must own piece `k` exclusively (claimed it, or it is not available yet
    /// and the caller is the request's only receiver).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn piece_mut(&self, k: usize) -> &mut [u8] {
        let r = self.range(k);
        // SAFETY: in bounds of the owned buffer; exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(r.start), r.len()) }
    }

    /// Piece `k`'s bytes after it completed (see [`Pieces::wait`]); no thread writes them
    /// any more.
    pub(crate) fn done_piece(&self, k: usize) -> &[u8] {
        let r = self.range(k);
        // SAFETY: in bounds; the piece finished (its writer is done, published under the
        // progress lock the caller went through) and is never claimed again.
        unsafe { std::slice::from_raw_parts(self.base.add(r.start), r.len()) }
    }

    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write's pieces up to `n` have arrived whole and may be written.
    pub(crate) fn arrived(&self, n: usize) {
        let _p = self.progress();
        self.available.store(n.min(self.count), Ordering::Release);
        self.changed.notify_all();
    }

    /// No more pieces will arrive (the client went away mid-payload): helpers stop waiting.
    pub(crate) fn abort(&self) {
        self.progress().aborted = true;
        self.changed.notify_all();
    }

    /// Claims the next available piece and runs it; false when none is available now.
    fn claim_and_run(&self, io: &AlignedIo) -> bool {
        let claimed = self
            .next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.available.load(Ordering::Acquire)).then_some(n + 1)
            });
        let Ok(k) = claimed else {
            return false;
        };
        let at = self.offset_of(k);
        // SAFETY: piece k was claimed by this thread alone (fetch_update hands out k once).
        let buf = unsafe { self.piece_mut(k) };
        let result = match self.op {
            PieceOp::Read => io.read_at(at, buf),
            PieceOp::Write(flags) => io.write_at_scratch(at, buf, flags),
        };
        self.progress().results[k] = Some(result);
        self.changed.notify_all();
        true
    }

    /// A helper's share: runs pieces as they become available until all are claimed (or
    /// no more will arrive).
    pub(crate) fn help(&self, io: &AlignedIo) {
        loop {
            if self.claim_and_run(io) {
                continue;
            }
            if self.next.load(Ordering::Acquire) >= self.count {
                return;
            }
            // A write whose next piece has not arrived: wait for it (or the end).
            let p = self.progress();
            let p = self
                .changed
                .wait_while(p, |p| {
                    !p.aborted
                        && self.next.load(Ordering::Acquire)
                            >= self.available.load(Ordering::Acquire)
                        && self.next.load(Ordering::Acquire) < self.count
                })
                .unwrap_or_else(|e| e.into_inner());
            if p.aborted {
                return;
            }
        }
    }

    /// Piece `k`'s result, once it has run: meanwhile this thread runs pieces nobody has
    /// claimed, and waits only for a piece another thread is running. All pieces must be
    /// available (a read, or a write whose payload has fully arrived).
    pub(crate) fn wait(&self, io: &AlignedIo, k: usize) -> io::Result<()> {
        loop {
            {
                let mut p = self.progress();
                if let Some(r) = p.results[k].take() {
                    return r;
                }
            }
            if self.claim_and_run(io) {
                continue;
            }
            // Piece k is running on another thread: wait for it.
            let p = self.progress();
            let mut p = self
                .changed
                .wait_while(p, |p| p.results[k].is_none())
                .unwrap_or_else(|e| e.into_inner());
            if let Some(r) = p.results[k].take() {
                return r;
            }
        }
    }

    /// Waits for every piece (running the unclaimed ones here); the first failure in
    /// device order, with its offset, if any.
    pub(crate) fn finish(&self, io: &AlignedIo) -> Result<(), (u64, io::Error)> {
        let mut first = None;
        for k in 0..self.count {
            if let Err(e) = self.wait(io, k) {
                first.get_or_insert((self.offset_of(k), e));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The buffer's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Pieces {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw from a boxed slice of `len` bytes in `new`; no
        // reference into it outlives `self`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, self.len)) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_dm::RamDisk;
    use std::sync::Arc;

    fn disk(len: u64) -> AlignedIo {
        AlignedIo::new(Arc::new(RamDisk::new(len).unwrap()))
    }

    #[test]
    fn piece_ranges_fall_on_piece_multiples_and_cover_the_buffer() {
        for (offset, len) in [
            (0u64, 1usize << 20),
            (512, (1 << 20) - 1000),
            (PIECE as u64 - 1, 3 * PIECE + 7),
            (5, 10),
        ] {
            let p = Pieces::new(offset, len, PieceOp::Read);
            let mut end = 0;
            for k in 0..p.count() {
                let r = p.range(k);
                assert_eq!(r.start, end, "contiguous");
                assert!(!r.is_empty());
                if k > 0 {
                    assert_eq!(p.offset_of(k) % PIECE as u64, 0);
                }
                end = r.end;
            }
            assert_eq!(end, len);
        }
    }

    /// A helper thread that says when it ends, so a stuck helper fails the test after a
    /// deadline instead of hanging it (std's join has no timeout).
    fn spawn_helper(f: impl FnOnce() + Send + 'static) -> std::sync::mpsc::Receiver<()> {
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        ended
    }

    fn joined_within_10s(ended: std::sync::mpsc::Receiver<()>) {
        ended
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a helper still runs 10 s after its request finished");
    }

    /// Pieces run on helper threads and the waiting thread read and write what a plain
    /// whole-buffer read and write would, also when the helpers start late or never.
    #[test]
    fn pieces_match_whole_requests_with_or_without_helpers() {
        let io = Arc::new(disk(4 << 20));
        let data: Vec<u8> = (0..(1 << 20) + 3000)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect();
        let offset = 3 * 512 + 1;
        for helpers in [0usize, 1, 3] {
            let w = Arc::new(Pieces::new(
                offset,
                data.len(),
                PieceOp::Write(WriteFlags::default()),
            ));
            let mut threads = Vec::new();
            for _ in 0..helpers {
                let (w, io) = (Arc::clone(&w), Arc::clone(&io));
                threads.push(spawn_helper(move || w.help(&io)));
            }
            for k in 0..w.count() {
                let r = w.range(k);
                // SAFETY: piece k is not available yet; this thread is its only receiver.
                unsafe { w.piece_mut(k) }.copy_from_slice(&data[r]);
                w.arrived(k + 1);
            }
            w.finish(&io).unwrap();
            for t in threads {
                joined_within_10s(t);
            }
            let mut back = vec![0u8; data.len()];
            io.read_at(offset, &mut back).unwrap();
            assert_eq!(back, data, "write with {helpers} helpers");

            let r = Arc::new(Pieces::new(offset, data.len(), PieceOp::Read));
            let mut threads = Vec::new();
            for _ in 0..helpers {
                let (r, io) = (Arc::clone(&r), Arc::clone(&io));
                threads.push(spawn_helper(move || r.help(&io)));
            }
            let mut got = Vec::new();
            for k in 0..r.count() {
                r.wait(&io, k).unwrap();
                got.extend_from_slice(r.done_piece(k));
            }
            for t in threads {
                joined_within_10s(t);
            }
            assert_eq!(got, data, "read with {helpers} helpers");
            io.write_at(offset, &vec![0u8; data.len()], WriteFlags::default())
                .unwrap();
        }
    }

    /// A helper waiting for a write's next piece leaves when the payload stops arriving.
    #[test]
    fn abort_releases_waiting_helpers() {
        let io = Arc::new(disk(1 << 20));
        let w = Arc::new(Pieces::new(
            0,
            4 * PIECE,
            PieceOp::Write(WriteFlags::default()),
        ));
        let (left, helper_left) = std::sync::mpsc::channel();
        {
            let (w, io) = (Arc::clone(&w), Arc::clone(&io));
            std::thread::spawn(move || {
                w.help(&io);
                let _ = left.send(());
            });
        }
        w.arrived(1);
        w.abort();
        // A helper left waiting is the failure: a timeout, not a hung test.
        helper_left
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the helper still waits 10 s after abort");
    }
}
