//! The implementation registry, like the kernel's `/proc/crypto`: several implementations
//! per algorithm, each with a priority; the highest-priority available one that supports a
//! spec and key size is chosen unless the caller names one.

use crate::dmcipher::{DmCipher, ModeEngine, NullEngine, SectorLayer};
use crate::iv::IvGenerator;
use crate::spec::{CipherSpec, SectorOptions};
use crate::xts_x86::{self, XtsPath};
use crate::{awslc, rustcrypto, CipherError, SectorCipher};

/// One entry of [`implementations`], for `cryptblk ciphers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImplementationInfo {
    /// Name to select it by ([`SectorOptions::implementation`]).
    pub name: String,
    /// What it is built on.
    pub description: String,
    /// Kernel-style algorithm names it covers (`xts(aes)`, `cbc(serpent)`, ...), with key
    /// size restrictions in parentheses where it has them.
    pub algorithms: Vec<String>,
    /// Selection priority on this CPU (higher wins).
    pub priority: u32,
    /// Whether it can run on this CPU.
    pub available: bool,
    /// Whether it is the default choice for at least one algorithm it covers.
    pub selected_by_default: bool,
}

/// Builds a keyed engine for a spec.
type EngineBuilder = fn(&CipherSpec, &[u8]) -> Result<Box<dyn ModeEngine>, CipherError>;

struct Implementation {
    name: &'static str,
    description: &'static str,
    /// (display name, representative spec, key length) per covered algorithm.
    algorithms: &'static [(&'static str, &'static str, usize)],
    priority: fn() -> u32,
    available: fn() -> bool,
    supports: fn(&CipherSpec, usize) -> bool,
    build: EngineBuilder,
}

/// AES-NI with PCLMULQDQ, as `CRYPTBLK_CPU_MASK` leaves it.
fn has_aes_ni() -> bool {
    let f = crate::cpu::cpu_features();
    f.aesni && f.pclmul
}

/// The key sizes the hand-written XTS paths cover (both AES-XTS sizes).
const XTS_X86_ALGS: &[(&str, &str, usize)] = &[
    ("xts(aes) (256-bit keys)", "aes-xts-plain64", 32),
    ("xts(aes) (512-bit keys)", "aes-xts-plain64", 64),
];

const RUSTCRYPTO_ALGS: &[(&str, &str, usize)] = &[
    ("xts(aes)", "aes-xts-plain64", 32),
    ("cbc(aes)", "aes-cbc-plain64", 32),
    ("ecb(aes)", "aes-ecb", 32),
    ("lrw(aes)", "aes-lrw-plain64", 48),
    ("xts(serpent)", "serpent-xts-plain64", 64),
    ("cbc(serpent)", "serpent-cbc-plain64", 32),
    ("ecb(serpent)", "serpent-ecb", 32),
    ("lrw(serpent)", "serpent-lrw-plain64", 48),
    ("xts(twofish)", "twofish-xts-plain64", 64),
    ("cbc(twofish)", "twofish-cbc-plain64", 32),
    ("ecb(twofish)", "twofish-ecb", 32),
    ("lrw(twofish)", "twofish-lrw-plain64", 48),
    ("xts(camellia)", "camellia-xts-plain64", 64),
    ("cbc(camellia)", "camellia-cbc-plain64", 32),
    ("xts(kuznyechik)", "kuznyechik-xts-plain64", 64),
    ("cbc(kuznyechik)", "kuznyechik-cbc-plain64", 32),
    ("xts(aria)", "aria-xts-plain64", 64),
    ("cbc(aria)", "aria-cbc-plain64", 32),
];

