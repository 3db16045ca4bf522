//! The seven dm-verity root hashes of cryptsetup's `tests/verity-compat-test`
//! (recorded in shared/cryptsetup-tests/vectors.md section 1): 8 MiB of zeros, hash tree on a
//! separate device and appended to the data device at `--hash-offset 8388608`.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::{HeaderIo, MemIo};
use cryptblk_format::verity::{self, VerityParams, VeritySuperblock};

const SALT: &str = "e48da609055204e89ae53b655ca2216dd983cf3cb829f34f63a297d106d53e2d";
const DATA_BYTES: u64 = 8 << 20;

struct Vector {
    block: u32,
    hash: &'static str,
    salt: &'static str,
    format: u32,
    root: &'static str,
    hash_blocks: u64,
}

const VECTORS: [Vector; 7] = [
    Vector {
        block: 512,
        hash: "sha256",
        salt: SALT,
        format: 1,
        root: "9de18652fe74edfb9b805aaed72ae2aa48f94333f1ba5c452ac33b1c39325174",
        hash_blocks: 1093,
    },
    Vector {
        block: 1024,
        hash: "sha256",
        salt: SALT,
        format: 1,
        root: "54d92778750495d1f80832b486ebd007617d746271511bbf0e295e143da2b3df",
        hash_blocks: 265,
    },
    Vector {
        block: 4096,
        hash: "sha256",
        salt: SALT,
        format: 1,
        root: "e522df0f97da4febb882ac40f30b37dc0b444bf6df418929463fa25280f09d5c",
        hash_blocks: 17,
    },
    Vector {
        block: 4096,
        hash: "sha256",
        salt: SALT,
        format: 0,
        root: "cbbf4ebd004ef65e29b935bb635a39cf754d677f3fa10b0126da725bbdf10f7d",
        hash_blocks: 17,
    },
    Vector {
        block: 4096,
        hash: "sha256",
        salt: "-",
        format: 1,
        root: "ef29c902d87350f1da4bfa536e16cebc162a909bf89abe448b81ec500d4fb9bf",
        hash_blocks: 17,
    },
    Vector {
        block: 1024,
        hash: "sha1",
        salt: SALT,
        format: 1,
        root: "d0e9163ca8844aaa2e88fe5265a8c5d9ee494a99",
        hash_blocks: 265,
    },
    Vector {
        block: 1024,
        hash: "sha1",
        salt: "dadada",
        format: 1,
        root: "73509e8e868be6b8ac939817a98a3d35121413b2",
        hash_blocks: 265,
    },
];

fn params(v: &Vector, hash_offset: u64) -> VerityParams {
    VerityParams {
        hash_type: v.format,
        algorithm: HashAlgorithm::from_name(v.hash).unwrap(),
        data_block_size: v.block,
        hash_block_size: v.block,
        data_blocks: DATA_BYTES / v.block as u64,
        salt: verity::parse_salt(v.salt).unwrap(),
        hash_offset,
        superblock: true,
        uuid: Some([0x11; 16]),
    }
}

#[test]
fn root_hashes_on_separate_hash_device() {
    for v in &VECTORS {
        let data = MemIo::zeroed(DATA_BYTES as usize);
        let hash = MemIo::default();
        let p = params(v, 0);
        let out = verity::format(&data, &hash, &p).unwrap();
        assert_eq!(
            hex::encode(&out.root_hash),
            v.root,
            "bs {} {} v{}",
            v.block,
            v.hash,
            v.format
        );
        assert_eq!(out.geometry.hash_blocks(), v.hash_blocks);
        // Superblock block + tree, nothing more.
        assert_eq!(hash.size().unwrap(), (1 + v.hash_blocks) * v.block as u64);
        let sb = VeritySuperblock::read(&hash, 0).unwrap();
        assert_eq!(sb, p.superblock());
        let report = verity::verify(&data, &hash, &p, &out.root_hash).unwrap();
        assert!(report.is_ok(), "{report:?}");
        // A wrong root hash (cryptsetup's test uses abcdef00...) is rejected.
        let mut wrong = vec![0u8; out.root_hash.len()];
        wrong[..4].copy_from_slice(&[0xab, 0xcd, 0xef, 0x00]);
        assert!(!verity::verify(&data, &hash, &p, &wrong).unwrap().is_ok());
    }
}

#[test]
fn root_hashes_with_hash_area_appended_to_data_device() {
    for v in &VECTORS {
        let dev = MemIo::zeroed(DATA_BYTES as usize);
        let p = params(v, DATA_BYTES);
        let out = verity::format(&dev, &dev, &p).unwrap();
        assert_eq!(
            hex::encode(&out.root_hash),
            v.root,
            "bs {} {} v{}",
            v.block,
            v.hash,
            v.format
        );
        assert_eq!(
            VeritySuperblock::read(&dev, DATA_BYTES).unwrap(),
            p.superblock()
        );
        assert!(verity::verify(&dev, &dev, &p, &out.root_hash)
            .unwrap()
            .is_ok());
    }
}

#[test]
fn corruption_of_data_and_hash_is_detected() {
    let v = &VECTORS[2];
    let data = MemIo::zeroed(DATA_BYTES as usize);
    let hash = MemIo::default();
    let p = params(v, 0);
    let root = verity::format(&data, &hash, &p).unwrap().root_hash;

    // Data byte 3456 lies in data block 0 (cryptsetup's test corrupts the same byte).
    data.write_at(3456, &[0x01]).unwrap();
    let r = verity::verify(&data, &hash, &p, &root).unwrap();
    assert_eq!(r.bad_data_blocks, vec![0]);
    assert!(!r.root_ok);
    assert!(verity::verify_strict(&data, &hash, &p, &root).is_err());
    data.write_at(3456, &[0x00]).unwrap();
    assert!(verity::verify(&data, &hash, &p, &root).unwrap().is_ok());

    // Hash byte 8193: the second tree block (first block of level 0).
    let mut b = [0u8; 1];
    hash.read_at(8193, &mut b).unwrap();
    hash.write_at(8193, &[b[0] ^ 0x80]).unwrap();
    let r = verity::verify(&data, &hash, &p, &root).unwrap();
    assert_eq!(r.bad_hash_blocks, vec![2]);
    assert!(r.bad_data_blocks.is_empty(), "{r:?}");
    assert!(r.root_ok);
    assert!(!r.is_ok());
}
