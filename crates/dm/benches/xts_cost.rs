//! Per-request cost of AES-256-XTS through the engine against the raw bulk cipher (issue 15):
//! the same 4 KiB requests, the same key, one harness for every path, so that instruction
//! counts (callgrind) and CPU-time ratios compare like with like.
//!
//! Paths:
//! - `raw`: [`RawBulkXts`], one AWS-LC call per 4 KiB request (one XTS data unit): the
//!   yardstick, what `openssl speed -evp aes-256-xts -bytes 4096` runs.
//! - `engine`: the sector cipher (`open_cipher("aes-xts-plain64")`) at the given sector size,
//!   as the crypt target calls it: request checks, IV generation, context slots.
//! - `target`: a `crypt` target (inline) over a RAM disk, `read_at`/`write_at` of 4 KiB:
//!   everything of `engine` plus the target's key state, statistics and the RAM copy.
//! - `linear`: a `linear` target over the same RAM disk: the copy alone, to subtract.
//!
//! Instruction counts (repeatable on a loaded machine; counts only the timed loop):
//! ```text
//! cargo bench -p cryptblk-dm --bench xts_cost --no-run
//! valgrind --tool=callgrind --toggle-collect='*xts_cost*hot_loop*' \
//!     --callgrind-out-file=/tmp/cg.out target/release/deps/xts_cost-* count engine 512 decrypt 20000
//! ```
//! then divide the `summary:` line of /tmp/cg.out by the count. `ratio` instead alternates
//! engine and raw in one process and prints the median of per-round CPU-time ratios.

use std::hint::black_box;
use std::time::Duration;

use cryptblk_cipher::{open_cipher, RawBulkXts, SectorCipher, SectorOptions};
use cryptblk_dm::{BlockDevice, Registry, WriteFlags};

const REQ: usize = 4096;
const KEY: &str = "2b7e151628aed2a6abf7158809cf4f3c2b7e151628aed2a6abf7158809cf4f3c\
                   000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
/// RAM disk of the `target` and `linear` paths: requests stride through it.
const DISK: u64 = 16 << 20;

fn key() -> Vec<u8> {
    hex_key(KEY)
}

fn hex_key(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex key"))
        .collect()
}

/// One request of 4 KiB at 512-byte sector `sector`.
trait Path {
    fn run(&mut self, sector: u64, buf: &mut [u8]);
}

struct Raw(RawBulkXts);
impl Path for Raw {
    fn run(&mut self, sector: u64, buf: &mut [u8]) {
        self.0.crypt(sector, buf).expect("raw");
    }
}

struct Engine(Box<dyn SectorCipher>, bool);
impl Path for Engine {
    fn run(&mut self, sector: u64, buf: &mut [u8]) {
        if self.1 {
            self.0.encrypt(sector, buf).expect("encrypt");
        } else {
            self.0.decrypt(sector, buf).expect("decrypt");
        }
    }
}

struct Target(cryptblk_dm::Table, bool);
impl Path for Target {
    fn run(&mut self, sector: u64, buf: &mut [u8]) {
        let off = (sector * 512) % DISK;
        if self.1 {
            self.0
                .write_at(off, buf, WriteFlags::default())
                .expect("write");
        } else {
            self.0.read_at(off, buf).expect("read");
        }
    }
}

fn path(kind: &str, sector_size: usize, encrypt: bool) -> Box<dyn Path> {
    match kind {
        "raw" => Box::new(Raw(RawBulkXts::new(&key(), encrypt).expect("raw key"))),
        "engine" => {
            let opts = SectorOptions {
                sector_size,
                ..Default::default()
            };
            let c = open_cipher("aes-xts-plain64", &key(), &opts).expect("cipher");
            Box::new(Engine(c, encrypt))
        }
        "target" | "linear" => {
            let reg = Registry::new();
            let sectors = DISK / 512;
            let ram = format!("ram:{DISK}");
            let table = if kind == "linear" {
                format!("0 {sectors} linear {ram} 0")
            } else {
                let ss = if sector_size == 512 {
                    String::new()
                } else {
                    format!(" sector_size:{sector_size}")
                };
                let n = if ss.is_empty() { 2 } else { 3 };
                format!(
                    "0 {sectors} crypt aes-xts-plain64 {KEY} 0 {ram} 0 {n} \
                     no_read_workqueue no_write_workqueue{ss}"
                )
            };
            let t = reg.load_table(&table).expect("table");
            // Real data everywhere, so reads copy instead of filling zeros.
            let chunk = vec![0xa5u8; 1 << 20];
            for off in (0..DISK).step_by(chunk.len()) {
                t.write_at(off, &chunk, WriteFlags::default())
                    .expect("prefill");
            }
            Box::new(Target(t, encrypt))
        }
        other => panic!("unknown path {other} (raw, engine, target, linear)"),
    }
}

