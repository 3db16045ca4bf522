//! NBD backings (`nbd+unix://`, `nbd://`): a LUKS2 volume that cryptsetup formatted, kept on
//! nbdkit's file plugin or qemu-storage-daemon, served by cryptblk with a crypt table over
//! the remote export. fio verifies through cryptblk's export, the file decrypts with the
//! independent model, and a remote server that dies and comes back gives errors, never
//! wrong data, then serves again.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const IMG_SIZE: u64 = 64 << 20;

/// A remote server process, killed when dropped.
struct Remote(Child);

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_socket(sock: &Path) {
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nbdkit(img: &Path, sock: &Path) -> Remote {
    let _ = std::fs::remove_file(sock);
    let child = spawn_captured(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(sock)
            .arg("file")
            .arg(img),
    );
    wait_for_socket(sock);
    Remote(child)
}

fn qemu_storage_daemon(img: &Path, sock: &Path) -> Remote {
    let _ = std::fs::remove_file(sock);
    let child = spawn_captured(
        Command::new("qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=f,filename={},cache.direct=off",
                img.display()
            ))
            .arg("--nbd-server")
            .arg(format!("addr.type=unix,addr.path={}", sock.display()))
            .args([
                "--export",
                "type=nbd,id=e,node-name=f,name=disk,writable=on",
            ]),
    );
    wait_for_socket(sock);
    Remote(child)
}

/// A cryptsetup LUKS2 image and the crypt table that maps it over `uri`:
/// (table file, volume key hex, data offset, sector size).
fn luks_over(dir: &Path, img: &Path, uri: &str) -> Option<(PathBuf, String, usize, u32)> {
    let key = write_file(dir, "pass", b"remote passphrase");
    cryptsetup_luks2(img, &key, IMG_SIZE)?;
    let vk = cryptsetup_volume_key(img, &key, &[])?;
    let (offset, sector) = cryptsetup_luks2_segment(img)?;
    let sectors = (IMG_SIZE as usize - offset) / 512;
    let table = format!(
        "0 {sectors} crypt aes-xts-plain64 {vk} 0 {uri} {} 1 sector_size:{sector}\n",
        offset / 512
    );
    let path = write_file(dir, "table", table.as_bytes());
    Some((path, vk, offset, sector))
}

fn create(name: &str, table: &Path, sock: &Path) -> Served {
    run_ok(
        cryptblk()
            .args(["dm", "create", name, "--table-file"])
            .arg(table)
            .arg("--nbd")
            .arg(sock),
        b"",
    );
    Served::volume(name)
}

/// fio --verify=crc32c through cryptblk's export, then a pattern written through it that
/// the independent model finds encrypted in the image file.
fn verify_stack(dir: &Path, img: &Path, export: &Path, vk: &str, offset: usize, sector: u32) {
    let fio = spawn_fio_verify(dir, export, "remote", "8M", 1);
    fio_jobs(fio, "through an NBD backing");
    let pattern = dir.join("pattern");
    let plain = write_pattern(&pattern, 1 << 20, 11);
    run_ok(
        Command::new("nbdcopy")
            .arg(&pattern)
            .arg(nbd_uri(export))
            .arg("--flush"),
        b"",
    );
    // The data reached the file (nbdcopy flushed through cryptblk to the remote server).
    let file = std::fs::read(img).unwrap();
    let cipher = &file[offset..offset + plain.len()];
    let decrypted = independent("decrypt", "aes-xts-plain64", vk, sector, cipher);
    assert!(
        decrypted == plain,
        "the image does not decrypt to what was written"
    );
}

