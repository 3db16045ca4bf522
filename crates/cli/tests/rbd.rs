//! `rbd:pool/image` backing stores against a real Ceph cluster and librbd's own LUKS2
//! encryption: an image formatted by `rbd encryption format ... luks2` and written through
//! librbd (qemu-img's rbd driver with `encrypt.format=luks2`) reads back identically through
//! `cryptblk open rbd:...`, and what cryptblk writes reads back through librbd's encryption.
//!
//! The tests need a cluster: `CEPH_CONF` names its configuration (`scripts/test.sh` starts
//! one with `../shared/ceph/up.sh` when `CEPH_CONF` is unset). Without `CEPH_CONF`, or with a
//! cluster that does not answer, they fail: they never pass without having run.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// The pool the test cluster provides.
const POOL: &str = "testpool";

/// `CEPH_CONF`, checked to name a cluster that answers; panics (failing the test) otherwise.
fn cluster() -> String {
    let Some(conf) = std::env::var_os("CEPH_CONF") else {
        panic!(
            "CEPH_CONF is not set: the rbd: tests need a Ceph cluster (scripts/test.sh starts \
             one with ../shared/ceph/up.sh; or run it and export CEPH_CONF=$CEPH_DIR/ceph.conf)"
        );
    };
    let conf = conf.to_string_lossy().into_owned();
    // Fail, not skip, when the configured cluster does not answer.
    let out = run(
        Command::new("timeout").args(["20", "ceph", "--connect-timeout", "15", "health"]),
        b"",
    );
    assert!(
        out.status.success(),
        "CEPH_CONF={conf} is set but the cluster does not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    conf
}

/// An RBD image of the test pool, removed (with its snapshots) when dropped.
struct RbdImage {
    name: String,
}

impl RbdImage {
    fn create(tag: &str, size: &str) -> RbdImage {
        let name = format!("cryptblk-{tag}-{}", std::process::id());
        let img = RbdImage { name };
        let _ = run(
            Command::new("rbd").args(["rm", "--no-progress", &img.spec()]),
            b"",
        );
        run_ok(
            Command::new("rbd").args(["create", "--size", size, &img.spec()]),
            b"",
        );
        img
    }

    /// `pool/image`, as the rbd tool names it.
    fn spec(&self) -> String {
        format!("{POOL}/{}", self.name)
    }

    /// `rbd:pool/image[@snap]`, as cryptblk names it.
    fn device(&self, snap: Option<&str>) -> String {
        match snap {
            Some(s) => format!("rbd:{}@{s}", self.spec()),
            None => format!("rbd:{}", self.spec()),
        }
    }

    /// qemu's image options for the image decrypted by librbd with secret `s`.
    fn librbd_luks2_opts(&self) -> String {
        format!(
            "driver=rbd,pool={POOL},image={},encrypt.format=luks2,encrypt.key-secret=s",
            self.name
        )
    }
}

impl Drop for RbdImage {
    fn drop(&mut self) {
        let _ = run(
            Command::new("rbd").args(["snap", "purge", "--no-progress", &self.spec()]),
            b"",
        );
        let _ = run(
            Command::new("rbd").args(["rm", "--no-progress", &self.spec()]),
            b"",
        );
    }
}

/// `qemu-img convert` through librbd's LUKS2 encryption, `to_rbd` choosing the direction.
fn qemu_img_librbd(img: &RbdImage, pass: &Path, file: &Path, to_rbd: bool) {
    let secret = format!("secret,id=s,file={}", pass.display());
    let mut c = Command::new("qemu-img");
    c.args(["convert", "--object", &secret]);
    if to_rbd {
        c.args(["-n", "-f", "raw", "--target-image-opts"])
            .arg(file)
            .arg(img.librbd_luks2_opts());
    } else {
        c.args(["-O", "raw", "--image-opts", &img.librbd_luks2_opts()])
            .arg(file);
    }
    run_ok(&mut c, b"");
}

/// The first `len` bytes of the export on `sock`, read by nbdcopy.
fn read_export(dir: &Path, sock: &Path, len: usize) -> Vec<u8> {
    let out = dir.join("export.raw");
    run_ok(Command::new("nbdcopy").arg(nbd_uri(sock)).arg(&out), b"");
    let mut data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    assert!(
        data.len() >= len,
        "export has {} bytes, want {len}",
        data.len()
    );
    data.truncate(len);
    data
}

#[test]
fn librbd_luks2_image_and_cryptblk_agree_both_ways() {
    cluster();
    let dir = tempdir();
    // No trailing newline: the rbd tool drops one, qemu and cryptblk do not.
    let pass = write_file(dir.path(), "pass", b"rbd test passphrase");
    let img = RbdImage::create("luks2", "48M");
    run_ok(
        Command::new("rbd")
            .args(["encryption", "format", &img.spec(), "luks2"])
            .arg(&pass),
        b"",
    );

    // librbd's header as cryptblk reads it: the LUKS2 volume it is.
    let dump = run_ok(cryptblk().arg("luksDump").arg(img.device(None)), b"");
    for want in [
        "Version:       \t2",
        "cipher: aes-xts-plain64",
        "sector: 4096 [bytes]",
        "offset: 16777216 [bytes]",
    ] {
        assert!(dump.contains(want), "luksDump lacks {want:?}:\n{dump}");
    }

    // Written through librbd's encryption, read through cryptblk.
    let len = 6 << 20;
    let first = write_pattern(&dir.path().join("first.bin"), len, 11);
    qemu_img_librbd(&img, &pass, &dir.path().join("first.bin"), true);
    let sock = dir.path().join("rbd.sock");
    let served = open_nbd(Path::new(&img.device(None)), &pass, "rbd-both", &sock, &[]);
    let st = status("rbd-both");
    assert_eq!(st["info"]["device"], img.device(None), "{st}");
    // 48 MiB image, 16 MiB of header: 32 MiB of data.
    assert_eq!(st["size"], 32 << 20, "{st}");
    assert!(
        read_export(dir.path(), &sock, len) == first,
        "cryptblk read other data than librbd wrote"
    );

    // Written through cryptblk (over the first pattern, unaligned to objects), read through
    // librbd's encryption.
    let second = write_pattern(&dir.path().join("second.bin"), 3 << 20, 12);
    run_ok(
        Command::new("qemu-io")
            .args(["-f", "raw", "-c", &format!("write -P 0x5a {} 1M", 5 << 20)])
            .arg(nbd_uri(&sock)),
        b"",
    );
    run_ok(
        Command::new("nbdcopy")
            .arg(dir.path().join("second.bin"))
            .arg(nbd_uri(&sock)),
        b"",
    );
    let st = status("rbd-both");
    assert!(
        st["status"].as_str().unwrap().contains(" errors=0 "),
        "{st}"
    );
    assert_eq!(
        st["backings"],
        serde_json::json!([{ "device": img.device(None), "errors": 0 }]),
        "{st}"
    );
    // One writer: the daemon holds the image's exclusive lock, so another librbd client's
    // write and a second read-write open are refused while it serves.
    let out = run(
        Command::new("qemu-io")
            .args(["-c", "write -P 0x33 0 4k", "--image-opts"])
            .arg(format!("driver=rbd,pool={POOL},image={}", img.name)),
        b"",
    );
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Read-only"),
        "another client wrote under the daemon: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&pass)
            .arg(img.device(None))
            .args(["rbd-second", "--nbd"])
            .arg(dir.path().join("second.sock")),
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("exclusive lock"),
        "{err}"
    );
    drop(served);
    let back = dir.path().join("back.raw");
    qemu_img_librbd(&img, &pass, &back, false);
    let back = std::fs::read(&back).unwrap();
    assert_eq!(back.len(), 32 << 20);
    let mut want = first;
    want[..second.len()].copy_from_slice(&second);
    want[5 << 20..6 << 20].fill(0x5a);
    assert!(
        back[..len] == want[..],
        "librbd decrypted other data than cryptblk wrote"
    );
    assert!(
        back[len..].iter().all(|&b| b == 0),
        "librbd sees data past what was written"
    );
}

