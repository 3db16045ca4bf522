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

use super::volume;
use crate::args::{ExportArgs, IntegrityAction, IntegrityOpts, Opts};
use crate::exit::{ActionResult, ExitCode, Failure};
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode};
use cryptblk_dm::TableSpec;
use cryptblk_volume::control;
use cryptblk_volume::integrity::{self as lib, Algorithm};
use cryptblk_volume::serve::ServeSpec;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

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
        IntegrityAction::Dump { device } => dump(device),
    }
}

/// The algorithm and internal hash key from the options, checked.
fn algorithm(o: &IntegrityOpts) -> Result<Algorithm, Failure> {
    let key = lib::read_key(o.integrity_key_file.as_deref(), o.integrity_key_size)?;
    Algorithm::new(o.integrity.as_deref(), key)
}

/// `--journal-crypt*` and `--journal-integrity*`, keys read and checked.
fn journal_algorithms(o: &IntegrityOpts) -> Result<Vec<lib::JournalKey>, Failure> {
    lib::journal_keys(&[
        lib::JournalRequest {
            option: "journal_crypt",
            what: "journal encryption",
            algorithm: o.journal_crypt.as_deref(),
            key_file: o.journal_crypt_key_file.as_deref(),
            key_size: o.journal_crypt_key_size,
        },
        lib::JournalRequest {
            option: "journal_mac",
            what: "journal integrity",
            algorithm: o.journal_integrity.as_deref(),
            key_file: o.journal_integrity_key_file.as_deref(),
            key_size: o.journal_integrity_key_size,
        },
    ])
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
    // Formatting a device a daemon serves would pull its data out from under it.
    let mut formatted = vec![device];
    formatted.extend(o.data_device.as_deref());
    let _in_use = cryptblk_volume::lock::for_format(&formatted)?;
    // With a data device, the positional device holds only the metadata.
    let devices = lib::Devices::open(device, o.data_device.as_deref())?;
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
    lib::apply_journal_keys(&mut cfg, &journal_algorithms(o)?);
    let spec = devices.spec().to_string();
    let sb = devices.format(&cfg, device)?;
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
        let mut bar = crate::progress::Bar::for_action(opts, crate::progress::Dest::Stdout, &spec);
        devices.wipe(&cfg, &mut bar)?
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
    }
    Ok(())
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
    if o.integrity_recalculate && o.integrity_recalculate_reset {
        return Err(Failure::usage(
            "Choose one of --integrity-recalculate and --integrity-recalculate-reset.",
        ));
    }
    let alg = algorithm(o)?;
    let mode = if o.integrity_recovery_mode {
        lib::OpenMode::Recovery
    } else if o.integrity_bitmap_mode {
        lib::OpenMode::Bitmap
    } else if o.integrity_no_journal {
        lib::OpenMode::Direct
    } else {
        lib::OpenMode::Journal
    };
    let recalculate = if o.integrity_recalculate_reset {
        Some(lib::Recalculate::Reset)
    } else if o.integrity_recalculate {
        Some(lib::Recalculate::Resume)
    } else {
        None
    };
    let options = lib::OpenOptions {
        mode,
        recalculate,
        buffer_sectors: o.buffer_sectors,
        journal_watermark: o.journal_watermark,
        commit_time: o.journal_commit_time,
        sectors_per_bit: o.bitmap_sectors_per_bit,
        bitmap_flush_interval: o.bitmap_flush_time,
        readonly: opts.readonly,
    };
    let journals = journal_algorithms(o)?;
    let plan = lib::plan(
        device,
        o.data_device.as_deref(),
        name,
        &alg,
        &journals,
        &options,
    )?;
    let spec = ServeSpec {
        name: plan.name.clone(),
        table: plan.table.to_string(),
        export: super::serving::export_spec(export, &plan.name)?,
        readonly: mode == lib::OpenMode::Recovery || opts.readonly,
        info: plan.info.clone(),
    };
    super::serving::start(spec, export, opts.json)
}

