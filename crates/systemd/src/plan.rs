//! What a crypttab line asks of cryptblk: the export, the `cryptblk open` options its
//! crypttab options map to, how the key is obtained, and the ordering facts the unit needs.
//!
//! Honoured options (crypttab(5) name -> `cryptblk open` option):
//! `x-cryptblk.export=ublk|nbd:SOCKET|vhost-user:SOCKET|fuse:DIR` -> `--ublk`, `--nbd`,
//! `--vhost-user`, `--fuse`; `luks` `plain` `tcrypt` `bitlk` -> `--type`; `cipher=`
//! `size=` `hash=` `offset=` `skip=` `sector-size=` -> `--cipher` `--key-size` `--hash`
//! `--offset` `--skip` `--sector-size`; `keyfile-offset=` `keyfile-size=` (with a key file
//! only) `key-slot=` -> `--keyfile-offset` `--keyfile-size` `--key-slot`; `discard` -> `--allow-discards`;
//! `readonly`/`read-only` -> `--readonly`; `header=` -> `--header`; `no-read-workqueue`
//! `no-write-workqueue` `same-cpu-crypt` `submit-from-crypt-cpus` -> the `--perf-*` flags;
//! `token-timeout=` -> `--token-timeout` (whole seconds, rounded up; 0 no limit);
//! `tpm2-device=` -> `--tpm2-device` (`auto`: cryptblk's default device);
//! `tcrypt-hidden` `tcrypt-system` `tcrypt-veracrypt` `veracrypt-pim=` `tcrypt-keyfile=` ->
//! the TCRYPT options (`--key-file` for each `tcrypt-keyfile=`; a TCRYPT line's own key
//! file holds the passphrase, as for systemd). Ordering: `_netdev`, `nofail`, `noauto`, `x-systemd.device-timeout=`;
//! key asking: `tries=`, `headless=`. Every other option is warned about once and ignored.

use crate::crypttab::Entry;
use crate::escape;

/// How the volume is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Export {
    /// `/dev/ublkbN`.
    Ublk,
    /// NBD on this socket (or `HOST:PORT`).
    Nbd(String),
    /// vhost-user-blk on this socket.
    VhostUser(String),
    /// A FUSE mount at this directory.
    Fuse(String),
}

impl Export {
    /// The `cryptblk open` options for this export.
    pub fn args(&self) -> Vec<String> {
        match self {
            Export::Ublk => vec!["--ublk".into()],
            Export::Nbd(s) => vec!["--nbd".into(), s.clone()],
            Export::VhostUser(s) => vec!["--vhost-user".into(), s.clone()],
            Export::Fuse(d) => vec!["--fuse".into(), d.clone()],
        }
    }

    /// Whether a served volume outlives a restart of its daemon (the unit restarts it):
    /// every export but FUSE, whose mount dies with its process.
    pub fn survives_restart(&self) -> bool {
        !matches!(self, Export::Fuse(_))
    }

    /// A short name for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Export::Ublk => "ublk",
            Export::Nbd(_) => "NBD",
            Export::VhostUser(_) => "vhost-user",
            Export::Fuse(_) => "FUSE",
        }
    }
}

/// Where the encrypted data is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// A device node under `/dev` (a tag is resolved to its `/dev/disk/by-*` node): the
    /// unit binds to its `.device` unit.
    Node(String),
    /// A file (an image): the unit needs the mounts of its path.
    File(String),
    /// Anything else cryptblk opens (`rbd:pool/image`, an NBD URI): over the network.
    Remote(String),
}

impl Device {
    /// What `cryptblk open` is given.
    pub fn path(&self) -> &str {
        match self {
            Device::Node(p) | Device::File(p) | Device::Remote(p) => p,
        }
    }
}

