//! The I/O workloads: the reference's fio command and its variations.

use serde::Serialize;

/// How offsets advance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessPattern {
    /// fio `readwrite`: reads and writes each walk the region sequentially (fio keeps one
    /// position per direction), the direction of each I/O drawn by the read mix.
    Sequential,
    /// fio `randrw`: uniformly random block-aligned offsets.
    Random,
}

/// One workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// Short name used in filters, tables and charts.
    pub name: String,
    /// One line saying what it is.
    pub description: String,
    /// Offset pattern.
    pub pattern: AccessPattern,
    /// Percentage of I/Os that are reads (fio `rwmixread`).
    pub read_percent: u8,
    /// Bytes per I/O.
    pub block_size: u64,
    /// Independent jobs (fio `numjobs`), each on its own slice of the region.
    pub jobs: u32,
    /// I/Os in flight per job (fio `iodepth`; in-process: threads per job).
    pub iodepth: u32,
}

impl Workload {
    fn new(
        name: &str,
        description: &str,
        pattern: AccessPattern,
        bs: u64,
        jobs: u32,
        qd: u32,
    ) -> Self {
        Workload {
            name: name.into(),
            description: description.into(),
            pattern,
            read_percent: 50,
            block_size: bs,
            jobs,
            iodepth: qd,
        }
    }

    /// Every built-in workload; the first is the reference's command.
    pub fn builtin() -> Vec<Workload> {
        use AccessPattern::*;
        vec![
            Workload::new(
                "rw4k",
                "the reference: fio --readwrite=readwrite --bs=4k --direct=1, psync, iodepth 1",
                Sequential,
                4096,
                1,
                1,
            ),
            Workload::new(
                "randrw4k",
                "random 50/50 read/write, 4 KiB, iodepth 1",
                Random,
                4096,
                1,
                1,
            ),
            Workload::new(
                "randrw64k",
                "random 50/50 read/write, 64 KiB, iodepth 1",
                Random,
                64 << 10,
                1,
                1,
            ),
            Workload::new(
                "randrw1m",
                "random 50/50 read/write, 1 MiB, iodepth 1",
                Random,
                1 << 20,
                1,
                1,
            ),
            Workload::new(
                "randrw4k-4j-qd16",
                "random 50/50 read/write, 4 KiB, 4 jobs x iodepth 16",
                Random,
                4096,
                4,
                16,
            ),
        ]
    }

    /// fio's `--rw` value. Pure reads and writes get fio's one-direction modes: fio treats a
    /// `readwrite` job as mixed even at `--rwmixread=100` and then does not check what it
    /// One sequential pass of 1 MiB writes, 4 in flight: how regions are filled before
    /// they are read (fio headers, a peer's image).
    pub fn sequential_fill(name: &str) -> Workload {
        Workload {
            name: name.into(),
            description: String::new(),
            pattern: AccessPattern::Sequential,
            read_percent: 0,
            block_size: 1 << 20,
            jobs: 1,
            iodepth: 4,
        }
    }

    /// reads against verification headers.
    pub fn fio_rw(&self) -> &'static str {
        match (self.pattern, self.read_percent) {
            (AccessPattern::Sequential, 100) => "read",
            (AccessPattern::Sequential, 0) => "write",
            (AccessPattern::Sequential, _) => "readwrite",
            (AccessPattern::Random, 100) => "randread",
            (AccessPattern::Random, 0) => "randwrite",
            (AccessPattern::Random, _) => "randrw",
        }
    }

    /// Total I/Os in flight.
    pub fn concurrency(&self) -> u32 {
        self.jobs * self.iodepth
    }

    /// The byte length of each job's slice of a `region`-byte area: equal, block aligned.
    pub fn slice_len(&self, region: u64, parts: u32) -> u64 {
        let per = region / u64::from(parts.max(1));
        per - per % self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_sane() {
        let all = Workload::builtin();
        assert_eq!(all[0].name, "rw4k");
        assert_eq!(all[0].fio_rw(), "readwrite");
        let pure = |pattern, read_percent| Workload {
            pattern,
            read_percent,
            ..all[0].clone()
        };
        assert_eq!(pure(AccessPattern::Sequential, 100).fio_rw(), "read");
        assert_eq!(pure(AccessPattern::Sequential, 0).fio_rw(), "write");
        assert_eq!(pure(AccessPattern::Random, 100).fio_rw(), "randread");
        assert_eq!(pure(AccessPattern::Random, 0).fio_rw(), "randwrite");
        assert_eq!(pure(AccessPattern::Random, 70).fio_rw(), "randrw");
        for w in &all {
            assert!(w.block_size % 4096 == 0);
            assert!(w.concurrency() >= 1);
            let slice = w.slice_len(256 << 20, w.concurrency());
            assert!(slice >= w.block_size && slice % w.block_size == 0);
        }
        assert_eq!(all[4].concurrency(), 64);
    }
}