#[test]
fn snapshots_open_read_only_and_bad_specs_fail_cleanly() {
    cluster();
    let dir = tempdir();
    let pass = write_file(dir.path(), "pass", b"snap pass");
    // A cryptsetup-made LUKS2 image (fast KDF; librbd's format takes many seconds) imported.
    let Some(()) = cryptsetup_luks2(&dir.path().join("local.img"), &pass, 24 << 20) else {
        return;
    };
    let img = RbdImage {
        name: format!("cryptblk-snap-{}", std::process::id()),
    };
    let _ = run(
        Command::new("rbd").args(["rm", "--no-progress", &img.spec()]),
        b"",
    );
    run_ok(
        Command::new("rbd")
            .args(["import", "--no-progress"])
            .arg(dir.path().join("local.img"))
            .arg(img.spec()),
        b"",
    );
    std::fs::remove_file(dir.path().join("local.img")).unwrap();
    let sock = dir.path().join("snap.sock");
    let before = write_pattern(&dir.path().join("before.bin"), 1 << 20, 21);
    let served = open_nbd(Path::new(&img.device(None)), &pass, "rbd-snap", &sock, &[]);
    run_ok(
        Command::new("nbdcopy")
            .arg(dir.path().join("before.bin"))
            .arg(nbd_uri(&sock)),
        b"",
    );
    drop(served);
    run_ok(
        Command::new("rbd").args(["snap", "create", &format!("{}@s1", img.spec())]),
        b"",
    );
    // The image moves on; the snapshot keeps the old data.
    let served = open_nbd(Path::new(&img.device(None)), &pass, "rbd-snap", &sock, &[]);
    let (ok, text) = qemu_io_nbd(&sock, "write -P 0x77 0 1M");
    assert!(ok, "{text}");
    drop(served);

    let served = open_nbd(
        Path::new(&img.device(Some("s1"))),
        &pass,
        "rbd-snap",
        &sock,
        &[],
    );
    assert!(
        read_export(dir.path(), &sock, 1 << 20) == before,
        "snapshot read other data"
    );
    let (ok, text) = qemu_io_nbd(&sock, "write -P 1 0 4k");
    assert!(!ok, "a write to a snapshot succeeded: {text}");
    // Refused by the read-only image before it reached the cluster: no failure of the store.
    let st = status("rbd-snap");
    assert_eq!(st["backings"][0]["errors"], 0, "{st}");
    drop(served);

    // The cluster refusing the daemon (its client blocklisted, as after a fencing): reads
    // fail with EIO, counted in status, instead of returning anything.
    let served = open_nbd(Path::new(&img.device(None)), &pass, "rbd-snap", &sock, &[]);
    let watchers = run_ok(Command::new("rbd").args(["status", &img.spec()]), b"");
    let client = watchers
        .split_whitespace()
        .find_map(|w| w.strip_prefix("watcher="))
        .unwrap_or_else(|| panic!("no watcher in rbd status:\n{watchers}"))
        .to_string();
    run_ok(
        Command::new("ceph").args(["osd", "blocklist", "add", &client]),
        b"",
    );
    let (ok, text) = qemu_io_nbd(&sock, &format!("read {} 64k", 2 << 20));
    let st = status("rbd-snap");
    drop(served);
    run_ok(
        Command::new("ceph").args(["osd", "blocklist", "rm", &client]),
        b"",
    );
    assert!(!ok && text.contains("Input/output error"), "{text}");
    assert!(st["backings"][0]["errors"].as_u64().unwrap() > 0, "{st}");

    // Any table can name an image: a linear mapping serves the raw image as `rbd export`
    // reads it.
    let table = write_file(
        dir.path(),
        "linear.table",
        format!("0 8192 linear {} 0\n", img.device(None)).as_bytes(),
    );
    run_ok(
        cryptblk()
            .args(["dm", "create", "rbd-linear", "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(dir.path().join("linear.sock")),
        b"",
    );
    let raw = read_export(dir.path(), &dir.path().join("linear.sock"), 4 << 20);
    run_ok(cryptblk().args(["dm", "remove", "rbd-linear"]), b"");
    let exported = dir.path().join("exported.raw");
    run_ok(
        Command::new("rbd")
            .args(["export", "--no-progress", &img.spec()])
            .arg(&exported),
        b"",
    );
    assert!(
        std::fs::read(&exported).unwrap()[..4 << 20] == raw[..],
        "linear over rbd: differs"
    );

    // Unknown image, unknown pool, malformed spec: one line naming the device, exit 4 as
    // cryptsetup's for a device that does not exist.
    for (dev, why) in [
        (
            format!("rbd:{POOL}/no-such-image-{}", std::process::id()),
            "No such file",
        ),
        (
            "rbd:no-such-pool/img".to_string(),
            "cannot open pool no-such-pool",
        ),
        (
            "rbd:just-a-name".to_string(),
            "expected a pool and an image",
        ),
    ] {
        let out = run(
            cryptblk()
                .args(["open", "--key-file"])
                .arg(&pass)
                .arg(&dev)
                .args(["rbd-bad", "--nbd"])
                .arg(dir.path().join("bad.sock")),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(exit_code(&out), 4, "{dev}: {err}");
        assert_eq!(err.lines().count(), 1, "{dev}: {err}");
        assert!(err.contains(&dev) && err.contains(why), "{dev}: {err}");
    }
}
