//! `cryptblk bench --reencrypt`: offline LUKS2 reencryption throughput, cryptblk beside
//! `cryptsetup reencrypt --force-offline-reencrypt`, on copies of one RAM-backed image.
//!
//! One LUKS2 image (aes-xts-plain64, pbkdf2 with forced iterations so the KDF costs
//! nothing, the data area filled with pseudo-random ciphertext) is made in `/dev/shm`.
//! Each repeat copies it once per tool and times both re-keys (same resilience mode, each
//! tool's own default hotzone for it), alternating which tool goes first, so load drift
//! hits both alike. Figures are medians of wall time; CPU seconds (user + system of the
//! child) come with them, as they are less sensitive to a shared machine. After every run
//! the header is checked by cryptsetup: the new key opens it and no reencryption is left.
//!
//! Both tools run as processes: the comparison includes their start-up and key setup,
//! which the forced PBKDF iterations keep to milliseconds.

use crate::BenchError;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The resilience modes the comparison knows (both tools' names).
pub const RESILIENCES: [&str; 3] = ["checksum", "journal", "none"];

/// The PBKDF options both tools get: the KDF is not what is measured.
const FAST_KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// Options of the reencryption comparison.
#[derive(Clone, Debug)]
pub struct ReencryptBenchOptions {
    /// Bytes of the image (default 1 GiB); the data area is this minus the 16 MiB header.
    pub size: u64,
    /// Resilience modes to run (default `checksum`, cryptsetup's default).
    pub resiliences: Vec<String>,
    /// Repeats per tool and mode (default 3).
    pub repeats: u32,
    /// Encryption sector size of the image (default 4096, what cryptsetup picks for a file).
    pub sector_size: u32,
    /// The cryptblk binary to time.
    pub cryptblk: PathBuf,
    /// The cryptsetup binary (default `cryptsetup` from PATH).
    pub cryptsetup: PathBuf,
    /// Directory of the images; RAM-backed (default `/dev/shm`).
    pub dir: PathBuf,
}

impl Default for ReencryptBenchOptions {
    fn default() -> Self {
        ReencryptBenchOptions {
            size: 1 << 30,
            resiliences: vec!["checksum".into()],
            repeats: 3,
            sector_size: 4096,
            cryptblk: PathBuf::from("cryptblk"),
            cryptsetup: PathBuf::from("cryptsetup"),
            dir: PathBuf::from("/dev/shm"),
        }
    }
}

/// One timed run of one tool.
#[derive(Clone, Debug, Serialize)]
pub struct ReencryptRun {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// User + system CPU seconds of the tool's process.
    pub cpu_seconds: f64,
}

/// The runs of one tool in one resilience mode.
#[derive(Clone, Debug, Serialize)]
pub struct ReencryptRow {
    /// "cryptblk" or "cryptsetup".
    pub tool: String,
    /// Resilience mode.
    pub resilience: String,
    /// Every run, in order.
    pub runs: Vec<ReencryptRun>,
    /// Median wall seconds.
    pub median_seconds: f64,
    /// Median CPU seconds.
    pub median_cpu_seconds: f64,
    /// Data bytes per median wall second, in MB/s (10^6).
    pub mb_s: f64,
}

/// cryptblk against cryptsetup in one resilience mode.
#[derive(Clone, Debug, Serialize)]
pub struct ReencryptRatio {
    /// Resilience mode.
    pub resilience: String,
    /// cryptsetup's median time over cryptblk's: above 1, cryptblk is faster.
    pub speed_ratio: f64,
    /// cryptsetup's median CPU seconds over cryptblk's.
    pub cpu_ratio: f64,
}

/// What the comparison measured.
#[derive(Clone, Debug, Serialize)]
pub struct ReencryptReport {
    /// Image size in bytes.
    pub size: u64,
    /// Bytes of data reencrypted per run.
    pub data_bytes: u64,
    /// The image's cipher and sector size.
    pub image: String,
    /// `cryptsetup --version`.
    pub cryptsetup_version: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Load average at the start and the end.
    pub load_avg: (f64, f64),
    /// One row per tool and mode.
    pub rows: Vec<ReencryptRow>,
    /// One ratio per mode.
    pub ratios: Vec<ReencryptRatio>,
}

fn tool_err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Tool(format!("{what}: {e}"))
}

