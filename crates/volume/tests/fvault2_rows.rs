//! The `fvault2` rows of cryptsetup's expected.tsv: the image unlocked with the row's
//! passphrase must give the listed volume key, and the logical volume activated through the
//! plan's dm table (run by cryptblk's own dm) must have the listed filesystem UUID (blkid)
//! and whole-device sha256.

use cryptblk_volume::fvault2;

mod common;
use common::*;

#[test]
fn every_fvault2_row_behaves_as_listed() {
    let rows = expected_rows("fvault2");
    assert_eq!(rows.len(), 1, "fvault2 rows in expected.tsv");
    let tmp = unpack_images("fvault2");
    for r in &rows {
        let (case, path, kind, secret, expect, value) = (&r[0], &r[2], &r[5], &r[6], &r[7], &r[8]);
        assert_eq!(kind, "passphrase", "{case}");
        assert_eq!(expect, "volume_key;open->fs_uuid;sha256(device)", "{case}");
        let want: Vec<&str> = value.split(';').collect();
        let img = tmp.0.join(path);
        let h = fvault2::load(&img).unwrap_or_else(|e| panic!("{case}: {e}"));
        let vk = fvault2::unlock(&h, secret.as_bytes()).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(hex(vk.as_bytes()), want[0], "{case}: volume key");
        // A wrong passphrase is cryptsetup's EPERM (exit 2).
        let e = fvault2::unlock(&h, b"heslo124").unwrap_err();
        assert_eq!(e.code as i32, 2, "{case}: {e}");
        let plan =
            fvault2::plan(&h, &vk, &img, "row", &[]).unwrap_or_else(|e| panic!("{case}: {e}"));
        let copy = tmp.0.join("mapped");
        let (hash, size) = hash_and_copy("fvault2-row", &plan.table, &copy);
        assert_eq!(size, h.lv_size, "{case}: mapped size");
        assert_eq!(blkid_uuid(&copy), want[1], "{case}: filesystem UUID");
        assert_eq!(hash, want[2], "{case}: sha256 of the mapped device");
        std::fs::remove_file(&copy).unwrap();
    }
}
