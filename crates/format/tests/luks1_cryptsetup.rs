//! LUKS1 interoperability with the real cryptsetup binary, in both directions, plus data
//! encrypted through cryptblk checked by an independent pyca/cryptography model.

mod common;

use common::*;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::keyfile::{read_key_file, KeyFileLimits};
use cryptblk_format::luks1::{Luks1FormatParams, Luks1Volume};
use cryptblk_format::FormatError;
use std::fs::{File, OpenOptions};
use std::path::Path;

fn rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fast_kdf(hash: HashAlgorithm) -> PbkdfRequest {
    PbkdfRequest::pbkdf2(hash).with_forced_iterations(1000)
}

/// Enabled slot numbers as cryptsetup's luksDump lists them.
fn cryptsetup_slots(img: &Path) -> Vec<usize> {
    let (rc, out, err) = cryptsetup(&["luksDump", s(img)]);
    assert_eq!(rc, 0, "luksDump failed: {err}");
    out.lines()
        .filter_map(|l| l.strip_prefix("Key Slot "))
        .filter(|l| l.ends_with("ENABLED"))
        .map(|l| l[..1].parse().unwrap())
        .collect()
}

fn test_passphrase(img: &Path, key: &Path, slot: Option<usize>) -> i32 {
    let mut args = vec![
        "open",
        "--test-passphrase",
        "--batch-mode",
        "--key-file",
        s(key),
    ];
    let slot_s;
    if let Some(n) = slot {
        slot_s = n.to_string();
        args.extend(["--key-slot", &slot_s]);
    }
    args.push(s(img));
    cryptsetup(&args).0
}

fn write_key(dir: &TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn cryptsetup_formats_cryptblk_unlocks() {
    if !require_tool("cryptsetup", "CRYPTBLK_SKIP_CRYPTSETUP") {
        return;
    }
    let cases = [
        ("aes-xts-plain64", 512, "sha256"),
        ("aes-xts-plain64", 256, "sha512"),
        ("aes-cbc-essiv:sha256", 256, "sha1"),
        ("aes-cbc-plain64", 128, "ripemd160"),
        ("aes-xts-plain64", 256, "whirlpool"),
    ];
    for (cipher, bits, hash) in cases {
        let dir = TempDir::new("cs2cb");
        let img = dir.join("img");
        File::create(&img).unwrap().set_len(3 << 20).unwrap();
        let k0 = write_key(&dir, "k0", b"first passphrase");
        // Binary key file with newlines: the whole file is the key.
        let k1 = write_key(&dir, "k1", b"\x00bin\nary\xff key\n");
        let k2 = write_key(&dir, "k2", b"0123456789abcdefghijklmnopqrstuvwxyz");
        let bits_s = bits.to_string();
        let (rc, _, err) = cryptsetup(&[
            "luksFormat",
            "--type",
            "luks1",
            "--batch-mode",
            "--cipher",
            cipher,
            "--key-size",
            &bits_s,
            "--hash",
            hash,
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&k0),
            s(&img),
        ]);
        assert_eq!(rc, 0, "luksFormat {cipher} {bits} {hash}: {err}");
        let (rc, _, err) = cryptsetup(&[
            "luksAddKey",
            "--batch-mode",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&k0),
            "--key-slot",
            "3",
            s(&img),
            s(&k1),
        ]);
        assert_eq!(rc, 0, "luksAddKey: {err}");
        let (rc, _, err) = cryptsetup(&[
            "luksAddKey",
            "--batch-mode",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&k0),
            "--new-keyfile-offset",
            "5",
            "--new-keyfile-size",
            "10",
            s(&img),
            s(&k2),
        ]);
        assert_eq!(rc, 0, "luksAddKey with offset/size: {err}");

        let expected_vk = cryptsetup_volume_key(&img, &k0);
        assert_eq!(expected_vk.len() * 8, bits);
        let vol = Luks1Volume::open(File::open(&img).unwrap()).unwrap();
        let k2_bytes = read_key_file(
            &k2,
            KeyFileLimits {
                offset: 5,
                size: Some(10),
            },
        )
        .unwrap();
        let keys: [(&[u8], usize); 3] = [
            (&std::fs::read(&k0).unwrap(), 0),
            (&std::fs::read(&k1).unwrap(), 3),
            (k2_bytes.as_bytes(), 1),
        ];
        for (key, slot) in keys {
            let u = vol
                .unlock(key, None)
                .unwrap_or_else(|e| panic!("{cipher}/{hash}: {e}"));
            assert_eq!(u.keyslot, slot, "{cipher}/{hash}");
            assert_eq!(
                u.volume_key.as_bytes(),
                &expected_vk[..],
                "{cipher}/{hash} VK"
            );
        }
        let e = vol.unlock(b"not a key", None).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        // Our dump text is cryptsetup's, byte for byte.
        let (_, dump, _) = cryptsetup(&["luksDump", s(&img)]);
        assert_eq!(vol.dump(s(&img), None), dump, "{cipher}/{hash} dump");
        let (_, vkdump, _) = cryptsetup(&[
            "luksDump",
            "--dump-volume-key",
            "--batch-mode",
            "--key-file",
            s(&k0),
            s(&img),
        ]);
        let vk = SecretBytes::from_slice(&expected_vk);
        assert_eq!(
            vol.dump(s(&img), Some(&vk)),
            vkdump,
            "{cipher}/{hash} VK dump"
        );
        // Header backup is byte-identical to cryptsetup's.
        let cs_backup = dir.join("cs-backup");
        let (rc, _, err) = cryptsetup(&[
            "luksHeaderBackup",
            s(&img),
            "--header-backup-file",
            s(&cs_backup),
        ]);
        assert_eq!(rc, 0, "luksHeaderBackup: {err}");
        assert!(
            vol.header_backup().unwrap() == std::fs::read(&cs_backup).unwrap(),
            "{cipher}/{hash}: header backup differs from cryptsetup's"
        );
    }
}

