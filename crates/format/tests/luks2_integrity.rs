//! LUKS2 headers with an integrity-protected segment, made by cryptblk, read by the real
//! cryptsetup: `luksDump` text identical to cryptblk's (the `integrity:` line and the
//! keyslot key size = encryption + integrity key), `--dump-volume-key` gives the volume key
//! cryptblk generated, `--dump-json-metadata` shows cryptsetup's segment object, and the
//! passphrase unlocks.

mod luks2_common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header};
use luks2_common::*;
use std::path::Path;

const PW: &[u8] = b"integrity passphrase";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn cs_ok(args: &[&str], stdin: &[u8]) -> String {
    let (rc, out, err) = cryptsetup(args, stdin);
    assert_eq!(rc, 0, "cryptsetup {args:?} failed: {err}");
    out
}

struct Case {
    cipher: &'static str,
    integrity: &'static str,
    key_bits: usize,
    integrity_key_bits: Option<usize>,
    sector: u32,
    expect_vk_bits: usize,
    expect_tag: u32,
    expect_dm_cipher: &'static str,
}

const CASES: &[Case] = &[
    Case {
        cipher: "aes-xts-plain64",
        integrity: "hmac-sha256",
        key_bits: 512,
        integrity_key_bits: None,
        sector: 512,
        expect_vk_bits: 768,
        expect_tag: 32,
        expect_dm_cipher: "capi:authenc(hmac(sha256),xts(aes))-plain64",
    },
    Case {
        cipher: "aes-xts-random",
        integrity: "hmac-sha512",
        key_bits: 256,
        integrity_key_bits: None,
        sector: 4096,
        expect_vk_bits: 768,
        expect_tag: 80,
        expect_dm_cipher: "capi:authenc(hmac(sha512),xts(aes))-random",
    },
    Case {
        cipher: "aes-cbc-essiv:sha256",
        integrity: "hmac-sha1",
        key_bits: 128,
        integrity_key_bits: None,
        sector: 512,
        expect_vk_bits: 288,
        expect_tag: 20,
        expect_dm_cipher: "capi:authenc(hmac(sha1),cbc(aes))-essiv:sha256",
    },
    Case {
        cipher: "aes-gcm-random",
        integrity: "aead",
        key_bits: 256,
        integrity_key_bits: None,
        sector: 4096,
        expect_vk_bits: 256,
        expect_tag: 28,
        expect_dm_cipher: "capi:gcm(aes)-random",
    },
    Case {
        cipher: "chacha20-random",
        integrity: "poly1305",
        key_bits: 256,
        integrity_key_bits: None,
        sector: 512,
        expect_vk_bits: 256,
        expect_tag: 28,
        expect_dm_cipher: "capi:rfc7539(chacha20,poly1305)-random",
    },
    Case {
        cipher: "chacha20-plain64",
        integrity: "poly1305",
        key_bits: 256,
        integrity_key_bits: None,
        sector: 4096,
        expect_vk_bits: 256,
        expect_tag: 16,
        expect_dm_cipher: "capi:rfc7539(chacha20,poly1305)-plain64",
    },
];

#[test]
fn cryptblk_integrity_headers_read_by_cryptsetup() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("luks2-integrity");
    for (i, c) in CASES.iter().enumerate() {
        let name = format!("{}-{}-{}", c.cipher, c.integrity, c.sector);
        let img = dir.path(&format!("{i}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let f = open_rw(&img);
        let p = FormatParams {
            cipher: c.cipher.into(),
            key_size: c.key_bits / 8,
            sector_size: c.sector,
            data_offset: Some(4 << 20),
            integrity: Some(c.integrity.into()),
            integrity_key_size: c.integrity_key_bits.map(|b| b / 8),
            keyslot: KeyslotParams::new(
                PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000),
            ),
            ..FormatParams::default()
        };
        let (h, vk, _) = Luks2Header::format(&f, &p, PW).unwrap();
        assert_eq!(vk.len() * 8, c.expect_vk_bits, "{name}");

        // The real cryptsetup prints exactly what cryptblk prints.
        let dump = cs_ok(&["luksDump", s(&img)], b"");
        assert_eq!(dump, h.dump(), "{name}");
        let integ_kernel = match c.integrity {
            "hmac-sha256" => "hmac(sha256)",
            "hmac-sha512" => "hmac(sha512)",
            "hmac-sha1" => "hmac(sha1)",
            other => other,
        };
        assert!(
            dump.contains(&format!("\tintegrity: {integ_kernel}\n")),
            "{name}: {dump}"
        );
        assert!(
            dump.contains(&format!("\tKey:        {} bits\n", c.expect_vk_bits)),
            "{name}: {dump}"
        );

        // cryptsetup's view of the segment object.
        let json: serde_json::Value =
            serde_json::from_str(&cs_ok(&["luksDump", "--dump-json-metadata", s(&img)], b""))
                .unwrap();
        let seg = &json["segments"]["0"];
        assert_eq!(seg["integrity"]["type"], integ_kernel, "{name}");
        assert_eq!(seg["integrity"]["journal_encryption"], "none");
        assert_eq!(seg["integrity"]["journal_integrity"], "none");
        assert_eq!(seg["encryption"], c.cipher);
        assert_eq!(seg["sector_size"], c.sector);

        // Same volume key, and the passphrase opens the keyslot in cryptsetup.
        let (rc, out, err) = cryptsetup(
            &[
                "luksDump",
                "--dump-volume-key",
                "-q",
                "--key-file=-",
                s(&img),
            ],
            PW,
        );
        assert_eq!(rc, 0, "{name}: {err}");
        let hex: String = out
            .split("MK dump:")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(hex, vk.to_hex(), "{name}");
        cs_ok(&["open", "--test-passphrase", "--key-file=-", s(&img)], PW);

        // The activation layout cryptblk derives from the header.
        let l = Luks2Header::read(&f)
            .unwrap()
            .integrity_layout()
            .unwrap()
            .expect("integrity layout");
        assert_eq!(l.tag_size, c.expect_tag, "{name}");
        assert_eq!(l.dm_cipher, c.expect_dm_cipher, "{name}");
        assert_eq!(l.superblock_offset, 4 << 20);
        assert_eq!(l.encryption_key_size, c.key_bits / 8);
    }
}

#[test]
fn unsupported_integrity_combinations_are_refused() {
    let dir = Scratch::new("luks2-integrity-bad");
    let img = dir.path("x.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let f = open_rw(&img);
    for (cipher, integ, bits) in [
        ("aes-gcm-random", "hmac-sha256", 256),
        ("aes-xts-plain64", "aead", 512),
        ("aes-xts-plain64", "poly1305", 512),
        ("aes-xts-plain64", "crc32c", 512),
        ("aes-xts-plain64", "hmac-sha256", 200),
    ] {
        let p = FormatParams {
            cipher: cipher.into(),
            key_size: bits / 8,
            integrity: Some(integ.into()),
            ..FormatParams::default()
        };
        let e = Luks2Header::format(&f, &p, PW).unwrap_err();
        assert!(!e.to_string().is_empty(), "{cipher} {integ}");
    }
}
