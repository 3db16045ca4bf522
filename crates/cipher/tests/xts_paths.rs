//! The hand-written AES-XTS paths (AES-NI, VAES+AVX2, VAES+AVX-512; AES-128-XTS and
//! AES-256-XTS) against IEEE 1619 vectors, RustCrypto's `xts-mode` + `aes`, AWS-LC's
//! AES-256-XTS and pyca/cryptography (OpenSSL's XTS).
//!
//! Every path the CPU has is tested (the hardware's own features, not `CRYPTBLK_CPU_MASK`:
//! a mask must not make these tests skip a path). python3 with `cryptography` is required;
//! set CRYPTBLK_SKIP_PYTHON=1 to skip that one test explicitly.

use aes::{Aes128, Aes256};
use cipher::KeyInit;
use cryptblk_cipher::xts_x86::{XtsAes, XtsPath};
use cryptblk_cipher::{open_cipher, SectorOptions};
use proptest::prelude::*;
use std::io::Write;
use std::process::{Command, Stdio};
use xts_mode::Xts128;

/// The paths this CPU's hardware runs (ignoring any mask), checked to be available.
fn paths() -> Vec<XtsPath> {
    use std::arch::is_x86_feature_detected as has;
    assert!(
        has!("aes") && has!("pclmulqdq"),
        "these tests need an x86-64 CPU with AES-NI"
    );
    let mut v = vec![XtsPath::AesNi];
    if has!("vaes") && has!("vpclmulqdq") && has!("avx2") {
        v.push(XtsPath::VaesAvx2);
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
            v.push(XtsPath::VaesAvx512);
        }
    }
    for p in &v {
        assert!(
            p.available(),
            "{} is on this CPU but not available (CRYPTBLK_CPU_MASK set for the tests?)",
            p.name()
        );
    }
    v
}

/// Every keyed variant of every path: the AES-NI path twice where the CPU has AVX (VEX
/// encodings, and the legacy SSE ones a CPU without AVX runs).
fn keyed(key: &[u8]) -> Vec<(String, XtsAes)> {
    let mut v = Vec::new();
    for p in paths() {
        let x = XtsAes::new(p, key).unwrap();
        if p == XtsPath::AesNi {
            assert_eq!(
                x.uses_vex(),
                std::arch::is_x86_feature_detected!("avx"),
                "aesni-xts: VEX exactly when the CPU has AVX"
            );
            if x.uses_vex() {
                let sse = XtsAes::new(p, key).unwrap().with_sse_encoding();
                assert!(!sse.uses_vex());
                v.push(("aesni-xts (sse)".to_string(), sse));
            }
        }
        v.push((p.name().to_string(), x));
    }
    v
}

fn pattern() -> String {
    let p: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    hex::encode(p)
}

