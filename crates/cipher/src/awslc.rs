//! The AWS-LC implementation: AES-256-XTS through EVP (AVX-512/VAES code paths where the CPU
//! has them) and AES-CBC through `AES_cbc_encrypt` (AES-NI).
//!
//! AWS-LC offers XTS only with 256-bit AES keys (a 64-byte volume key) and refuses XTS keys
//! whose halves are equal; both cases fall back to another implementation.
//!
//! Key schedules are computed once per context: XTS keeps lock-free slots of keyed EVP
//! contexts (one per concurrently active thread) and only resets the IV per sector; CBC's
//! `AES_KEY` schedules are read-only and shared by all threads.

use crate::dmcipher::{Direction, IvRun, ModeEngine, Sectors};
use crate::locked::LockedBox;
use crate::spec::{BlockCipherName, ChainMode, CipherSpec};
use crate::CipherError;
use aws_lc_sys as sys;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// True when `spec` with a `key_len`-byte key is something this implementation runs.
pub(crate) fn supports(spec: &CipherSpec, key_len: usize) -> bool {
    spec.cipher() == BlockCipherName::Aes
        && match spec.chain_mode() {
            ChainMode::Xts => key_len == 64,
            ChainMode::Cbc => matches!(key_len, 16 | 24 | 32),
            _ => false,
        }
}

pub(crate) fn engine(spec: &CipherSpec, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    if !supports(spec, key.len()) {
        return Err(CipherError::NoImplementation(format!("aws-lc for {spec}")));
    }
    // The contexts below hold key schedules: they must come from locked memory.
    crate::lock_backend_memory();
    match spec.chain_mode() {
        ChainMode::Xts => Ok(Box::new(XtsEngine::new(key)?)),
        _ => Ok(Box::new(CbcEngine::new(key)?)),
    }
}

fn backend_error(what: &str) -> CipherError {
    // SAFETY: ERR_get_error only reads this thread's error queue.
    let code = unsafe { sys::ERR_get_error() };
    CipherError::Backend(format!("aws-lc {what} failed (error {code:#x})"))
}

/// Marks a slot whose context is in use (never a real pointer: `EVP_CIPHER_CTX_new` returns
/// heap memory, never the dangling address of an 8-aligned type).
fn busy() -> *mut sys::EVP_CIPHER_CTX {
    std::ptr::NonNull::dangling().as_ptr()
}

/// This thread's preferred slot: threads get consecutive numbers, so up to `slots` threads
/// each find their own slot free and never touch another thread's.
fn slot_hint() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HINT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    HINT.with(|h| *h)
}

/// Keyed contexts for one direction, one per concurrently active thread, handed out
/// without a lock: a slot holds null (not created yet), a keyed context (idle) or the busy
/// mark. Taking is one atomic swap on the thread's own slot, returning one store.
///
/// Why not thread-locals: a context holds the key schedule, and `key wipe` (dropping the
/// engine) must free every copy at once, including those of idle threads; the slots belong
/// to the engine and are freed with it.
struct CtxSlots {
    /// `EVP_aes_256_xts`, or `EVP_aes_256_ecb` for the batched path.
    cipher: *const sys::EVP_CIPHER,
    encrypt: bool,
    key: crate::SecretBytes,
    slots: Box<[AtomicPtr<sys::EVP_CIPHER_CTX>]>,
}

// SAFETY: each context is used by one thread at a time (the slot's swap to busy hands it
// over exclusively), and AWS-LC contexts carry no thread affinity.
unsafe impl Send for CtxSlots {}
// SAFETY: as above; the key bytes are only read.
unsafe impl Sync for CtxSlots {}

/// A context taken from [`CtxSlots`], put back (or freed) on drop.
struct Lease<'a> {
    ctx: *mut sys::EVP_CIPHER_CTX,
    /// The slot it came from; `None` for a context made for this call only.
    slot: Option<&'a AtomicPtr<sys::EVP_CIPHER_CTX>>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        match self.slot {
            Some(slot) => slot.store(self.ctx, Ordering::Release),
            // SAFETY: made for this call, freed once; freeing cleanses the key schedule.
            None => unsafe { sys::EVP_CIPHER_CTX_free(self.ctx) },
        }
    }
}

