//! cryptsetup's up-front argument checks, before clap parses the command line: which option
//! each cryptsetup action takes, the option values cryptsetup refuses while parsing (a key
//! size that is not a multiple of 8, a sector size that is not a power of two in 512..4096,
//! ...), and the per-action combinations it refuses (`open --shared` without `--type
//! plain`, ...). Refusals are one line with cryptsetup's message and exit code 1, as
//! `cryptsetup --test-args` gives them. The facts (option list, action lists, messages) are
//! cryptsetup 2.8's; the code is cryptblk's own.
//!
//! The same pass brings cryptsetup's command-line habits to clap's grammar: action aliases
//! (`create`, `plainOpen`, `tcryptOpen`, `remove`, ...) become `open --type X` / `close`,
//! and positional arguments beyond what an action takes are dropped, as cryptsetup ignores
//! them (`refresh DEV NAME` refreshes NAME, as cryptsetup's does).
//!
//! Only cryptsetup's own actions are checked: cryptblk's additions (`encrypt`, `verity`,
//! `dm`, `bench`, ...) and cryptblk-only options pass through to clap unchanged.
// Hand-written rather than a clap feature: clap has no notion of "option allowed only with
// these subcommands" for global options, nor of checks that depend on `--type`.

use clap::CommandFactory;
use std::ffi::OsString;

/// How an option's value is read (cryptsetup's argument types).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No value.
    Flag,
    /// Any string.
    Str,
    /// Unsigned 32-bit decimal.
    U32,
    /// Signed 32-bit decimal.
    I32,
    /// Unsigned 64-bit decimal.
    U64,
    /// A size: decimal with an optional unit (S = 512 bytes, K/M/G/T, with B or iB).
    Size,
}

/// One cryptsetup option: long name, short name, value kind, the actions that take it
/// (empty: every action).
struct CsOpt {
    long: &'static str,
    short: Option<char>,
    kind: Kind,
    actions: &'static [&'static str],
}

const fn o(
    long: &'static str,
    short: Option<char>,
    kind: Kind,
    actions: &'static [&'static str],
) -> CsOpt {
    CsOpt {
        long,
        short,
        kind,
        actions,
    }
}

const ALL: &[&str] = &[];
const FORMAT: &[&str] = &["luksFormat"];
const OPEN: &[&str] = &["open"];
const CLOSE: &[&str] = &["close"];
const REENCRYPT: &[&str] = &["reencrypt"];
const FORMAT_REENCRYPT: &[&str] = &["luksFormat", "reencrypt"];
const TCRYPT: &[&str] = &["open", "tcryptDump"];
const PBKDF: &[&str] = &[
    "benchmark",
    "luksFormat",
    "luksAddKey",
    "luksChangeKey",
    "luksConvertKey",
    "reencrypt",
];
const FORCE_ITER: &[&str] = &[
    "luksFormat",
    "luksAddKey",
    "luksChangeKey",
    "luksConvertKey",
    "reencrypt",
];
const KEYSLOT_CIPHER: &[&str] = &[
    "luksFormat",
    "reencrypt",
    "luksAddKey",
    "luksChangeKey",
    "luksConvertKey",
];
const KEY_SIZE: &[&str] = &["open", "benchmark", "luksFormat", "reencrypt", "luksAddKey"];
const KEY_SLOT: &[&str] = &[
    "open",
    "reencrypt",
    "config",
    "luksFormat",
    "luksAddKey",
    "luksChangeKey",
    "luksConvertKey",
    "luksDump",
    "token",
    "luksResume",
];
const KEY_DESCRIPTION: &[&str] = &[
    "token",
    "luksDump",
    "luksFormat",
    "resize",
    "open",
    "luksResume",
    "luksAddKey",
    "reencrypt",
];
const TOKENS_PATH: &[&str] = &[
    "resize",
    "open",
    "luksAddKey",
    "luksDump",
    "luksResume",
    "token",
];
const LABEL: &[&str] = &["config", "luksFormat", "reencrypt"];
const UNBOUND: &[&str] = &["luksAddKey", "luksDump", "open", "token"];
const ADDKEY: &[&str] = &["luksAddKey"];

