//! Every LUKS1 case of cryptsetup's test images (expected.tsv), checked with cryptblk alone
//! against results established by cryptsetup and an independent decryption.

mod common;

use common::*;
use cryptblk_format::hdrio::{HeaderIo, MemIo};
use cryptblk_format::luks1::Luks1Volume;
use cryptblk_format::FormatError;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// cryptsetup 2.6.1's reasons (`--debug`) for refusing each evil header (README.md).
fn evil_reason(file: &str) -> &'static str {
    match file {
        "evil_hdr-luks_hdr_damage" => "Invalid offset 1 in keyslot 2.",
        "evil_hdr-payload_overwrite" => {
            "Invalid keyslot size 250 (offset 3847, stripes 4000) in keyslot 3 (beyond data area offset 4096)."
        }
        "evil_hdr-stripes_payload_dmg" => "Invalid stripes count 44944 in keyslot 5.",
        "evil_hdr-small_luks_device" => "LUKS1 requires at least 1049600 bytes",
        "evil_hdr-keyslot_overlap" => "Not enough space in LUKS keyslot 1.",
        other => panic!("no reason recorded for {other}"),
    }
}

/// Cases that may fail only because the cipher crate lacks the image's cipher specification
/// (none since essiv:wp256 landed).
const KNOWN_CIPHER_GAPS: &[&str] = &[];

struct Images {
    dir: TempDir,
    unpacked: HashMap<String, ()>,
}

impl Images {
    fn path(&mut self, archive: &str, path: &str) -> PathBuf {
        if !self.unpacked.contains_key(archive) {
            if archive.ends_with(".tar.xz") {
                untar(archive, &self.dir);
            } else {
                unxz(archive, &self.dir);
            }
            self.unpacked.insert(archive.to_string(), ());
        }
        self.dir.join(path)
    }
}

fn secret(kind: &str, value: &str, images: &mut Images, archive: &str) -> Vec<u8> {
    match kind {
        "passphrase" => value.as_bytes().to_vec(),
        "keyfile" => std::fs::read(images.path(archive, value)).unwrap(),
        other => panic!("secret kind {other}"),
    }
}

