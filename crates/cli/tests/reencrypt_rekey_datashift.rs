//! A re-key with `--reduce-device-size` (cryptsetup's datashift re-encryption: the data
//! moves up by the shift, its last shift bytes are dropped) initialised by cryptsetup 2.6.1
//! and run by cryptblk ends with the very data area cryptsetup's own run leaves, and never
//! writes past the device's end (issue 25, luks2-reencryption-mangle-test [7]).

mod common;

use common::*;

#[test]
fn datashift_rekey_run_matches_cryptsetup_and_stays_inside_the_device() {
    let dir = tempdir();
    let d = dir.path();
    let key = d.join("key");
    std::fs::write(&key, b"datashift rekey key").unwrap();
    let base = d.join("base.img");
    write_pattern(&base, 32 << 20, 7);
    let cs = || {
        let mut c = tool("cryptsetup").unwrap();
        c.arg("-q");
        c
    };
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
    run_ok(
        cs().args(["reencrypt", "--init-only", "--reduce-device-size", "2M"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&base),
        b"",
    );
    let mut images = Vec::new();
    for (who, mut t) in [("cryptsetup", cs()), ("cryptblk", cryptblk())] {
        let img = d.join(format!("{who}.img"));
        std::fs::copy(&base, &img).unwrap();
        run_ok(
            t.args(["reencrypt", "-q", "--force-offline-reencrypt", "--key-file"])
                .arg(&key)
                .arg(&img),
            b"",
        );
        images.push(std::fs::read(&img).unwrap());
    }
    assert_eq!(
        images[1].len(),
        32 << 20,
        "cryptblk changed the device size"
    );
    let data = 16 << 20;
    assert!(
        images[0][data..] == images[1][data..],
        "the data areas differ after the run"
    );
}
