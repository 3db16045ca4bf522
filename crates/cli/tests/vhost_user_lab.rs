//! `cryptblk open --vhost-user` with a real VM: the lab (/work/shared/lab) boots QEMU with
//! the daemon's socket as its virtio-blk disk /dev/vda. The guest checks the geometry and
//! queues, makes ext4 and runs fio --verify=crc32c on it, then has its own kernel dm-crypt
//! open the LUKS2 image as the host holds it and read exactly what it wrote through
//! cryptblk. A second VM on the same daemon (a new frontend after the first disconnected)
//! reads the first one's file system back. Guest script: fixtures/vhost-user/guest.sh.
//!
//! Skipped only when CRYPTBLK_SKIP_LAB=1; a lab that cannot boot fails the test.

mod common;
use common::*;
use std::path::Path;

/// Boots the lab with `socket` as a vhost-user-blk disk of `queues` queues and runs the
/// guest script in `mode`; returns its output after checking that every check passed.
fn boot(share: &Path, socket: &Path, queues: u16, mode: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vhost-user/guest.sh");
    let qemu_args = format!(
        "-chardev socket,id=vu0,path={} -device vhost-user-blk-pci,chardev=vu0,num-queues={queues}",
        socket.display()
    );
    let out = lab_vm(&script)
        .arg(mode)
        .env("LAB_SHARE", share)
        .env("LAB_SHARED_MEM", "1")
        .env("LAB_MEM", "1G")
        .env("LAB_QEMU_ARGS", qemu_args)
        .env("LAB_TIMEOUT", "900")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the lab: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "lab run ({mode}) failed ({})",
        out.status
    );
    assert!(
        stdout.contains("ALL PASSED") && !stdout.contains("FAIL "),
        "guest checks ({mode})"
    );
    stdout
}

#[test]
fn a_vm_boots_on_a_vhost_user_volume_and_kernel_dm_crypt_reads_it() {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab test: CRYPTBLK_SKIP_LAB=1 is set");
        return;
    }
    let share = tempfile::Builder::new()
        .prefix("cb-vhost-lab")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = share.path();
    let key = s.join("key");
    std::fs::write(&key, b"vhost-user to the kernel").unwrap();
    let img = s.join("disk.img");
    cryptblk_luks2(&img, &key, 96 << 20);
    write_pattern(&s.join("pattern.bin"), 1 << 20, 77);

    // A short socket path (sun_path is 108 bytes).
    let work = tempdir();
    let socket = work.path().join("vu.sock");
    let name = format!("cbvu-{}", std::process::id() % 100_000);
    let queues = 2u16;
    run_ok(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(&name)
            .arg("--vhost-user")
            .arg(&socket)
            .args(["--queues", &queues.to_string()]),
        b"",
    );
    let served = Served::volume(&name);
    let facts = status(&name);
    assert_eq!(facts["export"]["kind"], "vhostuser", "{facts}");
    let size = facts["size"].as_u64().expect("size in status");
    let sector_size = facts["info"]["sector_size"]
        .as_u64()
        .expect("sector size in status");
    std::fs::write(s.join("expect"), format!("{size} {sector_size} {queues}\n")).unwrap();

    let first = boot(s, &socket, queues, "write");
    assert!(first.contains("PASS kernel dm-crypt reads what the guest wrote"));
    // The daemon is still serving: a new VM connects to the same socket.
    let second = boot(s, &socket, queues, "reread");
    assert!(second.contains("PASS the second VM reads the first one's file"));
    drop(served);
}

/// The daemon's pid, from its status.
fn daemon_pid(name: &str) -> i32 {
    status(name)["pid"].as_i64().expect("status has the pid") as i32
}

/// Waits (at most 5 minutes: the guest is emulated) until the guest has finished more
/// than `after` fio rounds; fails if the lab ends first.
fn wait_rounds(share: &Path, lab: &mut std::process::Child, after: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let done = std::fs::read_to_string(share.join("rounds"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if done > after {
            return done;
        }
        if let Some(status) = lab.try_wait().unwrap() {
            panic!(
                "the lab ended ({status}) after {done} rounds, waiting for round {}",
                after + 1
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no fio round past {after} in 5 minutes"
        );
        // The guest reports through a file in the share: polled.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// issue 28 item 3: QEMU's vhost-user-blk frontend reconnects (`reconnect=1`) to the
/// daemon opened again after a `kill -9`, and to the daemon that replaced it through
/// `cryptblk upgrade`, while the guest runs fio --verify=crc32c on /dev/vda: fio ends with
/// 0 errors. About 50 s here (TCG, kernel 6.12): ignored to keep CI short.
#[test]
#[ignore = "kernel lab, minutes: cargo test --test vhost_user_lab -- --ignored"]
fn a_vm_survives_a_killed_and_an_upgraded_vhost_user_daemon() {
    let share = tempfile::Builder::new()
        .prefix("cb-vhost-survive")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = share.path();
    let key = s.join("key");
    std::fs::write(&key, b"vhost-user survives").unwrap();
    let img = s.join("disk.img");
    cryptblk_luks2(&img, &key, 64 << 20);
    let work = tempdir();
    let socket = work.path().join("vu.sock");
    let name = format!("cbvs-{}", std::process::id() % 100_000);
    let open = || {
        run_ok(
            cryptblk()
                .args(["open", "--key-file"])
                .arg(&key)
                .arg(&img)
                .arg(&name)
                .arg("--vhost-user")
                .arg(&socket),
            b"",
        )
    };
    open();
    let served = Served::volume(&name);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vhost-user/survive.sh");
    let qemu_args = format!(
        "-chardev socket,id=vu0,path={},reconnect=1 -device vhost-user-blk-pci,chardev=vu0,num-queues=1",
        socket.display()
    );
    let mut lab = lab_vm(&script)
        .env("LAB_SHARE", s)
        .env("LAB_SHARED_MEM", "1")
        .env("LAB_MEM", "1G")
        .env("LAB_QEMU_ARGS", qemu_args)
        .env("LAB_TIMEOUT", "900")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the lab: {e}"));
    let started = std::time::Instant::now();
    let first = wait_rounds(s, &mut lab, 0);

    let pid = daemon_pid(&name);
    // SAFETY: plain kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon {pid} survived SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    open();
    let after_kill = wait_rounds(s, &mut lab, first + 1);
    let killed_pid = daemon_pid(&name);

    let up = run(cryptblk().args(["upgrade", &name]), b"");
    assert!(
        up.status.success(),
        "upgrade: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_ne!(daemon_pid(&name), killed_pid, "upgrade kept the pid");
    wait_rounds(s, &mut lab, after_kill + 1);
    std::fs::write(s.join("stop"), b"").unwrap();
    let out = lab.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "{stdout}\n{}\nlab run took {:?}",
        String::from_utf8_lossy(&out.stderr),
        started.elapsed()
    );
    assert!(out.status.success(), "lab run failed ({})", out.status);
    assert!(
        stdout.contains("ALL PASSED") && !stdout.contains("FAIL "),
        "guest checks"
    );
    drop(served);
}
