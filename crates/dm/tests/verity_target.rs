//! The `verity` target against hash trees built by the real `veritysetup` (cryptsetup 2.6.x):
//! every block of an intact device reads back verified, flipped bits in data or hash blocks
//! fail the read with EIO and are counted, and the optional corruption modes behave as the
//! kernel documents. Set CRYPTBLK_SKIP_VERITYSETUP=1 to skip explicitly without the tool.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_dm::targets::verity::{CorruptionMode, VerityConfig, VerityTarget};
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions, Registry, Target, WriteFlags};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn tool_available() -> bool {
    match Command::new("veritysetup").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            if std::env::var("CRYPTBLK_SKIP_VERITYSETUP").as_deref() == Ok("1") {
                eprintln!("veritysetup missing: skipped because CRYPTBLK_SKIP_VERITYSETUP=1");
                false
            } else {
                panic!("veritysetup not found (set CRYPTBLK_SKIP_VERITYSETUP=1 to skip)");
            }
        }
    }
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("cryptblk-dmverity-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A volume formatted by veritysetup: paths, contents, root hash, parameters.
struct Volume {
    data: PathBuf,
    hash: PathBuf,
    contents: Vec<u8>,
    root: String,
    cfg: VerityConfig,
}

#[allow(clippy::too_many_arguments)]
fn veritysetup_format(
    dir: &TempDir,
    name: &str,
    contents: Vec<u8>,
    extra: &[&str],
    version: u32,
    bs: u32,
    hash: &str,
    salt: &str,
) -> Volume {
    let data = dir.path(&format!("{name}.data"));
    let hash_path = dir.path(&format!("{name}.hash"));
    std::fs::write(&data, &contents).unwrap();
    let out = Command::new("veritysetup")
        .arg("format")
        .arg(format!("--format={version}"))
        .arg(format!("--data-block-size={bs}"))
        .arg(format!("--hash-block-size={bs}"))
        .arg(format!("--hash={hash}"))
        .arg(format!("--salt={salt}"))
        .args(extra)
        .arg(&data)
        .arg(&hash_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "veritysetup format: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = text
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim()
        .to_string();
    let cfg = VerityConfig {
        version,
        data_block_size: bs,
        hash_block_size: bs,
        num_data_blocks: (contents.len() / bs as usize) as u64,
        hash_start_block: 1, // veritysetup's superblock occupies the first hash block
        algorithm: HashAlgorithm::from_name(hash).unwrap(),
        root_digest: hex::decode(&root).unwrap(),
        salt: if salt == "-" {
            vec![]
        } else {
            hex::decode(salt).unwrap()
        },
        mode: CorruptionMode::Eio,
        restart_on_error: false,
        ignore_zero_blocks: false,
        check_at_most_once: false,
    };
    Volume {
        data,
        hash: hash_path,
        contents,
        root,
        cfg,
    }
}

fn open(path: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(
        FileBacking::open(
            path,
            FileOptions {
                direct: false,
                read_only: true,
            },
        )
        .unwrap(),
    )
}

fn target(v: &Volume, cfg: VerityConfig) -> VerityTarget {
    let len = v.contents.len() as u64;
    VerityTarget::new(open(&v.data), "data", open(&v.hash), "hash", cfg, len).unwrap()
}

fn flip(path: &Path, at: u64, mask: u8) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ mask], at).unwrap();
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn intact_volumes_read_back_verified() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("intact");
    let cases: [(u32, u32, &str, &str, usize); 4] = [
        (
            1,
            4096,
            "sha256",
            "e48da609055204e89ae53b655ca2216dd983cf3cb829f34f63a297d106d53e2d",
            4 << 20,
        ),
        (0, 4096, "sha256", "abcd", (1 << 20) + 3 * 4096),
        (1, 1024, "sha1", "dadada", 1 << 20),
        (1, 512, "sha512", "-", 300 * 512),
    ];
    for (n, (version, bs, hash, salt, len)) in cases.into_iter().enumerate() {
        let v = veritysetup_format(
            &dir,
            &format!("v{n}"),
            pattern(len, n as u64 + 3),
            &[],
            version,
            bs,
            hash,
            salt,
        );
        let t = target(&v, v.cfg.clone());
        assert_eq!(t.size(), len as u64);
        let mut all = vec![0u8; len];
        // Read in odd-sized multi-block chunks to cross hash-block boundaries.
        let chunk = bs as usize * 37;
        let mut at = 0;
        while at < len {
            let n = chunk.min(len - at);
            t.read_at(at as u64, &mut all[at..at + n]).unwrap();
            at += n;
        }
        assert_eq!(all, v.contents, "case {n}");
        assert_eq!(t.corrupted_blocks(), 0);
        // Read-only target; misaligned reads are refused.
        assert_eq!(
            errno(
                &t.write_at(0, &all[..bs as usize], WriteFlags::default())
                    .unwrap_err()
            ),
            libc::EROFS
        );
        if bs > 512 {
            assert_eq!(
                errno(&t.read_at(512, &mut all[..512]).unwrap_err()),
                libc::EINVAL
            );
        }
    }
}

