//! Hand-written AES-XTS (AES-128-XTS and AES-256-XTS) for x86-64, one path per CPU class:
//! AES-NI on 128-bit xmm registers, VAES + AVX2 on 256-bit ymm registers (2 blocks per
//! instruction) and VAES + AVX-512 on 512-bit zmm registers (4 blocks per instruction).
//!
//! Why hand-written: no maintained userspace library has an XTS path for VAES with AVX2
//! (OpenSSL 3.0 and AWS-LC stop at AES-NI there; the Linux kernel's aes-xts-vaes-avx2 is
//! kernel-only and GPL), AWS-LC has no AES-128-XTS at all and its AVX-512 XTS is AES-256
//! only, and RustCrypto's `xts-mode` goes one block at a time. Each path keeps 8 vectors of
//! blocks in flight (8, 16 or 32 blocks) so the AES units' latency is covered. The VAES paths
//! keep the tweaks in vector registers: every lane's tweak is advanced by x^(8 * lanes) per
//! iteration with one carry-less multiply for the reduction, so the 8 tweak vectors are
//! independent. The AES-NI path is one asm loop after OpenSSL's (see `mod aesni`).
//!
//! A request of several sectors has the tweaks of 8 sectors encrypted at once (the serial
//! 10-14 rounds of one tweak otherwise cost every sector their full latency: +30-40% at
//! 512-byte sectors, a few percent at 4 KiB).
//!
//! Only whole 16-byte blocks: dm-crypt's sectors are 512..4096 bytes, so XTS's ciphertext
//! stealing (for a data unit that is not a block multiple) is never needed; other lengths are
//! refused with an error.
//!
//! The key schedules (data key, its decryption form, tweak key) are expanded once per key
//! and live in locked memory, zeroized on drop. Register spills of round keys and tweaks to
//! the stack are not wiped (as with any AES-NI code compiled by a compiler).

use crate::cpu::cpu_features;
use crate::locked::LockedBox;
use crate::CipherError;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One of the hand-written AES-XTS paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XtsPath {
    /// AES-NI on xmm registers, 8 blocks in flight.
    AesNi,
    /// VAES + AVX2 on ymm registers, 8 x 2 blocks in flight.
    VaesAvx2,
    /// VAES + AVX-512 on zmm registers, 8 x 4 blocks in flight.
    VaesAvx512,
}

impl XtsPath {
    /// Every path, slowest first.
    pub const ALL: [XtsPath; 3] = [XtsPath::AesNi, XtsPath::VaesAvx2, XtsPath::VaesAvx512];

    /// The registry name (`cryptblk ciphers`, `--cipher-implementation`).
    pub fn name(self) -> &'static str {
        match self {
            XtsPath::AesNi => "aesni-xts",
            XtsPath::VaesAvx2 => "vaes-avx2-xts",
            XtsPath::VaesAvx512 => "vaes-avx512-xts",
        }
    }

    /// Whether this CPU (after `CRYPTBLK_CPU_MASK`) can run the path.
    pub fn available(self) -> bool {
        let f = cpu_features();
        let base = cfg!(target_arch = "x86_64") && f.aesni && f.pclmul;
        match self {
            XtsPath::AesNi => base,
            XtsPath::VaesAvx2 => base && f.avx2 && f.vaes,
            XtsPath::VaesAvx512 => base && f.avx2 && f.vaes && f.avx512,
        }
    }
}

/// Whether the AES-NI path may use VEX encodings: AVX on this CPU, and `avx2` not hidden by
/// `CRYPTBLK_CPU_MASK` (masking it selects the legacy SSE encodings, so both are testable).
fn vex_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cpu_features().avx2 && std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Round keys: the data key (encryption and equivalent-inverse decryption schedules) and
/// the tweak key, for 10 (AES-128) or 14 (AES-256) rounds.
#[repr(C, align(64))]
struct Schedule {
    enc: [[u8; 16]; 15],
    dec: [[u8; 16]; 15],
    tweak: [[u8; 16]; 15],
    rounds: usize,
}

impl Drop for Schedule {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.enc.zeroize();
        self.dec.zeroize();
        self.tweak.zeroize();
    }
}

/// AES-XTS keyed for one of the [`XtsPath`]s: `key` is key1 || key2 (32 bytes for
/// AES-128-XTS, 64 for AES-256-XTS), data units are whole 16-byte blocks.
pub struct XtsAes {
    path: XtsPath,
    ks: LockedBox<Schedule>,
    /// The AES-NI path uses VEX encodings (AVX present and `avx2` not masked).
    vex: bool,
}

impl XtsAes {
    /// Expands `key` for `path`; fails when the CPU lacks the path or the key size is not
    /// 32 or 64 bytes.
    pub fn new(path: XtsPath, key: &[u8]) -> Result<Self, CipherError> {
        if !path.available() {
            return Err(CipherError::NoImplementation(path.name().into()));
        }
        if key.len() != 32 && key.len() != 64 {
            return Err(CipherError::KeySize {
                spec: "aes-xts".into(),
                got: key.len(),
            });
        }
        crate::lock_backend_memory();
        let mut ks = LockedBox::new(Schedule {
            enc: [[0; 16]; 15],
            dec: [[0; 16]; 15],
            tweak: [[0; 16]; 15],
            rounds: 0,
        });
        let (k1, k2) = key.split_at(key.len() / 2);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: available() checked AES-NI (with SSE4.1).
        unsafe {
            let s = &mut *ks;
            s.rounds = expand(k1, &mut s.enc);
            expand(k2, &mut s.tweak);
            invert(&s.enc, &mut s.dec, s.rounds);
        }
        Ok(Self {
            path,
            ks,
            vex: vex_available(),
        })
    }

    /// The path this instance runs.
    pub fn path(&self) -> XtsPath {
        self.path
    }