#[test]
fn luks2_on_nbdkit_file_plugin() {
    assert!(
        tool("nbdkit").is_some() && tool("fio").is_some() && tool("nbdcopy").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let img = dir.path().join("remote.img");
    let remote_sock = dir.path().join("nbdkit.sock");
    let uri = format!("nbd+unix:///?socket={}", remote_sock.display());
    let Some((table, vk, offset, sector)) = luks_over(dir.path(), &img, &uri) else {
        return;
    };
    let _remote = nbdkit(&img, &remote_sock);
    let export = dir.path().join("export.sock");
    let _served = create("overnbdkit", &table, &export);
    verify_stack(dir.path(), &img, &export, &vk, offset, sector);
    // The header is untouched: cryptsetup still reads it on the file.
    if let Some(mut c) = cryptsetup() {
        run_ok(c.arg("luksDump").arg(&img), b"");
    }
}

#[test]
fn luks2_on_qemu_storage_daemon() {
    assert!(
        tool("qemu-storage-daemon").is_some() && tool("fio").is_some() && tool("nbdcopy").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let img = dir.path().join("remote.img");
    let remote_sock = dir.path().join("qsd.sock");
    let uri = format!("nbd+unix:///disk?socket={}", remote_sock.display());
    let Some((table, vk, offset, sector)) = luks_over(dir.path(), &img, &uri) else {
        return;
    };
    let _remote = qemu_storage_daemon(&img, &remote_sock);
    let export = dir.path().join("export.sock");
    let _served = create("overqsd", &table, &export);
    verify_stack(dir.path(), &img, &export, &vk, offset, sector);
}

/// nbdcopy of `len` bytes from the export to a file: the bytes, or None if it failed.
fn read_export(dir: &Path, export: &Path, len: usize) -> Option<Vec<u8>> {
    let out = dir.join("readback");
    let _ = std::fs::remove_file(&out);
    let r = run(Command::new("nbdcopy").arg(nbd_uri(export)).arg(&out), b"");
    if !r.status.success() {
        return None;
    }
    let mut data = std::fs::read(&out).unwrap();
    data.truncate(len);
    Some(data)
}

#[test]
fn remote_server_lost_and_back_gives_errors_never_wrong_data() {
    assert!(
        tool("nbdkit").is_some() && tool("nbdcopy").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let img = dir.path().join("remote.img");
    let remote_sock = dir.path().join("nbdkit.sock");
    let uri = format!("nbd+unix:///?socket={}", remote_sock.display());
    let Some((table, vk, offset, _)) = luks_over(dir.path(), &img, &uri) else {
        return;
    };
    let remote = nbdkit(&img, &remote_sock);
    let export = dir.path().join("export.sock");
    let _served = create("flaky", &table, &export);
    let pattern = dir.path().join("pattern");
    let size = IMG_SIZE as usize - offset;
    let plain = write_pattern(&pattern, size, 5);
    run_ok(
        Command::new("nbdcopy")
            .arg(&pattern)
            .arg(nbd_uri(&export))
            .arg("--flush"),
        b"",
    );

    // Readers going on while the server is killed and started again: every read either
    // fails or returns exactly what was written.
    let reader = {
        let dir = dir.path().to_path_buf();
        let export = export.clone();
        let plain = plain.clone();
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0, 0);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(4) {
                match read_export(&dir, &export, plain.len()) {
                    Some(data) => {
                        assert!(data == plain, "wrong data read while the server restarted");
                        ok += 1;
                    }
                    None => failed += 1,
                }
            }
            (ok, failed)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    drop(remote);
    // A read with the server gone fails (EIO), it does not return stale or zero data.
    assert!(read_export(dir.path(), &export, plain.len()).is_none());
    std::thread::sleep(Duration::from_millis(1000));
    let _remote = nbdkit(&img, &remote_sock);
    let (ok, failed) = reader.join().unwrap();
    assert!(
        failed > 0,
        "no read failed while the server was gone ({ok} succeeded)"
    );

    // Back: reads succeed again (after the reconnect pause) with the right data.
    std::thread::sleep(Duration::from_millis(1200));
    let back = read_export(dir.path(), &export, plain.len()).expect("read after restart");
    assert!(back == plain);
    let facts = status("flaky");
    let remote = &facts["info"]["remote_nbd"][0];
    assert!(remote["errors"].as_u64().unwrap_or(0) > 0, "{facts}");
    assert!(remote["reconnects"].as_u64().unwrap_or(0) >= 1, "{facts}");
    assert_eq!(remote["connected"], true, "{facts}");

    // The daemon's log says what happened, with the failed request's place, and never the key.
    let log = std::fs::read_to_string(common::runtime_dir().join("flaky.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("request at") && l.contains("failed")),
        "no failed request in the log:\n{log}"
    );
    assert!(
        log.contains("connected again"),
        "no reconnect in the log:\n{log}"
    );
    assert!(
        !log.to_lowercase().contains(&vk.to_lowercase()),
        "the key is in the log"
    );
}
