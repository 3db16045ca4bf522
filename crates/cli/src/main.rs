//! The `cryptblk` command: a thin layer that parses arguments and calls the library crates.

mod actions;
mod args;
mod args_check;
mod daemon;
mod docs;
mod exit;
mod features;
mod logger;
mod progress;
mod usage;

use args::Action;
use clap::Parser;
use exit::{ActionResult, ExitCode, Failure};

fn main() {
    // The daemon reads its spec from stdin and must not parse user options.
    if std::env::args().nth(1).as_deref() == Some("__serve") {
        std::process::exit(daemon::daemon_main());
    }
    // Hidden, for scripts/install.sh and the Debian package: man pages and completions.
    if std::env::args().nth(1).as_deref() == Some("__generate-docs") {
        let args: Vec<String> = std::env::args().skip(2).collect();
        std::process::exit(docs::main(&args));
    }
    quiet_on_closed_stdout();
    // cryptsetup's `--usage` answers wherever it stands, before any other check.
    if usage::asked(&std::env::args().skip(1).collect::<Vec<_>>()) {
        let argv0 = std::env::args().next().unwrap_or_default();
        let program = std::path::Path::new(&argv0)
            .file_name()
            .map_or("cryptblk".into(), |n| n.to_string_lossy().into_owned());
        eprint!("{}", usage::text(&program));
        return;
    }
    // tpm2-tss prints its own warnings and errors to stderr; cryptblk reports a TPM failure in
    // one line of its own. Set here, before any thread exists (TSS2_LOG=... overrides).
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+NONE");
    }
    // `bench` first: its own grammar, so its help lists only its options.
    let parsed = if std::env::args().nth(1).as_deref() == Some("bench") {
        args::BenchCli::try_parse_from(std::env::args().skip(1)).map(args::BenchCli::into_cli)
    } else {
        match args_check::check(std::env::args_os().collect()) {
            Ok(checked) => args::Cli::try_parse_from(checked.argv),
            Err(message) => {
                eprintln!("{message}");
                std::process::exit(ExitCode::WrongParameters as i32);
            }
        }
    };
    let mut cli = match parsed {
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
    logger::install(logger::Process::Command {
        debug: cli.opts.debug,
    });
    if let Err(m) = cli.one_key_file() {
        eprintln!("{m}");
        std::process::exit(ExitCode::WrongParameters as i32);
    }
    if cli.opts.compat.test_args {
        println!("No action taken. Invoked with --test-args option.");
        return;
    }
    let verbose = cli.opts.verbose;
    let result = run(cli);
    if verbose && result.is_ok() {
        verbose_verdict(&result);
    }
    if let Err(f) = result {
        if stdout_reader_gone() {
            // The data went to a reader that stopped reading (`decrypt vol - | head -c 100`):
            // end as `cat` does there, killed by SIGPIPE and silent, so a pipeline with
            // `pipefail` still sees that the stream was cut short.
            die_of_sigpipe();
        }
        if !f.message.is_empty() {
            // stderr may be the same closed pipe (`2>&1 | head`): never panic reporting.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{}", f.message);
        }
        if verbose {
            let code = f.code;
            verbose_verdict(&Err(f));
            std::process::exit(code as i32);
        }
        std::process::exit(f.code as i32);
    }
}

/// cryptsetup's last line under `-v`, on standard output: "Command successful." or "Command
/// failed with code -N (what N means)." (N its exit code). Scripts and expect checks wait
/// for it.
fn verbose_verdict(result: &ActionResult) {
    use std::io::Write;
    let line = match result {
        Ok(()) => "Command successful.".to_string(),
        Err(f) => format!(
            "Command failed with code -{} ({}).",
            f.code as i32,
            match f.code {
                ExitCode::WrongParameters => "wrong or missing parameters",
                ExitCode::NoPermission => "no permission or bad passphrase",
                ExitCode::OutOfMemory => "out of memory",
                ExitCode::WrongDevice => "wrong device or file specified",
                ExitCode::Busy => "device already exists or device is busy",
            }
        ),
    };
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// True when standard output is a pipe or socket whose reader has closed it (the kernel
/// reports `POLLERR` on the write end of such a pipe).
fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & libc::POLLERR != 0
}

/// Ends the process by the default action of SIGPIPE, which Rust's runtime ignores.
fn die_of_sigpipe() -> ! {
    // SAFETY: restoring a signal's default disposition and raising it has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// A reader that stops early (`cryptblk status | head -1`) closes stdout, and Rust ignores
/// SIGPIPE, so the next `println!` panics on EPIPE. Such a run did all it was asked for that
/// anyone reads: end quietly with status 0, as `head`-fed tools do, instead of a panic
/// message. The daemon (`__serve`) never prints to stdout and keeps the default hook.
fn quiet_on_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
}