/// cryptsetup 2.8's options, in its own order (the first disallowed one is reported).
const CS_OPTS: &[CsOpt] = &[
    o("active-name", None, Kind::Str, ALL),
    o("align-payload", None, Kind::U32, FORMAT_REENCRYPT),
    o("allow-discards", None, Kind::Flag, OPEN),
    o("batch-mode", Some('q'), Kind::Flag, ALL),
    o("cancel-deferred", None, Kind::Flag, CLOSE),
    o("cipher", Some('c'), Kind::Str, ALL),
    o("debug", None, Kind::Flag, ALL),
    o("debug-json", None, Kind::Flag, ALL),
    o("decrypt", None, Kind::Flag, ALL),
    o("deferred", None, Kind::Flag, CLOSE),
    o(
        "device-size",
        None,
        Kind::Size,
        &["open", "resize", "reencrypt"],
    ),
    o("disable-blkid", None, Kind::Flag, FORMAT_REENCRYPT),
    o("disable-external-tokens", None, Kind::Flag, ALL),
    o("disable-keyring", None, Kind::Flag, ALL),
    o("disable-locks", None, Kind::Flag, ALL),
    o("disable-sum", None, Kind::Flag, FORMAT),
    o("disable-veracrypt", None, Kind::Flag, TCRYPT),
    o("dump-json-metadata", None, Kind::Flag, ALL),
    o("dump-volume-key", None, Kind::Flag, ALL),
    o("encrypt", None, Kind::Flag, ALL),
    o("external-tokens-path", None, Kind::Str, TOKENS_PATH),
    o("force-password", None, Kind::Flag, ALL),
    o("force-offline-reencrypt", None, Kind::Flag, REENCRYPT),
    o("force-no-keyslots", None, Kind::Flag, REENCRYPT),
    o("hash", Some('h'), Kind::Str, ALL),
    o("header", None, Kind::Str, ALL),
    o("header-backup-file", None, Kind::Str, ALL),
    o("hotzone-size", None, Kind::Size, REENCRYPT),
    o("hw-opal", None, Kind::Flag, FORMAT),
    o("hw-opal-factory-reset", None, Kind::Flag, &["erase"]),
    o("hw-opal-only", None, Kind::Flag, FORMAT),
    o("init-only", None, Kind::Flag, ALL),
    o("integrity", Some('I'), Kind::Str, FORMAT),
    o("integrity-inline", None, Kind::Flag, FORMAT),
    o("integrity-key-size", None, Kind::U32, ALL),
    o("integrity-legacy-padding", None, Kind::Flag, ALL),
    o("integrity-no-journal", None, Kind::Flag, ALL),
    o("integrity-no-wipe", None, Kind::Flag, FORMAT),
    o("iter-time", Some('i'), Kind::U32, PBKDF),
    o("iv-large-sectors", None, Kind::Flag, OPEN),
    o("json-file", None, Kind::Str, ALL),
    o("keep-key", None, Kind::Flag, REENCRYPT),
    o("key-description", None, Kind::Str, KEY_DESCRIPTION),
    o("key-file", Some('d'), Kind::Str, ALL),
    o("key-size", Some('s'), Kind::U32, KEY_SIZE),
    o("key-slot", Some('S'), Kind::I32, KEY_SLOT),
    o("keyfile-offset", None, Kind::U64, ALL),
    o("keyfile-size", Some('l'), Kind::U32, ALL),
    o("keyslot-cipher", None, Kind::Str, KEYSLOT_CIPHER),
    o("keyslot-key-size", None, Kind::U32, KEYSLOT_CIPHER),
    o("label", None, Kind::Str, LABEL),
    o(
        "link-vk-to-keyring",
        None,
        Kind::Str,
        &["open", "luksResume"],
    ),
    o("luks2-keyslots-size", None, Kind::Size, FORMAT_REENCRYPT),
    o("luks2-metadata-size", None, Kind::Size, FORMAT_REENCRYPT),
    o("new-keyfile", None, Kind::Str, ADDKEY),
    o("new-keyfile-offset", None, Kind::U64, ALL),
    o("new-keyfile-size", None, Kind::U32, ALL),
    o("new-key-description", None, Kind::Str, ADDKEY),
    o("new-key-size", None, Kind::U32, REENCRYPT),
    o("new-key-slot", None, Kind::I32, ADDKEY),
    o("new-token-id", None, Kind::I32, ADDKEY),
    o("new-volume-key-file", None, Kind::Str, REENCRYPT),
    o("new-volume-key-keyring", None, Kind::Str, REENCRYPT),
    o(
        "offset",
        Some('o'),
        Kind::U64,
        &["open", "reencrypt", "luksFormat"],
    ),
    o("pbkdf", None, Kind::Str, PBKDF),
    o("pbkdf-force-iterations", None, Kind::U32, FORCE_ITER),
    o("pbkdf-memory", None, Kind::U32, ALL),
    o("pbkdf-parallel", None, Kind::U32, ALL),
    o("perf-high_priority", None, Kind::Flag, ALL),
    o("perf-no_read_workqueue", None, Kind::Flag, ALL),
    o("perf-no_write_workqueue", None, Kind::Flag, ALL),
    o("perf-same_cpu_crypt", None, Kind::Flag, ALL),
    o("perf-submit_from_crypt_cpus", None, Kind::Flag, ALL),
    o("persistent", None, Kind::Flag, OPEN),
    o("priority", None, Kind::Str, &["config"]),
    o("progress-json", None, Kind::Flag, FORMAT_REENCRYPT),
    o("progress-frequency", None, Kind::U32, ALL),
    o("readonly", Some('r'), Kind::Flag, ALL),
    o("reduce-device-size", None, Kind::Size, ALL),
    o("refresh", None, Kind::Flag, OPEN),
    o("resilience", None, Kind::Str, ALL),
    o("resilience-hash", None, Kind::Str, ALL),
    o("resume-only", None, Kind::Flag, ALL),
    // `benchmark --sector-size` is cryptblk's own (rows for 512..4096-byte sectors, as the
    // kernel's dm-crypt uses them); cryptsetup refuses it there.
    o(
        "sector-size",
        None,
        Kind::U32,
        &["open", "reencrypt", "luksFormat", "benchmark"],
    ),
    o("serialize-memory-hard-pbkdf", None, Kind::Flag, OPEN),
    o("shared", None, Kind::Flag, OPEN),
    o("size", Some('b'), Kind::U64, &["open", "resize"]),
    o("skip", Some('p'), Kind::U64, OPEN),
    o("subsystem", None, Kind::Str, LABEL),
    o("test-args", None, Kind::Flag, ALL),
    o("test-passphrase", None, Kind::Flag, OPEN),
    o("timeout", Some('t'), Kind::U32, ALL),
    o("token-id", None, Kind::I32, ALL),
    o("token-only", None, Kind::Flag, ALL),
    o("token-replace", None, Kind::Flag, &["token"]),
    o("token-type", None, Kind::Str, ALL),
    o("tcrypt-backup", None, Kind::Flag, TCRYPT),
    o("tcrypt-hidden", None, Kind::Flag, TCRYPT),
    o("tcrypt-system", None, Kind::Flag, TCRYPT),
    o("tries", Some('T'), Kind::U32, ALL),
    o("type", Some('M'), Kind::Str, ALL),
    o("unbound", None, Kind::Flag, UNBOUND),
    o("use-random", None, Kind::Flag, FORMAT_REENCRYPT),
    o("use-urandom", None, Kind::Flag, FORMAT_REENCRYPT),
    o(
        "uuid",
        None,
        Kind::Str,
        &["luksFormat", "luksUUID", "reencrypt"],
    ),
    o("veracrypt", None, Kind::Flag, ALL),
    o("veracrypt-pim", None, Kind::U32, TCRYPT),
    o("veracrypt-query-pim", None, Kind::Flag, TCRYPT),
    o("verbose", Some('v'), Kind::Flag, ALL),
    o("verify-passphrase", Some('y'), Kind::Flag, ALL),
    o("volume-key-file", None, Kind::Str, ALL),
    o("volume-key-keyring", None, Kind::Str, ALL),
    o("block-size", Some('B'), Kind::U32, ALL),
    o("use-directio", None, Kind::Flag, ALL),
    o("use-fsync", None, Kind::Flag, ALL),
    o("write-log", None, Kind::Flag, ALL),
];

