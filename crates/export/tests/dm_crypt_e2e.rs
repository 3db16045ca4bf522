//! End to end: a cryptblk-dm `crypt` mapping served over NBD and FUSE to real clients, its
//! ciphertext checked with an independent AES-XTS implementation (pyca `cryptography`),
//! and a file system written through the stack checked by e2fsprogs on the decrypted
//! image.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{pattern, require_tool, run, run_text, TempDir};
use cryptblk_dm::{BlockDevice, Registry};
use cryptblk_export::{Export, ExportConfig, ExportDescription, FuseConfig, FuseExport, NbdConfig};

const MIB: u64 = 1 << 20;
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e0d0c0b0a090807060504030201000ffeeddccbbaa99887766554433221100";

/// Serves `dev` over NBD on a Unix socket in `dir`, as the daemon does: through the one
/// export interface.
fn start_nbd(dev: Arc<dyn BlockDevice>, dir: &TempDir) -> Box<dyn Export> {
    cryptblk_export::start(ExportConfig::Nbd(NbdConfig::unix(dir.join("s.sock"))), dev).unwrap()
}

/// The URI clients connect to, from the export's description.
fn nbd_uri(export: &dyn Export) -> String {
    match export.describe() {
        ExportDescription::Nbd(d) => d.uri,
        other => panic!("not an NBD export: {other:?}"),
    }
}

/// Encrypts or decrypts a whole image with AES-XTS as dm-crypt's aes-xts-plain64 does:
/// each `sector_size` unit is one XTS data unit, tweak = 64-bit little-endian IV sector
/// (counted in 512-byte sectors unless `iv_large`).
const PY_XTS: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
op, src, dst, key, ss, iv_large = sys.argv[1], sys.argv[2], sys.argv[3], bytes.fromhex(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
data = open(src, "rb").read()
out = bytearray()
for i in range(0, len(data), ss):
    iv = i // ss if iv_large else i // 512
    c = Cipher(algorithms.AES(key), modes.XTS(iv.to_bytes(16, "little")))
    f = c.encryptor() if op == "enc" else c.decryptor()
    out += f.update(data[i:i + ss]) + f.finalize()
open(dst, "wb").write(out)
"#;

fn python_ready() -> bool {
    if !require_tool("python3", "PYTHON3") {
        return false;
    }
    let ok = Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        return true;
    }
    if std::env::var("CRYPTBLK_SKIP_PYCRYPTOGRAPHY").as_deref() == Ok("1") {
        eprintln!("SKIPPED: python3 cryptography missing and CRYPTBLK_SKIP_PYCRYPTOGRAPHY=1");
        return false;
    }
    panic!("python3 with pyca cryptography is required (or CRYPTBLK_SKIP_PYCRYPTOGRAPHY=1)");
}

fn xts(op: &str, src: &Path, dst: &Path, sector_size: u32) {
    run(Command::new("python3")
        .args(["-c", PY_XTS, op])
        .arg(src)
        .arg(dst)
        .args([KEY, &sector_size.to_string(), "0"]));
}

fn crypt_mapping(
    reg: &Registry,
    name: &str,
    file: &Path,
    size: u64,
    extra: &str,
) -> Arc<dyn BlockDevice> {
    let table = format!(
        "0 {} crypt aes-xts-plain64 {KEY} 0 {} 0{extra}",
        size / 512,
        file.display()
    );
    reg.create(name, &table)
        .unwrap_or_else(|e| panic!("create {table}: {e}"))
}

#[test]
fn nbd_crypt_mapping_is_dm_crypt_compatible() {
    if !python_ready() || !require_tool("nbdcopy", "NBDCOPY") {
        return;
    }
    let dir = TempDir::new("e2e-nbd");
    let backing = dir.join("cipher.img");
    std::fs::write(&backing, vec![0u8; 16 * MIB as usize]).unwrap();
    let plain = pattern(40, 16 * MIB as usize);
    std::fs::write(dir.join("plain.img"), &plain).unwrap();

    let reg = Registry::new();
    let dev = crypt_mapping(&reg, "e2e", &backing, 16 * MIB, "");
    let server = start_nbd(dev, &dir);
    run(Command::new("nbdcopy")
        .arg(dir.join("plain.img"))
        .arg(nbd_uri(server.as_ref())));
    server.stop().unwrap();
    reg.remove("e2e").unwrap();

    // The backing file holds dm-crypt ciphertext: decrypt it independently.
    let ciphertext = std::fs::read(&backing).unwrap();
    assert!(
        ciphertext[..4096] != plain[..4096],
        "backing must not hold plaintext"
    );
    xts("dec", &backing, &dir.join("decrypted.img"), 512);
    assert!(
        std::fs::read(dir.join("decrypted.img")).unwrap() == plain,
        "pyca decryption differs"
    );

    // And the other way: ciphertext made by pyca reads back as plaintext over NBD.
    let plain2 = pattern(41, 16 * MIB as usize);
    std::fs::write(dir.join("plain2.img"), &plain2).unwrap();
    xts("enc", &dir.join("plain2.img"), &backing, 512);
    let dev = crypt_mapping(&reg, "e2e", &backing, 16 * MIB, "");
    let server = start_nbd(dev, &dir);
    run(Command::new("nbdcopy")
        .arg(nbd_uri(server.as_ref()))
        .arg(dir.join("out.img")));
    server.stop().unwrap();
    assert!(
        std::fs::read(dir.join("out.img")).unwrap() == plain2,
        "NBD read of pyca ciphertext differs"
    );
}

