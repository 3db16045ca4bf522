//! The background tag recalculation of the integrity target (the kernel's `integrity_recalc`
//! work item, queued on resume when the superblock says `recalculating`).
//!
//! The thread runs one chunk at a time through a step function of the target: each step
//! takes the target's state lock, so a chunk never races a write to the same blocks (the
//! kernel's range lock), and I/O proceeds between chunks. It holds only a `Weak` reference
//! to the target; dropping the [`RecalcThread`] (or [`RecalcCtl::stop`], as a suspend does)
//! makes it stop after the chunk in progress, whose end is then already in the superblock.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

/// Shared state between the target and its recalculation thread.
pub(super) struct RecalcCtl {
    stop: AtomicBool,
    /// `None` while running; then how it ended (`Err(errno)` on an I/O error).
    outcome: Mutex<Option<Result<(), i32>>>,
    done: Condvar,
}

impl RecalcCtl {
    /// A control for a thread about to start.
    pub(super) fn new() -> Self {
        RecalcCtl {
            stop: AtomicBool::new(false),
            outcome: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    /// Asks the thread to stop before its next chunk.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was requested (checked by the step under the target's lock).
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn finish(&self, r: Result<(), i32>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.done.notify_all();
    }

    /// Waits until the thread has ended: finished, stopped, or failed (`Err`).
    pub(super) fn wait(&self) -> io::Result<()> {
        let mut g = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match *g {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => return Err(io::Error::from_raw_os_error(e)),
                None => g = self.done.wait(g).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

/// The running thread; dropping it stops and joins it.
pub(super) struct RecalcThread {
    ctl: Arc<RecalcCtl>,
    handle: Option<JoinHandle<()>>,
}

impl RecalcThread {
    /// Starts a thread calling `step` on the target until it returns `Ok(false)` (done),
    /// fails, is stopped, or the target is gone.
    pub(super) fn spawn<T: Send + Sync + 'static>(
        ctl: Arc<RecalcCtl>,
        target: Weak<T>,
        step: fn(&T, &RecalcCtl) -> io::Result<bool>,
    ) -> io::Result<Self> {
        let thread_ctl = ctl.clone();
        let handle = std::thread::Builder::new()
            .name("integrity-recalc".into())
            .spawn(move || {
                let r = loop {
                    if thread_ctl.stopped() {
                        break Ok(());
                    }
                    let Some(t) = target.upgrade() else {
                        break Ok(());
                    };
                    match step(&t, &thread_ctl) {
                        Ok(true) => {}
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e.raw_os_error().unwrap_or(libc::EIO)),
                    }
                };
                thread_ctl.finish(r);
            })?;
        Ok(RecalcThread {
            ctl,
            handle: Some(handle),
        })
    }
}

impl Drop for RecalcThread {
    fn drop(&mut self) {
        self.ctl.stop();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