/// cryptsetup's option aliases: alias -> the option it stands for.
const CS_ALIASES: &[(&str, &str)] = &[
    ("new", "encrypt"),
    ("dump-master-key", "dump-volume-key"),
    ("master-key-file", "volume-key-file"),
];

/// cryptsetup's actions: name, positional arguments required, their description.
const CS_ACTIONS: &[(&str, usize, &str)] = &[
    ("open", 1, "<device> [--type <type>] [<name>]"),
    ("close", 1, "<name>"),
    ("resize", 1, "<name>"),
    ("status", 1, "<name>"),
    ("benchmark", 0, "[--cipher <cipher>]"),
    ("repair", 1, "<device>"),
    ("reencrypt", 0, "<device>"),
    ("erase", 1, "<device>"),
    ("convert", 1, "<device>"),
    ("config", 1, "<device>"),
    ("luksFormat", 1, "<device> [<new key file>]"),
    ("luksAddKey", 1, "<device> [<new key file>]"),
    ("luksRemoveKey", 1, "<device> [<key file>]"),
    ("luksChangeKey", 1, "<device> [<key file>]"),
    ("luksConvertKey", 1, "<device> [<key file>]"),
    ("luksKillSlot", 2, "<device> <key slot>"),
    ("luksUUID", 1, "<device>"),
    ("isLuks", 1, "<device>"),
    ("luksDump", 1, "<device>"),
    ("tcryptDump", 1, "<device>"),
    ("bitlkDump", 1, "<device>"),
    ("fvault2Dump", 1, "<device>"),
    ("luksSuspend", 1, "<device>"),
    ("luksResume", 1, "<device>"),
    ("luksHeaderBackup", 1, "<device>"),
    ("luksHeaderRestore", 1, "<device>"),
    ("token", 2, "<add|remove|import|export> <device>"),
];

/// What the command line asked for, after the checks.
#[derive(Debug)]
pub struct Checked {
    /// The arguments to give clap (aliases rewritten, ignored extra positionals dropped).
    pub argv: Vec<OsString>,
}

/// One option as given: its long name (cryptsetup's, after aliases) and value.
struct Given {
    long: String,
    value: Option<String>,
}

/// How cryptblk's clap grammar reads one option word: its long name and whether it takes a
/// value (`None`: clap does not know it).
fn clap_option(
    cmd: &clap::Command,
    long: Option<&str>,
    short: Option<char>,
) -> Option<(String, bool)> {
    let matches = |a: &&clap::Arg| {
        if let Some(l) = long {
            a.get_long() == Some(l) || a.get_all_aliases().is_some_and(|v| v.contains(&l))
        } else {
            short.is_some() && a.get_short() == short
        }
    };
    // An option before a group's inner action (`verity --hash-offset N format ...`) is one
    // of the inner actions' options.
    let arg = cmd.get_arguments().find(matches).or_else(|| {
        cmd.get_subcommands()
            .find_map(|s| s.get_arguments().find(matches))
    })?;
    let name = arg.get_long().unwrap_or(arg.get_id().as_str()).to_string();
    Some((name, arg.get_action().takes_values()))
}

