//! cryptsetup's up-front argument checks: for each command line, `cryptblk --test-args` and
//! the real `cryptsetup --test-args` must agree on the exit status (0, or 1 for a usage
//! error), and cryptblk must refuse in one line. Nothing here touches a device: `--test-args`
//! stops after the checks (one test proves that on an image).

mod common;

use common::{cryptblk, run, tool, write_file};

/// Command lines and whether cryptsetup 2.8 accepts them (`true`) or refuses them up front.
/// `DEV`, `NAME`, `F`... are never opened: `--test-args` stops before.
const CASES: &[(&str, bool)] = &[
    // An option outside its actions.
    ("close NAME --test-passphrase", false),
    ("resize NAME --test-passphrase", false),
    ("open DEV NAME --deferred", false),
    ("close NAME --deferred", true),
    ("close NAME --shared", false),
    ("close NAME --allow-discards", false),
    ("open DEV NAME --allow-discards", true),
    ("close NAME --persistent", false),
    ("open DEV NAME --persistent", true),
    ("luksFormat DEV --serialize-memory-hard-pbkdf", false),
    ("open DEV NAME --serialize-memory-hard-pbkdf", true),
    ("close NAME --key-size 256", false),
    ("luksUUID DEV --key-size 256", false),
    ("luksAddKey DEV --key-size 256", true),
    ("open DEV NAME --integrity hmac-sha256", false),
    ("luksFormat DEV --type luks2 --integrity hmac-sha256", true),
    ("open DEV NAME --integrity-no-wipe", false),
    ("open DEV NAME --label L", false),
    ("open DEV NAME --subsystem S", false),
    ("luksFormat DEV --label L --subsystem S", true),
    ("config DEV --label L", true),
    ("luksAddKey DEV --use-random", false),
    ("luksFormat DEV --use-random", true),
    ("luksFormat DEV --use-urandom", true),
    (
        "open DEV NAME --uuid 12345678-1234-1234-1234-123456789abc",
        false,
    ),
    (
        "luksUUID DEV --uuid 12345678-1234-1234-1234-123456789abc",
        true,
    ),
    ("open DEV NAME --align-payload 8192", false),
    ("luksFormat DEV --align-payload 8192", true),
    ("resize NAME --luks2-metadata-size 16k", false),
    ("resize NAME --luks2-keyslots-size 16m", false),
    ("reencrypt DEV --luks2-keyslots-size 16m", true),
    ("luksFormat DEV --skip 8192", false),
    ("resize NAME --offset 8292", false),
    ("luksFormat DEV --offset 16384", true),
    ("luksFormat DEV --iv-large-sectors", false),
    ("resize NAME --refresh", false),
    ("tcryptDump DEV --allow-discards --type tcrypt", false),
    ("luksDump DEV --pbkdf pbkdf2", false),
    ("open DEV NAME --pbkdf-force-iterations 1000", false),
    ("open DEV NAME --hotzone-size 1m", false),
    ("luksFormat DEV --keep-key", false),
    ("open DEV NAME --token-replace", false),
    ("open DEV NAME --cancel-deferred", false),
    ("open DEV NAME --priority prefer", false),
    // Values refused while parsing.
    ("open DEV NAME --key-size 31", false),
    ("open DEV NAME --key-size 32", true),
    ("luksFormat DEV --key-size -32", false),
    ("reencrypt DEV --key-size 31", false),
    ("benchmark --key-size 31", false),
    ("benchmark --key-size 32", true),
    ("luksAddKey DEV --key-size 31", false),
    ("luksFormat DEV --key-size abc", false),
    ("luksFormat DEV -S-2", false),
    ("luksFormat DEV -S 2", true),
    ("luksFormat DEV --keyfile-size -1 --key-file F", false),
    ("luksFormat DEV --keyfile-size 42 --key-file F", true),
    ("luksAddKey DEV --new-keyfile-size -42 NF", false),
    ("luksFormat DEV --sector-size 511", false),
    ("luksFormat DEV --sector-size 8192", false),
    ("luksFormat DEV --sector-size 1536", false),
    ("luksFormat DEV --sector-size 4096", true),
    ("reencrypt DEV --sector-size 1024", true),
    ("config DEV -S1 --priority norma", false),
    ("config DEV -S1 --priority normal", true),
    ("config DEV -S1 --priority ignore", true),
    ("luksFormat DEV --pbkdf blah", false),
    ("luksFormat DEV --pbkdf argon2id", true),
    ("luksFormat DEV --pbkdf-force-iterations 1000 -i1", false),
    ("reencrypt DEV --reduce-device-size 2G", false),
    ("reencrypt DEV --reduce-device-size 67108865", false),
    ("reencrypt DEV --reduce-device-size -64m", false),
    ("reencrypt DEV --reduce-device-size 64m", true),
    ("reencrypt DEV --reduce-device-size 1024S", true),
    ("reencrypt DEV --device-size 33554433", false),
    ("reencrypt DEV --device-size 32m", true),
    ("reencrypt DEV --hotzone-size 0", false),
    ("luksFormat DEV --luks2-metadata-size 16x", false),
    ("luksFormat DEV --luks2-metadata-size 16k", true),
    (
        "luksAddKey DEV --keyslot-cipher aes-xts-plain64 --keyslot-key-size 31",
        false,
    ),
    ("open DEV NAME --type tcrypt --veracrypt-pim -1", false),
    ("open DEV NAME --type tcrypt --veracrypt-pim 1", true),
    // Combinations.
    ("open DEV NAME --persistent --test-passphrase", false),
    ("open DEV NAME --type luks1 --shared", false),
    ("open DEV NAME --type plain --shared", true),
    ("open DEV NAME --skip 8192", false),
    ("open DEV NAME --skip 8192 --type loopaes", true),
    ("open DEV NAME --offset 16384", false),
    ("open DEV NAME --offset 16384 --type plain", true),
    ("open DEV NAME --sector-size 1024", false),
    ("open DEV NAME --type plain --sector-size 1024", true),
    (
        "open DEV --type plain --iv-large-sectors --sector-size 512",
        false,
    ),
    (
        "open DEV --type plain --iv-large-sectors --sector-size 1024",
        true,
    ),
    ("open DEV NAME --type tcrypt --iv-large-sectors", false),
    ("open DEV NAME --test-passphrase --type plain", false),
    ("open DEV NAME --test-passphrase --type bitlk", true),
    ("open DEV NAME --test-passphrase --type luks2", true),
    (
        "open DEV NAME --type plain --size 100 --device-size 51200",
        false,
    ),
    ("open DEV NAME --type plain --device-size 32m", true),
    ("open DEV --unbound NAME", false),
    ("open DEV --unbound -S5 NAME", false),
    ("open DEV --unbound --test-passphrase", true),
    (
        "open DEV NAME --type tcrypt --tcrypt-hidden --allow-discards",
        false,
    ),
    ("open DEV NAME --tcrypt-hidden", false),
    ("open DEV NAME --tcrypt-system --type tcrypt", true),
    ("tcryptDump DEV NAME --tcrypt-backup --type tcrypt", true),
    ("open DEV NAME --veracrypt", false),
    ("open DEV NAME --type tcrypt --veracrypt", true),
    (
        "open DEV NAME --type tcrypt --disable-veracrypt --veracrypt-pim 1",
        false,
    ),
    (
        "open DEV NAME --type tcrypt --disable-veracrypt --veracrypt-query-pim",
        false,
    ),
    ("open DEV NAME --key-file F0 --key-file F1", false),
    (
        "open DEV NAME --key-file F0 --key-file F1 --type tcrypt",
        true,
    ),
    ("open DEV NAME --test-passphrase --refresh", false),
    ("open DEV NAME --refresh", true),
    ("refresh DEV NAME", true),
    ("refresh DEV NAME --test-passphrase", false),
    ("close NAME --deferred --cancel-deferred", false),
    ("luksFormat DEV --align-payload 8192 --offset 16384", false),
    ("luksFormat DEV --type luks2 --integrity-no-wipe", false),
    (
        "luksFormat DEV --type luks2 --integrity hmac-sha256 --integrity-no-wipe",
        true,
    ),
    ("luksFormat DEV --use-random --use-urandom", false),
    ("luksFormat DEV --keyslot-cipher aes-xts-plain64", false),
    ("luksFormat DEV --keyslot-key-size 512", false),
    (
        "luksFormat DEV --keyslot-cipher aes-xts-plain64 --keyslot-key-size 512",
        true,
    ),
    ("luksAddKey DEV --unbound", false),
    ("luksAddKey DEV --unbound --key-size 0", false),
    ("luksAddKey DEV --unbound --key-size 256", true),
    ("luksDump DEV --unbound", false),
    ("luksDump DEV --unbound -S5", true),
    (
        "reencrypt DEV --active-name N --force-offline-reencrypt",
        false,
    ),
    ("reencrypt DEV --type luks1 --active-name N", false),
    ("token add DEV", false),
    ("token add DEV --key-description D", true),
    ("token remove DEV", false),
    ("token export DEV --token-id 0", true),
    ("token unassign DEV --token-id 0", false),
    ("token unassign DEV --token-id 0 -S0", true),
    ("token bogus DEV", false),
    ("luksKillSlot DEV", false),
    ("luksKillSlot DEV 1", true),
    // cryptsetup's spellings: repeated flags, aliases, options before the action.
    ("-q luksFormat -q DEV", true),
    ("--key-size 31 open DEV NAME", false),
    ("--type plain open DEV NAME --shared", true),
    ("create NAME DEV", true),
    ("plainOpen DEV NAME --shared", true),
    ("luksOpen DEV NAME --shared", false),
    ("remove NAME", true),
    ("luksAddKey DEV --new-keyfile-size 42 NF", true),
    ("luksAddKey DEV --master-key-file F", true),
    ("open DEV NAME --disable-locks --disable-keyring", true),
];

