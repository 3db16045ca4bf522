//! The background timer of the integrity target: the kernel's `autocommit_timer` (J mode:
//! commit the journal `commit_time` ms after the first uncommitted write) and
//! `bitmap_flush_work` (B mode: flush and clean the bitmap `bitmap_flush_interval` ms after
//! a region was marked dirty).
//!
//! Like the kernel's `mod_timer` guarded by `timer_pending`, arming an armed timer does not
//! move its deadline: a steady stream of writes is still committed every interval. The
//! thread holds only a `Weak` reference to the target, so it never keeps a dropped target
//! alive, and it is woken (not waited out) when the target is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the thread should do next (behind [`TimerCtl::state`]).
#[derive(Default)]
struct TimerState {
    /// When the armed timer fires; `None` = idle.
    deadline: Option<Instant>,
    /// The owner is being dropped: exit.
    stop: bool,
}

/// The shared half of the timer: armed by the I/O path, waited on by the thread.
pub(super) struct TimerCtl {
    interval: Duration,
    /// Set from arming until the thread takes the expired deadline; lets the write path
    /// skip the lock when the timer is already pending.
    armed: AtomicBool,
    state: Mutex<TimerState>,
    wake: Condvar,
}

impl TimerCtl {
    /// A disarmed timer firing `interval_ms` after it is armed.
    pub(super) fn new(interval_ms: u32) -> Self {
        TimerCtl {
            interval: Duration::from_millis(u64::from(interval_ms)),
            armed: AtomicBool::new(false),
            state: Mutex::new(TimerState::default()),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TimerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms the timer unless it is already pending.
    pub(super) fn arm(&self) {
        if self.armed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut st = self.lock();
        if st.deadline.is_none() {
            st.deadline = Some(Instant::now() + self.interval);
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Waits until the armed deadline passes (then disarms and returns `true`) or the
    /// timer is stopped (`false`).
    fn wait_expired(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.stop {
                return false;
            }
            match st.deadline {
                None => st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    let now = Instant::now();
                    if now >= at {
                        st.deadline = None;
                        drop(st);
                        // Writes from here on arm a new period. Writes between taking the
                        // deadline and this store saw the timer armed and did not re-arm;
                        // they hold the target's state lock while doing so, and the work
                        // that follows takes that lock after them, so it covers them.
                        self.armed.store(false, Ordering::Release);
                        return true;
                    }
                    st = self
                        .wake
                        .wait_timeout(st, at - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}

/// The running thread; stopping it (or dropping this) wakes and joins it.
pub(super) struct TimerThread {
    ctl: std::sync::Arc<TimerCtl>,
    handle: Option<JoinHandle<()>>,
}

impl TimerThread {
    /// Starts a thread that calls `fire` on the target behind `target` each time `ctl`
    /// expires, until stopped or the target is gone.
    pub(super) fn spawn<T: Send + Sync + 'static>(
        name: &str,
        ctl: std::sync::Arc<TimerCtl>,
        target: Weak<T>,
        fire: fn(&T),
    ) -> std::io::Result<Self> {
        let thread_ctl = ctl.clone();
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while thread_ctl.wait_expired() {
                    let Some(t) = target.upgrade() else { return };
                    fire(&t);
                }
            })?;
        Ok(TimerThread {
            ctl,
            handle: Some(handle),
        })
    }
}

impl Drop for TimerThread {
    fn drop(&mut self) {
        self.ctl.stop();
        if let Some(h) = self.handle.take() {
            // A commit in progress finishes first (it holds the target's state lock and
            // completes or fails on its own); an idle thread wakes at once.
            let _ = h.join();
        }
    }
}
