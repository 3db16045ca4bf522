//! The experiment's result and how it is shown: the report (its serde field names are
//! the JSON format of `--json-file`), one markdown table per transport in the reference's
//! shape, and the aims next to the measured ratios.
//!
//! Invariants: a ratio is always against `plain` on the same transport; a missing figure is
//! shown, never guessed (`-` for MB/s, `N/A` for an overhead, `not run` for an aim);
//! configurations and workloads appear in the report's order (table order).

use serde::Serialize;

use super::bound::AeadBound;
use super::configs::IntegrityBenchConfig;
use crate::workload::Workload;

/// One cell: the median MB/s of a configuration under a workload.
#[derive(Clone, Debug, Serialize)]
pub struct IntegrityCell {
    /// Transport name (`inproc`, `nbd`).
    pub transport: String,
    /// Configuration name.
    pub config: String,
    /// Workload name.
    pub workload: String,
    /// Median MB/s (MB = 10^6 bytes).
    pub mb_s: f64,
    /// Every repeat's MB/s.
    pub samples: Vec<f64>,
    /// Median MB per second of the process's CPU time (in process only): what the aims
    /// compare, since a loaded machine barely moves it.
    pub cpu_mb_s: Option<f64>,
    /// Every repeat's MB per CPU second.
    pub cpu_samples: Vec<f64>,
}

/// The experiment's result.
#[derive(Clone, Debug, Serialize)]
pub struct IntegrityReport {
    /// Configurations that ran, in table order.
    pub configs: Vec<IntegrityBenchConfig>,
    /// Their tables (keys masked), per configuration.
    pub tables: Vec<(String, Vec<String>)>,
    /// Configurations that could not be loaded, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Workloads, in row order.
    pub workloads: Vec<Workload>,
    /// Median figures.
    pub cells: Vec<IntegrityCell>,
    /// Seconds per run.
    pub runtime_s: f64,
    /// Repeats per cell.
    pub repeats: u32,
    /// Region covered by the workloads, bytes.
    pub region: u64,
    /// Transports, in table order, with what each one is.
    pub transports: Vec<(String, String)>,
    /// 1-minute load average at the start and at the end.
    pub load_avg: (f64, f64),
    /// The bound of the authenticated configuration, measured in the same run (when it
    /// ran).
    pub bound: Option<AeadBound>,
}

/// The aims: (configuration, workloads, minimum ratio to plain).
pub const AIMS: [(&str, &[&str], f64); 4] = [
    ("int-crc32c-j", &["write", "randwrite"], 0.45),
    ("int-crc32c-b", &["write", "randwrite"], 0.8),
    ("verity", &["read", "randread"], 0.9),
    ("verity-once", &["read", "randread"], 0.9),
];

/// The authenticated configuration's aim: (configuration, minimum ratio to the bound one
/// pass of HMAC-SHA256 plus AES-XTS allows, [`AeadBound`]), for every workload.
pub const BOUND_AIM: (&str, f64) = ("crypt-int-hmac-sha256", 0.7);

