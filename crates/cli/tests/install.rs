//! scripts/install.sh into a DESTDIR: the binary, the generated man pages (rendered by the
//! real man-db), the bash completion (loaded by a real bash) and the zsh/fish completions land
//! where those tools look; and `--version` names the optional features built in.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{run, run_ok};

/// Each external command gets this long (seconds) before `timeout` ends it.
const LIMIT: &str = "120";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn timed(program: &str) -> Command {
    let mut c = Command::new("timeout");
    c.args([LIMIT, program]);
    c
}

/// Installs the debug binary under test (no release build) with `--prefix /usr`.
fn install(destdir: &Path) -> String {
    run_ok(
        timed("bash")
            .arg(repo_root().join("scripts/install.sh"))
            .args(["--prefix", "/usr", "--destdir"])
            .arg(destdir)
            .arg("--binary")
            .arg(env!("CARGO_BIN_EXE_cryptblk")),
        b"",
    )
}

#[test]
fn install_puts_binary_man_pages_and_completions_in_place() {
    let dir = common::tempdir();
    let dest = dir.path().join("root");
    let listing = install(&dest);
    let usr = dest.join("usr");
    for file in [
        "bin/cryptblk",
        "share/man/man8/cryptblk.8",
        "share/man/man8/cryptblk-luksFormat.8",
        "share/man/man8/cryptblk-open.8",
        "share/man/man8/cryptblk-close.8",
        "share/bash-completion/completions/cryptblk",
        "share/zsh/site-functions/_cryptblk",
        "share/fish/vendor_completions.d/cryptblk.fish",
    ] {
        let p = usr.join(file);
        assert!(
            p.is_file(),
            "{} missing; installed:\n{listing}",
            p.display()
        );
        assert!(
            listing.contains(&p.display().to_string()),
            "{file} not listed"
        );
    }
    assert!(
        !listing.contains("__serve"),
        "internal action documented: {listing}"
    );
    let installed = run_ok(Command::new(usr.join("bin/cryptblk")).arg("--version"), b"");
    assert!(installed.starts_with("cryptblk 0."), "{installed}");
}

#[test]
fn installed_luks_format_page_renders_with_man() {
    let dir = common::tempdir();
    let dest = dir.path().join("root");
    install(&dest);
    let page = dest.join("usr/share/man/man8/cryptblk-luksFormat.8");
    let out = run(
        timed("man")
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .arg("-l")
            .arg(&page),
        b"",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "man -l failed: {err}");
    // groff's warnings (bad requests, unknown macros) would mean broken roff.
    assert!(!err.contains("warning"), "{err}");
    for want in [
        "cryptblk-luksFormat",
        "Initialise a LUKS volume",
        "--key-file",
        "SYNOPSIS",
    ] {
        assert!(text.contains(want), "{want} not in the page:\n{text}");
    }
    // The top page lists the actions.
    let top = run_ok(
        timed("man")
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .arg("-l")
            .arg(dest.join("usr/share/man/man8/cryptblk.8")),
        b"",
    );
    assert!(
        top.contains("luksFormat") && top.contains("reencrypt"),
        "{top}"
    );
}

/// Runs the installed bash completion on `words` (the last is the one being completed)
/// and returns the candidates.
fn bash_complete(completion: &Path, words: &[&str]) -> Vec<String> {
    let script = r#"set -e
source "$1"
complete -p cryptblk
shift
COMP_WORDS=("$@")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
func=$(complete -p cryptblk | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
"$func" cryptblk "${COMP_WORDS[$COMP_CWORD]}" "${COMP_WORDS[$COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let out = run_ok(
        timed("bash")
            .args(["--norc", "--noprofile", "-c", script, "complete-test"])
            .arg(completion)
            .args(words),
        b"",
    );
    let mut lines = out.lines();
    let spec = lines.next().unwrap_or_default();
    assert!(
        spec.starts_with("complete ") && spec.ends_with(" cryptblk"),
        "complete -p: {spec}"
    );
    lines.map(|l| l.trim().to_string()).collect()
}

#[test]
fn bash_completion_completes_actions_and_options() {
    let dir = common::tempdir();
    let dest = dir.path().join("root");
    install(&dest);
    let completion = dest.join("usr/share/bash-completion/completions/cryptblk");

    let actions = bash_complete(&completion, &["cryptblk", "luksF"]);
    assert_eq!(actions, ["luksFormat"], "after 'luksF'");
    let all = bash_complete(&completion, &["cryptblk", ""]);
    for want in ["luksFormat", "open", "close", "reencrypt", "status"] {
        assert!(all.iter().any(|a| a == want), "{want} not in {all:?}");
    }
    assert!(!all.iter().any(|a| a.starts_with("__")), "{all:?}");

    let options = bash_complete(&completion, &["cryptblk", "luksFormat", "--key-f"]);
    assert_eq!(options, ["--key-file"], "after 'luksFormat --key-f'");
    let options = bash_complete(&completion, &["cryptblk", "open", "--"]);
    for want in ["--key-file", "--type", "--nbd"] {
        assert!(
            options.iter().any(|o| o == want),
            "{want} not in {options:?}"
        );
    }
}

/// `--version` names the optional features this binary was built with (integration tests
/// are built with the package's features, so `cfg!` here says what the binary has).
#[test]
fn version_names_the_features_built_in() {
    let out = run_ok(common::cryptblk().arg("--version"), b"");
    let sign = |on: bool| if on { '+' } else { '-' };
    let want = format!(
        "cryptblk {} ({}rbd {}tpm2 {}blkid){}",
        env!("CARGO_PKG_VERSION"),
        sign(cfg!(feature = "rbd")),
        sign(cfg!(feature = "tpm2")),
        sign(cfg!(feature = "blkid")),
        if cfg!(feature = "blkid") {
            " flags: BLKID KEYRING"
        } else {
            " flags: KEYRING"
        }
    );
    assert_eq!(out.trim(), want);
}
