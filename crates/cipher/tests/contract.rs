//! The SectorCipher contract, the registry, and known-answer tests for Serpent and Twofish.

use cryptblk_cipher::xts_x86::XtsPath;
use cryptblk_cipher::{
    default_implementation, implementations, measure, open_cipher, CipherError, SectorOptions,
};
use proptest::prelude::*;
use std::time::Duration;

fn opts(imp: &str) -> SectorOptions {
    SectorOptions {
        implementation: Some(imp.to_string()),
        ..Default::default()
    }
}

#[test]
fn misaligned_buffers_are_refused_untouched() {
    for spec in [
        "aes-xts-plain64",
        "aes-cbc-essiv:sha256",
        "serpent-xts-plain64",
    ] {
        let key = vec![3u8; if spec.contains("xts") { 64 } else { 32 }];
        let c = open_cipher(spec, &key, &SectorOptions::default()).unwrap();
        let mut buf = vec![7u8; 1000];
        let err = c.encrypt(0, &mut buf).unwrap_err();
        assert!(matches!(
            err,
            CipherError::Misaligned {
                len: 1000,
                sector_size: 512
            }
        ));
        assert!(buf.iter().all(|&b| b == 7));
        assert!(c.decrypt(0, &mut buf).is_err());
        assert!(buf.iter().all(|&b| b == 7));
    }
    let c = open_cipher(
        "aes-xts-plain64",
        &[1u8; 64],
        &SectorOptions {
            sector_size: 4096,
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = vec![9u8; 4096];
    assert!(matches!(
        c.encrypt(0, &mut buf[..2048]),
        Err(CipherError::Misaligned { .. })
    ));
    assert!(matches!(
        c.encrypt(4, &mut buf),
        Err(CipherError::MisalignedSector {
            sector: 4,
            sector_size: 4096
        })
    ));
    assert!(buf.iter().all(|&b| b == 9));
    assert_eq!(c.sector_size(), 4096);
}

#[test]
fn bad_parameters_are_refused() {
    assert!(matches!(
        open_cipher(
            "capi:xts(ecb(aes-generic))-plain64",
            &[0; 64],
            &SectorOptions::default()
        ),
        Err(CipherError::UnknownSpec(_))
    ));
    assert!(matches!(
        open_cipher("aes-xts-plain64", &[0; 16], &SectorOptions::default()),
        Err(CipherError::KeySize { got: 16, .. })
    ));
    assert!(matches!(
        open_cipher(
            "aes-xts-plain64",
            &[0; 64],
            &SectorOptions {
                sector_size: 2000,
                ..Default::default()
            }
        ),
        Err(CipherError::SectorSize(2000))
    ));
    assert!(matches!(
        open_cipher("aes-xts-plain64", &[0; 64], &opts("no-such")),
        Err(CipherError::NoImplementation(_))
    ));
    // AWS-LC has no AES-128-XTS and no Serpent.
    assert!(matches!(
        open_cipher("aes-xts-plain64", &[0; 32], &opts("aws-lc")),
        Err(CipherError::NoImplementation(_))
    ));
    assert!(matches!(
        open_cipher("serpent-cbc-plain64", &[0; 32], &opts("aws-lc")),
        Err(CipherError::NoImplementation(_))
    ));
    assert!(open_cipher("aes-cbc-essiv:sha1", &[0; 32], &SectorOptions::default()).is_err());
}

/// The hand-written AES-XTS path the registry prefers on this CPU (RustCrypto without
/// AES-NI).
fn best_xts_path() -> &'static str {
    XtsPath::ALL
        .into_iter()
        .rev()
        .find(|p| p.available())
        .map_or("rustcrypto", |p| p.name())
}

#[test]
fn registry_lists_and_prefers_the_fastest() {
    let list = implementations();
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "aws-lc",
            "vaes-avx512-xts",
            "vaes-avx2-xts",
            "aesni-xts",
            "rustcrypto",
            "hctr2",
            "adiantum",
            "null"
        ]
    );
    assert!(list.iter().all(|i| !i.algorithms.is_empty()));
    for i in &list {
        let path = XtsPath::ALL.into_iter().find(|p| p.name() == i.name);
        assert_eq!(
            i.available,
            path.is_none_or(|p| p.available()),
            "{}",
            i.name
        );
    }
    assert_eq!(
        default_implementation("aes-cbc-plain64", 32).unwrap(),
        "aws-lc"
    );
    assert_eq!(
        default_implementation("aes-xts-plain64", 64).unwrap(),
        "aws-lc"
    );
    // AWS-LC has no AES-128-XTS: the fastest hand-written path the CPU has.
    assert_eq!(
        default_implementation("aes-xts-plain64", 32).unwrap(),
        best_xts_path()
    );
    assert_eq!(
        default_implementation("twofish-xts-plain64", 64).unwrap(),
        "rustcrypto"
    );
    assert_eq!(
        default_implementation("cipher_null-ecb", 0).unwrap(),
        "null"
    );
    assert_eq!(
        default_implementation("aes-hctr2-plain64", 32).unwrap(),
        "hctr2"
    );
    assert_eq!(
        default_implementation("xchacha20,aes-adiantum-plain64", 32).unwrap(),
        "adiantum"
    );
    assert_eq!(
        default_implementation("aria-xts-plain64", 64).unwrap(),
        "rustcrypto"
    );
    for i in &list {
        let expect = matches!(
            i.name.as_str(),
            "aws-lc" | "rustcrypto" | "hctr2" | "adiantum" | "null"
        ) || i.name == best_xts_path();
        assert_eq!(i.selected_by_default, expect, "{}", i.name);
    }
    let c = open_cipher(
        "aes-xts-plain64",
        &(0..64u8).collect::<Vec<_>>(),
        &SectorOptions::default(),
    )
    .unwrap();
    assert_eq!(c.implementation(), "aws-lc");
}

