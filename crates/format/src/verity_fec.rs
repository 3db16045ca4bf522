//! dm-verity forward error correction (FEC) as `veritysetup` writes it and the kernel's
//! dm-verity-fec reads it: Reed-Solomon parity over the data and the hash area.
//!
//! Layout facts (kernel `Documentation/admin-guide/device-mapper/verity.rst`, cryptsetup's
//! `lib/verity/verity_fec.c`; facts only, no code taken):
//! * The code is RS(255, rsn) over GF(2^8), field polynomial 0x11d, first consecutive root
//!   0, primitive element 1 (generator roots `α^0 .. α^(roots-1)`), `rsn = 255 - roots`,
//!   `roots` from 2 to 24.
//! * The covered area is a virtual sequence of `blocks` blocks of the data block size: the
//!   `data_blocks` data blocks, then the hash device from the first block after the
//!   superblock up to the end of the hash device (or up to the FEC offset when the FEC area
//!   is on the hash device). Blocks past the end read as zeros.
//! * `rounds = ceil(blocks / rsn)`. Codeword `c = n * block_size + b` (round `n`, byte `b`)
//!   takes message byte `i` from byte `b` of virtual block `i * rounds + n`: the bytes of a
//!   codeword are spread one block-stride apart, so a burst in one block costs each codeword
//!   at most one symbol. Its `roots` parity bytes sit at `fec_offset + c * roots`.
//!
//! The codec is hand-written: the Reed-Solomon crates on crates.io are either erasure
//! codes over a different construction (reed-solomon-erasure, reed-solomon-simd) or
//! unmaintained, and the kernel's exact generator (fcr 0, prim 1) with error (not erasure)
//! decoding is what byte compatibility needs.

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::verity::VerityParams;
use std::collections::BTreeMap;

/// Symbols per codeword (`DM_VERITY_FEC_RSM`).
pub const FEC_RSM: u32 = 255;
/// Fewest parity bytes per codeword veritysetup and the kernel accept.
pub const FEC_MIN_ROOTS: u32 = 2;
/// Most parity bytes per codeword veritysetup and the kernel accept.
pub const FEC_MAX_ROOTS: u32 = 24;
/// veritysetup's default `--fec-roots`.
pub const FEC_DEFAULT_ROOTS: u32 = 2;

/// GF(2^8) with the field polynomial x^8+x^4+x^3+x^2+1 (0x11d) and α = 2.
struct Gf {
    exp: [u8; 512],
    log: [u8; 256],
}

impl Gf {
    const fn new() -> Self {
        let mut exp = [0u8; 512];
        let mut log = [0u8; 256];
        let mut x: u16 = 1;
        let mut i = 0;
        while i < 255 {
            exp[i] = x as u8;
            exp[i + 255] = x as u8;
            log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
            i += 1;
        }
        exp[510] = exp[0];
        exp[511] = exp[1];
        Gf { exp, log }
    }

    fn mul(&self, a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            0
        } else {
            self.exp[self.log[a as usize] as usize + self.log[b as usize] as usize]
        }
    }

    fn div(&self, a: u8, b: u8) -> u8 {
        debug_assert!(b != 0);
        if a == 0 {
            0
        } else {
            self.exp[self.log[a as usize] as usize + 255 - self.log[b as usize] as usize]
        }
    }

    /// α^e for any non-negative exponent.
    fn pow_alpha(&self, e: usize) -> u8 {
        self.exp[e % 255]
    }

    /// p(x) at `x`, coefficients lowest power first.
    fn eval_low_first(&self, p: &[u8], x: u8) -> u8 {
        p.iter().rev().fold(0u8, |acc, &c| self.mul(acc, x) ^ c)
    }
}

static GF: Gf = Gf::new();

/// A Reed-Solomon RS(255, 255 - roots) codec with dm-verity's parameters.
#[derive(Clone, Debug)]
pub struct ReedSolomon {
    roots: usize,
    /// Generator polynomial, lowest power first, monic (`gen[roots] == 1`).
    generator: Vec<u8>,
}

impl ReedSolomon {
    /// A codec with `roots` parity bytes per 255-byte codeword.
    pub fn new(roots: u32) -> Result<Self> {
        check_roots(roots)?;
        let roots = roots as usize;
        let mut g = vec![1u8];
        for i in 0..roots {
            // g *= (x + α^i)
            let a = GF.pow_alpha(i);
            let mut next = vec![0u8; g.len() + 1];
            for (k, &c) in g.iter().enumerate() {
                next[k + 1] ^= c;
                next[k] ^= GF.mul(c, a);
            }
            g = next;
        }
        Ok(ReedSolomon {
            roots,
            generator: g,
        })
    }

