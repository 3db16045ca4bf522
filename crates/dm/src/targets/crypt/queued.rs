//! The kernel's default dm-crypt processing model, rebuilt with real threads.
//!
//! - Reads: the caller hands the request to the `kcryptd_io` thread, which submits it to the
//!   lower device; once the ciphertext is in, the request is queued to the `kcryptd` crypt
//!   pool for decryption, and the worker completes it.
//! - Writes: the caller queues the request to the crypt pool; a worker encrypts it (into a
//!   pooled bounce buffer, or in place when the caller lent its buffer as scratch) and hands
//!   it to the single `dmcrypt_write` thread, which takes every pending write at once, sorts
//!   them by sector and submits them in that order. With `submit_from_crypt_cpus` the worker
//!   submits directly.
//! - The crypt pool has one worker per CPU. By default any idle worker takes the next job
//!   (the kernel's unbound `kcryptd` workqueue); with `same_cpu_crypt` each worker is pinned
//!   to its CPU and only runs jobs submitted from that CPU (a bound per-CPU workqueue).
//!
//! Our [`crate::BlockDevice`] API is synchronous, so the caller blocks on a completion until
//! its request has gone through every hop; the hops themselves are genuine hand-offs between
//! threads, with the wake-up and cache costs that implies.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use cryptblk_cipher::SectorCipher;

use super::{cipher_io, CryptFlags, CryptStats};
use crate::device::{BlockDevice, WriteFlags};
use crate::SECTOR_SIZE;

/// Bounce buffers kept for reuse; more than this many idle ones are freed.
const BOUNCE_POOL_MAX: usize = 64;

/// Where a finished request's result goes; the submitting thread waits on it.
struct Completion {
    result: Mutex<Option<io::Result<()>>>,
    ready: Condvar,
}

