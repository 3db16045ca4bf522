//! Adiantum (Crowley, Biggers 2018), the kernel's `adiantum(xchacha12,aes)` and
//! `adiantum(xchacha20,aes)`, cryptsetup's `xchacha12,aes-adiantum-plain64`: the `adiantum`
//! crate over RustCrypto's XChaCha (`chacha20`) and AES (`aes` 0.9, the cipher 0.5 stack
//! that crate is built on).
//!
//! Each encryption sector is one Adiantum message; its tweak is dm-crypt's 32-byte IV
//! (the kernel's Adiantum IV size), of which plain/plain64/null fill the first 16 bytes.

use crate::dmcipher::{Direction, IvRun, ModeEngine, Sectors};
use crate::hctr2::dm_tweak;
use crate::locked::LockedBox;
use crate::spec::{ChainMode, CipherSpec};
use crate::CipherError;
use adiantum::cipher::KeyInit;
use chacha20::{XChaCha12, XChaCha20};

/// Adiantum keyed once, over the stream cipher `S`.
struct Adiantum<S: adiantum::cipher::KeySizeUser>(adiantum::Cipher<S, aes09::Aes256>);

/// The two Adiantum variants dm-crypt names.
enum Variant {
    XChaCha12(Adiantum<XChaCha12>),
    XChaCha20(Adiantum<XChaCha20>),
}

impl Variant {
    fn crypt(&self, dir: Direction, tweak: &[u8], sector: &mut [u8]) {
        match (self, dir) {
            (Self::XChaCha12(a), Direction::Encrypt) => a.0.encrypt(sector, tweak),
            (Self::XChaCha12(a), Direction::Decrypt) => a.0.decrypt(sector, tweak),
            (Self::XChaCha20(a), Direction::Encrypt) => a.0.encrypt(sector, tweak),
            (Self::XChaCha20(a), Direction::Decrypt) => a.0.decrypt(sector, tweak),
        }
    }
}

impl ModeEngine for Variant {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        sectors.each_in_place(unit, ivs, |iv, sector| {
            let tweak = dm_tweak(iv);
            self.crypt(dir, &tweak, sector);
            Ok(())
        })
    }
}

/// True for `xchacha12,aes-adiantum-*` and `xchacha20,aes-adiantum-*`.
pub(crate) fn supports(spec: &CipherSpec) -> bool {
    matches!(
        spec.chain_mode(),
        ChainMode::AdiantumXChaCha12 | ChainMode::AdiantumXChaCha20
    )
}

fn keyed<S>(key: &[u8]) -> Result<Adiantum<S>, CipherError>
where
    adiantum::Cipher<S, aes09::Aes256>: KeyInit,
    S: adiantum::cipher::KeySizeUser,
{
    adiantum::Cipher::<S, aes09::Aes256>::new_from_slice(key)
        .map(Adiantum)
        .map_err(|_| CipherError::Backend("Adiantum rejected its key".into()))
}

/// The Adiantum engine for `spec` (a 32-byte key), its keys in locked memory.
pub(crate) fn engine(spec: &CipherSpec, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    if key.len() != 32 {
        return Err(CipherError::KeySize {
            spec: spec.spec_string(),
            got: key.len(),
        });
    }
    let v = match spec.chain_mode() {
        ChainMode::AdiantumXChaCha12 => Variant::XChaCha12(keyed::<XChaCha12>(key)?),
        ChainMode::AdiantumXChaCha20 => Variant::XChaCha20(keyed::<XChaCha20>(key)?),
        _ => {
            return Err(CipherError::NoImplementation(format!(
                "adiantum for {spec}"
            )))
        }
    };
    Ok(Box::new(LockedBox::new(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The designers' reference vectors (src/testdata/adiantum.txt), through the engine's
    /// own per-variant dispatch.
    #[test]
    fn reference_vectors() {
        let mut n = 0;
        for line in include_str!("testdata/adiantum.txt").lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(' ').collect();
            let key = hex::decode(f[1]).unwrap();
            let tweak = if f[2] == "-" {
                vec![]
            } else {
                hex::decode(f[2]).unwrap()
            };
            let (p, c) = (hex::decode(f[3]).unwrap(), hex::decode(f[4]).unwrap());
            let v = match f[0] {
                "xchacha12" => Variant::XChaCha12(keyed(&key).unwrap()),
                _ => Variant::XChaCha20(keyed(&key).unwrap()),
            };
            let mut buf = p.clone();
            v.crypt(Direction::Encrypt, &tweak, &mut buf);
            assert!(buf == c, "{} {}-byte vector", f[0], p.len());
            v.crypt(Direction::Decrypt, &tweak, &mut buf);
            assert!(buf == p);
            n += 1;
        }
        assert_eq!(n, 4);
    }
}
