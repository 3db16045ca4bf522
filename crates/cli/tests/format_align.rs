//! luksFormat's data placement options as cryptsetup 2.6.1 takes them (compat-test and
//! compat-test2 of cryptsetup's suite, issue 25): `--offset` must sit on a 4096-byte
//! boundary, and `--align-payload` aligns (attached header) or places (detached header)
//! the data. Both tools format copies of the same image; their headers must agree.

mod common;

use common::*;
use std::process::Command;

fn cs() -> Command {
    tool("cryptsetup").unwrap()
}

/// `luksFormat --offset` off a 4096-byte boundary is refused before anything is asked or
/// written, for LUKS1 and LUKS2 alike (cryptsetup's crypt_set_data_offset): same exit code,
/// same message, the image's bytes unchanged.
#[test]
fn format_offset_off_4096_bytes_is_refused_as_cryptsetup_does() {
    let dir = tempdir();
    let img = dir.path().join("off.img");
    std::fs::write(&img, vec![0x5a; 20 << 20]).unwrap();
    let before = sha256(&img);
    for ty in ["luks2", "luks1"] {
        let mut seen = Vec::new();
        for mut t in [cs(), cryptblk()] {
            t.args(["luksFormat", "-q", "--type", ty, "--offset", "16385"])
                .args(FAST)
                .arg(&img);
            let out = run(&mut t, b"P\n");
            assert_eq!(sha256(&img), before, "{ty}: {t:?} wrote to the image");
            seen.push((
                exit_code(&out),
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        assert_eq!(seen[0], seen[1], "{ty}: cryptsetup vs cryptblk");
        assert_eq!(seen[0].0, 1, "{ty}");
    }
}

/// The data offset, keyslots area size and sector size of a LUKS2 header, from
/// cryptsetup's own luksDump.
fn layout(hdr: &std::path::Path) -> (String, String, String) {
    let out = run_ok(cs().arg("luksDump").arg(hdr), b"");
    let j: serde_json::Value = serde_json::from_str(&run_ok(
        cs().args(["luksDump", "--dump-json-metadata"]).arg(hdr),
        b"",
    ))
    .unwrap();
    assert!(out.contains("crypt"), "{out}");
    (
        j["segments"]["0"]["offset"].as_str().unwrap().to_string(),
        j["config"]["keyslots_size"].as_str().unwrap().to_string(),
        j["segments"]["0"]["sector_size"].to_string(),
    )
}

#[test]
fn align_payload_places_the_data_as_cryptsetup_does() {
    let dir = tempdir();
    let d = dir.path();
    let cases: [(&str, &[&str], bool); 7] = [
        ("luks2", &["--align-payload", "5"], false),
        (
            "luks2",
            &["--sector-size", "2048", "--align-payload", "32"],
            false,
        ),
        (
            "luks2",
            &["--sector-size", "4096", "--align-payload", "32768"],
            false,
        ),
        ("luks2", &["--align-payload", "8192"], true),
        (
            "luks2",
            &["--align-payload", "0", "--sector-size", "512"],
            true,
        ),
        ("luks1", &["--align-payload", "8192"], true),
        ("luks1", &["--align-payload", "4097"], false),
    ];
    for (i, (ty, extra, detached)) in cases.into_iter().enumerate() {
        let mut seen = Vec::new();
        for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
            let img = d.join(format!("{i}-{who}.img"));
            sparse_file(&img, 40 << 20);
            let hdr = d.join(format!("{i}-{who}.hdr"));
            t.args(["luksFormat", "-q", "--type", ty])
                .args(FAST)
                .args(extra);
            if detached {
                t.arg("--header").arg(&hdr);
            }
            let out = run(t.arg(&img), b"P\n");
            assert_eq!(
                exit_code(&out),
                0,
                "{who} {ty} {extra:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let h = if detached { &hdr } else { &img };
            if ty == "luks2" {
                seen.push(layout(h));
            } else {
                let dump = run_ok(cs().arg("luksDump").arg(h), b"");
                let off = dump
                    .lines()
                    .find(|l| l.starts_with("Payload offset:"))
                    .unwrap()
                    .to_string();
                seen.push((off, String::new(), String::new()));
            }
        }
        assert_eq!(seen[0], seen[1], "{ty} {extra:?} detached={detached}");
    }
}

/// `--keyslot-cipher`/`--keyslot-key-size` (compat-test2): the keyslot area of a new
/// keyslot (luksFormat, luksAddKey) is encrypted as asked, the same as cryptsetup's, and
/// cryptsetup opens it.
#[test]
fn keyslot_cipher_options_as_cryptsetup() {
    let dir = tempdir();
    let d = dir.path();
    let opts = [
        "--keyslot-cipher",
        "aes-cbc-plain64",
        "--keyslot-key-size",
        "128",
    ];
    let mut areas = Vec::new();
    for (who, mk) in [
        ("cryptsetup", cs as fn() -> Command),
        ("cryptblk", cryptblk),
    ] {
        let img = d.join(format!("{who}.img"));
        sparse_file(&img, 40 << 20);
        let k1 = d.join("k1");
        let k2 = d.join("k2");
        std::fs::write(&k1, b"first").unwrap();
        std::fs::write(&k2, b"second").unwrap();
        run_ok(
            mk().args(["luksFormat", "-q", "--type", "luks2", "--key-slot", "0"])
                .args(FAST)
                .args(opts)
                .arg(&img)
                .arg(&k1),
            b"",
        );
        run_ok(
            mk().args(["luksAddKey", "-q", "--key-slot", "1", "-d"])
                .arg(&k1)
                .args(FAST)
                .args(opts)
                .arg(&img)
                .arg(&k2),
            b"",
        );
        let j: serde_json::Value = serde_json::from_str(&run_ok(
            cs().args(["luksDump", "--dump-json-metadata"]).arg(&img),
            b"",
        ))
        .unwrap();
        for (slot, key) in [("0", &k1), ("1", &k2)] {
            let a = &j["keyslots"][slot]["area"];
            areas.push((a["encryption"].clone(), a["key_size"].clone()));
            run_ok(
                cs().args(["open", "--test-passphrase", "-S", slot, "--key-file"])
                    .arg(key)
                    .arg(&img),
                b"",
            );
        }
    }
    assert_eq!(
        areas[0],
        serde_json::json!(["aes-cbc-plain64", 16])
            .as_array()
            .map(|a| (a[0].clone(), a[1].clone()))
            .unwrap()
    );
    assert_eq!(areas[..2], areas[2..], "cryptsetup vs cryptblk");
}

/// `config --subsystem S` alone clears the label, and `--label L` alone the subsystem, as
/// cryptsetup sets both together (compat-test2).
#[test]
fn config_sets_label_and_subsystem_together() {
    let dir = tempdir();
    let d = dir.path();
    let mut seen = Vec::new();
    for (who, mk) in [
        ("cryptsetup", cs as fn() -> Command),
        ("cryptblk", cryptblk),
    ] {
        let img = d.join(format!("{who}.img"));
        sparse_file(&img, 20 << 20);
        run_ok(
            cs().args([
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                "--label",
                "L1",
                "--subsystem",
                "S1",
            ])
            .args(FAST)
            .arg(&img),
            b"P\n",
        );
        for args in [&["--subsystem", "S2"][..], &["--label", "L3"]] {
            run_ok(mk().arg("config").arg(&img).args(args), b"");
            let j: serde_json::Value = serde_json::from_str(&run_ok(
                cs().args(["luksDump", "--dump-json-metadata"]).arg(&img),
                b"",
            ))
            .unwrap();
            let dump = run_ok(cs().arg("luksDump").arg(&img), b"");
            let lines: Vec<String> = dump
                .lines()
                .filter(|l| l.starts_with("Label:") || l.starts_with("Subsystem:"))
                .map(str::to_string)
                .collect();
            seen.push((who, lines, j["config"].get("label").cloned()));
        }
    }
    assert_eq!(seen[0].1, seen[2].1, "after --subsystem");
    assert_eq!(seen[1].1, seen[3].1, "after --label");
    assert!(
        seen[0].1.iter().any(|l| l.contains("(no label)")),
        "{seen:?}"
    );
}