#[test]
fn table_line_maps_through_the_registry() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("table");
    let v = veritysetup_format(
        &dir,
        "t",
        pattern(1 << 20, 11),
        &[],
        1,
        4096,
        "sha256",
        "0102",
    );
    let reg = Registry::new();
    let table = format!(
        "0 2048 verity 1 {} {} 4096 4096 256 1 sha256 {} 0102 1 ignore_zero_blocks",
        v.data.display(),
        v.hash.display(),
        v.root
    );
    let m = reg.create("vt", &table).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    m.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, v.contents);
    let shown = m.table(false).as_str().to_owned();
    assert!(
        shown.contains(&format!("sha256 {} 0102 1 ignore_zero_blocks", v.root)),
        "{shown}"
    );
    // A wrong root hash makes every read fail.
    let bad = table.replace(&v.root, &"ab".repeat(32));
    let m2 = reg.create("vt2", &bad).unwrap();
    assert_eq!(
        errno(&m2.read_at(0, &mut buf[..4096]).unwrap_err()),
        libc::EIO
    );
    // Malformed lines are rejected with a message.
    assert!(reg
        .create("vt3", &table.replace(" sha256 ", " nohash "))
        .is_err());
    assert!(reg
        .create(
            "vt4",
            &table.replace(" 1 ignore_zero_blocks", " 2 ignore_zero_blocks")
        )
        .is_err());
}

#[test]
fn data_and_hash_corruption_fail_reads_with_eio() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("tamper");
    let len = 8 << 20;
    let v = veritysetup_format(
        &dir,
        "c",
        pattern(len, 21),
        &[],
        1,
        4096,
        "sha256",
        "e48da609",
    );
    // Data byte 3456 (block 0), as cryptsetup's verity-compat-test corrupts it.
    flip(&v.data, 3456, 0x01);
    let t = target(&v, v.cfg.clone());
    let mut b = vec![0u8; 4096];
    assert_eq!(errno(&t.read_at(0, &mut b).unwrap_err()), libc::EIO);
    assert_eq!(t.corrupted_blocks(), 1);
    t.read_at(4096, &mut b).unwrap();
    assert_eq!(b, v.contents[4096..8192]);
    // A multi-block read that covers the bad block fails as a whole.
    let mut big = vec![0u8; 16384];
    assert!(t.read_at(0, &mut big).is_err());
    assert_eq!(t.status_params(), "C");
    // veritysetup agrees that the device is corrupt.
    let ok = Command::new("veritysetup")
        .arg("verify")
        .arg(&v.data)
        .arg(&v.hash)
        .arg(&v.root)
        .output()
        .unwrap()
        .status
        .success();
    assert!(!ok);
    flip(&v.data, 3456, 0x01);

    // Hash byte 8193: first level-0 block (after superblock and the single top block); it
    // covers data blocks 0..128, so all of them now fail and the rest still read.
    flip(&v.hash, 8193, 0x80);
    let t = target(&v, v.cfg.clone());
    for blk in [0u64, 1, 127] {
        assert_eq!(
            errno(&t.read_at(blk * 4096, &mut b).unwrap_err()),
            libc::EIO,
            "block {blk}"
        );
    }
    t.read_at(128 * 4096, &mut b).unwrap();
    assert_eq!(b, v.contents[128 * 4096..129 * 4096]);
    assert_eq!(t.corrupted_blocks(), 3);
    flip(&v.hash, 8193, 0x80);

    // The top block (hash block 1) is checked against the root: everything fails.
    flip(&v.hash, 4096 + 100, 0x02);
    let t = target(&v, v.cfg.clone());
    assert!(t.read_at((len - 4096) as u64, &mut b).is_err());
}

