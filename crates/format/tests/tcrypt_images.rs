//! Every TCRYPT case of cryptsetup's test images (expected.tsv): header search and key
//! derivation, `tcryptDump` text (compared with cryptsetup's where its kernel crypto allows),
//! and the decrypted volume's filesystem UUID as blkid reads it.

mod common;

use common::*;
use cryptblk_cipher::{open_cipher, SecretBytes, SectorOptions};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::tcrypt::{self, TcryptParams, TcryptVolume};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Why a row cannot pass yet, if it cannot (each such row still runs: one that passes fails
/// the test, so the rule cannot go stale).
fn known_gap(case: &str) -> Option<&'static str> {
    case.contains("-cbc-").then_some(
        "legacy CBC chains of TrueCrypt 1.0-4.3 (tcw IV, whitening, 64-bit-block ciphers) \
         are not implemented",
    )
}

struct Row {
    case: String,
    path: String,
    options: Vec<String>,
    keyfiles: bool,
    secret: String,
    expect: String,
    value: String,
}

fn rows() -> Vec<Row> {
    expected_rows()
        .into_iter()
        .filter(|r| r.get(3).map(String::as_str) == Some("tcrypt"))
        .map(|r| Row {
            case: r[0].clone(),
            path: r[2].clone(),
            options: r[4].split_whitespace().map(str::to_string).collect(),
            keyfiles: r[5].contains("keyfiles"),
            secret: r[6].clone(),
            expect: r[7].clone(),
            value: r[8].clone(),
        })
        .collect()
}

fn params(row: &Row, dir: &Path) -> TcryptParams {
    let mut p = TcryptParams::new(SecretBytes::from_slice(row.secret.as_bytes()));
    let mut it = row.options.iter();
    while let Some(o) = it.next() {
        match o.as_str() {
            "-h" => p.hash = it.next().cloned(),
            "-c" => p.cipher = it.next().cloned(),
            "--veracrypt-pim" => p.pim = it.next().unwrap().parse().unwrap(),
            "--tcrypt-hidden" => p.hidden = true,
            "--tcrypt-system" => p.system = true,
            "--tcrypt-backup" => p.backup = true,
            "--disable-veracrypt" => p.veracrypt = false,
            other => panic!("{}: option {other}", row.case),
        }
    }
    if row.keyfiles {
        for k in ["keyfile1", "keyfile2"] {
            let data = std::fs::read(dir.join("tcrypt-images").join(k)).unwrap();
            p.keyfiles.push(SecretBytes::from_vec(data));
        }
    }
    p
}

/// The decrypted data area written to `out`.
fn decrypt_to(vol: &TcryptVolume, image: &Path, out: &Path) {
    let f = File::open(image).unwrap();
    let start = vol.data_offset_sectors() * 512;
    let len = vol.data_size_sectors() * 512;
    let mut data = vec![0u8; len as usize];
    f.read_at(start, &mut data).unwrap();
    for layer in vol.layers() {
        let c = open_cipher(&layer.spec, layer.key.as_bytes(), &SectorOptions::default()).unwrap();
        c.decrypt(vol.iv_offset_sectors(), &mut data).unwrap();
    }
    std::fs::write(out, &data).unwrap();
}

/// For whole-drive system encryption: the drive with its encrypted area replaced by the
/// decrypted `plain`, and blkid of the first partition of its MBR (as the upstream test
/// maps the partition).
fn first_partition_uuid(vol: &TcryptVolume, image: &Path, plain: &Path) -> String {
    let mut drive = std::fs::read(image).unwrap();
    let data = std::fs::read(plain).unwrap();
    let at = (vol.data_offset_sectors() * 512) as usize;
    drive[at..at + data.len()].copy_from_slice(&data);
    let entry = &drive[446..462];
    let start = u32::from_le_bytes(entry[8..12].try_into().unwrap()) as usize * 512;
    let len = u32::from_le_bytes(entry[12..16].try_into().unwrap()) as usize * 512;
    if entry[4] == 0 || drive[510..512] != [0x55, 0xaa] || start + len > drive.len() {
        return String::new();
    }
    let part = plain.with_extension("part");
    std::fs::write(&part, &drive[start..start + len]).unwrap();
    let uuid = blkid_uuid(&part);
    let _ = std::fs::remove_file(&part);
    uuid
}

