//! Every `bitlk` row of cryptsetup's expected.tsv: the volume unlocked with the row's secret,
//! activated through the plan's dm table (run by cryptblk's own dm), must have the listed
//! filesystem UUID (blkid) and whole-device sha256; rows listing no UUID must be refused as
//! cryptsetup refuses them.

use cryptblk_format::bitlk::BitlkKey;
use cryptblk_volume::bitlk;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
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

/// Reads the whole mapped device: its sha256, and a sparse copy for blkid.
fn hash_and_copy(table: &str, copy: &Path) -> (String, u64) {
    use std::os::unix::fs::FileExt;
    let reg = cryptblk_dm::Registry::new();
    let dev = reg.create("bitlk-row", table).expect("table loads");
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
    reg.remove("bitlk-row").unwrap();
    (hex(&h.finalize()), size)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
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
fn every_bitlk_row_behaves_as_listed() {
    let images = images_dir();
    let tsv = std::fs::read_to_string(images.join("expected.tsv")).expect("expected.tsv");
    let rows: Vec<Vec<String>> = tsv
        .lines()
        .skip(1)
        .map(|l| l.split('\t').map(str::to_string).collect())
        .filter(|r: &Vec<String>| r.len() >= 9 && r[3] == "bitlk")
        .collect();
    assert_eq!(rows.len(), 41, "bitlk rows in expected.tsv");
    let tmp =
        Scratch(std::env::temp_dir().join(format!("cryptblk-bitlk-rows-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(images.join("bitlk-images.tar.xz"))
        .arg("-C")
        .arg(&tmp.0)
        .status()
        .unwrap();
    assert!(st.success());
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
                let (hash, size) = hash_and_copy(&plan.table, &copy);
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
