//! `token add|remove|import|export|unassign` against cryptsetup 2.6 on copies of the same
//! header: the same sequence of actions leaves the same JSON metadata (seqid aside), exports
//! are byte-identical both ways, luksDump agrees, and every refusal has cryptsetup's exit
//! code, one message, and leaves the image untouched.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A LUKS2 image by cryptsetup with keyslots 0 and 1.
fn image(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let img = dir.join("a.img");
    let k = write_file(dir, "k", b"pass one");
    let k2 = write_file(dir, "k2", b"pass two");
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    run_ok(
        cryptsetup()?
            .arg("luksAddKey")
            .args(FAST)
            .arg("--key-file")
            .arg(&k)
            .arg(&img)
            .arg(&k2),
        b"",
    );
    Some((img, k))
}

/// The JSON metadata as cryptsetup prints it, without the sequence id line.
fn metadata(img: &Path) -> String {
    let out = run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img),
        b"",
    );
    out.lines()
        .filter(|l| !l.contains("\"seqid\""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs the same token arguments with both tools, on `a` (cryptsetup) and `b` (cryptblk),
/// feeding `stdin`; both must agree on the exit code. Returns (code, cryptblk's stderr).
fn both(a: &Path, b: &Path, args: &[&str], stdin: &[u8]) -> (i32, String) {
    let ca = run(cryptsetup().unwrap().arg("token").args(args).arg(a), stdin);
    let cb = run(cryptblk().arg("token").args(args).arg(b), stdin);
    let err = String::from_utf8_lossy(&cb.stderr).into_owned();
    assert_eq!(
        exit_code(&ca),
        exit_code(&cb),
        "token {args:?}: cryptsetup {} ({}), cryptblk {} ({err})",
        exit_code(&ca),
        String::from_utf8_lossy(&ca.stderr),
        exit_code(&cb)
    );
    assert_eq!(
        ca.stdout, cb.stdout,
        "token {args:?}: different standard output"
    );
    (exit_code(&cb), err)
}

#[test]
fn same_actions_same_headers() {
    let dir = tempdir();
    let Some((a, _)) = image(dir.path()) else {
        return;
    };
    let b = dir.path().join("b.img");
    std::fs::copy(&a, &b).unwrap();
    let d = dir.path();
    let j1 = write_file(
        d,
        "j1",
        br#"{"type":"x-foo","keyslots":["0"],"a":{"b":[1,2,"\u00e9/x"]}}"#,
    );
    let j2 = write_file(
        d,
        "j2",
        br#"{"type":"clevis","keyslots":["1"],"jwe":{"ciphertext":"abc","encrypted_key":"","iv":"x","protected":"eyJ","tag":"t"}}"#,
    );
    let ok: &[&[&str]] = &[
        &["add", "--key-description", "foo"],
        &["add", "--key-description", "bar", "--key-slot", "1"],
        &["add", "--key-description", "loose", "--unbound"],
        &[
            "add",
            "--key-description",
            "again",
            "--token-id",
            "0",
            "--token-replace",
        ],
        &["import", "--json-file", j1.to_str().unwrap()],
        &[
            "import",
            "--json-file",
            j2.to_str().unwrap(),
            "--token-id",
            "7",
            "--key-slot",
            "0",
        ],
        &[
            "import",
            "--json-file",
            j1.to_str().unwrap(),
            "--token-id",
            "3",
            "--token-replace",
            "-S",
            "1",
        ],
        &["unassign", "--token-id", "1", "--key-slot", "1"],
        &["remove", "--token-id", "2"],
        &["export", "--token-id", "3"],
        &["export", "--token-id", "7"],
    ];
    for args in ok {
        let (c, err) = both(&a, &b, args, b"");
        assert_eq!(c, 0, "token {args:?}: {err}");
        assert_eq!(metadata(&a), metadata(&b), "after token {args:?}");
    }
    // Standard input is the default JSON source.
    let (c, err) = both(
        &a,
        &b,
        &["import", "--token-id", "9"],
        br#"{"type":"y","keyslots":[]}"#,
    );
    assert_eq!(c, 0, "{err}");
    assert_eq!(metadata(&a), metadata(&b));
    let dump = |c: &mut Command, img: &Path| run_ok(c.arg("luksDump").arg(img), b"");
    assert_eq!(
        dump(&mut cryptsetup().unwrap(), &b),
        dump(&mut cryptblk(), &b)
    );
}

#[test]
fn exports_round_trip_byte_identical() {
    let dir = tempdir();
    let Some((a, _)) = image(dir.path()) else {
        return;
    };
    let d = dir.path();
    let text: &[u8] = br#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AJ4AIP/x","tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc","tpm2-policy-hash":"4c3b","tpm2-pin":false}"#;
    let j = write_file(d, "j", text);
    // cryptsetup imports, cryptblk exports.
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "import", "--json-file"])
            .arg(&j)
            .arg(&a),
        b"",
    );
    let ours = run_ok(
        cryptblk()
            .args(["token", "export", "--token-id", "0"])
            .arg(&a),
        b"",
    );
    assert_eq!(ours.as_bytes(), text);
    // cryptblk imports (its own export, via a file), cryptsetup exports to a file.
    let e = d.join("e.json");
    run_ok(
        cryptblk()
            .args(["token", "export", "--token-id", "0", "--json-file"])
            .arg(&e)
            .arg(&a),
        b"",
    );
    run_ok(
        cryptblk()
            .args(["token", "import", "--token-id", "5", "--json-file"])
            .arg(&e)
            .arg(&a),
        b"",
    );
    let theirs = d.join("t.json");
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "export", "--token-id", "5", "--json-file"])
            .arg(&theirs)
            .arg(&a),
        b"",
    );
    assert_eq!(std::fs::read(&theirs).unwrap(), text);
}