/// IEEE 1619-2007 Annex B vectors: (name, key1 || key2, data unit sequence number,
/// plaintext, ciphertext).
fn vectors() -> Vec<(&'static str, String, u128, String, String)> {
    vec![
        (
            "vector 1 (AES-128)",
            "00".repeat(32),
            0,
            "00".repeat(32),
            "917cf69ebd68b2ec9b9fe9a3eadda692cd43d2f59598ed858c02c2652fbf922e".into(),
        ),
        (
            "vector 2 (AES-128)",
            "1111111111111111111111111111111122222222222222222222222222222222".into(),
            0x3333333333,
            "44".repeat(32),
            "c454185e6a16936e39334038acef838bfb186fff7480adc4289382ecd6d394f0".into(),
        ),
        (
            "vector 3 (AES-128)",
            "fffefdfcfbfaf9f8f7f6f5f4f3f2f1f022222222222222222222222222222222".into(),
            0x3333333333,
            "44".repeat(32),
            "af85336b597afc1a900b2eb21ec949d292df4c047e0b21532186a5971a227a89".into(),
        ),
        (
            "vector 4 (AES-128, 512 bytes)",
            "2718281828459045235360287471352631415926535897932384626433832795".into(),
            0,
            pattern(),
            concat!(
                "27a7479befa1d476489f308cd4cfa6e2a96e4bbe3208ff25287dd3819616e89c",
                "c78cf7f5e543445f8333d8fa7f56000005279fa5d8b5e4ad40e736ddb4d35412",
                "328063fd2aab53e5ea1e0a9f332500a5df9487d07a5c92cc512c8866c7e860ce",
                "93fdf166a24912b422976146ae20ce846bb7dc9ba94a767aaef20c0d61ad0265",
                "5ea92dc4c4e41a8952c651d33174be51a10c421110e6d81588ede82103a252d8",
                "a750e8768defffed9122810aaeb99f9172af82b604dc4b8e51bcb08235a6f434",
                "1332e4ca60482a4ba1a03b3e65008fc5da76b70bf1690db4eae29c5f1badd03c",
                "5ccf2a55d705ddcd86d449511ceb7ec30bf12b1fa35b913f9f747a8afd1b130e",
                "94bff94effd01a91735ca1726acd0b197c4e5b03393697e126826fb6bbde8ecc",
                "1e08298516e2c9ed03ff3c1b7860f6de76d4cecd94c8119855ef5297ca67e9f3",
                "e7ff72b1e99785ca0a7e7720c5b36dc6d72cac9574c8cbbc2f801e23e56fd344",
                "b07f22154beba0f08ce8891e643ed995c94d9a69c9f1b5f499027a78572aeebd",
                "74d20cc39881c213ee770b1010e4bea718846977ae119f7a023ab58cca0ad752",
                "afe656bb3c17256a9f6e9bf19fdd5a38fc82bbe872c5539edb609ef4f79c203e",
                "bb140f2e583cb2ad15b4aa5b655016a8449277dbd477ef2c8d6c017db738b18d",
                "eb4a427d1923ce3ff262735779a418f20a282df920147beabe421ee5319d0568"
            )
            .into(),
        ),
        (
            "vector 10 (AES-256, 512 bytes)",
            concat!(
                "2718281828459045235360287471352662497757247093699959574966967627",
                "3141592653589793238462643383279502884197169399375105820974944592"
            )
            .into(),
            0xff,
            pattern(),
            concat!(
                "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b",
                "5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd",
                "5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0",
                "c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca",
                "2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0",
                "b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f",
                "93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec",
                "583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a",
                "84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1",
                "505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae",
                "9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29",
                "a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac",
                "6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f",
                "645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed4385",
                "1ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa",
                "773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151"
            )
            .into(),
        ),
        (
            "vector 19 (AES-128, 512 bytes)",
            "e0e1e2e3e4e5e6e7e8e9eaebecedeeefc0c1c2c3c4c5c6c7c8c9cacbcccdcecf".into(),
            0xa987654321,
            pattern(),
            concat!(
                "38b45812ef43a05bd957e545907e223b954ab4aaf088303ad910eadf14b42be6",
                "8b2461149d8c8ba85f992be970bc621f1b06573f63e867bf5875acafa04e42cc",
                "bd7bd3c2a0fb1fff791ec5ec36c66ae4ac1e806d81fbf709dbe29e471fad3854",
                "9c8e66f5345d7c1eb94f405d1ec785cc6f6a68f6254dd8339f9d84057e01a177",
                "41990482999516b5611a38f41bb6478e6f173f320805dd71b1932fc333cb9ee3",
                "9936beea9ad96fa10fb4112b901734ddad40bc1878995f8e11aee7d141a2f5d4",
                "8b7a4e1e7f0b2c04830e69a4fd1378411c2f287edf48c6c4e5c247a19680f7fe",
                "41cefbd49b582106e3616cbbe4dfb2344b2ae9519391f3e0fb4922254b1d6d2d",
                "19c6d4d537b3a26f3bcc51588b32f3eca0829b6a5ac72578fb814fb43cf80d64",
                "a233e3f997a3f02683342f2b33d25b492536b93becb2f5e1a8b82f5b88334272",
                "9e8ae09d16938841a21a97fb543eea3bbff59f13c1a18449e398701c1ad51648",
                "346cbc04c27bb2da3b93a1372ccae548fb53bee476f9e9c91773b1bb19828394",
                "d55d3e1a20ed69113a860b6829ffa847224604435070221b257e8dff783615d2",
                "cae4803a93aa4334ab482a0afac9c0aeda70b45a481df5dec5df8cc0f423c77a",
                "5fd46cd312021d4b438862419a791be03bb4d97c0e59578542531ba466a83baf",
                "92cefc151b5cc1611a167893819b63fb8a6b18e86de60290fa72b797b0ce59f3"
            )
            .into(),
        ),
    ]
}