/// `integrity status <name>`: integritysetup's report, from the live table and status line
/// (`<mismatches> <provided sectors> -`), or JSON.
fn status(name: &str, json_out: bool) -> ActionResult {
    let a = control::status(name)?;
    let table = a.table.as_str();
    let not_integrity = || Failure::usage(format!("Device {name} is not an integrity device."));
    let spec = TableSpec::parse(table).map_err(|_| not_integrity())?;
    let t = spec.integrity_lines().next().ok_or_else(not_integrity)?;
    let status_line = a.status.as_str();
    let failures: u64 = status_line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let info = &a.info;
    let sector_size = t.block_size.unwrap_or(512);
    let integrity = t
        .internal_hash
        .as_ref()
        .map(|h| h.name.clone())
        .or_else(|| info.integrity.clone())
        .unwrap_or_default();
    let size_sectors = a.size / 512;
    let readonly = a.readonly;
    let recovery = t.mode == IntegrityMode::Recovery;
    let journal = t.mode == IntegrityMode::Journal;
    let bitmap = t.mode == IntegrityMode::Bitmap;
    let journal_bytes = u64::from(t.journal_sectors.unwrap_or(0)) * 512;
    let meta_device = t.meta_device.clone();
    let tag_size = t.tag_size.unwrap_or(0);
    // Status line `<mismatches> <provided> <recalc_sector|->` after `<start> <len> integrity`.
    let recalc_sector: Option<u64> = status_line
        .split_whitespace()
        .nth(5)
        .and_then(|v| v.parse().ok());
    if json_out {
        let mut v = json!({
            "name": name,
            "type": "INTEGRITY",
            "tag_size": tag_size,
            "integrity": integrity,
            "device": t.device,
            "metadata_device": meta_device,
            "recalc_sector": recalc_sector,
            "sector_size": sector_size,
            "interleave_sectors": t.interleave_sectors,
            "size": size_sectors,
            "mode": if readonly { "readonly" } else { "read/write" },
            "recovery": recovery,
            "journal_mode": match t.mode {
                IntegrityMode::Journal => "journal",
                IntegrityMode::Bitmap => "bitmap",
                IntegrityMode::Direct => "direct",
                IntegrityMode::Recovery => "recovery",
            },
            "failures": failures,
            "mismatches": failures,
            "export": a.export,
            "device_path": super::serving::device_path(name, &a.export),
        });
        if journal {
            v["journal_size"] = json!(journal_bytes);
            v["journal_watermark"] = json!(t.journal_watermark);
            v["journal_commit_time"] = json!(t.commit_time);
        }
        if bitmap {
            v["bitmap_sectors_per_bit"] = json!(t.sectors_per_bit);
            v["bitmap_flush_interval"] = json!(t.bitmap_flush_interval);
        }
        println!("{v}");
        return Ok(());
    }
    // integritysetup's and veritysetup's first line, as cryptsetup's, naming the export.
    println!("{}", super::serving::active_line(&a));
    println!("  type:    INTEGRITY");
    println!("  tag size: {tag_size}");
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
        t.interleave_sectors.unwrap_or(0)
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
            t.sectors_per_bit.unwrap_or(0)
        );
        println!(
            "  bitmap flush interval: {} ms",
            t.bitmap_flush_interval.unwrap_or(0)
        );
    }
    if journal {
        println!("  journal size: {journal_bytes} bytes");
        println!("  journal watermark: {}%", t.journal_watermark.unwrap_or(0));
        println!("  journal commit time: {} ms", t.commit_time.unwrap_or(0));
    } else {
        println!("  journal: not active");
    }
    print_export(&json!(a.export));
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
    let a = control::status(name)?;
    let table = a.table.as_str();
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
    let status_line = a.status.as_str();
    let verified = status_line.split_whitespace().nth(3) == Some("V");
    let size = a.size / 512;
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
        "export": a.export,
        "device_path": super::serving::device_path(name, &a.export),
    });
    if json_out {
        println!("{v}");
        return Ok(());
    }
    // integritysetup's and veritysetup's first line, as cryptsetup's, naming the export.
    println!("{}", super::serving::active_line(&a));
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
    print_export(&json!(a.export));
    Ok(())
}

/// `--journal-crypt` / `--journal-integrity` with their key files, as (table option,
/// kernel algorithm name, key): integritysetup's `ctr-aes` is the kernel's `ctr(aes)`,
/// `hmac-sha256` its `hmac(sha256)`; each needs a key file and key size.
/// `integrity dump <device>`: the superblock at sector 0, printed as integritysetup does.
fn dump(device: &Path) -> ActionResult {
    let f = volume::open_file(device, false)?;
    let sb = cryptblk_format::integrity::IntegritySuperblock::read(&f, 0)?;
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    print!("{}", sb.dump(&name));
    Ok(())
}