/// Everything the unit of one crypttab line needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// The crypttab line number.
    pub line: usize,
    /// Volume (mapping) name.
    pub name: String,
    /// The encrypted device.
    pub device: Device,
    /// The key file; None: key files in `/etc/cryptsetup-keys.d`, tokens, then ask.
    pub key_file: Option<String>,
    /// The export.
    pub export: Export,
    /// `cryptblk open` options (before the key options and the positional arguments).
    pub args: Vec<String>,
    /// `_netdev` (or a remote device): ordered after the network, pulled by
    /// `remote-cryptsetup.target`.
    pub netdev: bool,
    /// `nofail`: wanted, not required, by its target, and not ordered before it.
    pub nofail: bool,
    /// `noauto`: not pulled in by any target.
    pub noauto: bool,
    /// `x-systemd.device-timeout=` as written (checked to be a time span).
    pub device_timeout: Option<String>,
    /// `tries=` (0: ask forever); default 3, as systemd.
    pub tries: u32,
    /// `headless=`: never ask for a passphrase.
    pub headless: bool,
    /// LUKS (or no type given): the header's tokens are tried before asking, and an asked
    /// passphrase is given as `--key-file -` (exact bytes). Other types read an asked
    /// passphrase as a passphrase (to the newline), which is what `plain` hashes and what
    /// TCRYPT takes apart from its key files.
    pub tokens: bool,
    /// `keyfile-offset=`/`keyfile-size=` as `cryptblk open` options: they apply to the key
    /// file only (not to an asked passphrase).
    pub key_args: Vec<String>,
    /// TCRYPT with a key file: systemd reads the passphrase from that file (key files proper
    /// are `tcrypt-keyfile=`), so the unit gives it as standard input, not `--key-file`.
    pub passphrase_file: Option<String>,
    /// `header=`: a detached header file.
    pub header: Option<String>,
    /// `x-systemd.after=`, `before=`, `wants=`, `requires=` as fstab(5) takes them: unit
    /// settings (`After`, `Before`, `Wants`, `Requires`, `RequiresMountsFor`) and values,
    /// in line order.
    pub deps: Vec<(&'static str, String)>,
}

