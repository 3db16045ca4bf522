//! cryptsetup 2.7/2.8 behaviour of plain mode and `--perf-high_priority` (issue 25 item 2):
//! - plain mode's defaults are 2.7+'s (aes-xts-plain64, 256-bit key, so AES-128-XTS, and a
//!   sha256 passphrase hash; 2.6.1 used aes-cbc-essiv:sha256 and ripemd160), judged by
//!   OpenSSL: the sectors cryptblk wrote are AES-128-XTS under sha256(passphrase) with plain64
//!   tweaks; the three warnings are 2.8's, on stderr, and absent when everything is named;
//! - `--perf-high_priority` reaches the table (`high_priority`), `status` shows it on the
//!   flags line as cryptsetup 2.8 does, and the daemon's writer thread runs at nice -20.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

const PASSPHRASE: &[u8] = b"plain defaults passphrase";

const WARN_CIPHER: &str = "WARNING: Using default options for cipher (aes-xts-plain64, key size 256 bits) that could be incompatible with older versions.";
const WARN_HASH: &str = "WARNING: Using default options for hash (sha256) that could be incompatible with older versions.";
const WARN_ALWAYS: &str = "For plain mode, always use options --cipher, --key-size and if no keyfile or keyring is used, then also --hash.";

fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl is installed by scripts/install-deps.sh");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}");
    out.stdout
}

/// `openssl enc -aes-128-ecb` without padding.
fn aes128_ecb(key: &[u8], data: &[u8]) -> Vec<u8> {
    openssl(
        &["enc", "-aes-128-ecb", "-K", &hex::encode(key), "-nopad"],
        data,
    )
}

/// One 512-byte sector in AES-128-XTS with a plain64 tweak, built over OpenSSL's AES-ECB
/// (`openssl enc` has no XTS): `T = E_k2(IV)`, `C_j = E_k1(P_j ^ T*x^j) ^ T*x^j`.
fn aes128_xts_by_hand(key: &[u8], sector: u64, plain: &[u8]) -> Vec<u8> {
    let (k1, k2) = key.split_at(16);
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&sector.to_le_bytes());
    let mut t = u128::from_le_bytes(aes128_ecb(k2, &iv).try_into().unwrap());
    let mut masks = Vec::new();
    let mut xored = Vec::new();
    for block in plain.chunks(16) {
        let p = u128::from_le_bytes(block.try_into().unwrap());
        xored.extend_from_slice(&(p ^ t).to_le_bytes());
        masks.push(t);
        t = (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 };
    }
    aes128_ecb(k1, &xored)
        .chunks(16)
        .zip(masks)
        .flat_map(|(b, m)| (u128::from_le_bytes(b.try_into().unwrap()) ^ m).to_le_bytes())
        .collect()
}

/// `cryptblk open --type plain EXTRA IMG NAME --nbd SOCK` with the passphrase on stdin;
/// returns its stderr.
fn open_plain(img: &Path, name: &str, sock: &Path, extra: &[&str], stdin: &[u8]) -> String {
    let out = run(
        cryptblk()
            .args(["open", "--type", "plain"])
            .args(extra)
            .arg(img)
            .arg(name)
            .arg("--nbd")
            .arg(sock),
        stdin,
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "open --type plain {extra:?}: {err}");
    err
}

fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("WARNING: Using default") || l.starts_with("For plain mode"))
        .collect()
}

#[test]
fn plain_defaults_are_cryptsetup_2_8s_and_warned_about() {
    let dir = tempdir();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 1 << 20);
    let sock = dir.path().join("p.sock");
    let name = "t-plain28-defaults";
    let err = open_plain(&img, name, &sock, &[], PASSPHRASE);
    let served = Served::volume(name);
    assert_eq!(
        warnings(&err),
        [WARN_CIPHER, WARN_HASH, WARN_ALWAYS],
        "{err}"
    );
    let st = status(name);
    let table = st["table"].as_str().unwrap().to_string();
    assert!(table.contains(" crypt aes-xts-plain64 "), "{table}");
    let data_file = dir.path().join("data");
    let data = write_pattern(&data_file, 64 << 10, 5);
    run_ok(
        Command::new("nbdcopy").arg(&data_file).arg(nbd_uri(&sock)),
        b"",
    );
    run_ok(cryptblk().args(["close", name]), b"");
    drop(served);

    // OpenSSL: AES-128-XTS keyed by sha256(passphrase), tweak = plain64 sector number.
    let key = openssl(&["dgst", "-sha256", "-binary"], PASSPHRASE);
    assert_eq!(key.len(), 32);
    let stored = std::fs::read(&img).unwrap();
    for sector in [0usize, 1, 77, 127] {
        let expected =
            aes128_xts_by_hand(&key, sector as u64, &data[sector * 512..(sector + 1) * 512]);
        assert!(
            stored[sector * 512..(sector + 1) * 512] == expected[..],
            "sector {sector} is not AES-128-XTS under sha256(passphrase)"
        );
    }
}