    /// Message bytes per codeword.
    pub fn rsn(&self) -> usize {
        FEC_RSM as usize - self.roots
    }

    /// Parity of `msg` (`rsn` bytes, first byte highest power) into `parity` (`roots`
    /// bytes), systematic: the codeword is `msg || parity`.
    pub fn encode(&self, msg: &[u8], parity: &mut [u8]) {
        let r = self.roots;
        debug_assert_eq!(msg.len(), self.rsn());
        debug_assert_eq!(parity.len(), r);
        parity.fill(0);
        for &d in msg {
            let fb = d ^ parity[0];
            parity.copy_within(1.., 0);
            parity[r - 1] = 0;
            if fb != 0 {
                for (j, p) in parity.iter_mut().enumerate() {
                    *p ^= GF.mul(fb, self.generator[r - 1 - j]);
                }
            }
        }
    }

    fn syndromes(&self, cw: &[u8]) -> Vec<u8> {
        (0..self.roots)
            .map(|i| {
                let x = GF.pow_alpha(i);
                cw.iter().fold(0u8, |s, &c| GF.mul(s, x) ^ c)
            })
            .collect()
    }

    /// Corrects up to `roots / 2` wrong bytes of the 255-byte codeword `cw` in place.
    /// Returns the number corrected, or `None` when the codeword cannot be corrected (it
    /// is then left unchanged).
    pub fn decode(&self, cw: &mut [u8]) -> Option<usize> {
        debug_assert_eq!(cw.len(), FEC_RSM as usize);
        let s = self.syndromes(cw);
        if s.iter().all(|&v| v == 0) {
            return Some(0);
        }
        // Berlekamp-Massey: the error locator Λ (lowest power first, Λ0 = 1).
        let mut lambda = vec![1u8];
        let mut prev = vec![1u8];
        let mut l = 0usize;
        let mut shift = 1usize;
        let mut prev_d = 1u8;
        for (n, &sn) in s.iter().enumerate() {
            let mut d = sn;
            for (i, &li) in lambda.iter().enumerate().take(l + 1).skip(1) {
                d ^= GF.mul(li, s[n - i]);
            }
            if d == 0 {
                shift += 1;
                continue;
            }
            let coef = GF.div(d, prev_d);
            let mut next = lambda.clone();
            if next.len() < prev.len() + shift {
                next.resize(prev.len() + shift, 0);
            }
            for (i, &p) in prev.iter().enumerate() {
                next[i + shift] ^= GF.mul(coef, p);
            }
            if 2 * l <= n {
                prev = std::mem::replace(&mut lambda, next);
                l = n + 1 - l;
                prev_d = d;
                shift = 1;
            } else {
                lambda = next;
                shift += 1;
            }
        }
        while lambda.len() > 1 && *lambda.last().expect("non-empty") == 0 {
            lambda.pop();
        }
        let degree = lambda.len() - 1;
        if degree != l || 2 * degree > self.roots {
            return None;
        }
        // Ω = S·Λ mod x^roots.
        let mut omega = vec![0u8; self.roots];
        for (i, &si) in s.iter().enumerate() {
            for (k, &lk) in lambda.iter().enumerate() {
                if i + k < self.roots {
                    omega[i + k] ^= GF.mul(si, lk);
                }
            }
        }
        // Λ' (formal derivative: in characteristic 2 only the odd terms survive).
        let deriv: Vec<u8> = (1..lambda.len())
            .map(|k| if k % 2 == 1 { lambda[k] } else { 0 })
            .collect();
        // Chien search over the 255 positions; position j holds the coefficient of
        // x^(254 - j), locator X = α^(254 - j).
        let mut fixes = Vec::with_capacity(degree);
        for j in 0..FEC_RSM as usize {
            let power = FEC_RSM as usize - 1 - j;
            let x_inv = GF.pow_alpha(255 - power);
            if GF.eval_low_first(&lambda, x_inv) != 0 {
                continue;
            }
            let den = GF.eval_low_first(&deriv, x_inv);
            if den == 0 {
                return None;
            }
            // Forney with first consecutive root 0: e = X · Ω(X⁻¹) / Λ'(X⁻¹).
            let num = GF.mul(GF.pow_alpha(power), GF.eval_low_first(&omega, x_inv));
            fixes.push((j, GF.div(num, den)));
        }
        if fixes.len() != degree {
            return None;
        }
        let mut fixed = cw.to_vec();
        for &(j, e) in &fixes {
            fixed[j] ^= e;
        }
        // A locator of the right degree whose fix still leaves a non-codeword means more
        // errors than the code corrects: refuse instead of miscorrecting.
        if self.syndromes(&fixed).iter().any(|&v| v != 0) {
            return None;
        }
        cw.copy_from_slice(&fixed);
        Some(fixes.len())
    }
}

