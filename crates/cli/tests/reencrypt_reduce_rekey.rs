//! `reencrypt --reduce-device-size` on an existing LUKS2 volume (a re-key that moves the data
//! up by the shift: cryptsetup 2.6.1 writes a backward `datashift` reencryption whatever
//! `--resilience` says), the decryption that exports a header larger than the data behind
//! it, and the reencryption metadata cryptsetup refuses to load: each compared with
//! cryptsetup 2.6.1 (exit code, messages, metadata, and the bytes cryptsetup's own run
//! leaves). Issue 25, luks2-reencryption-mangle-test.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn cs() -> Command {
    cryptsetup().expect("cryptsetup")
}

fn cb() -> Command {
    let mut c = cryptblk();
    c.arg("-q");
    c
}

/// A 32 MiB LUKS2 image made by cryptsetup with 16 KiB metadata (as the mangle test makes
/// it), its data area filled through nothing but the pattern the file held before.
fn luks2_image(dir: &Path, key: &Path) -> std::path::PathBuf {
    let img = dir.join("base.img");
    write_pattern(&img, 32 << 20, 11);
    run_ok(
        cs().args([
            "luksFormat",
            "--type",
            "luks2",
            "--luks2-metadata-size",
            "16384",
        ])
        .args(FAST)
        .arg("--key-file")
        .arg(key)
        .arg(&img),
        b"",
    );
    img
}

fn copy(from: &Path, to: &Path) -> std::path::PathBuf {
    std::fs::copy(from, to).unwrap();
    to.to_path_buf()
}

fn json(img: &Path) -> Value {
    let out = run_ok(
        cs().args(["luksDump", "--dump-json-metadata"]).arg(img),
        b"",
    );
    serde_json::from_str(&out).unwrap()
}

/// What a reencryption's metadata says, without salts and digests (random per run).
fn layout(j: &Value) -> Value {
    let reenc = j["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .cloned()
        .unwrap_or(Value::Null);
    let slots: Vec<&String> = j["keyslots"].as_object().unwrap().keys().collect();
    serde_json::json!({
        "reencrypt": reenc,
        "keyslots": slots,
        "segments": j["segments"],
        "config": j["config"],
        "segments_of_digests": j["digests"].as_object().unwrap().values()
            .map(|d| d["segments"].clone()).collect::<Vec<_>>(),
    })
}

fn reencrypt(t: &mut Command, key: &Path, img: &Path, extra: &[&str]) -> (i32, String, String) {
    let out = run(
        t.arg("reencrypt")
            .arg(img)
            .args(["--key-file"])
            .arg(key)
            .args(extra),
        b"",
    );
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn init_only_datashift_rekey_is_cryptsetups_and_either_tool_finishes_it() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"reduce rekey key");
    let base = luks2_image(d, &key);
    let opts = [
        "--init-only",
        "--resilience",
        "none",
        "--reduce-device-size",
        "2M",
    ];
    let theirs = copy(&base, &d.join("cs.img"));
    let ours = copy(&base, &d.join("cb.img"));
    let (rc_cs, _, err_cs) = reencrypt(&mut cs(), &key, &theirs, &opts);
    let (rc_cb, out_cb, err_cb) = reencrypt(&mut cb(), &key, &ours, &opts);
    assert_eq!(rc_cs, 0, "{err_cs}");
    assert_eq!(rc_cb, 0, "{err_cb}");
    assert_eq!(out_cb, "");
    let (jt, jo) = (json(&theirs), json(&ours));
    assert_eq!(layout(&jo), layout(&jt));
    assert_eq!(jo["keyslots"]["2"]["area"]["type"], "datashift");
    // The header's epoch too: cryptsetup's three header writes.
    let epoch = |img: &Path| {
        run_ok(cs().arg("luksDump").arg(img), b"")
            .lines()
            .find(|l| l.starts_with("Epoch:"))
            .map(str::to_string)
    };
    assert_eq!(epoch(&ours), epoch(&theirs));
    // The data has not been touched yet.
    let data = 16 * MIB as usize;
    assert!(std::fs::read(&ours).unwrap()[data..] == std::fs::read(&base).unwrap()[data..]);

    // cryptsetup finishes what cryptblk began, and cryptblk finishes a copy of it: the
    // same data, inside the same device size, under the new key cryptsetup opens.
    let by_cs = copy(&ours, &d.join("cb-then-cs.img"));
    let by_cb = copy(&ours, &d.join("cb-then-cb.img"));
    let finish = ["--force-offline-reencrypt"];
    let (rc, _, err) = reencrypt(&mut cs(), &key, &by_cs, &finish);
    assert_eq!(rc, 0, "cryptsetup finishing cryptblk's init: {err}");
    let (rc, _, err) = reencrypt(&mut cb(), &key, &by_cb, &finish);
    assert_eq!(rc, 0, "cryptblk finishing its own init: {err}");
    let (a, b) = (
        std::fs::read(&by_cs).unwrap(),
        std::fs::read(&by_cb).unwrap(),
    );
    assert_eq!(b.len() as u64, 32 * MIB);
    let new_data = 18 * MIB as usize;
    assert!(a[new_data..] == b[new_data..], "the data areas differ");
    for img in [&by_cs, &by_cb] {
        let j = json(img);
        assert_eq!(j["segments"]["0"]["offset"], "18874368", "{j}");
        assert!(j["config"]["requirements"].is_null(), "{j}");
        run_ok(
            cs().args(["open", "--test-passphrase", "--key-file"])
                .arg(&key)
                .arg(img),
            b"",
        );
    }
    // The plaintext moved with it: what was at the start of the volume still is.
    let before = run_ok_bytes(cb().args(["decrypt", "--key-file"]).arg(&key).arg(&base));
    let after = run_ok_bytes(cb().args(["decrypt", "--key-file"]).arg(&key).arg(&by_cs));
    assert_eq!(after.len() as u64, 14 * MIB);
    assert!(after[..] == before[..after.len()], "the plaintext changed");
}