/// The volume of crypttab line `e`, or None when the line does not carry
/// `x-cryptblk.export=` (it stays systemd-cryptsetup's). `warn` receives one line for each
/// option that is ignored. An Err is one message: the line is skipped.
pub fn plan(e: &Entry, warn: &mut dyn FnMut(String)) -> Result<Option<Volume>, String> {
    let Some(export) = e.options.iter().find(|o| o.name == "x-cryptblk.export") else {
        return Ok(None);
    };
    let export = parse_export(export.value.as_deref().unwrap_or(""))?;
    check_name(&e.name)?;
    let device = parse_device(&e.device)?;
    let mut v = Volume {
        line: e.line,
        name: e.name.clone(),
        netdev: matches!(device, Device::Remote(_)),
        device,
        key_file: e.key_file.clone(),
        export,
        args: Vec::new(),
        nofail: false,
        noauto: false,
        device_timeout: None,
        tries: 3,
        headless: false,
        tokens: true,
        key_args: Vec::new(),
        passphrase_file: None,
        header: None,
        deps: Vec::new(),
    };
    if let Some(k) = &v.key_file {
        if !k.starts_with('/') {
            return Err(format!(
                "key file '{k}' is not an absolute path (a KEYFILE:DEVICE key is not supported)"
            ));
        }
    }
    let mut ty: Option<&str> = None;
    for o in &e.options {
        let val = o.value.as_deref();
        let need = |what: &str| -> Result<String, String> {
            match val {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(format!("option {} needs a {what}", o.name)),
            }
        };
        let number = |what: &str| -> Result<String, String> {
            let v = need(what)?;
            v.parse::<u64>()
                .map(|n| n.to_string())
                .map_err(|_| format!("option {}={v}: not a number", o.name))
        };
        let mut key_arg = |flag: &str, value: String| {
            v.key_args.push(flag.to_string());
            v.key_args.push(value);
        };
        let mut arg = |flag: &str, value: Option<String>| {
            v.args.push(flag.to_string());
            v.args.extend(value);
        };
        match o.name.as_str() {
            "x-cryptblk.export" => {}
            "luks" | "plain" | "tcrypt" | "bitlk" => {
                if let Some(t) = ty {
                    if t != o.name {
                        return Err(format!("volume types {t} and {} both given", o.name));
                    }
                }
                ty = Some(match o.name.as_str() {
                    "luks" => "luks",
                    "plain" => "plain",
                    "tcrypt" => "tcrypt",
                    _ => "bitlk",
                });
            }
            "cipher" => arg("--cipher", Some(need("cipher")?)),
            "size" => arg("--key-size", Some(number("key size in bits")?)),
            "hash" => arg("--hash", Some(need("hash")?)),
            "offset" => arg("--offset", Some(number("sector count")?)),
            "skip" => arg("--skip", Some(number("sector count")?)),
            "sector-size" => arg("--sector-size", Some(number("size in bytes")?)),
            "keyfile-offset" => key_arg("--keyfile-offset", number("byte count")?),
            "keyfile-size" => key_arg("--keyfile-size", number("byte count")?),
            "key-slot" | "keyslot" => arg("--key-slot", Some(number("keyslot number")?)),
            "discard" => arg("--allow-discards", None),
            "readonly" | "read-only" => arg("--readonly", None),
            "same-cpu-crypt" => arg("--perf-same_cpu_crypt", None),
            "submit-from-crypt-cpus" => arg("--perf-submit_from_crypt_cpus", None),
            "no-read-workqueue" => arg("--perf-no_read_workqueue", None),
            "no-write-workqueue" => arg("--perf-no_write_workqueue", None),
            "header" => {
                let h = need("path")?;
                if !h.starts_with('/') {
                    return Err(format!(
                        "header '{h}' is not an absolute path (HEADER:DEVICE is not supported)"
                    ));
                }
                arg("--header", Some(h.clone()));
                v.header = Some(h);
            }
            "token-timeout" => {
                let secs = crate::timespan::parse_seconds(&need("time span")?)
                    .map_err(|m| format!("option token-timeout: {m}"))?;
                let secs = secs.map_or(0, |s| s.ceil() as u64);
                arg("--token-timeout", Some(secs.to_string()));
            }
            "tpm2-device" => {
                let d = need("device")?;
                if d != "auto" {
                    arg("--tpm2-device", Some(d));
                }
            }
            "tcrypt-hidden" => arg("--tcrypt-hidden", None),
            "tcrypt-system" => arg("--tcrypt-system", None),
            "tcrypt-veracrypt" => arg("--veracrypt", None),
            "veracrypt-pim" => arg("--veracrypt-pim", Some(number("PIM")?)),
            "tcrypt-keyfile" => {
                let k = need("path")?;
                if !k.starts_with('/') {
                    return Err(format!("tcrypt-keyfile '{k}' is not an absolute path"));
                }
                arg("--key-file", Some(k));
            }
            "tries" => {
                v.tries = number("count")?
                    .parse()
                    .map_err(|_| "option tries: too large".to_string())?
            }
            "headless" => v.headless = parse_bool(val.unwrap_or("yes"))?,
            "_netdev" => v.netdev = true,
            "nofail" => v.nofail = true,
            "noauto" => v.noauto = true,
            "auto" => v.noauto = false,
            "x-systemd.device-timeout" => {
                let t = need("time span")?;
                crate::timespan::parse_seconds(&t)
                    .map_err(|m| format!("option x-systemd.device-timeout: {m}"))?;
                v.device_timeout = Some(t);
            }
            "x-systemd.after" | "x-systemd.before" | "x-systemd.wants" | "x-systemd.requires" => {
                let u = need("unit")?;
                if u.is_empty() || u.contains(char::is_whitespace) || u.contains(['"', '\\']) {
                    return Err(format!("option {}: '{u}' is not a unit name", o.name));
                }
                let path = u.starts_with('/');
                let setting = match (o.name.as_str(), path) {
                    // As fstab: an absolute path is the mount point it needs.
                    ("x-systemd.requires", true) => "RequiresMountsFor",
                    ("x-systemd.requires", false) => "Requires",
                    (_, true) => {
                        return Err(format!("option {}: '{u}' is a path, not a unit", o.name))
                    }
                    ("x-systemd.after", _) => "After",
                    ("x-systemd.before", _) => "Before",
                    _ => "Wants",
                };
                if setting == "Requires" {
                    // fstab's x-systemd.requires= orders after the unit too.
                    v.deps.push(("After", u.clone()));
                }
                v.deps.push((setting, u));
            }
            other => warn(format!(
                "option '{other}' is not supported by cryptblk and is ignored"
            )),
        }
    }
    if let Some(t) = ty {
        v.args.splice(0..0, ["--type".to_string(), t.to_string()]);
        v.tokens = t == "luks";
        if t == "tcrypt" {
            v.passphrase_file = v.key_file.take();
        }
    }
    if v.key_file.is_none() && !v.key_args.is_empty() {
        warn(
            "keyfile-offset=/keyfile-size= apply to a key file, and this line has none: \
              ignored"
                .to_string(),
        );
        v.key_args.clear();
    }
    if v.device_timeout.is_some() && !matches!(v.device, Device::Node(_)) {
        warn(format!(
            "x-systemd.device-timeout= ignored: {} is not a device node",
            v.device.path()
        ));
        v.device_timeout = None;
    }
    Ok(Some(v))
}

