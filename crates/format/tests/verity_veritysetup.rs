//! Compatibility with the real `veritysetup` (cryptsetup 2.6.x), both ways, on plain files:
//! trees built by veritysetup verify with cryptblk (same root hash, same superblock, same
//! hash-device bytes), trees built by cryptblk pass `veritysetup verify` and dump the same,
//! and tampering is caught by both. Set CRYPTBLK_SKIP_VERITYSETUP=1 to skip explicitly when
//! the tool is missing.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::verity::{self, VerityParams, VeritySuperblock};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

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
        let p = std::env::temp_dir().join(format!(
            "cryptblk-verity-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
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

/// Deterministic non-trivial contents (xorshift), so every block differs.
fn write_pattern(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    std::fs::write(path, v).unwrap();
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

fn veritysetup(args: &[&str]) -> (bool, String) {
    let out = Command::new("veritysetup").args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn field<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .map(|r| r.trim_start_matches(':').trim())
        })
        .unwrap_or_else(|| panic!("no '{name}' in veritysetup output:\n{text}"))
}

struct Case {
    format: u32,
    hash: &'static str,
    data_bs: u32,
    hash_bs: u32,
    salt: &'static str,
    data_len: usize,
}

const CASES: [Case; 5] = [
    Case {
        format: 1,
        hash: "sha256",
        data_bs: 4096,
        hash_bs: 4096,
        salt: "00112233445566778899aabbccddeeff",
        data_len: 3 << 20,
    },
    Case {
        format: 1,
        hash: "sha1",
        data_bs: 1024,
        hash_bs: 512,
        salt: "dadada",
        data_len: 1 << 20,
    },
    Case {
        format: 0,
        hash: "sha256",
        data_bs: 4096,
        hash_bs: 4096,
        salt: "beef",
        data_len: (2 << 20) + 4096 * 3,
    },
    Case {
        format: 1,
        hash: "sha512",
        data_bs: 512,
        hash_bs: 4096,
        salt: "-",
        data_len: 700 * 512,
    },
    Case {
        format: 1,
        hash: "sha256",
        data_bs: 4096,
        hash_bs: 4096,
        salt: "01",
        data_len: 4096,
    },
];

#[test]
fn trees_built_by_veritysetup_verify_with_cryptblk() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("a");
    for (n, c) in CASES.iter().enumerate() {
        let data = dir.path(&format!("data{n}"));
        let hash = dir.path(&format!("hash{n}"));
        write_pattern(&data, c.data_len, n as u64 + 7);
        let (ok, out) = veritysetup(&[
            "format",
            &format!("--format={}", c.format),
            &format!("--hash={}", c.hash),
            &format!("--data-block-size={}", c.data_bs),
            &format!("--hash-block-size={}", c.hash_bs),
            &format!("--salt={}", c.salt),
            data.to_str().unwrap(),
            hash.to_str().unwrap(),
        ]);
        assert!(ok, "veritysetup format failed: {out}");
        let root = hex::decode(field(&out, "Root hash")).unwrap();

        let hash_file = open_rw(&hash);
        let data_file = open_rw(&data);
        let sb = VeritySuperblock::read(&hash_file, 0).unwrap();
        assert_eq!(sb.hash_type, c.format);
        assert_eq!(sb.algorithm, c.hash);
        assert_eq!(sb.data_block_size, c.data_bs);
        assert_eq!(sb.hash_block_size, c.hash_bs);
        assert_eq!(sb.data_blocks, (c.data_len / c.data_bs as usize) as u64);
        assert_eq!(sb.salt, verity::parse_salt(c.salt).unwrap());
        assert_eq!(sb.uuid_string(), field(&out, "UUID"));
        let params = sb.params(0).unwrap();
        assert_eq!(
            params.geometry().unwrap().hash_blocks().to_string(),
            field(&out, "Hash blocks")
        );
        let report = verity::verify(&data_file, &hash_file, &params, &root).unwrap();
        assert!(report.is_ok(), "case {n}: {report:?}");

        // Rebuilding with the same parameters gives the same hash device, byte for byte.
        let mine = dir.path(&format!("mine{n}"));
        let mine_file = open_rw(&mine);
        let ours = verity::format(&data_file, &mine_file, &params).unwrap();
        assert_eq!(ours.root_hash, root, "case {n}");
        assert_eq!(
            std::fs::read(&mine).unwrap(),
            std::fs::read(&hash).unwrap(),
            "case {n}"
        );

        // Our dump prints what veritysetup dump prints.
        let (ok, theirs) = veritysetup(&["dump", hash.to_str().unwrap()]);
        assert!(ok, "{theirs}");
        let our_dump = verity::dump(&sb, hash.to_str().unwrap(), 0).unwrap();
        assert_eq!(our_dump.trim(), theirs.trim(), "case {n}");

        // Tampering with one data byte is found by both.
        let mut b = [0u8; 1];
        let at = (c.data_len / 2) as u64 + 5;
        data_file.read_at(at, &mut b).unwrap();
        data_file.write_at(at, &[b[0] ^ 1]).unwrap();
        let r = verity::verify(&data_file, &hash_file, &params, &root).unwrap();
        assert_eq!(r.bad_data_blocks, vec![at / c.data_bs as u64], "case {n}");
        let (ok, _) = veritysetup(&[
            "verify",
            data.to_str().unwrap(),
            hash.to_str().unwrap(),
            &hex::encode(&root),
        ]);
        assert!(!ok, "veritysetup accepted tampered data (case {n})");
    }
}