#[test]
fn ext4_through_fuse_loop_on_4k_crypt_checks_clean_after_independent_decryption() {
    if !python_ready()
        || !require_tool("losetup", "LOSETUP")
        || !require_tool("mkfs.ext4", "MKFS_EXT4")
        || !require_tool("debugfs", "DEBUGFS")
    {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        assert!(
            std::env::var("CRYPTBLK_SKIP_FUSE").as_deref() == Ok("1"),
            "/dev/fuse is required (or CRYPTBLK_SKIP_FUSE=1)"
        );
        eprintln!("SKIPPED: /dev/fuse is missing and CRYPTBLK_SKIP_FUSE=1");
        return;
    }
    let dir = TempDir::new("e2e-fuse");
    let backing = dir.join("cipher.img");
    let size = 48 * MIB;
    std::fs::write(&backing, vec![0u8; size as usize]).unwrap();
    let mnt = dir.join("fuse");
    let fs_dir = dir.join("fs");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&fs_dir).unwrap();
    let content = pattern(42, 3 * MIB as usize + 1234);

    let reg = Registry::new();
    // 4096-byte encryption sectors: the loop device's 512-byte requests need RMW.
    let dev = crypt_mapping(&reg, "e2e4k", &backing, size, " 1 sector_size:4096");
    assert_eq!(dev.logical_block_size(), 4096);
    let mut export = FuseExport::mount(dev, FuseConfig::new(&mnt)).unwrap();
    let lo = run_text(
        Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(export.file_path()),
    );
    let lo = lo.trim().to_string();
    let result = std::panic::catch_unwind(|| {
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo));
        run(Command::new("mount").arg(&lo).arg(&fs_dir));
        let written = std::panic::catch_unwind(|| {
            std::fs::write(fs_dir.join("payload.bin"), &content).unwrap();
            run(&mut Command::new("sync"));
        });
        run(Command::new("umount").arg(&fs_dir));
        if let Err(p) = written {
            std::panic::resume_unwind(p);
        }
    });
    let _ = Command::new("losetup").arg("-d").arg(&lo).status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while export.unmount().is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    export.unmount().expect("unmount after loop detach");
    // The export holds the device until dropped; the mapping is then free to go.
    drop(export);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    reg.remove("e2e4k").unwrap();

    xts("dec", &backing, &dir.join("plain.img"), 4096);
    let plain_img = dir.join("plain.img");
    let fsck = Command::new("fsck.ext4")
        .args(["-f", "-n"])
        .arg(&plain_img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "fsck of the independently decrypted image failed:\n{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    run(Command::new("debugfs")
        .args([
            "-R",
            &format!("dump /payload.bin {}", dir.join("dumped.bin").display()),
        ])
        .arg(&plain_img));
    assert!(
        std::fs::read(dir.join("dumped.bin")).unwrap() == content,
        "file read by debugfs differs"
    );
}

/// Large requests, which the NBD server does in pieces (one piece's crypto overlapped with
/// another's transfer), over a crypt mapping at both sector sizes: qemu-io writes pattern
/// files at offsets that are block- but not piece-aligned, nbdcopy reads with 1 MiB
/// requests. The backing decrypts with pyca to what was written, and the reads return that
/// plaintext.
#[test]
fn large_requests_in_pieces_match_pyca() {
    if !python_ready() || !require_tool("qemu-io", "QEMU_IO") || !require_tool("nbdcopy", "NBDCOPY")
    {
        return;
    }
    let dir = TempDir::new("e2e-pieces");
    let size = 8 * MIB;
    for (ss, extra) in [(512u64, ""), (4096, " 1 sector_size:4096")] {
        let backing = dir.join("cipher.img");
        let mut expected = pattern(50 + ss, size as usize);
        std::fs::write(dir.join("seed.img"), &expected).unwrap();
        xts("enc", &dir.join("seed.img"), &backing, ss as u32);
        let reg = Registry::new();
        let dev = crypt_mapping(&reg, "pieces", &backing, size, extra);
        // Pieces are off by default: turned on here at their smallest useful size.
        let config = NbdConfig::unix(dir.join("s.sock")).with_overlap_min(256 << 10);
        let server = cryptblk_export::start(ExportConfig::Nbd(config), dev).unwrap();
        let uri = nbd_uri(server.as_ref());

        let cases = [
            (3 * ss, MIB + 2 * ss),
            ((128 << 10) - ss, (700 << 10) + ss),
            (5 * MIB + ss, 2 * MIB - 3 * ss),
        ];
        let mut cmd = Command::new("qemu-io");
        cmd.args(["-f", "raw"]);
        for (i, &(off, len)) in cases.iter().enumerate() {
            let data = pattern(60 + i as u64, len as usize);
            let file = dir.join(&format!("w{i}.bin"));
            std::fs::write(&file, &data).unwrap();
            cmd.args(["-c", &format!("write -s {} {off} {len}", file.display())]);
            expected[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        cmd.arg(&uri);
        let out = run_text(&mut cmd);
        assert!(
            !out.contains("failed") && !out.contains("error"),
            "qemu-io:\n{out}"
        );

        // 1 MiB reads, each in pieces (byte-unaligned reads in pieces are checked against a
        // plain backing in nbd_pieces.rs).
        run(Command::new("nbdcopy")
            .arg("--request-size=1048576")
            .arg(&uri)
            .arg(dir.join("out.img")));
        assert!(
            std::fs::read(dir.join("out.img")).unwrap() == expected,
            "nbdcopy read differs (sector size {ss})"
        );
        server.stop().unwrap();
        reg.remove("pieces").unwrap();

        xts("dec", &backing, &dir.join("dec.img"), ss as u32);
        assert!(
            std::fs::read(dir.join("dec.img")).unwrap() == expected,
            "pyca decryption of the backing differs (sector size {ss})"
        );
    }
}