static REGISTRY: &[Implementation] = &[
    Implementation {
        name: "aws-lc",
        description: "AWS-LC (aws-lc-sys): AES-NI/VAES/AVX-512 assembly",
        algorithms: &[
            ("xts(aes) (512-bit keys)", "aes-xts-plain64", 64),
            ("cbc(aes)", "aes-cbc-plain64", 32),
        ],
        // Without AES-NI AWS-LC still runs (constant-time vector code), but then it has no
        // edge over the portable implementation. Without AVX-512 its XTS is AES-NI code:
        // below the VAES-AVX2 path, above our AES-NI path (a maintained library at parity).
        priority: || {
            let f = crate::cpu::cpu_features();
            match (has_aes_ni(), f.avx512 && f.vaes) {
                (false, _) => 150,
                (true, false) => 320,
                (true, true) => 400,
            }
        },
        available: || true,
        supports: awslc::supports,
        build: awslc::engine,
    },
    Implementation {
        name: "vaes-avx512-xts",
        description: "hand-written AES-XTS: VAES + AVX-512, zmm (4 blocks per instruction)",
        algorithms: XTS_X86_ALGS,
        // Below AWS-LC (400): for 512-bit keys AWS-LC's AVX-512 XTS is as fast
        // (docs/bench/xts-paths.md) and maintained; for 256-bit keys AWS-LC has no XTS.
        priority: || 390,
        available: || XtsPath::VaesAvx512.available(),
        supports: xts_x86::supports,
        build: |spec, key| xts_x86::engine(XtsPath::VaesAvx512, spec, key),
    },
    Implementation {
        name: "vaes-avx2-xts",
        description: "hand-written AES-XTS: VAES + AVX2, ymm (2 blocks per instruction)",
        algorithms: XTS_X86_ALGS,
        priority: || 350,
        available: || XtsPath::VaesAvx2.available(),
        supports: xts_x86::supports,
        build: |spec, key| xts_x86::engine(XtsPath::VaesAvx2, spec, key),
    },
    Implementation {
        name: "aesni-xts",
        description: "hand-written AES-XTS: AES-NI, xmm (8 blocks in flight)",
        algorithms: XTS_X86_ALGS,
        priority: || 300,
        available: || XtsPath::AesNi.available(),
        supports: xts_x86::supports,
        build: |spec, key| xts_x86::engine(XtsPath::AesNi, spec, key),
    },
    Implementation {
        name: "rustcrypto",
        description:
            "RustCrypto aes/serpent/twofish/camellia/kuznyechik with xts-mode and cbc (portable)",
        algorithms: RUSTCRYPTO_ALGS,
        priority: || 200,
        available: || true,
        supports: |spec, _| rustcrypto::supports(spec),
        build: rustcrypto::engine,
    },
    Implementation {
        name: "hctr2",
        description: "HCTR2 over RustCrypto aes + polyval (the mode hand-written: crate::hctr2)",
        algorithms: &[("hctr2(aes)", "aes-hctr2-plain64", 32)],
        priority: || 200,
        available: || true,
        supports: |spec, _| crate::hctr2::supports(spec),
        build: crate::hctr2::engine,
    },
    Implementation {
        name: "adiantum",
        description: "Adiantum: the adiantum crate over RustCrypto chacha20 (XChaCha) + aes",
        algorithms: &[
            (
                "adiantum(xchacha12,aes)",
                "xchacha12,aes-adiantum-plain64",
                32,
            ),
            (
                "adiantum(xchacha20,aes)",
                "xchacha20,aes-adiantum-plain64",
                32,
            ),
        ],
        priority: || 200,
        available: || true,
        supports: |spec, _| crate::adiantum_mode::supports(spec),
        build: crate::adiantum_mode::engine,
    },
    Implementation {
        name: "null",
        description: "cipher_null: the identity (no encryption)",
        algorithms: &[("ecb(cipher_null)", "cipher_null-ecb", 0)],
        priority: || 100,
        available: || true,
        supports: |spec, _| spec.is_null(),
        build: |_, _| Ok(Box::new(NullEngine)),
    },
];

/// Available implementations supporting `spec` with a `key_len`-byte key, best first.
fn candidates(spec: &CipherSpec, key_len: usize) -> Vec<&'static Implementation> {
    let mut v: Vec<_> = REGISTRY
        .iter()
        .filter(|i| (i.available)() && (i.supports)(spec, key_len))
        .collect();
    v.sort_by_key(|i| std::cmp::Reverse((i.priority)()));
    v
}

/// Lists every implementation with its priority and availability on this CPU.
pub fn implementations() -> Vec<ImplementationInfo> {
    REGISTRY
        .iter()
        .map(|imp| {
            let selected_by_default = imp.algorithms.iter().any(|(_, spec, key_len)| {
                CipherSpec::parse(spec)
                    .ok()
                    .and_then(|s| {
                        candidates(&s, *key_len)
                            .first()
                            .map(|best| best.name == imp.name)
                    })
                    .unwrap_or(false)
            });
            ImplementationInfo {
                name: imp.name.to_string(),
                description: imp.description.to_string(),
                algorithms: imp
                    .algorithms
                    .iter()
                    .map(|(n, _, _)| n.to_string())
                    .collect(),
                priority: (imp.priority)(),
                available: (imp.available)(),
                selected_by_default,
            }
        })
        .collect()
}

/// The implementation [`open_cipher`] picks for `spec` and a `key_len`-byte key when none
/// is named.
pub fn default_implementation(spec: &str, key_len: usize) -> Result<String, CipherError> {
    let spec = CipherSpec::parse(spec)?;
    spec.check_key_size(key_len)?;
    // A multi-key spec's engines each take one of its keys.
    let one = spec.key_layout(key_len).map_or(key_len, |(k, _)| k);
    candidates(&spec, one)
        .first()
        .map(|i| i.name.to_string())
        .ok_or_else(|| CipherError::NoImplementation(format!("any for {spec}")))
}

/// Opens a sector cipher for a dm-crypt cipher specification and volume key.
///
/// `spec` is any form [`CipherSpec::parse`] accepts; `key` is the whole volume key (for XTS
/// both halves; empty for `cipher_null`). With `opts.implementation` set, exactly that
/// implementation is used or [`CipherError::NoImplementation`] returned; otherwise the
/// highest-priority one that accepts the key is used.
pub fn open_cipher(
    spec: &str,
    key: &[u8],
    opts: &SectorOptions,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    open_cipher_spec(&CipherSpec::parse(spec)?, key, opts)
}