/// Where Debian's libcryptsetup looks for token plugins: `/usr/lib/<multiarch>/cryptsetup`,
/// the multiarch triplet as the C compiler (or dpkg) names it for this machine.
fn token_plugin_dir() -> PathBuf {
    let multiarch = [
        ("gcc", &["-print-multiarch"][..]),
        ("dpkg-architecture", &["-qDEB_HOST_MULTIARCH"][..]),
    ]
    .iter()
    .find_map(|(cmd, args)| {
        let out = Command::new(cmd).args(*args).output().ok()?;
        let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !t.is_empty()).then_some(t)
    })
    .expect("neither gcc -print-multiarch nor dpkg-architecture names the multiarch triplet");
    Path::new("/usr/lib").join(multiarch).join("cryptsetup")
}

/// luksDump of systemd's token types is cryptsetup's with the systemd token plugins loaded
/// (Debian's systemd installs them): the extra lines for TPM2, FIDO2 and PKCS#11 tokens,
/// with fields present, missing, and in both spellings systemd has used.
#[test]
fn luks_dump_of_systemd_tokens() {
    let dir = tempdir();
    let Some((a, _)) = image(dir.path()) else {
        return;
    };
    let plugins = token_plugin_dir();
    assert!(
        plugins.join("libcryptsetup-token-systemd-tpm2.so").exists(),
        "systemd's cryptsetup token plugins are not in {} (Debian's systemd installs them; \
         run scripts/install-deps.sh)",
        plugins.display()
    );
    let tokens: &[&str] = &[
        r#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AJ4AILj3iLw4G4ZOW8Nn934FRC4BktNS/PqonU9sN68tlCoGABDk5GlMKRQtu1ai2oGnLFlIH0XW2uCasAF+gwhMg0YiPyWR8vdLuBoJr77LhJHLNBf8aiokEnFq+hW+8F3i00uaZc0rkL1PWXTvWpfvzWmKp1Newp9QmtAw8CpZLRsZeuGotUYqrAPLsUVVVd07ZDPhAYSccwxVTUeI/gBOAAgACwAAABIAIItWgtgbKUNdCNeSeBUGEdx+WSOy/vzOaEoJV3tAEwqLABAAILYB270Sw6Y9FTcOXnXXt7p9+xmNpEYsy199xPjk8SR4","tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc","tpm2-policy-hash":"8b5682d81b29435d08d79278150611dc7e5923b2fefcce684a09577b40130a8b","tpm2-pin":false}"#,
        r#"{"type":"systemd-tpm2","keyslots":["0","1"],"tpm2-blob":"AAEC","tpm2-pcrs":[0,7,11],"tpm2-pin":true,"tpm2-pcr-bank":"sha1","tpm2-policy-hash":"00ff"}"#,
        r#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AAEC","tpm2-pcrs":[],"tpm2-policy-hash":"00ff","tpm2_pubkey":"AAECAwQ=","tpm2_pubkey_pcrs":[11,12],"tpm2-primary-alg":"rsa"}"#,
        r#"{"type":"systemd-fido2","keyslots":["1"],"fido2-credential":"AAECAwQFBgcICQoLDA0ODxAREhM=","fido2-salt":"AAEC","fido2-rp":"io.systemd.cryptsetup","fido2-clientPin-required":false,"fido2-up-required":true,"fido2-uv-required":true}"#,
        r#"{"type":"systemd-pkcs11","keyslots":["1"],"pkcs11-uri":"pkcs11:token=x","pkcs11-key":"AAEC"}"#,
    ];
    for (i, t) in tokens.iter().enumerate() {
        let j = write_file(dir.path(), &format!("t{i}"), t.as_bytes());
        run_ok(
            cryptsetup()
                .unwrap()
                .args(["token", "import", "--json-file"])
                .arg(&j)
                .arg(&a),
            b"",
        );
    }
    let theirs = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&a), b"");
    assert!(theirs.contains("tpm2-hash-pcrs:   0+7+11"), "{theirs}");
    assert_eq!(theirs, run_ok(cryptblk().arg("luksDump").arg(&a), b""));
}