    /// The AES-NI path with the legacy SSE encodings even where AVX is present (what a CPU
    /// without AVX runs), so tests and measurements reach both; other paths are unchanged.
    pub fn with_sse_encoding(mut self) -> Self {
        self.vex = false;
        self
    }

    /// Whether the AES-NI path runs the VEX (AVX) encodings.
    pub fn uses_vex(&self) -> bool {
        self.path == XtsPath::AesNi && self.vex
    }

    /// Encrypts one data unit in place with the 16-byte tweak (for dm-crypt's plain64,
    /// the little-endian sector number).
    pub fn encrypt_unit(&self, tweak: &[u8; 16], buf: &mut [u8]) -> Result<(), CipherError> {
        self.unit(false, tweak, None, buf)
    }

    /// Decrypts one data unit in place.
    pub fn decrypt_unit(&self, tweak: &[u8; 16], buf: &mut [u8]) -> Result<(), CipherError> {
        self.unit(true, tweak, None, buf)
    }

    /// One data unit, from `src` (or in place) into `dst`.
    pub(crate) fn unit(
        &self,
        decrypt: bool,
        tweak: &[u8; 16],
        src: Option<&[u8]>,
        dst: &mut [u8],
    ) -> Result<(), CipherError> {
        if dst.is_empty() || !dst.len().is_multiple_of(16) {
            return Err(CipherError::Unsupported(format!(
                "XTS data unit of {} bytes: only whole 16-byte blocks (no ciphertext stealing; \
                 dm-crypt sectors never need it)",
                dst.len()
            )));
        }
        if src.is_some_and(|s| s.len() != dst.len()) {
            return Err(CipherError::Backend(
                "source and destination lengths differ".into(),
            ));
        }
        #[cfg(target_arch = "x86_64")]
        {
            let mut t0 = [tweak_block(*tweak)];
            self.encrypt_tweaks(&mut t0);
            // SAFETY: the path's CPU features were checked when this was keyed.
            unsafe { self.unit_encrypted_tweak(decrypt, t0[0], src, dst) };
        }
        Ok(())
    }

    /// Encrypts up to 8 tweaks in place under the tweak key, interleaved: the tweak
    /// encryption is one serial chain of 10 or 14 AES rounds per sector, which a request of
    /// several sectors overlaps instead of paying each time.
    #[cfg(target_arch = "x86_64")]
    fn encrypt_tweaks(&self, t: &mut [__m128i]) {
        debug_assert!((1..=8).contains(&t.len()));
        macro_rules! by_count {
            ($r:literal) => {
                match t.len() {
                    1 => encrypt_blocks::<$r, 1>(&self.ks.tweak, t.try_into().unwrap()),
                    2 => encrypt_blocks::<$r, 2>(&self.ks.tweak, t.try_into().unwrap()),
                    3 => encrypt_blocks::<$r, 3>(&self.ks.tweak, t.try_into().unwrap()),
                    4 => encrypt_blocks::<$r, 4>(&self.ks.tweak, t.try_into().unwrap()),
                    5 => encrypt_blocks::<$r, 5>(&self.ks.tweak, t.try_into().unwrap()),
                    6 => encrypt_blocks::<$r, 6>(&self.ks.tweak, t.try_into().unwrap()),
                    7 => encrypt_blocks::<$r, 7>(&self.ks.tweak, t.try_into().unwrap()),
                    _ => encrypt_blocks::<$r, 8>(&self.ks.tweak, t.try_into().unwrap()),
                }
            };
        }
        // SAFETY: AES-NI was checked when this was keyed.
        unsafe {
            if self.ks.rounds == 10 {
                by_count!(10)
            } else {
                by_count!(14)
            }
        }
    }

    /// One data unit whose tweak is already encrypted (`t0`); lengths checked by the caller.
    ///
    /// # Safety
    /// `src`, when given, has `dst`'s length, a nonzero multiple of 16.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unit_encrypted_tweak(
        &self,
        decrypt: bool,
        tweak: __m128i,
        src: Option<&[u8]>,
        dst: &mut [u8],
    ) {
        let inp = src.map_or(dst.as_ptr(), <[u8]>::as_ptr);
        let out = dst.as_mut_ptr();
        let n = dst.len();
        // SAFETY: the path's CPU features were checked when this was keyed; `inp` and `out`
        // are `n` valid bytes each, equal or disjoint (distinct borrows).
        unsafe {
            let s = &*self.ks;
            match (self.path, decrypt) {
                (XtsPath::AesNi, false) => aesni::encrypt(s, tweak, inp, out, n, self.vex),
                (XtsPath::AesNi, true) => aesni::decrypt(s, tweak, inp, out, n, self.vex),
                (XtsPath::VaesAvx2, false) => avx2::encrypt(s, tweak, inp, out, n),
                (XtsPath::VaesAvx2, true) => avx2::decrypt(s, tweak, inp, out, n),
                (XtsPath::VaesAvx512, false) => avx512::encrypt(s, tweak, inp, out, n),
                (XtsPath::VaesAvx512, true) => avx512::decrypt(s, tweak, inp, out, n),
            }
        }
    }
}

/// `t * x^s` in GF(2^128) for each 128-bit lane, XTS's little-endian convention, `s` in
/// 0..=57 (each 64-bit shift count is that of its lane; a count of 64 shifts out all bits).
/// The bits shifted out of the top are reduced with one carry-less multiply by 0x87.
macro_rules! mulx_body {
    ($v:expr, $shl:expr, $shr:expr, $bslli8:expr, $clmul01:expr, $xor3:expr) => {{
        let v = $v;
        let a = $shl(v); // lo << s, hi << s
        let b = $shr(v); // lo >> (64 - s), hi >> (64 - s)
        let c = $bslli8(b); // 0, lo >> (64 - s): carry from lo into hi
        let d = $clmul01(b); // (hi >> (64 - s)) * 0x87 into lo
        $xor3(a, c, d)
    }};
}

