//! The `fvault2` rows of cryptsetup's expected.tsv: the image unlocked with the row's
//! passphrase must give the listed volume key, and the logical volume activated through the
//! plan's dm table (run by cryptblk's own dm) must have the listed filesystem UUID (blkid)
//! and whole-device sha256.

use cryptblk_volume::fvault2;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn images_dir() -> PathBuf {
    match std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/cryptsetup-tests"
        )),
    }
}

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads the whole mapped device: its sha256 and size, and a sparse copy for blkid.
fn hash_and_copy(table: &str, copy: &Path) -> (String, u64) {
    use std::os::unix::fs::FileExt;
    let reg = cryptblk_dm::Registry::new();
    let dev = reg.create("fvault2-row", table).expect("table loads");
    let size = cryptblk_dm::BlockDevice::size(&*dev);
    let out = std::fs::File::create(copy).unwrap();
    out.set_len(size).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = buf.len().min((size - off) as usize);
        cryptblk_dm::BlockDevice::read_at(&*dev, off, &mut buf[..n]).unwrap();
        h.update(&buf[..n]);
        if buf[..n].iter().any(|&b| b != 0) {
            out.write_all_at(&buf[..n], off).unwrap();
        }
        off += n as u64;
    }
    drop(dev);
    reg.remove("fvault2-row").unwrap();
    (hex(&h.finalize()), size)
}

fn blkid_uuid(p: &Path) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID"])
        .arg(p)
        .output()
        .expect("blkid must be installed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn every_fvault2_row_behaves_as_listed() {
    let images = images_dir();
    let tsv = std::fs::read_to_string(images.join("expected.tsv")).expect("expected.tsv");
    let rows: Vec<Vec<String>> = tsv
        .lines()
        .skip(1)
        .map(|l| l.split('\t').map(str::to_string).collect())
        .filter(|r: &Vec<String>| r.len() >= 9 && r[3] == "fvault2")
        .collect();
    assert_eq!(rows.len(), 1, "fvault2 rows in expected.tsv");
    let tmp =
        Scratch(std::env::temp_dir().join(format!("cryptblk-fvault2-rows-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(images.join("fvault2-images.tar.xz"))
        .arg("-C")
        .arg(&tmp.0)
        .status()
        .unwrap();
    assert!(st.success());
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
        let (hash, size) = hash_and_copy(&plan.table, &copy);
        assert_eq!(size, h.lv_size, "{case}: mapped size");
        assert_eq!(blkid_uuid(&copy), want[1], "{case}: filesystem UUID");
        assert_eq!(hash, want[2], "{case}: sha256 of the mapped device");
        std::fs::remove_file(&copy).unwrap();
    }
}
