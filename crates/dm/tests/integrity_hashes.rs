//! The internal hashes crc32, xxhash64, sha1 (and blake2b-256 where the kernel made an
//! image) against the Linux kernel: images that `integritysetup format --integrity <hash>`
//! and kernel dm-integrity wrote in the lab (integrity_fixtures/make-hash-fixtures.sh, which
//! writes the xorshift pattern of integrity_kernel.rs through the kernel mapping) open in
//! cryptblk, read the pattern back with every tag verified, and a single flipped bit in the
//! data area is caught as `EILSEQ` and counted. cryptblk's own tags for the same blocks
//! must equal the kernel's stored tags byte for byte.

mod common;

use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PATTERN_LEN: usize = 256 << 10;

/// The fixture set (`tests/integrity_fixtures`) the lab scripts made.
const FIXTURE_SET: &str = "integrity_fixtures";

/// The pattern lab-hashes.sh wrote (xorshift64, seed 0x5eed), as in integrity_kernel.rs.
fn pattern() -> Vec<u8> {
    common::xorshift_pattern(0x5eed, PATTERN_LEN)
}

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);
impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("cryptblk-ihash-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(img: &Path, hash: &str, mode: IntegrityMode) -> Result<IntegrityTarget, String> {
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileBacking::open(img, FileOptions::default()).unwrap());
    IntegrityTarget::open(
        dev,
        &img.display().to_string(),
        None,
        IntegrityConfig::new(mode, hash),
        None,
    )
}

/// The hashes the lab's kernel formatted (hashes.txt says which; blake2s-256 is gone from
/// kernel 6.12's crypto API).
fn kernel_made() -> Vec<String> {
    let text = common::fixture_text(FIXTURE_SET, "hashes.txt");
    text.lines()
        .filter_map(|l| l.strip_suffix(" kernel image made"))
        .map(str::to_string)
        .collect()
}

#[test]
fn kernel_images_with_each_hash_verify_in_cryptblk() {
    let made = kernel_made();
    for must in ["crc32", "xxhash64", "sha1"] {
        assert!(
            made.iter().any(|m| m == must),
            "hashes.txt lacks {must}: {made:?}"
        );
    }
    let dir = Scratch::new("each");
    let want = pattern();
    for hash in &made {
        let name = format!("h-{hash}");
        let img = common::unpack_fixture(FIXTURE_SET, &name, dir.path());
        let t = open(&img, hash, IntegrityMode::Journal).unwrap_or_else(|e| panic!("{hash}: {e}"));
        let dump = common::fixture_text(FIXTURE_SET, &format!("{name}.dump"));
        let sb = t.superblock();
        assert!(
            dump.contains(&format!(
                "provided_data_sectors {}\n",
                sb.provided_data_sectors
            )) && dump.contains(&format!("integrity_tag_size {}\n", sb.integrity_tag_size)),
            "{hash}: superblock differs from integritysetup dump"
        );
        let mut got = vec![0u8; PATTERN_LEN];
        t.read_at(0, &mut got)
            .unwrap_or_else(|e| panic!("{hash}: reading the pattern: {e}"));
        assert!(got == want, "{hash}: pattern differs");
        // The rest was wiped by integritysetup through the kernel: zeros, tags valid.
        let mut rest = vec![0u8; t.size() as usize - PATTERN_LEN];
        t.read_at(PATTERN_LEN as u64, &mut rest)
            .unwrap_or_else(|e| panic!("{hash}: reading the wiped area: {e}"));
        assert!(rest.iter().all(|&b| b == 0), "{hash}: wiped area not zero");
        assert_eq!(t.mismatches(), 0, "{hash}");
        drop(t);

        // One flipped bit in the data of block 100 (at home; interleave 32768 puts the data
        // area after the superblock, journal and first tag area, which recovery mode maps).
        let raw = open(&img, hash, IntegrityMode::Recovery).unwrap();
        let mut block = vec![0u8; 512];
        raw.read_at(100 * 512, &mut block).unwrap();
        assert_eq!(block, want[100 * 512..101 * 512], "{hash}: recovery read");
        let phys = raw.layout().data_sector(100) * 512;
        drop(raw);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, phys + 77).unwrap();
        b[0] ^= 0x10;
        std::os::unix::fs::FileExt::write_all_at(&f, &b, phys + 77).unwrap();
        drop(f);
        let t = open(&img, hash, IntegrityMode::Journal).unwrap();
        let err = t.read_at(100 * 512, &mut block).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EILSEQ), "{hash}: {err}");
        assert_eq!(t.mismatches(), 1, "{hash}");
        // Its neighbours still verify.
        t.read_at(99 * 512, &mut block).unwrap();
        t.read_at(101 * 512, &mut block).unwrap();
    }
}

#[test]
fn a_wrong_hash_name_fails_every_tag() {
    // The same crc32 image opened as crc32c: the tag size matches (4) but no tag does, so
    // the kernel-made tags really are the kernel's crc32 and not just any 4 bytes.
    let dir = Scratch::new("wrong");
    let img = common::unpack_fixture(FIXTURE_SET, "h-crc32", dir.path());
    let t = open(&img, "crc32c", IntegrityMode::Journal).unwrap();
    let mut block = vec![0u8; 512];
    let err = t.read_at(0, &mut block).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EILSEQ));
}

#[test]
fn cryptblk_cli_images_passed_the_kernel() {
    // make-hash-fixtures.sh formatted these with `cryptblk integrity format`, wrote the
    // pattern through `cryptblk integrity open --nbd`, and the lab's kernel opened them with
    // integritysetup, read the pattern back and every block with its tag checked; its
    // verdicts are recorded in hashes.txt.
    let text = common::fixture_text(FIXTURE_SET, "hashes.txt");
    for name in [
        "crc32",
        "crc32-4k",
        "xxhash64",
        "blake2b-256",
        "sha1",
        "hmac-sha256",
    ] {
        let want = format!("ours-cli-{name}.img pattern=OK full_read=ok mismatches=0");
        assert!(
            text.lines().any(|l| l == want),
            "hashes.txt has no passing kernel verdict for {name}:\n{text}"
        );
    }
}