fn run_ok_bytes(cmd: &mut Command) -> Vec<u8> {
    let out = run(cmd.arg("-"), b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn a_shift_off_the_sector_size_is_refused_as_cryptsetup_refuses_it() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"reduce rekey key");
    let base = luks2_image(d, &key);
    for (opts, ss) in [
        (vec!["--reduce-device-size", "512"], 4096),
        (
            vec!["--reduce-device-size", "512", "--sector-size", "512"],
            4096,
        ),
    ] {
        let mut all = vec!["--init-only"];
        all.extend(&opts);
        let theirs = copy(&base, &d.join("cs.img"));
        let ours = copy(&base, &d.join("cb.img"));
        let (rc_cs, _, err_cs) = reencrypt(&mut cs(), &key, &theirs, &all);
        let (rc_cb, _, err_cb) = reencrypt(&mut cb(), &key, &ours, &all);
        let want = format!(
            "Data shift value is not aligned to encryption sector size ({ss} bytes).\n\
             Failed to initialize LUKS2 reencryption in metadata.\n"
        );
        assert_eq!((rc_cs, err_cs.as_str()), (1, want.as_str()), "{opts:?}");
        assert_eq!((rc_cb, err_cb.as_str()), (1, want.as_str()), "{opts:?}");
        // cryptsetup adds a keyslot before it finds out and takes it back (a new epoch);
        // cryptblk checks first and leaves the image as it was.
        assert_eq!(sha256(&ours), sha256(&base), "{opts:?}");
    }
    // The `S` (512-byte sector) suffix is cryptsetup's too.
    let theirs = copy(&base, &d.join("cs.img"));
    let ours = copy(&base, &d.join("cb.img"));
    let opts = ["--init-only", "--reduce-device-size", "4096S"];
    assert_eq!(reencrypt(&mut cs(), &key, &theirs, &opts).0, 0);
    let (rc, _, err) = reencrypt(&mut cb(), &key, &ours, &opts);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(layout(&json(&ours)), layout(&json(&theirs)));
}

