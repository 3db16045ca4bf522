//! End-to-end check against ciphertext made by real cryptsetup and the Linux kernel:
//! cryptsetup's LUKS1 test images (serpent-xts, twofish-xts, aes-lrw, aes-xts-essiv:wp256,
//! aes-cbc-essiv, aes-xts), opened with their key file.
//!
//! Each image exercises the cipher twice: the keyslot material is encrypted with the spec
//! (sectors counted from the keyslot start), and only a bit-exact decryption yields the
//! master key whose PBKDF2 digest the header stores; the payload then has to decrypt to the
//! FAT file system whose volume id cryptsetup's test expects (DEAD-BABE).
//!
//! The LUKS1 parsing here is a minimal private test helper (header fields at fixed offsets,
//! AF merge), not the format layer's implementation. Images: CRYPTBLK_CRYPTSETUP_TESTS or
//! `<workspace>/../shared/cryptsetup-tests`; CRYPTBLK_SKIP_CRYPTSETUP_TESTS=1 skips.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::{open_cipher, SectorOptions};
use std::path::PathBuf;
use std::process::Command;

fn images_dir() -> Option<PathBuf> {
    if std::env::var("CRYPTBLK_SKIP_CRYPTSETUP_TESTS").as_deref() == Ok("1") {
        eprintln!("CRYPTBLK_SKIP_CRYPTSETUP_TESTS=1: skipping the LUKS1 image check");
        return None;
    }
    let shared = std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/cryptsetup-tests"
            ))
        });
    let archive = shared.join("luks1-images.tar.xz");
    assert!(
        archive.exists(),
        "{} is missing (CRYPTBLK_SKIP_CRYPTSETUP_TESTS=1 skips)",
        archive.display()
    );
    let dir = std::env::temp_dir().join(format!("cryptblk-cipher-luks1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = Command::new("tar")
        .arg("-xJf")
        .arg(&archive)
        .arg("-C")
        .arg(&dir)
        .status()
        .expect("tar (with xz) is required");
    assert!(ok.success(), "extracting {} failed", archive.display());
    Some(dir)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn cstr(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap()).into_owned()
}

/// LUKS1 anti-forensic merge: XOR the stripes, diffusing with the hash between them.
fn af_merge(material: &[u8], key_len: usize, stripes: usize, hash: HashAlgorithm) -> Vec<u8> {
    let mut d = vec![0u8; key_len];
    for i in 0..stripes - 1 {
        d.iter_mut()
            .zip(&material[i * key_len..])
            .for_each(|(a, b)| *a ^= b);
        let hl = hash.output_len();
        let mut next = Vec::with_capacity(key_len);
        for (j, chunk) in d.chunks(hl).enumerate() {
            let h = hash.digest(&[&(j as u32).to_be_bytes(), chunk]);
            next.extend_from_slice(&h[..chunk.len()]);
        }
        d = next;
    }
    d.iter_mut()
        .zip(&material[(stripes - 1) * key_len..])
        .for_each(|(a, b)| *a ^= b);
    d
}

/// Opens `image` with `passphrase`, returning (spec, decrypted first payload sectors).
fn open_image(image: &[u8], passphrase: &[u8]) -> (String, Vec<u8>) {
    assert_eq!(&image[..6], b"LUKS\xba\xbe");
    let spec = format!("{}-{}", cstr(&image[8..40]), cstr(&image[40..72]));
    let hash = HashAlgorithm::from_name(&cstr(&image[72..104])).unwrap();
    let payload = be32(image, 104) as usize * 512;
    let key_len = be32(image, 108) as usize;
    let (mk_digest, mk_salt, mk_iter) = (&image[112..132], &image[132..164], be32(image, 164));
    for slot in 0..8 {
        let ks = &image[208 + slot * 48..208 + (slot + 1) * 48];
        if be32(ks, 0) != 0x00AC_71F3 {
            continue;
        }
        let mut slot_key = vec![0u8; key_len];
        hash.pbkdf2(passphrase, &ks[8..40], be32(ks, 4), &mut slot_key);
        let (offset, stripes) = (be32(ks, 40) as usize * 512, be32(ks, 44) as usize);
        let len = (key_len * stripes).div_ceil(512) * 512;
        let mut material = image[offset..offset + len].to_vec();
        let c = open_cipher(&spec, &slot_key, &SectorOptions::default()).unwrap();
        c.decrypt(0, &mut material).unwrap();
        let mk = af_merge(&material, key_len, stripes, hash);
        let mut digest = [0u8; 20];
        hash.pbkdf2(&mk, mk_salt, mk_iter, &mut digest);
        if digest != mk_digest {
            continue;
        }
        let c = open_cipher(&spec, &mk, &SectorOptions::default()).unwrap();
        let mut data = image[payload..payload + 64 * 512].to_vec();
        c.decrypt(0, &mut data).unwrap();
        return (spec, data);
    }
    panic!("{spec}: no keyslot opened: the keyslot cipher output is wrong");
}

#[test]
fn cryptsetup_luks1_images_decrypt() {
    let Some(dir) = images_dir() else { return };
    let base = dir.join("luks1-images");
    let keyfile = std::fs::read(base.join("keyfile1")).unwrap();
    let mut seen = Vec::new();
    for name in [
        "luks1_serpent-xts-plain64-sha1.img",
        "luks1_serpent-xts-plain64-sha256.img",
        "luks1_twofish-xts-plain64-sha1.img",
        "luks1_twofish-xts-plain64-whirlpool.img",
        "luks1_aes-lrw-plain64-sha1.img",
        "luks1_aes-xts-essiv-wp256-whirlpool.img",
        "luks1_aes-cbc-essiv-sha256-sha1.img",
        "luks1_aes-xts-plain64-sha256.img",
    ] {
        let image = std::fs::read(base.join(name)).unwrap();
        let (spec, data) = open_image(&image, &keyfile);
        // FAT boot sector: 0x55AA signature, volume id (LE) at 0x27 = DEAD-BABE.
        assert_eq!(
            &data[510..512],
            &[0x55, 0xaa],
            "{name}: payload is no FAT boot sector"
        );
        assert_eq!(
            u32::from_le_bytes(data[0x27..0x2b].try_into().unwrap()),
            0xDEAD_BABE,
            "{name}"
        );
        seen.push(spec);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for s in [
        "serpent-xts-plain64",
        "twofish-xts-plain64",
        "aes-lrw-plain64",
        "aes-xts-essiv:wp256",
        "aes-cbc-essiv:sha256",
    ] {
        assert!(seen.iter().any(|x| x == s), "{s} not covered: {seen:?}");
    }
}