#[test]
fn equal_xts_halves_fall_back_from_aws_lc() {
    // The kernel accepts an XTS key whose halves are equal; AWS-LC refuses it.
    let key = [0x42u8; 64];
    let c = open_cipher("aes-xts-plain64", &key, &SectorOptions::default()).unwrap();
    assert_eq!(c.implementation(), best_xts_path());
    assert!(open_cipher("aes-xts-plain64", &key, &opts("aws-lc")).is_err());
}

#[test]
fn measure_reports_both_directions() {
    let t = measure("aes-xts-plain64", 64, 512, None, Duration::from_millis(20)).unwrap();
    assert!(t.encrypt_mb_s > 0.0 && t.decrypt_mb_s > 0.0);
    assert!(measure(
        "aes-xts-plain64",
        64,
        512,
        Some("bogus"),
        Duration::from_millis(1)
    )
    .is_err());
}

/// First ciphertext block of sector 0 with a zero IV (`-cbc-plain` at sector 0) is the bare
/// block cipher's output: published ECB vectors check our key and byte-order wiring.
fn first_block(spec: &str, key: &str) -> String {
    let key = hex::decode(key).unwrap();
    let c = open_cipher(spec, &key, &SectorOptions::default()).unwrap();
    let mut buf = vec![0u8; 512];
    c.encrypt(0, &mut buf).unwrap();
    hex::encode(&buf[..16])
}

#[test]
fn serpent_nessie_vectors() {
    // NESSIE Serpent set 1 vector 0 (the kernel's byte order).
    let k128 = "80000000000000000000000000000000";
    assert_eq!(
        first_block("serpent-cbc-plain", k128),
        "264e5481eff42a4606abda06c0bfda3d"
    );
    assert_eq!(
        first_block("serpent-ecb", k128),
        "264e5481eff42a4606abda06c0bfda3d"
    );
    let k256 = format!("80{}", "0".repeat(62));
    assert_eq!(
        first_block("serpent-cbc-plain64", &k256),
        "a223aa1288463c0e2be38ebd825616c0"
    );
}

#[test]
fn twofish_paper_vectors() {
    // Twofish paper, zero key and plaintext, 128- and 256-bit keys.
    assert_eq!(
        first_block("twofish-cbc-plain", &"0".repeat(32)),
        "9f589f5cf6122c32b6bfec2f2ae8c35a"
    );
    assert_eq!(
        first_block("twofish-ecb", &"0".repeat(64)),
        "57ff739d4dc92c1bd7fc01700cc8216f"
    );
}

#[test]
fn serpent_and_twofish_modes_round_trip() {
    for spec in [
        "serpent-xts-plain64",
        "twofish-xts-plain64",
        "serpent-cbc-essiv:sha256",
        "twofish-cbc-essiv:sha256",
        "serpent-lrw-benbi",
        "twofish-xts-plain64be",
    ] {
        let key: Vec<u8> = (0..64u8).collect();
        let key = &key[..cryptblk_cipher::CipherSpec::parse(spec)
            .unwrap()
            .default_key_size()];
        let c = open_cipher(spec, key, &SectorOptions::default()).unwrap();
        let plain: Vec<u8> = (0..2048u32).map(|i| (i * 7) as u8).collect();
        let mut buf = plain.clone();
        c.encrypt(8, &mut buf).unwrap();
        assert_ne!(buf, plain);
        // Different sectors get different ciphertext for the same plaintext.
        assert_ne!(buf[..512], buf[512..1024]);
        c.decrypt(8, &mut buf).unwrap();
        assert_eq!(buf, plain, "{spec}");
    }
}