fn cs_option(long: Option<&str>, short: Option<char>) -> Option<&'static CsOpt> {
    let long = long.map(|l| {
        CS_ALIASES
            .iter()
            .find(|(a, _)| *a == l)
            .map_or(l, |(_, to)| *to)
    });
    CS_OPTS.iter().find(|c| match long {
        Some(l) => c.long == l,
        None => short.is_some() && c.short == short,
    })
}

/// Reads the command line as popt would: options anywhere, `--name=value`, `--name value`,
/// `-xVALUE`, `-x VALUE`, clusters of short flags, `--` ending the options. Returns the
/// options given and the indices (into `args`) of the positional words.
fn scan<'c>(root: &'c clap::Command, args: &[String]) -> (Vec<Given>, Vec<usize>) {
    let mut given = Vec::new();
    let mut positional = Vec::new();
    let mut sub: Option<&'c clap::Command> = None;
    let mut i = 1;
    let mut options_end = false;
    while i < args.len() {
        let a = &args[i];
        let cmd = sub.unwrap_or(root);
        if options_end || a == "-" || !a.starts_with('-') {
            let find = |c: &'c clap::Command| {
                c.get_subcommands()
                    .find(|s| s.get_name() == a || s.get_all_aliases().any(|x| x == a))
            };
            match positional.len() {
                0 => sub = find(root),
                // The inner action of a group (`verity format`, `integrity open`).
                1 => sub = sub.and_then(|g| find(g).or(Some(g))),
                _ => {}
            }
            positional.push(i);
            i += 1;
            continue;
        }
        if a == "--" {
            options_end = true;
            i += 1;
            continue;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let (long, takes) = resolve(cmd, Some(name), None);
            let value = if takes && inline.is_none() {
                i += 1;
                args.get(i).cloned()
            } else {
                inline
            };
            given.push(Given { long, value });
            i += 1;
            continue;
        }
        // A cluster of short options: each takes the rest of the word, or the next word,
        // as its value when it takes one.
        let chars: Vec<char> = a[1..].chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let (long, takes) = resolve(cmd, None, Some(chars[k]));
            if takes {
                let rest: String = chars[k + 1..].iter().collect();
                let value = if rest.is_empty() {
                    i += 1;
                    args.get(i).cloned()
                } else {
                    Some(rest)
                };
                given.push(Given { long, value });
                break;
            }
            given.push(Given { long, value: None });
            k += 1;
        }
        i += 1;
    }
    (given, positional)
}

/// The long name of an option and whether it takes a value: as cryptblk's grammar reads it,
/// else as cryptsetup's does (clap then refuses it, or it is an option clap lacks).
fn resolve(cmd: &clap::Command, long: Option<&str>, short: Option<char>) -> (String, bool) {
    if let Some((name, takes)) = clap_option(cmd, long, short) {
        let name = cs_option(Some(&name), None).map_or(name, |c| c.long.to_string());
        return (name, takes);
    }
    if let Some(c) = cs_option(long, short) {
        return (c.long.to_string(), c.kind != Kind::Flag);
    }
    let name = long.map_or_else(|| short.unwrap_or('?').to_string(), str::to_string);
    (name, false)
}

/// cryptsetup's message for a number it cannot read (popt's).
const BAD_NUMBER: &str = "invalid numeric value";