#[test]
fn decryption_exporting_a_header_as_large_as_the_data_is_cryptsetups() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"decrypt export key");
    // 32 MiB with a 16 MiB header: the data is exactly the shift; 24 MiB: less than it.
    for size in [32 * MIB, 24 * MIB] {
        let base = d.join("base.img");
        write_pattern(&base, size as usize, 5);
        run_ok(
            cs().args([
                "luksFormat",
                "--type",
                "luks2",
                "--luks2-metadata-size",
                "16384",
            ])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&base),
            b"",
        );
        let plain = run_ok_bytes(cb().args(["decrypt", "--key-file"]).arg(&key).arg(&base));
        let mut hdrs = Vec::new();
        for (who, mut t) in [("cs", cs()), ("cb", cb())] {
            let img = copy(&base, &d.join(format!("{who}.img")));
            let hdr = d.join(format!("{who}.hdr"));
            let _ = std::fs::remove_file(&hdr);
            let (rc, _, err) = reencrypt(
                &mut t,
                &key,
                &img,
                &[
                    "--decrypt",
                    "--init-only",
                    "--force-offline-reencrypt",
                    "--resilience",
                    "checksum",
                    "--header",
                    hdr.to_str().unwrap(),
                ],
            );
            assert_eq!(rc, 0, "{who} {size}: {err}");
            hdrs.push((img, hdr));
        }
        let (jt, jo) = (json(&hdrs[0].1), json(&hdrs[1].1));
        assert_eq!(layout(&jo), layout(&jt), "{size}");
        assert!(
            std::fs::read(&hdrs[0].0).unwrap() == std::fs::read(&hdrs[1].0).unwrap(),
            "{size}: the data devices differ after init"
        );
        // cryptsetup finishes cryptblk's decryption: the plaintext, at the device start.
        let (img, hdr) = &hdrs[1];
        let (rc, _, err) = reencrypt(
            &mut cs(),
            &key,
            img,
            &[
                "--force-offline-reencrypt",
                "--header",
                hdr.to_str().unwrap(),
            ],
        );
        assert_eq!(rc, 0, "{size}: cryptsetup finishing cryptblk's init: {err}");
        let out = std::fs::read(img).unwrap();
        assert!(out[..plain.len()] == plain[..], "{size}: plaintext differs");
    }
}

/// Rewrites both JSON areas of the 16 KiB-metadata header in `img` with `j` and fixes the
/// checksums, as the mangle test does with dd and sha256sum.
fn write_json(img: &Path, j: &Value) {
    use cryptblk_cipher::hash::HashAlgorithm;
    const M: usize = 16384;
    let mut b = std::fs::read(img).unwrap();
    let text = serde_json::to_vec(j).unwrap();
    for base in [0, M] {
        b[base + 4096..base + M].fill(0);
        b[base + 4096..base + 4096 + text.len()].copy_from_slice(&text);
        b[base + 448..base + 512].fill(0);
        let sum = HashAlgorithm::Sha256.digest(&[&b[base..base + M]]);
        b[base + 448..base + 448 + 32].copy_from_slice(&sum);
    }
    std::fs::write(img, b).unwrap();
}

#[test]
fn reencryption_metadata_cryptsetup_will_not_load_is_refused_and_kept() {
    let dir = tempdir();
    let d = dir.path();
    let key = write_file(d, "key", b"mangle key");
    let base = luks2_image(d, &key);
    let (rc, _, err) = reencrypt(
        &mut cs(),
        &key,
        &base,
        &["--init-only", "--resilience", "none"],
    );
    assert_eq!(rc, 0, "{err}");
    let good = json(&base);
    type Mangle = fn(&mut Value);
    let cases: [(&str, Mangle); 4] = [
        ("reencrypt key_size 16", |j| {
            j["keyslots"]["2"]["key_size"] = 16.into()
        }),
        ("segment 0 cipher", |j| {
            j["segments"]["0"]["encryption"] = "aes-cbc-null".into()
        }),
        ("segment 0 sector size", |j| {
            j["segments"]["0"]["sector_size"] = 512.into()
        }),
        ("segment 0 in reencryption, old cipher", |j| {
            j["segments"]["0"]["flags"] = serde_json::json!(["in-reencryption"]);
            j["segments"]["2"]["encryption"] = "aes-cbc-essiv:sha256".into();
            j["segments"]["2"]["sector_size"] = 512.into();
        }),
    ];
    for (what, mangle) in cases {
        let img = copy(&base, &d.join("m.img"));
        let mut j = good.clone();
        mangle(&mut j);
        write_json(&img, &j);
        let before = sha256(&img);
        for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cb())] {
            let out = run(t.args(["repair", "--key-file"]).arg(&key).arg(&img), b"");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(exit_code(&out), 1, "{who} repair of {what}: {err}");
            // cryptsetup: "Device m.img is not a valid LUKS device."; cryptblk names what
            // is wrong, in one line too.
            assert_eq!(err.lines().count(), 1, "{who} repair of {what}: {err}");
            assert_eq!(sha256(&img), before, "{who} changed the image ({what})");
        }
    }
    // Unmangled, both load it (the cases fail for what was changed, not for the rewrite).
    let img = copy(&base, &d.join("m.img"));
    write_json(&img, &good);
    run_ok(cs().arg("luksDump").arg(&img), b"");
    run_ok(cb().arg("luksDump").arg(&img), b"");
}
