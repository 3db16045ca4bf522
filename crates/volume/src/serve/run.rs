//! The daemon's entry point: [`serve_stack`] builds a stack, binds its control sockets,
//! reports [`ReadyFacts`] and answers control requests until the stack is closed.
//!
//! Invariants: `on_ready` runs only once the export accepts I/O and every control socket
//! answers; the top control socket is removed last, after the stack is stopped and
//! flushed, so a client waiting for it to vanish knows the backing is written back.
//! SIGTERM, SIGINT and SIGHUP are blocked in the calling thread (and the threads it starts)
//! and turned into `close`.

use super::control;
use super::facts::ReadyFacts;
use super::spec::{check_stack_taken_over, LowerTable, ServeSpec};
use super::stack;
use super::upgrade::{Inherited, Successor, TakeOverHook};
use crate::control::Response;
use crate::VolumeError as Failure;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Serves `spec` in this process until `close` or SIGTERM/SIGINT. `on_ready` is called once
/// the export accepts I/O and the control sockets answer. Lower mappings are created first:
/// the keyless ones of `spec.info.lower`, then `secret_lower` (`dm create --lower`). The top
/// mapping is exported; every lower one answers on its own control socket; closing the top
/// ends them all.
pub fn serve_stack(
    spec: ServeSpec,
    secret_lower: Vec<LowerTable>,
    on_ready: impl FnOnce(&ReadyFacts),
) -> Result<(), Failure> {
    serve_stack_with(spec, secret_lower, on_ready, |_| {})
}

/// [`serve_stack`], with `on_stopping` called (with the mapping's name) when the close
/// begins, before the export stops: a service manager is told `STOPPING=1` there.
pub fn serve_stack_with(
    spec: ServeSpec,
    secret_lower: Vec<LowerTable>,
    on_ready: impl FnOnce(&ReadyFacts),
    on_stopping: impl FnOnce(&str),
) -> Result<(), Failure> {
    serve_stack_upgradable(
        spec,
        secret_lower,
        Inherited::none(),
        on_ready,
        on_stopping,
        None,
    )
}

/// [`serve_stack_with`] for a daemon that can be upgraded (`successor` starts the new
/// process, see [`super::upgrade`]) and may itself be a successor: `inherited` holds the
/// listening sockets its predecessor passed on (the export's and the control sockets).
/// After a hand-over it returns `Ok` without touching the volume again.
pub fn serve_stack_upgradable(
    spec: ServeSpec,
    secret_lower: Vec<LowerTable>,
    mut inherited: Inherited,
    on_ready: impl FnOnce(&ReadyFacts),
    on_stopping: impl FnOnce(&str),
    successor: Option<Successor>,
) -> Result<(), Failure> {
    control::block_termination_signals();
    check_stack_taken_over(&spec, &secret_lower, &|n| inherited.has_control(n))?;
    log::info!("{}: starting (pid {})", spec.name, std::process::id());
    if let Some(fd) = inherited.export.take() {
        cryptblk_export::handover::offer(fd);
    }
    // A successor handed the `upgrade` request answers it (its predecessor exits once this
    // process says it takes over, before the export can start): from then on, a failure
    // leaves the device waiting for the same `open`, and the answer says so.
    let requester = inherited.requester.take();
    let took_over = Arc::new(AtomicBool::new(false));
    let hook: Option<TakeOverHook> = match (&requester, inherited.on_take_over.take()) {
        (Some(_), Some(tell)) => {
            let took_over = Arc::clone(&took_over);
            Some(Box::new(move || {
                took_over.store(true, Ordering::SeqCst);
                tell();
            }))
        }
        _ => None,
    };
    let name = spec.name.clone();
    let answer_failure = |f: Failure| -> Failure {
        if let Some(r) = &requester {
            if took_over.load(Ordering::SeqCst) {
                let f = Failure::new(
                    f.code,
                    format!(
                        "upgrade of {name} failed after its old daemon exited: {}; its device stays and its I/O waits: run the same open to take it over",
                        f.message
                    ),
                );
                answer(r, &Response::error(f.code, f.message.clone()));
                return f;
            }
        }
        f
    };
    let built = stack::Stack::build(spec, secret_lower, hook);
    // An inherited listener the export did not adopt is not ours to keep.
    cryptblk_export::handover::discard();
    let stack = built.map_err(&answer_failure)?;
    let mut sockets =
        match control::Sockets::bind(&stack.spec().name, stack.lower(), &mut inherited) {
            Ok(s) => s,
            Err(f) => {
                // A ublk device taken over stays for the next `open` (user recovery).
                if took_over.load(Ordering::SeqCst) {
                    stack.leave_for_recovery();
                } else {
                    stack.abandon();
                }
                return Err(answer_failure(f));
            }
        };
    control::spawn_signal_watcher(sockets.top_path().to_path_buf());
    let facts = ReadyFacts {
        name: stack.spec().name.clone(),
        pid: std::process::id(),
        export: stack.export_info(),
        lower: stack.lower().to_vec(),
    };
    log::info!("{}: ready, serving {}", facts.name, facts.describe());
    on_ready(&facts);
    if let Some(r) = &requester {
        log::info!("{}: upgraded: pid {} serves it now", facts.name, facts.pid);
        answer(r, &Response::Done);
    }
    drop(requester);
    if control::serve(&stack, &mut sockets, successor) {
        log::info!("{}: handed over; this process exits", facts.name);
        // The successor owns the volume, its sockets and their files now: nothing of this
        // stack may flush, write or unlink again (a target's teardown could write behind
        // the successor's back), so none of it is dropped; the process exits next.
        std::mem::forget(stack);
        std::mem::forget(sockets);
        return Ok(());
    }
    let name = stack.spec().name.clone();
    log::info!("{name}: closing");
    on_stopping(&name);
    let closed = stack.close();
    // Last: `close` waits for the socket to vanish, so it must mean "stopped and flushed"
    // (a ublk node gone, the backing written back) before a script reuses the backing.
    sockets.remove();
    match &closed {
        Ok(()) => log::info!("{name}: closed"),
        Err(e) => log::error!("{name}: close failed: {e}"),
    }
    closed
}

/// Answers the `upgrade` request a predecessor handed over (one line, as its control loop
/// would have); a requester that has gone is not an error of the volume.
fn answer(requester: &UnixStream, response: &Response) {
    let _ = requester.set_write_timeout(Some(std::time::Duration::from_secs(10)));
    let mut w = requester;
    let _ = w.write_all(response.encode().as_bytes());
    let _ = requester.shutdown(std::net::Shutdown::Both);
}
