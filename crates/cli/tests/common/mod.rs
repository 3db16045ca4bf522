//! Shared helpers for the CLI's integration tests: run cryptblk and the real tools it must
//! agree with, in throw-away directories.
#![allow(dead_code)]

pub mod memory;
pub mod reenc;
pub mod sweep;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// PBKDF arguments that keep test formats fast (cryptsetup and cryptblk both take them).
pub const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// The cryptblk binary under test.
pub fn cryptblk() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cryptblk"));
    c.env("CRYPTBLK_RUNTIME_DIR", runtime_dir());
    c
}

/// A runtime directory private to this test process, so parallel tests and a user's own
/// volumes never see each other's daemons.
/// The directory is removed when the test process exits.
pub fn runtime_dir() -> PathBuf {
    static CLEANUP: std::sync::Once = std::sync::Once::new();
    let d = runtime_dir_path();
    std::fs::create_dir_all(&d).unwrap();
    CLEANUP.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe { libc::atexit(remove_runtime_dir) };
    });
    d
}

fn runtime_dir_path() -> PathBuf {
    std::env::temp_dir().join(format!("cryptblk-test-rt-{}", std::process::id()))
}

/// Runs at exit of the test harness: the daemons the tests started are closed by then, so
/// what is left are stale sockets and logs.
extern "C" fn remove_runtime_dir() {
    let _ = std::fs::remove_dir_all(runtime_dir_path());
}

/// A tool from PATH that the test needs; panics with a clear message when missing unless
/// CRYPTBLK_SKIP_<TOOL>=1 asks to skip, in which case `None`.
pub fn tool(name: &str) -> Option<Command> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
        || Path::new("/usr/sbin").join(name).is_file();
    if found {
        return Some(Command::new(name));
    }
    let skip_var = format!(
        "CRYPTBLK_SKIP_{}",
        name.to_ascii_uppercase().replace(['-', '.'], "_")
    );
    if std::env::var(&skip_var).as_deref() == Ok("1") {
        eprintln!("skipping: {name} not installed and {skip_var}=1");
        return None;
    }
    panic!("{name} is required by this test (run scripts/install-deps.sh, or set {skip_var}=1 to skip)");
}

/// cryptsetup, non-interactive.
pub fn cryptsetup() -> Option<Command> {
    tool("cryptsetup").map(|mut c| {
        c.arg("--batch-mode");
        c
    })
}

