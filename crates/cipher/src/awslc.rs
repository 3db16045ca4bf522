//! The AWS-LC implementation: AES-256-XTS through EVP (AVX-512/VAES code paths where the CPU
//! has them) and AES-CBC through `AES_cbc_encrypt` (AES-NI).
//!
//! AWS-LC offers XTS only with 256-bit AES keys (a 64-byte volume key) and refuses XTS keys
//! whose halves are equal; both cases fall back to another implementation.
//!
//! Key schedules are computed once per context: XTS keeps a pool of keyed EVP contexts (one per
//! concurrently active caller) and only resets the IV per sector; CBC's `AES_KEY` schedules
//! are read-only and shared by all threads.

use crate::dmcipher::{Direction, IvRun, ModeEngine, Sectors};
use crate::locked::LockedBox;
use crate::spec::{BlockCipherName, ChainMode, CipherSpec};
use crate::CipherError;
use aws_lc_sys as sys;
use std::ptr;
use std::sync::Mutex;

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

/// An owned `EVP_CIPHER_CTX`.
struct Ctx(*mut sys::EVP_CIPHER_CTX);

// SAFETY: a context is used by one thread at a time (it is taken out of the pool's mutex
// before use), and AWS-LC contexts carry no thread affinity.
unsafe impl Send for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from EVP_CIPHER_CTX_new and is freed once; freeing also
        // cleanses the key schedule.
        unsafe { sys::EVP_CIPHER_CTX_free(self.0) };
    }
}

/// Keyed contexts for one direction, created on demand (one per concurrent caller).
struct CtxPool {
    encrypt: bool,
    key: crate::SecretBytes,
    idle: Mutex<Vec<Ctx>>,
}

impl CtxPool {
    fn new(key: &[u8], encrypt: bool) -> Result<Self, CipherError> {
        let pool = Self {
            encrypt,
            key: crate::SecretBytes::from_slice(key),
            idle: Mutex::new(Vec::new()),
        };
        // Key one context now so a bad key fails at open time, not on first I/O.
        let first = pool.create()?;
        pool.put(first);
        Ok(pool)
    }

    fn create(&self) -> Result<Ctx, CipherError> {
        // SAFETY: plain constructor; null is checked.
        let ctx = Ctx(unsafe { sys::EVP_CIPHER_CTX_new() });
        if ctx.0.is_null() {
            return Err(backend_error("EVP_CIPHER_CTX_new"));
        }
        // SAFETY: ctx is valid, the cipher is static, the key is 64 bytes as AES-256-XTS needs.
        let ok = unsafe {
            sys::EVP_CipherInit_ex(
                ctx.0,
                sys::EVP_aes_256_xts(),
                ptr::null_mut(),
                self.key.as_bytes().as_ptr(),
                ptr::null(),
                i32::from(self.encrypt),
            )
        };
        if ok != 1 {
            return Err(backend_error("AES-256-XTS key setup"));
        }
        Ok(ctx)
    }

    fn take(&self) -> Result<Ctx, CipherError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(c) => Ok(c),
            None => self.create(),
        }
    }

    fn put(&self, ctx: Ctx) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ctx);
    }
}

struct XtsEngine {
    enc: CtxPool,
    dec: CtxPool,
}

impl XtsEngine {
    fn new(key: &[u8]) -> Result<Self, CipherError> {
        Ok(Self {
            enc: CtxPool::new(key, true)?,
            dec: CtxPool::new(key, false)?,
        })
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
        let pool = match dir {
            Direction::Encrypt => &self.enc,
            Direction::Decrypt => &self.dec,
        };
        let ctx = pool.take()?;
        let len = i32::try_from(unit).map_err(|_| CipherError::SectorSize(unit))?;
        let result = sectors.each(unit, ivs, |iv, input, out| {
            let mut out_len = 0i32;
            let o = out.as_mut_ptr();
            let i = input.map_or(o as *const u8, |s| s.as_ptr());
            // SAFETY: ctx is keyed and exclusively ours; passing only the IV (no cipher, no
            // key, enc = -1) starts a new data unit without a new key schedule. Input and
            // output are either the same sector (in place, which EVP allows) or two distinct
            // buffers of `len` bytes.
            let ok = unsafe {
                sys::EVP_CipherInit_ex(
                    ctx.0,
                    ptr::null(),
                    ptr::null_mut(),
                    ptr::null(),
                    iv.as_ptr(),
                    -1,
                ) == 1
                    && sys::EVP_CipherUpdate(ctx.0, o, &mut out_len, i, len) == 1
            };
            if ok && out_len == len {
                Ok(())
            } else {
                Err(backend_error("AES-256-XTS sector"))
            }
        });
        pool.put(ctx);
        result
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