fn parse_u64(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

fn parse_i64(v: &str) -> Option<i64> {
    let digits = v.strip_prefix(['-', '+']).unwrap_or(v);
    parse_u64(digits)?;
    v.parse().ok()
}

/// A size as cryptsetup reads `--device-size` and the like: digits, then optionally one of
/// S (512-byte sectors), K, M, G, T, followed by nothing (powers of 1024), `iB` (1024) or
/// `B` (1000).
pub fn parse_size(v: &str) -> Option<u64> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n = parse_u64(num)?;
    if unit.is_empty() {
        return Some(n);
    }
    let mut u = unit.chars();
    let letter = u.next()?;
    let rest: String = u.collect();
    let base: u64 = match rest.as_str() {
        "" | "iB" => 1024,
        "B" => 1000,
        _ => return None,
    };
    let mult = match letter.to_ascii_uppercase() {
        'S' => 512,
        'K' => base,
        'M' => base.pow(2),
        'G' => base.pow(3),
        'T' => base.pow(4),
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Checks one option's value as cryptsetup does while parsing.
fn check_value(g: &Given, kind: Kind) -> Result<(), String> {
    let v = g.value.as_deref().unwrap_or("");
    let bad = || Err(BAD_NUMBER.to_string());
    match kind {
        Kind::Flag | Kind::Str => {}
        Kind::U32 => {
            if parse_u64(v).is_none_or(|n| n > u64::from(u32::MAX)) {
                return bad();
            }
        }
        Kind::U64 => {
            if parse_u64(v).is_none() {
                return bad();
            }
        }
        Kind::I32 => {
            if parse_i64(v).is_none_or(|n| i32::try_from(n).is_err()) {
                return bad();
            }
        }
        Kind::Size => {
            if parse_size(v).is_none() {
                return Err(format!(
                    "Invalid size specification in parameter --{}.",
                    g.long
                ));
            }
        }
    }
    let num = || parse_u64(v).unwrap_or(0);
    let size = || parse_size(v).unwrap_or(0);
    match g.long.as_str() {
        "device-size" if size() == 0 => return bad(),
        "device-size" if size() % 512 != 0 => {
            return Err("Device size must be multiple of 512 bytes sector.".into())
        }
        "hotzone-size" if size() == 0 => {
            return Err("Invalid max reencryption hotzone size specification.".into())
        }
        "key-size" if num() % 8 != 0 => return Err("Key size must be a multiple of 8 bits".into()),
        "integrity-key-size" | "keyslot-key-size" if num() == 0 => return bad(),
        "integrity-key-size" | "keyslot-key-size" if num() % 8 != 0 => {
            return Err("Key size must be a multiple of 8 bits".into())
        }
        "key-slot" if parse_i64(v).unwrap_or(-1) < 0 => return Err("Key slot is invalid.".into()),
        "reduce-device-size" if size() > 1 << 30 => {
            return Err("Maximum device reduce size is 1 GiB.".into())
        }
        "reduce-device-size" if size() % 512 != 0 => {
            return Err("Reduce size must be multiple of 512 bytes sector.".into())
        }
        "sector-size" if !(512..=4096).contains(&num()) || !num().is_power_of_two() => {
            return Err("Unsupported encryption sector size.".into())
        }
        "priority" if !matches!(v, "normal" | "prefer" | "ignore") => {
            return Err("Option --priority can be only ignore/normal/prefer.".into())
        }
        _ => {}
    }
    Ok(())
}

/// The options given, for the per-action checks.
struct Set<'a>(&'a [Given]);

impl Set<'_> {
    fn has(&self, long: &str) -> bool {
        self.0.iter().any(|g| g.long == long)
    }
    fn last(&self, long: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|g| g.long == long)
            .and_then(|g| g.value.as_deref())
    }
    fn count(&self, long: &str) -> usize {
        self.0.iter().filter(|g| g.long == long).count()
    }
}

/// cryptsetup's action aliases: the action they stand for and the `--type` they imply.
fn alias(name: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match name {
        "create" | "plainOpen" => ("open", Some("plain")),
        "luksOpen" => ("open", Some("luks")),
        "loopaesOpen" => ("open", Some("loopaes")),
        "tcryptOpen" => ("open", Some("tcrypt")),
        "bitlkOpen" => ("open", Some("bitlk")),
        "fvault2Open" => ("open", Some("fvault2")),
        "remove" | "plainClose" | "luksClose" | "loopaesClose" | "tcryptClose" | "bitlkClose"
        | "fvault2Close" => ("close", None),
        "luksErase" => ("erase", None),
        "luksConfig" => ("config", None),
        _ => return None,
    })
}

