//! cryptsetup's LUKS2 test images (compatimage2, luks2_valid_hdr, luks2_keyslot_unassigned,
//! luks2_invalid_cipher, luks2_header_requirements, luks2_mda_images, blkid-luks2-pv) with
//! the expectations of cryptsetup's own test suite (expected.tsv / README.md), and where a
//! volume is changed by cryptblk, the real cryptsetup must accept the result.

mod luks2_common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{self, KeyslotParams, Luks2Header, UnlockPurpose};
use cryptblk_format::FormatError;
use luks2_common::*;

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(HashAlgorithm::Sha256.digest(&[data]))
}

fn fast_pbkdf2() -> KeyslotParams {
    KeyslotParams::new(PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000))
}

#[test]
fn compatimage2_both_keyslots_and_payload() {
    let dir = Scratch::new("compat2");
    let img = dir.path("compatimage2.img");
    unxz("compatimage2.img.xz", &img);
    let f = open_rw(&img);
    let h = Luks2Header::read(&f).unwrap();
    assert_eq!(h.uuid(), "28632274-8c8a-493f-835b-da802e1c576b");
    assert_eq!(h.metadata_size(), 16384);
    assert_eq!(h.keyslots_size(), 4_161_536);
    let seg = h.default_segment().unwrap();
    assert_eq!(seg.encryption, "aes-cbc-essiv:sha256");
    assert_eq!(
        (seg.offset, seg.size, seg.sector_size),
        (4 << 20, None, 512)
    );
    assert_eq!(h.volume_key_size(), Some(16));

    let s0 = h
        .unlock(&f, b"compatkey", Some(0), UnlockPurpose::Activate)
        .unwrap();
    assert_eq!(s0.key.to_hex(), "d47ee2cdc40f39be9a3e8d72a149cc4d");
    let s1 = h
        .unlock(&f, b"0123456789abcdef", None, UnlockPurpose::Activate)
        .unwrap();
    assert_eq!(
        (s1.slot, s1.key.to_hex()),
        (1, "d47ee2cdc40f39be9a3e8d72a149cc4d".into())
    );
    assert!(matches!(
        h.unlock(&f, b"rUkL4RUryBom", None, UnlockPurpose::Verify),
        Err(FormatError::WrongPassphrase)
    ));
    assert!(matches!(
        h.unlock(&f, b"compatkey", Some(1), UnlockPurpose::Verify),
        Err(FormatError::WrongPassphrase)
    ));

    // What its crypt line is made of (the dm crate's tests print the line from these).
    assert_eq!(seg.iv_tweak, 0);
    assert!(h.config_flags().is_empty());
    let mut flagged = h.clone();
    flagged.set_config_flags(&[
        "allow-discards".to_string(),
        "no-read-workqueue".to_string(),
    ]);
    assert_eq!(
        flagged.config_flags(),
        ["allow-discards", "no-read-workqueue"]
    );
    let cipher = h.open_segment_cipher(&s0.key).unwrap();
    let mut sector = vec![0u8; 512];
    f.read_at(seg.offset, &mut sector).unwrap();
    cipher.decrypt(0, &mut sector).unwrap();
    assert_eq!(
        sha256_hex(&sector),
        "38ef2d1b8c387efb50680e1d3f234f170d2b7b6c6d9eb856b4f426543a6c4ef2"
    );
}

#[test]
fn pre_release_argon2_header_loads_but_cannot_unlock() {
    let dir = Scratch::new("validhdr");
    let img = dir.path("valid.img");
    unxz("luks2_valid_hdr.img.xz", &img);
    let f = open_rw(&img);
    let h = Luks2Header::read(&f).unwrap();
    assert_eq!(h.uuid(), "12a3a118-7039-4575-a649-3f559d8d87ee");
    assert_eq!(h.seqid(), 10);
    let ks = h.keyslots();
    assert_eq!(ks.len(), 8);
    assert!(ks.iter().all(|k| k.kdf == "argon2"));
    assert!(h
        .unlock(&f, b"anything", Some(0), UnlockPurpose::Verify)
        .is_err());
}