#[test]
fn cryptblk_formats_cryptsetup_reads() {
    if !require_tool("cryptsetup", "CRYPTBLK_SKIP_CRYPTSETUP") {
        return;
    }
    let cases = [
        ("aes-xts-plain64", 64, HashAlgorithm::Sha256),
        ("aes-xts-plain64", 32, HashAlgorithm::Sha1),
        ("aes-cbc-essiv:sha256", 32, HashAlgorithm::Sha512),
        ("aes-cbc-essiv:sha256", 16, HashAlgorithm::Ripemd160),
    ];
    for (cipher, key_bytes, hash) in cases {
        let dir = TempDir::new("cb2cs");
        let img = dir.join("img");
        File::create(&img).unwrap().set_len(3 << 20).unwrap();
        let k = |n: &str, b: &[u8]| write_key(&dir, n, b);
        let (ka, kb, kc, kd) = (
            k("a", b"alpha\n"),
            k("b", b"beta"),
            k("c", b"gamma"),
            k("d", b"delta"),
        );
        let mut p = Luks1FormatParams::new(cipher, key_bytes, hash).unwrap();
        p.kdf = fast_kdf(hash);
        p.uuid = Some("0b1f0f6a-1f35-4f2b-9b4b-1d2a8a9d0c11".into());
        let (mut vol, vk) = Luks1Volume::format(rw(&img), &p, b"alpha\n").unwrap();
        let tag = format!("{cipher}/{key_bytes}/{}", hash.name());

        // Layout equals what cryptsetup itself produces for the same parameters.
        let ref_img = dir.join("ref");
        File::create(&ref_img).unwrap().set_len(3 << 20).unwrap();
        let bits = (key_bytes * 8).to_string();
        let (rc, _, err) = cryptsetup(&[
            "luksFormat",
            "--type",
            "luks1",
            "--batch-mode",
            "--cipher",
            cipher,
            "--key-size",
            &bits,
            "--hash",
            hash.name(),
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&ka),
            s(&ref_img),
        ]);
        assert_eq!(rc, 0, "{err}");
        let reference = Luks1Volume::open(File::open(&ref_img).unwrap()).unwrap();
        assert_eq!(
            reference.header().payload_offset,
            vol.header().payload_offset,
            "{tag}"
        );
        assert_eq!(
            reference.header().mk_digest_iterations,
            vol.header().mk_digest_iterations
        );
        for i in 0..8 {
            assert_eq!(
                reference.header().keyslots[i].key_material_offset,
                vol.header().keyslots[i].key_material_offset,
                "{tag} slot {i}"
            );
        }

        assert_eq!(test_passphrase(&img, &ka, Some(0)), 0, "{tag}");
        assert_eq!(cryptsetup_volume_key(&img, &ka), vk.as_bytes(), "{tag}");
        let (_, uuid, _) = cryptsetup(&["luksUUID", s(&img)]);
        assert_eq!(uuid.trim(), "0b1f0f6a-1f35-4f2b-9b4b-1d2a8a9d0c11");

        // Several keyslots.
        assert_eq!(vol.add_key(&vk, b"beta", None, &fast_kdf(hash)).unwrap(), 1);
        assert_eq!(
            vol.add_key_by_passphrase(b"beta", None, b"gamma", Some(5), &fast_kdf(hash))
                .unwrap(),
            5
        );
        assert_eq!(cryptsetup_slots(&img), vec![0, 1, 5], "{tag}");
        assert_eq!(test_passphrase(&img, &kb, Some(1)), 0, "{tag}");
        assert_eq!(test_passphrase(&img, &kc, Some(5)), 0, "{tag}");
        assert_eq!(
            test_passphrase(&img, &kd, None),
            2,
            "{tag}: wrong passphrase must be exit 2"
        );

        // Change, remove, kill.
        let (from, to) = vol
            .change_key(b"gamma", None, b"delta", None, &fast_kdf(hash))
            .unwrap();
        assert_eq!((from, to), (5, 2));
        assert_eq!(cryptsetup_slots(&img), vec![0, 1, 2], "{tag}");
        assert_eq!(test_passphrase(&img, &kd, Some(2)), 0, "{tag}");
        assert_eq!(test_passphrase(&img, &kc, None), 2, "{tag}");
        assert_eq!(vol.remove_key(b"beta").unwrap(), 1);
        vol.kill_slot(0).unwrap();
        assert_eq!(cryptsetup_slots(&img), vec![2], "{tag}");
        assert_eq!(test_passphrase(&img, &ka, None), 2, "{tag}");
        assert_eq!(test_passphrase(&img, &kd, None), 0, "{tag}");

        // Our dump equals cryptsetup's for the same header.
        let (_, dump, _) = cryptsetup(&["luksDump", s(&img)]);
        assert_eq!(vol.dump(s(&img), None), dump, "{tag}");

        // UUID change seen by cryptsetup.
        vol.set_uuid(Some("11111111-2222-3333-4444-555555555555"))
            .unwrap();
        let (_, uuid, _) = cryptsetup(&["luksUUID", s(&img)]);
        assert_eq!(uuid.trim(), "11111111-2222-3333-4444-555555555555");

        // cryptsetup restores a cryptblk header backup; cryptblk restores cryptsetup's.
        let ours = dir.join("ours.bak");
        std::fs::write(&ours, vol.header_backup().unwrap()).unwrap();
        vol.erase().unwrap();
        assert_eq!(
            test_passphrase(&img, &kd, None),
            1,
            "{tag}: no keyslots left is exit 1"
        );
        let (rc, _, err) = cryptsetup(&[
            "luksHeaderRestore",
            "--batch-mode",
            s(&img),
            "--header-backup-file",
            s(&ours),
        ]);
        assert_eq!(rc, 0, "{tag}: {err}");
        assert_eq!(test_passphrase(&img, &kd, None), 0, "{tag}");
        drop(vol);
        let cs_backup = dir.join("cs.bak");
        let (rc, _, err) = cryptsetup(&[
            "luksHeaderBackup",
            s(&img),
            "--header-backup-file",
            s(&cs_backup),
        ]);
        assert_eq!(rc, 0, "{err}");
        let mut vol = Luks1Volume::open(rw(&img)).unwrap();
        vol.erase().unwrap();
        assert!(matches!(
            vol.unlock(b"delta", None),
            Err(FormatError::NoKeyslot(_))
        ));
        let vol =
            Luks1Volume::restore_header(rw(&img), &std::fs::read(&cs_backup).unwrap()).unwrap();
        assert_eq!(vol.unlock(b"delta", None).unwrap().volume_key, vk);
    }
}