impl CtxSlots {
    fn new(cipher: *const sys::EVP_CIPHER, key: &[u8], encrypt: bool) -> Result<Self, CipherError> {
        // Twice the CPUs: a few more threads than cores (NBD workers, split helpers) still
        // find a slot; contexts are created only when a slot is first used.
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .saturating_mul(2)
            .clamp(4, 64)
            .next_power_of_two();
        let pool = Self {
            cipher,
            encrypt,
            key: crate::SecretBytes::from_slice(key),
            slots: (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
        };
        // Key one context now so a bad key fails at open time, not on first I/O.
        let first = pool.create()?;
        pool.slots[0].store(first, Ordering::Release);
        Ok(pool)
    }

    fn create(&self) -> Result<*mut sys::EVP_CIPHER_CTX, CipherError> {
        // SAFETY: plain constructor; null is checked.
        let ctx = unsafe { sys::EVP_CIPHER_CTX_new() };
        if ctx.is_null() {
            return Err(backend_error("EVP_CIPHER_CTX_new"));
        }
        // SAFETY: ctx is valid, the cipher is static, the key has the cipher's key length
        // (64 bytes for AES-256-XTS, 32 for AES-256-ECB); ECB runs whole blocks unpadded.
        let ok = unsafe {
            sys::EVP_CipherInit_ex(
                ctx,
                self.cipher,
                ptr::null_mut(),
                self.key.as_bytes().as_ptr(),
                ptr::null(),
                i32::from(self.encrypt),
            ) == 1
                && sys::EVP_CIPHER_CTX_set_padding(ctx, 0) == 1
        };
        if !ok {
            // SAFETY: created above, freed once.
            unsafe { sys::EVP_CIPHER_CTX_free(ctx) };
            return Err(backend_error("AES-256-XTS key setup"));
        }
        Ok(ctx)
    }

    fn take(&self) -> Result<Lease<'_>, CipherError> {
        let n = self.slots.len();
        let start = slot_hint();
        for k in 0..n {
            let slot = &self.slots[(start + k) & (n - 1)];
            // A plain load first: skipping a busy slot costs no write to its cache line.
            if slot.load(Ordering::Relaxed) == busy() {
                continue;
            }
            let got = slot.swap(busy(), Ordering::Acquire);
            if got == busy() {
                continue;
            }
            let ctx = if got.is_null() {
                match self.create() {
                    Ok(c) => c,
                    Err(e) => {
                        slot.store(ptr::null_mut(), Ordering::Release);
                        return Err(e);
                    }
                }
            } else {
                got
            };
            return Ok(Lease {
                ctx,
                slot: Some(slot),
            });
        }
        // More threads at once than slots: a context for this call alone.
        Ok(Lease {
            ctx: self.create()?,
            slot: None,
        })
    }
}

impl Drop for CtxSlots {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut() {
            let p = *slot.get_mut();
            if !p.is_null() && p != busy() {
                // SAFETY: an idle context owned by this pool, freed once; freeing also
                // cleanses the key schedule.
                unsafe { sys::EVP_CIPHER_CTX_free(p) };
            }
        }
    }
}

struct XtsEngine {
    enc: CtxSlots,
    dec: CtxSlots,
    /// Sectors smaller than this go through [`Batched`]; 0 = never.
    batch_below: usize,
    batched: Batched,
}

impl XtsEngine {
    fn new(key: &[u8]) -> Result<Self, CipherError> {
        // SAFETY: static cipher descriptions.
        let (xts, ecb) = unsafe { (sys::EVP_aes_256_xts(), sys::EVP_aes_256_ecb()) };
        // The XTS contexts are keyed first: AWS-LC refuses equal key halves there, and the
        // batched path must refuse exactly the keys the per-sector path refuses.
        let enc = CtxSlots::new(xts, key, true)?;
        let dec = CtxSlots::new(xts, key, false)?;
        let (k1, k2) = key.split_at(32);
        Ok(Self {
            enc,
            dec,
            batch_below: std::env::var("CRYPTBLK_XTS_BATCH_BELOW")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(BATCH_BELOW),
            batched: Batched {
                data_enc: CtxSlots::new(ecb, k1, true)?,
                data_dec: CtxSlots::new(ecb, k1, false)?,
                tweak: CtxSlots::new(ecb, k2, true)?,
            },
        })
    }
}

/// Default sector size below which the batched path is used: 0, off. Measured with
/// `benches/xts_cost.rs` in crates/dm (callgrind, test profile): 31,000 instructions per
/// 4 KiB request at 512-byte sectors against 12,800 per sector through AWS-LC's XTS and
/// 8,600 for the raw bulk call, so it stays off until a release-build measurement shows it
/// ahead (`CRYPTBLK_XTS_BATCH_BELOW=4096` turns it on for such A/B runs).
const BATCH_BELOW: usize = 0;