/// Rows where cryptsetup 2.6.1 (the host's) differs from 2.8: compared with cryptblk only.
const NOT_IN_261: &[&str] = &[];

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn cryptblk_refuses_what_cryptsetup_refuses_up_front() {
    let mut wrong = Vec::new();
    for &(line, accepted) in CASES {
        let expected = if accepted { 0 } else { 1 };
        if !NOT_IN_261.contains(&line) {
            let mut cs = tool("cryptsetup").expect("cryptsetup");
            let out = run(cs.arg("--test-args").args(words(line)), b"");
            let rc = out.status.code().unwrap_or(-1);
            if rc != expected {
                wrong.push(format!("cryptsetup {line}: rc {rc}, table says {expected}"));
            }
        }
        let out = run(cryptblk().arg("--test-args").args(words(line)), b"");
        let rc = out.status.code().unwrap_or(-1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if rc != expected {
            wrong.push(format!(
                "cryptblk {line}: rc {rc}, expected {expected}: {stderr}"
            ));
        } else if accepted && stdout != "No action taken. Invoked with --test-args option.\n" {
            wrong.push(format!("cryptblk {line}: stdout {stdout:?}"));
        } else if !accepted && (stderr.lines().count() != 1 || !stdout.is_empty()) {
            wrong.push(format!("cryptblk {line}: not one line: {stdout}{stderr}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The messages are cryptsetup's (the last line of its usage output).
#[test]
fn refusals_carry_cryptsetup_messages() {
    for line in [
        "open DEV NAME --key-size 31",
        "luksFormat DEV --sector-size 511",
        "open DEV NAME --integrity hmac-sha256",
        "open DEV NAME --type luks1 --shared",
        "config DEV --priority normal",
        "luksKillSlot DEV",
    ] {
        let mut cs = tool("cryptsetup").expect("cryptsetup");
        let theirs = run(cs.arg("--test-args").args(words(line)), b"");
        let theirs = String::from_utf8_lossy(&theirs.stderr);
        let theirs = theirs.lines().last().unwrap_or_default();
        let theirs = theirs.strip_prefix("cryptsetup: ").unwrap_or(theirs);
        let ours = run(cryptblk().arg("--test-args").args(words(line)), b"");
        let ours = String::from_utf8_lossy(&ours.stderr);
        assert_eq!(ours.trim_end(), theirs, "{line}");
    }
}

/// `--test-args` does nothing to the device, and an option cryptblk parses but does not
/// implement is refused when the action runs, the image untouched.
#[test]
fn test_args_and_unsupported_options_leave_the_image_alone() {
    let dir = common::tempdir();
    let img = write_file(dir.path(), "img", &vec![0u8; 4 << 20]);
    let key = write_file(dir.path(), "key", b"passphrase");
    let before = common::sha256(&img);
    let out = run(
        cryptblk()
            .args(["--test-args", "-q", "luksFormat", "--type", "luks2", "-d"])
            .arg(&key)
            .arg(&img),
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(common::sha256(&img), before);
    // cryptsetup accepts this line (`--test-args`: exit 0); cryptblk parses it but does not
    // implement large-IV plain mappings, so it refuses when the action runs.
    let out = run(
        cryptblk()
            .args([
                "-q",
                "open",
                "--type",
                "plain",
                "--cipher",
                "aes-xts-plain64",
            ])
            .args([
                "--key-size",
                "256",
                "--sector-size",
                "4096",
                "--iv-large-sectors",
            ])
            .arg("-d")
            .arg(&key)
            .arg(&img)
            .arg("args-check-iv-large"),
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Option --iv-large-sectors is not supported by cryptblk.\n"
    );
    assert_eq!(common::sha256(&img), before);
}