/// The loop callgrind counts (`--toggle-collect='*hot_loop*'`); never inlined so it has a
/// symbol of its own.
#[inline(never)]
fn hot_loop(p: &mut dyn Path, buf: &mut [u8], first: u64, count: u64) {
    for i in 0..count {
        p.run(first + i * (REQ as u64 / 512), black_box(&mut *buf));
    }
}

/// The calling thread's CPU time (other processes' time slices are not charged to us).
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; the thread CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; ignore flags.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let cmd = arg(0, "ratio");
    match cmd.as_str() {
        "count" => {
            let kind = arg(1, "engine");
            let ss: usize = arg(2, "4096").parse().expect("sector size");
            let encrypt = arg(3, "decrypt") == "encrypt";
            let n: u64 = arg(4, "10000").parse().expect("count");
            let mut p = path(&kind, ss, encrypt);
            let mut buf = vec![0x5au8; REQ];
            // Warm up (first-use context creation, page faults) outside the counted loop.
            hot_loop_warm(&mut *p, &mut buf);
            hot_loop(&mut *p, &mut buf, 1 << 20, n);
            println!("{kind} sector_size={ss} {} requests={n}", arg(3, "decrypt"));
        }
        "ratio" => {
            // A/B in one process: rounds alternate the paths; per round, each path's CPU
            // time for the same number of requests; the median ratio is printed.
            let rounds: usize = arg(1, "15").parse().expect("rounds");
            let n: u64 = arg(2, "20000").parse().expect("requests per round");
            for ss in [4096usize, 512] {
                for encrypt in [false, true] {
                    let mut raw = path("raw", ss, encrypt);
                    let mut eng = path("engine", ss, encrypt);
                    let mut tgt = path("target", ss, encrypt);
                    let mut lin = path("linear", ss, encrypt);
                    let mut buf = vec![0x5au8; REQ];
                    let mut r_eng = Vec::new();
                    let mut r_tgt = Vec::new();
                    let mut raw_ns = Vec::new();
                    for round in 0..rounds {
                        let mut t = [0f64; 4];
                        let order: [usize; 4] = if round % 2 == 0 {
                            [0, 1, 2, 3]
                        } else {
                            [3, 2, 1, 0]
                        };
                        for k in order {
                            let p: &mut dyn Path = match k {
                                0 => &mut *raw,
                                1 => &mut *eng,
                                2 => &mut *tgt,
                                _ => &mut *lin,
                            };
                            let s = cpu_now();
                            hot_loop(p, &mut buf, 1 << 20, n);
                            t[k] = (cpu_now() - s).as_secs_f64();
                        }
                        r_eng.push(t[1] / t[0]);
                        // The target's crypto share: its time minus the plain copy's.
                        r_tgt.push((t[2] - t[3]) / t[0]);
                        raw_ns.push(t[0] * 1e9 / n as f64);
                    }
                    println!(
                        "sector_size={ss:4} {:7}: raw {:6.0} ns/4KiB; engine/raw {:.3}; \
                         (target-linear)/raw {:.3}  (medians of {rounds} alternating rounds)",
                        if encrypt { "encrypt" } else { "decrypt" },
                        median(raw_ns),
                        median(r_eng),
                        median(r_tgt)
                    );
                }
            }
        }
        other => panic!("unknown command {other} (count, ratio)"),
    }
}

fn hot_loop_warm(p: &mut dyn Path, buf: &mut [u8]) {
    for i in 0..64 {
        p.run(i * 8, buf);
    }
}
