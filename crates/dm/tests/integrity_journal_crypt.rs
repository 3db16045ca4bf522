//! dm-integrity journal encryption (`journal_crypt:`) and journal MACs (`journal_mac:`)
//! against the Linux kernel, via images made in the kernel lab
//! (integrity_fixtures/make-journal-crypt-fixtures.sh + lab-journal-crypt.sh):
//!
//! - `kernel_journal_crypt_images_replay_in_cryptblk`: copies of kernel mappings taken while
//!   live (`integritysetup --journal-crypt ctr-aes|cbc-aes|chacha20`, `--journal-integrity
//!   hmac-sha256`), whose last writes are only in the kernel's encrypted / MACed journal,
//!   replay in cryptblk and read exactly the kernel's data; wrong keys and missing options
//!   never yield data;
//! - `tampered_journal_mac_fails_device`: a flipped bit in the MACed sector fields of the
//!   journal fails the device at replay (as the kernel did with the same tampering, see
//!   results-jc.txt) and nothing is written;
//! - `cryptblk_journal_crypt_round_trip`: cryptblk's own images with committed encrypted
//!   journals replay (the kernel's verdict on the same images, made by the ignored
//!   `write_images_for_kernel`, is in results-jc.txt);
//! - `journal_write_error_fails_device`: a journal commit that fails on the write path (FUA
//!   write, journal watermark) fails the device like the kernel's `dm_integrity_io_error`.

mod common;

use common::{open_file, CrashDisk, CutDisk, MemDisk};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, Target, WriteFlags};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// The fixture set the lab scripts made.
const SET: &str = "integrity_fixtures";
const PATTERN_LEN: usize = 64 << 10;

/// (fixture, journal cipher as the kernel names it, journal MAC hmac(sha256)?), as
/// lab-journal-crypt.sh made them (integritysetup ctr-aes, cbc-aes, chacha20,
/// hmac-sha256).
const KERNEL_IMAGES: [(&str, Option<&str>, bool); 4] = [
    ("jc-ctr-hmac", Some("ctr(aes)"), true),
    ("jc-cbc-hmac", Some("cbc(aes)"), true),
    ("jc-chacha20", Some("chacha20"), false),
    ("jm-hmac", None, true),
];

/// The pattern written through every mapping (xorshift64, seed 0x5eed).
fn pattern() -> Vec<u8> {
    common::xorshift_pattern(0x5eed, PATTERN_LEN)
}

/// What the kernel images hold: the pattern, then its last 8 KiB over its first 8 KiB.
fn kernel_data() -> Vec<u8> {
    let mut want = pattern();
    let tail = want[PATTERN_LEN - 8192..].to_vec();
    want[..8192].copy_from_slice(&tail);
    want
}

/// jcrypt.key of the lab scripts.
fn crypt_key() -> SecretBytes {
    SecretBytes::from_vec((0..32u8).map(|i| 0xa0 ^ i).collect())
}

/// jmac.key of the lab scripts.
fn mac_key() -> SecretBytes {
    SecretBytes::from_vec((0..32u8).map(|i| 0x5c + i).collect())
}

