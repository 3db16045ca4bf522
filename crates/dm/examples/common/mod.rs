//! Helpers shared by the examples (`#[path]`-included; not an example of its own).

/// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`): what a request cost
/// here, whatever else the machine is doing.
pub fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