/// `enc8`/`dec8`: one AES round on 8 vectors in one `asm!` block. Why asm: with intrinsics,
/// LLVM's scheduler on 16 vector registers (xmm, ymm) reorders the rounds into two blocks
/// at a time to save registers, which leaves the AES units waiting on latency; one asm
/// statement per round needs all 8 blocks in registers at once, so they stay interleaved.
macro_rules! asm8 {
    ($feat:literal, $V:ty, $cls:ident, "aes") => {
        // Legacy SSE encoding, two operands: `aesenc x, k`.
        asm8!(@one enc8, $feat, $V, $cls,
            "aesenc {0}, {8}\n aesenc {1}, {8}\n aesenc {2}, {8}\n aesenc {3}, {8}\n",
            "aesenc {4}, {8}\n aesenc {5}, {8}\n aesenc {6}, {8}\n aesenc {7}, {8}");
        asm8!(@one dec8, $feat, $V, $cls,
            "aesdec {0}, {8}\n aesdec {1}, {8}\n aesdec {2}, {8}\n aesdec {3}, {8}\n",
            "aesdec {4}, {8}\n aesdec {5}, {8}\n aesdec {6}, {8}\n aesdec {7}, {8}");
    };
    ($feat:literal, $V:ty, $cls:ident, "vaes") => {
        // VEX/EVEX encoding, three operands: `vaesenc x, x, k`.
        asm8!(@one enc8, $feat, $V, $cls,
            "vaesenc {0}, {0}, {8}\n vaesenc {1}, {1}, {8}\n vaesenc {2}, {2}, {8}\n vaesenc {3}, {3}, {8}\n",
            "vaesenc {4}, {4}, {8}\n vaesenc {5}, {5}, {8}\n vaesenc {6}, {6}, {8}\n vaesenc {7}, {7}, {8}");
        asm8!(@one dec8, $feat, $V, $cls,
            "vaesdec {0}, {0}, {8}\n vaesdec {1}, {1}, {8}\n vaesdec {2}, {2}, {8}\n vaesdec {3}, {3}, {8}\n",
            "vaesdec {4}, {4}, {8}\n vaesdec {5}, {5}, {8}\n vaesdec {6}, {6}, {8}\n vaesdec {7}, {7}, {8}");
    };
    (@one $name:ident, $feat:literal, $V:ty, $cls:ident, $a:literal, $b:literal) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $name(x: &mut [$V; 8], k: $V) {
            // SAFETY: register-only AES rounds; the features are enabled on this function.
            unsafe {
                std::arch::asm!(
                    $a, $b,
                    inout($cls) x[0], inout($cls) x[1], inout($cls) x[2], inout($cls) x[3],
                    inout($cls) x[4], inout($cls) x[5], inout($cls) x[6], inout($cls) x[7],
                    in($cls) k,
                    options(pure, nomem, nostack, preserves_flags)
                );
            }
        }
    };
}

