//! scripts/install.sh with the generator: whatever `--prefix` it is given, the units the
//! installed `cryptblk-generator` writes run the cryptblk binary installed with it (not the
//! compiled-in /usr/bin/cryptblk), and the udev rule lands where udev reads rules.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` (120 s at most, then killed and failed).
fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    out
}

fn generator() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cryptblk-generator"))
}

/// The workspace's cryptblk binary, built beside the generator.
fn cryptblk() -> PathBuf {
    let p = generator().parent().unwrap().join("cryptblk");
    assert!(p.is_file(), "{} is built with the workspace", p.display());
    p
}

/// Installs into `destdir` with `prefix`, runs the installed generator on a one-line
/// crypttab and returns (installed listing, the generated unit).
fn install_and_generate(destdir: &Path, prefix: &str) -> (String, String) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = run(Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .args(["--prefix", prefix, "--destdir"])
        .arg(destdir)
        .arg("--binary")
        .arg(cryptblk())
        .arg("--generator")
        .arg(generator()));
    let listing = String::from_utf8(out.stdout).unwrap();
    let tab = destdir.join("crypttab");
    std::fs::write(
        &tab,
        "data /dev/sdb /etc/cryptblk/data.key luks,x-cryptblk.export=ublk\n",
    )
    .unwrap();
    let gen_dir = destdir.join("gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    let installed = destdir.join(prefix.trim_start_matches('/'));
    run(
        Command::new(installed.join("lib/systemd/system-generators/cryptblk-generator"))
            .arg(&gen_dir)
            .env("SYSTEMD_CRYPTTAB", &tab)
            .env_remove("CRYPTBLK_BIN"),
    );
    let unit = std::fs::read_to_string(gen_dir.join("cryptblk@data.service")).unwrap();
    (listing, unit)
}

#[test]
fn installed_generator_runs_the_binary_installed_with_it() {
    for prefix in ["/usr/local", "/usr", "/opt/cryptblk"] {
        let dir = tempfile::tempdir().unwrap();
        let (listing, unit) = install_and_generate(dir.path(), prefix);
        let root = dir.path().join(prefix.trim_start_matches('/'));
        let bin = root.join("bin/cryptblk");
        for f in [
            bin.clone(),
            root.join("lib/systemd/system-generators/cryptblk-generator"),
            root.join("lib/udev/rules.d/60-cryptblk.rules"),
        ] {
            assert!(f.is_file(), "{prefix}: {} missing:\n{listing}", f.display());
            assert!(listing.contains(&f.display().to_string()), "{listing}");
        }
        let bin = bin.display().to_string();
        assert!(
            unit.contains(&format!("\nExecStart={bin} open "))
                && unit.contains(&format!("\nExecStop={bin} close data\n")),
            "--prefix {prefix}: the unit does not run {bin}:\n{unit}"
        );
    }
}

#[test]
fn a_generator_outside_an_installation_keeps_the_compiled_in_binary() {
    // The build tree's generator has no lib/systemd/system-generators parent.
    assert_eq!(cryptblk_systemd::unit::cryptblk_beside(&generator()), None);
    let dir = tempfile::tempdir().unwrap();
    let gens = dir.path().join("usr/lib/systemd/system-generators");
    std::fs::create_dir_all(&gens).unwrap();
    // No bin/cryptblk beside it: nothing to take.
    assert_eq!(
        cryptblk_systemd::unit::cryptblk_beside(&gens.join("cryptblk-generator")),
        None
    );
    std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
    std::fs::write(dir.path().join("usr/bin/cryptblk"), "").unwrap();
    assert_eq!(
        cryptblk_systemd::unit::cryptblk_beside(&gens.join("cryptblk-generator")),
        Some(dir.path().join("usr/bin/cryptblk").display().to_string())
    );
}