/// `x-cryptblk.export=` values.
fn parse_export(s: &str) -> Result<Export, String> {
    let (kind, arg) = match s.split_once(':') {
        Some((k, a)) => (k, Some(a)),
        None => (s, None),
    };
    let path = |what: &str| -> Result<String, String> {
        match arg {
            Some(a) if !a.is_empty() => Ok(a.to_string()),
            _ => Err(format!(
                "x-cryptblk.export={kind} needs a {what}: {kind}:PATH"
            )),
        }
    };
    let absolute = |p: String| -> Result<String, String> {
        if p.starts_with('/') {
            Ok(p)
        } else {
            Err(format!(
                "x-cryptblk.export={s}: '{p}' is not an absolute path"
            ))
        }
    };
    match kind {
        "ublk" if arg.is_none() => Ok(Export::Ublk),
        "nbd" => Ok(Export::Nbd(path("socket path or HOST:PORT")?)),
        "vhost-user" => Ok(Export::VhostUser(absolute(path("socket path")?)?)),
        "fuse" => Ok(Export::Fuse(absolute(path("directory")?)?)),
        _ => Err(format!(
            "x-cryptblk.export={s}: expected ublk, nbd:PATH, vhost-user:PATH or fuse:DIR"
        )),
    }
}

/// The device field: a tag becomes its udev node.
fn parse_device(s: &str) -> Result<Device, String> {
    if let Some(node) = escape::tag_node(s) {
        return Ok(Device::Node(node));
    }
    if s.starts_with("/dev/") {
        escape::escape_path(s)?;
        return Ok(Device::Node(s.to_string()));
    }
    if s.starts_with('/') {
        escape::escape_path(s)?;
        return Ok(Device::File(s.to_string()));
    }
    if s.contains(':') && !s.contains('=') {
        return Ok(Device::Remote(s.to_string()));
    }
    Err(format!(
        "device '{s}' is not a path, UUID=, PARTUUID=, LABEL=, PARTLABEL= or a remote image"
    ))
}

/// Volume names cryptblk accepts (no `/`, not `.`/`..`, no control characters).
fn check_name(n: &str) -> Result<(), String> {
    if n.is_empty()
        || n == "."
        || n == ".."
        || n.contains('/')
        || n.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(format!("'{n}' is not a usable volume name"));
    }
    Ok(())
}