#[test]
fn corruption_modes_and_options() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("modes");
    let mut contents = pattern(1 << 20, 31);
    contents[5 * 4096..6 * 4096].fill(0); // an all-zero block for ignore_zero_blocks
    let v = veritysetup_format(&dir, "m", contents, &[], 1, 4096, "sha256", "77");
    flip(&v.data, 2 * 4096 + 9, 0x10);
    let mut b = vec![0u8; 4096];

    // ignore_corruption: the (wrong) data is returned, the event counted.
    let t = target(
        &v,
        VerityConfig {
            mode: CorruptionMode::Ignore,
            ..v.cfg.clone()
        },
    );
    t.read_at(2 * 4096, &mut b).unwrap();
    assert_eq!(b[9], v.contents[2 * 4096 + 9] ^ 0x10);
    assert_eq!(t.corrupted_blocks(), 1);

    // restart_on_corruption: the first failure stops all further I/O.
    let t = target(
        &v,
        VerityConfig {
            mode: CorruptionMode::Restart,
            ..v.cfg.clone()
        },
    );
    t.read_at(0, &mut b).unwrap();
    assert!(t.read_at(2 * 4096, &mut b).is_err());
    assert!(t.is_failed());
    assert!(t.read_at(0, &mut b).is_err());

    // ignore_zero_blocks: a zero block reads as zeros even if its data was changed on disk.
    flip(&v.data, 5 * 4096 + 1, 0xff);
    let t = target(
        &v,
        VerityConfig {
            ignore_zero_blocks: true,
            ..v.cfg.clone()
        },
    );
    t.read_at(5 * 4096, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    let t = target(&v, v.cfg.clone());
    assert!(t.read_at(5 * 4096, &mut b).is_err());

    // check_at_most_once: a block verified once is not re-verified.
    let t = target(
        &v,
        VerityConfig {
            check_at_most_once: true,
            ..v.cfg.clone()
        },
    );
    t.read_at(7 * 4096, &mut b).unwrap();
    flip(&v.data, 7 * 4096, 0x01);
    t.read_at(7 * 4096, &mut b).unwrap();
    assert_eq!(t.corrupted_blocks(), 0);
    let t = target(&v, v.cfg.clone());
    assert!(t.read_at(7 * 4096, &mut b).is_err());
}

#[test]
fn hash_area_appended_to_the_data_device() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("append");
    let len = 2 << 20;
    let mut image = pattern(len, 41);
    image.resize(len + (64 << 10), 0);
    let data = dir.path("dev");
    std::fs::write(&data, &image).unwrap();
    let out = Command::new("veritysetup")
        .args([
            "format",
            "--hash-offset=2097152",
            "--data-blocks=512",
            "--salt=aa",
        ])
        .arg(&data)
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let root = text
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .unwrap()
        .trim();
    let reg = Registry::new();
    // hash_start_block = hash offset / 4096 + 1 (the superblock block).
    let table = format!(
        "0 4096 verity 1 {0} {0} 4096 4096 512 513 sha256 {root} aa",
        data.display()
    );
    let m = reg.create("ap", &table).unwrap();
    let mut buf = vec![0u8; len];
    m.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, image[..len]);
}
