//! Runs `cryptblk bench` without the CLI crate (same options, hand-parsed), e.g.
//! `cargo run --release -p cryptblk-bench --example bench -- --quick --json r.json`.

use std::path::PathBuf;
use std::time::Duration;

use cryptblk_bench::{run, BenchOptions};

fn usage() -> ! {
    eprintln!(
        "usage: bench [--quick] [--runtime SECS] [--repeats N] [--config NAME]... [--workload NAME]...\n\
         \x20            [--transport inproc|nbd|loop]... [--peers] [--live SECS] [--live-transport T]\n\
         \x20            [--json FILE] [--svg FILE] [--markdown FILE] [--region MIB] [--device-size MIB]\n\
         \x20            [--fio-verify on|off] [--no-progress]"
    );
    std::process::exit(2)
}

fn main() {
    let mut o = BenchOptions::default();
    let mut args = std::env::args().skip(1);
    let secs = |v: Option<String>| {
        Duration::from_secs_f64(v.and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()))
    };
    let mib = |v: Option<String>| {
        v.and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| usage())
            << 20
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--runtime" => o.runtime = Some(secs(args.next())),
            "--repeats" => {
                o.repeats = Some(
                    args.next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| usage()),
                )
            }
            "--config" => o.configs.push(args.next().unwrap_or_else(|| usage())),
            "--workload" => o.workloads.push(args.next().unwrap_or_else(|| usage())),
            "--transport" => o.transports.push(args.next().unwrap_or_else(|| usage())),
            "--peers" => o.peers = true,
            "--live" => o.live = Some(secs(args.next())),
            "--live-transport" => o.live_transport = Some(args.next().unwrap_or_else(|| usage())),
            "--json" => o.json = Some(PathBuf::from(args.next().unwrap_or_else(|| usage()))),
            "--svg" => o.svg = Some(PathBuf::from(args.next().unwrap_or_else(|| usage()))),
            "--markdown" => {
                o.markdown = Some(PathBuf::from(args.next().unwrap_or_else(|| usage())))
            }
            "--region" => o.region = Some(mib(args.next())),
            "--device-size" => o.device_size = Some(mib(args.next())),
            "--fio-verify" => o.fio_verify = Some(args.next().as_deref() == Some("on")),
            "--no-progress" => o.progress = Some(false),
            _ => usage(),
        }
    }
    match run(&o) {
        Ok(report) => {
            print!("{}", report.render_table());
            if !report.failures().is_empty() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(1);
        }
    }
}
