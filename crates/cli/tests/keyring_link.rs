//! cryptsetup 2.7's `--link-vk-to-keyring KEYRING::KEY` and `--volume-key-keyring KEY`,
//! checked with keyutils' keyctl in a fresh session keyring per run (`keyctl session -`):
//! after `open --test-passphrase --link-vk-to-keyring` the named key is in the named keyring
//! with the named type (user or logon) and holds cryptsetup's volume key; a key placed by
//! keyctl opens the volume with `--volume-key-keyring` (no passphrase read), a wrong one is
//! refused; malformed values (compat-test2's list) are refused in one line, exit 1, before
//! any passphrase is read.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

const PASS: &[u8] = b"the passphrase";

/// `script` run by sh in a new session keyring, with $1 = cryptblk, $2 = the image.
fn in_session(script: &str, img: &Path, stdin: &[u8]) -> std::process::Output {
    run(
        tool("keyctl")
            .expect("keyctl")
            .args(["session", "-", "sh", "-c", script, "sh"])
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .arg(img),
        stdin,
    )
}

fn image(dir: &Path) -> Option<(std::path::PathBuf, String)> {
    let img = dir.join("v.img");
    let k = write_file(dir, "k", PASS);
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    let vk = cryptsetup_volume_key(&img, &k, &[])?;
    Some((img, vk))
}

#[test]
fn link_vk_to_keyring_puts_the_volume_key_there() {
    let dir = tempdir();
    let Some((img, vk)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    // A named keyring (%:NAME), a user key: keyctl finds it there and reads cryptsetup's key;
    // that key then opens the volume with --volume-key-keyring and no passphrase.
    let script = r#"set -e
keyctl newring cryptblk-ring @s >/dev/null
printf 'the passphrase' | "$1" open --test-passphrase "$2" --link-vk-to-keyring "%:cryptblk-ring::%user:cryptblk-vk"
id=$(keyctl search %:cryptblk-ring user cryptblk-vk)
echo "desc=$(keyctl rdescribe "$id")"
echo "key=$(keyctl pipe "$id" | od -An -v -tx1 | tr -d ' \n')"
"$1" open --test-passphrase -v --volume-key-keyring cryptblk-vk "$2" </dev/null && echo vkk-ok
"$1" open --test-passphrase -v --volume-key-keyring %user:cryptblk-vk "$2" </dev/null && echo vkk2-ok
# A special keyring and the default type.
printf 'the passphrase' | "$1" open --test-passphrase "$2" --link-vk-to-keyring "@s::cryptblk-vk2"
echo "s=$(keyctl search @s user cryptblk-vk2)"
# A logon key: the kernel has it, userspace cannot read it.
printf 'the passphrase' | "$1" open --test-passphrase "$2" --link-vk-to-keyring "@s::%logon:cryptblk:vk"
echo "logon=$(keyctl rdescribe "$(keyctl search @s logon cryptblk:vk)" | cut -d';' -f1)"
keyctl pipe "$(keyctl search @s logon cryptblk:vk)" >/dev/null 2>&1 || echo logon-unreadable
"#;
    let out = in_session(script, &img, b"");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    assert!(text.contains("desc=user;"), "{text}");
    assert!(text.contains(";cryptblk-vk\n"), "{text}");
    assert!(text.contains(&format!("key={vk}\n")), "{text}");
    assert!(
        text.contains("vkk-ok") && text.contains("vkk2-ok"),
        "{text}{err}"
    );
    assert!(text.contains("s="), "{text}");
    assert!(text.contains("logon=logon\n"), "{text}");
    assert!(text.contains("logon-unreadable"), "{text}");
    // Without the option nothing is linked.
    let script =
        r#""$1" open --test-passphrase "$2" && keyctl search @s user cryptblk-vk2 || echo none"#;
    let out = in_session(script, &img, PASS);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("none"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn volume_key_keyring_checks_the_key() {
    let dir = tempdir();
    let Some((img, vk)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    // The right key placed by keyctl opens; a wrong one of the right size is refused;
    // a logon key is refused in one line (userspace cannot read it).
    let bytes: Vec<u8> = (0..vk.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&vk[i..i + 2], 16).unwrap())
        .collect();
    let vk_file = write_file(dir.path(), "vk", &bytes);
    let script = format!(
        r#"keyctl padd user good @s <"{vkf}" >/dev/null
head -c {n} /dev/zero | keyctl padd user bad @s >/dev/null
"$1" open --test-passphrase --volume-key-keyring good "$2" </dev/null; echo "good=$?"
"$1" open --test-passphrase --volume-key-keyring bad "$2" </dev/null; echo "bad=$?"
"$1" open --test-passphrase --volume-key-keyring missing "$2" </dev/null; echo "missing=$?"
"$1" open --test-passphrase --volume-key-keyring %logon:x:y "$2" </dev/null; echo "logon=$?"
"#,
        n = bytes.len(),
        vkf = vk_file.display()
    );
    let out = in_session(&script, &img, b"");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("good=0"), "{text}{err}");
    assert!(
        text.contains("bad=1") || text.contains("bad=2"),
        "{text}{err}"
    );
    assert!(!text.contains("missing=0"), "{text}{err}");
    assert!(text.contains("logon=1"), "{text}{err}");
}

#[test]
fn malformed_link_values_are_refused_up_front() {
    let dir = tempdir();
    let Some((img, _)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    for bad in [
        "%cryptblk-ring::",
        ":cryptblk-ring::k",
        "@uuu::k",
        "@usu::k",
        "cryptblk-ring::%user",
        "cryptblk-ring::%user:",
        "%user:k",
        "@t::%0:k",
        "@t::%blah:k",
        "@t::%userlogon:k",
    ] {
        // Standard input is a terminal nowhere here: a passphrase read would consume it and
        // open; the refusal must come first.
        let out = run(
            Command::new(env!("CARGO_BIN_EXE_cryptblk"))
                .args(["open", "--test-passphrase", "--link-vk-to-keyring", bad])
                .arg(&img),
            PASS,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(exit_code(&out), 1, "{bad}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{bad}: {err}");
        assert!(err.contains("--link-vk-to-keyring"), "{bad}: {err}");
    }
}

#[test]
fn open_and_resume_link_the_volume_key() {
    let dir = tempdir();
    let Some((img, vk)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let k = dir.path().join("k");
    let sock = dir.path().join("nbd.sock");
    let name = "t-vklink";
    // Closed on drop, whatever happens below.
    let _served = Served::volume(name);
    let script = r#"set -e
"$1" open --key-file "$3" "$2" t-vklink --nbd "$4" --link-vk-to-keyring "@s::%user:cryptblk-open"
echo "open=$(keyctl pipe %user:cryptblk-open | od -An -v -tx1 | tr -d ' \n')"
"$1" luksSuspend t-vklink
"$1" luksResume t-vklink --key-file "$3" --link-vk-to-keyring "@s::%user:cryptblk-resume"
echo "resume=$(keyctl pipe %user:cryptblk-resume | od -An -v -tx1 | tr -d ' \n')"
"#;
    let out = run(
        tool("keyctl")
            .expect("keyctl")
            .env("CRYPTBLK_RUNTIME_DIR", runtime_dir())
            .args(["session", "-", "sh", "-c", script, "sh"])
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .arg(&img)
            .arg(&k)
            .arg(&sock),
        b"",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    assert!(text.contains(&format!("open={vk}\n")), "{text}");
    assert!(text.contains(&format!("resume={vk}\n")), "{text}");
    assert_ne!(status(name)["suspended"], true);
}
