//! The verification pattern of the in-process engine.
//!
//! Every 4 KiB unit of the benchmark region holds bytes derived from (unit index, generation):
//! a write bumps the unit's generation and writes its pattern; a read checks the unit holds
//! exactly the pattern of the generation last written. A stale block, a block from another
//! offset, a torn or mis-decrypted block all fail the check. Producing and checking the
//! pattern is a few additions per 8 bytes, so it stays on for every in-process run.

use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes per pattern unit: the smallest block size of every workload.
pub const UNIT: u64 = 4096;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn seed(unit: u64, generation: u32) -> u64 {
    splitmix64(unit ^ (u64::from(generation) << 40) ^ 0x6372_7970_7462_6c6b)
}

const STEP: u64 = 0xD6E8_FEB8_6659_FD93;

/// Writes the pattern of (`unit`, `generation`) into `buf` (one unit long).
pub fn fill(buf: &mut [u8], unit: u64, generation: u32) {
    let mut v = seed(unit, generation);
    for w in buf.chunks_exact_mut(8) {
        w.copy_from_slice(&v.to_le_bytes());
        v = v.wrapping_add(STEP);
    }
}

/// True when `buf` (one unit long) holds exactly the pattern of (`unit`, `generation`).
pub fn check(buf: &[u8], unit: u64, generation: u32) -> bool {
    let mut v = seed(unit, generation);
    let mut ok = true;
    for w in buf.chunks_exact(8) {
        // No early exit: keeps the loop branch-free so the check costs the same either way.
        ok &= w == v.to_le_bytes();
        v = v.wrapping_add(STEP);
    }
    ok
}

/// The generation each unit of a region holds. Workers own disjoint slices, so relaxed
/// atomics suffice; the atomics only make sharing the map between threads sound.
pub struct GenerationMap {
    gens: Vec<AtomicU32>,
}

impl GenerationMap {
    /// A map for `len` bytes, every unit at generation 0 (what [`crate::engine::prefill`]
    /// writes).
    pub fn new(len: u64) -> Self {
        GenerationMap {
            gens: (0..len / UNIT).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Generation of unit `index` (relative to the region start).
    pub fn get(&self, index: u64) -> u32 {
        self.gens[index as usize].load(Ordering::Relaxed)
    }

    /// Records that unit `index` now holds `generation`.
    pub fn set(&self, index: u64, generation: u32) {
        self.gens[index as usize].store(generation, Ordering::Relaxed)
    }

    /// Number of units.
    pub fn units(&self) -> u64 {
        self.gens.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_identifies_unit_and_generation() {
        let mut a = vec![0u8; UNIT as usize];
        fill(&mut a, 7, 3);
        assert!(check(&a, 7, 3));
        assert!(!check(&a, 7, 2));
        assert!(!check(&a, 8, 3));
        assert!(!check(&vec![0u8; UNIT as usize], 7, 3));
        let mut torn = a.clone();
        torn[4000] ^= 1;
        assert!(!check(&torn, 7, 3));
        // Units differ from each other everywhere, not only in a header.
        let mut b = vec![0u8; UNIT as usize];
        fill(&mut b, 8, 3);
        assert!(a.chunks(512).zip(b.chunks(512)).all(|(x, y)| x != y));
    }

    #[test]
    fn generation_map() {
        let m = GenerationMap::new(64 << 10);
        assert_eq!(m.units(), 16);
        assert_eq!(m.get(15), 0);
        m.set(15, 9);
        assert_eq!(m.get(15), 9);
    }
}
