//! Which cut points a sampled crash sweep tries: a rotating sample, so that the runs of CI
//! cover every cut point over time at the cost of one sample each. Shared by the sweeps of
//! `cryptblk` (crates/cli/tests) and `cryptblk-volume` (crates/volume/tests, through
//! `#[path]`).

use std::io::Write;
use std::sync::OnceLock;

/// This run's sweep seed: `CRYPTBLK_SWEEP_SEED` when set (to repeat a run), else the clock.
/// Printed once, past the test harness's capture, so that every run's output names it.
pub fn sweep_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let (seed, from) = match std::env::var("CRYPTBLK_SWEEP_SEED") {
            Ok(v) => (
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("CRYPTBLK_SWEEP_SEED={v:?} is not a number")),
                "CRYPTBLK_SWEEP_SEED",
            ),
            Err(_) => (
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
                "the clock",
            ),
        };
        // Written to the process's stderr, not through eprintln!, which a passing test's
        // capture would swallow.
        let _ = writeln!(
            std::io::stderr(),
            "crash sweep seed {seed} (from {from}; repeat with CRYPTBLK_SWEEP_SEED={seed})"
        );
        seed
    })
}

/// The offset in `0..stride` at which this run's sample starts, for the sample `salt`
/// (e.g. a tear) of a sweep: the seed mixed with the salt (splitmix64), so that samples of
/// one run start at unrelated offsets.
pub fn sweep_offset(stride: usize, salt: u64) -> usize {
    let mut z = sweep_seed()
        .wrapping_add(salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % stride.max(1) as u64) as usize
}