#[test]
fn refusals_match_and_change_nothing() {
    let dir = tempdir();
    let Some((a, k)) = image(dir.path()) else {
        return;
    };
    let b = dir.path().join("b.img");
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "add", "--key-description", "d"])
            .arg(&a),
        b"",
    );
    std::fs::copy(&a, &b).unwrap();
    let before = sha256(&b);
    let d = dir.path();
    let bad_json: &[&[u8]] = &[
        br#"{"keyslots":[]}"#,
        br#"{"type":"x","keyslots":["9"]}"#,
        br#"{"type":"x","keyslots":[0]}"#,
        br#"{"type":"x"}"#,
        br#"{"type":"x","#,
        b"[1]",
        br#"{"type":5,"keyslots":[]}"#,
        br#"{"type":"luks2-keyring","keyslots":[]}"#,
        br#"{"type":"luks2-keyring","keyslots":[],"key_description":"a","extra":1}"#,
        b"",
    ];
    for (i, j) in bad_json.iter().enumerate() {
        let f = write_file(d, &format!("bad{i}"), j);
        let (c, err) = both(&a, &b, &["import", "--json-file", f.to_str().unwrap()], b"");
        assert_eq!(c, 1, "{}", String::from_utf8_lossy(j));
        assert_eq!(err.trim(), "Failed to import token from file.");
    }
    let good = write_file(d, "good", br#"{"type":"x","keyslots":[]}"#);
    let g = good.to_str().unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["add", "--key-description", "x", "-S", "5"],
            1,
            "Keyslot 5 is not active.",
        ),
        (
            &["add", "--key-description", "x", "--token-id", "0"],
            1,
            "Token 0 in use.",
        ),
        (
            &["add", "--key-description", "x", "--token-id", "40"],
            1,
            "Token 40 is invalid.",
        ),
        (
            &["add", "--key-description", "x", "--unbound", "-S", "1"],
            1,
            "Options --key-slot and --unbound cannot be combined.",
        ),
        (
            &["add"],
            1,
            "--key-description parameter is mandatory for token add action.",
        ),
        (
            &["import", "--json-file", g, "-S", "7"],
            1,
            "Keyslot 7 is not active.",
        ),
        (
            &["import", "--json-file", g, "--token-id", "0"],
            1,
            "Token 0 in use.",
        ),
        (
            &["import", "--json-file", g, "--unbound"],
            1,
            "Option --unbound is valid only with token add action.",
        ),
        (
            &["remove"],
            1,
            "Action requires specific token. Use --token-id parameter.",
        ),
        (&["remove", "--token-id", "7"], 1, "Token 7 is not in use."),
        (&["remove", "--token-id", "32"], 1, "Token 32 is invalid."),
        (
            &["export", "--token-id", "7"],
            1,
            "Failed to get token 7 for export.",
        ),
        (
            &["unassign", "--token-id", "0"],
            1,
            "Action requires specific keyslot. Use --key-slot parameter.",
        ),
        (
            &["unassign", "--token-id", "0", "-S", "5"],
            1,
            "Token 0 is not assigned to keyslot 5.",
        ),
        (
            &["unassign", "--token-id", "9", "-S", "0"],
            1,
            "Token 9 is not assigned to keyslot 0.",
        ),
    ];
    for (args, want, msg) in cases {
        let (c, err) = both(&a, &b, args, b"");
        assert_eq!(c, *want, "token {args:?}: {err}");
        assert!(err.trim().ends_with(msg), "token {args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "token {args:?}: {err}");
    }
    assert_eq!(
        sha256(&b),
        before,
        "a refused token action changed the image"
    );
    // Not LUKS2: a LUKS1 volume and a key file.
    let l1 = d.join("l1.img");
    cryptsetup_luks1(&l1, &k, 4 << 20).unwrap();
    for dev in [&l1, &k] {
        let (c, err) = code(
            cryptblk()
                .args(["token", "add", "--key-description", "x"])
                .arg(dev),
        );
        assert_eq!(c, 1, "{err}");
        assert_eq!(
            err.trim(),
            format!("Device {} is not a valid LUKS2 device.", dev.display())
        );
    }
    let (c, _) = code(
        cryptblk()
            .args(["token", "export", "--token-id", "0"])
            .arg(d.join("missing.img")),
    );
    assert_eq!(c, 4);
}
