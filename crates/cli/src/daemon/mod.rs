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
    let (spec, lower, inherited) = match spawn::read_handover() {
        Ok(s) => s,
        Err(code) => return code,
    };
    match serve::serve_stack_upgradable(
        spec,
        lower,
        inherited,
        spawn::report_ready,
        |_| {},
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