/// The shared per-width XTS loop of the VAES paths; the module it expands in defines `V`,
/// `LANES` and the vector helpers (`ld`, `st`, `xor`, `bc`, `enc8`, `enclast`, `dec8`,
/// `declast`, `step`, `first`, `lane0`).
macro_rules! xts_core {
    ($feat:literal) => {
        /// Blocks per iteration: 8 vectors.
        const BLOCKS: usize = 8 * LANES;

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn encrypt(
            s: &Schedule,
            t0: __m128i,
            inp: *const u8,
            out: *mut u8,
            n: usize,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe {
                if s.rounds == 10 {
                    run::<10, false>(s, t0, inp, out, n)
                } else {
                    run::<14, false>(s, t0, inp, out, n)
                }
            }
        }

        #[target_feature(enable = $feat)]
        pub(super) unsafe fn decrypt(
            s: &Schedule,
            t0: __m128i,
            inp: *const u8,
            out: *mut u8,
            n: usize,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe {
                if s.rounds == 10 {
                    run::<10, true>(s, t0, inp, out, n)
                } else {
                    run::<14, true>(s, t0, inp, out, n)
                }
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn run<const R: usize, const DEC: bool>(
            s: &Schedule,
            t0: __m128i,
            inp: *const u8,
            out: *mut u8,
            n: usize,
        ) {
            // SAFETY: the caller guarantees the CPU features and `n` valid bytes at `inp`
            // and `out`; every access below is within 0..n.
            unsafe {
                let keys = if DEC { &s.dec } else { &s.enc };
                let mut rk = [bc(&keys[0]); 15];
                for r in 1..=R {
                    rk[r] = bc(&keys[r]);
                }
                // Tweak vector j holds the tweaks of blocks j*LANES .. j*LANES+LANES-1.
                let tw0 = first(t0);
                let mut tw = [tw0; 8];
                for j in 1..8 {
                    tw[j] = step(tw0, (LANES * j) as i64);
                }
                let mut off = 0usize;
                while off + 16 * BLOCKS <= n {
                    let mut x = [tw0; 8];
                    for j in 0..8 {
                        x[j] = xor(ld(inp.add(off + 16 * LANES * j)), xor(tw[j], rk[0]));
                    }
                    for r in 1..R {
                        if DEC {
                            dec8(&mut x, rk[r]);
                        } else {
                            enc8(&mut x, rk[r]);
                        }
                    }
                    for j in 0..8 {
                        // The last round's key XOR carries the output tweak XOR too.
                        let k = xor(tw[j], rk[R]);
                        x[j] = if DEC {
                            declast(x[j], k)
                        } else {
                            enclast(x[j], k)
                        };
                        st(out.add(off + 16 * LANES * j), x[j]);
                        tw[j] = step(tw[j], BLOCKS as i64);
                    }
                    off += 16 * BLOCKS;
                }
                if off < n {
                    // A unit that is not a multiple of the iteration (only units below
                    // 128/256/512 bytes, never a dm-crypt sector): one block at a time.
                    let mut t = lane0(tw[0]);
                    while off < n {
                        let b = _mm_xor_si128(_mm_loadu_si128(inp.add(off).cast()), t);
                        let b = if DEC {
                            super::decrypt_block::<R>(keys, b)
                        } else {
                            super::encrypt_block::<R>(keys, b)
                        };
                        _mm_storeu_si128(out.add(off).cast(), _mm_xor_si128(b, t));
                        t = super::mulx1(t);
                        off += 16;
                    }
                }
            }
        }
    };
}

/// The AES-NI path: one `asm!` loop over 8 blocks per iteration on xmm registers, after the
/// structure of OpenSSL's `aesni_xts_encrypt` (crypto/aes/asm/aesni-x86_64.pl, Apache-2.0):
/// the iteration's tweaks sit in memory (computed during the previous iteration), one round
/// key register is reloaded per round for all 8 blocks, the whitening key and the last round
/// key stay in registers, and the last round's key is `tweak ^ rk[R]` so the output tweak
/// XOR costs nothing extra.
///
/// Why the loop is one asm block: on 16 xmm registers, 8 blocks, 8 tweaks and the round keys
/// do not fit; with intrinsics LLVM spilled and reordered them and the path ran at 0.73x
/// (AES-128) / 0.82x (AES-256) of OpenSSL. Here the registers are fixed: xmm0-7 the blocks,
/// xmm8 the round key, xmm9 rk[0], xmm10 rk[R].
///
/// Unlike OpenSSL, the next tweaks are computed in general-purpose registers (`add/adc`
/// doubles the 128-bit tweak, `sbb/and 0x87/xor` reduces): the integer pipes are idle here,
/// while the vector pipes are shared with the AES units. With AVX the VEX encodings are used
/// (three operands, unaligned memory operands: fewer moves and loads).
#[cfg(target_arch = "x86_64")]
mod aesni {
    use super::*;

    /// Blocks per iteration.
    const BLOCKS: usize = 8;

    /// One iteration's tweaks, 16-byte aligned (legacy SSE memory operands need it).
    #[repr(C, align(16))]
    struct Tweaks([[u8; 16]; BLOCKS]);

    /// `t * x` in GF(2^128), XTS's little-endian convention.
    fn mulx(t: u128) -> u128 {
        (t << 1) ^ (0x87 * (t >> 127))
    }

    /// Whitening of block `$i` (offset `$o`): `in ^ tweak ^ rk[0]`.
    macro_rules! white {
        (sse, $i:literal, $o:literal) => {
            concat!(
                "movdqu xmm",
                $i,
                ", [{inp} + ",
                $o,
                "]\n",
                "pxor xmm",
                $i,
                ", [{cur} + ",
                $o,
                "]\n",
                "pxor xmm",
                $i,
                ", xmm9\n"
            )
        };
        (vex, $i:literal, $o:literal) => {
            concat!(
                "vpxor xmm",
                $i,
                ", xmm9, [{cur} + ",
                $o,
                "]\n",
                "vpxor xmm",
                $i,
                ", xmm",
                $i,
                ", [{inp} + ",
                $o,
                "]\n"
            )
        };
    }

    /// One middle round on all 8 blocks with the key at `[{k} + $o]`.
    macro_rules! round {
        (sse, $op:literal, $o:literal) => {
            concat!(
                "movdqa xmm8, [{k} + ",
                $o,
                "]\n",
                $op,
                " xmm0, xmm8\n",
                $op,
                " xmm1, xmm8\n",
                $op,
                " xmm2, xmm8\n",
                $op,
                " xmm3, xmm8\n",
                $op,
                " xmm4, xmm8\n",
                $op,
                " xmm5, xmm8\n",
                $op,
                " xmm6, xmm8\n",
                $op,
                " xmm7, xmm8\n"
            )
        };
        (vex, $op:literal, $o:literal) => {
            concat!(
                "vmovdqa xmm8, [{k} + ",
                $o,
                "]\n",
                "v",
                $op,
                " xmm0, xmm0, xmm8\n",
                "v",
                $op,
                " xmm1, xmm1, xmm8\n",
                "v",
                $op,
                " xmm2, xmm2, xmm8\n",
                "v",
                $op,
                " xmm3, xmm3, xmm8\n",
                "v",
                $op,
                " xmm4, xmm4, xmm8\n",
                "v",
                $op,
                " xmm5, xmm5, xmm8\n",
                "v",
                $op,
                " xmm6, xmm6, xmm8\n",
                "v",
                $op,
                " xmm7, xmm7, xmm8\n"
            )
        };
    }

    /// The last round of block `$i`, key `tweak ^ rk[R]`, and its store.
    macro_rules! last {
        (sse, $op:literal, $i:literal, $o:literal) => {
            concat!(
                "movdqa xmm8, [{cur} + ",
                $o,
                "]\n",
                "pxor xmm8, xmm10\n",
                $op,
                " xmm",
                $i,
                ", xmm8\n",
                "movdqu [{out} + ",
                $o,
                "], xmm",
                $i,
                "\n"
            )
        };
        (vex, $op:literal, $i:literal, $o:literal) => {
            concat!(
                "vpxor xmm8, xmm10, [{cur} + ",
                $o,
                "]\n",
                "v",
                $op,
                " xmm",
                $i,
                ", xmm",
                $i,
                ", xmm8\n",
                "vmovdqu [{out} + ",
                $o,
                "], xmm",
                $i,
                "\n"
            )
        };
    }

    /// The next tweak (`{lo}:{hi}` times x) stored at `[{nxt} + $o]`.
    macro_rules! tweak {
        ($o:literal, $o8:literal) => {
            concat!(
                "add {lo}, {lo}\n",
                "adc {hi}, {hi}\n",
                "sbb {t}, {t}\n",
                "and {t}, 0x87\n",
                "xor {lo}, {t}\n",
                "mov [{nxt} + ",
                $o,
                "], {lo}\n",
                "mov [{nxt} + ",
                $o8,
                "], {hi}\n"
            )
        };
    }

    /// One loop function: `$enc`/`$last` the AES instructions, `$mid` the offsets of the
    /// round keys 3..R-1, `$kl` the offset of rk[R].
    macro_rules! xts_loop {
        ($name:ident, $feat:literal, $f:ident, $enc:literal, $lastop:literal, $kl:literal,
         [$($mid:literal),*]) => {
            /// 8 blocks per iteration over `n` bytes (a nonzero multiple of 128); `cur`
            /// holds the first iteration's tweaks, `lo:hi` the last of them; returns the
            /// buffer holding the tweaks that follow the last block.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name(
                k: *const [u8; 16],
                mut inp: *const u8,
                mut out: *mut u8,
                mut n: usize,
                mut cur: *mut u8,
                mut nxt: *mut u8,
                mut lo: u64,
                mut hi: u64,
            ) -> *mut u8 {
                // SAFETY: the caller passes `n` bytes at `inp` and `out`, 128 bytes
                // 16-aligned at `cur` and `nxt`, an aligned schedule at `k`.
                unsafe {
                    std::arch::asm!(
                        concat!("movdqa xmm9, [{k}]\n", "movdqa xmm10, [{k} + ", $kl, "]\n"),
                        "2:",
                        white!($f, "0", "0"), white!($f, "1", "16"),
                        white!($f, "2", "32"), white!($f, "3", "48"),
                        white!($f, "4", "64"), white!($f, "5", "80"),
                        white!($f, "6", "96"), white!($f, "7", "112"),
                        round!($f, $enc, "16"),
                        tweak!("0", "8"), tweak!("16", "24"),
                        tweak!("32", "40"), tweak!("48", "56"),
                        round!($f, $enc, "32"),
                        tweak!("64", "72"), tweak!("80", "88"),
                        tweak!("96", "104"), tweak!("112", "120"),
                        $(round!($f, $enc, $mid),)*
                        last!($f, $lastop, "0", "0"), last!($f, $lastop, "1", "16"),
                        last!($f, $lastop, "2", "32"), last!($f, $lastop, "3", "48"),
                        last!($f, $lastop, "4", "64"), last!($f, $lastop, "5", "80"),
                        last!($f, $lastop, "6", "96"), last!($f, $lastop, "7", "112"),
                        "add {inp}, 128",
                        "add {out}, 128",
                        "mov {t}, {cur}",
                        "mov {cur}, {nxt}",
                        "mov {nxt}, {t}",
                        "sub {n}, 128",
                        "jnz 2b",
                        k = in(reg) k,
                        inp = inout(reg) inp,
                        out = inout(reg) out,
                        n = inout(reg) n,
                        cur = inout(reg) cur,
                        nxt = inout(reg) nxt,
                        lo = inout(reg) lo,
                        hi = inout(reg) hi,
                        t = out(reg) _,
                        out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                        out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                        out("xmm8") _, out("xmm9") _, out("xmm10") _,
                        options(nostack)
                    );
                }
                let _ = (inp, out, n, nxt, lo, hi);
                cur
            }
        };
    }

    // Round keys 3..=9 (AES-128) and 3..=13 (AES-256) at 16 bytes each.
    xts_loop!(
        enc10_sse,
        "aes,sse4.1",
        sse,
        "aesenc",
        "aesenclast",
        "160",
        ["48", "64", "80", "96", "112", "128", "144"]
    );
    xts_loop!(
        dec10_sse,
        "aes,sse4.1",
        sse,
        "aesdec",
        "aesdeclast",
        "160",
        ["48", "64", "80", "96", "112", "128", "144"]
    );
    xts_loop!(
        enc14_sse,
        "aes,sse4.1",
        sse,
        "aesenc",
        "aesenclast",
        "224",
        ["48", "64", "80", "96", "112", "128", "144", "160", "176", "192", "208"]
    );
    xts_loop!(
        dec14_sse,
        "aes,sse4.1",
        sse,
        "aesdec",
        "aesdeclast",
        "224",
        ["48", "64", "80", "96", "112", "128", "144", "160", "176", "192", "208"]
    );
    xts_loop!(
        enc10_vex,
        "aes,sse4.1,avx",
        vex,
        "aesenc",
        "aesenclast",
        "160",
        ["48", "64", "80", "96", "112", "128", "144"]
    );
    xts_loop!(
        dec10_vex,
        "aes,sse4.1,avx",
        vex,
        "aesdec",
        "aesdeclast",
        "160",
        ["48", "64", "80", "96", "112", "128", "144"]
    );
    xts_loop!(
        enc14_vex,
        "aes,sse4.1,avx",
        vex,
        "aesenc",
        "aesenclast",
        "224",
        ["48", "64", "80", "96", "112", "128", "144", "160", "176", "192", "208"]
    );
    xts_loop!(
        dec14_vex,
        "aes,sse4.1,avx",
        vex,
        "aesdec",
        "aesdeclast",
        "224",
        ["48", "64", "80", "96", "112", "128", "144", "160", "176", "192", "208"]
    );

    /// Encrypts `n` bytes (whole blocks); `vex` selects the AVX encodings.
    #[target_feature(enable = "aes,sse4.1")]
    pub(super) unsafe fn encrypt(
        s: &Schedule,
        t0: __m128i,
        inp: *const u8,
        out: *mut u8,
        n: usize,
        vex: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { run(s, t0, inp, out, n, vex, false) }
    }

    /// Decrypts `n` bytes (whole blocks).
    #[target_feature(enable = "aes,sse4.1")]
    pub(super) unsafe fn decrypt(
        s: &Schedule,
        t0: __m128i,
        inp: *const u8,
        out: *mut u8,
        n: usize,
        vex: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { run(s, t0, inp, out, n, vex, true) }
    }

    #[target_feature(enable = "aes,sse4.1")]
    unsafe fn run(
        s: &Schedule,
        t0: __m128i,
        inp: *const u8,
        out: *mut u8,
        n: usize,
        vex: bool,
        dec: bool,
    ) {
        // SAFETY: the caller guarantees AES-NI (and AVX when `vex`) and `n` valid bytes at
        // `inp` and `out`; every access below is within 0..n or the two tweak buffers.
        unsafe {
            let mut t0b = [0u8; 16];
            _mm_storeu_si128(t0b.as_mut_ptr().cast(), t0);
            let mut t = u128::from_le_bytes(t0b);
            let mut a = Tweaks([[0; 16]; BLOCKS]);
            let mut b = Tweaks([[0; 16]; BLOCKS]);
            for (j, slot) in a.0.iter_mut().enumerate() {
                if j > 0 {
                    t = mulx(t);
                }
                *slot = t.to_le_bytes();
            }
            let keys = if dec { &s.dec } else { &s.enc };
            let whole = n & !(16 * BLOCKS - 1);
            let mut cur: *mut u8 = a.0.as_mut_ptr().cast();
            if whole > 0 {
                let nxt: *mut u8 = b.0.as_mut_ptr().cast();
                let (lo, hi) = (t as u64, (t >> 64) as u64);
                let k = keys.as_ptr();
                cur = match (vex, dec, s.rounds == 10) {
                    (false, false, true) => enc10_sse(k, inp, out, whole, cur, nxt, lo, hi),
                    (false, true, true) => dec10_sse(k, inp, out, whole, cur, nxt, lo, hi),
                    (false, false, false) => enc14_sse(k, inp, out, whole, cur, nxt, lo, hi),
                    (false, true, false) => dec14_sse(k, inp, out, whole, cur, nxt, lo, hi),
                    (true, false, true) => enc10_vex(k, inp, out, whole, cur, nxt, lo, hi),
                    (true, true, true) => dec10_vex(k, inp, out, whole, cur, nxt, lo, hi),
                    (true, false, false) => enc14_vex(k, inp, out, whole, cur, nxt, lo, hi),
                    (true, true, false) => dec14_vex(k, inp, out, whole, cur, nxt, lo, hi),
                };
            }
            // Fewer than 8 blocks left (only in units that are not a multiple of 128
            // bytes, never a dm-crypt sector): one at a time with the buffered tweaks.
            let mut off = whole;
            let mut j = 0;
            while off < n {
                let tw = _mm_loadu_si128(cur.add(16 * j).cast());
                let x = _mm_xor_si128(_mm_loadu_si128(inp.add(off).cast()), tw);
                let x = match (dec, s.rounds == 10) {
                    (false, true) => super::encrypt_block::<10>(keys, x),
                    (false, false) => super::encrypt_block::<14>(keys, x),
                    (true, true) => super::decrypt_block::<10>(keys, x),
                    (true, false) => super::decrypt_block::<14>(keys, x),
                };
                _mm_storeu_si128(out.add(off).cast(), _mm_xor_si128(x, tw));
                off += 16;
                j += 1;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    type V = __m256i;
    const LANES: usize = 2;

    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    unsafe fn ld(p: *const u8) -> V {
        // SAFETY: the caller passes 32 valid bytes.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    unsafe fn st(p: *mut u8, v: V) {
        // SAFETY: the caller passes 32 valid bytes.
        unsafe { _mm256_storeu_si256(p.cast(), v) }
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn xor(a: V, b: V) -> V {
        _mm256_xor_si256(a, b)
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn bc(k: &[u8; 16]) -> V {
        // SAFETY: 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(k.as_ptr().cast())) }
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn enclast(a: V, k: V) -> V {
        _mm256_aesenclast_epi128(a, k)
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn declast(a: V, k: V) -> V {
        _mm256_aesdeclast_epi128(a, k)
    }
    /// `v * x^s` in each lane.
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn step(v: V, s: i64) -> V {
        let l = _mm_cvtsi64_si128(s);
        let r = _mm_cvtsi64_si128(64 - s);
        let poly = _mm256_set1_epi64x(0x87);
        mulx_body!(
            v,
            |v| _mm256_sll_epi64(v, l),
            |v| _mm256_srl_epi64(v, r),
            |b| _mm256_bslli_epi128::<8>(b),
            |b| _mm256_clmulepi64_epi128::<0x01>(b, poly),
            |a, c, d| _mm256_xor_si256(_mm256_xor_si256(a, c), d)
        )
    }
    /// Lanes `t, t*x`.
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn first(t: __m128i) -> V {
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(t), super::mulx1(t))
    }
    #[target_feature(enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq")]
    #[inline]
    fn lane0(v: V) -> __m128i {
        _mm256_castsi256_si128(v)
    }

    asm8!(
        "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq",
        V,
        ymm_reg,
        "vaes"
    );
    xts_core!("aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    type V = __m512i;
    const LANES: usize = 4;

    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    unsafe fn ld(p: *const u8) -> V {
        // SAFETY: the caller passes 64 valid bytes.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    unsafe fn st(p: *mut u8, v: V) {
        // SAFETY: the caller passes 64 valid bytes.
        unsafe { _mm512_storeu_si512(p.cast(), v) }
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn xor(a: V, b: V) -> V {
        _mm512_xor_si512(a, b)
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn bc(k: &[u8; 16]) -> V {
        // SAFETY: 16 bytes.
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(k.as_ptr().cast())) }
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn enclast(a: V, k: V) -> V {
        _mm512_aesenclast_epi128(a, k)
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn declast(a: V, k: V) -> V {
        _mm512_aesdeclast_epi128(a, k)
    }
    /// `v * x^s` in each lane.
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn step(v: V, s: i64) -> V {
        let l = _mm_cvtsi64_si128(s);
        let r = _mm_cvtsi64_si128(64 - s);
        let poly = _mm512_set1_epi64(0x87);
        mulx_body!(
            v,
            |v| _mm512_sll_epi64(v, l),
            |v| _mm512_srl_epi64(v, r),
            |b| _mm512_bslli_epi128::<8>(b),
            |b| _mm512_clmulepi64_epi128::<0x01>(b, poly),
            |a, c, d| _mm512_ternarylogic_epi64::<0x96>(a, c, d)
        )
    }
    /// Lanes `t, t*x, t*x^2, t*x^3`.
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn first(t: __m128i) -> V {
        let t1 = super::mulx1(t);
        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(t), t1);
        let lo2 = avx2_step2(lo);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), lo2)
    }
    /// `v * x^2` on two lanes (the upper half of [`first`]).
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn avx2_step2(v: __m256i) -> __m256i {
        let poly = _mm256_set1_epi64x(0x87);
        mulx_body!(
            v,
            |v| _mm256_slli_epi64::<2>(v),
            |v| _mm256_srli_epi64::<62>(v),
            |b| _mm256_bslli_epi128::<8>(b),
            |b| _mm256_clmulepi64_epi128::<0x01>(b, poly),
            |a, c, d| _mm256_xor_si256(_mm256_xor_si256(a, c), d)
        )
    }
    #[target_feature(
        enable = "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl"
    )]
    #[inline]
    fn lane0(v: V) -> __m128i {
        _mm512_castsi512_si128(v)
    }

    asm8!(
        "aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl",
        V,
        zmm_reg,
        "vaes"
    );
    xts_core!("aes,sse4.1,pclmulqdq,avx2,vaes,vpclmulqdq,avx512f,avx512bw,avx512vl");
}

/// `v * x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1,pclmulqdq")]
#[inline]
fn mulx1(v: __m128i) -> __m128i {
    let poly = _mm_set1_epi64x(0x87);
    mulx_body!(
        v,
        |v| _mm_slli_epi64::<1>(v),
        |v| _mm_srli_epi64::<63>(v),
        |b| _mm_slli_si128::<8>(b),
        |b| _mm_clmulepi64_si128::<0x01>(b, poly),
        |a, c, d| _mm_xor_si128(_mm_xor_si128(a, c), d)
    )
}

/// A 16-byte tweak as a vector.
#[cfg(target_arch = "x86_64")]
fn tweak_block(t: [u8; 16]) -> __m128i {
    // SAFETY: SSE2 is baseline on x86-64; 16 bytes.
    unsafe { _mm_loadu_si128(t.as_ptr().cast()) }
}

/// `N` independent blocks under an encryption schedule of `R` rounds, in place; the rounds
/// of all blocks are interleaved, so `N` blocks cost about what one block's latency does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1")]
fn encrypt_blocks<const R: usize, const N: usize>(rk: &[[u8; 16]; 15], b: &mut [__m128i; N]) {
    let k = |r: usize| {
        // SAFETY: 16 bytes.
        unsafe { _mm_loadu_si128(rk[r].as_ptr().cast()) }
    };
    let k0 = k(0);
    for v in b.iter_mut() {
        *v = _mm_xor_si128(*v, k0);
    }
    for r in 1..R {
        let kr = k(r);
        for v in b.iter_mut() {
            *v = _mm_aesenc_si128(*v, kr);
        }
    }
    let kl = k(R);
    for v in b.iter_mut() {
        *v = _mm_aesenclast_si128(*v, kl);
    }
}

/// One block under an encryption schedule of `R` rounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1")]
#[inline]
fn encrypt_block<const R: usize>(rk: &[[u8; 16]; 15], b: __m128i) -> __m128i {
    let k = |r: usize| {
        // SAFETY: 16 bytes.
        unsafe { _mm_loadu_si128(rk[r].as_ptr().cast()) }
    };
    let mut b = _mm_xor_si128(b, k(0));
    for r in 1..R {
        b = _mm_aesenc_si128(b, k(r));
    }
    _mm_aesenclast_si128(b, k(R))
}

/// One block under an equivalent-inverse decryption schedule of `R` rounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1")]
#[inline]
fn decrypt_block<const R: usize>(rk: &[[u8; 16]; 15], b: __m128i) -> __m128i {
    let k = |r: usize| {
        // SAFETY: 16 bytes.
        unsafe { _mm_loadu_si128(rk[r].as_ptr().cast()) }
    };
    let mut b = _mm_xor_si128(b, k(0));
    for r in 1..R {
        b = _mm_aesdec_si128(b, k(r));
    }
    _mm_aesdeclast_si128(b, k(R))
}

/// AES key expansion (FIPS-197 5.2) with AESKEYGENASSIST, for a 16- or 32-byte key; returns
/// the number of rounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1")]
fn expand(key: &[u8], rk: &mut [[u8; 16]; 15]) -> usize {
    // w ^= w << 32 ^ w << 64 ^ w << 96: the running XOR of the previous round key's words.
    fn spread(mut t: __m128i) -> __m128i {
        // SAFETY: SSE2 is baseline on x86-64.
        unsafe {
            t = _mm_xor_si128(t, _mm_slli_si128::<4>(t));
            t = _mm_xor_si128(t, _mm_slli_si128::<4>(t));
            _mm_xor_si128(t, _mm_slli_si128::<4>(t))
        }
    }
    let put = |rk: &mut [[u8; 16]; 15], i: usize, v: __m128i| {
        // SAFETY: 16 bytes.
        unsafe { _mm_storeu_si128(rk[i].as_mut_ptr().cast(), v) }
    };
    // SAFETY: 16 bytes each.
    let lo = unsafe { _mm_loadu_si128(key.as_ptr().cast()) };
    put(rk, 0, lo);
    macro_rules! r128 {
        ($prev:ident, $i:expr, $rcon:expr) => {{
            let a = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<$rcon>($prev));
            let v = _mm_xor_si128(spread($prev), a);
            put(rk, $i, v);
            v
        }};
    }
    if key.len() == 16 {
        let k = r128!(lo, 1, 0x01);
        let k = r128!(k, 2, 0x02);
        let k = r128!(k, 3, 0x04);
        let k = r128!(k, 4, 0x08);
        let k = r128!(k, 5, 0x10);
        let k = r128!(k, 6, 0x20);
        let k = r128!(k, 7, 0x40);
        let k = r128!(k, 8, 0x80);
        let k = r128!(k, 9, 0x1b);
        r128!(k, 10, 0x36);
        return 10;
    }
    // SAFETY: a 32-byte key.
    let hi = unsafe { _mm_loadu_si128(key.as_ptr().add(16).cast()) };
    put(rk, 1, hi);
    // Even round keys: RotWord/SubWord/Rcon of the previous key's last word; odd ones:
    // SubWord only.
    macro_rules! r256 {
        ($a:ident, $b:ident, $i:expr, $rcon:expr) => {{
            let t = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<$rcon>($b));
            let even = _mm_xor_si128(spread($a), t);
            put(rk, $i, even);
            even
        }};
    }
    macro_rules! r256odd {
        ($a:ident, $b:ident, $i:expr) => {{
            let t = _mm_shuffle_epi32::<0xaa>(_mm_aeskeygenassist_si128::<0>($b));
            let odd = _mm_xor_si128(spread($a), t);
            put(rk, $i, odd);
            odd
        }};
    }
    let (a, b) = (lo, hi);
    let a = r256!(a, b, 2, 0x01);
    let b = r256odd!(b, a, 3);
    let a = r256!(a, b, 4, 0x02);
    let b = r256odd!(b, a, 5);
    let a = r256!(a, b, 6, 0x04);
    let b = r256odd!(b, a, 7);
    let a = r256!(a, b, 8, 0x08);
    let b = r256odd!(b, a, 9);
    let a = r256!(a, b, 10, 0x10);
    let b = r256odd!(b, a, 11);
    let a = r256!(a, b, 12, 0x20);
    let b = r256odd!(b, a, 13);
    r256!(a, b, 14, 0x40);
    14
}

/// The equivalent inverse cipher's schedule (FIPS-197 5.3.5): the encryption keys reversed,
/// InvMixColumns applied to the inner ones.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,sse4.1")]
fn invert(enc: &[[u8; 16]; 15], dec: &mut [[u8; 16]; 15], rounds: usize) {
    for i in 0..=rounds {
        // SAFETY: 16 bytes each.
        unsafe {
            let k = _mm_loadu_si128(enc[rounds - i].as_ptr().cast());
            let k = if i == 0 || i == rounds {
                k
            } else {
                _mm_aesimc_si128(k)
            };
            _mm_storeu_si128(dec[i].as_mut_ptr().cast(), k);
        }
    }
}

/// The registry's engine over one path.
pub(crate) struct XtsX86Engine(pub(crate) XtsAes);

impl crate::dmcipher::ModeEngine for XtsX86Engine {
    fn crypt(
        &self,
        dir: crate::dmcipher::Direction,
        sectors: crate::dmcipher::Sectors<'_>,
        unit: usize,
        ivs: &crate::dmcipher::IvRun<'_>,
    ) -> Result<(), CipherError> {
        let decrypt = dir == crate::dmcipher::Direction::Decrypt;
        #[cfg(target_arch = "x86_64")]
        {
            // Whole-block sectors (dm-crypt's always are): the tweaks of 8 sectors at a time
            // are encrypted together (see `encrypt_tweaks`), then each sector runs.
            let (src, dst) = sectors.parts();
            let x = &self.0;
            if unit == 0 || !unit.is_multiple_of(16) || src.is_some_and(|s| s.len() != dst.len()) {
                // Refused by `unit` with its error.
                return x.unit(decrypt, &[0; 16], src, dst);
            }
            let count = dst.len() / unit;
            let mut iv = [0u8; crate::iv::IV_LEN];
            let mut first = 0;
            for chunk in dst.chunks_mut(8 * unit) {
                let k = chunk.len() / unit;
                let mut t = [tweak_block([0; 16]); 8];
                for (j, tj) in t[..k].iter_mut().enumerate() {
                    ivs.fill(first + j, &mut iv);
                    *tj = tweak_block(iv[..16].try_into().expect("16-byte IV"));
                }
                x.encrypt_tweaks(&mut t[..k]);
                for (j, out) in chunk.chunks_exact_mut(unit).enumerate() {
                    let i = first + j;
                    let input = src.map(|s| &s[i * unit..(i + 1) * unit]);
                    // SAFETY: whole blocks, `input` as long as `out` (checked above).
                    unsafe { x.unit_encrypted_tweak(decrypt, t[j], input, out) };
                }
                first += k;
            }
            debug_assert_eq!(first, count);
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        sectors.each(unit, ivs, |iv, input, out| {
            self.0.unit(decrypt, iv, input, out)
        })
    }
}

/// Whether a path runs `spec` with a `key_len`-byte key: `aes-xts-*` with 32- or 64-byte
/// keys.
pub(crate) fn supports(spec: &crate::CipherSpec, key_len: usize) -> bool {
    spec.cipher() == crate::BlockCipherName::Aes
        && spec.chain_mode() == crate::ChainMode::Xts
        && matches!(key_len, 32 | 64)
}

/// Builds the engine for `path`.
pub(crate) fn engine(
    path: XtsPath,
    spec: &crate::CipherSpec,
    key: &[u8],
) -> Result<Box<dyn crate::dmcipher::ModeEngine>, CipherError> {
    if !supports(spec, key.len()) {
        return Err(CipherError::NoImplementation(format!(
            "{} for {spec}",
            path.name()
        )));
    }
    Ok(Box::new(XtsX86Engine(XtsAes::new(path, key)?)))
}