#[test]
fn trees_built_by_cryptblk_pass_veritysetup_verify() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("b");
    for (n, c) in CASES.iter().enumerate() {
        let data = dir.path(&format!("data{n}"));
        let hash = dir.path(&format!("hash{n}"));
        write_pattern(&data, c.data_len, n as u64 + 99);
        let data_file = open_rw(&data);
        let hash_file = open_rw(&hash);
        let params = VerityParams {
            hash_type: c.format,
            algorithm: HashAlgorithm::from_name(c.hash).unwrap(),
            data_block_size: c.data_bs,
            hash_block_size: c.hash_bs,
            data_blocks: (c.data_len / c.data_bs as usize) as u64,
            salt: verity::parse_salt(c.salt).unwrap(),
            hash_offset: 0,
            superblock: true,
            uuid: None,
        };
        let out = verity::format(&data_file, &hash_file, &params).unwrap();
        let root = hex::encode(&out.root_hash);
        let (ok, text) = veritysetup(&[
            "verify",
            "-v",
            data.to_str().unwrap(),
            hash.to_str().unwrap(),
            &root,
        ]);
        assert!(ok, "case {n}: veritysetup verify rejected our tree: {text}");
        let (ok, theirs) = veritysetup(&["dump", hash.to_str().unwrap()]);
        assert!(ok, "{theirs}");
        assert_eq!(field(&theirs, "UUID"), out.superblock.uuid_string());
        assert_eq!(
            field(&theirs, "Hash blocks"),
            out.geometry.hash_blocks().to_string()
        );
        assert_eq!(field(&theirs, "Hash algorithm"), c.hash);

        if out.geometry.levels == 0 {
            continue; // No tree blocks: the root hash is the data block's digest.
        }
        // Flip a bit in the last tree block (level 0): veritysetup must refuse.
        let last = out.geometry.hash_device_end() - 1 - (out.geometry.hash_block_size as u64 - 1);
        let mut b = [0u8; 1];
        hash_file.read_at(last, &mut b).unwrap();
        hash_file.write_at(last, &[b[0] ^ 4]).unwrap();
        let (ok, _) = veritysetup(&[
            "verify",
            data.to_str().unwrap(),
            hash.to_str().unwrap(),
            &root,
        ]);
        assert!(!ok, "case {n}: veritysetup accepted a tampered hash block");
        assert!(
            !verity::verify(&data_file, &hash_file, &params, &out.root_hash)
                .unwrap()
                .is_ok()
        );
    }
}

#[test]
fn appended_hash_area_and_no_superblock_interoperate() {
    if !tool_available() {
        return;
    }
    let dir = TempDir::new("c");
    let dev = dir.path("dev");
    let data_len = 1 << 20;
    write_pattern(&dev, data_len, 5);
    // veritysetup appends the tree at --hash-offset on the data device itself.
    let (ok, out) = veritysetup(&[
        "format",
        "--hash-offset=1048576",
        "--data-blocks=256",
        "--salt=abcd",
        dev.to_str().unwrap(),
        dev.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let root = hex::decode(field(&out, "Root hash")).unwrap();
    let f = open_rw(&dev);
    let sb = VeritySuperblock::read(&f, 1 << 20).unwrap();
    let params = sb.params(1 << 20).unwrap();
    assert!(verity::verify(&f, &f, &params, &root).unwrap().is_ok());

    // cryptblk without a superblock; veritysetup given the parameters explicitly.
    let dev2 = dir.path("dev2");
    write_pattern(&dev2, data_len, 6);
    let f2 = open_rw(&dev2);
    let mut p2 = params.clone();
    p2.superblock = false;
    p2.salt = vec![1, 2, 3];
    let ours = verity::format(&f2, &f2, &p2).unwrap();
    let (ok, text) = veritysetup(&[
        "verify",
        "--no-superblock",
        "--hash-offset=1048576",
        "--data-blocks=256",
        "--salt=010203",
        dev2.to_str().unwrap(),
        dev2.to_str().unwrap(),
        &hex::encode(&ours.root_hash),
    ]);
    assert!(ok, "{text}");
    // The tree starts right at the hash offset when there is no superblock.
    assert_eq!(
        f2.size().unwrap(),
        (1 << 20) + ours.geometry.hash_blocks() * 4096
    );
}
