//! Compatibility with the real cryptsetup in both directions:
//! volumes made by `cryptsetup luksFormat --type luks2` unlock in cryptblk to the volume key
//! `cryptsetup luksDump --dump-volume-key` prints, and cryptblk prints the same luksDump;
//! volumes made or changed by cryptblk pass `cryptsetup open --test-passphrase` and
//! `cryptsetup luksDump` shows what cryptblk shows.

mod luks2_common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::{PbkdfKind, PbkdfRequest};
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header, UnlockPurpose};
use luks2_common::*;
use std::path::Path;

fn pbkdf2_fast() -> PbkdfRequest {
    PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000)
}

fn argon_fast(kind: PbkdfKind) -> PbkdfRequest {
    PbkdfRequest {
        kind,
        hash: HashAlgorithm::Sha256,
        iter_time_ms: 100,
        force_iterations: Some(4),
        max_memory_kib: 32,
        parallel: 1,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sparse(p: &Path, len: u64) {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(len).unwrap();
}

/// Volume key hex from `cryptsetup luksDump --dump-volume-key`.
fn cs_volume_key(args: &[&str], key: &[u8]) -> String {
    let mut a = vec!["luksDump", "--dump-volume-key", "-q", "--key-file=-"];
    a.extend_from_slice(args);
    let (rc, out, err) = cryptsetup(&a, key);
    assert_eq!(rc, 0, "dump-volume-key failed: {err}");
    let mut hex = String::new();
    let mut on = false;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("MK dump:") {
            on = true;
            hex.push_str(rest);
        } else if on && line.starts_with('\t') {
            hex.push_str(line);
        } else if on {
            break;
        }
    }
    hex.split_whitespace().collect()
}

fn cs_ok(args: &[&str], stdin: &[u8]) -> String {
    let (rc, out, err) = cryptsetup(args, stdin);
    assert_eq!(rc, 0, "cryptsetup {args:?} failed: {err}");
    out
}

const PW: &[u8] = b"correct horse";

#[test]
fn cryptsetup_volumes_unlock_in_cryptblk() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("cs2cb");
    let keyfile: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
    let cases: Vec<(&str, Vec<&str>, Vec<u8>)> = vec![
        (
            "pbkdf2",
            vec!["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"],
            PW.to_vec(),
        ),
        (
            "argon2i",
            vec![
                "--pbkdf",
                "argon2i",
                "--pbkdf-memory",
                "32",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-parallel",
                "1",
            ],
            PW.to_vec(),
        ),
        (
            "argon2id",
            vec![
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "64",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-parallel",
                "2",
            ],
            PW.to_vec(),
        ),
        (
            "keyfile",
            vec!["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"],
            keyfile.clone(),
        ),
        (
            "sector4k",
            vec![
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--sector-size",
                "4096",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
            ],
            PW.to_vec(),
        ),
        (
            "mda64k",
            vec![
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--luks2-metadata-size",
                "64k",
                "--luks2-keyslots-size",
                "2m",
            ],
            PW.to_vec(),
        ),
        (
            "labels",
            vec![
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--label",
                "my label",
                "--subsystem",
                "sys1",
                "--hash",
                "sha512",
            ],
            PW.to_vec(),
        ),
    ];
    for (name, args, key) in &cases {
        let img = dir.path(&format!("{name}.img"));
        sparse(&img, 20 << 20);
        let mut a = vec!["luksFormat", "--type", "luks2", "-q", "--key-file=-"];
        a.extend_from_slice(args);
        a.push(s(&img));
        cs_ok(&a, key);
        let vk = cs_volume_key(&[s(&img)], key);
        let f = open_rw(&img);
        let h = Luks2Header::read(&f).unwrap();
        let u = h.unlock(&f, key, None, UnlockPurpose::Activate).unwrap();
        assert_eq!(u.key.to_hex(), vk, "{name}");
        assert!(h.unlock(&f, b"wrong", None, UnlockPurpose::Verify).is_err());
        let dump = cs_ok(&["luksDump", s(&img)], b"");
        assert_eq!(h.dump(), dump, "{name}: luksDump text");
        let (_, vk_text, _) = cryptsetup(
            &[
                "luksDump",
                "--dump-volume-key",
                "-q",
                "--key-file=-",
                s(&img),
            ],
            key,
        );
        assert_eq!(
            h.dump_volume_key(s(&img), &u.key),
            vk_text,
            "{name}: volume key dump"
        );
        match *name {
            "sector4k" => assert_eq!(h.default_segment().unwrap().sector_size, 4096),
            "mda64k" => {
                assert_eq!(h.metadata_size(), 65536);
                assert_eq!(h.keyslots_size(), 2 << 20);
            }
            "labels" => assert_eq!((h.label(), h.subsystem()), ("my label", "sys1")),
            "argon2i" => assert_eq!(h.keyslots()[0].kdf, "argon2i"),
            _ => {}
        }
    }

    // Several keyslots: a second passphrase added by cryptsetup.
    let img = dir.path("pbkdf2.img");
    let newkey = dir.path("newkey");
    std::fs::write(&newkey, b"second one").unwrap();
    cs_ok(
        &[
            "luksAddKey",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "-S",
            "5",
            s(&img),
            s(&newkey),
        ],
        PW,
    );
    let f = open_rw(&img);
    let h = Luks2Header::read(&f).unwrap();
    let u = h
        .unlock(&f, b"second one", None, UnlockPurpose::Activate)
        .unwrap();
    assert_eq!(u.slot, 5);
    assert_eq!(u.key.to_hex(), cs_volume_key(&[s(&img)], PW));

    // Detached header.
    let hdr = dir.path("detached.hdr");
    let data = dir.path("detached.data");
    sparse(&data, 4 << 20);
    cs_ok(
        &[
            "luksFormat",
            "--type",
            "luks2",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--header",
            s(&hdr),
            s(&data),
        ],
        PW,
    );
    let f = open_rw(&hdr);
    let h = Luks2Header::read(&f).unwrap();
    assert_eq!(h.data_offset(), 0);
    let u = h.unlock(&f, PW, None, UnlockPurpose::Activate).unwrap();
    assert_eq!(u.key.to_hex(), cs_volume_key(&[s(&hdr)], PW));
}

