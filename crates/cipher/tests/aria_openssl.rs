//! ARIA as dm-crypt runs it (`aria-xts-plain64`, `aria-cbc-essiv:sha256`), judged by the
//! `openssl` command line (OpenSSL's ARIA): the kernel lab's kernel has no ARIA and pyca has
//! none, so XTS is built by hand here over `openssl enc -aria-N-ecb` (IEEE 1619: tweak
//! `T = E_k2(IV)`, `C_j = E_k1(P_j ^ T*x^j) ^ T*x^j`), and ESSIV's IVs over `openssl dgst`
//! and ARIA-ECB, with the chaining done by `openssl enc -aria-N-cbc`.

use cryptblk_cipher::{open_cipher, SectorOptions};
use std::io::Write;
use std::process::{Command, Stdio};

fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl must be installed (scripts/install-deps.sh)");
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `openssl enc -aria-{bits}-ecb` without padding.
fn aria_ecb(key: &[u8], data: &[u8]) -> Vec<u8> {
    let alg = format!("-aria-{}-ecb", key.len() * 8);
    let k = hex::encode(key);
    openssl(&["enc", &alg, "-K", &k, "-nopad"], data)
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(73).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn plain64(sector: u64) -> [u8; 16] {
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&sector.to_le_bytes());
    iv
}

fn mul_x(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 }
}

/// aria-xts-plain64 (both key sizes, 512- and 4096-byte sectors) equals XTS built by hand
/// over OpenSSL's ARIA, and decrypts back.
#[test]
fn aria_xts_plain64_equals_openssl_aria_by_hand() {
    for (key_len, sector_size, first) in [(32usize, 512usize, 5u64), (64, 512, 77), (64, 4096, 8)] {
        let key = bytes(key_len as u8, key_len);
        let (k1, k2) = key.split_at(key_len / 2);
        let sectors = 3;
        let data = bytes(9, sectors * sector_size);
        let opts = SectorOptions {
            sector_size,
            ..Default::default()
        };
        let c = open_cipher("aria-xts-plain64", &key, &opts).unwrap();
        let mut ours = data.clone();
        c.encrypt(first, &mut ours).unwrap();

        // IV sectors count 512-byte units.
        let step = (sector_size / 512) as u64;
        let ivs: Vec<u8> = (0..sectors as u64)
            .flat_map(|i| plain64(first + i * step))
            .collect();
        let tweaks = aria_ecb(k2, &ivs);
        let mut masks = Vec::with_capacity(data.len() / 16);
        let mut xored = Vec::with_capacity(data.len());
        for (s, sector) in data.chunks(sector_size).enumerate() {
            let mut t = u128::from_le_bytes(tweaks[s * 16..s * 16 + 16].try_into().unwrap());
            for block in sector.chunks(16) {
                let p = u128::from_le_bytes(block.try_into().unwrap());
                xored.extend_from_slice(&(p ^ t).to_le_bytes());
                masks.push(t);
                t = mul_x(t);
            }
        }
        let enc = aria_ecb(k1, &xored);
        let expected: Vec<u8> = enc
            .chunks(16)
            .zip(&masks)
            .flat_map(|(b, t)| (u128::from_le_bytes(b.try_into().unwrap()) ^ t).to_le_bytes())
            .collect();
        assert!(
            ours == expected,
            "aria-xts-plain64, {key_len}-byte key, {sector_size}-byte sectors"
        );
        c.decrypt(first, &mut ours).unwrap();
        assert!(ours == data);
    }
}

/// aria-cbc-essiv:sha256 equals OpenSSL's ARIA-CBC with ESSIV IVs made by OpenSSL
/// (`sha256(key)` keys ARIA-256-ECB over the plain64 sector number).
#[test]
fn aria_cbc_essiv_sha256_equals_openssl() {
    for key_len in [16usize, 32] {
        let key = bytes(40 + key_len as u8, key_len);
        let data = bytes(3, 2 * 512);
        let c = open_cipher("aria-cbc-essiv:sha256", &key, &SectorOptions::default()).unwrap();
        let first = 1000u64;
        let mut ours = data.clone();
        c.encrypt(first, &mut ours).unwrap();

        let salt = openssl(&["dgst", "-sha256", "-binary"], &key);
        let alg = format!("-aria-{}-cbc", key_len * 8);
        let k = hex::encode(&key);
        for (i, sector) in data.chunks(512).enumerate() {
            let iv = aria_ecb(&salt, &plain64(first + i as u64));
            let expected = openssl(
                &["enc", &alg, "-K", &k, "-iv", &hex::encode(&iv), "-nopad"],
                sector,
            );
            assert!(
                ours[i * 512..(i + 1) * 512] == expected[..],
                "aria-cbc-essiv:sha256, {key_len}-byte key, sector {i}"
            );
        }
        c.decrypt(first, &mut ours).unwrap();
        assert!(ours == data);
    }
}

/// HCTR2 and Adiantum through the registry: each sector is one wide-block message whose
/// tweak is the 32-byte plain64 IV, so changing one byte of a sector changes all of it (a
/// wide-block property XTS lacks), and decryption restores the data. Their exact bytes
/// are checked against the designers' vectors in the crate's unit tests, and Adiantum's
/// against the kernel in tests/lab/wide-ciphers.sh.
#[test]
fn wide_block_ciphers_through_the_registry() {
    for (spec, key_len) in [
        ("aes-hctr2-plain64", 32usize),
        ("aes-hctr2-plain64", 16),
        ("xchacha12,aes-adiantum-plain64", 32),
        ("xchacha20,aes-adiantum-plain64", 32),
        ("capi:adiantum(xchacha12,aes)-plain64", 32),
    ] {
        for sector_size in [512usize, 4096] {
            let key = bytes(7, key_len);
            let opts = SectorOptions {
                sector_size,
                ..Default::default()
            };
            let c = open_cipher(spec, &key, &opts).unwrap();
            let data = bytes(1, sector_size).repeat(2);
            let mut a = data.clone();
            c.encrypt(0, &mut a).unwrap();
            let mut b = data.clone();
            b[sector_size - 1] ^= 1;
            c.encrypt(0, &mut b).unwrap();
            let differing = a[..sector_size]
                .iter()
                .zip(&b[..sector_size])
                .filter(|(x, y)| x != y)
                .count();
            assert!(
                differing > sector_size * 9 / 10,
                "{spec}: one flipped bit changed only {differing} bytes of the sector"
            );
            assert_eq!(a[sector_size..], b[sector_size..], "{spec}: other sector");
            // The tweak is the sector number: the same data in two sectors differs.
            assert_ne!(a[..sector_size], a[sector_size..]);
            c.decrypt(0, &mut a).unwrap();
            assert!(a == data, "{spec} round trip");
        }
    }
}
