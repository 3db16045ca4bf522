//! `integrity format|open|close|status|dump`: standalone dm-integrity devices the way
//! integritysetup handles them, and `verity close|status`.
//!
//! `format` does what integritysetup does with the kernel: clear the superblock area, load
//! the target so that it writes a superblock and an empty journal, then (unless
//! `--no-wipe`) write zeros with valid tags over the whole device through a temporary
//! mapping opened without the journal, with a progress bar on a terminal. `open` reads the
//! superblock, builds the kernel table line integritysetup would load and hands it to the
//! same serving daemon as `open` and `dm create`. The integrity key travels only inside
//! that table (through the daemon's pipe), never on a command line.
//!
//! With `--data-device D`, the positional device holds superblock, journal and tags and `D`
//! only data (the kernel's `meta_device:` layout): the table names `D` as its device and
//! the positional one as `meta_device:`, as integritysetup's does. `open
//! --integrity-recalculate` (`--integrity-recalculate-reset`) adds `recalculate`
//! (`reset_recalculate`): tags are recomputed in the background while the device serves.

use super::volume::{self, open_file};
use crate::args::{ExportArgs, IntegrityAction, IntegrityOpts, Opts};
use crate::control;
use crate::exit::{ActionResult, ExitCode, Failure};
use crate::serve::ServeSpec;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::integrity::hash::{kernel_name, InternalHash};
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions};
use cryptblk_format::integrity::IntegritySuperblock;
use serde_json::{json, Value};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// integritysetup's default algorithm.
const DEFAULT_INTEGRITY: &str = "crc32c";
/// Longest key integritysetup reads from `--integrity-key-file`.
const MAX_KEY_SIZE: u32 = 4096;
/// Bytes written per wipe request (cryptsetup's DEFAULT_WIPE_BLOCK).
/// Superblock flag `fix_padding`.
const FLAG_FIXED_PADDING: u32 = 0x8;
/// Superblock flag `fix_hmac`.
const FLAG_FIXED_HMAC: u32 = 0x10;

/// Runs one `integrity` action.
pub fn integrity(opts: &Opts, action: &IntegrityAction) -> ActionResult {
    match action {
        IntegrityAction::Format { device } => format(opts, device),
        IntegrityAction::Open {
            device,
            name,
            export,
        } => open(opts, device, name, export),
        IntegrityAction::Close { name } => super::serving::close(name),
        IntegrityAction::Status { name } => status(name, opts.json),
        IntegrityAction::Dump { device } => super::verity::integrity_dump(device),
    }
}

/// The algorithm as given (integritysetup spelling) and its kernel name, checked with the
/// key: an unknown name or a key that does not fit the algorithm is refused here, before
/// anything is written.
struct Algorithm {
    /// `--integrity` as given (`hmac-sha256`).
    user: String,
    /// Kernel crypto API name (`hmac(sha256)`).
    kernel: String,
    /// The key of a keyed algorithm.
    key: Option<SecretBytes>,
    /// Digest size in bytes.
    digest_size: usize,
}

fn algorithm(o: &IntegrityOpts) -> Result<Algorithm, Failure> {
    let user = o
        .integrity
        .clone()
        .unwrap_or_else(|| DEFAULT_INTEGRITY.to_string());
    let kernel = kernel_name(&user);
    let key = read_key(o)?;
    let hash = InternalHash::new(&kernel, key.clone()).map_err(|e| {
        let what = if e.contains("needs a key") {
            format!(
                "Integrity algorithm {user} needs a key: use --integrity-key-file and --integrity-key-size."
            )
        } else if e.contains("takes no key") {
            format!("Integrity algorithm {user} takes no key (drop --integrity-key-file).")
        } else {
            format!("Integrity algorithm {user} is not supported ({e}).")
        };
        Failure::usage(what)
    })?;
    Ok(Algorithm {
        user,
        kernel,
        key,
        digest_size: hash.digest_size(),
    })
}

