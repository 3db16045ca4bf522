//! HCTR2 (Crowley, Huckleberry, Biggers: "Length-preserving encryption with HCTR2", 2021),
//! the kernel's `hctr2(aes)` and cryptsetup 2.7+'s `aes-hctr2-plain64`.
//!
//! Written here because the one crate on crates.io (`hctr2` 0.2) builds only with a nightly
//! compiler; this is the mode's few lines over RustCrypto's `aes` (the block cipher and
//! XCTR's keystream, many blocks per call) and `polyval` (the hash, CLMUL-accelerated).
//!
//! The construction, with `E` the block cipher under key `K`, `hbar = E(0)` the POLYVAL key
//! and `L = E(1)` (facts from the paper and the kernel's crypto/hctr2.c):
//! `H(T, X) = POLYVAL(hbar, le128(2*8*|T| + 2 + [|X| % 16 != 0]) || pad0(T) || pad1(X))`,
//! where `pad1` appends `0x01` and zeros to a partial last block. For a message `M || N`
//! (`M` one block): `MM = M ^ H(T, N)`, `UU = E(MM)`, `S = MM ^ UU ^ L`,
//! `V = N ^ XCTR(S)`, `U = UU ^ H(T, V)`, ciphertext `U || V`; XCTR's block `i` (from 1) is
//! `E(S ^ le128(i))`. dm-crypt passes a 32-byte tweak: the sector's IV.

use crate::block::Block16;
use crate::dmcipher::{Direction, IvRun, ModeEngine, Sectors};
use crate::locked::LockedBox;
use crate::rustcrypto::new_cipher;
use crate::spec::{BlockCipherName, ChainMode, CipherSpec};
use crate::CipherError;
use cipher::generic_array::GenericArray;
use polyval::universal_hash::{KeyInit, UniversalHash};
use polyval::Polyval;

/// HCTR2's block size (that of AES).
const BLOCK: usize = 16;
/// The tweak length dm-crypt gives HCTR2 (the kernel's IV size for `hctr2(aes)`).
pub(crate) const DM_TWEAK_LEN: usize = 32;

/// The 32-byte tweak dm-crypt hands a wide-block mode (HCTR2, Adiantum): plain/plain64/null
/// fill the first 16 bytes (the spec parser allows no other IV mode for these), the rest is
/// zero.
pub(crate) fn dm_tweak(iv: &[u8]) -> [u8; DM_TWEAK_LEN] {
    let mut tweak = [0u8; DM_TWEAK_LEN];
    tweak[..iv.len()].copy_from_slice(iv);
    tweak
}
/// XCTR blocks per block-cipher call: enough for AES-NI's pipeline, small on the stack.
const XCTR_BATCH: usize = 32;

/// HCTR2 over one keyed block cipher `C` (AES-128/192/256).
pub(crate) struct Hctr2<C: Block16> {
    cipher: C,
    /// `E(le128(1))`, XORed into XCTR's nonce.
    l: u128,
    /// POLYVAL keyed with `E(0)`, before any input.
    hash: Polyval,
}

impl<C: Block16> Hctr2<C> {
    /// Keys HCTR2 with the block cipher key `key`.
    pub fn new(key: &[u8]) -> Result<Self, CipherError> {
        let cipher = new_cipher::<C>(key)?;
        let mut hbar = GenericArray::default();
        cipher.encrypt_block(&mut hbar);
        let mut l = GenericArray::default();
        l[0] = 1;
        cipher.encrypt_block(&mut l);
        let hash = Polyval::new(&hbar);
        hbar.iter_mut().for_each(|b| *b = 0);
        Ok(Self {
            cipher,
            l: u128::from_le_bytes(l.into()),
            hash,
        })
    }

    /// `H(T, X)` as a little-endian integer.
    fn h(&self, tweak: &[u8], x: &[u8]) -> u128 {
        let partial = !x.len().is_multiple_of(BLOCK);
        let len_block = (tweak.len() as u128) * 8 * 2 + 2 + u128::from(partial);
        let mut p = self.hash.clone();
        p.update(&[len_block.to_le_bytes().into()]);
        p.update_padded(tweak);
        let whole = x.len() - x.len() % BLOCK;
        p.update_padded(&x[..whole]);
        if partial {
            let mut last = [0u8; BLOCK];
            let tail = &x[whole..];
            last[..tail.len()].copy_from_slice(tail);
            last[tail.len()] = 1;
            p.update(&[last.into()]);
        }
        u128::from_le_bytes(p.finalize().into())
    }