fn open(path: &Path) -> Luks1Volume<File> {
    Luks1Volume::open(File::open(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn payload(vol: &Luks1Volume<File>, vk: &[u8]) -> Vec<u8> {
    let dev = vol.device();
    let start = vol.header().data_offset_bytes();
    let mut data = vec![0u8; (dev.size().unwrap() - start) as usize];
    dev.read_at(start, &mut data).unwrap();
    decrypt(&vol.header().cipher_spec(), vk, &mut data);
    data
}

#[test]
fn expected_tsv_luks1_cases() {
    let mut images = Images {
        dir: TempDir::new("images"),
        unpacked: HashMap::new(),
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for row in expected_rows() {
        if row.get(3).map(String::as_str) != Some("luks1") {
            continue;
        }
        let (case, archive, path, kind, sec, expect, value) = (
            &row[0], &row[1], &row[2], &row[5], &row[6], &row[7], &row[8],
        );
        let img = images.path(archive, path);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_case(case, &img, kind, sec, expect, value, &mut images, archive)
        }));
        checked += 1;
        match result {
            Ok(Ok(())) => eprintln!("PASS {case}"),
            // Known gap of the cipher crate (ESSIV with whirlpool-256 is not implemented):
            // tolerated only as exactly that error, and reported.
            Ok(Err(msg))
                if KNOWN_CIPHER_GAPS.contains(&case.as_str())
                    && msg.contains("no known cipher specification pattern") =>
            {
                eprintln!("XFAIL {case}: {msg}");
            }
            Ok(Err(msg)) => {
                eprintln!("FAIL {case}: {msg}");
                failures.push(format!("{case}: {msg}"));
            }
            Err(_) => failures.push(format!("{case}: panicked")),
        }
    }
    assert!(
        checked >= 30,
        "only {checked} LUKS1 rows found in expected.tsv"
    );
    assert!(
        failures.is_empty(),
        "failed cases:\n{}",
        failures.join("\n")
    );
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    case: &str,
    img: &Path,
    kind: &str,
    sec: &str,
    expect: &str,
    value: &str,
    images: &mut Images,
    archive: &str,
) -> Result<(), String> {
    match expect {
        "reject" => {
            let file = img.file_name().unwrap().to_str().unwrap();
            let err = match Luks1Volume::open(File::open(img).unwrap()) {
                Ok(_) => return Err("header was accepted".into()),
                Err(e) => e.to_string(),
            };
            let want = evil_reason(file);
            if !err.contains(want) {
                return Err(format!("error '{err}' does not name '{want}'"));
            }
            // Restoring it over a valid volume must fail and change nothing.
            let backup = std::fs::read(img).unwrap();
            let target = MemIo::new(valid_volume_bytes());
            let before = target.contents();
            if Luks1Volume::restore_header(&target, &backup).is_ok() {
                return Err("restore accepted the evil header".into());
            }
            if target.contents() != before {
                return Err("failed restore modified the target".into());
            }
            Ok(())
        }
        "vk_verifies_against_mk_digest" => {
            let vol = open(img);
            let vk = hex::decode(sec).unwrap();
            vol.verify_volume_key(&vk).map_err(|e| e.to_string())?;
            let mut wrong = vk.clone();
            wrong[0] ^= 1;
            match vol.verify_volume_key(&wrong) {
                Err(FormatError::VolumeKeyMismatch) => Ok(()),
                other => Err(format!("altered key: {other:?}")),
            }
        }
        "fail_exit2" => {
            let vol = open(img);
            match vol.unlock(sec.as_bytes(), None) {
                Err(e) if e.exit_code() == 2 => Ok(()),
                Err(e) => Err(format!("wrong error {e} (exit {})", e.exit_code())),
                Ok(_) => Err("wrong passphrase accepted".into()),
            }
        }
        _ => {
            let vol = open(img);
            let pass = secret(kind, sec, images, archive);
            let u = vol
                .unlock(&pass, None)
                .map_err(|e| format!("unlock: {e}"))?;
            let vk = u.volume_key.as_bytes().to_vec();
            let got = match expect {
                "volume_key" => hex(&vk),
                "open_ok+sha256(payload)" | "sha256(payload)" => sha256_hex(&payload(&vol, &vk)),
                "open_ok+sha1(payload)" => sha1_hex(&payload(&vol, &vk)),
                "open_ok+fs_uuid" => {
                    let dev = vol.device();
                    let mut boot = vec![0u8; 512];
                    dev.read_at(vol.header().data_offset_bytes(), &mut boot)
                        .unwrap();
                    decrypt(&vol.header().cipher_spec(), &vk, &mut boot);
                    fat_serial(&boot)
                }
                other => return Err(format!("unknown expectation {other}")),
            };
            if got != value {
                return Err(format!("{case}: got {got}, expected {value}"));
            }
            Ok(())
        }
    }
}

/// A small valid LUKS1 volume created by real cryptsetup, as bytes (restore target).
fn valid_volume_bytes() -> Vec<u8> {
    let dir = TempDir::new("target");
    let img = unxz("compatimage.img.xz", &dir);
    std::fs::read(img).unwrap()
}

#[test]
fn header_backup_of_compatimage_restores_and_opens_other_data() {
    let dir = TempDir::new("backup");
    let img = unxz("compatimage.img.xz", &dir);
    let vol = open(&img);
    let backup = vol.header_backup().unwrap();
    assert!(backup.len().is_multiple_of(4096));
    assert!(backup.len() as u64 >= vol.header().required_size());
    // Break the header, restore, open again.
    let mut bytes = std::fs::read(&img).unwrap();
    let data_before = bytes[vol.header().data_offset_bytes() as usize..].to_vec();
    bytes[..4096].fill(0);
    let target = MemIo::new(bytes);
    let restored = Luks1Volume::restore_header(&target, &backup).unwrap();
    let u = restored.unlock(b"compatkey", None).unwrap();
    assert_eq!(
        hex(u.volume_key.as_bytes()),
        "e1a851c034ed7993b276608a45842b7b"
    );
    let after = target.contents();
    assert_eq!(
        &after[vol.header().data_offset_bytes() as usize..],
        &data_before[..],
        "restore touched the data area"
    );
    // A backup with a different payload offset is refused over an existing header.
    let dir2 = TempDir::new("backup2");
    let v10 = unxz("compatv10image.img.xz", &dir2);
    let other = MemIo::new(std::fs::read(v10).unwrap());
    let e = Luks1Volume::restore_header(&other, &backup).unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");
}

#[test]
fn wrong_slot_and_missing_slot_errors_follow_cryptsetup() {
    let dir = TempDir::new("slots");
    let img = unxz("compatimage.img.xz", &dir);
    let vol = open(&img);
    assert_eq!(vol.unlock(b"compatkey", Some(0)).unwrap().keyslot, 0);
    let e = vol.unlock(b"compatkey", Some(1)).unwrap_err();
    assert!(matches!(e, FormatError::NoKeyslot(_)), "{e}");
    assert_eq!(e.exit_code(), 1);
    assert!(vol.unlock(b"compatkey", Some(8)).is_err());
}
