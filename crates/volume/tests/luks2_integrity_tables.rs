//! The tables that activate a LUKS2 `--integrity` volume, against the kernel's own: for
//! volumes cryptsetup 2.6 made and activated in the lab (kernel 6.12), the crypt line equals
//! `dmsetup table --showkeys` and the integrity line carries the same fields and options.

use cryptblk_cipher::SecretBytes;
use cryptblk_format::integrity::IntegritySuperblock;
use cryptblk_format::luks2::integrity::{IntegrityAlgorithm, IntegrityLayout, SegmentIntegrity};
use cryptblk_format::luks2::Luks2Header;
use cryptblk_volume::luks2_integrity::{crypt_table, integrity_table};
use std::path::Path;

/// Kernel-made images (crates/dm/tests/aead_fixtures, cryptsetup 2.6.1 + kernel 6.12, opened
/// with `--disable-keyring` so `dmsetup table --showkeys` printed the key): the crypt line
/// cryptblk builds from the header and the passphrase is the kernel's, byte for byte (key
/// included), and the integrity line has the kernel's size, offset, tag size, mode and
/// options.
#[test]
fn table_lines_equal_the_kernels_for_kernel_made_images() {
    use cryptblk_format::integrity::IntegritySuperblock;
    use cryptblk_format::luks2::UnlockPurpose;
    let fixtures = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dm/tests/aead_fixtures"
    ));
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for name in [
        "gcm-random",
        "gcm-random-4k",
        "chacha20-random-poly1305",
        "chacha20-plain64-poly1305",
        "xts-plain64-hmac-sha256",
        "xts-random-hmac-sha256",
        "xts-random-hmac-sha256-4k",
        "cbc-essiv-hmac-sha512",
    ] {
        let tables = std::fs::read_to_string(fixtures.join(format!("{name}.tables"))).unwrap();
        let line = |prefix: &str| {
            tables
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("{name}: no '{prefix}' line"))
                .to_string()
        };
        let (kernel_int, kernel_crypt) = (line("kaead_dif: "), line("kaead: "));
        let img = dir.path().join(format!("{name}.img"));
        let out = std::process::Command::new("xz")
            .arg("-dc")
            .arg(fixtures.join(format!("{name}.img.xz")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: xz");
        std::fs::write(&img, &out.stdout).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let h = Luks2Header::read(&f).unwrap();
        let vk = h
            .unlock(&f, b"cryptblk-aead-fixture", None, UnlockPurpose::Activate)
            .unwrap()
            .key;
        let l = h.integrity_layout().unwrap().expect("integrity segment");
        let sb = IntegritySuperblock::read(&f, l.superblock_offset / 512).unwrap();
        let ours_crypt = crypt_table(&l, &vk, "254:0", sb.provided_data_sectors, &[])
            .unwrap()
            .to_text(true)
            .trim_end()
            .to_string();
        if kernel_crypt.contains(":logon:") {
            // Key in the kernel keyring: compare everything but the key field.
            let o: Vec<&str> = ours_crypt.split_whitespace().collect();
            let k: Vec<&str> = kernel_crypt.split_whitespace().collect();
            assert_eq!(o.len(), k.len(), "{name}");
            for i in (0..o.len()).filter(|&i| i != 4) {
                assert_eq!(o[i], k[i], "{name}: crypt field {i}");
            }
        } else {
            assert_eq!(ours_crypt, kernel_crypt, "{name}");
        }
        let ours_int = integrity_table(&l, "7:0", &sb, false)
            .unwrap()
            .to_text(false)
            .trim_end()
            .to_string();
        let o: Vec<&str> = ours_int.split_whitespace().collect();
        let k: Vec<&str> = kernel_int.split_whitespace().collect();
        assert_eq!(o[..7], k[..7], "{name}: {ours_int} vs {kernel_int}");
        for opt in &o[8..] {
            assert!(k[8..].contains(opt), "{name}: {opt} not in {kernel_int}");
        }
        checked += 1;
    }
    assert_eq!(checked, 8);
}

#[test]
fn table_lines_of_a_layout() {
    let alg = IntegrityAlgorithm::from_name("hmac-sha256").unwrap();
    let si = SegmentIntegrity::new(&alg, alg.default_key_size);
    let l = IntegrityLayout::new(si, "aes-xts-plain64", 64, 4 << 20, 512, 0).unwrap();
    let format = cryptblk_volume::luks2_integrity::format_table(&l, "/dev/x", true);
    assert_eq!(
        format.to_text(true).as_str(),
        "0 8 integrity /dev/x 8192 32 J 0\n"
    );
    let sb = IntegritySuperblock {
        version: 4,
        integrity_tag_size: 32,
        provided_data_sectors: 52800,
        flags: 0x8,
        ..Default::default()
    };
    assert_eq!(
        integrity_table(&l, "/dev/x", &sb, false)
            .unwrap()
            .to_text(true)
            .as_str(),
        "0 52800 integrity /dev/x 8192 32 J 1 fix_padding\n"
    );
    let vk = SecretBytes::from_slice(&[0x11; 64]);
    let line = crypt_table(&l, &vk, "/dev/mapper/v_dif", 52800, &[])
        .unwrap()
        .to_text(true);
    assert!(line.starts_with("0 52800 crypt capi:authenc(hmac(sha256),xts(aes))-plain64 1111"));
    assert!(line.ends_with(" 0 /dev/mapper/v_dif 0 1 integrity:32:aead\n"));
}
