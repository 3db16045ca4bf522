//! `reencrypt --encrypt` (data shift, detached header) and `--decrypt` (detached header)
//! against cryptsetup 2.6.1 on the same inputs:
//!
//! - the metadata cryptblk writes is cryptsetup's, field for field (salts, digests and
//!   UUIDs aside), at `--init-only` and when finished;
//! - runs cryptsetup began and strace killed at a write are read correctly by cryptblk
//!   (`decrypt`) and finished by `cryptblk reencrypt --resume-only`; cryptsetup accepts the
//!   result and the independent model decrypts it with the volume key cryptsetup reports
//!   (or the data reads back as plaintext after a decryption);
//! - runs cryptblk began and strace killed at a write are finished by cryptsetup.
//!
//! Kill points are a sample of each run's writes (set `CRYPTBLK_REENC_EVERY=1` for all).

mod common;
use common::reenc::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"encdec-pass";
const MIB: usize = 1 << 20;

type Lab = KeyLab;

/// The metadata with what is random in it blanked: salts, digests and their iterations,
/// the digests' ids.
fn normalized(mut j: Value) -> Value {
    if let Some(ks) = j["keyslots"].as_object_mut() {
        for k in ks.values_mut() {
            if k["kdf"].is_object() {
                k["kdf"]["salt"] = Value::Null;
            }
        }
    }
    if let Some(d) = j["digests"].as_object_mut() {
        let vals: Vec<Value> = d
            .values()
            .map(|v| {
                let mut v = v.clone();
                v["salt"] = Value::Null;
                v["digest"] = Value::Null;
                // Calibrated (the reencryption digest of a decryption is).
                v["iterations"] = Value::Null;
                v
            })
            .collect();
        j["digests"] = Value::Array(vals);
    }
    j
}

fn cryptblk_ok(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut c = cryptblk();
    for a in args {
        c.arg(a);
    }
    let out = run(&mut c, b"");
    assert!(
        out.status.success(),
        "cryptblk {:?} failed: {}",
        c.get_args().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// cryptsetup accepts the finished header of `img` and the independent model decrypts
/// `len` bytes from `offset` to `plain`.
fn check_encrypted(lab: &Lab, img: &Path, hdr: Option<&Path>, offset: usize, plain: &[u8]) {
    let hdr_args: Vec<&str> = hdr.map_or(vec![], |h| vec!["--header", h.to_str().unwrap()]);
    let j = json_of(hdr.unwrap_or(img)).expect("cryptsetup reads the header");
    assert!(
        j["config"]["requirements"].is_null(),
        "still reencrypting: {j}"
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&lab.key)
            .args(&hdr_args)
            .arg(img),
        b"",
    );
    let key = cryptsetup_volume_key(img, &lab.key, &hdr_args).unwrap();
    let data = std::fs::read(img).unwrap();
    let got = independent(
        "decrypt",
        "aes-xts-plain64",
        &key,
        512,
        &data[offset..offset + plain.len()],
    );
    assert!(
        got == plain,
        "the finished volume does not decrypt to the plaintext"
    );
}

/// `cryptsetup reencrypt --encrypt --reduce-device-size 4M` of a 10 MiB plain device,
/// killed at a sample of its writes: cryptblk reads each interrupted volume, finishes it,
/// and cryptsetup and the model agree with the result.
#[test]
fn cryptsetup_killed_datashift_encryptions_are_read_and_finished_by_cryptblk() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let base = lab.path("plain.img");
    let all = write_pattern(&base, 10 * MIB, 11);
    let plain = &all[..6 * MIB];
    let img = lab.path("enc.img");
    let key = lab.key.to_str().unwrap().to_string();
    let img_s = img.to_str().unwrap().to_string();
    let cmd: Vec<&str> = [
        "cryptsetup",
        "--batch-mode",
        "reencrypt",
        "--encrypt",
        "--reduce-device-size",
        "4M",
        "--key-file",
        key.as_str(),
    ]
    .into_iter()
    .chain(FAST)
    .chain([img_s.as_str()])
    .collect();
    std::fs::copy(&base, &img).unwrap();
    let total = count_writes(&os(&cmd), "write", lab.dir.path());
    assert!(total > 10, "only {total} writes");
    let mut tried = 0;
    for n in kill_points(total, 6) {
        std::fs::copy(&base, &img).unwrap();
        killed(&os(&cmd), "write", n, lab.dir.path());
        let Some(j) = json_of(&img) else {
            // Killed before the header went on: still the plain device.
            assert!(
                std::fs::read(&img).unwrap()[..6 * MIB] == *plain,
                "kill {n}"
            );
            continue;
        };
        if !j["config"]["requirements"].is_null() {
            let out = lab.path("out");
            cryptblk_ok(&[&"decrypt", &"--key-file", &lab.key, &img, &out]);
            assert!(
                std::fs::read(&out).unwrap() == plain,
                "kill {n}: cryptblk reads the interrupted encryption wrong"
            );
            cryptblk_ok(&[
                &"reencrypt",
                &"--resume-only",
                &"--key-file",
                &lab.key,
                &img,
            ]);
        }
        check_encrypted(&lab, &img, None, 2 * MIB, plain);
        tried += 1;
    }
    eprintln!("{tried} of cryptsetup's {total} writes killed and finished by cryptblk");
    assert!(tried >= 4);
}

