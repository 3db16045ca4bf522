//! Progress of long operations (reencrypt, offline encrypt/decrypt, integrity wipes) as
//! cryptsetup reports it: a bar on a terminal, `Progress:` lines every `--progress-frequency`
//! seconds, JSON lines with `--progress-json`, and on every run that finishes the line
//! `Finished, time 00m02s, 1024 MiB written, speed 445.2 MiB/s`, also without a terminal.
//! Batch mode (`-q`) prints none of it unless `--progress-json` asks, as cryptsetup does.
//!
//! Rate and ETA are cryptsetup's: bytes moved since the first report over the time since
//! then, so a resumed run's earlier work neither inflates nor deflates them. (indicatif's own
//! rate estimate smooths over ticks and showed a 2.3 s run as "2.88 MiB/s eta 6m"; it only
//! draws the bar here.)

use crate::args::Opts;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Where the text lines go: cryptsetup's actions print progress on standard output; an action
/// whose standard output carries data (`decrypt ... -`) or JSON prints it on standard error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Standard output, as cryptsetup.
    Stdout,
    /// Standard error.
    Stderr,
}

/// How a run's progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// Nothing at all (batch mode).
    Silent,
    /// Only the final `Finished` line (no terminal, no frequency).
    Summary,
    /// A bar on standard error's terminal, then the final line.
    Bar,
    /// A `Progress:` line every so often, then the final line (`--progress-frequency`).
    Lines(Duration),
    /// cryptsetup's JSON objects, one a line, on standard output (`--progress-json`).
    Json,
}

/// The library's [`cryptblk_volume::Progress`] reported as cryptsetup reports it.
pub struct Bar {
    style: Style,
    dest: Dest,
    /// The device named in `--progress-json` lines.
    device: String,
    run: Option<Run>,
}

/// One started operation.
struct Run {
    total: Option<u64>,
    /// Bytes done at the first report and when it came (cryptsetup's start offset).
    start: Option<(u64, Instant)>,
    /// The latest report.
    done: u64,
    /// When a line was last printed (`Lines`, `Json`) or the bar's text last set.
    last_shown: Option<Instant>,
    bar: Option<ProgressBar>,
}

/// cryptsetup's default interval between two updates of the progress line.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);

impl Bar {
    /// Progress for an action run with `opts`: lines to `dest`, `device` named in JSON lines.
    pub fn for_action(opts: &Opts, dest: Dest, device: &str) -> Self {
        let style = if opts.progress_json {
            Style::Json
        } else if opts.batch_mode && !opts.verbose {
            Style::Silent
        } else if let Some(secs) = opts.progress_frequency.filter(|s| *s > 0) {
            Style::Lines(Duration::from_secs(secs))
        } else if std::io::stderr().is_terminal() {
            Style::Bar
        } else {
            Style::Summary
        };
        // A JSON summary on standard output (`--json`) must stay the only thing there.
        let dest = if opts.json && !opts.progress_json {
            Dest::Stderr
        } else {
            dest
        };
        Bar {
            style,
            dest,
            device: device.to_string(),
            run: None,
        }
    }

    /// Progress of an action of cryptblk's own whose standard output may carry the data
    /// (`encrypt`, `decrypt`): the text lines go to standard error.
    pub fn for_file(opts: &Opts, device: &std::path::Path) -> Self {
        Self::for_action(opts, Dest::Stderr, &device.display().to_string())
    }

    fn line(&self, text: &str) {
        // A closed stream ends nothing here: the operation itself goes on and reports.
        let _ = match self.dest {
            Dest::Stdout => writeln!(std::io::stdout().lock(), "{text}"),
            Dest::Stderr => writeln!(std::io::stderr().lock(), "{text}"),
        };
    }
}

/// Bytes per second since the first report, and the time left for `total` at that rate.
fn rate_and_eta(run: &Run, now: Instant) -> Option<(f64, Duration, Duration)> {
    let (first, t0) = run.start?;
    let elapsed = now.duration_since(t0);
    if elapsed.is_zero() {
        return None;
    }
    let rate = run.done.saturating_sub(first) as f64 / elapsed.as_secs_f64();
    let eta = match run.total {
        Some(total) if rate > 0.0 => {
            Duration::from_secs_f64((total.saturating_sub(run.done) as f64 / rate).min(1e9))
        }
        _ => Duration::ZERO,
    };
    Some((rate, elapsed, eta))
}

pub use cryptblk_volume::progress::{finished_line, human_speed, human_time, human_written};

fn progress_line(run: &Run, rate: f64, eta: Duration) -> String {
    let pct = match run.total {
        Some(t) if t > 0 => run.done as f64 / t as f64 * 100.0,
        _ => 0.0,
    };
    format!(
        "Progress: {pct:5.1}%, ETA {}, {}, {}",
        human_time(eta),
        human_written(run.done),
        human_speed(rate)
    )
}

