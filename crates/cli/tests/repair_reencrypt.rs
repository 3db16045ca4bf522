//! `repair` as cryptsetup's own luks2-reencryption-mangle-test checks it (issue 25): a
//! repair that has nothing to do, or that fails, leaves the image byte for byte as it was;
//! unprotected reencryption metadata (cryptsetup 2.2's unversioned `online-reencrypt`
//! requirement, or no reencryption digest) is refused by `reencrypt` and upgraded by
//! `repair`, after which cryptsetup 2.6.1 itself runs the reencryption to its end.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Rewrites both LUKS2 header copies of `img` with `edit` applied to the JSON (checksums
/// resealed), as the mangle test does with jq.
fn mangle(img: &Path, edit: impl Fn(&mut Value)) {
    use cryptblk_format::luks2::binary;
    let mut bytes = std::fs::read(img).unwrap();
    let hdr_size = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    for at in [0, hdr_size] {
        let area = &mut bytes[at..at + hdr_size];
        let json_end = area[4096..].iter().position(|&b| b == 0).unwrap() + 4096;
        let mut json: Value = serde_json::from_slice(&area[4096..json_end]).unwrap();
        edit(&mut json);
        let text = serde_json::to_vec(&json).unwrap();
        area[4096..].fill(0);
        area[4096..4096 + text.len()].copy_from_slice(&text);
        binary::seal("sha256", area).unwrap();
    }
    std::fs::write(img, bytes).unwrap();
}

/// The LUKS2 JSON of `img` as cryptsetup dumps it.
fn json_of(img: &Path) -> Value {
    let out = run_ok(
        tool("cryptsetup")
            .unwrap()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img),
        b"",
    );
    serde_json::from_str(&out).unwrap()
}

/// A 32 MiB LUKS2 image by cryptsetup with its reencryption initialised (`--init-only`,
/// resilience none), as the mangle test's `img_prepare`; returns (image, key file).
fn prepared(dir: &Path) -> (PathBuf, PathBuf) {
    let key = dir.join("key");
    std::fs::write(&key, b"0123456789abcdef0123456789abcdef").unwrap();
    let img = dir.join("base.img");
    sparse_file(&img, 32 << 20);
    run_ok(
        cryptsetup()
            .unwrap()
            .args([
                "luksFormat",
                "--type",
                "luks2",
                "--luks2-metadata-size",
                "16384",
            ])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["reencrypt", "--init-only", "--resilience", "none"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    (img, key)
}

/// A copy of `base` for one tool.
fn copy(base: &Path, name: &str) -> PathBuf {
    let img = base.with_file_name(name);
    std::fs::copy(base, &img).unwrap();
    img
}

/// `TOOL repair -q --key-file KEY IMG`: (exit code, stderr).
fn repair(tool_cmd: Command, img: &Path, key: &Path) -> (i32, String) {
    let mut c = tool_cmd;
    c.args(["repair", "-q", "--key-file"]).arg(key).arg(img);
    let out = run(&mut c, b"");
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `TOOL reencrypt` of `img` as the mangle test runs it: (exit code).
fn reencrypt(tool_cmd: Command, img: &Path, key: &Path) -> i32 {
    let mut c = tool_cmd;
    c.args([
        "reencrypt",
        "-q",
        "--force-offline-reencrypt",
        "--resilience",
        "none",
        "--key-file",
    ])
    .arg(key)
    .arg(img);
    exit_code(&run(&mut c, b""))
}

fn cs() -> Command {
    tool("cryptsetup").unwrap()
}

#[test]
fn repair_with_nothing_to_do_or_failing_leaves_the_image_unchanged() {
    let dir = tempdir();
    let (base, key) = prepared(dir.path());
    // A sound header mid-reencryption: both tools return 0 and write nothing.
    for (who, t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let img = copy(&base, &format!("sound-{who}.img"));
        let before = sha256(&img);
        let (code, err) = repair(t, &img, &key);
        assert_eq!(code, 0, "{who}: {err}");
        assert_eq!(sha256(&img), before, "{who} rewrote a sound header");
    }
    // A plain LUKS2 header: -v says there is nothing to repair, on stdout, and writes nothing.
    let plain = dir.path().join("plain.img");
    sparse_file(&plain, 20 << 20);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&plain),
        b"",
    );
    let mut said = Vec::new();
    for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let img = copy(&plain, &format!("plain-{who}.img"));
        let before = sha256(&img);
        let out = run(t.args(["repair", "-q", "-v"]).arg(&img), b"");
        assert_eq!(exit_code(&out), 0, "{who}");
        assert_eq!(sha256(&img), before, "{who} rewrote a sound header");
        said.push(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .map(str::to_string),
        );
    }
    assert_eq!(said[0], said[1]);
    // Unknown requirements: repair fails (exit 1) and the image stays as it was.
    for req in ["online-reencrypt-v999", "online-reencrypt-v3X"] {
        let mangled = copy(&base, &format!("{req}.img"));
        mangle(&mangled, |j| {
            let m = j["config"]["requirements"]["mandatory"]
                .as_array_mut()
                .unwrap();
            if req.ends_with('X') {
                m.push(req.into());
            } else {
                *m = vec![req.into()];
            }
        });
        for (who, t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
            let img = copy(&mangled, &format!("{req}-{who}.img"));
            let before = sha256(&img);
            let (code, err) = repair(t, &img, &key);
            assert_eq!(code, 1, "{who} {req}: {err}");
            assert_eq!(
                sha256(&img),
                before,
                "{who} {req}: a failed repair changed the image"
            );
        }
    }
}