/// A LUKS2 volume with a detached header: `plain` encrypted by the model under a known
/// key, the header made by cryptsetup. Returns (header, data).
fn detached_volume(lab: &Lab, plain: &[u8]) -> (PathBuf, PathBuf) {
    let hdr = lab.path("base.hdr");
    let data = lab.path("base.img");
    let vk = lab.path("vk");
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(5))
        .collect();
    std::fs::write(&vk, &key).unwrap();
    std::fs::write(&data, vec![0u8; plain.len()]).unwrap();
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(["--sector-size", "4096", "--volume-key-file"])
            .arg(&vk)
            .args(FAST)
            .arg("--key-file")
            .arg(&lab.key)
            .arg("--header")
            .arg(&hdr)
            .arg(&data),
        b"",
    );
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let ct = independent("encrypt", "aes-xts-plain64", &hex, 4096, plain);
    std::fs::write(&data, ct).unwrap();
    (hdr, data)
}

/// `cryptsetup reencrypt --decrypt --header H` (backward, checksum, 1 MiB hotzones) of an
/// 8 MiB volume killed at a sample of its writes: cryptblk reads each interrupted volume and
/// finishes it; the data is the plaintext and cryptsetup reads the final header.
#[test]
fn cryptsetup_killed_detached_decryptions_are_read_and_finished_by_cryptblk() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let plain = write_pattern(&lab.path("pattern"), 8 * MIB, 5);
    let (base_hdr, base_data) = detached_volume(&lab, &plain);
    let (hdr, img) = (lab.path("dec.hdr"), lab.path("dec.img"));
    let (key, hdr_s, img_s) = (
        lab.key.to_str().unwrap().to_string(),
        hdr.to_str().unwrap().to_string(),
        img.to_str().unwrap().to_string(),
    );
    let cmd = [
        "cryptsetup",
        "--batch-mode",
        "reencrypt",
        "--decrypt",
        "--force-offline-reencrypt",
        "--hotzone-size",
        "1M",
        "--header",
        hdr_s.as_str(),
        "--key-file",
        key.as_str(),
        img_s.as_str(),
    ];
    let reset = || {
        std::fs::copy(&base_hdr, &hdr).unwrap();
        std::fs::copy(&base_data, &img).unwrap();
    };
    reset();
    let total = count_writes(&os(&cmd), "write", lab.dir.path());
    assert!(total > 20, "only {total} writes");
    let mut tried = 0;
    for n in kill_points(total, 8) {
        reset();
        killed(&os(&cmd), "write", n, lab.dir.path());
        let j = json_of(&hdr).expect("the detached header stays readable");
        let finished =
            j["segments"]["0"]["type"] == "linear" && j["config"]["requirements"].is_null();
        if in_progress(&hdr) {
            let out = lab.path("out");
            cryptblk_ok(&[
                &"decrypt",
                &"--header",
                &hdr,
                &"--key-file",
                &lab.key,
                &img,
                &out,
            ]);
            assert!(
                std::fs::read(&out).unwrap() == plain,
                "kill {n}: cryptblk reads the interrupted decryption wrong"
            );
            cryptblk_ok(&[
                &"reencrypt",
                &"--resume-only",
                &"--header",
                &hdr,
                &"--key-file",
                &lab.key,
                &img,
            ]);
        } else if !finished {
            // Killed before the reencryption was recorded: cryptblk starts it itself.
            cryptblk_ok(&[
                &"reencrypt",
                &"--decrypt",
                &"--header",
                &hdr,
                &"--key-file",
                &lab.key,
                &img,
            ]);
        }
        let j = json_of(&hdr).expect("cryptsetup reads the final header");
        assert!(j["config"]["requirements"].is_null(), "kill {n}: {j}");
        assert_eq!(j["segments"]["0"]["type"], "linear", "kill {n}");
        assert!(
            std::fs::read(&img).unwrap() == plain,
            "kill {n}: data is not the plaintext"
        );
        tried += 1;
    }
    eprintln!("{tried} of cryptsetup's {total} writes killed and finished by cryptblk");
    assert!(tried >= 6);
}