/// Data sectors encrypted through the cipher crate with the LUKS1 volume key decrypt with
/// the independent pyca/cryptography dm-crypt model.
#[test]
fn data_encrypted_by_cryptblk_decrypts_with_pyca() {
    if !require_tool("python3", "CRYPTBLK_SKIP_PYTHON") {
        return;
    }
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/independent/dmcrypt.py"
    );
    assert!(Path::new(model).exists(), "missing {model}");
    for (cipher, key_bytes) in [("aes-xts-plain64", 64), ("aes-cbc-essiv:sha256", 32)] {
        let dir = TempDir::new("pyca");
        let img = dir.join("img");
        File::create(&img).unwrap().set_len(3 << 20).unwrap();
        let mut p = Luks1FormatParams::new(cipher, key_bytes, HashAlgorithm::Sha256).unwrap();
        p.kdf = fast_kdf(HashAlgorithm::Sha256);
        let (vol, vk) = Luks1Volume::format(rw(&img), &p, b"pw").unwrap();
        let plain: Vec<u8> = (0..64 * 512u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut ct = plain.clone();
        let c = cryptblk_cipher::open_cipher(
            &vol.header().cipher_spec(),
            vk.as_bytes(),
            &cryptblk_cipher::SectorOptions::default(),
        )
        .unwrap();
        c.encrypt(0, &mut ct).unwrap();
        let ct_path = dir.join("ct");
        std::fs::write(&ct_path, &ct).unwrap();
        let out_path = dir.join("pt");
        let st = std::process::Command::new("python3")
            .args([
                model,
                "decrypt",
                "--cipher",
                cipher,
                "--key",
                &vk.to_hex(),
                s(&ct_path),
                s(&out_path),
            ])
            .status()
            .unwrap();
        assert!(st.success(), "pyca model failed for {cipher}");
        assert!(
            std::fs::read(&out_path).unwrap() == plain,
            "{cipher}: pyca disagrees"
        );
    }
}

