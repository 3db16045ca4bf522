//! `cryptblk __generate-docs DIR`: the man pages and shell completions, generated from the
//! clap definitions in [`crate::args`] so they never drift from what the parser accepts.
//! A hidden action of the binary itself (not a build script) because it needs the CLI's own
//! types; `scripts/install.sh` and the Debian package run it.
//!
//! Writes `DIR/man8/cryptblk.8` and one page per action (`cryptblk-luksFormat.8`,
//! `cryptblk-dm-create.8`, ...), and `DIR/completions/{cryptblk.bash,_cryptblk,cryptblk.fish}`.

use std::path::Path;

use clap::{Command, CommandFactory};
use clap_complete::Shell;

use crate::args::Cli;

/// Man pages of system administration commands (cryptsetup's too) are in section 8.
const SECTION: &str = "8";

/// Generates everything under `dir`; returns what it wrote, one path a line.
pub fn generate(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    let mut cmd = Cli::command();
    // Propagates the global options and names each subcommand `cryptblk-<action>`.
    cmd.build();
    let man_dir = dir.join(format!("man{SECTION}"));
    std::fs::create_dir_all(&man_dir)?;
    man_pages(&cmd, &man_dir, &mut written)?;

    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = completion_command();
        let path = clap_complete::generate_to(shell, &mut cmd, "cryptblk", &completions)?;
        written.push(path);
    }
    Ok(written)
}

/// The command as completions offer it: clap_complete completes hidden subcommands too
/// (`__serve`), and clap cannot remove a subcommand, so this is a copy of the top level with
/// the same options and only the visible actions.
fn completion_command() -> Command {
    let full = Cli::command();
    Command::new("cryptblk")
        .version(crate::features::version())
        .disable_help_flag(true)
        .disable_help_subcommand(true)
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

/// The page of `cmd` and of each of its visible subcommands, recursively (internal ones such
/// as `__serve` are hidden and get none).
fn man_pages(
    cmd: &Command,
    dir: &Path,
    written: &mut Vec<std::path::PathBuf>,
) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, dir, written)?;
    }
    let page = clap_mangen::Man::new(cmd.clone())
        .section(SECTION)
        .manual("System Administration")
        .source(format!("cryptblk {}", crate::features::version()));
    written.push(page.generate_to(dir)?);
    Ok(())
}

/// Entry point of `cryptblk __generate-docs DIR`: exit status 0, or 1 with one error line.
pub fn main(args: &[String]) -> i32 {
    let [dir] = args else {
        eprintln!("usage: cryptblk __generate-docs DIR");
        return 1;
    };
    match generate(Path::new(dir)) {
        Ok(paths) => {
            // A reader that stops early (`| head`) is no error here.
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for p in paths {
                if writeln!(out, "{}", p.display()).is_err() {
                    break;
                }
            }
            0
        }
        Err(e) => {
            eprintln!("cannot write the documentation to {dir}: {e}");
            4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_for_actions_and_no_internal_ones() {
        let dir = tempfile::tempdir().unwrap();
        let written = generate(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "cryptblk.8",
            "cryptblk-luksFormat.8",
            "cryptblk-open.8",
            "cryptblk-close.8",
            "cryptblk-dm.8",
            "cryptblk.bash",
            "_cryptblk",
            "cryptblk.fish",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("__serve")), "{names:?}");
        for file in ["cryptblk.bash", "_cryptblk", "cryptblk.fish"] {
            let text = std::fs::read_to_string(dir.path().join("completions").join(file)).unwrap();
            assert!(
                !text.contains("__serve"),
                "{file} completes the internal action"
            );
            assert!(text.contains("luksFormat"), "{file} lacks luksFormat");
        }
    }
}