#[test]
fn unprotected_reencryption_metadata_is_refused_then_upgraded_by_repair() {
    let dir = tempdir();
    let (base, key) = prepared(dir.path());
    // cryptsetup 2.2's metadata: no reencryption digest, the unversioned requirement.
    mangle(&base, |j| {
        let slot = j["keyslots"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, k)| k["type"] == "reencrypt")
            .map(|(id, _)| id.clone())
            .unwrap();
        j["digests"].as_object_mut().unwrap().retain(|_, d| {
            !d["keyslots"]
                .as_array()
                .unwrap()
                .contains(&slot.clone().into())
        });
        j["config"]["requirements"]["mandatory"] = serde_json::json!(["online-reencrypt"]);
    });
    for (who, t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let img = copy(&base, &format!("old-{who}.img"));
        let before = sha256(&img);
        // The reencryption is refused and touches nothing.
        assert_ne!(
            reencrypt(t, &img, &key),
            0,
            "{who} ran unprotected metadata"
        );
        assert_eq!(
            sha256(&img),
            before,
            "{who}: a refused reencrypt changed the image"
        );
        // repair upgrades it...
        let t = if who == "cryptsetup" {
            cs()
        } else {
            cryptblk()
        };
        let (code, err) = repair(t, &img, &key);
        assert_eq!(code, 0, "{who}: {err}");
        let j = json_of(&img);
        assert_eq!(
            j["config"]["requirements"]["mandatory"],
            serde_json::json!(["online-reencrypt-v2"]),
            "{who}"
        );
        // ...so that cryptsetup itself verifies the digest and finishes the reencryption.
        assert_eq!(
            reencrypt(cs(), &img, &key),
            0,
            "cryptsetup after {who}'s repair"
        );
        let j = json_of(&img);
        assert!(
            j["config"]["requirements"]["mandatory"].is_null()
                || j["config"]["requirements"]["mandatory"] == serde_json::json!([])
        );
    }
    // A wrong passphrase upgrades nothing.
    let img = copy(&base, "old-wrong.img");
    let before = sha256(&img);
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"not the passphrase").unwrap();
    let (code, err) = repair(cryptblk(), &img, &wrong);
    let (cs_code, _) = repair(cs(), &copy(&base, "old-wrong-cs.img"), &wrong);
    assert_eq!(code, cs_code, "{err}");
    assert_eq!(sha256(&img), before);
}

/// LUKS1 `repair` as compat-test [29]: garbage over the header's second sector (keyslots 6
/// and 7), a cipher mode `ecb-xxx` and an upper-case hash name are repaired to the very
/// bytes cryptsetup 2.6.1 writes, the volume opens again, and a sound header is not
/// rewritten.
#[test]
fn luks1_repair_writes_what_cryptsetup_writes() {
    let dir = tempdir();
    let d = dir.path();
    let key = d.join("key");
    std::fs::write(&key, b"luks1 repair key").unwrap();
    let format = |img: &Path, extra: &[&str]| {
        sparse_file(img, 10 << 20);
        run_ok(
            cryptsetup()
                .unwrap()
                .args(["luksFormat", "--type", "luks1", "--key-slot", "0"])
                .args(FAST)
                .args(extra)
                .arg(img)
                .arg(&key),
            b"",
        );
    };
    let patch = |img: &Path, at: u64, bytes: &[u8]| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
        f.write_all_at(bytes, at).unwrap();
    };
    let garbage: Vec<u8> = (0..512u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let cases: [(&str, &[&str], u64, &[u8]); 3] = [
        ("sector1", &[], 512, &garbage),
        (
            "ecb",
            &["--hash", "sha256", "-c", "aes-ecb"],
            40,
            b"ecb-xxx",
        ),
        ("hash", &["--hash", "sha256"], 72, b"SHA256"),
    ];
    for (name, extra, at, bytes) in cases {
        let base = d.join(format!("{name}.img"));
        format(&base, extra);
        // A sound header: nothing to do, nothing written.
        let sound = copy(&base, &format!("{name}-sound.img"));
        let before = sha256(&sound);
        let (code, err) = repair(cryptblk(), &sound, &key);
        assert_eq!((code, sha256(&sound)), (0, before), "{name}: {err}");
        patch(&base, at, bytes);
        let mut headers = Vec::new();
        for (who, t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
            let img = copy(&base, &format!("{name}-{who}.img"));
            let (code, err) = repair(t, &img, &key);
            assert_eq!(code, 0, "{name} {who}: {err}");
            run_ok(
                tool("cryptsetup")
                    .unwrap()
                    .args(["open", "--test-passphrase", "--key-file"])
                    .arg(&key)
                    .arg(&img),
                b"",
            );
            headers.push(std::fs::read(&img).unwrap()[..4096].to_vec());
        }
        assert!(
            headers[0] == headers[1],
            "{name}: the repaired headers differ"
        );
    }
}