/// Checks a `--fec-roots` value (veritysetup: "Invalid number of parity bytes.").
pub fn check_roots(roots: u32) -> Result<()> {
    if !(FEC_MIN_ROOTS..=FEC_MAX_ROOTS).contains(&roots) {
        return Err(FormatError::InvalidParameter(
            "Invalid number of parity bytes.".into(),
        ));
    }
    Ok(())
}

/// Where the FEC of a verity volume lives and what it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FecLayout {
    /// Data (= hash) block size in bytes.
    pub block_size: u32,
    /// Parity bytes per codeword.
    pub roots: u32,
    /// Data blocks at the start of the covered area.
    pub data_blocks: u64,
    /// Byte offset on the hash device of the first covered hash-area block (after the
    /// superblock).
    pub hash_start: u64,
    /// Covered blocks in all (data, then hash area): the kernel's `fec_blocks`.
    pub blocks: u64,
    /// Byte offset of the parity on the FEC device.
    pub fec_offset: u64,
}

impl FecLayout {
    /// The layout veritysetup uses for `params` with `roots` parity bytes at `fec_offset`.
    /// `hash_area_end` is where the covered hash area ends on the hash device: its size,
    /// or `fec_offset` when the FEC area is on the hash device itself.
    pub fn new(
        params: &VerityParams,
        roots: u32,
        fec_offset: u64,
        hash_area_end: u64,
    ) -> Result<Self> {
        check_roots(roots)?;
        if params.data_block_size != params.hash_block_size {
            return Err(FormatError::InvalidParameter(
                "Block sizes must match for FEC.".into(),
            ));
        }
        let bs = u64::from(params.data_block_size);
        let hash_offset_block =
            params.hash_offset / u64::from(params.hash_block_size) + u64::from(params.superblock);
        let hash_blocks = (hash_area_end / bs).saturating_sub(hash_offset_block);
        Ok(FecLayout {
            block_size: params.data_block_size,
            roots,
            data_blocks: params.data_blocks,
            hash_start: hash_offset_block * bs,
            blocks: params.data_blocks + hash_blocks,
            fec_offset,
        })
    }

    /// Message bytes per codeword.
    pub fn rsn(&self) -> u64 {
        u64::from(FEC_RSM - self.roots)
    }

    /// Interleaving rounds: codewords per block-byte position.
    pub fn rounds(&self) -> u64 {
        self.blocks.div_ceil(self.rsn())
    }

    /// Parity size in blocks (`veritysetup dump`'s "FEC blocks").
    pub fn parity_blocks(&self) -> u64 {
        self.rounds() * u64::from(self.roots)
    }

    /// Parity size in bytes.
    pub fn parity_bytes(&self) -> u64 {
        self.parity_blocks() * u64::from(self.block_size)
    }

    /// Where virtual block `k` lives: `(true, offset)` on the data device, `(false,
    /// offset)` on the hash device, or `None` past the covered area (reads as zeros).
    pub fn locate(&self, k: u64) -> Option<(bool, u64)> {
        let bs = u64::from(self.block_size);
        if k < self.data_blocks {
            Some((true, k * bs))
        } else if k < self.blocks {
            Some((false, self.hash_start + (k - self.data_blocks) * bs))
        } else {
            None
        }
    }

    fn read_round(
        &self,
        data: &dyn HeaderIo,
        hash: &dyn HeaderIo,
        n: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let bs = self.block_size as usize;
        let rounds = self.rounds();
        for (i, block) in buf.chunks_exact_mut(bs).enumerate() {
            let k = i as u64 * rounds + n;
            match self.locate(k) {
                None => block.fill(0),
                Some((on_data, off)) => {
                    let dev = if on_data { data } else { hash };
                    dev.read_at(off, block)
                        .map_err(|e| FormatError::io(format!("reading FEC input block {k}"), e))?;
                }
            }
        }
        Ok(())
    }
}