/// XTS for small sectors, several sectors per AWS-LC call: the tweaks of all sectors of a
/// batch are encrypted in one multi-block ECB call (pipelined, instead of one serial AES
/// per sector inside each XTS call), and the data of the batch in another, with the tweak
/// XORs around it done here. AWS-LC has no multi-data-unit XTS call; this is XTS as IEEE
/// 1619 defines it (C = E_K1(P ^ T) ^ T, T_{j+1} = T_j * alpha), checked against AWS-LC's
/// own XTS and pyca in the tests.
struct Batched {
    data_enc: CtxSlots,
    data_dec: CtxSlots,
    tweak: CtxSlots,
}

/// Bytes per batch: the tweak buffer lives on the stack.
const BATCH: usize = 4096;

/// `t * alpha` in GF(2^128) with XTS's little-endian convention.
#[inline(always)]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

/// XORs the tweaks into 16-byte blocks: `dst = src ^ tw`.
#[inline(always)]
fn xor_tweaks(dst: &mut [u8], src: &[u8], tw: &[u128]) {
    for ((d, s), t) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)).zip(tw) {
        let v = u128::from_le_bytes(s.try_into().unwrap_or_default()) ^ t;
        d.copy_from_slice(&v.to_le_bytes());
    }
}

/// One AWS-LC ECB call over whole blocks, in place or `src` to `dst`.
fn ecb(
    ctx: *mut sys::EVP_CIPHER_CTX,
    dst: *mut u8,
    src: *const u8,
    len: usize,
) -> Result<(), CipherError> {
    let n = i32::try_from(len).map_err(|_| CipherError::SectorSize(len))?;
    let mut out_len = 0i32;
    // SAFETY: ctx is a keyed ECB context leased exclusively; src and dst are `len` valid
    // bytes, equal or disjoint; len is a multiple of 16 with padding off.
    let ok = unsafe { sys::EVP_CipherUpdate(ctx, dst, &mut out_len, src, n) == 1 };
    if ok && out_len == n {
        Ok(())
    } else {
        Err(backend_error("AES-256-ECB"))
    }
}