impl Completion {
    fn new() -> Self {
        Completion {
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    fn complete(&self, r: io::Result<()>) {
        *lock(&self.result) = Some(r);
        self.ready.notify_one();
    }

    fn wait(&self) -> io::Result<()> {
        let mut g = lock(&self.result);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

thread_local! {
    /// Each submitting thread has at most one request in flight, so one completion per
    /// thread, reused, keeps the steady state allocation-free.
    static COMPLETION: Arc<Completion> = Arc::new(Completion::new());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Queue state stays consistent across a panicking holder (push/pop are single calls).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    /// A write; `in_place` = the caller's buffer may be encrypted in place.
    Write {
        in_place: bool,
    },
}

/// One request travelling through the queues.
struct Job {
    kind: Kind,
    /// Target-relative byte offset.
    offset: u64,
    data: *mut u8,
    len: usize,
    flags: WriteFlags,
    /// Ciphertext buffer for writes that may not touch the caller's data.
    bounce: Option<Vec<u8>>,
    done: Arc<Completion>,
    /// CPU the request was submitted from.
    cpu: usize,
}

// SAFETY: `data` points into the buffer of a caller that is blocked in `Completion::wait`
// until the job completes; only the thread currently holding the job touches it, and
// nothing touches it after `complete`.
unsafe impl Send for Job {}

impl Job {
    /// The caller's buffer.
    ///
    /// # Safety
    /// Only while the job has not completed (see the `Send` impl).
    unsafe fn data(&mut self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.data, self.len)
    }
}

/// A FIFO with a condition variable: the body of a workqueue.
struct JobQueue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl JobQueue {
    fn new() -> Self {
        JobQueue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        }
    }

    fn push(&self, job: Job) {
        lock(&self.jobs).push_back(job);
        self.ready.notify_one();
    }

    /// Next job, or `None` once stopping and empty.
    fn pop(&self, stop: &AtomicBool) -> Option<Job> {
        let mut q = lock(&self.jobs);
        loop {
            if let Some(j) = q.pop_front() {
                return Some(j);
            }
            if stop.load(Ordering::Acquire) {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Moves every queued job into `out`, waiting for at least one; false once stopping.
    fn drain(&self, stop: &AtomicBool, out: &mut Vec<Job>) -> bool {
        let mut q = lock(&self.jobs);
        loop {
            if !q.is_empty() {
                out.extend(q.drain(..));
                return true;
            }
            if stop.load(Ordering::Acquire) {
                return false;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn wake_all(&self) {
        let _g = lock(&self.jobs);
        self.ready.notify_all();
    }
}

struct Shared {
    cipher: Arc<dyn SectorCipher>,
    dev: Arc<dyn BlockDevice>,
    /// Byte offset of the data on `dev`.
    base: u64,
    flags: CryptFlags,
    io_queue: JobQueue,
    /// The unbound crypt queue any worker serves.
    crypt_any: JobQueue,
    /// Per-CPU crypt queues for `same_cpu_crypt`.
    crypt_per_cpu: Vec<JobQueue>,
    /// The CPU numbers this process may run on when the engine started, in order: worker i
    /// serves (and with `same_cpu_crypt` is bound to) `cpus[i]`. In a container or under
    /// `taskset` these are not 0..n.
    cpus: Vec<usize>,
    write_queue: JobQueue,
    bounce: Mutex<Vec<Vec<u8>>>,
    stop: AtomicBool,
    _stats: Arc<CryptStats>,
}

/// The thread set of a queued crypt target; stopped and joined on drop.
pub struct QueuedEngine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn current_cpu() -> usize {
    // SAFETY: no arguments, no memory touched.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// The CPUs the calling thread may run on (CPU 0 alone if the kernel will not say).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; the kernel writes at most its size; CPU_ISSET stays
    // inside the set for c < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if cpus.is_empty() {
            vec![0]
        } else {
            cpus
        }
    }
}

/// dm-crypt's `high_priority` runs its workqueues as `WQ_HIGHPRI` (nice -20) and its writer
/// thread at nice -20 (`MIN_NICE`); this is the same for the threads that stand in for them.
const HIGH_PRIORITY_NICE: libc::c_int = -20;

/// The calling thread at [`HIGH_PRIORITY_NICE`] while the pipeline's threads are spawned,
/// its own nice value restored on drop.
///
/// Raising priority needs CAP_SYS_NICE (or an RLIMIT_NICE that allows it). Without it
/// `setpriority` fails with EPERM: the threads keep the caller's priority, the mapping works
/// as without the flag, and one warning says so.
struct RaisedNice {
    tid: libc::id_t,
    before: Option<libc::c_int>,
}

impl RaisedNice {
    fn for_spawning() -> Self {
        // SAFETY: gettid/getpriority/setpriority have no memory preconditions.
        let tid = unsafe { libc::gettid() } as libc::id_t;
        // getpriority may legitimately return -1: errno tells errors apart.
        let before = unsafe {
            *libc::__errno_location() = 0;
            let v = libc::getpriority(libc::PRIO_PROCESS, tid);
            (*libc::__errno_location() == 0).then_some(v)
        };
        let raised = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, HIGH_PRIORITY_NICE) } == 0;
        if !raised {
            log::warn!(
                "high_priority: cannot raise the crypt threads to nice {HIGH_PRIORITY_NICE} \
                 ({}); they run at normal priority (needs CAP_SYS_NICE)",
                io::Error::last_os_error()
            );
        }
        RaisedNice {
            tid,
            before: if raised { before } else { None },
        }
    }
}

impl Drop for RaisedNice {
    fn drop(&mut self) {
        if let Some(v) = self.before {
            // SAFETY: as above. Lowering priority back never needs a capability.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid, v) };
        }
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            // Best effort: an affinity failure (e.g. restricted cpuset) only loses locality.
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

impl QueuedEngine {
    /// Starts `kcryptd_io`, one `kcryptd` worker per CPU and `dmcrypt_write`.
    pub(crate) fn start(
        cipher: Arc<dyn SectorCipher>,
        dev: Arc<dyn BlockDevice>,
        base: u64,
        flags: CryptFlags,
        stats: Arc<CryptStats>,
    ) -> io::Result<QueuedEngine> {
        let allowed = allowed_cpus();
        let cpus = allowed.len();
        let shared = Arc::new(Shared {
            cipher,
            dev,
            base,
            flags,
            io_queue: JobQueue::new(),
            crypt_any: JobQueue::new(),
            crypt_per_cpu: (0..cpus).map(|_| JobQueue::new()).collect(),
            cpus: allowed,
            write_queue: JobQueue::new(),
            bounce: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            _stats: stats,
        });
        // Built before any thread exists, so an early return just drops it; if a later spawn
        // fails, dropping the engine stops and joins the threads already started.
        let mut engine = QueuedEngine {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        // high_priority: the threads are created at nice -20 (a new thread inherits its
        // creator's nice value), so they run at it from their first instruction and no
        // request can reach one before it was raised.
        let _raised = flags.high_priority.then(RaisedNice::for_spawning);
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> io::Result<()> {
            let h = std::thread::Builder::new().name(name).spawn(f)?;
            engine.threads.push(h);
            Ok(())
        };
        for (i, &cpu) in shared.cpus.iter().enumerate() {
            let s = shared.clone();
            spawn(
                format!("kcryptd/{cpu}"),
                Box::new(move || s.crypt_worker(i)),
            )?;
        }
        let s = shared.clone();
        spawn("kcryptd_io".into(), Box::new(move || s.io_worker()))?;
        let s = shared;
        spawn("dmcrypt_write".into(), Box::new(move || s.write_worker()))?;
        Ok(engine)
    }

    fn submit(
        &self,
        kind: Kind,
        offset: u64,
        data: *mut u8,
        len: usize,
        flags: WriteFlags,
    ) -> io::Result<()> {
        COMPLETION.with(|done| {
            let job = Job {
                kind,
                offset,
                data,
                len,
                flags,
                bounce: None,
                done: done.clone(),
                cpu: current_cpu(),
            };
            match kind {
                Kind::Read => self.shared.io_queue.push(job),
                Kind::Write { .. } => self.shared.queue_crypt(job),
            }
            done.wait()
        })
    }

    /// Reads and decrypts through `kcryptd_io` and `kcryptd`.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.submit(
            Kind::Read,
            offset,
            buf.as_mut_ptr(),
            buf.len(),
            WriteFlags::default(),
        )
    }

    /// Encrypts into a bounce buffer on `kcryptd` and writes via `dmcrypt_write`.
    pub(crate) fn write(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        // The pointer is only read from for in_place = false.
        self.submit(
            Kind::Write { in_place: false },
            offset,
            buf.as_ptr() as *mut u8,
            buf.len(),
            flags,
        )
    }

    /// Like [`QueuedEngine::write`], encrypting in the caller's buffer.
    pub(crate) fn write_scratch(
        &self,
        offset: u64,
        buf: &mut [u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.submit(
            Kind::Write { in_place: true },
            offset,
            buf.as_mut_ptr(),
            buf.len(),
            flags,
        )
    }
}

impl Drop for QueuedEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.io_queue.wake_all();
        self.shared.crypt_any.wake_all();
        for q in &self.shared.crypt_per_cpu {
            q.wake_all();
        }
        self.shared.write_queue.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn queue_crypt(&self, job: Job) {
        if self.flags.same_cpu_crypt {
            let n = self.crypt_per_cpu.len();
            // The submitter's CPU may have left the set since (a cpuset change): any worker.
            let i = self
                .cpus
                .iter()
                .position(|&c| c == job.cpu)
                .unwrap_or(job.cpu % n);
            self.crypt_per_cpu[i].push(job);
        } else {
            self.crypt_any.push(job);
        }
    }

    /// Worker `i` of [`Shared::cpus`].
    fn crypt_worker(&self, i: usize) {
        let queue = if self.flags.same_cpu_crypt {
            pin_to_cpu(self.cpus[i]);
            &self.crypt_per_cpu[i]
        } else {
            &self.crypt_any
        };
        while let Some(job) = queue.pop(&self.stop) {
            self.crypt(job);
        }
    }

    fn crypt(&self, mut job: Job) {
        let sector = job.offset / SECTOR_SIZE;
        match job.kind {
            Kind::Read => {
                // SAFETY: the job has not completed yet.
                let r = self.cipher.decrypt(sector, unsafe { job.data() });
                job.done.complete(r.map_err(cipher_io));
            }
            Kind::Write { in_place } => {
                let r = if in_place {
                    // SAFETY: as above; in_place means the caller lent the buffer as scratch.
                    self.cipher.encrypt(sector, unsafe { job.data() })
                } else {
                    let mut bounce = self.take_bounce(job.len);
                    // SAFETY: as above; only read from.
                    bounce.copy_from_slice(unsafe { job.data() });
                    let r = self.cipher.encrypt(sector, &mut bounce);
                    job.bounce = Some(bounce);
                    r
                };
                if let Err(e) = r {
                    self.finish(job, Err(cipher_io(e)));
                } else if self.flags.submit_from_crypt_cpus {
                    self.submit_write(job);
                } else {
                    self.write_queue.push(job);
                }
            }
        }
    }

    fn io_worker(&self) {
        while let Some(mut job) = self.io_queue.pop(&self.stop) {
            // SAFETY: the job has not completed yet.
            let r = self
                .dev
                .read_at(self.base + job.offset, unsafe { job.data() });
            match r {
                Ok(()) => self.queue_crypt(job),
                Err(e) => job.done.complete(Err(e)),
            }
        }
    }

    fn write_worker(&self) {
        let mut batch = Vec::new();
        while self.write_queue.drain(&self.stop, &mut batch) {
            // The kernel keeps pending writes in an rbtree keyed by sector and submits them
            // in order; sorting the drained batch is the same thing.
            batch.sort_unstable_by_key(|j| j.offset);
            for job in batch.drain(..) {
                self.submit_write(job);
            }
        }
    }

    fn submit_write(&self, mut job: Job) {
        let at = self.base + job.offset;
        let flags = job.flags;
        let r = match job.bounce.as_mut() {
            Some(b) => self.dev.write_at_scratch(at, b, flags),
            // SAFETY: the job has not completed yet; in-place writes lent the buffer.
            None => self.dev.write_at_scratch(at, unsafe { job.data() }, flags),
        };
        self.finish(job, r);
    }

    fn finish(&self, mut job: Job, r: io::Result<()>) {
        if let Some(b) = job.bounce.take() {
            let mut pool = lock(&self.bounce);
            if pool.len() < BOUNCE_POOL_MAX {
                pool.push(b);
            }
        }
        job.done.complete(r);
    }

    fn take_bounce(&self, len: usize) -> Vec<u8> {
        let found = {
            let mut pool = lock(&self.bounce);
            let pos = pool.iter().position(|b| b.capacity() >= len);
            pos.map(|i| pool.swap_remove(i)).or_else(|| pool.pop())
        };
        let mut b = found.unwrap_or_default();
        b.resize(len, 0);
        b
    }
}
