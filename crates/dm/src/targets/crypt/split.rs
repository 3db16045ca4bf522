//! Splitting one large request's crypto across cores.
//!
//! A process-wide pool of helper threads (one fewer than the CPUs) serves one split request
//! at a time. The request is cut into pieces of whole 4 KiB blocks; the caller and any idle
//! helpers claim pieces from a shared counter until none are left. Because the caller works
//! too and never waits for a helper to *start*, a split request is not slower than an unsplit
//! one when every other core is busy: the caller simply ends up doing all the pieces.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

use crate::SECTOR_SIZE;

/// When an inline request's crypto is divided among several threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitPolicy {
    /// Always on the calling thread.
    #[default]
    Off,
    /// Requests of at least this many bytes are cut into pieces shared by the caller and the
    /// helper pool.
    Above(usize),
}

impl SplitPolicy {
    /// Short description for status output.
    pub fn describe(&self) -> String {
        match self {
            SplitPolicy::Off => "off".into(),
            SplitPolicy::Above(n) => format!(">={n}"),
        }
    }

    /// Whether a request of `len` bytes is split.
    pub(crate) fn splits(&self, len: usize) -> bool {
        matches!(self, SplitPolicy::Above(n) if len >= *n && len >= 2 * PIECE_MIN)
    }

    /// Runs `op(sector, piece)` over `buf` (starting at 512-byte `sector`), split per policy.
    pub(crate) fn run(
        &self,
        buf: &mut [u8],
        sector: u64,
        op: impl Fn(u64, &mut [u8]) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        match self {
            _ if self.splits(buf.len()) => run_split(buf, sector, &op),
            _ => op(sector, buf),
        }
    }
}

/// Smallest piece: whole 4 KiB blocks hold whole encryption sectors of any size.
const PIECE_MIN: usize = 4096;

/// One piece's work (device I/O and crypto), starting at a 512-byte sector.
type SectorOp<'a> = dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync + 'a;

/// One split request, living on the caller's stack while helpers may reference it.
struct Task<'a> {
    op: &'a SectorOp<'a>,
    base: *mut u8,
    len: usize,
    piece: usize,
    pieces: usize,
    sector: u64,
    next: AtomicUsize,
    finished: AtomicUsize,
    error: Mutex<Option<io::Error>>,
}

impl Task<'_> {
    /// Claims and runs pieces until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.pieces {
                return;
            }
            let start = i * self.piece;
            let n = self.piece.min(self.len - start);
            // SAFETY: pieces are disjoint sub-slices of the caller's buffer, each claimed by
            // exactly one thread via `next`; the caller keeps the buffer alive until every
            // piece is finished.
            let chunk = unsafe { std::slice::from_raw_parts_mut(self.base.add(start), n) };
            let r = (self.op)(self.sector + (start as u64) / SECTOR_SIZE, chunk);
            if let Err(e) = r {
                let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(e);
            }
            self.finished.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The posted task (type-erased pointer) and how many helpers are inside it.
struct Slot {
    task: usize,
    /// Bumped per posted task, so a helper joins each task at most once even if a later
    /// task reuses the same stack address.
    generation: u64,
    helpers_inside: usize,
}

struct Pool {
    slot: Mutex<Slot>,
    posted: Condvar,
    left: Condvar,
    helpers: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool {
            slot: Mutex::new(Slot {
                task: 0,
                generation: 0,
                helpers_inside: 0,
            }),
            posted: Condvar::new(),
            left: Condvar::new(),
            helpers: cpus.saturating_sub(1),
        }
    })
}

fn start_helpers() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        for i in 0..pool().helpers {
            // If a helper cannot start, splitting degrades to the caller doing everything.
            let _ = std::thread::Builder::new()
                .name(format!("kcryptd_split/{i}"))
                .spawn(helper_loop);
        }
    });
}

fn helper_loop() {
    let p = pool();
    let mut joined = 0u64;
    loop {
        let task_ptr = {
            let mut s = p.slot.lock().unwrap_or_else(|e| e.into_inner());
            while s.task == 0 || s.generation == joined {
                s = p.posted.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.helpers_inside += 1;
            joined = s.generation;
            s.task
        };
        // SAFETY: the caller does not return (and the Task stays alive) until it has taken
        // the task out of the slot and `helpers_inside` is back to zero.
        let task = unsafe { &*(task_ptr as *const Task<'_>) };
        task.work();
        let mut s = p.slot.lock().unwrap_or_else(|e| e.into_inner());
        s.helpers_inside -= 1;
        if s.helpers_inside == 0 {
            p.left.notify_all();
        }
    }
}

fn run_split(buf: &mut [u8], sector: u64, op: &SectorOp<'_>) -> io::Result<()> {
    let p = pool();
    if p.helpers == 0 {
        return op(sector, buf);
    }
    start_helpers();
    let ways = p.helpers + 1;
    let piece = (buf.len() / ways)
        .next_multiple_of(PIECE_MIN)
        .max(PIECE_MIN);
    let task = Task {
        op,
        base: buf.as_mut_ptr(),
        len: buf.len(),
        piece,
        pieces: buf.len().div_ceil(piece),
        sector,
        next: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        error: Mutex::new(None),
    };
    let addr = &task as *const Task<'_> as usize;
    {
        let mut s = p.slot.lock().unwrap_or_else(|e| e.into_inner());
        if s.task != 0 || s.helpers_inside != 0 {
            // Another request holds the pool: do it all here rather than queue behind it.
            drop(s);
            return op(sector, buf);
        }
        s.task = addr;
        s.generation += 1;
        p.posted.notify_all();
    }
    task.work();
    {
        // Retire the task: no new helper can enter; wait for those inside to leave.
        let mut s = p.slot.lock().unwrap_or_else(|e| e.into_inner());
        s.task = 0;
        while s.helpers_inside > 0 {
            s = p.left.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
    debug_assert_eq!(task.finished.load(Ordering::Acquire), task.pieces);
    let err = task.error.lock().unwrap_or_else(|e| e.into_inner()).take();
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