#[test]
fn unbound_keyslot_rules() {
    let have_tool = have_cryptsetup();
    let dir = Scratch::new("unassigned");
    let img = dir.path("u.img");
    unxz("luks2_keyslot_unassigned.img.xz", &img);
    let f = open_rw(&img);
    let mut h = Luks2Header::read(&f).unwrap();
    assert!(h.keyslot_is_bound(0));
    assert!(!h.keyslot_is_bound(1));
    assert!(h.dump().contains("  1: luks2 (unbound)\n"));

    let pw1 = b"93R4P4pIqAH8";
    let k1 = h.unlock(&f, pw1, Some(1), UnlockPurpose::Verify).unwrap();
    assert_eq!(
        k1.key.to_hex(),
        "44ef741f63e25907f4e821cc90ff5af254a88c6a15ef910a1f43b4548470828b"
    );
    assert_eq!(
        h.unlock(&f, pw1, None, UnlockPurpose::Unbound)
            .unwrap()
            .slot,
        1
    );
    assert!(h.unlock(&f, pw1, Some(1), UnlockPurpose::Activate).is_err());
    assert!(h.unlock(&f, pw1, None, UnlockPurpose::Activate).is_err());
    assert!(h
        .unlock(&f, b"compatkey", Some(1), UnlockPurpose::Verify)
        .is_err());
    let k0 = h
        .unlock(&f, b"compatkey", None, UnlockPurpose::Activate)
        .unwrap();
    assert_eq!(
        k0.key.to_hex(),
        "7b24adb65c60f5029f10aafc7dcf72153076a955fef73e62c44b88e41aae6c63"
    );

    h.remove_keyslot(&f, 0).unwrap();
    drop(h);
    let h = Luks2Header::read(&f).unwrap();
    assert!(!h.dump().contains("0: luks2"));
    assert_eq!(
        h.unlock(&f, pw1, None, UnlockPurpose::Unbound)
            .unwrap()
            .slot,
        1
    );
    if have_tool {
        let (rc, out, err) = cryptsetup(&["luksDump", img.to_str().unwrap()], b"");
        assert_eq!(rc, 0, "{err}");
        assert!(
            !out.contains("0: luks2") && out.contains("1: luks2 (unbound)"),
            "{out}"
        );
        let (rc, _, err) = cryptsetup(
            &[
                "open",
                "--test-passphrase",
                "--unbound",
                "-S1",
                "--key-file=-",
                img.to_str().unwrap(),
            ],
            pw1,
        );
        assert_eq!(rc, 0, "{err}");
    }
}

#[test]
fn kernel_cipher_name_verifies_but_cannot_activate() {
    let dir = Scratch::new("invcipher");
    let img = dir.path("c.img");
    unxz("luks2_invalid_cipher.img.xz", &img);
    let f = open_rw(&img);
    let h = Luks2Header::read(&f).unwrap();
    assert!(h.dump().contains("capi:xts(ecb(aes-generic))-plain64"));
    let u = h
        .unlock(&f, b"93R4P4pIqAH8", None, UnlockPurpose::Verify)
        .unwrap();
    assert_eq!(
        u.key.to_hex(),
        "edaa40709797973715e572bf7d86fcbb9cfe2051083c33c28d58fe4e1e7ff642"
    );
    let err = h
        .open_segment_cipher(&u.key)
        .err()
        .expect("activation must fail");
    assert!(
        err.to_string()
            .contains("No known cipher specification pattern"),
        "{err}"
    );
}