#[test]
fn damaged_primary_header_is_recovered_from_secondary() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("damaged");
    for (tag, offset, len) in [
        ("bin", 0u64, 4096usize),
        ("json", 5000, 64),
        ("magic", 0, 6),
    ] {
        let img = dir.path(&format!("{tag}.img"));
        sparse(&img, 20 << 20);
        cs_ok(
            &[
                "luksFormat",
                "--type",
                "luks2",
                "-q",
                "--key-file=-",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--luks2-metadata-size",
                "32k",
                s(&img),
            ],
            PW,
        );
        let vk = cs_volume_key(&[s(&img)], PW);
        let f = open_rw(&img);
        f.write_at(offset, &vec![0x5a; len]).unwrap();
        let mut h = Luks2Header::read(&f).unwrap();
        assert!(h.needs_repair(), "{tag}");
        assert_eq!(h.metadata_size(), 32768);
        let u = h.unlock(&f, PW, None, UnlockPurpose::Activate).unwrap();
        assert_eq!(u.key.to_hex(), vk, "{tag}");
        h.repair(&f).unwrap();
        let h2 = Luks2Header::read(&f).unwrap();
        assert!(!h2.needs_repair());
        // The rewritten primary alone must satisfy cryptsetup: break the secondary.
        f.write_at(32768, &[0u8; 4096]).unwrap();
        assert_eq!(cs_volume_key(&[s(&img)], PW), vk, "{tag}");
    }
}