/// Computes the parity of the covered area and writes it at `layout.fec_offset` of `fec`.
pub fn encode(
    data: &dyn HeaderIo,
    hash: &dyn HeaderIo,
    fec: &dyn HeaderIo,
    layout: &FecLayout,
) -> Result<()> {
    let rs = ReedSolomon::new(layout.roots)?;
    let bs = layout.block_size as usize;
    let rsn = rs.rsn();
    let roots = layout.roots as usize;
    let mut buf = vec![0u8; rsn * bs];
    let mut msg = vec![0u8; rsn];
    let mut parity = vec![0u8; bs * roots];
    for n in 0..layout.rounds() {
        layout.read_round(data, hash, n, &mut buf)?;
        for b in 0..bs {
            for (i, m) in msg.iter_mut().enumerate() {
                *m = buf[i * bs + b];
            }
            rs.encode(&msg, &mut parity[b * roots..(b + 1) * roots]);
        }
        fec.write_at(layout.fec_offset + n * parity.len() as u64, &parity)
            .map_err(|e| FormatError::io("writing FEC parity", e))?;
    }
    fec.sync()
        .map_err(|e| FormatError::io("syncing FEC device", e))?;
    Ok(())
}

/// What [`correct`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FecCorrection {
    /// Bytes corrected in all.
    pub errors: usize,
    /// Corrected contents of every covered block that had errors, by virtual block index.
    pub blocks: BTreeMap<u64, Vec<u8>>,
}

/// Decodes every codeword of the covered area against the parity on `fec` (nothing is
/// written). `Err(FormatError::Corrupt)` names the first round that cannot be corrected.
pub fn correct(
    data: &dyn HeaderIo,
    hash: &dyn HeaderIo,
    fec: &dyn HeaderIo,
    layout: &FecLayout,
) -> Result<FecCorrection> {
    let rs = ReedSolomon::new(layout.roots)?;
    let bs = layout.block_size as usize;
    let rsn = rs.rsn();
    let roots = layout.roots as usize;
    let rounds = layout.rounds();
    let mut buf = vec![0u8; rsn * bs];
    let mut parity = vec![0u8; bs * roots];
    let mut cw = vec![0u8; FEC_RSM as usize];
    let mut out = FecCorrection::default();
    for n in 0..rounds {
        layout.read_round(data, hash, n, &mut buf)?;
        fec.read_at(layout.fec_offset + n * parity.len() as u64, &mut parity)
            .map_err(|e| FormatError::io("reading FEC parity", e))?;
        let mut touched = vec![false; rsn];
        for b in 0..bs {
            for (i, c) in cw[..rsn].iter_mut().enumerate() {
                *c = buf[i * bs + b];
            }
            cw[rsn..].copy_from_slice(&parity[b * roots..(b + 1) * roots]);
            match rs.decode(&mut cw) {
                None => {
                    return Err(FormatError::Corrupt(format!(
                        "Failed to repair parity for block {n}."
                    )))
                }
                Some(0) => {}
                Some(fixed) => {
                    out.errors += fixed;
                    for (i, (&c, t)) in cw[..rsn].iter().zip(touched.iter_mut()).enumerate() {
                        if buf[i * bs + b] != c {
                            buf[i * bs + b] = c;
                            *t = true;
                        }
                    }
                }
            }
        }
        for (i, t) in touched.iter().enumerate() {
            let k = i as u64 * rounds + n;
            if *t && k < layout.blocks {
                out.blocks.insert(k, buf[i * bs..(i + 1) * bs].to_vec());
            }
        }
    }
    Ok(out)
}

/// A read-only view of a device with some blocks replaced (the FEC-corrected ones).
pub struct PatchedIo<'a> {
    inner: &'a dyn HeaderIo,
    /// Replacement contents by byte offset.
    patches: BTreeMap<u64, Vec<u8>>,
}

impl<'a> PatchedIo<'a> {
    /// `inner` with the blocks of `c` that live on it (`data` side when `on_data`, hash
    /// side otherwise; both when the data and hash devices are one file) replaced.
    pub fn new(
        inner: &'a dyn HeaderIo,
        layout: &FecLayout,
        c: &FecCorrection,
        data_side: bool,
        hash_side: bool,
    ) -> Self {
        let mut patches = BTreeMap::new();
        for (&k, block) in &c.blocks {
            if let Some((on_data, off)) = layout.locate(k) {
                if (on_data && data_side) || (!on_data && hash_side) {
                    patches.insert(off, block.clone());
                }
            }
        }
        PatchedIo { inner, patches }
    }
}