#[test]
fn unknown_requirements_allow_verification_only() {
    let dir = Scratch::new("reqs");
    untar("luks2_header_requirements.tar.xz", &dir.0);
    let img = dir.path("luks2_header_requirements");
    let f = open_rw(&img);
    let mut h = Luks2Header::read(&f).unwrap();
    assert_eq!(
        h.requirements(),
        vec!["req0".to_string(), "req1".to_string()]
    );
    assert!(h.dump().contains("Requirements:\treq0 req1 \n"));
    assert_eq!(h.token(0).unwrap()["type"], "user_type");
    let u = h
        .unlock(&f, b"blablabl", None, UnlockPurpose::Verify)
        .unwrap();
    assert_eq!(
        u.key.to_hex(),
        "07459b841ad76fcbc2b27e6d20195359dbfa6ba3aaf3abb25477c03a6fc936bd"
    );
    h.verify_volume_key(u.key.as_bytes()).unwrap();
    let unmet = |r: Result<(), FormatError>| {
        let e = r.expect_err("must be refused");
        assert!(e.to_string().contains("Unmet LUKS2 requirements"), "{e}");
    };
    unmet(
        h.unlock(&f, b"blablabl", None, UnlockPurpose::Activate)
            .map(|_| ()),
    );
    unmet(h.open_segment_cipher(&u.key).map(|_| ()));
    unmet(h.write(&f));
    unmet(h.add_keyslot(&f, &u.key, b"x", &fast_pbkdf2()).map(|_| ()));
    unmet(h.remove_keyslot(&f, 0));
    unmet(Luks2Header::read_for_write(&f).map(|_| ()));
    // Header backup still works and is a loadable header.
    let backup = dir.path("backup");
    let out = std::fs::File::create(&backup).unwrap();
    h.backup(&f, &out).unwrap();
    let b = open_rw(&backup);
    assert_eq!(Luks2Header::read(&b).unwrap().uuid(), h.uuid());

    // Restoring any header over the device with unknown requirements is refused too.
    let free_path = dir.path("luks2_header_requirements_free");
    unmet(Luks2Header::restore(&f, &open_rw(&free_path)).map(|_| ()));

    // The same header without requirements accepts changes.
    let free = open_rw(&dir.path("luks2_header_requirements_free"));
    let mut h = Luks2Header::read_for_write(&free).unwrap();
    let slot = h
        .add_keyslot(&free, &u.key, b"second", &fast_pbkdf2())
        .unwrap();
    let h = Luks2Header::read(&free).unwrap();
    assert_eq!(
        h.unlock(&free, b"second", None, UnlockPurpose::Activate)
            .unwrap()
            .slot,
        slot
    );
    // Tokens of unknown types survive the write verbatim.
    assert_eq!(h.token(0).unwrap()["type"], "user_type");
    assert_eq!(h.token(6).unwrap()["type"], "luks2-reserved");
}

#[test]
fn metadata_size_variants() {
    let have_tool = have_cryptsetup();
    let dir = Scratch::new("mda");
    untar("luks2_mda_images.tar.xz", &dir.0);
    for kib in [16u64, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
        let img = dir.path(&format!("test_image_{kib}"));
        let f = open_rw(&img);
        let mut h = Luks2Header::read(&f).unwrap();
        assert_eq!(h.metadata_size(), kib * 1024, "image {kib}");
        assert!(h.metadata_and_keyslots_size() <= h.data_offset(), "{kib}");
        assert_eq!(h.data_offset(), 12 << 20);
        let u = h
            .unlock(&f, b"Qx3qn46vq0v", None, UnlockPurpose::Activate)
            .unwrap();
        assert_eq!(
            u.key.to_hex(),
            "b67647946b62ded9d65983a92cd2c0f4c08923473deb44741da5ba675e8bde82"
        );
        let mut p = fast_pbkdf2();
        p.slot = Some(9);
        assert_eq!(h.add_keyslot(&f, &u.key, b"ocMakf3fAcQO", &p).unwrap(), 9);
        let token: serde_json::Value = serde_json::from_str(
            r#"{"type":"some_type","keyslots":[],"base64_data":"zxI7vKB1Qwl4VPB4D-N-OgcC14hPCG0IDu8O7eCqaQ"}"#,
        )
        .unwrap();
        h.import_token(Some(10), token.clone()).unwrap();
        h.write(&f).unwrap();
        drop(f);
        let f = open_rw(&img);
        let h = Luks2Header::read(&f).unwrap();
        assert_eq!(h.token(10), Some(&token));
        for pw in [&b"Qx3qn46vq0v"[..], b"ocMakf3fAcQO"] {
            assert_eq!(
                h.unlock(&f, pw, None, UnlockPurpose::Activate)
                    .unwrap()
                    .key
                    .to_hex(),
                u.key.to_hex()
            );
        }
        if have_tool {
            for pw in [&b"Qx3qn46vq0v"[..], b"ocMakf3fAcQO"] {
                let (rc, _, err) = cryptsetup(
                    &[
                        "open",
                        "--test-passphrase",
                        "--key-file=-",
                        img.to_str().unwrap(),
                    ],
                    pw,
                );
                assert_eq!(rc, 0, "cryptsetup rejects image {kib}: {err}");
            }
            let (rc, out, err) = cryptsetup(
                &["token", "export", "--token-id", "10", img.to_str().unwrap()],
                b"",
            );
            assert_eq!(rc, 0, "{err}");
            let exported: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            assert_eq!(exported, token);
        }
    }
}