#[test]
fn ieee1619_vectors_every_path() {
    let paths = paths();
    for (name, key, seq, pt, ct) in vectors() {
        let key = hex::decode(key).unwrap();
        let (pt, ct) = (hex::decode(pt).unwrap(), hex::decode(ct).unwrap());
        let tweak = seq.to_le_bytes();
        for (label, x) in keyed(&key) {
            let mut buf = pt.clone();
            x.encrypt_unit(&tweak, &mut buf).unwrap();
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&ct),
                "{name} encrypt, {label}"
            );
            x.decrypt_unit(&tweak, &mut buf).unwrap();
            assert_eq!(buf, pt, "{name} decrypt, {label}");
        }
        for &p in &paths {
            let x = XtsAes::new(p, &key).unwrap();
            let mut buf = pt.clone();
            x.encrypt_unit(&tweak, &mut buf).unwrap();
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&ct),
                "{name} encrypt, {}",
                p.name()
            );
            x.decrypt_unit(&tweak, &mut buf).unwrap();
            assert_eq!(buf, pt, "{name} decrypt, {}", p.name());
            // Through the registry as dm-crypt's aes-xts-plain64: the tweak is the sector.
            if pt.len() == 512 {
                let opts = SectorOptions {
                    implementation: Some(p.name().into()),
                    ..Default::default()
                };
                let c = open_cipher("aes-xts-plain64", &key, &opts).unwrap();
                assert_eq!(c.implementation(), p.name());
                let mut buf = pt.clone();
                c.encrypt(seq as u64, &mut buf).unwrap();
                assert_eq!(buf, ct, "{name} via open_cipher, {}", p.name());
                c.decrypt(seq as u64, &mut buf).unwrap();
                assert_eq!(buf, pt);
            }
        }
    }
}

#[test]
fn partial_blocks_are_refused_untouched() {
    for p in paths() {
        let x = XtsAes::new(p, &[7u8; 32]).unwrap();
        for len in [0usize, 1, 15, 17, 31, 520, 4095] {
            let mut buf = vec![0x5au8; len];
            let err = x.encrypt_unit(&[0; 16], &mut buf).unwrap_err();
            assert!(err.to_string().contains("16-byte blocks"), "{err}");
            assert!(x.decrypt_unit(&[0; 16], &mut buf).is_err());
            assert!(
                buf.iter().all(|&b| b == 0x5a),
                "{} changed a refused buffer",
                p.name()
            );
        }
        assert!(XtsAes::new(p, &[7u8; 48]).is_err(), "48-byte key accepted");
    }
}

/// RustCrypto's XTS over one data unit (block by block: an independent reference).
fn reference(key: &[u8], tweak: [u8; 16], buf: &mut [u8], decrypt: bool) {
    let h = key.len() / 2;
    macro_rules! run {
        ($c:ty) => {{
            let x = Xts128::<$c>::new(
                <$c>::new_from_slice(&key[..h]).unwrap(),
                <$c>::new_from_slice(&key[h..]).unwrap(),
            );
            if decrypt {
                x.decrypt_sector(buf, tweak)
            } else {
                x.encrypt_sector(buf, tweak)
            }
        }};
    }
    match h {
        16 => run!(Aes128),
        32 => run!(Aes256),
        _ => unreachable!(),
    }
}

fn sector_sizes() -> impl Strategy<Value = usize> {
    prop_oneof![Just(512usize), Just(1024), Just(2048), Just(4096)]
}