/// Naming cipher and key size silences the cipher warning; a key file silences the hash
/// warning (no hashing), as in cryptsetup 2.8; everything named: no warning at all.
#[test]
fn plain_warnings_go_when_the_options_are_named() {
    let dir = tempdir();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 1 << 20);
    let key = write_file(dir.path(), "key", &[0x5a; 32]);
    let key = key.to_str().unwrap();
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["-c", "aes-xts-plain64", "-s", "256", "-h", "sha256"],
            &[],
        ),
        (&["-c", "aes-xts-plain64", "-s", "256", "--key-file", key], &[]),
        (
            &["-h", "sha256", "-c", "aes-cbc-essiv:sha256"],
            &[
                "WARNING: Using default options for cipher (aes-cbc-essiv:sha256, key size 256 bits) that could be incompatible with older versions.",
                WARN_ALWAYS,
            ],
        ),
        (
            &["-c", "aes-xts-plain64", "-s", "512"],
            &[WARN_HASH, WARN_ALWAYS],
        ),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let name = format!("t-plain28-w{i}");
        let sock = dir.path().join(format!("w{i}.sock"));
        let err = open_plain(&img, &name, &sock, extra, PASSPHRASE);
        let _served = Served::volume(name.clone());
        assert_eq!(warnings(&err), *want, "{extra:?}: {err}");
    }
}

/// nice value of each thread of `pid`, by thread name.
fn thread_nice(pid: u64) -> Vec<(String, i64)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(t.join("comm")),
            std::fs::read_to_string(t.join("stat")),
        ) else {
            continue;
        };
        // Fields after the parenthesised name start at field 3 (state); nice is field 19.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i64 = rest.split(' ').nth(16).unwrap().parse().unwrap();
        v.push((comm.trim().to_string(), nice));
    }
    v
}

#[test]
fn perf_high_priority_is_in_the_table_status_and_thread_priority() {
    require_root("raising thread priority needs CAP_SYS_NICE");
    let dir = tempdir();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 1 << 20);
    let key = write_file(dir.path(), "key", &[0x33; 32]);
    let key = key.to_str().unwrap();
    let name = "t-perf-high-prio";
    let sock = dir.path().join("h.sock");
    let plain = ["-c", "aes-xts-plain64", "-s", "256", "--key-file", key];
    let mut extra = plain.to_vec();
    extra.push("--perf-high_priority");
    open_plain(&img, name, &sock, &extra, b"");
    let served = Served::volume(name);
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert!(
        text.lines().any(|l| l == "  flags:   high_priority"),
        "cryptsetup 2.8's flags line: {text}"
    );
    let table = status(name)["table"].as_str().unwrap().to_string();
    assert!(table.trim_end().ends_with(" 1 high_priority"), "{table}");
    let ls: serde_json::Value =
        serde_json::from_str(&run_ok(cryptblk().args(["ls", "--json"]), b"")).unwrap();
    let pid = ls["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .and_then(|v| v["pid"].as_u64())
        .expect("the daemon's pid in ls --json");
    let threads = thread_nice(pid);
    let writer: Vec<_> = threads
        .iter()
        .filter(|(n, _)| n == "dmcrypt_write")
        .collect();
    assert!(!writer.is_empty(), "no dmcrypt_write thread: {threads:?}");
    assert!(writer.iter().all(|(_, nice)| *nice == -20), "{threads:?}");
    assert!(
        threads
            .iter()
            .filter(|(n, _)| n.starts_with("kcryptd"))
            .all(|(_, nice)| *nice == -20),
        "{threads:?}"
    );
    run_ok(cryptblk().args(["close", name]), b"");
    drop(served);

    // Without the flag: no high_priority, the threads at the daemon's own priority.
    open_plain(&img, name, &sock, &plain, b"");
    let served = Served::volume(name);
    let text = run_ok(cryptblk().args(["status", name]), b"");
    assert!(!text.contains("high_priority"), "{text}");
    drop(served);
}
