//! `cryptblk dm create --lower`: a raw authenticated dm-crypt table over a dm-integrity table
//! in one daemon, through the real binary, against stacks the real kernel made.
//!
//! The fixtures are the dm crate's `aead_fixtures` (see its README.md): images the kernel
//! (6.12, lab VM) wrote 256 KiB of a known pattern into through `dmsetup create` of an
//! integrity table and a crypt table on top of it. The tests give cryptblk the kernel's two
//! table lines verbatim, only `7:0` (the loop device) replaced by the image and `254:0` (the
//! integrity device) by `/dev/mapper/<lower name>`, and read over NBD with `qemu-img dd`
//! and `qemu-io`. The pattern is recomputed with Python's hashlib, independently of cryptblk.
//!
//! - `kernel_stacks_read_over_nbd`: three kernel stacks (GCM with a 12-byte tag from plain
//!   dmsetup tables, LUKS2 GCM, LUKS2 HMAC-SHA256 + XTS with 4096-byte sectors) read the
//!   kernel's pattern; `dm ls`, `dm table`, `dm status` answer for the lower mapping with
//!   the kernel's table and status lines.
//! - `write_refresh_reload_and_busy_lower`: writes through the stack read back (also after
//!   closing and serving it again); `refresh` and `reload`+`suspend`+`resume` of the top keep
//!   the lower working; `dm remove` of the lower is refused (exit 5) while the top uses it;
//!   `dm remove` of the top ends both.
//! - `flipped_tag_byte_is_eio_over_nbd`: one flipped byte of a sector's tag on the image
//!   makes that read fail with EIO over NBD while its neighbours read.
//! - `luks2_integrity_open_answers_for_its_dif_mapping`: `cryptblk open` of a kernel-made
//!   LUKS2 `--integrity` image: `<name>_dif` answers `dm table`/`dm status` with the
//!   kernel's lines and is busy while `<name>` uses it.
//! - `stack_errors_leave_no_daemon`: a lower name that clashes, a missing table file, a top
//!   table naming a lower mapping that does not exist, a lower table that does not load:
//!   clear messages, cryptsetup's exit codes, no control socket or mapping left behind.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dm/tests/aead_fixtures")
}

/// A fresh copy of fixture `name`'s image in `dir`.
fn unpack(name: &str, dir: &Path) -> PathBuf {
    let src = fixture_dir().join(format!("{name}.img.xz"));
    let dst = dir.join(format!("{name}.img"));
    unxz(&src, &dst);
    dst
}

/// The kernel's recorded lines of fixture `name`: (integrity line, crypt line, integrity
/// status line if recorded), each without its `name: ` prefix.
fn kernel_lines(name: &str) -> (String, String, Option<String>) {
    let text = std::fs::read_to_string(fixture_dir().join(format!("{name}.tables"))).unwrap();
    let (lower, upper) = if name.starts_with("d-") {
        ("dint: ", "dcrypt: ")
    } else {
        ("kaead_dif: ", "kaead: ")
    };
    let mut tables = text
        .lines()
        .skip_while(|l| !l.starts_with("# dmsetup table --showkeys"))
        .skip(1);
    let int = tables.next().unwrap().strip_prefix(lower).unwrap();
    let crypt = tables.next().unwrap().strip_prefix(upper).unwrap();
    let status = text
        .lines()
        .skip_while(|l| !l.starts_with("# dmsetup status"))
        .find_map(|l| l.strip_prefix(lower))
        .map(|s| s.trim().to_string());
    (int.to_string(), crypt.to_string(), status)
}

/// Writes the kernel's two lines as table files for a stack `top` over `lower` on `img`.
/// Returns (integrity table file, crypt table file).
fn table_files(name: &str, img: &Path, top: &str, lower: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let (int, crypt, _) = kernel_lines(name);
    let int = int.replacen(" 7:0 ", &format!(" {} ", img.display()), 1);
    let crypt = crypt.replacen(" 254:0 ", &format!(" /dev/mapper/{lower} "), 1);
    assert!(
        !crypt.contains(":logon:"),
        "{name}: keyring key in the table"
    );
    let (fi, fc) = (
        dir.join(format!("{top}-int.tbl")),
        dir.join(format!("{top}.tbl")),
    );
    std::fs::write(&fi, format!("{int}\n")).unwrap();
    std::fs::write(&fc, format!("{crypt}\n")).unwrap();
    (fi, fc)
}