impl Batched {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        let data = match dir {
            Direction::Encrypt => self.data_enc.take()?,
            Direction::Decrypt => self.data_dec.take()?,
        };
        let tweak = self.tweak.take()?;
        let mut tw = [0u128; BATCH / 16];
        let mut ivbuf = [0u8; 16 * (BATCH / 512)];
        let result = Self::batches(&data, &tweak, sectors, unit, ivs, &mut tw, &mut ivbuf);
        // The tweaks are derived from the key: do not leave them on the stack.
        zeroize::Zeroize::zeroize(&mut tw[..]);
        zeroize::Zeroize::zeroize(&mut ivbuf[..]);
        result
    }

    fn batches(
        data: &Lease<'_>,
        tweak: &Lease<'_>,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
        tw: &mut [u128; BATCH / 16],
        ivbuf: &mut [u8; 16 * (BATCH / 512)],
    ) -> Result<(), CipherError> {
        let per_batch = BATCH / unit;
        let blocks_per_unit = unit / 16;
        let (src, dst) = sectors.parts();
        for (b, out) in dst.chunks_mut(BATCH).enumerate() {
            let n = out.len() / unit;
            let first = b * per_batch;
            // The batch's IVs, encrypted under K2 in one call: each sector's first tweak.
            for i in 0..n {
                let mut iv = [0u8; 16];
                ivs.fill(first + i, &mut iv);
                ivbuf[16 * i..16 * (i + 1)].copy_from_slice(&iv);
            }
            let p = ivbuf.as_mut_ptr();
            ecb(tweak.ctx, p, p, 16 * n)?;
            for i in 0..n {
                let mut t =
                    u128::from_le_bytes(ivbuf[16 * i..16 * (i + 1)].try_into().unwrap_or_default());
                for slot in &mut tw[i * blocks_per_unit..(i + 1) * blocks_per_unit] {
                    *slot = t;
                    t = mul_alpha(t);
                }
            }
            let tw = &tw[..out.len() / 16];
            match src {
                Some(src) => {
                    let input = &src[b * BATCH..b * BATCH + out.len()];
                    xor_tweaks(out, input, tw);
                }
                None => {
                    for (d, t) in out.chunks_exact_mut(16).zip(tw) {
                        let v = u128::from_le_bytes((&*d).try_into().unwrap_or_default()) ^ t;
                        d.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            let o = out.as_mut_ptr();
            ecb(data.ctx, o, o, out.len())?;
            for (d, t) in out.chunks_exact_mut(16).zip(tw) {
                let v = u128::from_le_bytes((&*d).try_into().unwrap_or_default()) ^ t;
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        Ok(())
    }
}

impl ModeEngine for XtsEngine {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        if unit < self.batch_below && BATCH.is_multiple_of(unit) {
            return self.batched.crypt(dir, sectors, unit, ivs);
        }
        let pool = match dir {
            Direction::Encrypt => &self.enc,
            Direction::Decrypt => &self.dec,
        };
        let lease = pool.take()?;
        let ctx = lease.ctx;
        let len = i32::try_from(unit).map_err(|_| CipherError::SectorSize(unit))?;
        sectors.each(unit, ivs, |iv, input, out| {
            let mut out_len = 0i32;
            let o = out.as_mut_ptr();
            let i = input.map_or(o as *const u8, |s| s.as_ptr());
            // SAFETY: ctx is keyed and exclusively ours while leased; passing only the IV
            // (no cipher, no key, enc = -1) starts a new data unit without a new key
            // schedule. Input and output are either the same sector (in place, which EVP
            // allows) or two distinct buffers of `len` bytes.
            let ok = unsafe {
                sys::EVP_CipherInit_ex(
                    ctx,
                    ptr::null(),
                    ptr::null_mut(),
                    ptr::null(),
                    iv.as_ptr(),
                    -1,
                ) == 1
                    && sys::EVP_CipherUpdate(ctx, o, &mut out_len, i, len) == 1
            };
            if ok && out_len == len {
                Ok(())
            } else {
                Err(backend_error("AES-256-XTS sector"))
            }
        })
    }
}

/// An AES key schedule in locked memory, wiped on drop.
struct AesKey(LockedBox<sys::AES_KEY>);

impl AesKey {
    fn new(key: &[u8], encrypt: bool) -> Result<Self, CipherError> {
        // Expanded in place: no copy of the schedule outside locked memory.
        let mut k = LockedBox::new(sys::AES_KEY {
            rd_key: [0; 60],
            rounds: 0,
        });
        let bits = (key.len() * 8) as u32;
        // SAFETY: key holds bits/8 bytes; k is a valid AES_KEY to write.
        let rc = unsafe {
            if encrypt {
                sys::AES_set_encrypt_key(key.as_ptr(), bits, &mut *k)
            } else {
                sys::AES_set_decrypt_key(key.as_ptr(), bits, &mut *k)
            }
        };
        if rc != 0 {
            return Err(backend_error("AES key setup"));
        }
        Ok(Self(k))
    }
}

struct CbcEngine {
    enc: AesKey,
    dec: AesKey,
}

// SAFETY: the schedules are only read after construction.
unsafe impl Sync for CbcEngine {}
// SAFETY: plain owned data.
unsafe impl Send for CbcEngine {}

impl CbcEngine {
    fn new(key: &[u8]) -> Result<Self, CipherError> {
        Ok(Self {
            enc: AesKey::new(key, true)?,
            dec: AesKey::new(key, false)?,
        })
    }
}

impl ModeEngine for CbcEngine {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        let (key, enc) = match dir {
            Direction::Encrypt => (&*self.enc.0, 1),
            Direction::Decrypt => (&*self.dec.0, 0),
        };
        sectors.each(unit, ivs, |iv, input, out| {
            let o = out.as_mut_ptr();
            let i = input.map_or(o as *const u8, |s| s.as_ptr());
            // SAFETY: CBC over whole blocks (sector sizes are multiples of 16), in place or
            // between two distinct sector-sized buffers; the schedule is read-only and iv is
            // a private 16-byte buffer the call updates.
            unsafe { sys::AES_cbc_encrypt(i, o, out.len(), key, iv.as_mut_ptr(), enc) };
            Ok(())
        })
    }
}

/// The yardstick the engine's XTS path is held to (issue 15): one AWS-LC AES-256-XTS
/// context keyed once, then per call a new IV and one `EVP_CipherUpdate` over the whole
/// buffer as a single data unit, as `openssl speed -evp aes-256-xts` runs it. No sectors,
/// no IV generator, no context slots: the raw bulk cipher alone. Used by benchmarks only.
pub struct RawBulkXts {
    ctx: *mut sys::EVP_CIPHER_CTX,
}

impl RawBulkXts {
    /// Keys a context with a 64-byte AES-256-XTS key, for encryption or decryption.
    pub fn new(key: &[u8], encrypt: bool) -> Result<Self, CipherError> {
        if key.len() != 64 {
            return Err(CipherError::Unsupported(format!(
                "raw AES-256-XTS takes a 64-byte key, not {}",
                key.len()
            )));
        }
        crate::lock_backend_memory();
        // SAFETY: a static cipher description.
        let cipher = unsafe { sys::EVP_aes_256_xts() };
        let pool = CtxSlots {
            cipher,
            encrypt,
            key: crate::SecretBytes::from_slice(key),
            slots: Box::new([]),
        };
        Ok(Self {
            ctx: pool.create()?,
        })
    }

    /// Transforms `buf` in place as one XTS data unit whose tweak is `tweak`
    /// little-endian (plain64), with at most one AWS-LC call besides the IV reset.
    #[inline]
    pub fn crypt(&mut self, tweak: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        let mut iv = [0u8; 16];
        iv[..8].copy_from_slice(&tweak.to_le_bytes());
        let len = i32::try_from(buf.len()).map_err(|_| CipherError::SectorSize(buf.len()))?;
        let mut out_len = 0i32;
        let p = buf.as_mut_ptr();
        // SAFETY: ctx is keyed and owned; only the IV changes; in place over `len` bytes.
        let ok = unsafe {
            sys::EVP_CipherInit_ex(
                self.ctx,
                ptr::null(),
                ptr::null_mut(),
                ptr::null(),
                iv.as_ptr(),
                -1,
            ) == 1
                && sys::EVP_CipherUpdate(self.ctx, p, &mut out_len, p, len) == 1
        };
        if ok && out_len == len {
            Ok(())
        } else {
            Err(backend_error("raw AES-256-XTS"))
        }
    }
}

impl Drop for RawBulkXts {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once; freeing cleanses the key schedule.
        unsafe { sys::EVP_CIPHER_CTX_free(self.ctx) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iv::IvGenerator;

    fn engines() -> (XtsEngine, XtsEngine) {
        let key: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        let mut batched = XtsEngine::new(&key).unwrap();
        batched.batch_below = usize::MAX;
        let mut per_sector = XtsEngine::new(&key).unwrap();
        per_sector.batch_below = 0;
        (batched, per_sector)
    }

    /// The batched path gives AWS-LC's own per-sector XTS output, in place and between
    /// buffers, both ways, at every sector size it takes and for requests that end in a
    /// partial batch; the per-sector path is checked against pyca in the dm/export tests.
    #[test]
    fn batched_matches_per_sector_xts() {
        let (batched, per_sector) = engines();
        let gen = IvGenerator::Plain64;
        let data: Vec<u8> = (0..(64 << 10) + 1536)
            .map(|i: usize| (i * 131 + i / 977) as u8)
            .collect();
        for unit in [512usize, 1024, 2048] {
            let len = data.len() / unit * unit;
            let src = &data[..len];
            let ivs = IvRun::for_test(&gen, 12345);
            let mut want = src.to_vec();
            per_sector
                .crypt(Direction::Encrypt, Sectors::in_place(&mut want), unit, &ivs)
                .unwrap();
            let mut got = src.to_vec();
            batched
                .crypt(Direction::Encrypt, Sectors::in_place(&mut got), unit, &ivs)
                .unwrap();
            assert!(got == want, "encrypt in place, unit {unit}");
            let mut copied = vec![0u8; len];
            let s = Sectors::between(src, &mut copied);
            batched.crypt(Direction::Encrypt, s, unit, &ivs).unwrap();
            assert!(copied == want, "encrypt to, unit {unit}");
            let mut back = vec![0u8; len];
            let s = Sectors::between(&want, &mut back);
            batched.crypt(Direction::Decrypt, s, unit, &ivs).unwrap();
            assert!(back == src, "decrypt to, unit {unit}");
            batched
                .crypt(Direction::Decrypt, Sectors::in_place(&mut got), unit, &ivs)
                .unwrap();
            assert!(got == src, "decrypt in place, unit {unit}");
        }
    }

    /// Many threads at once, more than there are slots: every request still gets a
    /// context of its own and the right result.
    #[test]
    fn slots_serve_more_threads_than_slots() {
        let (batched, per_sector) = engines();
        let gen = IvGenerator::Plain64;
        let plain = vec![0x3cu8; 8192];
        let mut want = plain.clone();
        per_sector
            .crypt(
                Direction::Encrypt,
                Sectors::in_place(&mut want),
                4096,
                &IvRun::for_test(&gen, 8),
            )
            .unwrap();
        let threads = per_sector.enc.slots.len() * 2 + 3;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..200 {
                        for e in [&batched, &per_sector] {
                            let mut buf = plain.clone();
                            let ivs = IvRun::for_test(&gen, 8);
                            e.crypt(Direction::Encrypt, Sectors::in_place(&mut buf), 4096, &ivs)
                                .unwrap();
                            assert!(buf == want);
                        }
                    }
                });
            }
        });
    }
}