#[test]
fn ambiguous_lvm_signature_needs_repair() {
    let have_tool = have_cryptsetup();
    let dir = Scratch::new("pv");
    let img = dir.path("pv.img");
    unxz("blkid-luks2-pv.img.xz", &img);
    let f = open_rw(&img);
    assert_eq!(luks2::lvm2_signature_sector(&f), Some(1));
    let err = luks2::is_luks2(&f).unwrap_err();
    assert!(err.to_string().contains("ambiguous signatures"), "{err}");
    luks2::repair_device(&f).unwrap();
    luks2::is_luks2(&f).unwrap();
    assert_eq!(luks2::lvm2_signature_sector(&f), None);
    if have_tool {
        for extra in [&[][..], &["--type", "luks2"][..]] {
            let mut args = vec!["isLuks"];
            args.extend_from_slice(extra);
            args.push(img.to_str().unwrap());
            let (rc, _, err) = cryptsetup(&args, b"");
            assert_eq!(
                rc, 0,
                "cryptsetup isLuks {extra:?} after cryptblk repair: {err}"
            );
        }
        let (rc, _, _) = cryptsetup(&["isLuks", "--type", "luks1", img.to_str().unwrap()], b"");
        assert_ne!(rc, 0);
    }
}

#[test]
fn dumps_match_cryptsetup_for_every_image() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("dumps");
    let mut images = Vec::new();
    for (xz, name) in [
        ("compatimage2.img.xz", "compatimage2.img"),
        ("luks2_valid_hdr.img.xz", "valid.img"),
        ("luks2_keyslot_unassigned.img.xz", "unassigned.img"),
        ("luks2_invalid_cipher.img.xz", "invcipher.img"),
    ] {
        let p = dir.path(name);
        unxz(xz, &p);
        images.push(p);
    }
    untar("luks2_header_requirements.tar.xz", &dir.0);
    images.push(dir.path("luks2_header_requirements"));
    images.push(dir.path("luks2_header_requirements_free"));
    untar("luks2_mda_images.tar.xz", &dir.0);
    for kib in [16, 256, 4096] {
        images.push(dir.path(&format!("test_image_{kib}")));
    }
    for img in &images {
        let f = open_rw(img);
        let h = Luks2Header::read(&f).unwrap();
        let p = img.to_str().unwrap();
        let (rc, text, err) = cryptsetup(&["luksDump", p], b"");
        assert_eq!(rc, 0, "{p}: {err}");
        assert_eq!(h.dump(), text, "{p}: luksDump text");
        let (rc, json, err) = cryptsetup(&["luksDump", "--dump-json-metadata", p], b"");
        assert_eq!(rc, 0, "{p}: {err}");
        assert_eq!(h.dump_json(), json, "{p}: JSON");
    }
}