    /// XORs XCTR's keystream for nonce `s` into `data`.
    fn xctr(&self, s: u128, data: &mut [u8]) {
        let mut counter = 1u128;
        for chunk in data.chunks_mut(XCTR_BATCH * BLOCK) {
            let n = chunk.len().div_ceil(BLOCK);
            let mut ks = [GenericArray::default(); XCTR_BATCH];
            for b in ks[..n].iter_mut() {
                *b = (s ^ counter).to_le_bytes().into();
                counter += 1;
            }
            self.cipher.encrypt_blocks(&mut ks[..n]);
            for (d, k) in chunk.iter_mut().zip(ks[..n].iter().flatten()) {
                *d ^= k;
            }
        }
    }

    /// Encrypts `data` (at least one block, any length) in place under `tweak`.
    pub fn encrypt(&self, tweak: &[u8], data: &mut [u8]) {
        assert!(data.len() >= BLOCK, "HCTR2 needs at least one block");
        let (m, n) = data.split_at_mut(BLOCK);
        let mm = le(m) ^ self.h(tweak, n);
        let mut uu = GenericArray::from(mm.to_le_bytes());
        self.cipher.encrypt_block(&mut uu);
        let uu = u128::from_le_bytes(uu.into());
        self.xctr(mm ^ uu ^ self.l, n);
        m.copy_from_slice(&(uu ^ self.h(tweak, n)).to_le_bytes());
    }

    /// Decrypts `data` in place under `tweak` (the inverse of [`Hctr2::encrypt`]).
    pub fn decrypt(&self, tweak: &[u8], data: &mut [u8]) {
        assert!(data.len() >= BLOCK, "HCTR2 needs at least one block");
        let (u, v) = data.split_at_mut(BLOCK);
        let uu = le(u) ^ self.h(tweak, v);
        let mut mm = GenericArray::from(uu.to_le_bytes());
        self.cipher.decrypt_block(&mut mm);
        let mm = u128::from_le_bytes(mm.into());
        self.xctr(mm ^ uu ^ self.l, v);
        u.copy_from_slice(&(mm ^ self.h(tweak, v)).to_le_bytes());
    }
}

fn le(b: &[u8]) -> u128 {
    u128::from_le_bytes(b.try_into().expect("one block"))
}

impl<C: Block16> ModeEngine for Hctr2<C> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        sectors.each_in_place(unit, ivs, |iv, sector| {
            let tweak = dm_tweak(iv);
            match dir {
                Direction::Encrypt => self.encrypt(&tweak, sector),
                Direction::Decrypt => self.decrypt(&tweak, sector),
            }
            Ok(())
        })
    }
}

/// True for `aes-hctr2-*`.
pub(crate) fn supports(spec: &CipherSpec) -> bool {
    spec.chain_mode() == ChainMode::Hctr2 && spec.cipher() == BlockCipherName::Aes
}

