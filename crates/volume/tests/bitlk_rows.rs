//! Every `bitlk` row of cryptsetup's expected.tsv: the volume unlocked with the row's secret,
//! activated through the plan's dm table (run by cryptblk's own dm), must have the listed
//! filesystem UUID (blkid) and whole-device sha256; rows listing no UUID must be refused as
//! cryptsetup refuses them.

use cryptblk_format::bitlk::BitlkKey;
use cryptblk_volume::bitlk;
use std::collections::HashMap;

mod common;
use common::*;

#[test]
fn every_bitlk_row_behaves_as_listed() {
    let rows = expected_rows("bitlk");
    assert_eq!(rows.len(), 41, "bitlk rows in expected.tsv");
    let tmp = unpack_images("bitlk");
    // (image, volume key) -> (sha256, fs uuid): each image is read once.
    let mut seen: HashMap<(String, Vec<u8>), (String, String)> = HashMap::new();
    let mut passed = 0;
    for r in &rows {
        let (case, path, kind, secret, expect, value) = (&r[0], &r[2], &r[5], &r[6], &r[7], &r[8]);
        assert_eq!(expect, "open->fs_uuid;sha256(device)", "{case}");
        let (want_uuid, want_hash) = value.split_once(';').unwrap();
        let img = tmp.0.join(path);
        let h = bitlk::load(&img).unwrap_or_else(|e| panic!("{case}: {e}"));
        let file_secret;
        let key = match kind.as_str() {
            "passphrase" | "recovery_password" | "recovery_password_2" => {
                BitlkKey::Secret(secret.as_bytes())
            }
            "startup_key_file" => {
                file_secret = std::fs::read(tmp.0.join(secret)).unwrap();
                BitlkKey::Secret(&file_secret)
            }
            "none" => BitlkKey::None,
            k => panic!("{case}: secret kind {k}"),
        };
        let vk = bitlk::unlock(&h, &key).unwrap_or_else(|e| panic!("{case}: {e}"));
        let plan = bitlk::plan(&h, &vk, &img, "row", &[]);
        if want_hash.is_empty() {
            // The encrypt-on-write and partially encrypted images: cryptsetup 2.6 refuses
            // them (its test counts that as not applicable); so does cryptblk.
            let e = plan.err().unwrap_or_else(|| panic!("{case}: activated"));
            assert_eq!(e.code as i32, 1, "{case}");
            assert!(e.message.contains("encrypt-on-write"), "{case}: {e}");
            passed += 1;
            continue;
        }
        let plan = plan.unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = seen
            .entry((path.clone(), vk.as_bytes().to_vec()))
            .or_insert_with(|| {
                let copy = tmp.0.join("mapped");
                let (hash, size) = hash_and_copy("bitlk-row", &plan.table, &copy);
                assert_eq!(size, h.volume_size, "{case}");
                let uuid = blkid_uuid(&copy);
                std::fs::remove_file(&copy).unwrap();
                (hash, uuid)
            })
            .clone();
        assert_eq!(got.0, want_hash, "{case}: sha256 of the mapped device");
        assert_eq!(got.1, want_uuid, "{case}: filesystem UUID");
        passed += 1;
    }
    assert_eq!(passed, 41);
}