#[test]
fn cryptblk_volumes_open_in_cryptsetup() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("cb2cs");
    let variants: Vec<(&str, FormatParams)> = vec![
        (
            "default",
            FormatParams {
                label: "cryptblk".into(),
                subsystem: "test".into(),
                keyslot: KeyslotParams::new(pbkdf2_fast()),
                ..FormatParams::default()
            },
        ),
        (
            "argon2id-4k",
            FormatParams {
                sector_size: 4096,
                metadata_size: 65536,
                keyslots_size: Some(1 << 20),
                keyslot: KeyslotParams::new(argon_fast(PbkdfKind::Argon2id)),
                ..FormatParams::default()
            },
        ),
        (
            "argon2i-cbc",
            FormatParams {
                cipher: "aes-cbc-essiv:sha256".into(),
                key_size: 32,
                uuid: Some("11111111-2222-3333-4444-555555555555".into()),
                keyslot: KeyslotParams::new(argon_fast(PbkdfKind::Argon2i)),
                ..FormatParams::default()
            },
        ),
    ];
    for (name, p) in variants {
        let img = dir.path(&format!("{name}.img"));
        sparse(&img, 20 << 20);
        let f = open_rw(&img);
        let (h, vk, slot) = Luks2Header::format(&f, &p, PW).unwrap();
        assert_eq!(slot, 0);
        cs_ok(&["open", "--test-passphrase", "--key-file=-", s(&img)], PW);
        assert_eq!(cs_volume_key(&[s(&img)], PW), vk.to_hex(), "{name}");
        assert_eq!(cs_ok(&["luksDump", s(&img)], b""), h.dump(), "{name}");
        let (rc, _, _) = cryptsetup(
            &["open", "--test-passphrase", "--key-file=-", s(&img)],
            b"nope",
        );
        assert_eq!(rc, 2, "wrong passphrase must give exit code 2");
        if name == "argon2i-cbc" {
            assert_eq!(
                cs_ok(&["luksUUID", s(&img)], b"").trim(),
                "11111111-2222-3333-4444-555555555555"
            );
        }
    }

    // Keyslot edits on the default volume, each checked by cryptsetup.
    let img = dir.path("default.img");
    let f = open_rw(&img);
    let mut h = Luks2Header::read_for_write(&f).unwrap();
    let vk = h.unlock(&f, PW, None, UnlockPurpose::Activate).unwrap().key;
    let mut p = KeyslotParams::new(pbkdf2_fast());
    p.slot = Some(3);
    p.priority = 2;
    assert_eq!(h.add_keyslot(&f, &vk, b"slot three", &p).unwrap(), 3);
    let (uslot, ukey) = h
        .add_unbound_keyslot(&f, 32, b"unbound pw", &KeyslotParams::new(pbkdf2_fast()))
        .unwrap();
    let dump = cs_ok(&["luksDump", s(&img)], b"");
    assert_eq!(dump, h.dump());
    assert!(dump.contains("  3: luks2\n") && dump.contains("Priority:   preferred"));
    assert!(dump.contains(&format!("  {uslot}: luks2 (unbound)\n")));
    cs_ok(
        &[
            "open",
            "--test-passphrase",
            "-S",
            "3",
            "--key-file=-",
            s(&img),
        ],
        b"slot three",
    );
    cs_ok(
        &[
            "open",
            "--test-passphrase",
            "--unbound",
            "-S",
            &uslot.to_string(),
            "--key-file=-",
            s(&img),
        ],
        b"unbound pw",
    );
    let out = cs_ok(
        &[
            "luksDump",
            "--unbound",
            "-S",
            &uslot.to_string(),
            "-q",
            "--key-file=-",
            s(&img),
        ],
        b"unbound pw",
    );
    let hex: String = out
        .lines()
        .skip_while(|l| !l.contains("Unbound Key:") && !l.contains("MK dump:"))
        .flat_map(|l| {
            l.split(':')
                .next_back()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        hex.contains(ukey.to_hex().as_str()),
        "unbound key not in: {out}"
    );
    assert_eq!(h.dump_unbound_key(s(&img), uslot, &ukey), out);

    // Change and remove, then the old secrets must fail in cryptsetup too.
    let changed = h
        .change_key(
            &f,
            b"slot three",
            b"slot three v2",
            None,
            &KeyslotParams::new(pbkdf2_fast()),
        )
        .unwrap();
    assert_eq!(changed, 3);
    cs_ok(
        &[
            "open",
            "--test-passphrase",
            "-S",
            "3",
            "--key-file=-",
            s(&img),
        ],
        b"slot three v2",
    );
    let (rc, _, _) = cryptsetup(
        &["open", "--test-passphrase", "--key-file=-", s(&img)],
        b"slot three",
    );
    assert_ne!(rc, 0);
    h.remove_keyslot(&f, 0).unwrap();
    let (rc, _, _) = cryptsetup(&["open", "--test-passphrase", "--key-file=-", s(&img)], PW);
    assert_ne!(rc, 0);
    cs_ok(
        &["open", "--test-passphrase", "--key-file=-", s(&img)],
        b"slot three v2",
    );

    // Label and UUID changes.
    h.set_label("relabelled").unwrap();
    h.set_uuid("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee").unwrap();
    h.write(&f).unwrap();
    assert_eq!(
        cs_ok(&["luksUUID", s(&img)], b"").trim(),
        "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    );
    assert!(cs_ok(&["luksDump", s(&img)], b"").contains("Label:         \trelabelled\n"));

    // cryptsetup adds a keyslot to the cryptblk volume; cryptblk opens it.
    let kf = dir.path("kf");
    std::fs::write(&kf, b"from cryptsetup").unwrap();
    cs_ok(
        &[
            "luksAddKey",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            s(&img),
            s(&kf),
        ],
        b"slot three v2",
    );
    let h = Luks2Header::read(&f).unwrap();
    assert_eq!(
        h.unlock(&f, b"from cryptsetup", None, UnlockPurpose::Activate)
            .unwrap()
            .key
            .to_hex(),
        vk.to_hex()
    );

    // Header backup restores a wiped header; cryptsetup reads backup and restored device.
    let backup = dir.path("backup.hdr");
    let out = std::fs::File::create(&backup).unwrap();
    h.backup(&f, &out).unwrap();
    cs_ok(&["luksDump", s(&backup)], b"");
    f.write_at(0, &vec![0u8; 2 * h.metadata_size() as usize])
        .unwrap();
    assert!(Luks2Header::read(&f).is_err());
    Luks2Header::restore(&f, &open_rw(&backup)).unwrap();
    cs_ok(
        &["open", "--test-passphrase", "--key-file=-", s(&img)],
        b"from cryptsetup",
    );

    // Erase: no keyslot left for either tool.
    let mut h = Luks2Header::read(&f).unwrap();
    h.erase(&f).unwrap();
    assert!(h.keyslots().is_empty());
    let (rc, _, _) = cryptsetup(
        &["open", "--test-passphrase", "--key-file=-", s(&img)],
        b"from cryptsetup",
    );
    assert_ne!(rc, 0);
    assert!(!cs_ok(&["luksDump", s(&img)], b"").contains(": luks2"));
}

#[test]
fn detached_header_made_by_cryptblk() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("cbdetached");
    let hdr = dir.path("h.hdr");
    let data = dir.path("d.img");
    sparse(&data, 1 << 20);
    std::fs::File::create(&hdr).unwrap();
    let f = open_rw(&hdr);
    let p = FormatParams {
        detached_header: true,
        keyslot: KeyslotParams::new(pbkdf2_fast()),
        ..FormatParams::default()
    };
    let (h, vk, _) = Luks2Header::format(&f, &p, PW).unwrap();
    assert_eq!(h.data_offset(), 0);
    cs_ok(
        &[
            "open",
            "--test-passphrase",
            "--key-file=-",
            "--header",
            s(&hdr),
            s(&data),
        ],
        PW,
    );
    assert_eq!(cs_volume_key(&[s(&hdr)], PW), vk.to_hex());
}