/// The HCTR2 engine for `spec`, its key schedule in locked memory.
pub(crate) fn engine(spec: &CipherSpec, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    if !supports(spec) {
        return Err(CipherError::NoImplementation(format!("hctr2 for {spec}")));
    }
    Ok(match key.len() {
        16 => Box::new(LockedBox::new(Hctr2::<aes::Aes128>::new(key)?)),
        24 => Box::new(LockedBox::new(Hctr2::<aes::Aes192>::new(key)?)),
        32 => Box::new(LockedBox::new(Hctr2::<aes::Aes256>::new(key)?)),
        got => {
            return Err(CipherError::KeySize {
                spec: spec.spec_string(),
                got,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hx(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// Vectors from the HCTR2 authors' reference set (github.com/google/hctr2,
    /// test_vectors/ours/HCTR2/HCTR2_AES*.json): an empty tweak, a partial last block, and
    /// the 32-byte tweak dm-crypt uses.
    #[test]
    fn reference_vectors() {
        // (key, tweak, plaintext, ciphertext)
        let vectors: &[(&str, &str, &str, &str)] = &[
            (
                "74f98f60786abfa85b0bbba059e0f91e",
                "",
                "6b26837bdc1c583dc142c6ab7b3f43b0",
                "dd05a8ae51f1e8212fd6c33b9467036d",
            ),
            (
                "e86753cfcd932cb05a2d3cd10a25cf2c6c7df60c8b985ab0",
                "",
                "2339f0c4f569905813875194737d973ac6",
                "ee74412fc99386c4672fd9b3c6640381a3",
            ),
            (
                "7fc7152ae1f5fda4176769aec92bba82a314e7cfadfd8540da7b7d24bdf17d07",
                "",
                "9be382c65ac19fad4659b80bacc857a0",
                "596a76ff906fbe9b792767778fed2361",
            ),
            (
                "59653b1d435ec0aeb89d9bdd2203bfca",
                "ec95fa5acf5ed293a3b5e5bef3017b01d1ca6c0682f0bd67d96ca4dcb4380f74",
                "45df7587bc72ce55c9facbfc9f40822bc64f4f5b8b3b6d67a69362898c19f4e308929cc9472c6ed0a3022bdb2cf28d46cdb09d26634c406b7943e5ce42a8ec3b5bd0eaa4e6db66557a76ecab7d2a2bbda9ab22641aa1ae84867967e9b250be122fb214f0db71d8a7418a88a06a6e9d2afa11374032094c47410731853da8f764",
                "2d4b9f93ca5a482601cc54e4315012f049ff594268bd878f9e6296cdb92457a40b7bf52e0ea86507ab05d5cae79c6c345d4234a462e975483d9e8ffa42e975084e54912bbd110f8ef082f524f1c4fcae42547fce15a8b233c086b62be844ce1f685766946eadebf330f811bd6000c6d54c81f1202b4a5b99793bc95c7423e65d",
            ),
            (
                "8171c4d67e21d6a250235be986da8e3f",
                "10",
                "5477797774f15a78b691d443b14be3560b88f5b95977549508e85ebd7f31bb",
                "0a999af4e64b89473ae7ce0c1e06a03275e74f5640af8f15af291e04a097cd",
            ),
            (
                "04a05a65a232af79795b91dc8fc2cece9ca400063771b4b0361e05d0facf5a86",
                "f0b6952738d2d421160f70bbed85e85c859bccefb9dd57a9175db1ceafe426b512acf8396919c50d0550362a234982",
                "15179e4217ac277f35804a4974a7cf3405e2a4a9cdf87e06036c14f77f311990b8e46123e82abd387612cb71dea8f55e852d23e223c3275f11f679e3940d370b68a73489b85057daba267796764be1cb0c855a45c5a56ebece12f73aa253109adee0b242e53a633c6b9c8ae5afa4d5fc1b70e3afa11120266ba295f40ab358f07eefd0d9bf32a6ea68ec4293b091f0c9a1a32893643b3af67705b29cbc88619f9fd2011378e2f1a65ca03ee671c892838954903fd5477f659634850144c4135c9ee852154da089436614c36ffe95eee8ed281129cbeffb262937795cf3ca3da5c8bac2fa18358d19496622664fa10e9958da2938d8096ae9572ebd68deedd0",
                "98234a4e7b04c6af3b84275d5700669ff0a3396f83657d91add2dcef466d8868a4c7f9114c3ed7ba103bfecd10b370edfb246576a1344b626673ba9a29949d65f39f5615a14d2144842fb746137c653b8c17d0bffee6c3efdf597c2b0045d6376442d8bdd7f684fe5e20c58e0b0780c0d6ab3fc2b29652232f3a6df6aa46c30060ea9d11465c9a0b55ceb6e939bd62d712883629175a736d2be71cca67dd5347c7e9a17764194f58662210198d75c6ab4f3379b81c8feff4d72280b5a62180c724842dbd024df223a86fae68c9949d9bad1e453325a126ef3c30961dc72a47c46d81c7bb45c91737430f52975aa892c361d666f0ca9a30ef694f19c0053c77",
            ),
            (
                "d381721823ff6f4a2574290d518a0e13c1535d308dee750d14d669c915a90c60",
                "659bd4a87d291df4c4d69b6a28ab64e2628197c581aaf944c1725982af16c82c",
                "c76b526a10f0cc09c1121d6d21a678f505a3696091369857ba0c14ccf32d7303c6b25fc81627375dd00b87b250947b5804f4e07f6e578ec94184c1b17e4b91123a8b5d50827bcbd99ad94e1806239ed4a52098efb5dae5c08a6a837715841eae78949ddfb7d1ea67aab01415fa672184d3412aceba4b4ae89562a955f080adbdabafdd4fa57c1336ed5e4f72ad4bf1d0884eec2c88105eea12c0160129a3a055aa68f3e99d3b0d3b6decf8a02df0908d1ce288d42471f9b3c19fc5d67670c52e9cacdb90bd8372ba6eb5a55383a9a5bf7d060e3c2ad204b51e19380916d2821f751856b8960ba6f9cf62d9325da9d71dece4df1bbef136eee37bb52feef8533d6ab770a9fc9c5725f28910d3b8a88c30ae234f0e13664fe1b6c0e4f8ef93bd6e15856be360811d68d731878909abd5961df36d6780ca07315da7e4fb3ef29b335218c830fe2dca1e79927a605cb65887a436a267928ba4b7f186dfdcc07e8f63d2a2dc78eb4fd89647cab891f9f794215f9a9f5bb840414b66696a72d0cb70b793b5379605374fe58ca75a4e8bb784eac7fc196e1f5aa1ac187d523bb3346299e49e31043fc08d84177c25485267112767bb5a85ca56b25ce6ecd5963d15fcfb2225f413e5934b9a77f15218fa165e490345a808fab34192795033cad0d74255c39a0c4ed9a43c86809f53d1a42ed1bcf1546e93a465998edf29c0646307bbea",
                "9f7287c717fb201565b355a81c8e5232b1828dbfb59f100ae80c7062ef89b61f73cce4cc7a3a754a26e7f5d77b17392dd2276ef92f9ee2f6fa16c2f24926a75be7ca250e45a034c29a37797e7c58189410a87c48a9d763899e614d2634d9f0b12d172c6f7c350ebe77717c175bab70db2f540fa9c8f4f5ab52043ab803a7fd57455ebc77e1ee798c587b1ff775de681798858a185cd239787a6f266ee11391dddf0e6e67cc5153d8175ecea7e4affaf34f9f019b04e7fcf96adc1d0c9aaa3a7a7303dfbf3b82beb0b4a4cf07d7de7125c510ee0a15968b4ffeb828bd4acdeb9f5d00c1eee81644ece97bd6851729cf5820abf7ce6be7717d4fa8b0e97d70d60b2e20b11a6337aa2c94eed5f6582af47a4cbaf5e93c6f95135f96815bb562f2d78dbea13151e6fec9077d0f003a668c4b94aae556decd74a748676fedc96aefaf9ab7ae60fac03739a525e522ea8255683e30c35ab629737ab6fb34ee517c54e5014d7225324aa368809a89c511664c8c4450bed7a0eea6bb920ce6d78351b1696340f3f49284c43829fbb484a019751660bf0a9c89eeadb443f97139457c248330bbee28b0867bec93c1bfb9971b96efee5835611219da2577e5801a31279be4da8b7e514dcb01194fdc921a17d56bf450e306e4769f6500bd7ae26426f2e47e40f280ab62d5ef238bfb6f246e9b660ef41c241e1d269509943cb2b602a7d99a",
            ),
        ];
        check(vectors);
    }

    pub(super) fn check(vectors: &[(&str, &str, &str, &str)]) {
        for (i, (k, t, p, c)) in vectors.iter().enumerate() {
            let (k, t, p, c) = (hx(k), hx(t), hx(p), hx(c));
            let mut buf = p.clone();
            match k.len() {
                16 => Hctr2::<aes::Aes128>::new(&k).unwrap().encrypt(&t, &mut buf),
                24 => Hctr2::<aes::Aes192>::new(&k).unwrap().encrypt(&t, &mut buf),
                _ => Hctr2::<aes::Aes256>::new(&k).unwrap().encrypt(&t, &mut buf),
            }
            assert_eq!(hex::encode(&buf), hex::encode(&c), "vector {i}");
            match k.len() {
                16 => Hctr2::<aes::Aes128>::new(&k).unwrap().decrypt(&t, &mut buf),
                24 => Hctr2::<aes::Aes192>::new(&k).unwrap().decrypt(&t, &mut buf),
                _ => Hctr2::<aes::Aes256>::new(&k).unwrap().decrypt(&t, &mut buf),
            }
            assert_eq!(buf, p, "vector {i} decrypt");
        }
    }
}
