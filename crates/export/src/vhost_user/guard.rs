//! Surviving a frontend that truncates the guest memory it shared with us.
//!
//! The guest's memory is the frontend's file (a memfd, a hugetlbfs or /dev/shm file) mapped
//! shared into this process. Nothing stops the frontend from shrinking that file while we
//! use it, and an access past the file's new end raises SIGBUS, whose default action ends
//! the whole daemon, with every volume it serves, and logs nothing. A table whose regions
//! lie past their files' ends from the start is refused before it is used
//! (`backend::check_regions`); a file shrunk later cannot be refused: no check before an
//! access can exclude a shrink right after it.
//!
//! So: a process-wide SIGBUS handler. A fault at a page of a registered guest-memory region
//! ("address not backed by the file", `BUS_ADRERR`) gets an anonymous zero page mapped over
//! that page (`mmap(MAP_FIXED | MAP_ANONYMOUS)`), so the faulting access completes (it reads
//! zeros, or writes into a page nobody else sees), and the region's connection is marked
//! broken; its request loop then fails the request, logs the frontend's misbehaviour and
//! drops the connection ([`ConnGuard::broken`]). Any other SIGBUS goes to the handler that
//! was there before ours (Rust's stack-overflow handler), or gets the default action back.
//!
//! Why not the alternatives: unwinding or `siglongjmp` out of a signal handler through Rust
//! frames is undefined behaviour; a private mapping of guest memory would not see the
//! guest's writes; checking the file's size before each access races with the shrink.
//! A zero page is what a truncated file would have read as anyway, and only pages that
//! already fault (past the end of whatever file backs them) are replaced, so a stale entry
//! of the table can never hide live data. This is what other vhost-user backends do; it is
//! hand-written because no crate offers it (signal-hook chains to the previous handler
//! unconditionally, which for SIGBUS restores the default action).
//!
//! The handler does only what is async-signal-safe: atomic loads and stores, `mmap` and
//! `sigaction` system calls.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};

/// Guest-memory regions registered at once, over every connection of the process (a table
/// has at most 8 regions without `CONFIGURE_MEM_SLOTS`, which we do not offer).
const SLOTS: usize = 512;

/// A slot's `conn` while it is being filled in.
const CLAIMING: u64 = u64::MAX;

/// One registered region: host addresses `start..end` of connection `conn` (0: free).
struct Slot {
    conn: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    /// A fault in this region was answered with a zero page.
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // the initializer of the static array
const FREE: Slot = Slot {
    conn: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// Connection ids (0 is a free slot).
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// The base page size, read before the handler is installed.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The SIGBUS disposition in place before ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs the SIGBUS handler (once per process; later calls do nothing).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: an all-zero sigaction is a valid value; sigaction reads `new` and writes
        // `old`, both valid for the call. The previous disposition is stored before ours is
        // installed, so the handler always finds it.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                log::error!(
                    "vhost-user-blk: cannot read the SIGBUS disposition: {}",
                    std::io::Error::last_os_error()
                );
                return;
            }
            let _ = PREVIOUS.set(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) != 0 {
                log::error!(
                    "vhost-user-blk: cannot install the SIGBUS handler (a frontend that shrinks its memory can end the daemon): {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR {
        for slot in &TABLE {
            let conn = slot.conn.load(Ordering::Acquire);
            if conn == 0 || conn == CLAIMING {
                continue;
            }
            let (start, end) = (
                slot.start.load(Ordering::Relaxed),
                slot.end.load(Ordering::Relaxed),
            );
            if (start..end).contains(&addr) && zero_page(addr, start, end) {
                slot.hit.store(true, Ordering::Release);
                return;
            }
        }
    }
    // SAFETY: called from the signal handler with the kernel's arguments.
    unsafe { pass_on(sig, info, ctx) }
}

/// Maps an anonymous zero page over the page of `addr` (within `start..end`): the base page
/// size, or a huge page's for a hugetlbfs mapping, which cannot be split smaller.
fn zero_page(addr: usize, start: usize, end: usize) -> bool {
    let base = PAGE.load(Ordering::Relaxed);
    for size in [base, 2 << 20, 1 << 30] {
        let page = addr & !(size - 1);
        if page < start || page + size > end {
            return false;
        }
        // SAFETY: `page..page + size` lies inside a guest-memory mapping of ours that faults
        // there (the file behind it is gone); replacing it changes no memory anything else
        // owns.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return true;
        }
    }
    false
}