/// concat SHA-256(`cryptblk-aead-pattern-<i>`), what the kernel wrote (Python's hashlib).
fn kernel_pattern(len: usize) -> Vec<u8> {
    let script = format!(
        "import hashlib, sys\nout = b''\ni = 0\nwhile len(out) < {len}:\n    \
         out += hashlib.sha256(b'cryptblk-aead-pattern-%d' % i).digest()\n    i += 1\n\
         sys.stdout.buffer.write(out[:{len}])\n"
    );
    let out = tool("python3")
        .expect("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

/// `dm create TOP --table-file CRYPT --lower LOWER=INT --nbd SOCK`, checked to succeed.
fn create_stack(top: &str, lower: &str, int: &Path, crypt: &Path, sock: &Path) -> Served {
    create_stack_with(top, &[(lower, int)], crypt, sock)
}

/// `dm create TOP --table-file CRYPT [--lower NAME=FILE]... --nbd SOCK`, checked to succeed.
fn create_stack_with(top: &str, lower: &[(&str, &Path)], crypt: &Path, sock: &Path) -> Served {
    let mut c = cryptblk();
    c.args(["dm", "create", top, "--table-file"]).arg(crypt);
    for (name, file) in lower {
        c.arg("--lower").arg(format!("{name}={}", file.display()));
    }
    run_ok(c.arg("--nbd").arg(sock), b"");
    Served::volume(top)
}

/// The first `len` bytes of the export, read with `qemu-img dd` (the sectors the kernel
/// never wrote fail their tags, so the whole device cannot be copied).
fn nbd_read(sock: &Path, len: usize) -> Vec<u8> {
    let out = sock.with_extension("read");
    let _ = std::fs::remove_file(&out);
    run_ok(
        Command::new("qemu-img")
            .args(["dd", "-f", "raw", "-O", "raw"])
            .arg(format!("if={}", nbd_uri(sock)))
            .arg(format!("of={}", out.display()))
            .arg(format!("bs={len}"))
            .arg("count=1"),
        b"",
    );
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got.len(), len);
    got
}

/// The export's size in bytes, from `nbdinfo`.
fn nbd_size(sock: &Path) -> u64 {
    run_ok(
        Command::new("nbdinfo").arg("--size").arg(nbd_uri(sock)),
        b"",
    )
    .trim()
    .parse()
    .unwrap()
}

/// One `qemu-io` command against the export; returns its stdout and stderr.
fn qemu_io(sock: &Path, cmd: &str) -> String {
    qemu_io_nbd(sock, cmd).1
}

/// `cryptblk ARGS`: (exit code, stdout, stderr).
fn cryptblk_out(args: &[&str]) -> (i32, String, String) {
    let out = run(cryptblk().args(args), b"");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cryptblk ARGS`, checked to succeed: its stdout.
fn cryptblk_ok(args: &[&str]) -> String {
    run_ok(cryptblk().args(args), b"")
}

/// `dm create TOP --table-file CRYPT [--lower LOWER]... --nbd SOCK`, expected to fail:
/// (exit code, stdout, stderr).
fn try_create_stack(
    top: &str,
    crypt: &Path,
    lowers: &[String],
    sock: &Path,
) -> (i32, String, String) {
    let mut args = vec![
        "dm".to_string(),
        "create".into(),
        top.into(),
        "--table-file".into(),
        crypt.display().to_string(),
    ];
    for l in lowers {
        args.push("--lower".into());
        args.push(l.clone());
    }
    args.push("--nbd".into());
    args.push(sock.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cryptblk_out(&args)
}

fn dm_ls() -> Vec<String> {
    let (code, out, err) = cryptblk_out(&["dm", "ls"]);
    assert_eq!(code, 0, "dm ls: {err}");
    out.lines().map(str::to_string).collect()
}

fn require_tools() -> bool {
    ["xz", "python3", "nbdinfo", "qemu-img", "qemu-io"]
        .iter()
        .all(|t| tool(t).is_some())
}

/// Fields of a table line from `from` on (start, length, target and so on).
fn fields(line: &str, from: usize) -> Vec<String> {
    line.split_whitespace()
        .skip(from)
        .map(str::to_string)
        .collect()
}

#[test]
fn kernel_stacks_read_over_nbd() {
    if !require_tools() {
        return;
    }
    let dir = tempdir();
    let want = kernel_pattern(256 << 10);
    for (i, name) in [
        "d-gcm-random-tag12",
        "gcm-random",
        "xts-random-hmac-sha256-4k",
    ]
    .into_iter()
    .enumerate()
    {
        let img = unpack(name, dir.path());
        let (top, lower) = (format!("rd{i}"), format!("rd{i}_dif"));
        let (int, crypt) = table_files(name, &img, &top, &lower, dir.path());
        let sock = dir.path().join(format!("{top}.sock"));
        let served = create_stack(&top, &lower, &int, &crypt, &sock);

        let got = nbd_read(&sock, want.len());
        let (kint, kcrypt, kstatus) = kernel_lines(name);
        let sectors: u64 = fields(&kcrypt, 1)[0].parse().unwrap();
        assert_eq!(nbd_size(&sock), sectors * 512, "{name}: exported size");
        assert!(got == want, "{name}: kernel's pattern");
        // The last block, which the kernel never wrote on these unwiped images, has no
        // valid tag: EIO over NBD (the kernel's verdict in aead_fixtures/results.txt).
        let last = qemu_io(&sock, &format!("read {} 4096", sectors * 512 - 4096));
        assert!(
            last.contains("Input/output error"),
            "{name}: unwritten last block: {last}"
        );

        let ls = dm_ls();
        assert!(
            ls.contains(&top) && ls.contains(&lower),
            "{name}: dm ls {ls:?}"
        );
        // The lower mapping answers under its own name with the kernel's line (the device
        // aside); the top shows the kernel's crypt line with the lower's name for 254:0.
        let ours_int = cryptblk_ok(&["dm", "table", &lower]);
        assert_eq!(fields(&ours_int, 4), fields(&kint, 4), "{name}: integrity");
        assert_eq!(fields(&ours_int, 0)[..3], fields(&kint, 0)[..3], "{name}");
        let ours_crypt = cryptblk_ok(&["dm", "table", &top, "--showkeys"]);
        assert_eq!(
            fields(&ours_crypt, 0),
            fields(
                &kcrypt.replacen(" 254:0 ", &format!(" /dev/mapper/{lower} "), 1),
                0
            ),
            "{name}: crypt"
        );
        let hidden = cryptblk_ok(&["dm", "table", &top]);
        assert!(
            !hidden.contains(&fields(&kcrypt, 4)[0]),
            "{name}: key shown"
        );
        if let Some(kstatus) = kstatus {
            let ours = cryptblk_ok(&["dm", "status", &lower]);
            assert_eq!(ours.trim(), kstatus, "{name}: integrity status");
        }
        drop(served);
        let ls = dm_ls();
        assert!(
            !ls.contains(&top) && !ls.contains(&lower),
            "{name}: after dm remove: {ls:?}"
        );
    }
}

#[test]
fn write_refresh_reload_and_busy_lower() {
    if !require_tools() {
        return;
    }
    let dir = tempdir();
    let name = "d-gcm-random-tag12";
    let img = unpack(name, dir.path());
    let (top, lower) = ("wr", "wr_dif");
    let (int, crypt) = table_files(name, &img, top, lower, dir.path());
    let sock = dir.path().join("wr.sock");
    let mut want = kernel_pattern(256 << 10);
    // A second lower mapping that nothing stacks on, as a kernel table may sit unused.
    let spare = dir.path().join("spare.tbl");
    std::fs::write(&spare, "0 8 zero\n").unwrap();
    let served = create_stack_with(top, &[(lower, &int), ("wr_spare", &spare)], &crypt, &sock);

    // A write through the stack, over the kernel's data and past it.
    let w = qemu_io(&sock, "write -P 0x5a 196608 131072");
    assert!(w.contains("wrote 131072/131072"), "qemu-io write: {w}");
    want.resize(196608, 0);
    want.extend(std::iter::repeat_n(0x5a, 131072));
    assert!(nbd_read(&sock, want.len()) == want, "read back after write");

    // The lower is busy while the top stacks on it, as the kernel's EBUSY.
    let (code, _, err) = cryptblk_out(&["dm", "remove", lower]);
    assert_eq!(code, 5, "dm remove of a used lower: {err}");
    assert!(err.contains("in use") && err.contains(top), "{err}");
    let (code, _, err) = cryptblk_out(&["close", lower]);
    assert_eq!(code, 5, "close of a used lower: {err}");
    assert!(dm_ls().contains(&lower.to_string()));
    // An unused lower mapping can go, like `dmsetup remove` of an unopened device.
    let t = cryptblk_ok(&["dm", "table", "wr_spare"]);
    assert_eq!(t.trim(), "0 8 zero");
    cryptblk_ok(&["dm", "remove", "wr_spare"]);
    assert!(!dm_ls().contains(&"wr_spare".to_string()));
    let (code, _, err) = cryptblk_out(&["dm", "table", "wr_spare"]);
    assert_eq!(code, 4, "table of a removed lower: {err}");

    // refresh of the top swaps the crypt flags only, over the same lower mapping.
    run_ok(
        cryptblk().args(["refresh", top, "--perf-no_read_workqueue"]),
        b"",
    );
    let t = cryptblk_ok(&["dm", "table", top]);
    assert!(
        t.contains("no_read_workqueue")
            && t.contains("integrity:24:aead")
            && t.contains(&format!("/dev/mapper/{lower}")),
        "table after refresh: {t}"
    );
    assert!(nbd_read(&sock, want.len()) == want, "read after refresh");

    // reload + suspend + resume of the top with the kernel's line again.
    run_ok(
        cryptblk()
            .args(["dm", "reload", top, "--table-file"])
            .arg(&crypt),
        b"",
    );
    cryptblk_ok(&["dm", "suspend", top]);
    cryptblk_ok(&["dm", "resume", top]);
    let t = cryptblk_ok(&["dm", "table", top]);
    assert!(!t.contains("no_read_workqueue"), "reloaded table: {t}");
    assert!(nbd_read(&sock, want.len()) == want, "read after reload");
    let t = cryptblk_ok(&["dm", "table", lower]);
    assert!(t.contains(" integrity "), "lower after reload: {t}");
    // A second write after the swaps, then close: the journal is committed on the image.
    let w = qemu_io(&sock, "write -P 0xa5 4096 8192");
    assert!(w.contains("wrote 8192/8192"), "qemu-io write: {w}");
    want[4096..12288].fill(0xa5);
    drop(served);
    assert!(!dm_ls().iter().any(|n| n == top || n == lower));
    assert!(!runtime_dir().join(format!("{lower}.ctl")).exists());

    // Served again from the image alone: everything written verifies.
    let served = create_stack(top, lower, &int, &crypt, &sock);
    assert!(
        nbd_read(&sock, want.len()) == want,
        "read after serving again"
    );
    drop(served);
}

#[test]
fn flipped_tag_byte_is_eio_over_nbd() {
    if !require_tools() {
        return;
    }
    use cryptblk_dm::targets::integrity::IntegrityTarget;
    let dir = tempdir();
    let name = "d-gcm-random-tag12";
    let img = unpack(name, dir.path());
    // Where the tag of logical sector 8 lives (read from a scratch copy's geometry).
    let scratch = dir.path().join("scratch.img");
    std::fs::copy(&img, &scratch).unwrap();
    let (int_line, _, _) = kernel_lines(name);
    let reg = cryptblk_dm::Registry::new();
    let m = reg
        .create(
            "geom",
            &int_line.replacen(" 7:0 ", &format!(" {} ", scratch.display()), 1),
        )
        .unwrap();
    let tag_pos = m.with_table(|t| {
        t.entries()[0]
            .target
            .as_any()
            .downcast_ref::<IntegrityTarget>()
            .unwrap()
            .layout()
            .tag_position(8)
    });
    drop(m);
    drop(reg);

    let (top, lower) = ("flip", "flip_dif");
    let (int, crypt) = table_files(name, &img, top, lower, dir.path());
    let sock = dir.path().join("flip.sock");
    // Control: the pristine image reads sector 8.
    let served = create_stack(top, lower, &int, &crypt, &sock);
    let r = qemu_io(&sock, "read 4096 512");
    assert!(r.contains("read 512/512"), "pristine sector 8: {r}");
    drop(served);

    let mut bytes = std::fs::read(&img).unwrap();
    bytes[tag_pos as usize + 3] ^= 0x10;
    std::fs::write(&img, &bytes).unwrap();
    let served = create_stack(top, lower, &int, &crypt, &sock);
    let r = qemu_io(&sock, "read 4096 512");
    assert!(
        r.contains("Input/output error") && !r.contains("read 512/512"),
        "flipped tag: {r}"
    );
    for ok in ["read 3584 512", "read 4608 512"] {
        let r = qemu_io(&sock, ok);
        assert!(r.contains("read 512/512"), "neighbour {ok}: {r}");
    }
    drop(served);
}

#[test]
fn stack_errors_leave_no_daemon() {
    if !require_tools() {
        return;
    }
    let dir = tempdir();
    let name = "d-gcm-random-tag12";
    let img = unpack(name, dir.path());
    let sock = dir.path().join("err.sock");
    let gone = |names: &[&str]| {
        let ls = dm_ls();
        for n in names {
            assert!(!ls.iter().any(|l| l == n), "{n} listed: {ls:?}");
            assert!(
                !runtime_dir().join(format!("{n}.ctl")).exists(),
                "{n}.ctl left behind"
            );
        }
        assert!(!sock.exists(), "NBD socket left behind");
    };

    // A lower name another daemon already serves: busy, like cryptsetup's "already exists".
    let other_sock = dir.path().join("other.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "errtaken", "--table", "0 8 zero", "--nbd"])
            .arg(&other_sock),
        b"",
    );
    let _other = Served::volume("errtaken");
    let (int, crypt) = table_files(name, &img, "errclash", "errtaken", dir.path());
    let (code, _, err) = try_create_stack(
        "errclash",
        &crypt,
        &[format!("errtaken={}", int.display())],
        &sock,
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("Device errtaken already exists."), "{err}");
    gone(&["errclash"]);
    assert!(dm_ls().contains(&"errtaken".to_string()));

    // The lower named like the top, or twice: usage errors.
    for lowers in [
        vec![format!("errself={}", int.display())],
        vec![
            format!("errtwice_dif={}", int.display()),
            format!("errtwice_dif={}", int.display()),
        ],
        vec!["no-equals-sign".to_string()],
    ] {
        let (code, _, err) = try_create_stack("errself", &crypt, &lowers, &sock);
        assert_eq!(code, 1, "{lowers:?}: {err}");
        assert!(err.contains("lower"), "{lowers:?}: {err}");
        gone(&["errself", "errtwice_dif"]);
    }

    // Missing table files, lower or top.
    let (int, crypt) = table_files(name, &img, "errmiss", "errmiss_dif", dir.path());
    let missing = dir.path().join("no-such.tbl");
    for (top_file, lower_file) in [(&crypt, &missing), (&missing, &int)] {
        let (code, _, err) = try_create_stack(
            "errmiss",
            top_file,
            &[format!("errmiss_dif={}", lower_file.display())],
            &sock,
        );
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("cannot read table file") && err.contains("no-such.tbl"),
            "{err}"
        );
        gone(&["errmiss", "errmiss_dif"]);
    }

    // The top names a lower mapping that is not in the stack: no such device (exit 4).
    let (int, _) = table_files(name, &img, "errname", "errname_dif", dir.path());
    let (_, crypt) = table_files(name, &img, "errname", "errname_nope", dir.path());
    let (code, _, err) = try_create_stack(
        "errname",
        &crypt,
        &[format!("errname_dif={}", int.display())],
        &sock,
    );
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("/dev/mapper/errname_nope") && err.contains("errname"),
        "{err}"
    );
    gone(&["errname", "errname_dif", "errname_nope"]);

    // A lower table that does not load names the lower mapping.
    let bad = dir.path().join("bad-int.tbl");
    std::fs::write(&bad, "0 2448 integrity /nonexistent/disk 0 24 J 0\n").unwrap();
    let (code, _, err) = try_create_stack(
        "errname",
        &crypt,
        &[format!("errname_nope={}", bad.display())],
        &sock,
    );
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("errname_nope") && err.contains("/nonexistent/disk"),
        "{err}"
    );
    gone(&["errname", "errname_nope"]);

    // A keyed integrity option is refused inline like a crypt key.
    let (code, _, err) = cryptblk_out(&[
        "dm",
        "create",
        "errinline",
        "--table",
        "0 8 integrity ram:1M 0 32 J 1 internal_hash:hmac(sha256):00112233",
        "--nbd",
        sock.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refusing a key on the command line"), "{err}");
    gone(&["errinline"]);
}

#[test]
fn luks2_integrity_open_answers_for_its_dif_mapping() {
    // `cryptblk open` of a kernel-made LUKS2 --integrity image stacks <name>_dif under
    // <name> in one daemon, as cryptsetup does; the lower one now answers under its name
    // with the table and status line the kernel showed for its own kaead_dif.
    if !require_tools() {
        return;
    }
    let dir = tempdir();
    let name = "gcm-random";
    let img = unpack(name, dir.path());
    let key = dir.path().join("pass.key");
    std::fs::write(&key, "cryptblk-aead-fixture").unwrap();
    let sock = dir.path().join("lk.sock");
    let served = open_nbd(&img, &key, "lk", &sock, &[]);
    let (kint, _, kstatus) = kernel_lines(name);
    let ls = dm_ls();
    assert!(ls.contains(&"lk".to_string()) && ls.contains(&"lk_dif".to_string()));
    let ours = cryptblk_ok(&["dm", "table", "lk_dif"]);
    assert_eq!(fields(&ours, 4), fields(&kint, 4), "integrity table");
    let ours = cryptblk_ok(&["dm", "status", "lk_dif"]);
    assert_eq!(Some(ours.trim().to_string()), kstatus, "integrity status");
    let (code, _, err) = cryptblk_out(&["dm", "remove", "lk_dif"]);
    assert_eq!(code, 5, "{err}");
    assert_eq!(
        nbd_read(&sock, 256 << 10),
        kernel_pattern(256 << 10),
        "kernel's pattern"
    );
    drop(served);
    assert!(!dm_ls().iter().any(|n| n == "lk" || n == "lk_dif"));
}

#[test]
fn lower_table_from_stdin_named_without_dev_mapper() {
    // The lower table may come from standard input (`NAME=-`), and the top may name it
    // bare, as the registry resolves mapping names either way.
    if !require_tools() {
        return;
    }
    let dir = tempdir();
    let name = "d-gcm-random-tag12";
    let img = unpack(name, dir.path());
    let (int, crypt, _) = kernel_lines(name);
    let int = int.replacen(" 7:0 ", &format!(" {} ", img.display()), 1);
    let top_file = dir.path().join("bare.tbl");
    std::fs::write(&top_file, crypt.replacen(" 254:0 ", " bare_int ", 1)).unwrap();
    let sock = dir.path().join("bare.sock");
    let facts = run_ok(
        cryptblk()
            .args(["--json", "dm", "create", "bare", "--table-file"])
            .arg(&top_file)
            .args(["--lower", "bare_int=-", "--nbd"])
            .arg(&sock),
        int.as_bytes(),
    );
    let served = Served::volume("bare");
    assert!(facts.contains("\"lower\":[\"bare_int\"]"), "{facts}");
    assert_eq!(nbd_read(&sock, 256 << 10), kernel_pattern(256 << 10));
    let t = cryptblk_ok(&["dm", "table", "bare_int"]);
    assert_eq!(fields(&t, 4), fields(&int, 4));
    drop(served);
}