/// systemd's booleans.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "yes" | "y" | "true" | "t" | "on" => Ok(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Ok(false),
        _ => Err(format!("'{s}' is not a boolean")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypttab::parse;

    fn one(line: &str) -> (Result<Option<Volume>, String>, Vec<String>) {
        let (e, bad) = parse(line);
        assert!(bad.is_empty(), "{bad:?}");
        let mut w = Vec::new();
        let v = plan(&e[0], &mut |m| w.push(m));
        (v, w)
    }

    #[test]
    fn lines_without_the_export_option_stay_systemds() {
        assert_eq!(one("data /dev/sda2 none luks,discard").0, Ok(None));
    }

    #[test]
    fn options_map_to_cryptblk_open_arguments() {
        let (v, w) = one(
            "data UUID=ab-12 /etc/k luks,x-cryptblk.export=nbd:/run/d.sock,keyfile-offset=4,\
             keyfile-size=32,discard,read-only,header=/etc/h.img,no-read-workqueue,\
             no-write-workqueue,token-timeout=1min,tpm2-device=/dev/tpmrm0,tries=5,\
             headless=true,nofail,x-systemd.device-timeout=10s",
        );
        assert!(w.is_empty(), "{w:?}");
        let v = v.unwrap().unwrap();
        assert_eq!(v.device, Device::Node("/dev/disk/by-uuid/ab-12".into()));
        assert_eq!(v.export, Export::Nbd("/run/d.sock".into()));
        assert_eq!(
            v.args,
            [
                "--type",
                "luks",
                "--allow-discards",
                "--readonly",
                "--header",
                "/etc/h.img",
                "--perf-no_read_workqueue",
                "--perf-no_write_workqueue",
                "--token-timeout",
                "60",
                "--tpm2-device",
                "/dev/tpmrm0",
            ]
        );
        assert_eq!(
            v.key_args,
            ["--keyfile-offset", "4", "--keyfile-size", "32"]
        );
        assert_eq!(v.tries, 5);
        assert!(v.headless && v.nofail && v.tokens && !v.noauto && !v.netdev);
        assert_eq!(v.device_timeout.as_deref(), Some("10s"));
    }

    #[test]
    fn plain_options_and_no_tokens_for_plain() {
        let (v, _) = one(
            "p /srv/p.img - plain,cipher=aes-cbc-essiv:sha256,size=256,hash=sha512,offset=8,\
             skip=16,x-cryptblk.export=ublk",
        );
        let v = v.unwrap().unwrap();
        assert_eq!(v.device, Device::File("/srv/p.img".into()));
        assert!(!v.tokens);
        assert_eq!(
            v.args,
            [
                "--type",
                "plain",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
                "--hash",
                "sha512",
                "--offset",
                "8",
                "--skip",
                "16"
            ]
        );
    }

    #[test]
    fn key_file_options_need_a_key_file_and_tcrypt_key_files_hold_the_passphrase() {
        let (v, w) = one("a /dev/a none x-cryptblk.export=ublk,keyfile-size=8");
        assert!(v.unwrap().unwrap().key_args.is_empty());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("keyfile-offset=/keyfile-size="), "{w:?}");
        let (v, w) = one(
            "t /dev/t /etc/tc.pass tcrypt,tcrypt-keyfile=/etc/kf1,tcrypt-keyfile=/etc/kf2,\
             x-cryptblk.export=ublk",
        );
        assert!(w.is_empty(), "{w:?}");
        let v = v.unwrap().unwrap();
        assert_eq!(v.key_file, None);
        assert_eq!(v.passphrase_file.as_deref(), Some("/etc/tc.pass"));
        assert_eq!(
            v.args,
            [
                "--type",
                "tcrypt",
                "--key-file",
                "/etc/kf1",
                "--key-file",
                "/etc/kf2"
            ]
        );
        assert!(!v.tokens);
    }

    #[test]
    fn unsupported_options_warn_once_each() {
        let (v, w) = one("s /dev/sdc none x-cryptblk.export=ublk,swap,fido2-device=auto,_netdev");
        let v = v.unwrap().unwrap();
        assert!(v.netdev);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("'swap'"), "{w:?}");
        assert!(w[1].contains("'fido2-device'"), "{w:?}");
    }

    #[test]
    fn bad_values_are_one_error() {
        for line in [
            "a /dev/a - x-cryptblk.export=nbd",
            "a /dev/a - x-cryptblk.export=fuse:rel/dir",
            "a /dev/a - x-cryptblk.export=iscsi",
            "a /dev/a - x-cryptblk.export=ublk,keyfile-offset=x",
            "a /dev/a - x-cryptblk.export=ublk,tries",
            "a /dev/a - x-cryptblk.export=ublk,x-systemd.device-timeout=soon",
            "a /dev/a relative.key x-cryptblk.export=ublk",
            "a /dev/a - x-cryptblk.export=ublk,luks,plain",
            "a/b /dev/a - x-cryptblk.export=ublk",
            "a NOPE=1 - x-cryptblk.export=ublk",
        ] {
            let (v, _) = one(line);
            let err = v.expect_err(line);
            assert!(!err.is_empty() && !err.contains('\n'), "{line}: {err}");
        }
    }
}
