//! Differential fuzzing of the hand-written AES-XTS paths (`aesni-xts`, `vaes-avx2-xts`,
//! `vaes-avx512-xts`, whichever the CPU has) against RustCrypto's XTS and, for 512-bit
//! keys, AWS-LC, through the registry as dm-crypt's `aes-xts-plain64`: the input chooses the
//! key size, key, sector size, start sector (the whole u64 range) and data; every path must
//! produce the reference ciphertext and decrypt it back.
#![no_main]

use cryptblk_cipher::xts_x86::{XtsAes, XtsPath};
use cryptblk_cipher::{open_cipher, SectorOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 1 + 64 + 8 {
        return;
    }
    let ctl = data[0];
    let key = &data[1..if ctl & 1 == 0 { 33 } else { 65 }];
    let start = u64::from_le_bytes(data[65..73].try_into().unwrap());
    let sector_size = 512usize << ((ctl >> 1) & 3);
    let per = (sector_size / 512) as u64;
    let start = start - start % per;
    let body = &data[73..];
    let len = body.len() / sector_size * sector_size;
    let plain: Vec<u8> = if len == 0 {
        // Short inputs still run one sector: the body repeated.
        (0..sector_size).map(|i| body.get(i % body.len().max(1)).copied().unwrap_or(0)).collect()
    } else {
        body[..len].to_vec()
    };
    let open = |imp: &str| {
        let opts = SectorOptions {
            sector_size,
            implementation: Some(imp.into()),
            ..Default::default()
        };
        open_cipher("aes-xts-plain64", key, &opts)
    };
    let mut want = plain.clone();
    open("rustcrypto").unwrap().encrypt(start, &mut want).unwrap();
    if key.len() == 64 {
        // AWS-LC refuses keys with equal halves; otherwise it must agree.
        if let Ok(c) = open("aws-lc") {
            let mut got = plain.clone();
            c.encrypt(start, &mut got).unwrap();
            assert_eq!(got, want, "aws-lc");
        }
    }
    for p in XtsPath::ALL.into_iter().filter(|p| p.available()) {
        let c = open(p.name()).unwrap();
        let mut got = plain.clone();
        c.encrypt(start, &mut got).unwrap();
        assert_eq!(got, want, "{} encrypt", p.name());
        c.decrypt(start, &mut got).unwrap();
        assert_eq!(got, plain, "{} decrypt", p.name());
    }
    // The AES-NI path's legacy SSE encodings (what a CPU without AVX runs), sector by sector
    // with plain64's tweak (the 512-byte sector number).
    if XtsPath::AesNi.available() {
        let x = XtsAes::new(XtsPath::AesNi, key).unwrap().with_sse_encoding();
        let tweak = |i: usize| u128::from(start.wrapping_add(i as u64 * per)).to_le_bytes();
        let mut got = plain.clone();
        for (i, s) in got.chunks_mut(sector_size).enumerate() {
            x.encrypt_unit(&tweak(i), s).unwrap();
        }
        assert_eq!(got, want, "aesni-xts (sse) encrypt");
        for (i, s) in got.chunks_mut(sector_size).enumerate() {
            x.decrypt_unit(&tweak(i), s).unwrap();
        }
        assert_eq!(got, plain, "aesni-xts (sse) decrypt");
    }
});