/// A SIGBUS that is not ours: to the previous handler, or the default action back (the
/// faulting access then runs again and the kernel ends the process, as without us).
unsafe fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(prev) = PREVIOUS.get() {
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO the previous handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: without SA_SIGINFO the previous handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: an all-zero sigaction with SIG_DFL is valid; sigaction is async-signal-safe.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}

/// One frontend connection's guest memory in the SIGBUS handler's table: its regions are
/// registered while their mapping lives, and [`ConnGuard::broken`] tells whether one of
/// them faulted. Dropping it removes every entry.
pub(crate) struct ConnGuard {
    id: u64,
    /// Registered tables: the mapping (alive while anything uses it) and its slots.
    tables: Mutex<Vec<(Weak<GuestMemoryMmap>, Vec<usize>)>>,
}

impl ConnGuard {
    /// A guard for a new connection (installs the handler if needed).
    pub fn new() -> Self {
        install();
        ConnGuard {
            id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
            tables: Mutex::new(Vec::new()),
        }
    }

    /// Registers every region of `mem`; tables no longer mapped are removed first. Fails
    /// when the table is full (then nothing of `mem` is registered).
    pub fn protect(&self, mem: &Arc<GuestMemoryMmap>) -> std::io::Result<()> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables.retain(|(table, slots)| {
            let alive = table.strong_count() > 0;
            if !alive {
                slots.iter().for_each(|&i| release(i));
            }
            alive
        });
        let mut slots = Vec::new();
        for region in mem.iter() {
            let start = region.as_ptr() as usize;
            match claim(self.id, start, start + region.size()) {
                Some(i) => slots.push(i),
                None => {
                    slots.iter().for_each(|&i| release(i));
                    return Err(std::io::Error::other(
                        "too many guest-memory regions registered in this process",
                    ));
                }
            }
        }
        tables.push((Arc::downgrade(mem), slots));
        Ok(())
    }

    /// Whether a region of this connection faulted (the frontend shrank its memory).
    pub fn broken(&self) -> bool {
        TABLE
            .iter()
            .any(|s| s.conn.load(Ordering::Acquire) == self.id && s.hit.load(Ordering::Acquire))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let tables = self.tables.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, slots) in tables.drain(..) {
            slots.into_iter().for_each(release);
        }
    }
}

/// Takes a free slot for `start..end` of connection `conn`.
fn claim(conn: u64, start: usize, end: usize) -> Option<usize> {
    for (i, slot) in TABLE.iter().enumerate() {
        if slot
            .conn
            .compare_exchange(0, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            slot.start.store(start, Ordering::Relaxed);
            slot.end.store(end, Ordering::Relaxed);
            slot.hit.store(false, Ordering::Relaxed);
            slot.conn.store(conn, Ordering::Release);
            return Some(i);
        }
    }
    None
}

fn release(i: usize) {
    TABLE[i].conn.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use vm_memory::{FileOffset, GuestAddress};

    /// A shared mapping of a memfd that is then truncated: reading it past the new end
    /// reads zeros and marks the connection broken, instead of ending the process.
    #[test]
    fn a_truncated_guest_memory_reads_zeros_and_breaks_the_connection() {
        // SAFETY: memfd_create with a valid C string; the File owns the new descriptor.
        let fd = unsafe { libc::memfd_create(c"guard-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is new and owned by nobody else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(1 << 20).unwrap();
        let mem = Arc::new(
            GuestMemoryMmap::<()>::from_ranges_with_files(&[(
                GuestAddress(0),
                1 << 20,
                Some(FileOffset::new(file.try_clone().unwrap(), 0)),
            )])
            .unwrap(),
        );
        let guard = ConnGuard::new();
        guard.protect(&mem).unwrap();
        let base = mem.iter().next().unwrap().as_ptr();
        // SAFETY: inside the 1 MiB mapping.
        unsafe { base.add(8192).write_volatile(7) };
        assert!(!guard.broken());
        file.set_len(4096).unwrap();
        // SAFETY: inside the mapping; past the file's end now (SIGBUS, answered by a zero
        // page).
        let v = unsafe { base.add(8192).read_volatile() };
        assert_eq!(v, 0);
        assert!(guard.broken());
        // The first page, still backed by the file, is untouched.
        // SAFETY: inside the mapping and the file.
        unsafe { base.write_volatile(1) };
        let id = guard.id;
        drop(guard);
        assert!(TABLE.iter().all(|s| s.conn.load(Ordering::Relaxed) != id));
    }
}
