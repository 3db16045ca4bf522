//! The `cryptblk` command: a thin layer that parses arguments and calls the library crates.

mod actions;
mod args;
mod control;
mod exit;
mod serve;

use args::Action;
use clap::Parser;
use exit::{ActionResult, ExitCode, Failure};

fn main() {
    // The daemon reads its spec from stdin and must not parse user options.
    if std::env::args().nth(1).as_deref() == Some("__serve") {
        std::process::exit(serve::daemon_main());
    }
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

fn run(cli: args::Cli) -> ActionResult {
    let json = cli.opts.json;
    match &cli.action {
        Action::Dm(a) => actions::serving::dm(a, json),
        Action::Close { name } => actions::serving::close(name),
        Action::Status { name } => actions::serving::status(name, json),
        Action::Refresh { name, perf } => actions::serving::refresh(name, perf),
        Action::Serve => Err(Failure::usage("__serve is internal")),
        other => Err(Failure::usage(format!("action {other:?} is not available in this build yet"))),
    }
}
