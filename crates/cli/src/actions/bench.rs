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
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    let o = BenchOptions {
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
        ..BenchOptions::default()
    };
    let report = cryptblk_bench::run(&o).map_err(|e| Failure::usage(e.to_string()))?;
    if opts.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render_table());
    }
    let failed = report.failures();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            ExitCode::WrongParameters,
            format!("{} benchmark run(s) failed; see the table", failed.len()),
        ))
    }
}