impl HeaderIo for PatchedIo<'_> {
    fn size(&self) -> std::io::Result<u64> {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)?;
        let end = offset + buf.len() as u64;
        // Blocks are all one size; a patch starting up to one block before `offset` may
        // still overlap it.
        let from =
            offset.saturating_sub(self.patches.values().next().map_or(0, |b| b.len()) as u64);
        for (&at, block) in self.patches.range(from..end) {
            let pend = at + block.len() as u64;
            if pend <= offset {
                continue;
            }
            let lo = at.max(offset);
            let hi = pend.min(end);
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&block[(lo - at) as usize..(hi - at) as usize]);
        }
        Ok(())
    }

    fn write_at(&self, _offset: u64, _buf: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "read-only corrected view",
        ))
    }

    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u8 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u8
    }

    #[test]
    fn generator_has_the_kernel_roots() {
        for roots in [2u32, 7, 24] {
            let rs = ReedSolomon::new(roots).unwrap();
            for i in 0..roots as usize {
                assert_eq!(GF.eval_low_first(&rs.generator, GF.pow_alpha(i)), 0);
            }
        }
    }

    #[test]
    fn corrects_up_to_half_the_roots_and_refuses_more() {
        let mut seed = 7u64;
        for roots in [2u32, 3, 8, 24] {
            let rs = ReedSolomon::new(roots).unwrap();
            for trial in 0..20 {
                let msg: Vec<u8> = (0..rs.rsn()).map(|_| lcg(&mut seed)).collect();
                let mut cw = msg.clone();
                cw.resize(255, 0);
                let mut parity = vec![0u8; roots as usize];
                rs.encode(&msg, &mut parity);
                cw[rs.rsn()..].copy_from_slice(&parity);
                let good = cw.clone();
                assert_eq!(rs.decode(&mut cw.clone()), Some(0));
                let t = roots as usize / 2;
                let mut bad = good.clone();
                let mut pos = std::collections::BTreeSet::new();
                while pos.len() < t {
                    pos.insert(lcg(&mut seed) as usize % 255);
                }
                for &p in &pos {
                    bad[p] ^= lcg(&mut seed) | 1;
                }
                assert_eq!(rs.decode(&mut bad), Some(t), "roots {roots} trial {trial}");
                assert_eq!(bad, good);
                // One error more than the code corrects: refused and left unchanged. (With
                // few roots a wrong "correction" to another codeword is likely by nature,
                // so this is only asserted where miscorrection is improbable.)
                if roots >= 16 {
                    let mut worse = good.clone();
                    let mut pos = std::collections::BTreeSet::new();
                    while pos.len() < t + 1 {
                        pos.insert(lcg(&mut seed) as usize % 255);
                    }
                    for &p in &pos {
                        worse[p] ^= lcg(&mut seed) | 1;
                    }
                    let before = worse.clone();
                    assert_eq!(rs.decode(&mut worse), None, "roots {roots} trial {trial}");
                    assert_eq!(worse, before);
                }
            }
        }
    }

    #[test]
    fn patched_io_overlays_blocks() {
        let base: Vec<u8> = vec![0u8; 64];
        let layout = FecLayout {
            block_size: 16,
            roots: 2,
            data_blocks: 4,
            hash_start: 0,
            blocks: 4,
            fec_offset: 0,
        };
        let file = tempfile_like(&base);
        let mut c = FecCorrection::default();
        c.blocks.insert(1, vec![9u8; 16]);
        let p = PatchedIo::new(&file, &layout, &c, true, false);
        let mut buf = vec![0u8; 20];
        p.read_at(10, &mut buf).unwrap();
        assert_eq!(&buf[..6], &[0; 6]);
        assert_eq!(&buf[6..20], &[9; 14]);
    }

    struct Mem(Vec<u8>);
    impl HeaderIo for Mem {
        fn size(&self) -> std::io::Result<u64> {
            Ok(self.0.len() as u64)
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            buf.copy_from_slice(&self.0[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
            unreachable!()
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn tempfile_like(b: &[u8]) -> Mem {
        Mem(b.to_vec())
    }
}
