//! CPU time accounting: this process (getrusage) and other processes (/proc/<pid>/stat).

use std::time::Duration;

/// User + system CPU time consumed so far by this process (all threads).
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct we pass; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU time consumed so far by process `pid` (all its threads), from
/// /proc; `None` once it is gone.
pub fn pid_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&stat, clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. The command name (field 2)
/// may contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat_cpu(stat: &str, ticks_per_s: u64) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state), so field N is f[N - 3].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks_per_s as f64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line() {
        let line =
            "1234 (qemu nbd (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 0 0";
        assert_eq!(parse_stat_cpu(line, 100), Some(Duration::from_secs(3)));
        assert_eq!(parse_stat_cpu("garbage", 100), None);
    }

    #[test]
    fn own_cpu_advances() {
        let before = process_cpu();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(process_cpu() > before);
        assert!(pid_cpu(std::process::id()).is_some());
    }
}