/// Runs `cmd` to completion and returns its wall and CPU seconds; fails on a non-zero exit
/// with the tool's stderr.
fn timed(mut cmd: Command, what: &str) -> Result<ReencryptRun, BenchError> {
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| tool_err(what, e))?;
    let seconds = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(BenchError::Tool(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(ReencryptRun {
        seconds,
        cpu_seconds: children_cpu() - cpu0,
    })
}

/// User + system seconds of all waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes one plain struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Makes the base image: luksFormat by cryptsetup, then the data area overwritten with
/// pseudo-random bytes (standing in for ciphertext; no holes for either tool to skip).
fn make_image(opts: &ReencryptBenchOptions, path: &Path, key: &Path) -> Result<u64, BenchError> {
    let f = std::fs::File::create(path).map_err(|e| tool_err("creating the image", e))?;
    f.set_len(opts.size)
        .map_err(|e| tool_err("sizing the image", e))?;
    drop(f);
    let mut cmd = Command::new(&opts.cryptsetup);
    cmd.args(["luksFormat", "-q", "--type", "luks2", "--sector-size"])
        .arg(opts.sector_size.to_string())
        .args(FAST_KDF)
        .arg("--key-file")
        .arg(key)
        .arg(path);
    timed(cmd, "cryptsetup luksFormat")?;
    let offset = 16u64 << 20; // cryptsetup's default LUKS2 data offset.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| tool_err("opening the image", e))?;
    let mut rng = fastrand::Rng::with_seed(0x7265_656e);
    let mut buf = vec![0u8; 4 << 20];
    let mut pos = offset;
    while pos < opts.size {
        let n = ((opts.size - pos) as usize).min(buf.len());
        rng.fill(&mut buf[..n]);
        std::os::unix::fs::FileExt::write_all_at(&f, &buf[..n], pos)
            .map_err(|e| tool_err("filling the image", e))?;
        pos += n as u64;
    }
    Ok(opts.size - offset)
}

/// Checks a finished image with cryptsetup: the key opens it and no reencryption remains.
fn check_done(opts: &ReencryptBenchOptions, img: &Path, key: &Path) -> Result<(), BenchError> {
    let mut cmd = Command::new(&opts.cryptsetup);
    cmd.args(["open", "--test-passphrase", "--key-file"])
        .arg(key)
        .arg(img);
    timed(cmd, "cryptsetup open --test-passphrase")?;
    let dump = Command::new(&opts.cryptsetup)
        .arg("luksDump")
        .arg(img)
        .output()
        .map_err(|e| tool_err("cryptsetup luksDump", e))?;
    let text = String::from_utf8_lossy(&dump.stdout);
    if !dump.status.success() || text.contains("reencrypt") {
        return Err(BenchError::Verify(format!(
            "{} is not a finished LUKS2 volume after the reencryption",
            img.display()
        )));
    }
    Ok(())
}

fn reencrypt_cmd(
    opts: &ReencryptBenchOptions,
    tool: &str,
    res: &str,
    img: &Path,
    key: &Path,
) -> Command {
    let mut cmd = if tool == "cryptsetup" {
        let mut c = Command::new(&opts.cryptsetup);
        c.args(["reencrypt", "-q", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(&opts.cryptblk);
        c.args(["reencrypt", "-q"]);
        c
    };
    cmd.args(["--resilience", res])
        .args(FAST_KDF)
        .arg("--key-file")
        .arg(key)
        .arg(img);
    cmd
}

/// Runs the comparison. Needs 3 x `size` free in `dir` (the base image and one copy per
/// tool, one copy at a time).
pub fn run(opts: &ReencryptBenchOptions) -> Result<ReencryptReport, BenchError> {
    for r in &opts.resiliences {
        if !RESILIENCES.contains(&r.as_str()) {
            return Err(BenchError::UnknownName {
                what: "resilience".into(),
                name: r.clone(),
                known: RESILIENCES.join(", "),
            });
        }
    }
    if opts.size < 32 << 20 {
        return Err(BenchError::Options(
            "the reencryption image needs at least 32 MiB".into(),
        ));
    }
    let version = Command::new(&opts.cryptsetup)
        .arg("--version")
        .output()
        .map_err(|e| tool_err("cryptsetup is needed for --reencrypt", e))?;
    let load0 = crate::runner::load_avg();
    let work = tempfile::Builder::new()
        .prefix("cryptblk-reenc-bench.")
        .tempdir_in(&opts.dir)
        .map_err(|e| tool_err("making the work directory", e))?;
    let key = work.path().join("key");
    std::fs::write(&key, b"bench-pass").map_err(|e| tool_err("writing the key file", e))?;
    let base = work.path().join("base.img");
    let data_bytes = make_image(opts, &base, &key)?;
    let img = work.path().join("run.img");
    let tools = ["cryptsetup", "cryptblk"];
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    for res in &opts.resiliences {
        let mut runs: [Vec<ReencryptRun>; 2] = [Vec::new(), Vec::new()];
        for r in 0..opts.repeats.max(1) {
            // Alternate the order: A B, B A, A B ...
            let order: [usize; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            for t in order {
                std::fs::copy(&base, &img).map_err(|e| tool_err("copying the image", e))?;
                let run = timed(
                    reencrypt_cmd(opts, tools[t], res, &img, &key),
                    &format!("{} reencrypt --resilience {res}", tools[t]),
                )?;
                check_done(opts, &img, &key)?;
                std::fs::remove_file(&img).map_err(|e| tool_err("removing the copy", e))?;
                runs[t].push(run);
            }
        }
        let mut med = [(0.0, 0.0); 2];
        for (t, tool_runs) in runs.into_iter().enumerate() {
            let secs = median(tool_runs.iter().map(|r| r.seconds).collect());
            let cpu = median(tool_runs.iter().map(|r| r.cpu_seconds).collect());
            med[t] = (secs, cpu);
            rows.push(ReencryptRow {
                tool: tools[t].into(),
                resilience: res.clone(),
                runs: tool_runs,
                median_seconds: secs,
                median_cpu_seconds: cpu,
                mb_s: data_bytes as f64 / secs / 1e6,
            });
        }
        ratios.push(ReencryptRatio {
            resilience: res.clone(),
            speed_ratio: med[0].0 / med[1].0,
            cpu_ratio: med[0].1 / med[1].1,
        });
    }
    Ok(ReencryptReport {
        size: opts.size,
        data_bytes,
        image: format!(
            "LUKS2 aes-xts-plain64 512-bit key, {}-byte sectors",
            opts.sector_size
        ),
        cryptsetup_version: String::from_utf8_lossy(&version.stdout).trim().into(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_avg: (load0, crate::runner::load_avg()),
        rows,
        ratios,
    })
}

impl ReencryptReport {
    /// The report as an aligned text table with one ratio line per mode.
    pub fn render_table(&self) -> String {
        let mut out = format!(
            "offline reencryption (re-key) of {} MiB of data on /dev/shm, {}; {}; {} CPUs, load {:.2} -> {:.2}\n",
            self.data_bytes >> 20,
            self.image,
            self.cryptsetup_version,
            self.cpus,
            self.load_avg.0,
            self.load_avg.1
        );
        out.push_str(&format!(
            "{:<11} {:<10} {:>5} {:>10} {:>8} {:>8}  {}\n",
            "tool", "resilience", "runs", "median s", "MB/s", "CPU s", "all runs s"
        ));
        for r in &self.rows {
            let all: Vec<String> = r.runs.iter().map(|x| format!("{:.2}", x.seconds)).collect();
            out.push_str(&format!(
                "{:<11} {:<10} {:>5} {:>10.2} {:>8.1} {:>8.2}  {}\n",
                r.tool,
                r.resilience,
                r.runs.len(),
                r.median_seconds,
                r.mb_s,
                r.median_cpu_seconds,
                all.join(" ")
            ));
        }
        for q in &self.ratios {
            out.push_str(&format!(
                "{}: cryptblk is {:.2}x cryptsetup's speed ({:.2}x less CPU)\n",
                q.resilience, q.speed_ratio, q.cpu_ratio
            ));
        }
        out
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
