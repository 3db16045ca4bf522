//! SVG charts (plotters' SVG backend; text is laid out with plotters' built-in size estimate,
//! so no system fonts or fontconfig are needed).

use std::path::Path;

use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use crate::live::{LiveReport, LiveSample};
use crate::report::BenchReport;
use crate::BenchError;

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn err(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Output {
        path: path.to_path_buf(),
        msg: format!("drawing chart: {e}"),
    }
}

fn unique<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for i in items {
        if !v.iter().any(|x| x == i) {
            v.push(i.to_string());
        }
    }
    v
}

/// Draws one panel of grouped bars: configurations along x (labelled at the group centres),
/// one bar per transport. A macro rather than a function: the linear and logarithmic y axes
/// are different types, and plotters' generic bounds for both are unwieldy.
macro_rules! bar_panel {
    ($area:expr, $path:expr, $title:expr, $yrange:expr, $ydesc:expr, $floor:expr, $configs:expr, $transports:expr, $bars:expr) => {{
        let configs: &[String] = $configs;
        // x is in hundredths of a configuration slot: integer axes format themselves, and
        // key points at the slot centres put one label under each configuration.
        let n = configs.len() as i32 * 100;
        let centers: Vec<i32> = (0..configs.len() as i32).map(|i| i * 100 + 50).collect();
        let key_points = centers.clone();
        let name_at = |v: &i32| {
            if v.rem_euclid(100) == 50 {
                configs.get((v / 100) as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on($area)
            .caption($title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(120)
            .y_label_area_size(60)
            .build_cartesian_2d((0i32..n).with_key_points(key_points), $yrange)
            .map_err(|e| err($path, e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|_| String::new())
            .y_desc($ydesc)
            .draw()
            .map_err(|e| err($path, e))?;
        // Configuration names, written downwards from just below each slot's centre: the
        // mesh's own rotated labels are centred on the tick and half hidden by the plot.
        let base = $area.get_base_pixel();
        let label_style = TextStyle::from(("sans-serif", 13).into_font())
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for c in &centers {
            let (px, py) = chart.backend_coord(&(*c, $floor));
            $area
                .draw(&Text::new(
                    name_at(c),
                    (px - base.0, py - base.1 + 6),
                    label_style.clone(),
                ))
                .map_err(|e| err($path, e))?;
        }
        let transports: &[String] = $transports;
        let nt = transports.len().max(1) as f64;
        for (ti, t) in transports.iter().enumerate() {
            let color = PALETTE[ti % PALETTE.len()];
            let bars: Vec<(usize, f64)> = $bars(t);
            chart
                .draw_series(bars.into_iter().map(|(ci, v)| {
                    // The bars of one configuration share its unit-wide slot, side by side.
                    let x0 = ci as f64 + 0.1 + 0.8 * ti as f64 / nt;
                    let px = |x: f64| (x * 100.0).round() as i32;
                    Rectangle::new([(px(x0), $floor), (px(x0 + 0.8 / nt), v)], color.filled())
                }))
                .map_err(|e| err($path, e))?
                .label(t.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| err($path, e))?;
    }};
}

/// Throughput (read + write MB/s) and p99 latency (the worse of read and write) of every
/// configuration, one row of two panels per workload, one bar colour per transport.
pub fn render_matrix_svg(report: &BenchReport) -> Result<String, BenchError> {
    let path = Path::new("<matrix chart>");
    let ok: Vec<_> = report
        .results
        .iter()
        .filter_map(|r| r.median.as_ref().map(|m| (r, m)))
        .collect();
    let workloads = unique(ok.iter().map(|(r, _)| r.workload.as_str()));
    let configs = unique(ok.iter().map(|(r, _)| r.config.as_str()));
    let transports = unique(ok.iter().map(|(r, _)| r.transport.as_str()));
    if workloads.is_empty() {
        return Err(err(path, "no successful results to chart"));
    }
    let mut svg = String::new();
    {
        let row_h = 400u32;
        let root = SVGBackend::with_string(&mut svg, (1400, 50 + row_h * workloads.len() as u32))
            .into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(path, e))?;
        let root = root
            .titled(
                "cryptblk bench: throughput and p99 latency per configuration (medians)",
                ("sans-serif", 22),
            )
            .map_err(|e| err(path, e))?;
        let panels = root.split_evenly((workloads.len(), 2));
        for (wi, w) in workloads.iter().enumerate() {
            let bars_of = |t: &String,
                           f: &dyn Fn(&crate::metrics::RunMetrics) -> f64|
             -> Vec<(usize, f64)> {
                configs
                    .iter()
                    .enumerate()
                    .filter_map(|(ci, c)| {
                        ok.iter()
                            .find(|(r, _)| &r.workload == w && &r.config == c && &r.transport == t)
                            .map(|(_, m)| (ci, f(m)))
                    })
                    .filter(|(_, v)| *v > 0.0)
                    .collect()
            };
            let tput = |m: &crate::metrics::RunMetrics| m.total_mb_s();
            let p99 = |m: &crate::metrics::RunMetrics| m.read.lat_p99_us.max(m.write.lat_p99_us);
            let range = |f: &dyn Fn(&crate::metrics::RunMetrics) -> f64| {
                let v: Vec<f64> = ok
                    .iter()
                    .filter(|(r, _)| &r.workload == w)
                    .map(|(_, m)| f(m))
                    .filter(|v| *v > 0.0)
                    .collect();
                let max = v.iter().cloned().fold(0.0, f64::max).max(1e-3);
                let min = v.iter().cloned().fold(f64::INFINITY, f64::min).min(max);
                (min, max)
            };
            let (_, tmax) = range(&tput);
            bar_panel!(
                &panels[wi * 2],
                path,
                format!("{w}: read+write MB/s"),
                0f64..tmax * 1.12,
                "MB/s",
                0.0,
                &configs,
                &transports,
                |t: &String| bars_of(t, &tput)
            );
            let (lmin, lmax) = range(&p99);
            let floor = (lmin / 2.0).max(0.01);
            bar_panel!(
                &panels[wi * 2 + 1],
                path,
                format!("{w}: p99 latency µs (worse of read and write; log scale)"),
                (floor..lmax * 2.5).log_scale(),
                "µs",
                floor,
                &configs,
                &transports,
                |t: &String| bars_of(t, &p99)
            );
        }
        root.present().map_err(|e| err(path, e))?;
    }
    Ok(svg)
}

/// A named line of the live chart and how to get its value from a sample.
type Series = (String, Box<dyn Fn(&LiveSample) -> f64>);

/// The live flip over time: throughput (read, write, total) and p99 latency, with the flip
/// marked.
pub fn render_live_svg(live: &LiveReport) -> Result<String, BenchError> {
    let path = Path::new("<live chart>");
    if live.samples.is_empty() {
        return Err(err(path, "no live samples"));
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 800)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(path, e))?;
        let root = root
            .titled(
                &format!(
                    "{} {} over {}: queued -> inline (no_read_workqueue no_write_workqueue) at {:.2} s",
                    live.config, live.workload, live.transport, live.flip_at_s
                ),
                ("sans-serif", 20),
            )
            .map_err(|e| err(path, e))?;
        let panels = root.split_evenly((2, 1));
        let t_max = live
            .samples
            .iter()
            .map(|s| s.t_s)
            .fold(0.0, f64::max)
            .max(live.duration_s);
        let p99 = if live.transport == "inproc" {
            "p99"
        } else {
            "mean"
        };
        let panels_spec: [(&str, Vec<Series>); 2] = [
            (
                "throughput, 250 ms intervals",
                vec![
                    ("read MB/s".into(), Box::new(|s| s.read_mb_s)),
                    ("write MB/s".into(), Box::new(|s| s.write_mb_s)),
                    (
                        "read+write MB/s".into(),
                        Box::new(|s| s.read_mb_s + s.write_mb_s),
                    ),
                ],
            ),
            (
                "latency, 250 ms intervals",
                vec![
                    (format!("read {p99} µs"), Box::new(|s| s.read_p99_us)),
                    (format!("write {p99} µs"), Box::new(|s| s.write_p99_us)),
                ],
            ),
        ];
        for (area, (title, series)) in panels.iter().zip(panels_spec.iter()) {
            let y_max = live
                .samples
                .iter()
                .flat_map(|s| series.iter().map(move |(_, f)| f(s)))
                .fold(0.0, f64::max)
                .max(1e-3)
                * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(*title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..t_max, 0f64..y_max)
                .map_err(|e| err(path, e))?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc(if title.starts_with("through") {
                    "MB/s"
                } else {
                    "µs"
                })
                .draw()
                .map_err(|e| err(path, e))?;
            for (i, (name, f)) in series.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                chart
                    .draw_series(LineSeries::new(
                        live.samples.iter().map(|s| (s.t_s, f(s))),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| err(path, e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
            }
            let flip_color = RGBColor(0xd6, 0x27, 0x28);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(live.flip_at_s, 0.0), (live.flip_at_s, y_max)],
                    8,
                    5,
                    flip_color.stroke_width(2),
                ))
                .map_err(|e| err(path, e))?
                .label("flip to inline")
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], flip_color.stroke_width(2))
                });
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| err(path, e))?;
        }
        root.present().map_err(|e| err(path, e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{DirMetrics, RunMetrics};
    use crate::report::ResultRow;

    fn row(config: &str, workload: &str, transport: &str, mb: f64, p99: f64) -> ResultRow {
        let m = RunMetrics {
            read: DirMetrics {
                mb_s: mb,
                lat_p99_us: p99,
                ops: 1,
                ..Default::default()
            },
            write: DirMetrics {
                mb_s: mb,
                lat_p99_us: p99 / 2.0,
                ops: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        ResultRow::single(config, workload, transport, m)
    }

    #[test]
    fn matrix_svg_names_every_configuration() {
        let mut rep = BenchReport::default();
        for (w, t) in [("rw4k", "inproc"), ("rw4k", "nbd"), ("randrw1m", "inproc")] {
            rep.results.push(row("plain", w, t, 1126.0, 20.0));
            rep.results
                .push(row("xts-submit-crypt-cpus", w, t, 147.0, 300.0));
        }
        let svg = render_matrix_svg(&rep).unwrap();
        std::fs::write(
            std::env::temp_dir().join("cryptblk-bench-matrix-test.svg"),
            &svg,
        )
        .unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("xts-submit-crypt-cpus"));
        assert!(svg.contains("rw4k: read+write MB/s"));
        assert!(svg.contains("randrw1m: p99 latency"));
        assert!(
            svg.contains("\nnbd\n"),
            "legend entry for the nbd transport"
        );
        assert!(svg.matches("<rect").count() > 12);
        assert!(render_matrix_svg(&BenchReport::default()).is_err());
    }

    #[test]
    fn live_svg_has_both_panels_and_the_flip() {
        let mut live = LiveReport {
            config: "xts".into(),
            workload: "rw4k".into(),
            transport: "inproc".into(),
            duration_s: 2.0,
            flip_at_s: 1.0,
            ..Default::default()
        };
        for k in 1..=8 {
            live.samples.push(LiveSample {
                t_s: k as f64 * 0.25,
                read_mb_s: 100.0 * k as f64,
                write_mb_s: 90.0,
                read_p99_us: 40.0,
                write_p99_us: 50.0,
                ..Default::default()
            });
        }
        let svg = render_live_svg(&live).unwrap();
        assert!(svg.contains("throughput, 250 ms intervals"));
        assert!(svg.contains("read p99 µs"));
        assert!(svg.contains("flip to inline"));
        assert!(svg.contains("<polyline"));
    }
}
