//! The [`SectorCipher`] every implementation shares: request checks and IV sequencing around
//! an implementation's mode engine.

use crate::iv::{IvGenerator, IV_LEN};
use crate::{CipherError, SectorCipher};

/// Which way a batch of sectors goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Encrypt,
    Decrypt,
}

/// IVs of consecutive encryption sectors within one request.
pub(crate) struct IvRun<'a> {
    generator: &'a IvGenerator,
    first: u64,
    step: u64,
}

impl<'a> IvRun<'a> {
    /// A run starting at IV sector `first` and stepping by one, for engine unit tests.
    #[cfg(test)]
    pub(crate) fn for_test(generator: &'a IvGenerator, first: u64) -> Self {
        Self {
            generator,
            first,
            step: 1,
        }
    }

    /// The IV of the `index`-th encryption sector of the request.
    #[inline]
    pub(crate) fn fill(&self, index: usize, iv: &mut [u8; IV_LEN]) {
        let sector = self
            .first
            .wrapping_add((index as u64).wrapping_mul(self.step));
        self.generator.fill(sector, iv);
    }
}

/// The data of one engine call: whole sectors transformed in place, or read from a source
/// and written to a destination of the same length (one pass over memory instead of a copy
/// followed by in-place work).
pub(crate) struct Sectors<'a> {
    src: Option<&'a [u8]>,
    dst: &'a mut [u8],
}

impl<'a> Sectors<'a> {
    /// Sectors transformed in place.
    pub(crate) fn in_place(buf: &'a mut [u8]) -> Self {
        Sectors {
            src: None,
            dst: buf,
        }
    }

    /// Sectors read from `src` and written to `dst` (the same length).
    #[cfg(test)]
    pub(crate) fn between(src: &'a [u8], dst: &'a mut [u8]) -> Self {
        Sectors {
            src: Some(src),
            dst,
        }
    }

    /// The source (`None` when in place) and the destination, for engines that work on
    /// several sectors per call.
    pub(crate) fn parts(self) -> (Option<&'a [u8]>, &'a mut [u8]) {
        (self.src, self.dst)
    }

    /// Runs `f(iv, input, output)` for each `unit`-byte sector, with sector `i`'s IV from
    /// `ivs`; `input` is `None` when the sector is transformed in place in `output`.
    pub(crate) fn each(
        self,
        unit: usize,
        ivs: &IvRun<'_>,
        mut f: impl FnMut(&mut [u8; IV_LEN], Option<&[u8]>, &mut [u8]) -> Result<(), CipherError>,
    ) -> Result<(), CipherError> {
        let mut iv = [0u8; IV_LEN];
        for (i, out) in self.dst.chunks_exact_mut(unit).enumerate() {
            ivs.fill(i, &mut iv);
            let input = self.src.map(|s| &s[i * unit..(i + 1) * unit]);
            f(&mut iv, input, out)?;
        }
        Ok(())
    }

    /// Like [`Sectors::each`] for engines that only work in place: a copied sector is moved
    /// to its destination first, while it is hot in cache.
    pub(crate) fn each_in_place(
        self,
        unit: usize,
        ivs: &IvRun<'_>,
        mut f: impl FnMut(&mut [u8; IV_LEN], &mut [u8]) -> Result<(), CipherError>,
    ) -> Result<(), CipherError> {
        self.each(unit, ivs, |iv, input, out| {
            if let Some(input) = input {
                out.copy_from_slice(input);
            }
            f(iv, out)
        })
    }
}

/// A chaining mode over one key, processing whole encryption sectors.
///
/// `sectors` holds whole `unit`-byte sectors (checked by the caller); sector `i` uses the
/// IV `ivs.fill(i)`. Engines allocate nothing per sector.
pub(crate) trait ModeEngine: Send + Sync {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError>;
}

/// dm-crypt's per-request logic over a [`ModeEngine`].
pub(crate) struct DmCipher {
    engine: Box<dyn ModeEngine>,
    ivgen: IvGenerator,
    sector_size: usize,
    iv_offset: u64,
    iv_large_sectors: bool,
    implementation: &'static str,
    /// A per-sector layer around the engine (`elephant`, `lmk`).
    diffuser: Option<SectorLayer>,
}

/// A transform of each plaintext sector that wraps the chaining mode: applied before
/// encryption and undone after decryption, with the sector's IV sector number.
pub(crate) enum SectorLayer {
    /// BitLocker's Elephant diffuser (`elephant` IV mode); boxed, its key schedule is large.
    Elephant(Box<crate::elephant::Elephant>),
    /// loop-AES's IV folded into the first block (`lmk` IV mode).
    Lmk(crate::lmk::Lmk),
}