/// [`open_cipher`] for an already parsed specification.
pub fn open_cipher_spec(
    spec: &CipherSpec,
    key: &[u8],
    opts: &SectorOptions,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    opts.check()?;
    spec.check_key_size(key.len())?;
    if spec.iv_mode() == crate::IvMode::Tcw {
        return open_tcw(spec, key, opts);
    }
    if spec.key_count() == 1 && spec.iv_mode() != crate::IvMode::Lmk {
        return open_one(spec, key, opts, None);
    }
    // Multi-key (`aes:64-cbc-lmk`): the key splits into `key_count` keys of one size, and
    // for lmk perhaps one more, the IV seed (loop-AES v3).
    if spec.iv_mode() == crate::IvMode::Lmk && opts.sector_size != crate::lmk::LMK_SECTOR {
        return Err(CipherError::Unsupported(
            "lmk IVs need 512-byte sectors (the kernel: Unsupported sector size for LMK)".into(),
        ));
    }
    let bad_size = || CipherError::KeySize {
        spec: spec.spec_string(),
        got: key.len(),
    };
    let (one, seeded) = spec.key_layout(key.len()).ok_or_else(bad_size)?;
    let n = spec.key_count() as usize;
    let seed = seeded.then(|| &key[n * one..]);
    let mut ciphers = Vec::with_capacity(n);
    for k in key[..n * one].chunks_exact(one) {
        let layer = (spec.iv_mode() == crate::IvMode::Lmk)
            .then(|| SectorLayer::Lmk(crate::lmk::Lmk::new(seed)));
        ciphers.push(open_one(spec, k, opts, layer)?);
    }
    if ciphers.len() == 1 {
        return Ok(ciphers.remove(0));
    }
    Ok(Box::new(crate::multikey::MultiKey::new(ciphers, opts)))
}

/// One keyed cipher of `spec` (one key of a multi-key spec), with `layer` around its engine.
fn open_one(
    spec: &CipherSpec,
    key: &[u8],
    opts: &SectorOptions,
    layer: Option<SectorLayer>,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    let ivgen = IvGenerator::new(spec.iv_mode(), spec.cipher(), key, opts.sector_size)?;
    // elephant: the CBC engine takes the data key; the tweak key (second half) keys the
    // diffuser's sector keys.
    let (key, diffuser) = if spec.iv_mode() == crate::IvMode::Elephant {
        let (data, tweak) = key.split_at(key.len() / 2);
        (
            data,
            Some(SectorLayer::Elephant(Box::new(
                crate::elephant::Elephant::new(tweak, opts.sector_size)?,
            ))),
        )
    } else {
        (key, layer)
    };
    let (engine, name) = match &opts.implementation {
        Some(name) => {
            let imp = REGISTRY
                .iter()
                .find(|i| i.name == name)
                .ok_or_else(|| CipherError::NoImplementation(name.clone()))?;
            if !(imp.available)() || !(imp.supports)(spec, key.len()) {
                return Err(CipherError::NoImplementation(format!(
                    "{name} for {spec} with a {}-byte key",
                    key.len()
                )));
            }
            ((imp.build)(spec, key)?, imp.name)
        }
        None => {
            // A candidate may still refuse a key (AWS-LC rejects XTS keys with equal
            // halves, which the kernel accepts): fall through to the next one.
            let mut last = CipherError::NoImplementation(format!("any for {spec}"));
            let mut found = None;
            for imp in candidates(spec, key.len()) {
                match (imp.build)(spec, key) {
                    Ok(e) => {
                        found = Some((e, imp.name));
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            found.ok_or(last)?
        }
    };
    Ok(Box::new(
        DmCipher::new(engine, ivgen, opts, name).with_diffuser(diffuser),
    ))
}

/// dm-crypt's `tcw`: TrueCrypt's legacy CBC engine over RustCrypto ciphers, the only
/// implementation. As in the kernel, only 512-byte sectors (its whitening is per sector).
fn open_tcw(
    spec: &CipherSpec,
    key: &[u8],
    opts: &SectorOptions,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    use crate::tcrypt_cbc::{LegacyCipher, TcryptCbc};
    if let Some(name) = opts
        .implementation
        .as_deref()
        .filter(|n| *n != "rustcrypto")
    {
        return Err(CipherError::NoImplementation(format!("{name} for {spec}")));
    }
    if opts.sector_size != 512 {
        return Err(CipherError::Unsupported(format!(
            "tcw needs 512-byte sectors, not {}",
            opts.sector_size
        )));
    }
    let cipher = LegacyCipher::from_name(spec.cipher_name())
        .ok_or_else(|| CipherError::UnknownSpec(spec.spec_string()))?;
    Ok(Box::new(TcryptCbc::tcw(cipher, key, opts.iv_offset)?))
}