/// Runs `cmd` with `stdin` as input and returns its output (never panics on failure status).
pub fn run(cmd: &mut Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `cmd` and panics with its stderr unless it exits 0; returns stdout.
pub fn run_ok(cmd: &mut Command, stdin: &[u8]) -> String {
    let desc = format!("{cmd:?}");
    let out = run(cmd, stdin);
    assert!(
        out.status.success(),
        "{desc} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A temporary directory removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Writes `len` bytes of deterministic pseudo-random data derived from `seed` to `path`.
pub fn write_pattern(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(path, &data).unwrap();
    data
}

/// Creates a sparse file of `len` bytes.
pub fn sparse_file(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// The volume key cryptsetup reports for a LUKS volume, as lower-case hex.
pub fn cryptsetup_volume_key(dev: &Path, key_file: &Path, extra: &[&str]) -> Option<String> {
    let mut c = cryptsetup()?;
    c.args(["luksDump", "--dump-volume-key", "--key-file"])
        .arg(key_file)
        .args(extra)
        .arg(dev);
    let out = run_ok(&mut c, b"");
    parse_volume_key(&out)
}

/// Extracts the hex volume key from `luksDump --dump-volume-key` output (cryptsetup's or
/// cryptblk's: both print "MK dump:" or "Volume key:" followed by hex bytes over lines).
pub fn parse_volume_key(dump: &str) -> Option<String> {
    let start = dump.find("MK dump:").or_else(|| dump.find("Volume key:"))?;
    let rest = &dump[start..];
    let rest = &rest[rest.find(':')? + 1..];
    let mut hex = String::new();
    for line in rest.lines() {
        let t = line.trim();
        if !t.is_empty()
            && !t
                .split_whitespace()
                .all(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        {
            break;
        }
        hex.extend(t.split_whitespace());
    }
    Some(hex.to_ascii_lowercase())
}

/// Path of the independent pyca/cryptography model of dm-crypt.
pub fn independent_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/independent/dmcrypt.py")
}

/// Decrypts (or encrypts) `input` with the independent model and returns the result.
pub fn independent(
    direction: &str,
    cipher: &str,
    key_hex: &str,
    sector_size: u32,
    input: &[u8],
) -> Vec<u8> {
    let out = run(
        Command::new("python3")
            .arg(independent_model())
            .arg(direction)
            .args(["--cipher", cipher, "--key", key_hex])
            .args(["--sector-size", &sector_size.to_string()])
            .args(["-", "-"]),
        input,
    );
    assert!(
        out.status.success(),
        "independent model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// (data offset in bytes, encryption sector size) of a LUKS2 volume's data segment, as
/// cryptsetup's luksDump reports them (cryptsetup picks 4096-byte sectors by itself for image
/// files, so tests must not assume 512).
pub fn cryptsetup_luks2_segment(img: &Path) -> Option<(usize, u32)> {
    let mut c = cryptsetup()?;
    let dump = run_ok(c.arg("luksDump").arg(img), b"");
    let field = |name: &str| -> u64 {
        let line = dump
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in luksDump:\n{dump}"));
        line[name.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    Some((field("offset:") as usize, field("sector:") as u32))
}

/// Starts `cmd` with stdout and stderr captured, for commands that run while a test acts.
pub fn spawn_captured(cmd: &mut Command) -> std::process::Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// The NBD URI of an export on Unix socket `sock`.
pub fn nbd_uri(sock: &Path) -> String {
    format!("nbd+unix:///?socket={}", sock.display())
}

/// A mapping served by a `cryptblk` daemon, closed when dropped so that a failing test
/// leaves no daemon behind.
pub struct Served {
    close: &'static [&'static str],
    name: String,
}

impl Served {
    /// A mapping closed with `cryptblk close NAME`.
    pub fn volume(name: impl Into<String>) -> Self {
        Served {
            close: &["close"],
            name: name.into(),
        }
    }

    /// A mapping closed with `cryptblk integrity close NAME`.
    pub fn integrity(name: impl Into<String>) -> Self {
        Served {
            close: &["integrity", "close"],
            name: name.into(),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = run(cryptblk().args(self.close).arg(&self.name), b"");
    }
}

/// `cryptblk open --key-file KEY EXTRA.. IMG NAME --nbd SOCK`, checked to succeed.
pub fn open_nbd(img: &Path, key: &Path, name: &str, sock: &Path, extra: &[&str]) -> Served {
    run_ok(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(key)
            .args(extra)
            .arg(img)
            .arg(name)
            .arg("--nbd")
            .arg(sock),
        b"",
    );
    Served::volume(name)
}

/// `cryptblk luksFormat --type luks2 -q -c CIPHER --integrity INTEGRITY`, for the caller to
/// add sizes, key and device.
pub fn luks_format_integrity(cipher: &str, integrity: &str) -> Command {
    let mut c = cryptblk();
    c.args([
        "luksFormat",
        "--type",
        "luks2",
        "-q",
        "-c",
        cipher,
        "--integrity",
        integrity,
    ]);
    c
}

/// `xz -dc SRC` written to `dst`, checked to succeed.
pub fn unxz(src: &Path, dst: &Path) {
    let out = Command::new("xz").arg("-dc").arg(src).output().unwrap();
    assert!(out.status.success(), "xz -dc {}", src.display());
    std::fs::write(dst, out.stdout).unwrap();
}

/// A kernel-lab run of the guest `script`: tests/lab/vm.sh, the lab's run-in-vm.sh (it
/// finds `LAB_DIR` or ../shared/lab) that boots again when the guest kernel dies before the
/// script prints anything. Callers add LAB_SHARE and the other settings.
pub fn lab_vm(script: &Path) -> Command {
    let mut cmd = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/lab/vm.sh"
    ));
    cmd.arg(script);
    cmd
}

/// The pattern the lab wrote into the dm fixtures (xorshift64 from 0x5eed, 256 KiB).
pub fn lab_pattern() -> Vec<u8> {
    let mut x: u64 = 0x5eed;
    let mut v = Vec::new();
    while v.len() < 256 << 10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// `cryptblk integrity open ARGS.. IMG NAME --nbd SOCK`, checked to succeed.
pub fn integrity_open_nbd(img: &Path, name: &str, sock: &Path, args: &[&str]) -> Served {
    run_ok(
        cryptblk()
            .args(["integrity", "open"])
            .args(args)
            .arg(img)
            .arg(name)
            .arg("--nbd")
            .arg(sock),
        b"",
    );
    Served::integrity(name)
}

/// One `qemu-io -f raw -c CMD` against the export: (exit status success, stdout + stderr).
pub fn qemu_io_nbd(sock: &Path, cmd: &str) -> (bool, String) {
    let out = run(
        Command::new("qemu-io")
            .args(["-f", "raw", "-c", cmd])
            .arg(nbd_uri(sock)),
        b"",
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `integritysetup dump` (or cryptblk's) as field -> value.
pub fn dump_fields(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// True when the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `chown` of `p` to `uid` (and `gid` when given).
pub fn chown(p: &Path, uid: u32, gid: Option<u32>) {
    std::os::unix::fs::chown(p, Some(uid), gid).unwrap();
}

/// Runs `cmd ARGS..`, checked to succeed; returns stdout.
pub fn sh(cmd: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new(cmd);
    for a in args {
        c.arg(a);
    }
    run_ok(&mut c, b"")
}

/// The exit code of `out` (-1 when a signal ended the process).
pub fn exit_code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// Runs `cmd` without input: (exit code, stderr).
pub fn code(cmd: &mut Command) -> (i32, String) {
    let out = run(cmd, b"");
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// cryptsetup's `<kind>-images.tar.xz` (from `$CRYPTBLK_CRYPTSETUP_TESTS`, else
/// ../shared/cryptsetup-tests) unpacked, sparse, into `dir`.
pub fn unpack_cryptsetup_images(kind: &str, dir: &Path) {
    let src = match std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/cryptsetup-tests"
        )),
    };
    run_ok(
        Command::new("tar")
            .arg("xJSf")
            .arg(src.join(format!("{kind}-images.tar.xz")))
            .arg("-C")
            .arg(dir),
        b"",
    );
}

/// The sha256 of a file, by coreutils.
pub fn sha256(p: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(p), b"");
    out.split_whitespace().next().unwrap().to_string()
}

/// Writes `contents` to `dir/name` (a key file, a table...) and returns its path.
pub fn write_file(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

/// `cryptblk status --json NAME`, parsed.
pub fn status(name: &str) -> serde_json::Value {
    let out = run_ok(cryptblk().args(["status", "--json", name]), b"");
    serde_json::from_str(&out).unwrap()
}

/// A sparse `len`-byte `img` formatted LUKS2 by cryptsetup with key file `key` and the
/// [`FAST`] PBKDF; `None` when cryptsetup is missing and skipping was asked.
pub fn cryptsetup_luks2(img: &Path, key: &Path, len: u64) -> Option<()> {
    let mut c = cryptsetup()?;
    sparse_file(img, len);
    run_ok(
        c.args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(key)
            .arg(img),
        b"",
    );
    Some(())
}

/// `luksFormat --type luks1 --pbkdf-force-iterations 1000 --key-file KEY IMG` added to
/// `c` (cryptsetup's; 1000 iterations keep it fast).
pub fn luks1_format<'a>(c: &'a mut Command, img: &Path, key: &Path) -> &'a mut Command {
    c.args([
        "luksFormat",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
    ])
    .arg("--key-file")
    .arg(key)
    .arg(img)
}

/// A sparse `len`-byte `img` formatted LUKS1 by cryptsetup with key file `key` and 1000
/// PBKDF2 iterations; `None` when cryptsetup is missing and skipping was asked.
pub fn cryptsetup_luks1(img: &Path, key: &Path, len: u64) -> Option<()> {
    let mut c = cryptsetup()?;
    sparse_file(img, len);
    run_ok(luks1_format(&mut c, img, key), b"");
    Some(())
}

/// A sparse `len`-byte `img` formatted LUKS2 by cryptblk with key file `key` and the
/// [`FAST`] PBKDF.
pub fn cryptblk_luks2(img: &Path, key: &Path, len: u64) {
    sparse_file(img, len);
    run_ok(
        cryptblk()
            .args(["luksFormat", "-q", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(key)
            .arg(img),
        b"",
    );
}

/// fio writing the NBD export on `sock` at random and verifying as it goes (crc32c,
/// verify_backlog), two jobs each owning `job_size` of the device, `loops` times; started
/// in `dir` (fio leaves verify state files in its working directory), output captured as
/// JSON.
pub fn spawn_fio_verify(dir: &Path, sock: &Path, job: &str, job_size: &str, loops: u32) -> Child {
    let mut fio = Command::new("fio");
    fio.current_dir(dir);
    fio.args([
        &format!("--name={job}"),
        "--ioengine=nbd",
        &format!("--uri={}", nbd_uri(sock)),
        // Each job owns its part of the device, writes it at random and verifies as it goes
        // (verify_backlog), so reads and writes interleave with whatever the test does.
        "--rw=randwrite",
        "--bs=4k",
        &format!("--size={job_size}"),
        &format!("--offset_increment={job_size}"),
        "--iodepth=4",
        "--numjobs=2",
        "--verify=crc32c",
        "--verify_backlog=64",
        "--verify_fatal=1",
        "--do_verify=1",
        &format!("--loops={loops}"),
        "--output-format=json",
    ]);
    spawn_captured(&mut fio)
}

/// Calls `step` for as long as `child` runs (at most 120 s), `pause` after each call;
/// returns how many calls were made.
pub fn repeat_while_running(
    child: &mut Child,
    pause: Duration,
    mut step: impl FnMut(usize),
) -> usize {
    let mut n = 0;
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(120) {
        step(n);
        n += 1;
        std::thread::sleep(pause);
    }
    n
}

/// Waits for fio from [`spawn_fio_verify`], asserts it succeeded ("fio failed CONTEXT")
/// and returns its JSON report's jobs.
pub fn fio_jobs(child: Child, context: &str) -> Vec<serde_json::Value> {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed {context}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
    report["jobs"].as_array().unwrap().clone()
}

/// False (skip) or a panic when not root, as CRYPTBLK_SKIP_ROOT says; false when one of the
/// loop/mount tools or `extra_tools` is missing and skipping was asked.
pub fn can_loop_mount(extra_tools: &[&str]) -> bool {
    if !is_root() {
        if std::env::var("CRYPTBLK_SKIP_ROOT").as_deref() == Ok("1") {
            eprintln!("skipping: needs root for losetup/mount (CRYPTBLK_SKIP_ROOT=1)");
            return false;
        }
        panic!("this test needs root for losetup and mount (set CRYPTBLK_SKIP_ROOT=1 to skip)");
    }
    [
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
        "fusermount3",
    ]
    .iter()
    .chain(extra_tools)
    .for_each(|t| {
        // A missing tool fails the test instead of skipping it green: scripts/install-deps.sh
        // installs every one of them.
        assert!(
            tool(t).is_some(),
            "{t} is required (scripts/install-deps.sh installs it)"
        );
    });
    true
}

/// A volume served over FUSE at `mnt` (its `disk` file) with a filesystem mount point
/// `fs`; dropping it unmounts `fs`, detaches every loop device over the disk and closes the
/// volume, so a failing test leaves nothing behind.
pub struct FuseLoop {
    /// The FUSE mount point.
    pub mnt: PathBuf,
    /// Where the filesystem on the loop device is mounted.
    pub fs: PathBuf,
    name: String,
}

impl FuseLoop {
    /// Makes `dir/mnt` and `dir/fs` for volume `name`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mnt = dir.join("mnt");
        let fs = dir.join("fs");
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(&fs).unwrap();
        FuseLoop {
            mnt,
            fs,
            name: name.to_string(),
        }
    }

    /// The exported disk file.
    pub fn disk(&self) -> PathBuf {
        self.mnt.join("disk")
    }

    /// `cryptblk open --key-file KEY IMG NAME --fuse MNT`, checked to succeed.
    pub fn open(&self, img: &Path, key: &Path) {
        run_ok(
            cryptblk()
                .args(["open", "--key-file"])
                .arg(key)
                .arg(img)
                .arg(&self.name)
                .arg("--fuse")
                .arg(&self.mnt),
            b"",
        );
    }
}

impl Drop for FuseLoop {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.fs).status();
        // Detach whatever loop device still points into our mount.
        if let Ok(out) = Command::new("losetup")
            .args(["-j"])
            .arg(self.disk())
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(dev) = line.split(':').next() {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }
        let _ = run(cryptblk().args(["close", &self.name]), b"");
    }
}

/// A command running `cryptblk` as uid/gid 65534 (an ordinary user, so "the same user" is not
/// root) with its own runtime directory `rt`.
pub fn as_nobody(rt: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        env!("CARGO_BIN_EXE_cryptblk"),
    ])
    .env("CRYPTBLK_RUNTIME_DIR", rt);
    c
}

/// Panics unless the tests run as root: a security test that needs root must fail, never
/// pass without having checked anything (`why` says what it needs root for).
pub fn require_root(why: &str) {
    assert!(
        is_root(),
        "this security test needs root ({why}); run the suite as root, it does not skip"
    );
}

/// The name of the ordinary user security tests act as ([`other_user`]).
pub const OTHER_USER: &str = "cryptblk-test-other";

/// The uid and gid of [`OTHER_USER`], a system user without a home or login shell, created
/// if missing (tests running in parallel may race to create it: whoever loses finds it).
/// Panics (failing the test) when it cannot be had, e.g. when not root.
pub fn other_user() -> (u32, u32) {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, OTHER_USER]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if let (Some(u), Some(g)) = (id("-u"), id("-g")) {
        return (u, g);
    }
    require_root("to create the user cryptblk-test-other with useradd");
    let out = run(
        Command::new("useradd").args(["-r", "-M", "-U", "-s", "/usr/sbin/nologin", OTHER_USER]),
        b"",
    );
    match (id("-u"), id("-g")) {
        (Some(u), Some(g)) => (u, g),
        _ => panic!(
            "cannot create the test user {OTHER_USER}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `program` run as [`OTHER_USER`] (uid, gid, no supplementary groups) through setpriv.
pub fn as_other_user(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let (uid, gid) = other_user();
    tool("setpriv").expect("setpriv (util-linux) runs commands as the other user");
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(program);
    c
}

/// One exchange with a program on a terminal: wait for `prompt`, then type `answer` and
/// Enter. A `secret` prompt is answered only once the program has turned echo off, since
/// cryptsetup and cryptblk drop what was typed before (they set the terminal with
/// TCSAFLUSH after printing the prompt).
pub struct PtyStep<'a> {
    /// Text the program prints when it waits for the answer.
    pub prompt: &'a str,
    /// The line to type.
    pub answer: &'a str,
    /// The answer is a passphrase (typed with echo off).
    pub secret: bool,
}

/// What a program run on a terminal printed (standard output and error, as the terminal
/// shows them) and its exit code.
pub struct PtyRun {
    /// The terminal's output.
    pub output: String,
    /// The exit code (-1 for a signal).
    pub code: i32,
}

/// Runs `cmd` on a new pseudo-terminal (its controlling terminal, standard input, output
/// and error), answering `steps` in order; panics when a prompt does not come or the
/// program does not end within 60 s (the program is killed then).
pub fn run_on_pty(cmd: &mut Command, steps: &[PtyStep]) -> PtyRun {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; no name, settings or size are passed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    // The Command holds the terminal's other end until its stdio is replaced: without
    // this the master would never see the end of the output.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let fd = master.as_raw_fd();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out: Vec<u8> = Vec::new();
    let mut seen = 0;
    let mut steps = steps.iter();
    let mut next = steps.next();
    let fail = |child: &mut Child, out: &[u8], why: &str| -> ! {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{why}; terminal output: {:?}", String::from_utf8_lossy(out));
    };
    loop {
        if let Some(step) = next {
            let text = String::from_utf8_lossy(&out[seen..]).into_owned();
            if let Some(at) = text.find(step.prompt) {
                seen += text[..at + step.prompt.len()].len();
                while step.secret && echo_on(fd) {
                    if Instant::now() > deadline {
                        fail(&mut child, &out, "echo never turned off for a passphrase");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let line = format!("{}\n", step.answer);
                // SAFETY: writes from a live buffer to the open master.
                let n = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
                assert_eq!(n, line.len() as isize, "writing to the terminal");
                next = steps.next();
                continue;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = match next {
                Some(s) => format!("no prompt {:?} within 60 s", s.prompt),
                None => "the program did not end within 60 s".to_string(),
            };
            fail(&mut child, &out, &why);
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
        if ready <= 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a live buffer from the open master.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            // EIO: every holder of the terminal's other end has exited.
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    if let Some(s) = next {
        fail(
            &mut child,
            &out,
            &format!("the program ended before {:?}", s.prompt),
        );
    }
    let status = child.wait().unwrap();
    PtyRun {
        output: String::from_utf8_lossy(&out).into_owned(),
        code: status.code().unwrap_or(-1),
    }
}

/// True while the terminal of `master` echoes input.
fn echo_on(master: i32) -> bool {
    // SAFETY: termios is plain data that tcgetattr fills for a valid descriptor.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    unsafe { libc::tcgetattr(master, &mut t) };
    t.c_lflag & libc::ECHO != 0
}
