//! Existing on-disk signatures, probed with libblkid as cryptsetup built with libblkid does
//! (issue 25): `--version` names BLKID, luksFormat names what the device held (a warning on
//! standard output, a debug line in batch mode) and wipes its magic, `--disable-blkid` leaves
//! it, and `reencrypt --encrypt` refuses a header or data device holding broken LUKS
//! metadata. Each behaviour is compared with the installed cryptsetup on identical copies of
//! one image; blkid's own tools (sgdisk, wipefs) make and read the signatures.

mod common;
use common::*;
use std::path::Path;
#[cfg(feature = "blkid")]
use std::process::Command;

/// A 32 MiB image with a GPT (protective MBR at sector 0, backup header in the last sector,
/// beyond any LUKS data offset), made by sgdisk.
fn gpt_image(path: &Path) {
    sparse_file(path, 32 << 20);
    let mut c = tool("sgdisk").expect("sgdisk (gdisk) is required");
    run_ok(c.args(["-o", "-n", "1:2048:+10M"]).arg(path), b"");
    assert_eq!(
        last_sector_magic(path),
        *b"EFI PART",
        "sgdisk wrote no backup GPT"
    );
}

/// The first 8 bytes of the image's last sector (the backup GPT header's magic).
fn last_sector_magic(path: &Path) -> [u8; 8] {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, len - 512).unwrap();
    b
}

/// What blkid's wipefs lists on the image: (offset, type) pairs.
fn wipefs(path: &Path) -> Vec<(String, String)> {
    let mut c = tool("wipefs").expect("wipefs (util-linux) is required");
    let out = run_ok(
        c.args(["--noheadings", "--output", "OFFSET,TYPE"])
            .arg(path),
        b"",
    );
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

/// Bytes `from..` of the image (the part no LUKS header covers).
#[cfg(feature = "blkid")]
fn tail_bytes(path: &Path, from: u64) -> Vec<u8> {
    std::fs::read(path).unwrap()[from as usize..].to_vec()
}

#[test]
fn version_names_blkid_when_built_in() {
    let out = run_ok(cryptblk().arg("--version"), b"");
    assert_eq!(
        out.contains("BLKID"),
        cfg!(feature = "blkid"),
        "--version: {out:?}"
    );
    if cfg!(feature = "blkid") {
        // The reference names it the same way (the test scripts grep for it).
        let cs = run_ok(tool("cryptsetup").unwrap().arg("--version"), b"");
        assert!(
            cs.contains("BLKID"),
            "installed cryptsetup lacks BLKID: {cs}"
        );
    }
}

/// luksFormat in batch mode names the GPT in a debug line and wipes its magics: the image
/// afterwards holds only LUKS for wipefs, and everything past the LUKS2 header area is
/// byte for byte what cryptsetup leaves (the backup GPT header without its "EFI PART").
#[cfg(feature = "blkid")]
#[test]
fn luks_format_wipes_existing_signatures_as_cryptsetup() {
    let dir = tempdir();
    let orig = dir.path().join("gpt.img");
    gpt_image(&orig);
    let ours = dir.path().join("ours.img");
    let theirs = dir.path().join("theirs.img");
    std::fs::copy(&orig, &ours).unwrap();
    std::fs::copy(&orig, &theirs).unwrap();

    let mut cs = tool("cryptsetup").unwrap();
    let cs_out = run(
        cs.args(["luksFormat", "-q", "--debug", "--type", "luks2"])
            .args(FAST)
            .arg(&theirs),
        b"pass\n",
    );
    assert!(cs_out.status.success(), "{cs_out:?}");
    let out = run(
        cryptblk()
            .args(["luksFormat", "-q", "--debug", "--type", "luks2"])
            .args(FAST)
            .arg(&ours),
        b"pass\n",
    );
    assert!(out.status.success(), "{out:?}");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let line = format!(
        "Device {} already contains a 'gpt' partition signature.",
        ours.display()
    );
    assert!(text.contains(&line), "no {line:?} in {text}");
    let cs_text = String::from_utf8_lossy(&cs_out.stderr).into_owned()
        + &String::from_utf8_lossy(&cs_out.stdout);
    assert!(
        cs_text.contains(&format!(
            "Device {} already contains a 'gpt' partition signature.",
            theirs.display()
        )),
        "{cs_text}"
    );

    assert_eq!(
        last_sector_magic(&theirs),
        [0; 8],
        "cryptsetup left the backup GPT"
    );
    assert_eq!(
        last_sector_magic(&ours),
        [0; 8],
        "the backup GPT magic survived luksFormat"
    );
    let types = |p: &Path| wipefs(p).into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    assert_eq!(types(&ours), types(&theirs));
    assert_eq!(types(&ours), ["crypto_LUKS", "crypto_LUKS"]);
    // Past the default LUKS2 data offset (16 MiB) both images are the same bytes.
    assert!(
        tail_bytes(&ours, 16 << 20) == tail_bytes(&theirs, 16 << 20),
        "data area differs"
    );
}

/// Without batch mode (standard input not a terminal, so no question) both tools print the
/// same warning on standard output.
#[cfg(feature = "blkid")]
#[test]
fn luks_format_warns_on_stdout_as_cryptsetup() {
    let dir = tempdir();
    let img = dir.path().join("fs.img");
    sparse_file(&img, 32 << 20);
    let mut mkfs = tool("mkfs.ext4").unwrap();
    run_ok(mkfs.arg("-q").arg(&img), b"");
    let copy = dir.path().join("fs2.img");
    std::fs::copy(&img, &copy).unwrap();
    // The same path for both, so the lines compare byte for byte.
    let mut cs = tool("cryptsetup").unwrap();
    let theirs = run(
        cs.args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg(&img),
        b"pass\n",
    );
    assert!(theirs.status.success(), "{theirs:?}");
    std::fs::copy(&copy, &img).unwrap();
    let ours = run(
        cryptblk()
            .args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg(&img),
        b"pass\n",
    );
    assert!(ours.status.success(), "{ours:?}");
    let want = format!(
        "WARNING: Device {} already contains a 'ext4' superblock signature.\n",
        img.display()
    );
    assert_eq!(String::from_utf8_lossy(&theirs.stdout), want);
    assert_eq!(String::from_utf8_lossy(&ours.stdout), want);
}

/// `--disable-blkid` (cryptsetup 2.8): no probe, nothing named, nothing wiped; the backup
/// GPT header stays for blkid to see.
#[test]
fn disable_blkid_leaves_signatures() {
    let dir = tempdir();
    let img = dir.path().join("gpt.img");
    gpt_image(&img);
    let out = run(
        cryptblk()
            .args([
                "luksFormat",
                "-q",
                "--debug",
                "--disable-blkid",
                "--type",
                "luks2",
            ])
            .args(FAST)
            .arg(&img),
        b"pass\n",
    );
    assert!(out.status.success(), "{out:?}");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("'gpt'"), "{text}");
    assert_eq!(last_sector_magic(&img), *b"EFI PART");
    assert!(wipefs(&img).iter().any(|(_, t)| t == "gpt"));
}

