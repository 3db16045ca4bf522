//! The pipelines' hand-offs are real: a recording lower device sees which thread submits
//! each request, and in which order the sorting writer submits a backlog.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::KEY64;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, CryptFlags, CryptParams, CryptTarget, RamDisk, WriteFlags};

/// Records (thread name, op, offset) of every request, optionally slowing writes down.
struct Recorder {
    inner: RamDisk,
    log: Mutex<Vec<(String, &'static str, u64)>>,
    /// (thread name, nice value) of every request's submitter.
    nice: Mutex<Vec<(String, i32)>>,
    write_delay: Duration,
}

/// The calling thread's nice value.
fn own_nice() -> i32 {
    // SAFETY: no memory preconditions; errno tells -1 from an error.
    unsafe {
        *libc::__errno_location() = 0;
        let v = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
        assert_eq!(*libc::__errno_location(), 0, "getpriority failed");
        v
    }
}

impl Recorder {
    fn new(write_delay: Duration) -> Arc<Self> {
        Arc::new(Recorder {
            inner: RamDisk::new(1 << 20).unwrap(),
            log: Mutex::new(Vec::new()),
            nice: Mutex::new(Vec::new()),
            write_delay,
        })
    }
    fn record(&self, op: &'static str, offset: u64) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.nice.lock().unwrap().push((name.clone(), own_nice()));
        self.log.lock().unwrap().push((name, op, offset));
    }
    fn take(&self) -> Vec<(String, &'static str, u64)> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

impl BlockDevice for Recorder {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.record("read", offset);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> std::io::Result<()> {
        self.record("write", offset);
        std::thread::sleep(self.write_delay);
        self.inner.write_at(offset, buf, flags)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn target(dev: Arc<Recorder>, flags: CryptFlags) -> Arc<CryptTarget> {
    let params = CryptParams {
        cipher_spec: "aes-xts-plain64".into(),
        key: SecretBytes::from_vec(hex::decode(KEY64).unwrap()),
        iv_offset: 0,
        dev_spec: "recorder".into(),
        offset_sectors: 0,
        flags,
        implementation: None,
    };
    Arc::new(CryptTarget::new(dev, 1 << 20, params).unwrap())
}

fn on_thread(name: &str, f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn each_pipeline_submits_from_the_expected_thread() {
    let cases: [(CryptFlags, &str, &str); 3] = [
        (CryptFlags::inline(), "caller", "caller"),
        (CryptFlags::default(), "kcryptd_io", "dmcrypt_write"),
        (
            CryptFlags {
                submit_from_crypt_cpus: true,
                ..CryptFlags::default()
            },
            "kcryptd_io",
            "kcryptd/",
        ),
    ];
    for (flags, reader, writer) in cases {
        let rec = Recorder::new(Duration::ZERO);
        let t = target(rec.clone(), flags);
        let t2 = t.clone();
        on_thread("caller", move || {
            t2.write_at(4096, &[1u8; 4096], WriteFlags::default())
                .unwrap();
            let mut b = [0u8; 4096];
            t2.read_at(4096, &mut b).unwrap();
            assert_eq!(b, [1u8; 4096]);
        });
        let log = rec.take();
        assert_eq!(log.len(), 2, "{log:?}");
        assert!(
            log[0].0.starts_with(writer),
            "write submitted by {}: {flags:?}",
            log[0].0
        );
        assert!(
            log[1].0.starts_with(reader),
            "read submitted by {}: {flags:?}",
            log[1].0
        );
    }
}

#[test]
fn dmcrypt_write_sorts_a_backlog_by_sector() {
    // Writes take 30 ms each, so while the writer is busy with the first one, the others
    // pile up; the writer must then submit them in ascending sector order.
    let rec = Recorder::new(Duration::from_millis(30));
    let t = target(rec.clone(), CryptFlags::default());
    let writers: Vec<_> = (0..8u64)
        .map(|i| {
            let t = t.clone();
            std::thread::spawn(move || {
                // Stagger the submissions in descending sector order.
                std::thread::sleep(Duration::from_millis(3 * i));
                let off = (7 - i) * 65536;
                t.write_at(off, &[i as u8; 4096], WriteFlags::default())
                    .unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let log = rec.take();
    assert_eq!(log.len(), 8);
    assert!(log.iter().all(|(name, _, _)| name == "dmcrypt_write"));
    // Requests arrived in descending sector order. A FIFO writer would submit them that way
    // (7 descents); the sorting writer turns each batch it drains into an ascending run, so
    // only batch boundaries can descend. Normally that is one batch behind the first write;
    // allow a couple more in case the scheduler split the backlog.
    let offsets: Vec<u64> = log.iter().map(|e| e.2).collect();
    let descents = offsets.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(
        descents <= 3,
        "backlog not submitted in sector order: {offsets:?}"
    );
}

/// `high_priority` (dm-crypt 1.25, cryptsetup 2.8's --perf-high_priority): the threads that
/// stand in for dm-crypt's workqueues and writer thread run at nice -20, as the kernel's
/// do; without the flag they keep the creator's priority, and creating the target leaves
/// the creating thread's own priority as it was. Tests run as root (CAP_SYS_NICE).
#[test]
fn high_priority_raises_the_pipeline_threads_to_nice_minus_20() {
    assert_eq!(
        CryptFlags::parse(&["same_cpu_crypt".into(), "high_priority".into()])
            .unwrap()
            .format(),
        ["same_cpu_crypt", "high_priority"],
        "the kernel's order"
    );
    for high in [true, false] {
        let rec = Recorder::new(Duration::ZERO);
        let before = own_nice();
        let want = if high { -20 } else { before };
        let t = target(
            rec.clone(),
            CryptFlags {
                high_priority: high,
                ..CryptFlags::default()
            },
        );
        assert_eq!(own_nice(), before, "the creator's priority is restored");
        let t2 = t.clone();
        on_thread("caller", move || {
            t2.write_at(0, &[7u8; 4096], WriteFlags::default()).unwrap();
            let mut b = [0u8; 4096];
            t2.read_at(0, &mut b).unwrap();
        });
        let seen = std::mem::take(&mut *rec.nice.lock().unwrap());
        assert_eq!(seen.len(), 2, "{seen:?}");
        for (thread, nice) in &seen {
            assert!(
                thread == "dmcrypt_write" || thread == "kcryptd_io",
                "submitted by {thread}"
            );
            assert_eq!(*nice, want, "{thread} with high_priority={high}");
        }
    }
}
