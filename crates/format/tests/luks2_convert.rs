//! LUKS1 -> LUKS2 conversion against the real `cryptsetup convert --type luks2`: the same
//! LUKS1 volume converted by both tools must give identical JSON metadata, identical moved
//! keyslot material, and the same volume key; impossible conversions are refused by both
//! and leave the device untouched.

mod luks2_common;

use cryptblk_format::luks2::{Luks2Header, UnlockPurpose};
use luks2_common::*;

const PW: &[u8] = b"convert me";

fn luks1_image(dir: &Scratch, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let img = dir.path(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let p = img.to_str().unwrap();
    let mut args = vec![
        "luksFormat",
        "--type",
        "luks1",
        "-q",
        "--key-file=-",
        "--pbkdf-force-iterations",
        "1000",
    ];
    args.extend_from_slice(extra);
    args.push(p);
    let (rc, _, err) = cryptsetup(&args, PW);
    assert_eq!(rc, 0, "{err}");
    let kf = dir.path("second-key");
    std::fs::write(&kf, b"another").unwrap();
    let (rc, _, err) = cryptsetup(
        &[
            "luksAddKey",
            "-q",
            "--key-file=-",
            "--pbkdf-force-iterations",
            "1000",
            "-S",
            "3",
            p,
            kf.to_str().unwrap(),
        ],
        PW,
    );
    assert_eq!(rc, 0, "{err}");
    img
}

#[test]
fn conversion_matches_cryptsetup() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("convert");
    let orig = luks1_image(&dir, "orig.img", &["-s", "256"]);
    let (rc, dump, err) = cryptsetup(
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file=-",
            orig.to_str().unwrap(),
        ],
        PW,
    );
    assert_eq!(rc, 0, "{err}");
    let vk: String = dump
        .lines()
        .skip_while(|l| !l.starts_with("MK dump:"))
        .take_while(|l| l.starts_with("MK dump:") || l.starts_with('\t'))
        .flat_map(|l| {
            l.trim_start_matches("MK dump:")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let a = dir.path("a.img");
    let b = dir.path("b.img");
    std::fs::copy(&orig, &a).unwrap();
    std::fs::copy(&orig, &b).unwrap();
    let (rc, _, err) = cryptsetup(
        &["convert", "--type", "luks2", "-q", a.to_str().unwrap()],
        b"",
    );
    assert_eq!(rc, 0, "{err}");
    let f = open_rw(&b);
    let h = Luks2Header::convert_from_luks1(&f).unwrap();
    drop(f);

    let json = |p: &std::path::Path| {
        let (rc, out, err) = cryptsetup(
            &["luksDump", "--dump-json-metadata", p.to_str().unwrap()],
            b"",
        );
        assert_eq!(rc, 0, "{err}");
        out
    };
    assert_eq!(json(&a), json(&b));
    assert_eq!(json(&b), h.dump_json());
    let text = |p: &std::path::Path| cryptsetup(&["luksDump", p.to_str().unwrap()], b"").1;
    assert_eq!(text(&a), text(&b));

    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let end = 2 << 20;
    assert!(
        ba[32768..end] == bb[32768..end],
        "moved keyslot material differs"
    );
    assert!(ba[end..] == bb[end..], "data area differs");

    let f = open_rw(&b);
    let h = Luks2Header::read(&f).unwrap();
    for (pw, slot) in [(PW, 0), (&b"another"[..], 3)] {
        let u = h.unlock(&f, pw, None, UnlockPurpose::Activate).unwrap();
        assert_eq!((u.slot, u.key.to_hex().as_str()), (slot, vk.as_str()));
    }
    let (rc, _, err) = cryptsetup(
        &[
            "open",
            "--test-passphrase",
            "--key-file=-",
            b.to_str().unwrap(),
        ],
        b"another",
    );
    assert_eq!(rc, 0, "{err}");
}

#[test]
fn conversion_without_room_is_refused_like_cryptsetup() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("convert-full");
    // Data right after the LUKS1 keyslots (2056 sectors): no room for the larger LUKS2
    // metadata.
    let img = luks1_image(&dir, "full.img", &["-s", "256", "--align-payload", "2056"]);
    let before = std::fs::read(&img).unwrap();
    let (rc, _, _) = cryptsetup(
        &["convert", "--type", "luks2", "-q", img.to_str().unwrap()],
        b"",
    );
    assert_ne!(rc, 0, "cryptsetup converted it");
    assert!(std::fs::read(&img).unwrap() == before);
    let f = open_rw(&img);
    assert!(Luks2Header::convert_from_luks1(&f).is_err());
    drop(f);
    assert!(
        std::fs::read(&img).unwrap() == before,
        "failed conversion changed the device"
    );
}