fn xts_key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 64)
        .prop_filter("AWS-LC refuses equal halves", |k| k[..32] != k[32..])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// AWS-LC and RustCrypto agree on every AES spec both support.
    #[test]
    fn aws_lc_equals_rustcrypto(
        key in xts_key(),
        spec_idx in 0usize..5,
        cbc_key_len in prop::sample::select(vec![16usize, 24, 32]),
        shift in 0u32..4,
        start in any::<u32>(),
        sectors in 1usize..6,
        iv_offset in 0u64..100_000,
        large in any::<bool>(),
        seed in any::<u8>(),
    ) {
        let specs = ["aes-xts-plain64", "aes-xts-essiv:sha256", "aes-cbc-plain64", "aes-cbc-essiv:sha256", "aes-cbc-benbi"];
        let spec = specs[spec_idx];
        let key = if spec.contains("xts") { &key[..] } else { &key[..cbc_key_len] };
        let sector_size = 512usize << shift;
        let per = (sector_size / 512) as u64;
        let start = u64::from(start) / per * per;
        let plain: Vec<u8> = (0..sector_size * sectors).map(|i| (i as u8).wrapping_mul(seed | 1)).collect();
        let mut out = Vec::new();
        for imp in ["aws-lc", "rustcrypto"] {
            let o = SectorOptions { sector_size, iv_offset, iv_large_sectors: large, implementation: Some(imp.into()) };
            let c = open_cipher(spec, key, &o).unwrap();
            let mut buf = plain.clone();
            c.encrypt(start, &mut buf).unwrap();
            let enc = buf.clone();
            c.decrypt(start, &mut buf).unwrap();
            prop_assert_eq!(&buf, &plain);
            out.push(enc);
        }
        prop_assert!(out[0] == out[1], "{} differs between aws-lc and rustcrypto", spec);
    }
}

/// One cipher shared by several threads (as dm's queued pipeline does) gives the same bytes
/// as sequential use: AWS-LC's per-caller contexts must not mix IVs or directions.
#[test]
fn shared_between_threads() {
    use std::sync::Arc;
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(71) ^ 0x13).collect();
    for spec in [
        "aes-xts-plain64",
        "aes-cbc-essiv:sha256",
        "twofish-xts-plain64",
    ] {
        let key = &key[..if spec.contains("xts") { 64 } else { 32 }];
        let c: Arc<dyn cryptblk_cipher::SectorCipher> =
            Arc::from(open_cipher(spec, key, &SectorOptions::default()).unwrap());
        let plain: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let reference: Vec<Vec<u8>> = (0..4u64)
            .map(|t| {
                let mut b = plain.clone();
                c.encrypt(t * 1000, &mut b).unwrap();
                b
            })
            .collect();
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (c, plain, want) = (c.clone(), plain.clone(), reference[t as usize].clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let mut b = plain.clone();
                        c.encrypt(t * 1000, &mut b).unwrap();
                        assert!(b == want);
                        c.decrypt(t * 1000, &mut b).unwrap();
                        assert!(b == plain);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .expect("thread failed: results differed under concurrency");
        }
    }
}

/// `encrypt_to`/`decrypt_to` give exactly the bytes of the in-place calls, leave the source
/// unchanged, and refuse buffers of different lengths, for every implementation and mode.
#[test]
fn copying_calls_equal_in_place_calls() {
    let specs = [
        ("aes-xts-plain64", 64),
        ("aes-cbc-essiv:sha256", 32),
        ("aes-lrw-benbi", 48),
        ("aes-ecb", 32),
        ("serpent-xts-plain64", 64),
        ("twofish-cbc-plain64", 32),
        ("cipher_null-ecb", 0),
        ("aes-hctr2-plain64", 32),
        ("xchacha12,aes-adiantum-plain64", 32),
        ("aria-xts-plain64", 64),
    ];
    let mut checked = 0;
    for imp in implementations() {
        for (spec, key_len) in specs {
            let key: Vec<u8> = (0..key_len).map(|i| (i * 7 + 1) as u8).collect();
            for sector_size in [512usize, 4096] {
                let o = SectorOptions {
                    sector_size,
                    implementation: Some(imp.name.clone()),
                    ..Default::default()
                };
                let Ok(c) = open_cipher(spec, &key, &o) else {
                    continue; // not every implementation has every cipher
                };
                let plain: Vec<u8> = (0..3 * 4096).map(|i| (i * 13 % 251) as u8).collect();
                let mut in_place = plain.clone();
                c.encrypt(8, &mut in_place).unwrap();
                let mut copied = vec![0u8; plain.len()];
                c.encrypt_to(8, &plain, &mut copied).unwrap();
                assert_eq!(copied, in_place, "{spec} {} {sector_size}", imp.name);
                let mut back = vec![0u8; plain.len()];
                let cipher_text = copied.clone();
                c.decrypt_to(8, &cipher_text, &mut back).unwrap();
                assert_eq!(back, plain, "{spec} {} {sector_size}", imp.name);
                assert_eq!(cipher_text, copied, "source must stay unchanged");
                assert!(c.decrypt_to(8, &cipher_text[..512], &mut back).is_err());
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 16,
        "only {checked} cipher/implementation pairs opened"
    );
}