/// Detached headers (`--header`): data offset 0, header file sized like cryptsetup's.
#[test]
fn detached_headers_interoperate() {
    if !require_tool("cryptsetup", "CRYPTBLK_SKIP_CRYPTSETUP") {
        return;
    }
    let dir = TempDir::new("detached");
    let key = write_key(&dir, "key", b"detached secret");
    let data = dir.join("data");
    File::create(&data).unwrap().set_len(4 << 20).unwrap();

    // cryptsetup writes a detached header; cryptblk opens it.
    let cs_hdr = dir.join("cs.hdr");
    let (rc, _, err) = cryptsetup(&[
        "luksFormat",
        "--type",
        "luks1",
        "--batch-mode",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        s(&key),
        "--header",
        s(&cs_hdr),
        s(&data),
    ]);
    assert_eq!(rc, 0, "{err}");
    let vol = Luks1Volume::open(File::open(&cs_hdr).unwrap()).unwrap();
    assert_eq!(vol.header().payload_offset, 0);
    let vk = vol.unlock(b"detached secret", None).unwrap().volume_key;
    assert_eq!(vk.as_bytes(), &cryptsetup_volume_key(&cs_hdr, &key)[..]);

    // cryptblk writes one; cryptsetup accepts it and the file has the same size.
    let cb_hdr = dir.join("cb.hdr");
    File::create(&cb_hdr).unwrap();
    let mut p = Luks1FormatParams::new("aes-xts-plain64", 64, HashAlgorithm::Sha256).unwrap();
    p.kdf = fast_kdf(HashAlgorithm::Sha256);
    p.data_offset_sectors = Some(0);
    let (vol, vk) = Luks1Volume::format(rw(&cb_hdr), &p, b"detached secret").unwrap();
    assert_eq!(vol.header().payload_offset, 0);
    assert_eq!(
        std::fs::metadata(&cb_hdr).unwrap().len(),
        std::fs::metadata(&cs_hdr).unwrap().len(),
        "detached header file size differs from cryptsetup's"
    );
    let (rc, _, err) = cryptsetup(&[
        "open",
        "--test-passphrase",
        "--batch-mode",
        "--key-file",
        s(&key),
        "--header",
        s(&cb_hdr),
        s(&data),
    ]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(cryptsetup_volume_key(&cb_hdr, &key), vk.as_bytes());
}

fn cryptsetup_stdin(args: &[&str], input: &[u8]) -> (i32, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("cryptsetup")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Piped passphrases end at the first newline; `--key-file -` takes all of stdin: the same
/// bytes cryptsetup used must unlock through cryptblk's readers.
#[test]
fn stdin_passphrase_rules_match_cryptsetup() {
    use cryptblk_format::keyfile::read_key_from;
    if !require_tool("cryptsetup", "CRYPTBLK_SKIP_CRYPTSETUP") {
        return;
    }
    let dir = TempDir::new("stdin");
    let img = dir.join("img");
    File::create(&img).unwrap().set_len(3 << 20).unwrap();
    let piped = b"line one\nline two\n";
    let (rc, err) = cryptsetup_stdin(
        &[
            "luksFormat",
            "--type",
            "luks1",
            "--batch-mode",
            "--pbkdf-force-iterations",
            "1000",
            s(&img),
        ],
        piped,
    );
    assert_eq!(rc, 0, "{err}");
    let binary = b"\x01bin\nary\n\nkey";
    let (rc, err) = cryptsetup_stdin(
        &[
            "luksAddKey",
            "--batch-mode",
            "--pbkdf-force-iterations",
            "1000",
            s(&img),
            "-",
        ],
        &[&b"line one\n"[..], &binary[..]].concat(),
    );
    // cryptsetup reads the existing passphrase up to the newline, then the new key file
    // "-" (binary) gets the rest of stdin.
    assert_eq!(rc, 0, "{err}");
    let vol = Luks1Volume::open(File::open(&img).unwrap()).unwrap();
    let pass = read_key_from(&piped[..], KeyFileLimits::default(), true, false).unwrap();
    assert_eq!(pass.as_bytes(), b"line one");
    assert_eq!(vol.unlock(pass.as_bytes(), None).unwrap().keyslot, 0);
    let key = read_key_from(&binary[..], KeyFileLimits::default(), false, false).unwrap();
    assert_eq!(vol.unlock(key.as_bytes(), None).unwrap().keyslot, 1);
    // The line-based reading of the binary key would be wrong: only the full bytes work.
    let line = read_key_from(&binary[..], KeyFileLimits::default(), true, false).unwrap();
    assert!(matches!(
        vol.unlock(line.as_bytes(), None),
        Err(FormatError::WrongPassphrase)
    ));
}