impl IntegrityReport {
    /// Median MB/s of `config` under `workload` over `transport`.
    pub fn mb_s(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.transport == transport && c.config == config && c.workload == workload)
            .map(|c| c.mb_s)
    }

    /// Median MB per CPU second of `config` under `workload` over `transport`.
    pub fn cpu_mb_s(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.transport == transport && c.config == config && c.workload == workload)
            .and_then(|c| c.cpu_mb_s)
    }

    /// The figure the aims compare: MB per CPU second where measured, else MB/s.
    fn aim_figure(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        self.cpu_mb_s(transport, config, workload)
            .or_else(|| self.mb_s(transport, config, workload))
    }

    /// `config`'s aim figure over plain's for `workload` on the same transport.
    fn aim_ratio(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        let p = self.aim_figure(transport, "plain", workload)?;
        let c = self.aim_figure(transport, config, workload)?;
        (p > 0.0).then_some(c / p)
    }

    /// `config`'s figure over plain's for `workload` on the same transport.
    pub fn ratio(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        let p = self.mb_s(transport, "plain", workload)?;
        let c = self.mb_s(transport, config, workload)?;
        (p > 0.0).then_some(c / p)
    }

    /// The reference's table for one transport: one row per workload, per configuration
    /// its MB/s and (except plain) its overhead against plain in percent.
    pub fn render_table(&self, transport: &str) -> String {
        self.table_of(transport, "MB/s", |t, c, w| self.mb_s(t, c, w))
    }

    /// The same table in MB per CPU second (empty when none was measured).
    pub fn render_cpu_table(&self, transport: &str) -> String {
        if !self
            .cells
            .iter()
            .any(|c| c.transport == transport && c.cpu_mb_s.is_some())
        {
            return String::new();
        }
        self.table_of(transport, "MB/CPU-s", |t, c, w| self.cpu_mb_s(t, c, w))
    }

    fn table_of(
        &self,
        transport: &str,
        unit: &str,
        figure: impl Fn(&str, &str, &str) -> Option<f64>,
    ) -> String {
        let mut head = String::from("| |");
        let mut rule = String::from("|---|");
        for c in &self.configs {
            head.push_str(&format!(" {} |", c.heading));
            rule.push_str("---:|");
            if c.name != "plain" {
                head.push_str(" overhead |");
                rule.push_str("---:|");
            }
        }
        let mut out = format!("{head}\n{rule}\n");
        for w in &self.workloads {
            out.push_str(&format!("| {} {unit} |", w.name));
            let plain = figure(transport, "plain", &w.name);
            for c in &self.configs {
                let v = figure(transport, &c.name, &w.name);
                match v {
                    Some(v) => out.push_str(&format!(" {v:.1} |")),
                    None => out.push_str(" - |"),
                }
                if c.name != "plain" {
                    let ratio = match (v, plain) {
                        (Some(v), Some(p)) if p > 0.0 => Some(v / p),
                        _ => None,
                    };
                    match ratio {
                        Some(r) => out.push_str(&format!(" {:+.1}% |", (r - 1.0) * 100.0)),
                        None => out.push_str(" N/A |"),
                    }
                }
            }
            out.push('\n');
        }
        out
    }

    /// One table per transport; with more than one, each under a heading naming it.
    pub fn render_markdown(&self) -> String {
        if let [(only, _)] = self.transports.as_slice() {
            return self.tables_of(only);
        }
        let mut out = String::new();
        for (i, (t, what)) in self.transports.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(&format!("#### Transport `{t}` ({what})\n\n"));
            out.push_str(&self.tables_of(t));
        }
        out
    }

    /// The MB/s table, then (when measured) the MB per CPU second one.
    fn tables_of(&self, transport: &str) -> String {
        let mut out = self.render_table(transport);
        let cpu = self.render_cpu_table(transport);
        if !cpu.is_empty() {
            out.push_str("\nPer second of the process's CPU time (what the aims compare):\n\n");
            out.push_str(&cpu);
        }
        out
    }

    /// The aims next to the measured ratios (of MB per CPU second where measured, else of
    /// MB/s), one ratio and verdict column per transport; then the bound line and the
    /// authenticated configuration against it.
    pub fn render_aims(&self) -> String {
        let mut out = String::from("| aim | workload |");
        let mut rule = String::from("|---|---|");
        for (t, _) in &self.transports {
            out.push_str(&format!(" ratio to plain ({t}) | met ({t}) |"));
            rule.push_str("---:|---|");
        }
        out.push('\n');
        out.push_str(&rule);
        out.push('\n');
        for (config, works, min) in AIMS {
            for w in works {
                out.push_str(&format!("| {config} >= {min}x plain | {w} |"));
                for (t, _) in &self.transports {
                    let (measured, met) = match self.aim_ratio(t, config, w) {
                        Some(r) => (format!("{r:.2}x"), if r >= min { "yes" } else { "**no**" }),
                        None => ("not run".to_string(), "-"),
                    };
                    out.push_str(&format!(" {measured} | {met} |"));
                }
                out.push('\n');
            }
        }
        let (config, min) = BOUND_AIM;
        if let Some(b) = &self.bound {
            for w in &self.workloads {
                let bound = if w.read_percent == 100 {
                    b.read_mb_s
                } else {
                    b.write_mb_s
                };
                out.push_str(&format!("| {config} >= {min}x bound | {} |", w.name));
                for (t, _) in &self.transports {
                    let (measured, met) = match self.aim_figure(t, config, &w.name) {
                        Some(v) if bound > 0.0 => {
                            let r = v / bound;
                            (format!("{r:.2}x"), if r >= min { "yes" } else { "**no**" })
                        }
                        _ => ("not run".to_string(), "-"),
                    };
                    out.push_str(&format!(" {measured} | {met} |"));
                }
                out.push('\n');
            }
            out.push('\n');
            out.push_str(&b.render());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrity::workloads;

    fn cell(t: &str, c: &str, w: &str, v: f64) -> IntegrityCell {
        IntegrityCell {
            transport: t.into(),
            config: c.into(),
            workload: w.into(),
            mb_s: v,
            samples: vec![v],
            cpu_mb_s: None,
            cpu_samples: vec![],
        }
    }

    fn report(transports: &[&str], cells: Vec<IntegrityCell>) -> IntegrityReport {
        let cfgs = IntegrityBenchConfig::builtin();
        let named = |n: &str| cfgs.iter().find(|c| c.name == n).expect(n).clone();
        IntegrityReport {
            configs: vec![named("plain"), named("int-crc32c-j"), named("verity")],
            tables: vec![],
            skipped: vec![],
            workloads: workloads(),
            cells,
            runtime_s: 1.0,
            repeats: 1,
            region: 1 << 20,
            transports: transports
                .iter()
                .map(|t| (t.to_string(), format!("{t} engine")))
                .collect(),
            load_avg: (0.0, 0.0),
            bound: None,
        }
    }

    #[test]
    fn markdown_has_the_reference_shape() {
        let r = report(
            &["inproc"],
            vec![
                cell("inproc", "plain", "write", 100.0),
                cell("inproc", "int-crc32c-j", "write", 56.7),
                cell("inproc", "plain", "read", 200.0),
                cell("inproc", "verity", "read", 190.0),
            ],
        );
        let md = r.render_markdown();
        assert!(md.starts_with("| | plain | integrity crc32c J | overhead | verity | overhead |"));
        assert!(!md.contains("Transport"), "{md}");
        // No CPU figures measured: no CPU table.
        assert!(!md.contains("MB/CPU-s"), "{md}");
        assert!(
            md.contains("| write MB/s | 100.0 | 56.7 | -43.3% | - | N/A |"),
            "{md}"
        );
        assert!(
            md.contains("| read MB/s | 200.0 | - | N/A | 190.0 | -5.0% |"),
            "{md}"
        );
        let aims = r.render_aims();
        assert!(aims.starts_with(
            "| aim | workload | ratio to plain (inproc) | met (inproc) |\n|---|---|---:|---|\n"
        ));
        assert!(
            aims.contains("| int-crc32c-j >= 0.45x plain | write | 0.57x | yes |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| verity >= 0.9x plain | read | 0.95x | yes |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| int-crc32c-b >= 0.8x plain | write | not run | - |\n"),
            "{aims}"
        );
        assert!(!aims.contains("bound"), "no bound measured: {aims}");
    }

    /// CPU figures, where measured, are what the aims compare (not MB/s), and the
    /// authenticated configuration is set against the bound printed below the aims.
    #[test]
    fn aims_use_cpu_figures_and_the_bound() {
        let mut cells = vec![
            cell("inproc", "plain", "write", 100.0),
            cell("inproc", "int-crc32c-j", "write", 90.0),
            cell("inproc", "crypt-int-hmac-sha256", "write", 10.0),
            cell("inproc", "crypt-int-hmac-sha256", "read", 10.0),
        ];
        for (c, cpu) in cells.iter_mut().zip([1000.0, 400.0, 750.0, 600.0]) {
            c.cpu_mb_s = Some(cpu);
        }
        let mut r = report(&["inproc"], cells);
        r.bound = Some(AeadBound {
            block_size: 4096,
            hmac_mb_s: 1100.0,
            openssl_hmac_mb_s: Some(1200.0),
            xts_encrypt_mb_s: 11000.0,
            xts_decrypt_mb_s: 11000.0,
            xts_implementation: "aws-lc".into(),
            write_mb_s: 1000.0,
            read_mb_s: 1000.0,
        });
        let md = r.render_markdown();
        assert!(
            md.contains("| write MB/CPU-s | 1000.0 | 400.0 | -60.0% | - | N/A |"),
            "{md}"
        );
        let aims = r.render_aims();
        // 400 / 1000 CPU-s, although MB/s says 0.90x.
        assert!(
            aims.contains("| int-crc32c-j >= 0.45x plain | write | 0.40x | **no** |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| crypt-int-hmac-sha256 >= 0.7x bound | write | 0.75x | yes |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| crypt-int-hmac-sha256 >= 0.7x bound | read | 0.60x | **no** |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| crypt-int-hmac-sha256 >= 0.7x bound | randread | not run | - |\n"),
            "{aims}"
        );
        assert!(
            aims.contains(
                "HMAC-SHA256 1100.0 (openssl speed -hmac sha256 -bytes 4096: 1200.0 MB/s)"
            ),
            "{aims}"
        );
        assert!(
            aims.contains("one pass of both: writes 1000.0, reads 1000.0"),
            "{aims}"
        );
    }

    #[test]
    fn two_transports_give_two_tables_and_labelled_ratios() {
        let r = report(
            &["inproc", "nbd"],
            vec![
                cell("inproc", "plain", "write", 1000.0),
                cell("inproc", "int-crc32c-j", "write", 100.0),
                cell("nbd", "plain", "write", 50.0),
                cell("nbd", "int-crc32c-j", "write", 40.0),
                cell("nbd", "plain", "read", 60.0),
                cell("nbd", "verity", "read", 57.0),
            ],
        );
        let md = r.render_markdown();
        let inproc = md
            .find("#### Transport `inproc` (inproc engine)")
            .expect(&md);
        let nbd = md.find("#### Transport `nbd` (nbd engine)").expect(&md);
        assert!(inproc < nbd, "{md}");
        let (first, second) = md.split_at(nbd);
        // Each table holds its own transport's figures only, ratios against its own plain.
        assert!(
            first.contains("| write MB/s | 1000.0 | 100.0 | -90.0% | - | N/A |"),
            "{md}"
        );
        assert!(
            first.contains("| read MB/s | - | - | N/A | - | N/A |"),
            "{md}"
        );
        assert!(
            second.contains("| write MB/s | 50.0 | 40.0 | -20.0% | - | N/A |"),
            "{md}"
        );
        assert!(
            second.contains("| read MB/s | 60.0 | - | N/A | 57.0 | -5.0% |"),
            "{md}"
        );
        let aims = r.render_aims();
        assert!(aims.starts_with("| aim | workload | ratio to plain (inproc) | met (inproc) | ratio to plain (nbd) | met (nbd) |\n|---|---|---:|---|---:|---|\n"), "{aims}");
        assert!(
            aims.contains(
                "| int-crc32c-j >= 0.45x plain | write | 0.10x | **no** | 0.80x | yes |\n"
            ),
            "{aims}"
        );
        assert!(
            aims.contains("| verity >= 0.9x plain | read | not run | - | 0.95x | yes |\n"),
            "{aims}"
        );
    }
}
