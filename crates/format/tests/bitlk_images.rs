//! BitLocker headers of cryptsetup's test images: `bitlkDump` text identical to cryptsetup's,
//! volume keys identical to `bitlkDump --dump-volume-key`, clear failures on damage.

mod common;

use common::{require_tool, untar, TempDir};
use cryptblk_format::bitlk::{BitlkHeader, BitlkKey, BitlkKind};
use cryptblk_format::FormatError;
use std::process::{Command, Stdio};

fn images() -> Option<(TempDir, Vec<std::path::PathBuf>)> {
    if !require_tool("cryptsetup", "CRYPTBLK_SKIP_CRYPTSETUP") {
        return None;
    }
    let dir = TempDir::new("bitlk");
    untar("bitlk-images.tar.xz", &dir);
    let mut imgs: Vec<_> = std::fs::read_dir(dir.join("bitlk-images"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "img"))
        .collect();
    imgs.sort();
    assert!(imgs.len() >= 21, "{} images", imgs.len());
    Some((dir, imgs))
}

fn cryptsetup(args: &[&str], stdin: &[u8]) -> (i32, String) {
    use std::io::Write;
    let mut c = Command::new("cryptsetup")
        .args(args)
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = c.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn dump_matches_cryptsetup() {
    let Some((_dir, imgs)) = images() else { return };
    // ctime prints local time: compare both in UTC.
    std::env::set_var("TZ", "UTC");
    for img in &imgs {
        let f = std::fs::File::open(img).unwrap();
        let h = BitlkHeader::read(&f).unwrap_or_else(|e| panic!("{}: {e}", img.display()));
        let (rc, want) = cryptsetup(&["bitlkDump", img.to_str().unwrap()], b"");
        assert_eq!(rc, 0, "{}", img.display());
        let ours = h.dump(img.to_str().unwrap());
        if img.to_str().unwrap().ends_with("-crc.img") {
            // Its first metadata copy is damaged ("CORRUPTE" over the description, so its
            // CRC-32 fails): cryptsetup 2.6.1 reads it anyway, 2.8 (and cryptblk) take the
            // next valid copy, whose description upstream's bitlk-compat-test expects to
            // start with DESKTOP. Every other line is 2.6.1's.
            let desc = |t: &str| {
                t.lines()
                    .find(|l| l.starts_with("Description:"))
                    .map(str::to_owned)
            };
            let rest = |t: &str| {
                t.lines()
                    .filter(|l| !l.starts_with("Description:"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            assert_eq!(rest(&ours), rest(&want), "{}", img.display());
            assert_eq!(
                desc(&ours).unwrap(),
                "Description:  \tDESKTOP-NPM7RCA H: 7/4/2019"
            );
            assert_ne!(desc(&want), desc(&ours), "2.6.1 reads the damaged copy");
            continue;
        }
        assert_eq!(ours, want, "{}", img.display());
    }
}

/// A damaged first metadata copy (its CRC-32 no longer matches) is survived through the
/// second, as cryptsetup 2.8 does; with all three damaged the header is refused.
#[test]
fn damaged_metadata_copy_is_survived() {
    let Some((dir, _)) = images() else { return };
    let src = dir.join("bitlk-images/bitlk-aes-xts-128.img");
    let bytes = std::fs::read(&src).unwrap();
    let good = BitlkHeader::read(&cryptblk_format::hdrio::MemIo::new(bytes.clone())).unwrap();
    let mut bad = bytes.clone();
    // A byte of the description entry region of copy 0 (past the 112-byte head).
    let at = good.metadata_offsets[0] as usize + 200;
    bad[at] ^= 0x55;
    let h = BitlkHeader::read(&cryptblk_format::hdrio::MemIo::new(bad.clone())).unwrap();
    assert_eq!(h.description, good.description);
    assert_eq!(h.guid, good.guid);
    for o in &good.metadata_offsets[1..] {
        bad[*o as usize + 200] ^= 0x55;
    }
    assert!(matches!(
        BitlkHeader::read(&cryptblk_format::hdrio::MemIo::new(bad)),
        Err(FormatError::Corrupt(_))
    ));
}

#[test]
fn volume_keys_match_cryptsetup() {
    let Some((dir, _)) = images() else { return };
    let d = dir.join("bitlk-images");
    // One image per encryption method, and each kind of secret.
    let cases: &[(&str, &[u8])] = &[
        ("bitlk-aes-cbc-128.img", b"anaconda"),
        (
            "bitlk-aes-cbc-256.img",
            b"616319-601744-502117-534017-367994-176748-607299-663201",
        ),
        ("bitlk-aes-xts-256.img", b"anaconda"),
        ("bitlk-aes-cbc-elephant-128.img", b"anaconda"),
        ("bitlk-aes-cbc-elephant-256.img", b"anaconda"),
        ("bitlk-togo-aes-xts-128.img", b"anaconda"),
    ];
    for (name, secret) in cases {
        let img = d.join(name);
        let f = std::fs::File::open(&img).unwrap();
        let h = BitlkHeader::read(&f).unwrap();
        let vk = h
            .unlock(&BitlkKey::Secret(secret))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (rc, want) = cryptsetup(
            &[
                "bitlkDump",
                "-q",
                "--dump-volume-key",
                img.to_str().unwrap(),
            ],
            secret,
        );
        assert_eq!(rc, 0, "{name}");
        assert_eq!(
            h.dump_volume_key(img.to_str().unwrap(), vk.as_bytes()),
            want,
            "{name}"
        );
    }
    // cryptsetup 2.6.1 cannot use the non-ASCII passphrase (its later versions can): the
    // key it gives for the recovery password is the reference.
    let img = d.join("bitlk-aes-xts-128-unicode.img");
    let h = BitlkHeader::read(&std::fs::File::open(&img).unwrap()).unwrap();
    let vk = h.unlock(&BitlkKey::Secret("anaconda£".as_bytes())).unwrap();
    let rp = b"671979-070675-187088-665060-078518-143605-111408-569305";
    let (rc, want) = cryptsetup(
        &[
            "bitlkDump",
            "-q",
            "--dump-volume-key",
            img.to_str().unwrap(),
        ],
        rp,
    );
    assert_eq!(rc, 0);
    assert_eq!(
        h.dump_volume_key(img.to_str().unwrap(), vk.as_bytes()),
        want
    );
    // The startup key file opens its VMK; the clear key needs no secret.
    let img = d.join("bitlk-aes-xts-128-startup-key.img");
    let h = BitlkHeader::read(&std::fs::File::open(&img).unwrap()).unwrap();
    let bek = std::fs::read(d.join("4381F759-C4F8-4DE0-BB61-FC33A831BDA5.BEK")).unwrap();
    let by_bek = h.unlock(&BitlkKey::Secret(&bek)).unwrap();
    let by_pw = h.unlock(&BitlkKey::Secret(b"anaconda")).unwrap();
    assert_eq!(by_bek.as_bytes(), by_pw.as_bytes());
    let other_bek = std::fs::read(d.join("AA80A52B-9B66-47AE-B097-33F536FFBB07.BEK")).unwrap();
    assert!(matches!(
        h.unlock(&BitlkKey::Secret(&other_bek)),
        Err(FormatError::WrongPassphrase)
    ));
    let img = d.join("bitlk-aes-xts-128-clearkey-only.img");
    let h = BitlkHeader::read(&std::fs::File::open(&img).unwrap()).unwrap();
    assert!(h.has_clear_key());
    assert_eq!(h.unlock(&BitlkKey::None).unwrap().len(), 32);
}

#[test]
fn wrong_secrets_and_kinds() {
    let Some((dir, _)) = images() else { return };
    let d = dir.join("bitlk-images");
    let h =
        BitlkHeader::read(&std::fs::File::open(d.join("bitlk-aes-xts-128.img")).unwrap()).unwrap();
    assert_eq!(h.kind, BitlkKind::Normal);
    for bad in [
        &b"anacondA"[..],
        b"",
        b"235818-357951-253979-013365-241120-245575-342914-591921",
    ] {
        assert!(matches!(
            h.unlock(&BitlkKey::Secret(bad)),
            Err(FormatError::WrongPassphrase)
        ));
    }
    assert!(matches!(
        h.unlock(&BitlkKey::None),
        Err(FormatError::WrongPassphrase)
    ));
    let eow = BitlkHeader::read(&std::fs::File::open(d.join("bitlk-aes-xts-128-eow.img")).unwrap())
        .unwrap();
    assert_eq!(eow.kind, BitlkKind::EncryptOnWrite);
    let togo =
        BitlkHeader::read(&std::fs::File::open(d.join("bitlk-togo-aes-cbc-128.img")).unwrap())
            .unwrap();
    assert_eq!(togo.kind, BitlkKind::ToGo);
}

#[test]
fn damaged_headers_are_refused() {
    let Some((dir, _)) = images() else { return };
    let src = dir.join("bitlk-images/bitlk-aes-xts-128.img");
    let h = BitlkHeader::read(&std::fs::File::open(&src).unwrap()).unwrap();
    let first = h.metadata_offsets[0];
    let mut head = vec![0u8; (first + 65536) as usize];
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&src)
            .unwrap()
            .read_exact_at(&mut head, 0)
            .unwrap();
    }
    // The rest of the volume as zeros: only the layout checks look at the size.
    let size = std::fs::metadata(&src).unwrap().len() as usize;
    let io = |bytes: &[u8]| {
        let mut v = bytes.to_vec();
        if v.len() == head.len() {
            v.resize(size, 0);
        }
        cryptblk_format::hdrio::MemIo::new(v)
    };
    assert!(BitlkHeader::read(&io(&head)).is_ok());
    // Truncated before the metadata, inside it, and a corrupted signature, size and entry.
    for cut in [100usize, 512, first as usize + 50, first as usize + 200] {
        assert!(
            BitlkHeader::read(&io(&head[..cut])).is_err(),
            "cut at {cut}"
        );
    }
    let mut bad = head.clone();
    bad[first as usize] ^= 0xff;
    assert!(matches!(
        BitlkHeader::read(&io(&bad)),
        Err(FormatError::Corrupt(_))
    ));
    let mut bad = head.clone();
    bad[first as usize + 64..first as usize + 68].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        BitlkHeader::read(&io(&bad)),
        Err(FormatError::Corrupt(_))
    ));
    let mut bad = head.clone();
    bad[first as usize + 112] = 3; // first entry's size below its own header
    bad[first as usize + 113] = 0;
    assert!(matches!(
        BitlkHeader::read(&io(&bad)),
        Err(FormatError::Corrupt(_))
    ));
    let mut bad = head.clone();
    bad[3..11].copy_from_slice(b"NTFS    ");
    assert!(matches!(
        BitlkHeader::read(&io(&bad)),
        Err(FormatError::NotLuks)
    ));
}