/// Sector numbers spread over the whole range, most near 0 and near 2^64.
fn sector_numbers() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..1 << 20,
        (0u64..1 << 20).prop_map(|d| u64::MAX - d),
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Raw data units: any 16-byte tweak and any block count (also the per-block tail).
    #[test]
    fn raw_units_match_rustcrypto(
        wide in any::<bool>(),
        key in proptest::collection::vec(any::<u8>(), 64),
        tweak in any::<[u8; 16]>(),
        blocks in 1usize..300,
        seed in any::<u8>(),
    ) {
        let key = &key[..if wide { 64 } else { 32 }];
        let pt: Vec<u8> = (0..blocks * 16).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let mut want = pt.clone();
        reference(key, tweak, &mut want, false);
        for (label, x) in keyed(key) {
            let mut buf = pt.clone();
            x.encrypt_unit(&tweak, &mut buf).unwrap();
            prop_assert_eq!(&buf, &want, "{} encrypt", label);
            x.decrypt_unit(&tweak, &mut buf).unwrap();
            prop_assert_eq!(&buf, &pt, "{} decrypt", label);
        }
    }

    /// Whole dm-crypt requests (aes-xts-plain64, several sectors, sector numbers near 2^64)
    /// against RustCrypto and, for 512-bit keys, AWS-LC; in place and between buffers.
    #[test]
    fn sectors_match_rustcrypto_and_awslc(
        wide in any::<bool>(),
        key in proptest::collection::vec(any::<u8>(), 64),
        sector_size in sector_sizes(),
        count in 1usize..5,
        start in sector_numbers(),
        seed in any::<u8>(),
    ) {
        let key = &key[..if wide { 64 } else { 32 }];
        let per = (sector_size / 512) as u64;
        let start = start - start % per;
        let len = sector_size * count;
        let pt: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(73) ^ seed).collect();
        let open = |imp: &str| {
            let opts = SectorOptions {
                sector_size,
                implementation: Some(imp.into()),
                ..Default::default()
            };
            open_cipher("aes-xts-plain64", key, &opts).unwrap()
        };
        let mut want = pt.clone();
        open("rustcrypto").encrypt(start, &mut want).unwrap();
        // And sector by sector with xts-mode itself: the tweak is the 512-byte sector.
        for (i, s) in pt.chunks(sector_size).enumerate() {
            let mut one = s.to_vec();
            let sector = start.wrapping_add(i as u64 * per);
            reference(key, u128::from(sector).to_le_bytes(), &mut one, false);
            prop_assert_eq!(&one[..], &want[i * sector_size..(i + 1) * sector_size]);
        }
        if wide && key[..32] != key[32..] {
            let mut aws = pt.clone();
            open("aws-lc").encrypt(start, &mut aws).unwrap();
            prop_assert_eq!(&aws, &want, "aws-lc");
        }
        for p in paths() {
            let c = open(p.name());
            let mut buf = pt.clone();
            c.encrypt(start, &mut buf).unwrap();
            prop_assert_eq!(&buf, &want, "{} encrypt", p.name());
            let mut back = vec![0u8; len];
            c.decrypt_to(start, &buf, &mut back).unwrap();
            prop_assert_eq!(&back, &pt, "{} decrypt_to", p.name());
            let mut fwd = vec![0u8; len];
            c.encrypt_to(start, &pt, &mut fwd).unwrap();
            prop_assert_eq!(&fwd, &want, "{} encrypt_to", p.name());
        }
    }
}

/// pyca/cryptography (OpenSSL's AES-XTS) on random keys, tweaks near 2^64 and 2^128,
/// 512..4096-byte units: one Python process for all cases.
#[test]
fn every_path_matches_pyca() {
    if std::env::var_os("CRYPTBLK_SKIP_PYTHON").is_some() {
        eprintln!("CRYPTBLK_SKIP_PYTHON set: pyca cross-check skipped");
        return;
    }
    const SCRIPT: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
for line in sys.stdin:
    k, t, p = (bytes.fromhex(x) for x in line.split())
    e = Cipher(algorithms.AES(k), modes.XTS(t)).encryptor()
    print((e.update(p) + e.finalize()).hex())
"#;
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut cases = Vec::new();
    for i in 0..32 {
        let klen = if i % 2 == 0 { 32 } else { 64 };
        // pyca (OpenSSL) refuses XTS keys with equal halves; random ones never are.
        let key: Vec<u8> = (0..klen).map(|_| rnd() as u8).collect();
        let tweak: u128 = match i % 4 {
            0 => u128::from(u64::MAX - (rnd() % 1024)),
            1 => u128::MAX - u128::from(rnd() % 1024),
            2 => u128::from(rnd()) << 64 | u128::from(rnd()),
            _ => u128::from(rnd() % 4096),
        };
        let len = 512 << (i % 4);
        let pt: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        cases.push((key, tweak.to_le_bytes(), pt));
    }
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/install-deps.sh installs it with cryptography)");
    // Written from a thread: Python's answers fill the stdout pipe while we still write.
    let mut input = String::new();
    for (k, t, p) in &cases {
        input += &format!("{} {} {}\n", hex::encode(k), hex::encode(t), hex::encode(p));
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "python3 with cryptography failed");
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), cases.len());
    for ((k, t, p), want) in cases.iter().zip(&lines) {
        for (label, x) in keyed(k) {
            let mut buf = p.clone();
            x.encrypt_unit(t, &mut buf).unwrap();
            assert_eq!(
                &hex::encode(&buf),
                want,
                "{label} vs pyca, key {} bytes",
                k.len()
            );
            x.decrypt_unit(t, &mut buf).unwrap();
            assert_eq!(&buf, p);
        }
    }
}