/// Runs cryptsetup's checks on `args` (program name first) and returns the arguments for
/// clap, or cryptsetup's one-line message for a usage error (exit code 1).
pub fn check(args: Vec<OsString>) -> Result<Checked, String> {
    let strings: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut root = crate::args::Cli::command();
    root.build();
    let (given, positional) = scan(&root, &strings);
    let set = Set(&given);
    let Some(&action_at) = positional.first() else {
        return Ok(Checked { argv: args });
    };
    let word = strings[action_at].as_str();
    let (action, alias_type) = match alias(word) {
        Some((a, t)) => (a, t),
        None if word == "refresh" => ("open", None),
        None => (word, None),
    };
    let Some(&(_, required, desc)) = CS_ACTIONS.iter().find(|(a, _, _)| *a == action) else {
        // Not one of cryptsetup's actions: cryptblk's own grammar decides alone.
        return Ok(Checked {
            argv: group_options_after_action(&root, args, &positional),
        });
    };
    for g in &given {
        if let Some(c) = cs_option(Some(&g.long), None) {
            check_value(g, c.kind)?;
        }
    }
    if set.count("key-size") > 2 {
        return Err("At most 2 key size specifications can be supplied.".into());
    }
    if set.count("volume-key-file") > 2 {
        return Err("At most 2 volume key specifications can be supplied.".into());
    }
    let action_argc = positional.len() - 1;
    // cryptblk's `status --format prometheus` without a name reports every served volume.
    let required = if action == "status" && set.has("format") {
        0
    } else {
        required
    };
    if action_argc < required {
        return Err(format!("{action}: requires {desc} as arguments"));
    }
    let refresh = word == "refresh" || set.has("refresh");
    // cryptsetup's notion of the device type: an alias's, else --type, else "luks"; a
    // refresh reads it from the active mapping (none here).
    let device_type: Option<String> = if refresh {
        None
    } else if let Some(t) = alias_type {
        Some(t.to_string())
    } else if let Some(t) = match action {
        "tcryptDump" => Some("tcrypt"),
        "bitlkDump" => Some("bitlk"),
        "fvault2Dump" => Some("fvault2"),
        _ => None,
    } {
        Some(t.to_string())
    } else {
        Some(set.last("type").unwrap_or("luks").to_string())
    };
    for c in CS_OPTS {
        let given_here = set.has(c.long) || (c.long == "refresh" && refresh);
        if given_here && !c.actions.is_empty() && !c.actions.contains(&action) {
            return Err(format!(
                "Option --{} is not allowed with {action} action.",
                c.long
            ));
        }
    }
    let dt = device_type.as_deref();
    let is = |t: &str| dt == Some(t);
    // cryptsetup compares a missing type as equal to anything here.
    let is_or_none = |t: &str| dt.is_none() || dt == Some(t);
    if set.count("key-file") > 1 && !is_or_none("tcrypt") {
        return Err("Only one --key-file argument is allowed.".into());
    }
    if let Some(p) = set.last("pbkdf") {
        if !matches!(p, "pbkdf2" | "argon2i" | "argon2id") {
            return Err(
                "Password-based key derivation function (PBKDF) can be only pbkdf2 or \
                        argon2i/argon2id."
                    .into(),
            );
        }
    }
    if set.has("pbkdf-force-iterations") && set.has("iter-time") {
        return Err(
            "PBKDF forced iterations cannot be combined with iteration time option.".into(),
        );
    }
    if set.has("disable-keyring") && set.has("link-vk-to-keyring") {
        return Err("Cannot link volume key to a keyring when keyring is disabled.".into());
    }
    if set.has("disable-keyring") && (set.has("key-description") || set.has("new-key-description"))
    {
        return Err("Cannot use keyring key description when keyring is disabled.".into());
    }
    if set.has("integrity-inline") && !set.has("integrity") {
        return Err("Inline integrity must be used together with --integrity option.".into());
    }
    if set.has("keyslot-cipher") != set.has("keyslot-key-size") {
        return Err(
            "Options --keyslot-cipher and --keyslot-key-size must be used together.".into(),
        );
    }
    let key_slot_given = set.has("key-slot");
    let tcrypt_checks = || -> Result<(), String> {
        let tcrypt_opt =
            set.has("tcrypt-hidden") || set.has("tcrypt-system") || set.has("tcrypt-backup");
        if tcrypt_opt && !is("tcrypt") {
            return Err(
                "Option --tcrypt-hidden, --tcrypt-system or --tcrypt-backup is supported \
                        only for TCRYPT device."
                    .into(),
            );
        }
        if (set.has("veracrypt") || set.has("disable-veracrypt")) && !is("tcrypt") {
            return Err(
                "Option --veracrypt or --disable-veracrypt is supported only for TCRYPT \
                        device type."
                    .into(),
            );
        }
        if set.has("veracrypt-pim") && set.has("disable-veracrypt") {
            return Err(
                "Option --veracrypt-pim is supported only for VeraCrypt compatible devices.".into(),
            );
        }
        if set.has("veracrypt-query-pim") {
            if set.has("disable-veracrypt") {
                return Err(
                    "Option --veracrypt-query-pim is supported only for VeraCrypt \
                            compatible devices."
                        .into(),
                );
            }
            if set.has("veracrypt-pim") {
                return Err(
                    "The options --veracrypt-pim and --veracrypt-query-pim are mutually \
                            exclusive."
                        .into(),
                );
            }
        }
        Ok(())
    };
    match action {
        "open" => {
            let test_pass = set.has("test-passphrase");
            if set.has("persistent") && test_pass {
                return Err("Option --persistent is not allowed with --test-passphrase.".into());
            }
            if refresh && test_pass {
                return Err(
                    "Options --refresh and --test-passphrase are mutually exclusive.".into(),
                );
            }
            if set.has("shared") && !is_or_none("plain") {
                return Err("Option --shared is allowed only for open of plain device.".into());
            }
            if set.has("skip") && !is_or_none("plain") && !is("loopaes") {
                return Err(
                    "Option --skip is supported only for open of plain and loopaes devices.".into(),
                );
            }
            if set.has("offset") && !is_or_none("plain") && !is("loopaes") {
                return Err(
                    "Option --offset with open action is only supported for plain and \
                            loopaes devices."
                        .into(),
                );
            }
            if set.has("tcrypt-hidden") && set.has("allow-discards") {
                return Err(
                    "Option --tcrypt-hidden cannot be combined with --allow-discards.".into(),
                );
            }
            if set.has("sector-size") && !is("plain") {
                return Err(
                    "Sector size option with open action is supported only for plain devices."
                        .into(),
                );
            }
            let sector = set.last("sector-size").and_then(parse_u64).unwrap_or(0);
            if set.has("iv-large-sectors") && (!is("plain") || sector <= 512) {
                return Err(
                    "Large IV sectors option is supported only for opening plain type \
                            device with sector size larger than 512 bytes."
                        .into(),
                );
            }
            let passphrase_type = dt.is_some_and(|t| {
                t.starts_with("luks") || matches!(t, "tcrypt" | "bitlk" | "fvault2")
            });
            if test_pass && !passphrase_type {
                return Err(
                    "Option --test-passphrase is allowed only for open of LUKS, TCRYPT, \
                            BITLK and FVAULT2 devices."
                        .into(),
                );
            }
            if set.has("device-size") && set.has("size") {
                return Err("Options --device-size and --size cannot be combined.".into());
            }
            if set.has("unbound") && dt.is_some_and(|t| !t.starts_with("luks")) {
                return Err("Option --unbound is allowed only for open of luks device.".into());
            }
            if set.has("unbound") && !test_pass {
                return Err("Option --unbound cannot be used without --test-passphrase.".into());
            }
            if set.has("volume-key-keyring")
                && (set.has("hash") || set.has("volume-key-file"))
                && !is_or_none("plain")
            {
                return Err(
                    "Option --volume-key-keyring cannot be combined with --hash or \
                            --volume-key-file."
                        .into(),
                );
            }
            if set.count("volume-key-file") > 1 && set.count("key-size") < 2 {
                return Err(
                    "Both --volume-key-file options must be paired with respective \
                            --key-size options."
                        .into(),
                );
            }
            tcrypt_checks()?;
        }
        "tcryptDump" => tcrypt_checks()?,
        "close" if set.has("cancel-deferred") && set.has("deferred") => {
            return Err(
                "Options --cancel-deferred and --deferred cannot be used at the same time.".into(),
            );
        }
        "resize" if set.has("device-size") && set.has("size") => {
            return Err("Options --device-size and --size cannot be combined.".into());
        }
        "reencrypt" => {
            if is("luks1") && set.has("active-name") {
                return Err("Option --active-name can be set only for LUKS2 device.".into());
            }
            if set.has("active-name") && set.has("force-offline-reencrypt") {
                return Err(
                    "Options --active-name and --force-offline-reencrypt cannot be combined."
                        .into(),
                );
            }
            if set.has("new-volume-key-file") && set.has("keep-key") {
                return Err(
                    "Options --new-volume-key-file and --keep-key cannot be combined.".into(),
                );
            }
            if set.has("new-volume-key-keyring") && set.has("keep-key") {
                return Err(
                    "Options --new-volume-key-keyring and --keep-key cannot be combined.".into(),
                );
            }
        }
        "config" | "luksDump" => {
            let needs_slot = if action == "config" {
                set.has("priority")
            } else {
                set.has("unbound")
            };
            if needs_slot && !key_slot_given {
                return Err("Keyslot specification is required.".into());
            }
        }
        "luksFormat" => {
            if set.has("align-payload") && set.has("offset") {
                return Err("Options --align-payload and --offset cannot be combined.".into());
            }
            if set.has("integrity-no-wipe") && !set.has("integrity") {
                return Err(
                    "Option --integrity-no-wipe can be used only for format action with \
                            integrity extension."
                        .into(),
                );
            }
            if set.has("use-random") && set.has("use-urandom") {
                return Err("Only one of --use-[u]random options is allowed.".into());
            }
            if set.has("disable-sum") && !set.has("hw-opal") && !set.has("hw-opal-only") {
                return Err(
                    "Option --disable-sum must be used with --hw-opal or --hw-opal-only".into(),
                );
            }
        }
        "luksAddKey" => {
            let key_size = set.last("key-size").and_then(parse_u64).unwrap_or(0);
            if set.has("unbound") && key_size == 0 {
                return Err("Key size is required with --unbound option.".into());
            }
        }
        "token" => {
            let op = strings[positional[1]].as_str();
            if !matches!(op, "add" | "remove" | "import" | "export" | "unassign") {
                return Err("Invalid token action.".into());
            }
            if op == "add" && !set.has("key-description") {
                return Err(
                    "--key-description parameter is mandatory for token add action.".into(),
                );
            }
            if matches!(op, "remove" | "export") && !set.has("token-id") {
                return Err("Action requires specific token. Use --token-id parameter.".into());
            }
            if set.has("unbound") {
                if op != "add" {
                    return Err("Option --unbound is valid only with token add action.".into());
                }
                if key_slot_given {
                    return Err("Options --key-slot and --unbound cannot be combined.".into());
                }
            }
            if op == "unassign" && !key_slot_given {
                return Err("Action requires specific keyslot. Use --key-slot parameter.".into());
            }
            if op == "unassign" && !set.has("token-id") {
                return Err("Action requires specific token. Use --token-id parameter.".into());
            }
        }
        _ => {}
    }
    Ok(Checked {
        argv: rewrite(&root, args, &positional, word, alias_type),
    })
}