impl SectorLayer {
    fn before_encrypt(&self, iv_sector: u64, sector: &mut [u8]) {
        match self {
            Self::Elephant(e) => e.before_encrypt(iv_sector, sector),
            Self::Lmk(l) => l.tweak(iv_sector, sector),
        }
    }

    fn after_decrypt(&self, iv_sector: u64, sector: &mut [u8]) {
        match self {
            Self::Elephant(e) => e.after_decrypt(iv_sector, sector),
            Self::Lmk(l) => l.tweak(iv_sector, sector),
        }
    }
}

impl DmCipher {
    /// Adds a sector layer around the engine (`elephant`, `lmk`).
    pub(crate) fn with_diffuser(mut self, diffuser: Option<SectorLayer>) -> Self {
        self.diffuser = diffuser;
        self
    }

    pub(crate) fn new(
        engine: Box<dyn ModeEngine>,
        ivgen: IvGenerator,
        opts: &crate::SectorOptions,
        implementation: &'static str,
    ) -> Self {
        Self {
            engine,
            ivgen,
            sector_size: opts.sector_size,
            iv_offset: opts.iv_offset,
            iv_large_sectors: opts.iv_large_sectors,
            implementation,
            diffuser: None,
        }
    }

    fn run(&self, dir: Direction, sector: u64, sectors: Sectors<'_>) -> Result<(), CipherError> {
        let ss = self.sector_size;
        let buf = &sectors.dst;
        if sectors.src.is_some_and(|s| s.len() != buf.len()) {
            return Err(CipherError::Backend(
                "source and destination lengths differ".into(),
            ));
        }
        if !buf.len().is_multiple_of(ss) {
            return Err(CipherError::Misaligned {
                len: buf.len(),
                sector_size: ss,
            });
        }
        let per_sector = (ss / 512) as u64;
        // The kernel kills bios that start inside an encryption sector.
        if !sector.is_multiple_of(per_sector) {
            return Err(CipherError::MisalignedSector {
                sector,
                sector_size: ss,
            });
        }
        if buf.is_empty() {
            return Ok(());
        }
        // dm-crypt: iv_sector = (sector + iv_offset), shifted down to sector_size units with
        // iv_large_sectors; consecutive sectors step by sector_size/512 otherwise.
        let base = sector.wrapping_add(self.iv_offset);
        let (first, step) = if self.iv_large_sectors {
            (base >> per_sector.trailing_zeros(), 1)
        } else {
            (base, per_sector)
        };
        let ivs = IvRun {
            generator: &self.ivgen,
            first,
            step,
        };
        let Some(d) = &self.diffuser else {
            return self.engine.crypt(dir, sectors, ss, &ivs);
        };
        let iv_sector = |i: usize| first.wrapping_add((i as u64).wrapping_mul(step));
        match dir {
            Direction::Decrypt => {
                let Sectors { src, dst } = sectors;
                self.engine.crypt(
                    dir,
                    Sectors {
                        src,
                        dst: &mut *dst,
                    },
                    ss,
                    &ivs,
                )?;
                for (i, s) in dst.chunks_exact_mut(ss).enumerate() {
                    d.after_decrypt(iv_sector(i), s);
                }
                Ok(())
            }
            Direction::Encrypt => {
                // The diffuser works in place: a separate source is copied first.
                let Sectors { src, dst } = sectors;
                if let Some(src) = src {
                    dst.copy_from_slice(src);
                }
                for (i, s) in dst.chunks_exact_mut(ss).enumerate() {
                    d.before_encrypt(iv_sector(i), s);
                }
                self.engine.crypt(dir, Sectors::in_place(dst), ss, &ivs)
            }
        }
    }
}

impl SectorCipher for DmCipher {
    fn sector_size(&self) -> usize {
        self.sector_size
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(Direction::Encrypt, sector, Sectors::in_place(buf))
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(Direction::Decrypt, sector, Sectors::in_place(buf))
    }

    fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        let sectors = Sectors {
            src: Some(src),
            dst,
        };
        self.run(Direction::Encrypt, sector, sectors)
    }

    fn decrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        let sectors = Sectors {
            src: Some(src),
            dst,
        };
        self.run(Direction::Decrypt, sector, sectors)
    }

    fn implementation(&self) -> &str {
        self.implementation
    }
}

/// `cipher_null`: the identity.
pub(crate) struct NullEngine;

impl ModeEngine for NullEngine {
    fn crypt(
        &self,
        _: Direction,
        sectors: Sectors<'_>,
        _: usize,
        _: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        if let Some(src) = sectors.src {
            sectors.dst.copy_from_slice(src);
        }
        Ok(())
    }
}
