//! The CPU features the implementation registry may use, with a mask for testing.
//!
//! `CRYPTBLK_CPU_MASK` (like OpenSSL's `OPENSSL_ia32cap`) hides features from cryptblk's own
//! choice of implementation, so every path can be tested and measured on one machine: a
//! comma-separated list of `aesni` (AES-NI and everything built on it), `pclmul`, `avx2`,
//! `vaes` (VAES and VPCLMULQDQ) and `avx512` (every AVX-512 subset). It is read once, at first
//! use. Masking only lowers what cryptblk selects; AWS-LC detects the CPU itself (mask it
//! with `OPENSSL_ia32cap` for a measurement of AWS-LC alone).

use std::sync::OnceLock;

/// The x86-64 features the cipher paths are chosen by, after the mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AES-NI.
    pub aesni: bool,
    /// PCLMULQDQ (128-bit carry-less multiply).
    pub pclmul: bool,
    /// AVX2.
    pub avx2: bool,
    /// VAES and VPCLMULQDQ (the AES and carry-less multiply on 256/512-bit vectors).
    pub vaes: bool,
    /// AVX-512 F and BW (with VL).
    pub avx512: bool,
}

/// Environment variable naming the features to hide (see the module documentation).
pub const CPU_MASK_ENV: &str = "CRYPTBLK_CPU_MASK";

struct Detected {
    features: CpuFeatures,
    masked: Vec<String>,
    unknown: Vec<String>,
}

#[cfg(target_arch = "x86_64")]
fn hardware() -> CpuFeatures {
    use std::arch::is_x86_feature_detected as has;
    CpuFeatures {
        aesni: has!("aes") && has!("sse4.1"),
        pclmul: has!("pclmulqdq"),
        avx2: has!("avx2"),
        vaes: has!("vaes") && has!("vpclmulqdq"),
        avx512: has!("avx512f") && has!("avx512bw") && has!("avx512vl"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn hardware() -> CpuFeatures {
    CpuFeatures::default()
}

fn detected() -> &'static Detected {
    static D: OnceLock<Detected> = OnceLock::new();
    D.get_or_init(|| {
        let mut f = hardware();
        let mut masked = Vec::new();
        let mut unknown = Vec::new();
        let mask = std::env::var(CPU_MASK_ENV).unwrap_or_default();
        for token in mask.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match token.to_ascii_lowercase().as_str() {
                "aes" | "aesni" | "aes-ni" => f.aesni = false,
                "pclmul" | "pclmulqdq" => f.pclmul = false,
                "avx2" => f.avx2 = false,
                "vaes" | "vpclmulqdq" => f.vaes = false,
                "avx512" | "avx512f" | "avx-512" => f.avx512 = false,
                _ => {
                    unknown.push(token.to_string());
                    continue;
                }
            }
            masked.push(token.to_string());
        }
        Detected {
            features: f,
            masked,
            unknown,
        }
    })
}

/// This CPU's features as the registry sees them (after `CRYPTBLK_CPU_MASK`).
pub fn cpu_features() -> CpuFeatures {
    detected().features
}

/// One line naming the features in use and what the mask hid, for `benchmark` and `bench`
/// output: `aesni pclmul avx2 vaes avx512 (masked: avx512)`.
pub fn cpu_features_summary() -> String {
    let d = detected();
    let f = d.features;
    let names: Vec<&str> = [
        (f.aesni, "aesni"),
        (f.pclmul, "pclmul"),
        (f.avx2, "avx2"),
        (f.vaes, "vaes"),
        (f.avx512, "avx512"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, n)| *n)
    .collect();
    let mut s = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(" ")
    };
    if !d.masked.is_empty() {
        s.push_str(&format!(
            " (masked by {CPU_MASK_ENV}: {})",
            d.masked.join(",")
        ));
    }
    if !d.unknown.is_empty() {
        s.push_str(&format!(
            " (unknown {CPU_MASK_ENV} entries ignored: {})",
            d.unknown.join(",")
        ));
    }
    s
}