fn blkid_uuid(path: &Path) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-s", "UUID", "-o", "value"])
        .arg(path)
        .output()
        .expect("blkid must be installed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// cryptsetup's tcryptDump for the row, when this machine's kernel crypto lets it run.
fn cryptsetup_dump(row: &Row, dir: &Path) -> Option<String> {
    let mut cmd = Command::new("cryptsetup");
    cmd.arg("tcryptDump").args(&row.options);
    if row.keyfiles {
        for k in ["keyfile1", "keyfile2"] {
            cmd.arg("--key-file").arg(dir.join("tcrypt-images").join(k));
        }
    }
    let mut child = cmd
        .arg(dir.join(&row.path))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(row.secret.as_bytes())
        .unwrap();
    let out = child.wait_with_output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn expected_tsv_tcrypt_cases() {
    let dir = TempDir::new("tcrypt");
    untar("tcrypt-images.tar.xz", &dir);
    let rows = rows();
    assert_eq!(rows.len(), 121, "expected.tsv holds 121 tcrypt rows");
    let mut failures = Vec::new();
    let mut passed = 0;
    let mut compared = 0;
    let mut gaps = 0;
    // TCRYPT_ONLY=<substring> runs only the matching rows (while debugging one image).
    let only = std::env::var("TCRYPT_ONLY").unwrap_or_default();
    for row in rows.iter().filter(|r| r.case.contains(&only)) {
        let t0 = std::time::Instant::now();
        let image = dir.join(&row.path);
        let p = params(row, dir.path());
        let io = File::open(&image).unwrap();
        let result = tcrypt::unlock(&io as &dyn HeaderIo, &p);
        let outcome: Result<(), String> = match (row.expect.as_str(), result) {
            ("fail", Err(_)) => Ok(()),
            ("fail", Ok(_)) => Err("opened but must fail".into()),
            (_, Err(e)) => Err(format!("unlock: {e}")),
            (_, Ok(vol)) => {
                let name = image.display().to_string();
                let ours = vol.dump(&name, false);
                let mut r = Ok(());
                if let Some(theirs) = cryptsetup_dump(row, dir.path()) {
                    compared += 1;
                    if theirs != ours {
                        r = Err(format!("dump differs:\n{theirs}---\n{ours}"));
                    }
                }
                if r.is_ok() {
                    let out = dir.join("plain.img");
                    decrypt_to(&vol, &image, &out);
                    let mut uuid = blkid_uuid(&out);
                    if uuid.is_empty() && vol.system {
                        uuid = first_partition_uuid(&vol, &image, &out);
                    }
                    let _ = std::fs::remove_file(&out);
                    if uuid != row.value {
                        r = Err(format!("fs UUID {uuid:?}, want {}", row.value));
                    }
                }
                r
            }
        };
        match (outcome, known_gap(&row.case)) {
            (Ok(()), None) => passed += 1,
            (Ok(()), Some(_)) => failures.push(format!("{}: passes, update known_gap", row.case)),
            (Err(_), Some(_)) => gaps += 1,
            (Err(e), None) => failures.push(format!("{}: {e}", row.case)),
        }
        eprintln!("{}: {:?}", row.case, t0.elapsed());
    }
    eprintln!(
        "{passed} of {} rows pass, {gaps} known gaps; {compared} dumps compared with cryptsetup",
        rows.len()
    );
    assert!(
        failures.is_empty(),
        "{} failing:\n{}",
        failures.len(),
        failures.join("\n")
    );
    if only.is_empty() {
        assert!(
            compared >= 10,
            "only {compared} dumps compared with cryptsetup"
        );
    }
}
