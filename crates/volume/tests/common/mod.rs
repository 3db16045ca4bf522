//! What the expected.tsv row tests share: the images directory, the rows of one format, the
//! unpacked tarball, and the mapped device read back (sha256, size, a sparse copy for blkid).

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// cryptsetup's test images (`$CRYPTBLK_CRYPTSETUP_TESTS`, else ../shared/cryptsetup-tests).
pub fn images_dir() -> PathBuf {
    match std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/cryptsetup-tests"
        )),
    }
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The expected.tsv rows of `kind` (column 4), split into fields.
pub fn expected_rows(kind: &str) -> Vec<Vec<String>> {
    let tsv = std::fs::read_to_string(images_dir().join("expected.tsv")).expect("expected.tsv");
    tsv.lines()
        .skip(1)
        .map(|l| l.split('\t').map(str::to_string).collect())
        .filter(|r: &Vec<String>| r.len() >= 9 && r[3] == kind)
        .collect()
}

/// `<kind>-images.tar.xz` unpacked (sparse) into a scratch directory.
pub fn unpack_images(kind: &str) -> Scratch {
    let tmp =
        Scratch(std::env::temp_dir().join(format!("cryptblk-{kind}-rows-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let st = Command::new("tar")
        .arg("xJSf")
        .arg(images_dir().join(format!("{kind}-images.tar.xz")))
        .arg("-C")
        .arg(&tmp.0)
        .status()
        .unwrap();
    assert!(st.success());
    tmp
}

/// Reads the whole device `table` maps (as mapping `name` in cryptblk's own dm): its sha256
/// and size, and a sparse copy at `copy` for blkid.
pub fn hash_and_copy(name: &str, table: &str, copy: &Path) -> (String, u64) {
    use std::os::unix::fs::FileExt;
    let reg = cryptblk_dm::Registry::new();
    let dev = reg.create(name, table).expect("table loads");
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
    reg.remove(name).unwrap();
    (hex(&h.finalize()), size)
}

/// The filesystem UUID blkid probes in `p`.
pub fn blkid_uuid(p: &Path) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID"])
        .arg(p)
        .output()
        .expect("blkid must be installed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