/// `--integrity-key-file` + `--integrity-key-size`, with integritysetup's rules: both or
/// neither, at most 4096 bytes, and the file must hold that many.
fn read_key(o: &IntegrityOpts) -> Result<Option<SecretBytes>, Failure> {
    let (file, size) = match (&o.integrity_key_file, o.integrity_key_size) {
        (None, None) => return Ok(None),
        (Some(f), Some(s)) => (f, s),
        _ => {
            return Err(Failure::usage(
                "Both key file and key size options must be specified.",
            ))
        }
    };
    if size == 0 || size > MAX_KEY_SIZE {
        return Err(Failure::usage(format!(
            "Invalid --integrity-key-size size {size}. Maximum is {MAX_KEY_SIZE} bytes."
        )));
    }
    let mut f = std::fs::File::open(file)
        .map_err(|e| Failure::usage(format!("Cannot read keyfile {} ({e}).", file.display())))?;
    let mut key = SecretBytes::zeroed(size as usize);
    let mut got = 0;
    while got < key.len() {
        match f.read(&mut key.as_mut_bytes()[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Failure::usage(format!(
                    "Cannot read keyfile {} ({e}).",
                    file.display()
                )))
            }
        }
    }
    if got != key.len() {
        return Err(Failure::usage(format!(
            "Cannot read {size} bytes from keyfile {}.",
            file.display()
        )));
    }
    Ok(Some(key))
}