#[test]
fn back_conversion_matches_cryptsetup() {
    if !have_cryptsetup() {
        return;
    }
    let dir = Scratch::new("convert-back");
    let orig = dir.path("l2.img");
    std::fs::File::create(&orig)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let p = orig.to_str().unwrap();
    let kf = dir.path("kf2");
    std::fs::write(&kf, b"slot two").unwrap();
    for args in [
        &[
            "luksFormat",
            "--type",
            "luks2",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "pbkdf2",
            "--sector-size",
            "512",
            "--pbkdf-force-iterations",
            "1000",
            p,
        ][..],
        &[
            "luksAddKey",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "-S",
            "2",
            p,
            kf.to_str().unwrap(),
        ][..],
    ] {
        let (rc, _, err) = cryptsetup(args, PW);
        assert_eq!(rc, 0, "{args:?}: {err}");
    }
    let a = dir.path("a.img");
    let b = dir.path("b.img");
    std::fs::copy(&orig, &a).unwrap();
    std::fs::copy(&orig, &b).unwrap();
    let (rc, _, err) = cryptsetup(
        &["convert", "--type", "luks1", "-q", a.to_str().unwrap()],
        b"",
    );
    assert_eq!(rc, 0, "{err}");
    let f = open_rw(&b);
    let h = Luks2Header::read(&f).unwrap();
    let vk = h.unlock(&f, PW, None, UnlockPurpose::Activate).unwrap().key;
    h.convert_to_luks1(&f).unwrap();
    drop(f);
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(
        ba[..592] == bb[..592],
        "LUKS1 header differs from cryptsetup's"
    );
    assert!(ba == bb, "converted images differ");
    let (rc, dump, err) = cryptsetup(
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file=-",
            b.to_str().unwrap(),
        ],
        PW,
    );
    assert_eq!(rc, 0, "{err}");
    assert!(dump.starts_with("LUKS header information for"));
    let got: String = dump
        .lines()
        .skip_while(|l| !l.starts_with("MK dump:"))
        .take_while(|l| l.starts_with("MK dump:") || l.starts_with('\t'))
        .flat_map(|l| {
            l.trim_start_matches("MK dump:")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(got, vk.to_hex());
    assert_eq!(
        cryptsetup(&["isLuks", "--type", "luks1", b.to_str().unwrap()], b"").0,
        0
    );

    // Argon2 keyslots have no LUKS1 form: both tools refuse.
    let c = dir.path("c.img");
    std::fs::File::create(&c)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let (rc, _, err) = cryptsetup(
        &[
            "luksFormat",
            "--type",
            "luks2",
            "-q",
            "--key-file=-",
            "--pbkdf",
            "argon2id",
            "--sector-size",
            "512",
            "--pbkdf-memory",
            "32",
            "--pbkdf-force-iterations",
            "4",
            c.to_str().unwrap(),
        ],
        PW,
    );
    assert_eq!(rc, 0, "{err}");
    let before = std::fs::read(&c).unwrap();
    let f = open_rw(&c);
    let err = Luks2Header::read(&f)
        .unwrap()
        .convert_to_luks1(&f)
        .unwrap_err();
    assert!(err.to_string().contains("not LUKS1 compatible"), "{err}");
    drop(f);
    assert!(std::fs::read(&c).unwrap() == before);
    assert_ne!(
        cryptsetup(
            &["convert", "--type", "luks1", "-q", c.to_str().unwrap()],
            b""
        )
        .0,
        0
    );
}
