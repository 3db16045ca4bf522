//! Structure-aware mutations of the FVAULT2 fuzz seeds (fuzz/corpus/fvault2_header, built by
//! tests/independent/fvault2.py), fed to the metadata reader, the dump and the unlock: a
//! quick stand-in for the libFuzzer target on stable Rust. Besides raw bit flips (which
//! mostly stop at a checksum), the encrypted metadata blocks are decrypted, mutated in
//! plaintext (XML included), re-sealed and re-encrypted, so that the plist lookups, base64
//! decoding and size checks see hostile input. Every input must give a header or an error,
//! never a panic.
//!
//! The default run is short; a long one: `FVAULT2_MUTATIONS=1000000 cargo test -p
//! cryptblk-format --test fvault2_mutations -- --nocapture`.

use aes::cipher::generic_array::GenericArray;
use aes::cipher::KeyInit;
use cryptblk_format::fvault2::Fvault2Header;
use cryptblk_format::hdrio::MemIo;
use std::path::Path;

const MD: usize = 8192;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn seal(block: &mut [u8]) {
    block[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
    let crc = !crc32c::crc32c_append(0, &block[8..]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
}

/// The seed's encrypted metadata: the XTS cipher and where the blocks start.
fn metadata(seed: &[u8]) -> (xts_mode::Xts128<aes::Aes128>, usize) {
    let bs = le32(seed, 96) as usize;
    let label = le64(seed, 104) as usize * bs;
    let vgd = label + le32(seed, label + 220) as usize;
    let start = le64(seed, vgd + 32) as usize * bs;
    let key = |r: std::ops::Range<usize>| aes::Aes128::new(GenericArray::from_slice(&seed[r]));
    (xts_mode::Xts128::new(key(176..192), key(304..320)), start)
}

/// One mutation of `seed`.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut d = seed.to_vec();
    let (xts, start) = metadata(seed);
    let blocks = (d.len() - start) / MD;
    match rng.below(6) {
        // Raw flips anywhere.
        0 => {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(d.len());
                d[at] ^= 1 << rng.below(8);
            }
        }
        // A re-sealed physical volume header with a changed field.
        1 => {
            let at = rng.below(320);
            d[at] = rng.next() as u8;
            seal(&mut d[..512]);
        }
        // A truncated device.
        2 => d.truncate(rng.below(d.len())),
        // A metadata block's plaintext changed, re-sealed and re-encrypted.
        _ => {
            let i = rng.below(blocks);
            let block = &mut d[start + i * MD..start + (i + 1) * MD];
            xts.decrypt_sector(block, u128::from(i as u64).to_le_bytes());
            for _ in 0..1 + rng.below(4) {
                match rng.below(4) {
                    // A field of the block header or an offset/size word.
                    0 => {
                        let at = 8 + rng.below(128);
                        block[at] = rng.next() as u8;
                    }
                    // A byte of the XML (where the seeds keep it).
                    1 | 2 => {
                        let at = 320 + rng.below(1200);
                        let v = [b'<', b'>', b'/', b'0', b'=', 0, b'x', rng.next() as u8];
                        block[at] = v[rng.below(v.len())];
                    }
                    // A run of the XML removed.
                    _ => {
                        let a = 320 + rng.below(1200);
                        let n = rng.below(40).min(MD - a - 40);
                        block.copy_within(a + n..MD, a);
                    }
                }
            }
            seal(block);
            xts.encrypt_sector(block, u128::from(i as u64).to_le_bytes());
        }
    }
    d
}

/// The input as the start of a device: a zero block after it ends the metadata.
fn device(mut input: Vec<u8>) -> MemIo {
    input.resize(input.len() + 2 * MD, 0);
    MemIo::new(input)
}

fn run(iterations: u64) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/fvault2_header");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty());
    // The seeds themselves are valid volumes that unlock with the model's passphrase.
    for s in &seeds {
        let h = Fvault2Header::read(&device(s.clone())).expect("seed parses");
        h.unlock(b"synthetic").expect("seed unlocks");
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut parsed, mut unlocked) = (0u64, 0u64);
    for _ in 0..iterations {
        let seed = &seeds[rng.below(seeds.len())];
        let input = mutate(seed, &mut rng);
        if let Ok(h) = Fvault2Header::read(&device(input)) {
            parsed += 1;
            let _ = h.dump("fuzz");
            if h.pbkdf2_iterations <= 16 && h.unlock(b"synthetic").is_ok() {
                unlocked += 1;
            }
        }
    }
    eprintln!("{iterations} mutated inputs: {parsed} parsed, {unlocked} unlocked");
    assert!(parsed > 0 && parsed < iterations);
}

#[test]
fn mutated_seeds_never_panic() {
    let n = std::env::var("FVAULT2_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    run(n);
}