fn open_backing(device: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>, Failure> {
    // Fail like the rest of the CLI for a missing device, with cryptsetup's exit code.
    drop(open_file(device, !read_only)?);
    let b = FileBacking::open(
        device,
        FileOptions {
            read_only,
            ..Default::default()
        },
    )
    .map_err(|e| {
        Failure::device(format!(
            "Device {} does not exist or access denied ({e}).",
            device.display()
        ))
    })?;
    Ok(Arc::new(b))
}

/// `integrity format <device>`.
fn format(opts: &Opts, device: &Path) -> ActionResult {
    let o = &opts.integrity;
    let alg = algorithm(o)?;
    let sector_size = opts.sector_size.unwrap_or(512);
    if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
        return Err(Failure::usage(format!(
            "Unsupported sector size {sector_size} (a power of two from 512 to 4096)."
        )));
    }
    let tag_size = o.tag_size.filter(|&t| t != 0);
    if let Some(t) = tag_size {
        if t as usize != alg.digest_size {
            eprintln!(
                "WARNING: Requested tag size {t} bytes differs from {} size output ({} bytes).",
                alg.user, alg.digest_size
            );
        }
    }
    if let Some(j) = o.journal_size {
        if j % 512 != 0 || j == 0 || j / 512 > u32::MAX as u64 {
            return Err(Failure::usage(format!("Invalid journal size {j}.")));
        }
    }
    if o.integrity_recovery_mode || o.integrity_no_journal {
        return Err(Failure::usage(
            "--integrity-recovery-mode and --integrity-no-journal apply to open, not format.",
        ));
    }
    let dev = open_backing(device, false)?;
    // With a data device, `dev` (the positional device) is the metadata device.
    let data = match &o.data_device {
        Some(d) => Some(open_backing(d, false)?),
        None => None,
    };
    volume::confirm(
        opts,
        &format!(
            "This will overwrite data on {} irrevocably.",
            device.display()
        ),
    )?;
    let mut cfg = IntegrityConfig::new(IntegrityMode::Journal, &alg.kernel);
    cfg.tag_size = tag_size;
    cfg.block_size = sector_size;
    cfg.journal_sectors = o.journal_size.map(|j| (j / 512) as u32);
    if let Some(i) = o.interleave_sectors {
        cfg.interleave_sectors = i;
    }
    if let Some(b) = o.buffer_sectors {
        cfg.buffer_sectors = b.max(1);
    }
    cfg.internal_hash_key = alg.key.clone();
    cfg.fix_padding = !o.integrity_legacy_padding;
    cfg.fix_hmac = !o.integrity_legacy_hmac;
    for (opt, alg, key) in journal_algorithms(o)? {
        if opt == "journal_crypt" {
            (cfg.journal_crypt, cfg.journal_crypt_key) = (Some(alg), Some(key));
        } else {
            (cfg.journal_mac, cfg.journal_mac_key) = (Some(alg), Some(key));
        }
    }
    let (dev, meta, spec) = match (&data, &o.data_device) {
        (Some(d), Some(p)) => (d.clone(), Some(dev), p.display().to_string()),
        _ => (dev, None, device.display().to_string()),
    };
    let sb = IntegrityTarget::format(dev.clone(), &spec, meta.clone(), cfg.clone(), false)
        .map_err(|e| {
            Failure::usage(format!(
                "Cannot format integrity for device {}: {e}",
                device.display()
            ))
        })?;
    let quiet = opts.batch_mode || opts.json;
    if !quiet {
        println!(
            "Formatted with tag size {}, internal integrity {}.",
            sb.integrity_tag_size, alg.kernel
        );
    }
    let started = Instant::now();
    let wiped = if o.no_wipe {
        0
    } else {
        if !quiet {
            println!(
                "Wiping device to initialize integrity checksum.\n\
                 You can interrupt this by pressing CTRL+c (rest of not wiped device will contain invalid checksum)."
            );
        }
        // Like integritysetup: through a temporary mapping without the journal.
        cfg.mode = IntegrityMode::Direct;
        let t = IntegrityTarget::open(dev, &spec, meta, cfg, None)
            .map_err(|e| Failure::device(format!("Cannot open {spec} to wipe it: {e}")))?;
        wipe(&t, !quiet)?
    };
    if opts.json {
        println!(
            "{}",
            json!({
                "device": spec,
                "integrity": alg.user,
                "tag_size": sb.integrity_tag_size,
                "sector_size": 512u32 << sb.log2_sectors_per_block,
                "provided_data_sectors": sb.provided_data_sectors,
                "journal_sections": sb.journal_sections,
                "wiped_bytes": wiped,
                "seconds": started.elapsed().as_secs_f64(),
            })
        );
    } else if !quiet && wiped > 0 {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "Finished, time {}, {} MiB written, speed {:.1} MiB/s",
            mmss(secs),
            wiped >> 20,
            wiped as f64 / (1 << 20) as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}

/// `mm:ss.mmm`, as cryptsetup prints durations.
fn mmss(secs: f64) -> String {
    let m = (secs / 60.0).floor();
    format!("{:02}:{:06.3}", m as u64, secs - m * 60.0)
}

/// Writes zeros with valid tags over the whole device; returns the bytes written.
fn wipe(t: &IntegrityTarget, show: bool) -> Result<u64, Failure> {
    let total =
        cryptblk_volume::progress::zero_fill(t, "Wiping", &mut crate::progress::Bar::new(show))?;
    t.close()
        .map_err(|e| Failure::device(format!("Flushing after the wipe failed: {e}")))?;
    Ok(total)
}

/// `integrity open <device> <name>`.
fn open(opts: &Opts, device: &Path, name: &str, export: &ExportArgs) -> ActionResult {
    control::check_name(name)?;
    let o = &opts.integrity;
    let modes = [
        o.integrity_no_journal,
        o.integrity_bitmap_mode,
        o.integrity_recovery_mode,
    ];
    if modes.iter().filter(|&&m| m).count() > 1 {
        return Err(Failure::usage(
            "Choose one of --integrity-no-journal, --integrity-bitmap-mode and --integrity-recovery-mode.",
        ));
    }
    let alg = algorithm(o)?;
    let f = open_file(device, false)?;
    let sb = IntegritySuperblock::read(&f, 0).map_err(|_| {
        Failure::usage(format!(
            "Device {} is not a valid INTEGRITY device.",
            device.display()
        ))
    })?;
    let mpath = volume::table_path(device)?;
    // The table's device is the data device; the positional one is then `meta_device:`.
    let (dpath, meta_path) = match &o.data_device {
        Some(d) => (volume::table_path(d)?, Some(mpath)),
        None => (mpath, None),
    };
    if o.integrity_recalculate && o.integrity_recalculate_reset {
        return Err(Failure::usage(
            "Choose one of --integrity-recalculate and --integrity-recalculate-reset.",
        ));
    }
    let (mode, letter) = if o.integrity_recovery_mode {
        ("recovery", 'R')
    } else if o.integrity_bitmap_mode {
        ("bitmap", 'B')
    } else if o.integrity_no_journal {
        ("direct", 'D')
    } else {
        ("journal", 'J')
    };
    let mut params: Vec<String> = Vec::new();
    if let Some(m) = &meta_path {
        params.push(format!("meta_device:{}", m.display()));
    }
    if sb.sector_size() != 512 {
        params.push(format!("block_size:{}", sb.sector_size()));
    }
    if o.integrity_recalculate_reset {
        params.push("reset_recalculate".into());
    } else if o.integrity_recalculate {
        params.push("recalculate".into());
    }
    params.push(format!(
        "buffer_sectors:{}",
        o.buffer_sectors.unwrap_or(128).max(1)
    ));
    if letter == 'J' {
        params.push(format!(
            "journal_watermark:{}",
            o.journal_watermark.unwrap_or(50)
        ));
        params.push(format!(
            "commit_time:{}",
            o.journal_commit_time.unwrap_or(10000)
        ));
    }
    if letter == 'B' {
        if let Some(n) = o.bitmap_sectors_per_bit {
            if n == 0 || !n.is_power_of_two() {
                return Err(Failure::usage(format!(
                    "Invalid --bitmap-sectors-per-bit {n} (a power of two)."
                )));
            }
            params.push(format!("sectors_per_bit:{n}"));
        }
        if let Some(ms) = o.bitmap_flush_time {
            params.push(format!("bitmap_flush_interval:{ms}"));
        }
    }
    if sb.flags & FLAG_FIXED_PADDING != 0 {
        params.push("fix_padding".into());
    }
    if sb.flags & FLAG_FIXED_HMAC != 0 {
        params.push("fix_hmac".into());
    }
    let mut hash = format!("internal_hash:{}", alg.kernel);
    if let Some(k) = &alg.key {
        hash.push(':');
        hash.push_str(&k.to_hex());
    }
    params.push(hash);
    for (opt, alg, key) in journal_algorithms(o)? {
        params.push(format!("{opt}:{alg}:{}", key.to_hex()));
    }
    let table = format!(
        "0 {} integrity {} 0 {} {letter} {} {}",
        sb.provided_data_sectors,
        dpath.display(),
        sb.integrity_tag_size,
        params.len(),
        params.join(" ")
    );
    let spec = ServeSpec {
        name: name.to_string(),
        table,
        export: super::serving::export_spec(export)?,
        readonly: letter == 'R' || opts.readonly,
        info: json!({
            "type": "INTEGRITY",
            "device": dpath.display().to_string(),
            "metadata_device": meta_path.as_ref().map(|m| m.display().to_string()),
            "integrity": alg.kernel,
            "tag_size": sb.integrity_tag_size,
            "sector_size": sb.sector_size(),
            "mode": mode,
        }),
    };
    super::serving::start(spec, export, opts.json)
}

/// The `key:value` options and positional fields of a one-line integrity table.
struct IntegrityTable {
    device: String,
    tag_size: u64,
    mode: String,
    options: Vec<(String, String)>,
}

impl IntegrityTable {
    fn parse(table: &str) -> Option<Self> {
        let f: Vec<&str> = table.split_whitespace().collect();
        if f.len() < 7 || f[2] != "integrity" {
            return None;
        }
        let options = f
            .get(8..)
            .unwrap_or(&[])
            .iter()
            .map(|o| match o.split_once(':') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (o.to_string(), String::new()),
            })
            .collect();
        Some(IntegrityTable {
            device: f[3].to_string(),
            tag_size: f[5].parse().ok()?,
            mode: f[6].to_string(),
            options,
        })
    }

    fn opt(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn num(&self, key: &str) -> Option<u64> {
        self.opt(key).and_then(|v| v.parse().ok())
    }
}

/// `integrity status <name>`: integritysetup's report, from the live table and status line
/// (`<mismatches> <provided sectors> -`), or JSON.
fn status(name: &str, json_out: bool) -> ActionResult {
    let a = control::request(name, &json!({ "cmd": "status" }))?;
    let table = a["table"].as_str().unwrap_or("");
    let t = IntegrityTable::parse(table.lines().next().unwrap_or(""))
        .ok_or_else(|| Failure::usage(format!("Device {name} is not an integrity device.")))?;
    let status_line = a["status"].as_str().unwrap_or("");
    let failures: u64 = status_line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let info = &a["info"];
    let sector_size = t.num("block_size").unwrap_or(512);
    let integrity = t
        .opt("internal_hash")
        .map(|h| h.split(':').next().unwrap_or(h).to_string())
        .or_else(|| info["integrity"].as_str().map(str::to_string))
        .unwrap_or_default();
    let size_sectors = a["size"].as_u64().unwrap_or(0) / 512;
    let readonly = a["readonly"].as_bool() == Some(true);
    let recovery = t.mode == "R";
    let journal = t.mode == "J";
    let bitmap = t.mode == "B";
    let journal_bytes = t.num("journal_sectors").unwrap_or(0) * 512;
    let meta_device = t.opt("meta_device").map(str::to_string);
    // Status line `<mismatches> <provided> <recalc_sector|->` after `<start> <len> integrity`.
    let recalc_sector: Option<u64> = status_line
        .split_whitespace()
        .nth(5)
        .and_then(|v| v.parse().ok());
    if json_out {
        let mut v = json!({
            "name": name,
            "type": "INTEGRITY",
            "tag_size": t.tag_size,
            "integrity": integrity,
            "device": t.device,
            "metadata_device": meta_device,
            "recalc_sector": recalc_sector,
            "sector_size": sector_size,
            "interleave_sectors": t.num("interleave_sectors"),
            "size": size_sectors,
            "mode": if readonly { "readonly" } else { "read/write" },
            "recovery": recovery,
            "journal_mode": match t.mode.as_str() {
                "J" => "journal", "B" => "bitmap", "D" => "direct", _ => "recovery"
            },
            "failures": failures,
            "mismatches": failures,
            "export": a["export"],
        });
        if journal {
            v["journal_size"] = json!(journal_bytes);
            v["journal_watermark"] = json!(t.num("journal_watermark"));
            v["journal_commit_time"] = json!(t.num("commit_time"));
        }
        if bitmap {
            v["bitmap_sectors_per_bit"] = json!(t.num("sectors_per_bit"));
            v["bitmap_flush_interval"] = json!(t.num("bitmap_flush_interval"));
        }
        println!("{v}");
        return Ok(());
    }
    println!("/dev/mapper/{name} is active.");
    println!("  type:    INTEGRITY");
    println!("  tag size: {}", t.tag_size);
    println!("  integrity: {integrity}");
    println!(
        "  device:  {}{}",
        t.device,
        if meta_device.is_some() {
            " (detached)"
        } else {
            ""
        }
    );
    if let Some(m) = &meta_device {
        println!("  metadata device:  {m}");
    }
    println!("  sector size:  {sector_size} bytes");
    println!(
        "  interleave sectors: {}",
        t.num("interleave_sectors").unwrap_or(0)
    );
    println!("  size:    {size_sectors} sectors");
    println!(
        "  mode:    {}{}",
        if readonly { "readonly" } else { "read/write" },
        if recovery { " recovery" } else { "" }
    );
    println!("  failures: {failures}");
    if bitmap {
        println!(
            "  bitmap 512-byte sectors per bit: {}",
            t.num("sectors_per_bit").unwrap_or(0)
        );
        println!(
            "  bitmap flush interval: {} ms",
            t.num("bitmap_flush_interval").unwrap_or(0)
        );
    }
    if journal {
        println!("  journal size: {journal_bytes} bytes");
        println!(
            "  journal watermark: {}%",
            t.num("journal_watermark").unwrap_or(0)
        );
        println!(
            "  journal commit time: {} ms",
            t.num("commit_time").unwrap_or(0)
        );
    } else {
        println!("  journal: not active");
    }
    print_export(&a["export"]);
    Ok(())
}

fn print_export(e: &Value) {
    if let Some(uri) = e["uri"].as_str() {
        println!("  export:  nbd {uri}");
    }
    if let Some(file) = e["file"].as_str() {
        println!("  export:  fuse {file}");
    }
    if let Some(dev) = e["dev"].as_str() {
        println!("  export:  ublk {dev}");
    }
}

/// `verity status <name>`: veritysetup's report from the live verity table, or JSON.
pub fn verity_status(name: &str, json_out: bool) -> ActionResult {
    let a = control::request(name, &json!({ "cmd": "status" }))?;
    let table = a["table"].as_str().unwrap_or("");
    // <start> <len> verity <version> <data_dev> <hash_dev> <data_bs> <hash_bs>
    // <#blocks> <hash_start> <alg> <digest> <salt> [opts]
    let f: Vec<&str> = table.split_whitespace().collect();
    if f.len() < 13 || f[2] != "verity" {
        return Err(Failure::new(
            ExitCode::WrongParameters,
            format!("Device {name} is not a verity device."),
        ));
    }
    let hash_bs: u64 = f[7].parse().unwrap_or(4096);
    let hash_start: u64 = f[9].parse().unwrap_or(0);
    let status_line = a["status"].as_str().unwrap_or("");
    let verified = status_line.split_whitespace().nth(3) == Some("V");
    let size = a["size"].as_u64().unwrap_or(0) / 512;
    let salt = if f[12] == "-" { "-" } else { f[12] };
    let v = json!({
        "name": name,
        "type": "VERITY",
        "status": if verified { "verified" } else { "corrupted" },
        "hash_type": f[3].parse::<u64>().unwrap_or(1),
        "data_block": f[6].parse::<u64>().unwrap_or(0),
        "hash_block": hash_bs,
        "hash_name": f[10],
        "salt": salt,
        "data_device": f[4],
        "size": size,
        "mode": "readonly",
        "hash_device": f[5],
        // The table counts hash blocks from the superblock-less start; veritysetup shows
        // sectors.
        "hash_offset": hash_start * hash_bs / 512,
        "root_hash": f[11],
        "export": a["export"],
    });
    if json_out {
        println!("{v}");
        return Ok(());
    }
    println!("/dev/mapper/{name} is active.");
    println!("  type:        VERITY");
    println!("  status:      {}", v["status"].as_str().unwrap_or(""));
    println!("  hash type:   {}", v["hash_type"]);
    println!("  data block:  {}", v["data_block"]);
    println!("  hash block:  {hash_bs}");
    println!("  hash name:   {}", f[10]);
    println!("  salt:        {salt}");
    println!("  data device: {}", f[4]);
    println!("  size:        {size} sectors");
    println!("  mode:        readonly");
    println!("  hash device: {}", f[5]);
    println!("  hash offset: {} sectors", v["hash_offset"]);
    println!("  root hash:   {}", f[11]);
    print_export(&a["export"]);
    Ok(())
}

/// `--journal-crypt` / `--journal-integrity` with their key files, as (table option,
/// kernel algorithm name, key): integritysetup's `ctr-aes` is the kernel's `ctr(aes)`,
/// `hmac-sha256` its `hmac(sha256)`; each needs a key file and key size.
fn journal_algorithms(
    o: &IntegrityOpts,
) -> Result<Vec<(&'static str, String, SecretBytes)>, Failure> {
    let given = [
        (
            "journal_crypt",
            "journal encryption",
            &o.journal_crypt,
            &o.journal_crypt_key_file,
            o.journal_crypt_key_size,
        ),
        (
            "journal_mac",
            "journal integrity",
            &o.journal_integrity,
            &o.journal_integrity_key_file,
            o.journal_integrity_key_size,
        ),
    ];
    let mut out = Vec::new();
    for (opt, what, alg, file, size) in given {
        let Some(alg) = alg else {
            if file.is_some() || size.is_some() {
                return Err(Failure::usage(format!(
                    "A {what} key file or size needs the {what} algorithm."
                )));
            }
            continue;
        };
        // integritysetup's crypt_parse_hash_integrity_mode: "mode-alg" is "mode(alg)".
        if alg.contains(['(', ')']) {
            return Err(Failure::usage(format!("Invalid {what} algorithm {alg}.")));
        }
        let kernel = match alg.split_once('-') {
            Some((m, a)) if !a.starts_with(|c: char| c.is_ascii_digit()) => format!("{m}({a})"),
            _ => alg.clone(),
        };
        let (Some(file), Some(size)) = (file, size) else {
            return Err(Failure::usage(format!(
                "Both {what} key file and key size options must be specified."
            )));
        };
        if size == 0 || size > MAX_KEY_SIZE {
            return Err(Failure::usage(format!(
                "Invalid {what} key size {size}. Maximum is {MAX_KEY_SIZE} bytes."
            )));
        }
        let bytes = SecretBytes::from_vec(std::fs::read(file).map_err(|e| {
            Failure::usage(format!("Cannot read keyfile {} ({e}).", file.display()))
        })?);
        if bytes.len() < size as usize {
            return Err(Failure::usage(format!(
                "Cannot read {size} bytes from keyfile {}.",
                file.display()
            )));
        }
        out.push((
            opt,
            kernel,
            SecretBytes::from_slice(&bytes.as_bytes()[..size as usize]),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integrity_table_fields() {
        let t = IntegrityTable::parse(
            "0 7752 integrity /x 0 4 J 6 journal_sectors:176 interleave_sectors:32768 buffer_sectors:128 journal_watermark:50 commit_time:10000 internal_hash:crc32",
        )
        .unwrap();
        assert_eq!(t.tag_size, 4);
        assert_eq!(t.mode, "J");
        assert_eq!(t.num("journal_sectors"), Some(176));
        assert_eq!(t.opt("internal_hash"), Some("crc32"));
        assert!(IntegrityTable::parse("0 8 linear /x 0").is_none());
    }

    #[test]
    fn durations_as_cryptsetup() {
        assert_eq!(mmss(1106.389), "18:26.389");
        assert_eq!(mmss(2.5), "00:02.500");
    }
}
