//! Plain mode: passphrase hashing against cryptsetup's own test expectations (api-test.c
//! HashDevicePlain) and against an independent Python (hashlib) model for keys longer than
//! the digest; raw key files; geometry.

mod common;

use common::*;
use cryptblk_format::plain::{plain_hash, PlainParams, PlainVolume};

#[test]
fn cryptsetup_api_test_vectors() {
    // sha256, 16-byte key, passphrase of 32 'x' (api-test.c).
    let k = plain_hash("sha256", &[b'x'; 32], 16).unwrap();
    assert_eq!(k.to_hex(), "c62e4615bd39e222572f3a1bf7c2132e");
    // The whole 40-byte key file "x"*32 + "A"*8.
    let mut pass = vec![b'x'; 32];
    pass.extend_from_slice(b"AAAAAAAA");
    let k = plain_hash("sha256", &pass, 16).unwrap();
    assert_eq!(k.to_hex(), "0e49cb34a1dee1df33f6505e4de44a66");
    // Legacy "plain" hash: the bytes themselves.
    let raw = hex::decode("aabbcaffeecaffeecaffeecaffeecaff").unwrap();
    assert_eq!(plain_hash("plain", &raw, 16).unwrap().as_bytes(), &raw[..]);
}

/// Keys longer than one digest, checked against a separate Python implementation of
/// cryptsetup's rule (hashlib, not our hash code).
#[test]
fn long_keys_match_independent_model() {
    if !require_tool("python3", "CRYPTBLK_SKIP_PYTHON") {
        return;
    }
    let script = r#"
import hashlib, sys
name, n, pw = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
out, r = b"", 0
while len(out) < n:
    out += hashlib.new(name, b"A" * r + pw).digest()
    r += 1
print(out[:n].hex())
"#;
    for (hash, len) in [
        ("ripemd160", 32),
        ("ripemd160", 64),
        ("sha256", 64),
        ("sha1", 48),
        ("sha512", 64),
    ] {
        let out = std::process::Command::new("python3")
            .args(["-c", script, hash, &len.to_string(), "my secret passphrase"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let got = plain_hash(hash, b"my secret passphrase", len)
            .unwrap()
            .to_hex();
        assert_eq!(got, want, "{hash}/{len}");
    }
}

#[test]
fn key_file_is_read_raw_with_offset() {
    let dir = TempDir::new("plain");
    let kf = dir.join("key");
    let bytes: Vec<u8> = (0u8..100).collect();
    std::fs::write(&kf, &bytes).unwrap();
    let p = PlainParams {
        cipher_spec: "aes-xts-plain64".into(),
        key_bytes: 64,
        offset_sectors: 16,
        iv_offset_sectors: 7,
        ..Default::default()
    };
    let v = PlainVolume::from_key_file(&p, &kf, 10, 1 << 20).unwrap();
    assert_eq!(v.volume_key.as_bytes(), &bytes[10..74]);
    assert_eq!(v.size_sectors, 2048 - 16);
    assert_eq!(v.cipher_spec, "aes-xts-plain64");
    assert_eq!((v.iv_offset_sectors, v.offset_sectors), (7, 16));
    // Too short after the offset: refused, as cryptsetup does.
    assert!(PlainVolume::from_key_file(&p, &kf, 50, 1 << 20).is_err());
}

#[test]
fn passphrase_defaults_match_cryptsetup_2_6() {
    let p = PlainParams::default();
    assert_eq!(p.cipher_spec, "aes-cbc-essiv:sha256");
    assert_eq!(p.key_bytes, 32);
    assert_eq!(p.hash, "ripemd160");
    let v = PlainVolume::from_passphrase(&p, b"pw", 4096).unwrap();
    assert_eq!(v.volume_key, plain_hash("ripemd160", b"pw", 32).unwrap());
    assert!(
        PlainVolume::from_passphrase(&PlainParams { key_bytes: 33, ..p }, b"pw", 4096).is_err()
    );
}