/// cryptblk's and cryptsetup's `--init-only` and finished metadata agree (salts and
/// digests aside) for the three kinds, on copies of the same inputs.
#[test]
fn encdec_metadata_is_cryptsetups() {
    assert!(
        cryptsetup().is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let base = lab.path("plain.img");
    let all = write_pattern(&base, 8 * MIB, 2);
    for tool_name in ["cs", "cb"] {
        for (i, init_only) in [true, false].into_iter().enumerate() {
            let img = lab.path(&format!("{tool_name}-shift-{i}.img"));
            std::fs::copy(&base, &img).unwrap();
            let hdr = lab.path(&format!("{tool_name}-det-{i}.hdr"));
            let img2 = lab.path(&format!("{tool_name}-det-{i}.img"));
            std::fs::copy(&base, &img2).unwrap();
            let mut extra = vec!["--force-offline-reencrypt"];
            if init_only {
                extra.push("--init-only");
            }
            for (dev, args) in [
                (&img, vec!["--reduce-device-size", "4M"]),
                (&img2, vec!["--header", hdr.to_str().unwrap()]),
            ] {
                let mut c = if tool_name == "cs" {
                    let mut c = cryptsetup().unwrap();
                    c.arg("--batch-mode");
                    c
                } else {
                    cryptblk()
                };
                c.current_dir(lab.dir.path())
                    .args(["reencrypt", "--encrypt"])
                    .args(&args)
                    .args(&extra)
                    .args(FAST)
                    .arg("--key-file")
                    .arg(&lab.key)
                    .arg(dev);
                let out = run(&mut c, b"");
                assert!(out.status.success(), "{tool_name}: {out:?}");
            }
        }
    }
    for i in 0..2 {
        for (a, b) in [
            (format!("cs-shift-{i}.img"), format!("cb-shift-{i}.img")),
            (format!("cs-det-{i}.hdr"), format!("cb-det-{i}.hdr")),
        ] {
            let (ja, jb) = (
                json_of(&lab.path(&a)).unwrap(),
                json_of(&lab.path(&b)).unwrap(),
            );
            assert_eq!(normalized(ja), normalized(jb), "{a} vs {b}");
        }
    }
    // Both finished encryptions decrypt to the data (the moved segment included).
    check_encrypted(
        &lab,
        &lab.path("cb-shift-1.img"),
        None,
        2 * MIB,
        &all[..4 * MIB],
    );
    let hdr = lab.path("cb-det-1.hdr");
    check_encrypted(&lab, &lab.path("cb-det-1.img"), Some(&hdr), 0, &all);

    // Decryption of a detached-header volume, from copies of one header.
    let plain = write_pattern(&lab.path("pattern"), 4 * MIB, 9);
    let (h0, d0) = detached_volume(&lab, &plain);
    for i in 0..2 {
        let mut js = Vec::new();
        for tool_name in ["cs", "cb"] {
            let (h, d) = (
                lab.path(&format!("{tool_name}-dec-{i}.hdr")),
                lab.path(&format!("{tool_name}-dec-{i}.img")),
            );
            std::fs::copy(&h0, &h).unwrap();
            std::fs::copy(&d0, &d).unwrap();
            let mut c = if tool_name == "cs" {
                let mut c = cryptsetup().unwrap();
                c.arg("--batch-mode");
                c
            } else {
                cryptblk()
            };
            c.args(["reencrypt", "--decrypt", "--force-offline-reencrypt"]);
            if i == 0 {
                c.arg("--init-only");
            }
            c.arg("--header")
                .arg(&h)
                .arg("--key-file")
                .arg(&lab.key)
                .arg(&d);
            let out = run(&mut c, b"");
            assert!(out.status.success(), "{tool_name}: {out:?}");
            if i == 1 {
                assert!(
                    std::fs::read(&d).unwrap() == plain,
                    "{tool_name}: decrypted data"
                );
            }
            js.push(normalized(json_of(&h).unwrap()));
        }
        assert_eq!(js[0], js[1], "decrypt metadata (init-only: {})", i == 0);
    }
    // Without --header cryptsetup 2.6.1 refuses an attached-header decryption (exit 1).
    let att = lab.path("att.img");
    std::fs::copy(&base, &att).unwrap();
    let (code, err) = common::code(
        cryptblk()
            .args(["reencrypt", "--decrypt", "--key-file"])
            .arg(&lab.key)
            .arg(&att),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("LUKS2 decryption requires --header option."),
        "{err}"
    );
}

/// cryptblk's own encryption (data shift) and decryption (detached header), killed at a
/// sample of their writes, finished by cryptsetup (after `repair` where it asks).
#[test]
fn cryptblk_killed_encdec_runs_are_finished_by_cryptsetup() {
    assert!(
        cryptsetup().is_some() && tool("strace").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let lab = Lab::new(PASS);
    let base = lab.path("plain.img");
    let all = write_pattern(&base, 8 * MIB, 4);
    let plain = &all[..4 * MIB];
    let bin = env!("CARGO_BIN_EXE_cryptblk");
    let img = lab.path("enc.img");
    let (key, img_s) = (
        lab.key.to_str().unwrap().to_string(),
        img.to_str().unwrap().to_string(),
    );
    let cmd = [
        bin,
        "reencrypt",
        "--encrypt",
        "--reduce-device-size",
        "4M",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        key.as_str(),
        img_s.as_str(),
    ];
    let resume = |hdr: Option<&Path>, dev: &Path| {
        let hdr_args: Vec<&str> = hdr.map_or(vec![], |h| vec!["--header", h.to_str().unwrap()]);
        let go = || {
            run(
                cryptsetup()
                    .unwrap()
                    .args(["--batch-mode", "reencrypt", "--resume-only"])
                    .arg("--force-offline-reencrypt")
                    .args(&hdr_args)
                    .arg("--key-file")
                    .arg(&lab.key)
                    .arg(dev),
                b"",
            )
        };
        if !go().status.success() {
            run_ok(
                cryptsetup()
                    .unwrap()
                    .args(["--batch-mode", "repair"])
                    .args(&hdr_args)
                    .arg("--key-file")
                    .arg(&lab.key)
                    .arg(dev),
                b"",
            );
            let j = json_of(hdr.unwrap_or(dev)).unwrap();
            let data_segments = j["segments"]
                .as_object()
                .unwrap()
                .values()
                .filter(|s| s["flags"].is_null())
                .count();
            if in_progress(hdr.unwrap_or(dev)) && data_segments == 1 {
                // cryptsetup 2.6.1's repair of a cut last hotzone leaves all data new with
                // the requirement still set, and its own resume of that header processes
                // the whole device again (destroying it); cryptblk finishes the metadata.
                let mut c = cryptblk();
                c.args(["reencrypt", "--resume-only"]);
                if let Some(h) = hdr {
                    c.arg("--header").arg(h);
                }
                run_ok(c.arg("--key-file").arg(&lab.key).arg(dev), b"");
            } else if in_progress(hdr.unwrap_or(dev)) {
                let out = go();
                assert!(out.status.success(), "{out:?}");
            }
        }
    };
    std::fs::copy(&base, &img).unwrap();
    let total = count_writes(&os(&cmd), "pwrite64", lab.dir.path());
    assert!(total >= 8, "only {total} writes");
    let mut tried = 0;
    for n in kill_points(total, 6) {
        std::fs::copy(&base, &img).unwrap();
        killed(&os(&cmd), "pwrite64", n, lab.dir.path());
        if json_of(&img).is_none() {
            assert!(
                std::fs::read(&img).unwrap()[..4 * MIB] == *plain,
                "kill {n}"
            );
            continue;
        }
        if in_progress(&img) {
            resume(None, &img);
        }
        check_encrypted(&lab, &img, None, 2 * MIB, plain);
        tried += 1;
    }

    let dplain = write_pattern(&lab.path("pattern"), 4 * MIB, 8);
    let (h0, d0) = detached_volume(&lab, &dplain);
    let (hdr, dimg) = (lab.path("d.hdr"), lab.path("d.img"));
    let (hdr_s, dimg_s) = (
        hdr.to_str().unwrap().to_string(),
        dimg.to_str().unwrap().to_string(),
    );
    let dcmd = [
        bin,
        "reencrypt",
        "--decrypt",
        "--hotzone-size",
        "512K",
        "--header",
        hdr_s.as_str(),
        "--key-file",
        key.as_str(),
        dimg_s.as_str(),
    ];
    let reset = || {
        std::fs::copy(&h0, &hdr).unwrap();
        std::fs::copy(&d0, &dimg).unwrap();
    };
    reset();
    let dtotal = count_writes(&os(&dcmd), "pwrite64", lab.dir.path());
    for n in kill_points(dtotal, 8) {
        reset();
        killed(&os(&dcmd), "pwrite64", n, lab.dir.path());
        if in_progress(&hdr) {
            resume(Some(&hdr), &dimg);
        } else if json_of(&hdr).unwrap()["segments"]["0"]["type"] == "crypt" {
            continue;
        }
        assert!(std::fs::read(&dimg).unwrap() == dplain, "decrypt kill {n}");
        tried += 1;
    }
    eprintln!("cryptblk killed at {tried} writes ({total} + {dtotal}), cryptsetup finished");
    assert!(tried >= 8);
}
