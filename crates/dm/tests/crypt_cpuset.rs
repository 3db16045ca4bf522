//! The queued pipeline's per-CPU workers respect the CPUs the process may use (a
//! container's cpuset, `taskset`). Its own test binary: it lists the process's `kcryptd/`
//! threads, which a test running beside it in the same process would add to.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::KEY64;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, CryptFlags, CryptParams, CryptTarget, RamDisk, WriteFlags};

fn target(flags: CryptFlags) -> Arc<CryptTarget> {
    let params = CryptParams {
        cipher_spec: "aes-xts-plain64".into(),
        key: SecretBytes::from_vec(hex::decode(KEY64).unwrap()),
        iv_offset: 0,
        dev_spec: "ram".into(),
        offset_sectors: 0,
        flags,
        implementation: None,
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(RamDisk::new(1 << 20).unwrap());
    Arc::new(CryptTarget::new(dev, 1 << 20, params).unwrap())
}

/// The CPUs in the `Cpus_allowed_list` line of a thread's status.
fn allowed_list(tid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn same_cpu_crypt_workers_stay_on_the_cpus_the_process_may_use() {
    // Restrict a thread to the last CPU, as `taskset -c N` or a container's cpuset does,
    // and start a queued engine from it: its per-CPU workers must bind to CPU N, not to
    // CPU 0..n-1.
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    // With one CPU there is nothing outside the set to escape to and the test could not
    // fail: a missing second CPU fails it rather than passing it unchecked.
    assert!(
        all >= 2,
        "this test needs at least 2 CPUs in the process's affinity mask (it has {all})"
    );
    let last = (0..libc::CPU_SETSIZE as usize)
        .rev()
        .find(|&c| {
            // SAFETY: plain data; CPU_ISSET within the set.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
                libc::CPU_ISSET(c, &set)
            }
        })
        .unwrap();
    std::thread::spawn(move || {
        // SAFETY: plain data; CPU_SET within the set; this thread only.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(last, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
        let t = target(CryptFlags {
            same_cpu_crypt: true,
            ..CryptFlags::default()
        });
        t.write_at(0, &[7u8; 4096], WriteFlags::default()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut workers = 0;
        for e in std::fs::read_dir("/proc/self/task").unwrap() {
            let tid = e.unwrap().file_name().into_string().unwrap();
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
            if comm.starts_with("kcryptd/") {
                workers += 1;
                assert_eq!(comm.trim(), format!("kcryptd/{last}"));
                assert_eq!(allowed_list(&tid), last.to_string(), "{comm}");
            }
        }
        assert_eq!(workers, 1, "one worker per allowed CPU");
        drop(t);
    })
    .join()
    .unwrap();
}
