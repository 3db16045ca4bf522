//! The clevis `sss` pin: Shamir's secret sharing over nested pins. The outer JWE is `dir`
//! (the content key is the shared secret itself); its header holds the prime `p`, the
//! threshold `t` and one compact JWE per share, each of any pin, whose plaintext is the
//! share: x and y, each as many big-endian bytes as `p`. Any `t` shares give the secret as
//! the polynomial's value at 0 (Lagrange interpolation mod p).
//!
//! The arithmetic is crypto-bigint's (constant-time Montgomery residues, zeroizable); clevis
//! uses 32-byte primes (the size of an A256GCM key), which is all this accepts.

use super::{b64, bad, decrypt, Jwe};
use crate::error::{ErrorClass, Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
use crypto_bigint::{Encoding, U256};
use zeroize::Zeroize;

/// Bytes of the prime and of each coordinate.
const P_LEN: usize = 32;

/// The content key of an `sss` JWE: the secret recombined from the first `t` shares whose
/// nested JWEs decrypt. Fails naming why each share failed when fewer than `t` do.
pub fn recover_cek(jwe: &Jwe, tpm2_device: Option<&str>) -> Result<SecretBytes> {
    let h = &jwe.header;
    if h["alg"] != "dir" {
        return Err(bad("an sss JWE uses 'dir' key management"));
    }
    let sss = &h["clevis"]["sss"];
    let t = sss["t"]
        .as_u64()
        .filter(|&t| t >= 1)
        .ok_or_else(|| bad("sss threshold 't' missing"))? as usize;
    let p = b64(sss["p"].as_str().unwrap_or(""), "sss prime")?;
    if p.len() != P_LEN {
        return Err(bad(format!(
            "sss prime of {} bytes is not supported",
            p.len()
        )));
    }
    let p = U256::from_be_slice(&p);
    if p.as_words()[0] & 1 == 0 {
        return Err(bad("sss prime is even"));
    }
    let params = DynResidueParams::new(&p);
    let list = sss["jwe"]
        .as_array()
        .ok_or_else(|| bad("sss shares missing"))?;
    let mut shares: Vec<(U256, U256)> = Vec::new();
    let mut why = Vec::new();
    for (i, sub) in list.iter().enumerate() {
        if shares.len() == t {
            break;
        }
        let share = sub
            .as_str()
            .ok_or_else(|| bad("an sss share is not a compact JWE"))
            .and_then(Jwe::from_compact)
            .and_then(|j| decrypt(&j, tpm2_device));
        match share {
            Ok(s) if s.len() == 2 * P_LEN => {
                let b = s.as_bytes();
                shares.push((
                    U256::from_be_slice(&b[..P_LEN]),
                    U256::from_be_slice(&b[P_LEN..]),
                ));
            }
            Ok(_) => why.push(format!("share {i}: wrong size")),
            Err(e) => why.push(format!("share {i}: {e}")),
        }
    }
    if shares.len() < t {
        return Err(VolumeError::new(
            ErrorClass::WrongDevice,
            format!(
                "clevis sss: {} of the {t} shares needed ({})",
                shares.len(),
                why.join("; ")
            ),
        ));
    }
    let secret = interpolate_at_zero(&shares, params);
    for s in &mut shares {
        s.0.zeroize();
        s.1.zeroize();
    }
    let mut bytes = secret.to_be_bytes();
    let out = SecretBytes::from_slice(&bytes);
    bytes.zeroize();
    Ok(out)
}

/// f(0) of the polynomial through `points`, mod p: sum of y_i * prod x_j / (x_j - x_i).
fn interpolate_at_zero(points: &[(U256, U256)], params: DynResidueParams<4>) -> U256 {
    let r = |v: &U256| DynResidue::new(v, params);
    let mut acc = DynResidue::zero(params);
    for (i, (xi, yi)) in points.iter().enumerate() {
        let mut num = DynResidue::one(params);
        let mut den = DynResidue::one(params);
        for (j, (xj, _)) in points.iter().enumerate() {
            if i != j {
                num *= r(xj);
                den *= r(xj) - r(xi);
            }
        }
        // Distinct x coordinates make den invertible; equal ones (a corrupt token) give a
        // wrong secret, which the AES-GCM tag then refuses.
        let (inv, _) = den.invert();
        acc += r(yi) * num * inv;
    }
    acc.retrieve()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A degree-2 polynomial over a small-looking but valid odd modulus: any 3 points give
    /// f(0).
    #[test]
    fn lagrange() {
        // p = 2^255 - 19 (prime).
        let p =
            U256::from_be_hex("7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffed");
        let params = DynResidueParams::new(&p);
        let f = |x: u64| {
            // f(x) = 12345 + 678 x + 9 x^2
            let x = DynResidue::new(&U256::from_u64(x), params);
            let c = |v: u64| DynResidue::new(&U256::from_u64(v), params);
            (c(12345) + c(678) * x + c(9) * x * x).retrieve()
        };
        let pts: Vec<(U256, U256)> = [3u64, 8, 11, 20]
            .iter()
            .map(|&x| (U256::from_u64(x), f(x)))
            .collect();
        assert_eq!(
            interpolate_at_zero(&pts[..3], params),
            U256::from_u64(12345)
        );
        assert_eq!(
            interpolate_at_zero(&pts[1..], params),
            U256::from_u64(12345)
        );
        assert_ne!(
            interpolate_at_zero(&pts[..2], params),
            U256::from_u64(12345)
        );
    }
}