fn json_line(device: &str, run: &Run, rate: f64, elapsed: Duration, eta: Duration) -> String {
    // cryptsetup writes every number as a string.
    serde_json::json!({
        "device": device,
        "device_bytes": run.done.to_string(),
        "device_size": run.total.unwrap_or(run.done).to_string(),
        "speed": (rate as u64).to_string(),
        "eta_ms": eta.as_millis().to_string(),
        "time_ms": elapsed.as_millis().to_string(),
    })
    .to_string()
}

impl cryptblk_volume::Progress for Bar {
    fn start(&mut self, total: Option<u64>, what: &str) {
        let bar = (self.style == Style::Bar).then(|| {
            let pb = match total {
                Some(t) => ProgressBar::new(t),
                None => ProgressBar::new_spinner(),
            };
            pb.set_style(
                ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {prefix}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            pb.set_message(what.to_string());
            pb
        });
        self.run = Some(Run {
            total,
            start: None,
            done: 0,
            last_shown: None,
            bar,
        });
    }

    fn update(&mut self, done: u64) {
        let style = self.style;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let now = Instant::now();
        run.done = done;
        if run.start.is_none() {
            run.start = Some((done, now));
        }
        if let Some(b) = &run.bar {
            b.set_position(done);
        }
        let interval = match style {
            Style::Lines(d) => d,
            Style::Bar | Style::Json => DEFAULT_INTERVAL,
            Style::Silent | Style::Summary => return,
        };
        if run
            .last_shown
            .is_some_and(|t| now.duration_since(t) < interval)
        {
            return;
        }
        if run.last_shown.is_none() && style != Style::Bar {
            // The first report only starts the clock, as cryptsetup's.
            run.last_shown = Some(now);
            return;
        }
        let Some((rate, elapsed, eta)) = rate_and_eta(run, now) else {
            return;
        };
        run.last_shown = Some(now);
        let text = match style {
            Style::Bar => {
                if let Some(b) = &run.bar {
                    b.set_prefix(format!("{} eta {}", human_speed(rate), human_time(eta)));
                }
                return;
            }
            Style::Json => json_line(&self.device, run, rate, elapsed, eta),
            _ => progress_line(run, rate, eta),
        };
        self.line(&text);
    }

    fn finish(&mut self) {
        let Some(run) = self.run.take() else {
            return;
        };
        if let Some(b) = &run.bar {
            b.finish_and_clear();
        }
        // A run that stopped short (an error, an interruption) reports through its error.
        let complete = run.start.is_some() && run.total.is_none_or(|t| run.done >= t);
        if !complete || self.style == Style::Silent {
            return;
        }
        let now = Instant::now();
        let (rate, elapsed, eta) =
            rate_and_eta(&run, now).unwrap_or((0.0, Duration::ZERO, Duration::ZERO));
        let text = match self.style {
            Style::Json => json_line(&self.device, &run, rate, elapsed, eta),
            _ => finished_line(elapsed, run.done, rate),
        };
        self.line(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cryptsetup_units() {
        assert_eq!(human_time(Duration::from_secs(4)), "00m04s");
        assert_eq!(human_time(Duration::from_secs(89 * 60 + 59)), "89m59s");
        assert_eq!(human_time(Duration::from_secs(90 * 60)), "01h30m00s");
        assert_eq!(human_time(Duration::from_secs(3 * 86400)), "03 days");
        assert_eq!(human_written(1008 << 20), "1008 MiB written");
        assert_eq!(human_written(240 << 20), " 240 MiB written");
        assert_eq!(human_written(5 << 30), "   5 GiB written");
        assert_eq!(human_speed(245.7 * 1048576.0), "speed 245.7 MiB/s");
        assert_eq!(human_speed(0.0), "speed   0.0 B/s");
        assert_eq!(
            finished_line(Duration::from_secs(4), 1008 << 20, 245.7 * 1048576.0),
            "Finished, time 00m04s, 1008 MiB written, speed 245.7 MiB/s"
        );
    }

    #[test]
    fn rate_counts_from_the_first_report() {
        let t0 = Instant::now();
        let run = Run {
            total: Some(1 << 30),
            start: Some((512 << 20, t0)),
            done: 768 << 20,
            last_shown: None,
            bar: None,
        };
        let (rate, elapsed, eta) = rate_and_eta(&run, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(elapsed, Duration::from_secs(2));
        assert_eq!(rate, (128u64 << 20) as f64);
        assert_eq!(eta, Duration::from_secs(2));
    }
}
