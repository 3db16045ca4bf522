//! A scanner of another process's memory through `/proc/PID/mem` (root, or the process's
//! own user while it is dumpable), for tests that prove a key is gone or only in locked
//! memory.

use std::os::unix::fs::FileExt;

/// One mapping of a process: address range, whether the kernel keeps it locked (`lo` in
/// smaps' `VmFlags`), and its name (a path, `[heap]`, or empty).
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address; equal to `start` for a mapping that is not readable.
    pub end: u64,
    /// Locked in memory (mlock).
    pub locked: bool,
    /// The mapping's name as smaps shows it.
    pub name: String,
}

/// The mappings of process `pid`, in smaps order.
pub fn vmas(pid: u32) -> Vec<Vma> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Vma> = Vec::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                let readable = line
                    .split_whitespace()
                    .nth(1)
                    .is_some_and(|p| p.starts_with('r'));
                let name = line.split_whitespace().nth(5).unwrap_or("").to_string();
                // Unreadable ranges stay in the list (aligned with smaps entries, so the
                // VmFlags line below lands on the right one) but are never scanned.
                out.push(Vma {
                    start,
                    end: if readable { end } else { start },
                    locked: false,
                    name,
                });
                continue;
            }
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(v) = out.last_mut() {
                v.locked = flags.split_whitespace().any(|f| f == "lo");
            }
        }
    }
    out
}

/// Where `needle` occurs in process `pid`'s readable memory: (address, in a locked mapping,
/// mapping name).
pub fn find_in_memory(pid: u32, needle: &[u8]) -> Vec<(u64, bool, String)> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut hits = Vec::new();
    for v in vmas(pid) {
        // The kernel's vvar/vsyscall pages refuse reads; they hold no user data anyway.
        if v.end <= v.start || v.name == "[vvar]" || v.name == "[vsyscall]" {
            continue;
        }
        let mut buf = vec![0u8; (v.end - v.start) as usize];
        let Ok(n) = mem.read_at(&mut buf, v.start) else {
            continue;
        };
        buf.truncate(n);
        let mut at = 0;
        while let Some(i) = find(&buf[at..], needle) {
            hits.push((v.start + (at + i) as u64, v.locked, v.name.clone()));
            at += i + 1;
        }
    }
    hits
}

/// True if `needle` occurs anywhere in process `pid`'s readable memory.
pub fn in_memory(pid: u32, needle: &[u8]) -> bool {
    !find_in_memory(pid, needle).is_empty()
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
