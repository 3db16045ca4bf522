//! The `cryptblk` command: a thin layer that parses arguments and calls the library crates.

mod args;
mod exit;

use clap::Parser;
use exit::{ExitCode, Failure};

fn main() {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                _ => ExitCode::WrongParameters as i32,
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    if let Err(f) = run(cli) {
        eprintln!("{}", f.message);
        std::process::exit(f.code as i32);
    }
}

fn run(cli: args::Cli) -> exit::ActionResult {
    Err(Failure::usage(format!(
        "action {:?} is not available in this build",
        cli.action
    )))
}