fn run(cli: args::Cli) -> ActionResult {
    use actions::{info, luks, offline, serving};
    let o = &cli.opts;
    let json = o.json;
    if let Some(secs) = o.token.token_timeout {
        cryptblk_volume::token::clevis::tang::set_timeout(std::time::Duration::from_secs(secs));
    }
    if let Some(option) = o.compat.unsupported() {
        return Err(Failure::usage(format!(
            "Option {option} is not supported by cryptblk."
        )));
    }
    let sized = matches!(
        cli.action,
        Action::Open(_) | Action::LoopaesOpen(_) | Action::Reencrypt { .. }
    );
    if sized && o.compat.device_size.is_some() {
        return Err(Failure::usage(
            "Option --device-size is not supported by cryptblk.",
        ));
    }
    match &cli.action {
        Action::Open(a) if o.compat.refresh => {
            // cryptsetup's `open --refresh DEVICE NAME` (or `open --refresh NAME`).
            let name = a
                .name
                .clone()
                .unwrap_or_else(|| a.device.to_string_lossy().into_owned());
            luks::refresh(o, &name, &a.perf)
        }
        Action::LuksFormat { device, key_file } => {
            luks::luks_format(o, device, key_file.as_deref())
        }
        Action::Open(a) => actions::open::open(o, a),
        Action::LoopaesOpen(a) => actions::loopaes::open(o, a),
        Action::LuksDump { device } => luks::dump(o, device),
        Action::TcryptDump { device } => actions::tcrypt::dump(o, device),
        Action::BitlkDump { device } => actions::bitlk::dump(o, device),
        Action::Fvault2Dump { device } => actions::fvault2::dump(o, device),
        Action::LuksAddKey {
            device,
            new_key_file,
        } => luks::add_key(o, device, new_key_file.as_deref()),
        Action::LuksRemoveKey { device, key_file } => {
            luks::remove_key(o, device, key_file.as_deref())
        }
        Action::LuksChangeKey {
            device,
            new_key_file,
        } => luks::change_key(o, device, new_key_file.as_deref()),
        Action::LuksConvertKey { device, key_file } => {
            actions::lifecycle::convert_key(o, device, key_file.as_deref())
        }
        Action::LuksSuspend { name } => actions::lifecycle::suspend(name),
        Action::LuksResume { name } => actions::lifecycle::resume(o, name),
        Action::Resize { name } => {
            // args_check has refused a size it cannot read.
            let size = o
                .compat
                .device_size
                .as_deref()
                .and_then(args_check::parse_size);
            actions::lifecycle::resize(o, name, size)
        }
        Action::LuksKillSlot {
            device,
            slot,
            key_file,
        } => luks::kill_slot(o, device, *slot, key_file.as_deref()),
        Action::LuksHeaderBackup { device } => luks::header_backup(o, device),
        Action::LuksHeaderRestore { device } => luks::header_restore(o, device),
        Action::LuksUuid { device } => luks::uuid(o, device),
        Action::IsLuks { device } => luks::is_luks(o, device),
        Action::Erase { device } => luks::erase(o, device),
        Action::Config { device } => luks::config(o, device),
        Action::Convert { device } => luks::convert(o, device),
        Action::Repair { device } => luks::repair(o, device),
        Action::Reencrypt { device, args } => {
            actions::reencrypt::reencrypt_action(o, device.as_deref(), args)
        }
        Action::Benchmark => info::benchmark(o),
        Action::Ciphers => info::ciphers(o),
        Action::Encrypt { input, output } => offline::encrypt(o, input, output),
        Action::Decrypt { device, output } => offline::decrypt(o, device, output),
        Action::Dm(a) => serving::dm(a, json),
        Action::Bench(a) => actions::bench::bench(o, a),
        Action::Verity(a) => actions::verity::verity(o, a),
        Action::Integrity(a) => actions::integrity::integrity(o, a),
        Action::Close {
            name,
            deferred,
            cancel_deferred,
        } => serving::close_with(
            name,
            serving::CloseMode::from_flags(*deferred, *cancel_deferred)?,
        ),
        Action::Upgrade { name, binary } => serving::upgrade(name, binary.as_deref()),
        Action::Status {
            name,
            format: Some(args::StatusFormat::Prometheus),
        } => actions::monitor::prometheus(name.as_deref()),
        Action::Status { name, format: None } => {
            serving::status(name.as_deref().unwrap_or_default(), json)
        }
        Action::Ls => actions::monitor::ls(json),
        Action::Metrics { listen } => actions::monitor::serve_http(listen),
        Action::Refresh { name, perf } => luks::refresh(o, name, perf),
        Action::Token { op, device } => actions::token::token(o, *op, device),
        Action::Enroll {
            pkcs11_token_uri: Some(uri),
            device,
            ..
        } => actions::token::enroll_pkcs11(o, uri, device),
        Action::Enroll {
            recovery_key: true,
            device,
            ..
        } => actions::token::enroll_recovery(o, device),
        Action::Enroll {
            tang: Some(tang),
            tang_thumbprint,
            device,
            ..
        } => actions::token::enroll_tang(o, tang, tang_thumbprint.as_deref(), device),
        Action::Enroll {
            tang: None,
            tpm2_pcrs,
            tpm2_with_pin,
            device,
            ..
        } => actions::token::enroll_tpm2(o, tpm2_pcrs.as_deref(), *tpm2_with_pin, device),
        Action::Serve => Err(Failure::usage("__serve is internal")),
    }
}