/// `CRYPTBLK_CPU_MASK` hides paths from the registry's choice (run in a child process: the
/// mask is read once per process).
#[test]
fn cpu_mask_changes_the_default_path() {
    if let Ok(expect) = std::env::var("XTS_PATHS_CHILD_EXPECT") {
        let (k32, k64) = expect.split_once(',').unwrap();
        assert_eq!(
            cryptblk_cipher::default_implementation("aes-xts-plain64", 32).unwrap(),
            k32
        );
        assert_eq!(
            cryptblk_cipher::default_implementation("aes-xts-plain64", 64).unwrap(),
            k64
        );
        return;
    }
    let paths = paths();
    let mut cases = vec![
        ("aesni", "rustcrypto,rustcrypto"),
        ("vaes", "aesni-xts,aws-lc"),
    ];
    if paths.contains(&XtsPath::VaesAvx512) {
        cases.push(("avx512", "vaes-avx2-xts,vaes-avx2-xts"));
        // Unmasked: ours for AES-128-XTS (AWS-LC has none), AWS-LC's for AES-256-XTS.
        cases.push(("", "vaes-avx512-xts,aws-lc"));
    }
    for (mask, expect) in cases {
        let st = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cpu_mask_changes_the_default_path",
                "--nocapture",
            ])
            .env("CRYPTBLK_CPU_MASK", mask)
            .env("XTS_PATHS_CHILD_EXPECT", expect)
            .status()
            .unwrap();
        assert!(st.success(), "mask {mask}: expected {expect}");
    }
}

/// Requests of more sectors than one batch of encrypted tweaks (8 sectors): 9, 17 and 128
/// sectors, 512 and 4096 bytes, both key sizes, sector numbers wrapping past 2^64, in place
/// and between buffers, against RustCrypto.
#[test]
fn long_requests_cross_tweak_batches() {
    for key_len in [32usize, 64] {
        let key: Vec<u8> = (0..key_len).map(|i| (i * 7 + 3) as u8).collect();
        for (sector_size, count) in [(512usize, 9usize), (512, 128), (4096, 17)] {
            let len = sector_size * count;
            let pt: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(151) ^ (i >> 9) as u8)
                .collect();
            let start = (u64::MAX - 63) & !7;
            let open = |imp: &str| {
                let opts = SectorOptions {
                    sector_size,
                    implementation: Some(imp.into()),
                    ..Default::default()
                };
                open_cipher("aes-xts-plain64", &key, &opts).unwrap()
            };
            let mut want = pt.clone();
            open("rustcrypto").encrypt(start, &mut want).unwrap();
            for p in paths() {
                let what = format!("{} {key_len}-byte key, {count} x {sector_size}", p.name());
                let c = open(p.name());
                let mut buf = pt.clone();
                c.encrypt(start, &mut buf).unwrap();
                assert!(buf == want, "{what}: encrypt");
                let mut back = vec![0u8; len];
                c.decrypt_to(start, &buf, &mut back).unwrap();
                assert!(back == pt, "{what}: decrypt_to");
                let mut fwd = vec![0u8; len];
                c.encrypt_to(start, &pt, &mut fwd).unwrap();
                assert!(fwd == want, "{what}: encrypt_to");
                c.decrypt(start, &mut buf).unwrap();
                assert!(buf == pt, "{what}: decrypt");
            }
        }
    }
}
