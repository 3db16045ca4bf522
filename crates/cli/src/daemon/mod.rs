//! The daemon process: `cryptblk __serve` and the parent that starts it. What it serves
//! and how is the library's ([`cryptblk_volume::serve`]); this module is process handling
//! only: [`spawn`] starts the process and hands over the spec through a pipe, and
//! [`daemon_main`] protects the process's memory, sets up logging and serves.

mod spawn;

pub use spawn::{spawn_stack, spawn_successor};

use crate::exit::ExitCode;
use cryptblk_volume::serve;

/// Entry point of `cryptblk __serve`: reads the spec from stdin, serves until closed.
pub fn daemon_main() -> i32 {
    // Before the key arrives: nothing of this process may end up in a core file or be read
    // by another process of the same user.
    if let Err(e) = protect_key_memory() {
        eprintln!("cryptblk daemon: {e}");
        return ExitCode::WrongParameters as i32;
    }
    crate::logger::install(crate::logger::Process::Daemon);
    let (spec, lower, mut inherited) = match spawn::read_handover() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // A successor of a unit's main process (NOTIFY_SOCKET is kept for it; a daemon started
    // by `open` has none) becomes the main process before its predecessor exits, which is
    // when it tells the predecessor it takes over (ublk) or serves.
    inherited.on_take_over(Box::new(|| {
        cryptblk_systemd::notify::main_pid();
        spawn::report_taking_over();
    }));
    let ready = |facts: &serve::ReadyFacts| {
        cryptblk_systemd::notify::main_pid();
        spawn::report_ready(facts);
        cryptblk_systemd::notify::ready(facts);
        release_startup_memory();
    };
    match serve::serve_stack_upgradable(
        spec,
        lower,
        inherited,
        ready,
        cryptblk_systemd::notify::stopping,
        Some(&spawn::spawn_successor),
    ) {
        Ok(()) => 0,
        Err(f) => {
            spawn::report_error(&f);
            eprintln!("cryptblk daemon: {}", f.message);
            f.code as i32
        }
    }
}

/// Makes this process hold keys safely: no core dumps (`RLIMIT_CORE` 0) and not dumpable
/// (`PR_SET_DUMPABLE` 0: no core files even where the limit is raised again, and no
/// same-user `ptrace` attach or read of `/proc/PID/mem`; the kernel also makes the process's
/// `/proc` files root's).
pub fn protect_key_memory() -> std::io::Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a value that lives across them.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot disable core dumps: {e}"),
        ));
    }
    // SAFETY: PR_SET_DUMPABLE takes one integer argument; the rest are ignored.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("cannot make the daemon non-dumpable: {e}"),
        ));
    }
    Ok(())
}

/// Gives back the memory only starting up used, once the volume is served (issue 28: a
/// thousand idle volumes, each a process). Unlocking and building the stack leave the main
/// thread's stack touched deep down (about 1 MB in a debug build) and freed blocks in the
/// heap; both stay counted as the process's private memory until returned.
pub fn release_startup_memory() {
    // SAFETY: malloc_trim only hands free heap pages back to the kernel.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    release_unused_main_stack();
}

/// Stack below the caller's frame kept when releasing: room for the calls made from here
/// (and the x86-64 red zone) with a wide margin.
const STACK_KEPT_BELOW: usize = 64 << 10;

/// `MADV_DONTNEED` on the main thread's stack below the current frame: nothing lives there
/// (frames below the stack pointer are dead), and a later call that grows the stack again
/// gets zeroed pages, as glibc does for the stacks of threads that end. No-op off the main
/// thread.
fn release_unused_main_stack() {
    let here = 0u8;
    let sp = std::hint::black_box(std::ptr::addr_of!(here)) as usize;
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let Some((low, high)) = maps
        .lines()
        .filter(|l| l.ends_with("[stack]"))
        .filter_map(|l| {
            let (low, high) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(low, 16).ok()?,
                usize::from_str_radix(high, 16).ok()?,
            ))
        })
        .next()
    else {
        return;
    };
    if !(low..high).contains(&sp) {
        return;
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let top = sp.saturating_sub(STACK_KEPT_BELOW) & !(page - 1);
    if top <= low {
        return;
    }
    // SAFETY: [low, top) is the main thread's stack below this frame by a margin: no live
    // frame or object is there, so discarding its pages changes nothing observable.
    unsafe {
        libc::madvise(low as *mut libc::c_void, top - low, libc::MADV_DONTNEED);
    }
}
