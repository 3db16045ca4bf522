//! The crypt target must produce exactly what dm-crypt would: checked against the
//! independent pyca/cryptography model in tests/independent/dmcrypt.py (OpenSSL's AES-XTS),
//! so agreement is not self-referential.

mod common;

use std::process::Command;

use common::{dmcrypt_py, require_pyca, temp_dir, Rng, KEY64};
use cryptblk_dm::{BlockDevice, Registry, WriteFlags};

/// Runs dmcrypt.py over `input` and returns its output.
fn pyca(direction: &str, key: &str, extra: &[String], input: &[u8]) -> Vec<u8> {
    // Tests run in parallel: each call gets its own directory.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = temp_dir(&format!("pyca-{n}"));
    let inp = dir.join("in");
    let out = dir.join("out");
    std::fs::write(&inp, input).unwrap();
    let status = Command::new("python3")
        .arg(dmcrypt_py())
        .arg(direction)
        .args(["--cipher", "aes-xts-plain64", "--key", key])
        .args(extra)
        .arg(&inp)
        .arg(&out)
        .status()
        .expect("run python3");
    assert!(status.success(), "dmcrypt.py failed");
    let r = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// One table configuration: writes random plaintext through the crypt target over a file,
/// then has pyca decrypt the file's ciphertext region; and the reverse direction.
fn check(
    key: &str,
    iv_offset: u64,
    offset_sectors: u64,
    sector_size: u32,
    large: bool,
    queued: bool,
) {
    let dir = temp_dir(&format!(
        "compat-{iv_offset}-{offset_sectors}-{sector_size}-{large}-{queued}"
    ));
    let file = dir.join("disk.img");
    let len_sectors: u64 = 256; // 128 KiB mapped
    let file_len = (offset_sectors + len_sectors + 16) * 512;
    std::fs::write(&file, vec![0u8; file_len as usize]).unwrap();

    let mut opts = Vec::new();
    if !queued {
        opts.push("no_read_workqueue".to_string());
        opts.push("no_write_workqueue".to_string());
    }
    if sector_size != 512 {
        opts.push(format!("sector_size:{sector_size}"));
    }
    if large {
        opts.push("iv_large_sectors".to_string());
    }
    let opt_text = if opts.is_empty() {
        String::new()
    } else {
        format!(" {} {}", opts.len(), opts.join(" "))
    };
    let table = format!(
        "0 {len_sectors} crypt aes-xts-plain64 {key} {iv_offset} {} {offset_sectors}{opt_text}",
        file.display()
    );
    let reg = Registry::new();
    let m = reg.create("c", &table).unwrap();

    let mut rng = Rng::new(iv_offset ^ offset_sectors ^ u64::from(sector_size));
    let mut plain = vec![0u8; (len_sectors * 512) as usize];
    rng.fill(&mut plain);
    // Written in two pieces (second via the scratch path) to exercise the sector arithmetic.
    let half = plain.len() / 2;
    m.write_at(0, &plain[..half], WriteFlags::default())
        .unwrap();
    let mut scratch = plain[half..].to_vec();
    m.write_at_scratch(half as u64, &mut scratch, WriteFlags::default())
        .unwrap();
    m.flush().unwrap();

    let disk = std::fs::read(&file).unwrap();
    let start = (offset_sectors * 512) as usize;
    let cipher_region = &disk[start..start + plain.len()];
    assert_ne!(cipher_region, &plain[..], "data was not encrypted");
    // Bytes outside the mapped region are untouched.
    assert!(disk[..start].iter().all(|&b| b == 0));
    assert!(disk[start + plain.len()..].iter().all(|&b| b == 0));

    let mut extra = vec![
        "--iv-offset".to_string(),
        iv_offset.to_string(),
        "--sector-size".to_string(),
        sector_size.to_string(),
    ];
    if large {
        extra.push("--iv-large-sectors".into());
    }
    let decrypted = pyca("decrypt", key, &extra, cipher_region);
    assert!(
        decrypted == plain,
        "pyca disagrees with our ciphertext ({table})"
    );

    // Reverse: pyca encrypts, we decrypt a sub-range (sector 16 onwards, pyca --start-sector).
    let mut plain2 = vec![0u8; 64 * 512];
    rng.fill(&mut plain2);
    let mut extra2 = extra.clone();
    extra2.extend(["--start-sector".to_string(), "64".to_string()]);
    let enc = pyca("encrypt", key, &extra2, &plain2);
    drop(m);
    reg.remove("c").unwrap();
    let mut disk = std::fs::read(&file).unwrap();
    disk[start + 64 * 512..start + 128 * 512].copy_from_slice(&enc);
    std::fs::write(&file, &disk).unwrap();
    let m = reg.create("c", &table).unwrap();
    let mut back = vec![0u8; plain2.len()];
    m.read_at(64 * 512, &mut back).unwrap();
    assert!(
        back == plain2,
        "we disagree with pyca's ciphertext ({table})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn aes_xts_plain64_matches_pyca() {
    if !require_pyca() {
        return;
    }
    let key256 = &KEY64[..64]; // AES-128-XTS
    check(KEY64, 0, 0, 512, false, false);
    check(KEY64, 0, 0, 512, false, true);
    check(KEY64, 1000, 8, 512, false, false);
    check(key256, 7, 3, 512, false, true);
    check(KEY64, 16, 24, 4096, false, false);
    check(KEY64, 16, 24, 4096, true, true);
}

/// Crypt over a RAM disk decrypts straight out of the disk's memory and encrypts straight
/// into it (one pass, see `BlockDevice::read_transformed`); requests spanning several RAM
/// chunks, at offsets where that path is taken (4 KiB aligned) and where it is not, must
/// still produce the bytes pyca produces.
#[test]
fn crypt_over_ram_disk_matches_pyca() {
    if !require_pyca() {
        return;
    }
    for (offset_sectors, sector_size, iv_offset) in [
        (0u64, 512u32, 0u64),
        (8, 4096, 16),
        (1, 512, 3),
        (2048, 4096, 0),
    ] {
        let reg = Registry::new();
        let ram = format!("ram:{}#fused-{offset_sectors}", 8 << 20);
        let len_sectors: u64 = 1024; // 512 KiB: eight or nine 64 KiB chunks
        let opts = if sector_size == 512 {
            "2 no_read_workqueue no_write_workqueue".to_string()
        } else {
            format!("3 no_read_workqueue no_write_workqueue sector_size:{sector_size}")
        };
        let table = format!(
            "0 {len_sectors} crypt aes-xts-plain64 {KEY64} {iv_offset} {ram} {offset_sectors} {opts}"
        );
        let crypt = reg.create("c", &table).unwrap();
        let raw = reg
            .create(
                "raw",
                &format!("0 {len_sectors} linear {ram} {offset_sectors}"),
            )
            .unwrap();
        let mut rng = Rng::new(offset_sectors + 1);
        let mut plain = vec![0u8; (len_sectors * 512) as usize];
        rng.fill(&mut plain);
        // Pieces of uneven sizes, all through the scratch (one-pass) write path.
        let cuts = [0usize, 12288, 208896, 212992, plain.len()];
        for w in cuts.windows(2) {
            let mut piece = plain[w[0]..w[1]].to_vec();
            crypt
                .write_at_scratch(w[0] as u64, &mut piece, WriteFlags::default())
                .unwrap();
        }
        let mut back = vec![0u8; plain.len()];
        crypt.read_at(0, &mut back).unwrap();
        assert!(back == plain, "read back differs ({table})");
        let mut part = vec![0u8; 204800];
        crypt.read_at(8192, &mut part).unwrap();
        assert!(
            part[..] == plain[8192..8192 + 204800],
            "partial read ({table})"
        );

        let mut cipher_text = vec![0u8; plain.len()];
        raw.read_at(0, &mut cipher_text).unwrap();
        assert_ne!(cipher_text, plain, "data was not encrypted");
        let extra = [
            "--iv-offset".to_string(),
            iv_offset.to_string(),
            "--sector-size".to_string(),
            sector_size.to_string(),
        ];
        let decrypted = pyca("decrypt", KEY64, &extra, &cipher_text);
        assert!(
            decrypted == plain,
            "pyca disagrees with our ciphertext ({table})"
        );
    }
}
