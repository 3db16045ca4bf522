//! Which CPUs a bench run's servers, engine threads, peers and fio run on.
//!
//! Why the bench fixes this: at queue depth 1 a request is a ping-pong between fio and the
//! server thread. When the two sit on different CPUs every hand-off is a cross-CPU wakeup,
//! and on a virtual machine whose idle vCPUs halt at once (the `haltpoll` cpuidle driver
//! with `guest_halt_poll_ns` 0, as on the machine this was measured on) each such wakeup is
//! a VM exit on both sides. Whether the scheduler put the two on one CPU or two then decided
//! a run's speed by about 3x, at random from run to run: plain 4 KiB readwrite over NBD gave
//! 35, 33, 34, 23, 9, 15 MB/s unpinned, and 130, 127, 117, 122, 125, 118 MB/s with the whole
//! bench on one CPU, in one quiet minute. A bench that lets that lottery pick the figures
//! cannot tell two configurations apart, so by default the command line runs everything on
//! one CPU ([`CpuPlacement::LastCpu`]); `--cpus all` gives the scheduler back its choice.
//!
//! The placement is applied once, at the start of a run, to every thread of this process;
//! threads, peers and fio started afterwards inherit it (Linux copies the affinity mask to a
//! new thread or child). It is undone when the run ends.

use std::fmt;
use std::io;

use serde::Serialize;

/// Where a run's threads go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuPlacement {
    /// The scheduler places every thread (the library's default: a test harness calling
    /// [`crate::run`] must not have its threads pinned).
    #[default]
    Scheduler,
    /// One CPU: the highest-numbered one this process may use (CPU 0 takes most of the
    /// machine's interrupts). The command line's default.
    LastCpu,
    /// Exactly these CPUs.
    Cpus(Vec<usize>),
}

impl CpuPlacement {
    /// Parses `all`, `last`, a CPU number, or a list such as `0,1` or `0-1`.
    pub fn parse(s: &str) -> Result<CpuPlacement, String> {
        let s = s.trim();
        match s {
            "all" => return Ok(CpuPlacement::Scheduler),
            "last" => return Ok(CpuPlacement::LastCpu),
            _ => {}
        }
        let bad = || format!("invalid CPU list '{s}' (expected all, last, 1, 0,1 or 0-1)");
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part.trim(), part.trim()),
            };
            let lo: usize = lo.parse().map_err(|_| bad())?;
            let hi: usize = hi.parse().map_err(|_| bad())?;
            if hi < lo || hi >= libc::CPU_SETSIZE as usize {
                return Err(bad());
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuPlacement::Cpus(cpus))
    }

    /// The CPUs this placement pins to, given the CPUs the process may use; `None` for
    /// [`CpuPlacement::Scheduler`]. A CPU outside `allowed` is refused.
    pub fn resolve(&self, allowed: &[usize]) -> Result<Option<Vec<usize>>, String> {
        match self {
            CpuPlacement::Scheduler => Ok(None),
            CpuPlacement::LastCpu => Ok(allowed.last().map(|c| vec![*c])),
            CpuPlacement::Cpus(v) => match v.iter().find(|c| !allowed.contains(c)) {
                Some(c) => Err(format!(
                    "CPU {c} is not available to this process (allowed: {})",
                    list(allowed)
                )),
                None => Ok(Some(v.clone())),
            },
        }
    }
}

impl fmt::Display for CpuPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuPlacement::Scheduler => f.write_str("all (the scheduler places threads)"),
            CpuPlacement::LastCpu => f.write_str("last (one CPU)"),
            CpuPlacement::Cpus(v) => f.write_str(&list(v)),
        }
    }
}

/// `0,2,3` for a list of CPUs.
pub fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs task `tid` (0: the calling thread) may run on.
pub fn allowed_cpus(tid: libc::pid_t) -> io::Result<Vec<usize>> {
    let set = get_affinity(tid)?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: cpu < CPU_SETSIZE keeps CPU_ISSET inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

fn get_affinity(tid: libc::pid_t) -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; the kernel writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }
}

fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_of(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: plain data; CPU_SET stays inside the set for cpu < CPU_SETSIZE (checked by
    // `parse` and by `allowed_cpus`, which never yields a larger number).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        set
    }
}

fn own_threads() -> Vec<libc::pid_t> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every thread of this process pinned to a set of CPUs, until dropped.
pub struct Pinned {
    cpus: Vec<usize>,
    saved: Vec<(libc::pid_t, libc::cpu_set_t)>,
    /// The calling thread's mask before: what threads born during the pin get back.
    before: libc::cpu_set_t,
}

impl Pinned {
    /// Pins every thread of this process to `cpus`.
    pub fn all_threads(cpus: &[usize]) -> io::Result<Pinned> {
        let before = get_affinity(0)?;
        let set = set_of(cpus);
        let mut saved = Vec::new();
        for tid in own_threads() {
            // A thread may end between the listing and the call: skip it.
            if let Ok(old) = get_affinity(tid) {
                if set_affinity(tid, &set).is_ok() {
                    saved.push((tid, old));
                }
            }
        }
        // The caller's own thread must be pinned, or fio and new threads escape.
        set_affinity(0, &set)?;
        Ok(Pinned {
            cpus: cpus.to_vec(),
            saved,
            before,
        })
    }

    /// The CPUs pinned to.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for tid in own_threads() {
            let mask = self
                .saved
                .iter()
                .find(|(t, _)| *t == tid)
                .map_or(&self.before, |(_, m)| m);
            // Best effort: a thread that ended meanwhile has nothing to restore.
            let _ = set_affinity(tid, mask);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_taskset_writes_them() {
        assert_eq!(CpuPlacement::parse("all"), Ok(CpuPlacement::Scheduler));
        assert_eq!(CpuPlacement::parse("last"), Ok(CpuPlacement::LastCpu));
        assert_eq!(CpuPlacement::parse("1"), Ok(CpuPlacement::Cpus(vec![1])));
        assert_eq!(
            CpuPlacement::parse("3,0-1,1"),
            Ok(CpuPlacement::Cpus(vec![0, 1, 3]))
        );
        for bad in ["", "x", "2-1", "1,", "-1", "99999"] {
            assert!(CpuPlacement::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn resolve_takes_the_last_allowed_cpu_and_refuses_others() {
        let allowed = [0, 1, 5];
        assert_eq!(CpuPlacement::Scheduler.resolve(&allowed), Ok(None));
        assert_eq!(CpuPlacement::LastCpu.resolve(&allowed), Ok(Some(vec![5])));
        assert_eq!(
            CpuPlacement::Cpus(vec![0, 5]).resolve(&allowed),
            Ok(Some(vec![0, 5]))
        );
        assert!(CpuPlacement::Cpus(vec![2]).resolve(&allowed).is_err());
    }

    #[test]
    fn a_pin_holds_new_threads_and_fio_children_and_is_undone() {
        let before = allowed_cpus(0).unwrap();
        let cpu = *before.last().unwrap();
        {
            let _pin = Pinned::all_threads(&[cpu]).unwrap();
            assert_eq!(allowed_cpus(0).unwrap(), [cpu]);
            // A thread born during the pin inherits it.
            let inner = std::thread::spawn(|| allowed_cpus(0).unwrap())
                .join()
                .unwrap();
            assert_eq!(inner, [cpu]);
            // So does a child process (as fio is).
            let out = std::process::Command::new("grep")
                .args(["Cpus_allowed_list", "/proc/self/status"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                text.split_whitespace().last(),
                Some(cpu.to_string().as_str())
            );
        }
        assert_eq!(allowed_cpus(0).unwrap(), before);
    }
}