fn config(mode: IntegrityMode, crypt: Option<&str>, mac: bool) -> IntegrityConfig {
    let mut c = IntegrityConfig::new(mode, "crc32c");
    if let Some(alg) = crypt {
        c.journal_crypt = Some(alg.to_string());
        c.journal_crypt_key = Some(crypt_key());
    }
    if mac {
        c.journal_mac = Some("hmac(sha256)".into());
        c.journal_mac_key = Some(mac_key());
    }
    c
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cryptblk-jc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The image at `img` opened as device `name` with config `c`.
fn open_image(img: &Path, name: &str, c: IntegrityConfig) -> Result<IntegrityTarget, String> {
    IntegrityTarget::open(open_file(img), name, None, c, None)
}

/// Reads the first `PATTERN_LEN` bytes.
fn read_pattern_area(t: &IntegrityTarget) -> io::Result<Vec<u8>> {
    let mut got = vec![0u8; PATTERN_LEN];
    t.read_at(0, &mut got)?;
    Ok(got)
}

#[test]
fn kernel_journal_crypt_images_replay_in_cryptblk() {
    let dir = temp_dir("kernel");
    let want = kernel_data();
    let mut replayed = Vec::new();
    for (name, crypt, mac) in KERNEL_IMAGES {
        let live = format!("{name}-live");
        // integritysetup mapped --journal-crypt ctr-aes to the kernel's ctr(aes) (and so
        // on): the table the kernel held names the algorithms cryptblk implements.
        let table = common::fixture_text(SET, &format!("{name}.table"));
        if let Some(alg) = crypt {
            assert!(
                table.contains(&format!("journal_crypt:{alg}")),
                "{name}: {table}"
            );
        }
        assert_eq!(table.contains("journal_mac:hmac(sha256)"), mac, "{name}");

        // Without replay (recovery mode) the home locations lack the last write: it is only
        // in the kernel's journal.
        let img = common::unpack_fixture(SET, &live, &dir);
        let raw = open_image(&img, &live, config(IntegrityMode::Recovery, crypt, mac))
            .unwrap_or_else(|e| panic!("{live} (recovery): {e}"));
        if read_pattern_area(&raw).unwrap() != want {
            replayed.push(name);
        }
        let dump = common::fixture_text(SET, &format!("{name}.dump"));
        let sb = raw.superblock();
        assert!(
            dump.contains(&format!("journal_sections {}\n", sb.journal_sections)),
            "{live}"
        );
        assert_eq!(sb.flags & 1 != 0, mac, "{live}: have_journal_mac");
        drop(raw);

        // Journal mode replays the encrypted / MACed journal: the kernel's data exactly.
        let t = open_image(&img, &live, config(IntegrityMode::Journal, crypt, mac))
            .unwrap_or_else(|e| panic!("{live}: {e}"));
        let got = read_pattern_area(&t).unwrap_or_else(|e| panic!("{live}: {e}"));
        assert!(got == want, "{live}: data differs from the kernel's");
        // integritysetup wiped everything else: all of it reads as zeros with valid tags.
        let mut rest = vec![0u8; t.size() as usize - PATTERN_LEN];
        t.read_at(PATTERN_LEN as u64, &mut rest)
            .unwrap_or_else(|e| panic!("{live}: {e}"));
        assert!(rest.iter().all(|&b| b == 0), "{live}");
        assert_eq!(t.mismatches(), 0, "{live}");
        // cryptblk's table names the journal algorithms as the kernel's did.
        let ours = t.table_params(false);
        for tok in table.split_whitespace() {
            if tok.starts_with("journal_crypt:") || tok.starts_with("journal_mac:") {
                let mut parts = tok.splitn(3, ':');
                let opt = format!("{}:{}", parts.next().unwrap(), parts.next().unwrap());
                assert!(ours.contains(&opt), "{name}: {ours} lacks {opt}");
            }
        }
        // A clean close leaves a journal the kernel's way (checked again on reopen).
        t.close().unwrap();
        drop(t);
        let t = open_image(&img, &live, config(IntegrityMode::Journal, crypt, mac)).unwrap();
        assert!(read_pattern_area(&t).unwrap() == want, "{live} after close");
        drop(t);
        let _ = std::fs::remove_file(&img);

        // Wrong keys or missing options never give data.
        let img = common::unpack_fixture(SET, &live, &dir);
        if mac {
            let e = open_image(&img, &live, config(IntegrityMode::Journal, crypt, false))
                .err()
                .unwrap_or_else(|| panic!("{live}: opened without journal_mac"));
            assert!(e.contains("Journal mac mismatch"), "{live}: {e}");
            // A wrong MAC key: the superblock's MAC (fix_hmac) does not match.
            let mut c = config(IntegrityMode::Journal, crypt, true);
            c.journal_mac_key = Some(SecretBytes::from_slice(&[7; 32]));
            let e = open_image(&img, &live, c)
                .err()
                .unwrap_or_else(|| panic!("{live}: opened with a wrong MAC key"));
            assert!(e.contains("superblock"), "{live}: {e}");
        }
        if crypt.is_some() {
            let mut c = config(IntegrityMode::Journal, crypt, mac);
            c.journal_crypt_key = Some(SecretBytes::from_slice(&[9; 32]));
            // Decrypted with another key the journal's commit ids are garbage: the device
            // fails rather than replaying anything.
            if let Ok(t) = open_image(&img, &live, c) {
                assert!(
                    read_pattern_area(&t).is_err(),
                    "{live}: read with a wrong journal key"
                );
            }
        }
        let _ = std::fs::remove_file(&img);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("needed a journal replay: {replayed:?}");
    assert_eq!(
        replayed.len(),
        KERNEL_IMAGES.len(),
        "replayed only {replayed:?}"
    );
}

#[test]
fn tampered_journal_mac_fails_device() {
    let dir = temp_dir("tamper");
    let results = common::fixture_text(SET, "results-jc.txt");
    for (name, crypt) in [("jm-hmac", None), ("jc-ctr-hmac", Some("ctr(aes)"))] {
        let live = format!("{name}-live");
        let img = common::unpack_fixture(SET, &live, &dir);
        let raw = open_image(&img, &live, config(IntegrityMode::Recovery, crypt, true)).unwrap();
        let l = raw.layout().clone();
        drop(raw);
        // What lab-journal-crypt.sh flipped: bit 0 of the first entry's sector field of
        // every section (CTR: the same bit of the plain text).
        let mut image = std::fs::read(&img).unwrap();
        assert_eq!(l.journal_offset(), 4096);
        assert_eq!(l.journal_section_sectors, 168);
        for i in 0..l.journal_sections as u64 {
            image[(l.journal_offset() + i * l.journal_section_sectors as u64 * 512) as usize] ^= 1;
        }
        let disk = MemDisk::from_image(image.clone());
        let t = IntegrityTarget::open(
            disk.clone(),
            name,
            None,
            config(IntegrityMode::Journal, crypt, true),
            None,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = read_pattern_area(&t).expect_err("a tampered journal must fail the device");
        assert_eq!(common::errno(&e), libc::EILSEQ, "{name}: {e}");
        assert!(t.mismatches() >= 1, "{name}");
        assert!(t.flush().is_err(), "{name}");
        assert!(t.write_at(0, &[0u8; 512], WriteFlags::default()).is_err());
        assert!(
            t.close().is_err(),
            "{name}: a failed device closes with its error"
        );
        drop(t);
        assert!(
            disk.image() == image,
            "{name}: a failed replay wrote to the disk"
        );
        // The kernel, given the same tampered copy, also failed every read.
        let line = results
            .lines()
            .find(|l| l.starts_with(&format!("{name} tampered:")))
            .unwrap_or_else(|| panic!("{name}: no kernel verdict in results-jc.txt"));
        assert!(line.contains("read=ERROR"), "kernel: {line}");
        let _ = std::fs::remove_file(&img);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A formatted 4 MiB device like the lab's (crc32c, 256 KiB journal, fix_padding,
/// fix_hmac) holding `data` in a committed journal that was never written home.
fn cut_image(disk: Arc<dyn BlockDevice>, c: &IntegrityConfig, data: &[u8]) {
    let c = IntegrityConfig {
        journal_sectors: Some(512),
        fix_padding: true,
        fix_hmac: true,
        ..c.clone()
    };
    IntegrityTarget::format(disk.clone(), "cut", None, c.clone(), true).unwrap();
    let cut = Arc::new(CutDisk {
        inner: disk,
        budget: AtomicI64::new(1),
    });
    let t = IntegrityTarget::open(cut, "cut", None, c, None).unwrap();
    t.write_at(0, data, WriteFlags::default()).unwrap();
    assert!(t.flush().is_err(), "the cut must stop the write-back");
}

/// Bytes per journal section of the 512-byte-block crc32c devices here: 24-byte entries,
/// 20 per sector with a MAC (496 usable bytes), 21 without; 8 entry sectors plus one data
/// sector per entry.
fn section_bytes(mac: bool) -> usize {
    let per_sector = if mac { 20 } else { 21 };
    (8 + 8 * per_sector) * 512
}

/// An independent decryption of a journal (whole sections from section 0) with pyca's
/// AES-CTR / AES-CBC / ChaCha20 and the kernel's derivation: one keystream under a zero IV
/// over the journal (stream ciphers), or per-section CBC with IV = AES(le32(section)).
fn pyca_decrypt_journal(
    alg: &str,
    key: &SecretBytes,
    section_bytes: usize,
    data: &[u8],
) -> Vec<u8> {
    const PY: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
alg, key, sb = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
data = sys.stdin.buffer.read()
if alg == "ctr(aes)":
    out = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).decryptor().update(data)
elif alg == "chacha20":
    out = Cipher(algorithms.ChaCha20(key, bytes(16)), None).decryptor().update(data)
else:
    out = b""
    for i in range(len(data) // sb):
        iv = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(i.to_bytes(4, "little") + bytes(12))
        out += Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor().update(data[i * sb:(i + 1) * sb])
sys.stdout.buffer.write(out)
"#;
    use std::io::Write;
    let whole = data.len() / section_bytes * section_bytes;
    let mut child = std::process::Command::new("python3")
        .args(["-c", PY, alg, &key.to_hex(), &section_bytes.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    let input = data[..whole].to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(out.status.success(), "python3 failed");
    out.stdout
}

#[test]
fn cryptblk_journal_crypt_round_trip() {
    let data = pattern();
    for (name, crypt, mac) in KERNEL_IMAGES {
        let disk = MemDisk::new(4 << 20);
        let c = config(IntegrityMode::Journal, crypt, mac);
        cut_image(disk.clone(), &c, &data);
        let image = disk.image();
        // Home locations do not have the data yet; an encrypted journal does not show it.
        let block = &data[512..1016];
        let journal = &image[4096..4096 + (256 << 10)];
        let in_journal = journal.windows(block.len()).any(|w| w == block);
        assert_eq!(
            in_journal,
            crypt.is_none(),
            "{name}: plain text in the journal"
        );
        // pyca/cryptography, given the kernel's key derivation, decrypts it to the data.
        if let (Some(alg), true) = (crypt, common::require_pyca()) {
            let plain = pyca_decrypt_journal(alg, &crypt_key(), section_bytes(mac), journal);
            assert!(
                plain.windows(block.len()).any(|w| w == block),
                "{name}: pyca's decryption of the journal lacks the data"
            );
        }
        let t = IntegrityTarget::open(disk.clone(), name, None, c.clone(), None).unwrap();
        assert!(read_pattern_area(&t).unwrap() == data, "{name}: replay");
        assert_eq!(t.mismatches(), 0);
        t.close().unwrap();
        drop(t);
        // Another journal key cannot replay it.
        if crypt.is_some() {
            let disk = MemDisk::from_image(image.clone());
            let mut bad = c.clone();
            bad.journal_crypt_key = Some(SecretBytes::from_slice(&[3; 32]));
            if let Ok(t) = IntegrityTarget::open(disk, name, None, bad, None) {
                assert!(read_pattern_area(&t).is_err(), "{name}: wrong key replayed");
            }
        }
    }
    // The kernel read back every image write_images_for_kernel made this way.
    let results = common::fixture_text(SET, "results-jc.txt");
    for (name, _, _) in KERNEL_IMAGES {
        let line = results
            .lines()
            .find(|l| l.starts_with(&format!("ours-{name}.img ")))
            .unwrap_or_else(|| panic!("ours-{name}: no kernel verdict in results-jc.txt"));
        assert!(
            line.contains("pattern=OK full_read=ok mismatches=0"),
            "kernel: {line}"
        );
    }
}

#[test]
fn journal_write_error_fails_device() {
    for fua in [true, false] {
        let mem = MemDisk::new(4 << 20);
        let c = IntegrityConfig {
            journal_sectors: Some(512),
            journal_watermark: 10,
            ..config(IntegrityMode::Journal, Some("ctr(aes)"), true)
        };
        IntegrityTarget::format(mem.clone(), "fail", None, c.clone(), true).unwrap();
        let disk = CrashDisk::new(mem.clone(), i64::MAX, false);
        let t = IntegrityTarget::open(disk.clone(), "fail", None, c, None).unwrap();
        t.write_at(0, &[1u8; 4096], WriteFlags { fua: true })
            .unwrap();
        // The disk dies: the next commit cannot write the journal.
        disk.budget.store(0, Ordering::SeqCst);
        let r = if fua {
            t.write_at(8192, &[2u8; 512], WriteFlags { fua: true })
        } else {
            // Unflushed writes until the journal watermark forces a commit.
            (0..64u64)
                .map(|k| t.write_at(16384 + k * 4096, &[3u8; 4096], WriteFlags::default()))
                .find(|r| r.is_err())
                .unwrap_or(Ok(()))
        };
        let e = r.expect_err("the commit must fail");
        assert_eq!(common::errno(&e), libc::EIO);
        // Failed for good: reads of blocks already home (the disk still reads) fail too.
        let mut buf = [0u8; 4096];
        let e = t
            .read_at(0, &mut buf)
            .expect_err("the device must stay failed");
        assert_eq!(common::errno(&e), libc::EIO, "fua={fua}");
        assert!(t.flush().is_err());
        assert!(t
            .write_at(1 << 20, &[4u8; 512], WriteFlags::default())
            .is_err());
    }
}

#[test]
#[ignore = "fixture generator for make-journal-crypt-fixtures.sh (writes into CRYPTBLK_FIXTURE_OUT)"]
fn write_images_for_kernel() {
    let out = PathBuf::from(std::env::var("CRYPTBLK_FIXTURE_OUT").expect("CRYPTBLK_FIXTURE_OUT"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("pattern.bin"), pattern()).unwrap();
    std::fs::write(out.join("jcrypt.key"), crypt_key().as_bytes()).unwrap();
    std::fs::write(out.join("jmac.key"), mac_key().as_bytes()).unwrap();
    let ckey = "--journal-crypt-key-file jcrypt.key --journal-crypt-key-size 32";
    let mac = "--journal-integrity hmac-sha256 --journal-integrity-key-file jmac.key \
               --journal-integrity-key-size 32";
    for (name, crypt, with_mac) in KERNEL_IMAGES {
        let img = out.join(format!("ours-{name}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        cut_image(
            open_file(&img),
            &config(IntegrityMode::Journal, crypt, with_mac),
            &pattern(),
        );
        let mut opts = Vec::new();
        if let Some(alg) = crypt {
            // integritysetup's spelling of the kernel name.
            let user = alg.replace("(aes)", "-aes");
            opts.push(format!("--journal-crypt {user} {ckey}"));
        }
        if with_mac {
            opts.push(mac.to_string());
        }
        std::fs::write(out.join(format!("ours-{name}.opts")), opts.join(" ")).unwrap();
    }
}

#[test]
fn table_options_parse_and_print() {
    let crypt = crypt_key().to_hex().as_str().to_owned();
    let mac = mac_key().to_hex().as_str().to_owned();
    let line = format!(
        "/dev/x 0 4 J 3 internal_hash:crc32c journal_crypt:ctr(aes):{crypt} \
         journal_mac:hmac(sha256):{mac}"
    );
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    let (c, dev) = IntegrityConfig::parse(&args).unwrap();
    assert_eq!(dev, "/dev/x");
    assert_eq!(c.journal_crypt.as_deref(), Some("ctr(aes)"));
    assert_eq!(
        c.journal_crypt_key.as_ref().unwrap().as_bytes(),
        crypt_key().as_bytes()
    );
    assert_eq!(c.journal_mac.as_deref(), Some("hmac(sha256)"));
    assert_eq!(
        c.journal_mac_key.as_ref().unwrap().as_bytes(),
        mac_key().as_bytes()
    );
    // The target prints them back in the kernel's order, keys hidden unless asked for.
    let t = IntegrityTarget::open(MemDisk::new(4 << 20), "/dev/x", None, c, None).unwrap();
    let shown = t.table_params(true);
    assert!(
        shown.ends_with(&format!(
            "internal_hash:crc32c journal_crypt:ctr(aes):{crypt} journal_mac:hmac(sha256):{mac}"
        )),
        "{shown}"
    );
    assert!(!t.table_params(false).contains(&crypt));
    // Bad input is refused with a message, not a panic.
    for bad in ["journal_crypt:ctr(aes):zz", "journal_mac:hmac(sha256):0g"] {
        let args: Vec<String> = ["/dev/x", "0", "4", "J", "1", bad]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(IntegrityConfig::parse(&args).is_err(), "{bad}");
    }
    let mut c = config(IntegrityMode::Journal, Some("xts(aes)"), false);
    c.journal_sectors = Some(512);
    let e = IntegrityTarget::open(MemDisk::new(4 << 20), "x", None, c, None)
        .err()
        .unwrap();
    assert!(e.contains("unsupported journal cipher"), "{e}");
    let mut c = config(IntegrityMode::Journal, Some("ctr(aes)"), false);
    c.journal_crypt_key = Some(SecretBytes::from_slice(&[1; 7]));
    assert!(IntegrityTarget::open(MemDisk::new(4 << 20), "x", None, c, None).is_err());
}
