//! Multi-key ciphers (dm-crypt's `cipher:<keycount>-...`, e.g. loop-AES's `aes:64-cbc-lmk`):
//! one keyed cipher per key, and each encryption sector uses key number
//! `(sector + iv_offset) mod keycount`, counted in 512-byte sectors as dm-crypt counts them
//! (its `cc_sector`); the IV is derived as for a single key.

use crate::{CipherError, SectorCipher, SectorOptions};

/// The ciphers of a multi-key spec, chosen per sector.
pub(crate) struct MultiKey {
    ciphers: Vec<Box<dyn SectorCipher>>,
    sector_size: usize,
    iv_offset: u64,
}

impl MultiKey {
    /// `ciphers` (a power of two of them, each built with `opts`) as one sector cipher.
    pub(crate) fn new(ciphers: Vec<Box<dyn SectorCipher>>, opts: &SectorOptions) -> Self {
        debug_assert!(ciphers.len().is_power_of_two());
        Self {
            ciphers,
            sector_size: opts.sector_size,
            iv_offset: opts.iv_offset,
        }
    }

    /// Checks the request shape as a single cipher would, so errors match.
    fn check(&self, sector: u64, len: usize) -> Result<(), CipherError> {
        let ss = self.sector_size;
        if !len.is_multiple_of(ss) {
            return Err(CipherError::Misaligned {
                len,
                sector_size: ss,
            });
        }
        if !sector.is_multiple_of((ss / 512) as u64) {
            return Err(CipherError::MisalignedSector {
                sector,
                sector_size: ss,
            });
        }
        Ok(())
    }

    /// The cipher of the encryption sector at 512-byte sector `sector`.
    fn cipher_for(&self, sector: u64) -> &dyn SectorCipher {
        let mask = self.ciphers.len() as u64 - 1;
        self.ciphers[(sector.wrapping_add(self.iv_offset) & mask) as usize].as_ref()
    }

    /// Runs `f(cipher, sector, range)` for each encryption sector of a `len`-byte request.
    fn each(
        &self,
        sector: u64,
        len: usize,
        mut f: impl FnMut(&dyn SectorCipher, u64, std::ops::Range<usize>) -> Result<(), CipherError>,
    ) -> Result<(), CipherError> {
        self.check(sector, len)?;
        let ss = self.sector_size;
        for i in 0..len / ss {
            let s = sector.wrapping_add((i * ss / 512) as u64);
            f(self.cipher_for(s), s, i * ss..(i + 1) * ss)?;
        }
        Ok(())
    }
}

impl SectorCipher for MultiKey {
    fn sector_size(&self) -> usize {
        self.sector_size
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.each(sector, buf.len(), |c, s, r| c.encrypt(s, &mut buf[r]))
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.each(sector, buf.len(), |c, s, r| c.decrypt(s, &mut buf[r]))
    }

    fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        if src.len() != dst.len() {
            return Err(CipherError::Backend(
                "source and destination lengths differ".into(),
            ));
        }
        self.each(sector, dst.len(), |c, s, r| {
            c.encrypt_to(s, &src[r.clone()], &mut dst[r])
        })
    }

    fn decrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        if src.len() != dst.len() {
            return Err(CipherError::Backend(
                "source and destination lengths differ".into(),
            ));
        }
        self.each(sector, dst.len(), |c, s, r| {
            c.decrypt_to(s, &src[r.clone()], &mut dst[r])
        })
    }

    fn implementation(&self) -> &str {
        self.ciphers[0].implementation()
    }
}

#[cfg(test)]
mod tests {
    use crate::{open_cipher, SectorOptions};

    /// Sector `s` of a multi-key volume is sector `s` of the single-key volume under key
    /// `(s + iv_offset) % n`: checked against single-key ciphers built separately.
    #[test]
    fn key_chosen_by_sector_modulo_count() {
        let keys: Vec<u8> = (0..4 * 16).map(|i| (i * 13 + 1) as u8).collect();
        for iv_offset in [0u64, 3] {
            let opts = SectorOptions {
                iv_offset,
                ..SectorOptions::default()
            };
            let multi = open_cipher("aes:4-cbc-plain64", &keys, &opts).unwrap();
            let data: Vec<u8> = (0..8 * 512).map(|i| (i % 251) as u8).collect();
            let mut enc = data.clone();
            multi.encrypt(10, &mut enc).unwrap();
            for i in 0..8u64 {
                let k = ((10 + i + iv_offset) % 4) as usize;
                let one = open_cipher("aes-cbc-plain64", &keys[k * 16..][..16], &opts).unwrap();
                let r = i as usize * 512..(i as usize + 1) * 512;
                let mut expect = data[r.clone()].to_vec();
                one.encrypt(10 + i, &mut expect).unwrap();
                assert_eq!(enc[r], expect[..], "sector {i}, iv_offset {iv_offset}");
            }
            let mut back = vec![0u8; enc.len()];
            multi.decrypt_to(10, &enc, &mut back).unwrap();
            assert_eq!(back, data);
        }
    }

    #[test]
    fn lmk_needs_512_byte_sectors_and_whole_keys() {
        let opts = SectorOptions {
            sector_size: 4096,
            ..SectorOptions::default()
        };
        assert!(open_cipher("aes:64-cbc-lmk", &[1u8; 64 * 16], &opts).is_err());
        let d = SectorOptions::default();
        assert!(open_cipher("aes:64-cbc-lmk", &[1u8; 64 * 16], &d).is_ok());
        assert!(open_cipher("aes:64-cbc-lmk", &[1u8; 65 * 16], &d).is_ok());
        assert!(open_cipher("aes:64-cbc-lmk", &[1u8; 65 * 16 + 16], &d).is_err());
        let mut data = vec![7u8; 1024];
        let c = open_cipher("aes:64-cbc-lmk", &[1u8; 65 * 32], &d).unwrap();
        c.encrypt(0, &mut data).unwrap();
        assert_ne!(data, vec![7u8; 1024]);
        c.decrypt(0, &mut data).unwrap();
        assert_eq!(data, vec![7u8; 1024]);
    }
}
