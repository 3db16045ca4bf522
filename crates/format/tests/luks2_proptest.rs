//! The LUKS2 header parser never panics: random mutations of a valid header (with the
//! checksum recomputed, so the JSON validation is reached), random JSON values in place of
//! metadata sections, and random bytes behind a valid magic must all give Ok or an error.

use cryptblk_format::hdrio::MemIo;
use cryptblk_format::luks2::binary::{seal, BinaryHeader};
use cryptblk_format::luks2::Luks2Header;
use proptest::prelude::*;
use serde_json::{json, Value};

const MDA: u64 = 0x4000;
const KEYSLOTS: u64 = 0x8000;

fn valid_json() -> Value {
    json!({
        "keyslots": {"0": {
            "type": "luks2", "key_size": 32,
            "af": {"type": "luks1", "stripes": 4000, "hash": "sha256"},
            "area": {"type": "raw", "offset": "32768", "size": "131072",
                     "encryption": "aes-xts-plain64", "key_size": 64},
            "kdf": {"type": "pbkdf2", "hash": "sha256", "iterations": 1000,
                    "salt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}
        }},
        "tokens": {"0": {"type": "x", "keyslots": ["0"]}},
        "segments": {"0": {"type": "crypt", "offset": "1048576", "size": "dynamic",
                           "iv_tweak": "0", "encryption": "aes-xts-plain64", "sector_size": 512}},
        "digests": {"0": {"type": "pbkdf2", "keyslots": ["0"], "segments": ["0"],
                          "hash": "sha256", "iterations": 1000,
                          "salt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                          "digest": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}},
        "config": {"json_size": "12288", "keyslots_size": "163840"}
    })
}

/// One header copy holding `json_text`, checksum sealed.
fn copy(secondary: bool, json_text: &[u8]) -> Vec<u8> {
    let bin = BinaryHeader {
        secondary,
        version: 2,
        hdr_size: MDA,
        seqid: 1,
        label: String::new(),
        checksum_alg: "sha256".into(),
        salt: [7; 64],
        uuid: "12a3a118-7039-4575-a649-3f559d8d87ee".into(),
        subsystem: String::new(),
        hdr_offset: if secondary { MDA } else { 0 },
    };
    let mut area = bin.encode();
    area.resize(MDA as usize, 0);
    let n = json_text.len().min(MDA as usize - 4096);
    area[4096..4096 + n].copy_from_slice(&json_text[..n]);
    seal("sha256", &mut area).unwrap();
    area
}

fn device(json_text: &[u8]) -> MemIo {
    let mut dev = copy(false, json_text);
    dev.extend(copy(true, json_text));
    dev.resize((2 * MDA + KEYSLOTS + 0x100000) as usize, 0);
    MemIo::new(dev)
}

#[test]
fn tiny_or_foreign_devices_are_not_luks() {
    for dev in [vec![], vec![0u8; 100], vec![0u8; 1 << 16]] {
        assert!(matches!(
            Luks2Header::read(&MemIo::new(dev)),
            Err(cryptblk_format::FormatError::NotLuks)
        ));
    }
}

#[test]
fn baseline_header_is_valid() {
    let text = serde_json::to_vec(&valid_json()).unwrap();
    let h = Luks2Header::read(&device(&text)).unwrap();
    assert_eq!(h.keyslots().len(), 1);
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n.to_string())),
        "[a-z0-9-]{0,12}".prop_map(Value::String),
        Just(json!("18446744073709551616")),
        Just(json!("-1")),
        Just(json!("dynamic")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[0-9a-z_]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const PATHS: &[&[&str]] = &[
    &["keyslots"],
    &["keyslots", "0"],
    &["keyslots", "0", "area"],
    &["keyslots", "0", "area", "offset"],
    &["keyslots", "0", "area", "size"],
    &["keyslots", "0", "kdf"],
    &["keyslots", "0", "af", "stripes"],
    &["keyslots", "0", "key_size"],
    &["keyslots", "0", "area", "key_size"],
    &["keyslots", "0", "area", "encryption"],
    &["keyslots", "0", "kdf", "iterations"],
    &["keyslots", "0", "af", "hash"],
    &["keyslots", "0", "priority"],
    &["digests", "0", "iterations"],
    &["digests", "0", "digest"],
    &["segments", "0", "integrity"],
    &["tokens", "0"],
    &["tokens", "0", "keyslots"],
    &["segments", "0"],
    &["segments", "0", "offset"],
    &["segments", "0", "size"],
    &["segments", "0", "sector_size"],
    &["segments", "0", "flags"],
    &["segments", "1"],
    &["digests", "0", "segments"],
    &["digests", "0", "keyslots"],
    &["config", "json_size"],
    &["config", "keyslots_size"],
    &["config", "requirements"],
    &["config", "flags"],
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_json_text_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut text = serde_json::to_vec(&valid_json()).unwrap();
        for (i, b) in edits {
            let at = i.index(text.len());
            text[at] = b;
        }
        if truncate {
            let at = cut.index(text.len());
            text.truncate(at);
        }
        let _ = Luks2Header::read(&device(&text)).map(|h| (h.dump(), h.dump_json()));
    }

    #[test]
    fn replaced_sections_never_panic(path in 0..PATHS.len(), value in json_value()) {
        let mut v = valid_json();
        let mut cur = &mut v;
        let p = PATHS[path];
        for k in &p[..p.len() - 1] {
            cur = &mut cur[*k];
        }
        cur[p[p.len() - 1]] = value;
        let text = serde_json::to_vec(&v).unwrap();
        if let Ok(h) = Luks2Header::read(&device(&text)) {
            let _ = h.dump();
            let _ = h.keyslots();
            let _ = h.crypt_segments();
            let _ = h.volume_key_size();
        }
    }

    #[test]
    fn random_bytes_after_magic_never_panic(body in prop::collection::vec(any::<u8>(), 0..20000)) {
        let mut dev = b"LUKS\xba\xbe\x00\x02".to_vec();
        dev.extend(body);
        let _ = Luks2Header::read(&MemIo::new(dev));
    }
}
