//! The CPU's AES limit per register width, the ceiling every AES-XTS figure is judged
//! against (docs/bench/xts-paths.md): 12 independent AESENC chains on xmm (AES-NI), ymm
//! (VAES + AVX2) and zmm (VAES + AVX-512), in block-rounds per second of the thread's CPU
//! time, and what that allows for AES-128 (10 rounds) and AES-256 (14 rounds) in GB/s.
//!
//! usage: taskset -c 1 target/debug/examples/aes_roofline [ROUNDS]
//!
//! Why hand-written asm: the point is the instruction's throughput alone, with nothing a
//! compiler could add, reorder or remove.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    fn cpu_seconds() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    /// 12 AESENC on 12 independent registers per iteration, `$r` = xmm, ymm or zmm.
    macro_rules! chains {
        ($name:ident, $feat:literal, $r:literal) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(iterations: u64) {
                for _ in 0..iterations {
                    // SAFETY: register-only AES rounds on clobbered registers.
                    unsafe {
                        asm!(
                            concat!(
                                "vaesenc ", $r, "0, ", $r, "0, ", $r, "15\n",
                                "vaesenc ", $r, "1, ", $r, "1, ", $r, "15\n",
                                "vaesenc ", $r, "2, ", $r, "2, ", $r, "15\n",
                                "vaesenc ", $r, "3, ", $r, "3, ", $r, "15\n",
                                "vaesenc ", $r, "4, ", $r, "4, ", $r, "15\n",
                                "vaesenc ", $r, "5, ", $r, "5, ", $r, "15\n",
                                "vaesenc ", $r, "6, ", $r, "6, ", $r, "15\n",
                                "vaesenc ", $r, "7, ", $r, "7, ", $r, "15\n",
                                "vaesenc ", $r, "8, ", $r, "8, ", $r, "15\n",
                                "vaesenc ", $r, "9, ", $r, "9, ", $r, "15\n",
                                "vaesenc ", $r, "10, ", $r, "10, ", $r, "15\n",
                                "vaesenc ", $r, "11, ", $r, "11, ", $r, "15\n",
                            ),
                            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                            options(nostack, nomem, preserves_flags)
                        );
                    }
                }
            }
        };
    }
    chains!(xmm, "aes,avx", "xmm");
    chains!(ymm, "aes,avx2,vaes", "ymm");
    chains!(zmm, "aes,avx2,vaes,avx512f", "zmm");

    /// One width: its name, its loop and the blocks per register.
    type Width = (&'static str, unsafe fn(u64), u64);

    /// Block-rounds per second: `f` runs 12 * `lanes` block-rounds per iteration.
    fn rate(f: unsafe fn(u64), lanes: u64) -> f64 {
        let n = 20_000_000;
        let t = cpu_seconds();
        // SAFETY: the caller checked the CPU features.
        unsafe { f(n) };
        (n * 12 * lanes) as f64 / (cpu_seconds() - t)
    }

    pub fn main() {
        use std::arch::is_x86_feature_detected as has;
        let rounds: usize = std::env::args()
            .nth(1)
            .map_or(5, |s| s.parse().expect("rounds"));
        let mut widths: Vec<Width> = Vec::new();
        if has!("aes") && has!("avx") {
            widths.push(("xmm (AES-NI, VEX)", xmm, 1));
        }
        if has!("vaes") && has!("avx2") {
            widths.push(("ymm (VAES + AVX2)", ymm, 2));
        }
        if has!("vaes") && has!("avx512f") {
            widths.push(("zmm (VAES + AVX-512)", zmm, 4));
        }
        let mut samples = vec![Vec::new(); widths.len()];
        for _ in 0..rounds {
            for (i, (_, f, lanes)) in widths.iter().enumerate() {
                samples[i].push(rate(*f, *lanes));
            }
        }
        println!("| width | block-rounds/s (median) | AES-128 limit GB/s | AES-256 limit GB/s |");
        println!("|---|---:|---:|---:|");
        for ((name, _, _), s) in widths.iter().zip(samples.iter_mut()) {
            s.sort_by(|a, b| a.total_cmp(b));
            let r = s[s.len() / 2];
            println!(
                "| {name} | {:.2} G | {:.1} | {:.1} |",
                r / 1e9,
                r / 10.0 * 16.0 / 1e9,
                r / 14.0 * 16.0 / 1e9
            );
        }
        println!("# {rounds} rounds, medians; GB/s = 10^9 bytes per CPU second (openssl's unit)");
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    x86::main();
}