/// veritysetup and integritysetup take options before their action
/// (`veritysetup --hash-offset N format ...`), which cryptblk runs as `cryptblk verity
/// --hash-offset N format ...`: the options between a group (`verity`, `integrity`, `dm`)
/// and its inner action move after the inner action, where clap looks for them.
fn group_options_after_action(
    root: &clap::Command,
    args: Vec<OsString>,
    positional: &[usize],
) -> Vec<OsString> {
    let (Some(&group), Some(&inner)) = (positional.first(), positional.get(1)) else {
        return args;
    };
    let is_group = root
        .find_subcommand(args[group].to_string_lossy().as_ref())
        .is_some_and(|g| g.has_subcommands());
    if !is_group || inner == group + 1 {
        return args;
    }
    let mut out: Vec<OsString> = args[..=group].to_vec();
    out.push(args[inner].clone());
    out.extend(args[group + 1..inner].iter().cloned());
    out.extend(args[inner + 1..].iter().cloned());
    out
}

/// Brings cryptsetup's spellings to cryptblk's grammar: action aliases become the action
/// they stand for (with their `--type`), and positionals beyond what cryptblk's action takes
/// are dropped as cryptsetup ignores them.
fn rewrite(
    root: &clap::Command,
    mut args: Vec<OsString>,
    positional: &[usize],
    word: &str,
    alias_type: Option<&str>,
) -> Vec<OsString> {
    let action_at = positional[0];
    let mut operands: Vec<usize> = positional[1..].to_vec();
    let mut target = word.to_string();
    if alias(word).is_some() && root.find_subcommand(word).is_none() {
        // luksOpen, luksClose and luksErase are clap aliases already.
        target = alias(word).map_or(word, |(to, _)| to).to_string();
    }
    if word == "create" && operands.len() >= 2 {
        // `create NAME DEVICE`: cryptsetup's historical order, the other way round.
        args.swap(operands[0], operands[1]);
    }
    let mut drop = Vec::new();
    if word == "refresh" && operands.len() >= 2 {
        // `refresh DEVICE NAME`: cryptsetup's refresh reads the name from the second.
        drop.push(operands.remove(0));
    }
    let capacity = root
        .find_subcommand(&target)
        .map(|s| {
            let mut n = 0usize;
            for a in s.get_positionals() {
                if a.get_num_args().is_some_and(|r| r.max_values() > 1) {
                    return usize::MAX;
                }
                n += 1;
            }
            n
        })
        .unwrap_or(usize::MAX);
    drop.extend(operands.iter().skip(capacity));
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut typed = false;
    for (i, a) in args.into_iter().enumerate() {
        if drop.contains(&i) {
            continue;
        }
        if i == action_at {
            out.push(OsString::from(&target));
            continue;
        }
        if a == "--" && !typed {
            if let (Some(t), true) = (alias_type, target != word) {
                out.push("--type".into());
                out.push(t.into());
                typed = true;
            }
        }
        out.push(a);
    }
    if let (Some(t), false, true) = (alias_type, typed, target != word) {
        out.push("--type".into());
        out.push(t.into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Result<Vec<String>, String> {
        let args: Vec<OsString> = std::iter::once("cryptblk")
            .chain(line.split_whitespace())
            .map(OsString::from)
            .collect();
        check(args).map(|c| {
            c.argv
                .into_iter()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn sizes_read_as_cryptsetup_reads_them() {
        assert_eq!(parse_size("64m"), Some(64 << 20));
        assert_eq!(parse_size("1024S"), Some(1024 * 512));
        assert_eq!(parse_size("2MB"), Some(2_000_000));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("-64m"), None);
        assert_eq!(parse_size("1x"), None);
    }

    #[test]
    fn aliases_and_extra_operands_become_cryptblk_grammar() {
        assert_eq!(
            run("create NAME DEV").unwrap(),
            ["open", "DEV", "NAME", "--type", "plain"]
        );
        assert_eq!(run("refresh DEV NAME").unwrap(), ["refresh", "NAME"]);
        assert_eq!(run("tcryptDump DEV NAME").unwrap(), ["tcryptDump", "DEV"]);
        assert_eq!(run("remove NAME").unwrap(), ["close", "NAME"]);
        assert_eq!(
            run("luksOpen DEV NAME").unwrap(),
            ["luksOpen", "DEV", "NAME"]
        );
    }

    #[test]
    fn refusals_carry_cryptsetup_messages() {
        assert_eq!(
            run("open DEV NAME --key-size 31").unwrap_err(),
            "Key size must be a multiple of 8 bits"
        );
        assert_eq!(
            run("open DEV NAME --integrity hmac-sha256").unwrap_err(),
            "Option --integrity is not allowed with open action."
        );
        assert_eq!(
            run("luksKillSlot DEV").unwrap_err(),
            "luksKillSlot: requires <device> <key slot> as arguments"
        );
        assert!(run("luksFormat DEV -S-2").is_err());
        assert!(run("luksFormat DEV -S 2").is_ok());
        // cryptblk's own actions are left to clap, options before a group's action moved.
        assert_eq!(
            run("verity --data-blocks 3 --hash-offset=8 format a b").unwrap(),
            [
                "verity",
                "format",
                "--data-blocks",
                "3",
                "--hash-offset=8",
                "a",
                "b"
            ]
        );
    }
}
