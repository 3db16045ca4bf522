//! `bench`: the benchmark of the reference experiments, printed as a table and written as
//! JSON, SVG and markdown on request.

use crate::args::{BenchArgs, Opts};
use crate::exit::{ActionResult, ExitCode, Failure};
use cryptblk_bench::BenchOptions;
use std::time::Duration;

/// Runs the benchmark; exit 1 when any run failed (its row says why).
pub fn bench(opts: &Opts, a: &BenchArgs) -> ActionResult {
    let device_size = a
        .device_size
        .as_deref()
        .map(|s| cryptblk_dm::parse_size(s).map_err(|e| Failure::usage(e.to_string())))
        .transpose()?;
    if a.integrity_report {
        return integrity_report(opts, a, device_size);
    }
    if a.transports
        .iter()
        .any(|t| cryptblk_bench::lab::is_lab_transport(t))
    {
        return lab_bench(opts, a, device_size);
    }
    if let Some(modes) = &a.reencrypt {
        return reencrypt_report(opts, a, modes, device_size);
    }
    let report = cryptblk_bench::run(&bench_options(a, device_size))
        .map_err(|e| Failure::usage(e.to_string()))?;
    print_report(
        opts,
        || report.to_json(),
        || report.render_table(),
        report.failures().len(),
    )
}

/// The options of a dm-crypt matrix run (on the host or in the lab) from the arguments.
fn bench_options(a: &BenchArgs, device_size: Option<u64>) -> BenchOptions {
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    BenchOptions {
        quick: a.quick,
        runtime: a.runtime.map(secs),
        repeats: a.repeats,
        configs: a.configs.clone(),
        workloads: a.workloads.clone(),
        transports: a.transports.clone(),
        device_size,
        peers: a.peers,
        live: a.live.map(secs),
        json: a.json_file.clone(),
        svg: a.svg.clone(),
        markdown: a.markdown.clone(),
        cpus: a.cpus.clone(),
        ..BenchOptions::default()
    }
}

/// Prints a report (its JSON with `--json`, else its table); exit 1 when any of its runs
/// failed (the table says why).
fn print_report(
    opts: &Opts,
    json: impl FnOnce() -> String,
    table: impl FnOnce() -> String,
    failed: usize,
) -> ActionResult {
    if opts.json {
        println!("{}", json());
    } else {
        print!("{}", table());
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(Failure::new(
            ExitCode::WrongParameters,
            format!("{failed} benchmark run(s) failed; see the table"),
        ))
    }
}

/// `bench --transport ublk|vhost-user`: the same rows, measured in the kernel lab VM beside
/// the guest kernel's dm-crypt, with the ratios (and the emulated-CPU caveat).
fn lab_bench(opts: &Opts, a: &BenchArgs, device_size: Option<u64>) -> ActionResult {
    let o = bench_options(a, device_size);
    let lab = cryptblk_bench::lab::LabOptions {
        lab_dir: None,
        cryptblk: std::env::current_exe()
            .map_err(|e| Failure::usage(format!("cannot find the cryptblk binary: {e}")))?,
    };
    let report = cryptblk_bench::lab::run(&o, &lab).map_err(|e| Failure::usage(e.to_string()))?;
    print_report(
        opts,
        || report.to_json(),
        || report.render_table(),
        report.failures().len(),
    )
}

/// `bench --integrity-report`: the dm-integrity/dm-verity overhead table (markdown on
/// stdout, or JSON), written to --markdown / --json-file when given.
fn integrity_report(opts: &Opts, a: &BenchArgs, device_size: Option<u64>) -> ActionResult {
    use cryptblk_bench::integrity::{self, IntegrityBenchOptions};
    if a.peers || a.live.is_some() {
        return Err(Failure::usage(
            "--integrity-report takes neither --peers nor --live",
        ));
    }
    let transports =
        integrity::select_transports(&a.transports).map_err(|e| Failure::usage(e.to_string()))?;
    let mut o = IntegrityBenchOptions {
        configs: a.configs.clone(),
        workloads: a.workloads.clone(),
        transports,
        ..IntegrityBenchOptions::default()
    };
    if let Some(r) = a.runtime {
        o.runtime = Duration::from_secs_f64(r.max(0.01));
    }
    if let Some(r) = a.repeats {
        o.repeats = r.max(1);
    }
    if let Some(d) = device_size {
        o.device_size = d;
        o.region = o.region.min(d / 4 / 4096 * 4096);
    }
    if a.quick {
        o.runtime = Duration::from_millis(200);
        o.repeats = 1;
        o.device_size = o.device_size.min(128 << 20);
        o.region = o.region.min(32 << 20);
    }
    let report = integrity::run(&o).map_err(|e| Failure::usage(e.to_string()))?;
    let mut md = report.render_markdown();
    md.push('\n');
    md.push_str(&format!(
        "load average {:.2} at the start, {:.2} at the end\n\n",
        report.load_avg.0, report.load_avg.1
    ));
    md.push_str(&report.render_aims());
    for (name, why) in &report.skipped {
        md.push_str(&format!("\n{name} skipped: {why}\n"));
    }
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    if let Some(p) = &a.markdown {
        std::fs::write(p, &md)?;
    }
    if let Some(p) = &a.json_file {
        std::fs::write(p, &json)?;
    }
    if opts.json {
        println!("{json}");
    } else {
        print!("{md}");
    }
    Ok(())
}

/// `bench --reencrypt`: offline re-key throughput against cryptsetup's (table on stdout, or
/// JSON), written to --json-file / --markdown when given.
fn reencrypt_report(
    opts: &Opts,
    a: &BenchArgs,
    modes: &[String],
    device_size: Option<u64>,
) -> ActionResult {
    use cryptblk_bench::reencrypt::{self, ReencryptBenchOptions};
    if a.peers || a.live.is_some() || a.integrity_report {
        return Err(Failure::usage(
            "--reencrypt takes neither --peers, --live nor --integrity-report",
        ));
    }
    let mut o = ReencryptBenchOptions {
        cryptblk: std::env::current_exe()?,
        ..ReencryptBenchOptions::default()
    };
    if !modes.is_empty() {
        o.resiliences = modes.to_vec();
    }
    if let Some(r) = a.repeats {
        o.repeats = r.max(1);
    }
    if a.quick {
        o.repeats = 1;
        o.size = 128 << 20;
    }
    if let Some(d) = device_size {
        o.size = d;
    }
    let report = reencrypt::run(&o).map_err(|e| Failure::usage(e.to_string()))?;
    let table = report.render_table();
    let json = report.to_json();
    if let Some(p) = &a.markdown {
        std::fs::write(p, format!("```\n{table}```\n"))?;
    }
    if let Some(p) = &a.json_file {
        std::fs::write(p, &json)?;
    }
    if opts.json {
        println!("{json}");
    } else {
        print!("{table}");
    }
    Ok(())
}