/// cryptsetup's blkid-luks2-pv.img: a LUKS2 header whose primary copy an LVM2 label damaged.
#[cfg(feature = "blkid")]
fn pv_image(dir: &Path) -> std::path::PathBuf {
    let src = std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cryptsetup-tests")
        });
    let img = dir.join("pv.img");
    unxz(&src.join("blkid-luks2-pv.img.xz"), &img);
    img
}

/// `reencrypt --encrypt` over broken LUKS metadata (as --header, or as the data device with a
/// new detached header) is refused as cryptsetup refuses it: exit 1, its message, the image
/// untouched and no header file created.
#[cfg(feature = "blkid")]
#[test]
fn reencrypt_encrypt_refuses_broken_luks_metadata() {
    let dir = tempdir();
    let pv = pv_image(dir.path());
    let sum = sha256(&pv);
    let data = dir.path().join("data.img");
    sparse_file(&data, 8 << 20);
    let new_hdr = dir.path().join("new.hdr");
    type Case<'a> = (Vec<&'a std::ffi::OsStr>, &'a Path);
    let cases: [Case; 2] = [
        (
            vec!["--header".as_ref(), pv.as_os_str(), data.as_os_str()],
            &pv,
        ),
        (
            vec!["--header".as_ref(), new_hdr.as_os_str(), pv.as_os_str()],
            &pv,
        ),
    ];
    for (args, broken) in cases {
        let want = format!(
            "Device {} contains broken LUKS metadata. Aborting operation.",
            broken.display()
        );
        for (name, mut cmd) in [
            ("cryptsetup", Command::new("cryptsetup")),
            ("cryptblk", cryptblk()),
        ] {
            let out = run(
                cmd.args(["reencrypt", "--encrypt", "-q", "--type", "luks2"])
                    .args(FAST)
                    .args(&args),
                b"pass\n",
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(exit_code(&out), 1, "{name} {args:?}: {err}");
            assert!(err.contains(&want), "{name} {args:?}: {err}");
            assert_eq!(sha256(&pv), sum, "{name} changed the image");
            assert!(!new_hdr.exists(), "{name} created the header");
        }
    }
}

/// A loop device detached when dropped.
#[cfg(feature = "blkid")]
struct Loop(String);

#[cfg(feature = "blkid")]
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// On a block device (which cryptblk's own data lock holds open `O_EXCL`) the wipe still
/// happens: reformatting a loop device that holds a LUKS header (a signature) succeeds and
/// leaves only the new header, as cryptsetup does. cryptsetup's suite caught the first
/// version of the wipe refusing this as "device in use".
#[cfg(feature = "blkid")]
#[test]
fn luks_format_wipes_on_a_block_device() {
    require_root("loop devices");
    let dir = tempdir();
    let img = dir.path().join("gpt.img");
    gpt_image(&img);
    let lo = Loop(sh("losetup", &[&"-f", &"--show", &img]).trim().to_string());
    for round in 0..2 {
        let out = run(
            cryptblk()
                .args(["luksFormat", "-q", "--type", "luks2"])
                .args(FAST)
                .arg(&lo.0),
            b"pass\n",
        );
        assert!(out.status.success(), "round {round}: {out:?}");
    }
    let lo_path = Path::new(&lo.0).to_path_buf();
    let types = wipefs(&lo_path)
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>();
    assert_eq!(types, ["crypto_LUKS", "crypto_LUKS"]);
    assert_eq!(last_sector_magic(&img), [0; 8]);
}
