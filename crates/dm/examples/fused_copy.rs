//! Thread-CPU time per request of the two ways `crypt` can read from and write to a RAM
//! disk: copy then transform in place, or transform while copying (one pass). CPU time, not
//! wall time, so a busy machine perturbs it less. `cargo run --release -p cryptblk-dm
//! --example fused_copy`.

#[path = "common/mod.rs"]
mod common;

use std::io;

use common::cpu_ns;
use cryptblk_cipher::{open_cipher, SectorCipher, SectorOptions};
use cryptblk_dm::backing::RamDisk;
use cryptblk_dm::device::{BlockDevice, CopyTransform, WriteFlags};

struct Decrypt<'a>(&'a dyn SectorCipher);

impl CopyTransform for Decrypt<'_> {
    fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()> {
        self.0
            .decrypt(pos as u64 / 512, buf)
            .map_err(io::Error::other)
    }
    fn copy(&self, pos: usize, src: &[u8], dst: &mut [u8]) -> io::Result<()> {
        self.0
            .decrypt_to(pos as u64 / 512, src, dst)
            .map_err(io::Error::other)
    }
}

struct Encrypt<'a>(&'a dyn SectorCipher);

impl CopyTransform for Encrypt<'_> {
    fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()> {
        self.0
            .encrypt(pos as u64 / 512, buf)
            .map_err(io::Error::other)
    }
    fn copy(&self, pos: usize, src: &[u8], dst: &mut [u8]) -> io::Result<()> {
        self.0
            .encrypt_to(pos as u64 / 512, src, dst)
            .map_err(io::Error::other)
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    const DISK: u64 = 512 << 20;
    let key: Vec<u8> = (0..64u8).collect();
    let c = open_cipher("aes-xts-plain64", &key, &SectorOptions::default()).unwrap();
    let ram = RamDisk::new(DISK).unwrap();
    let fill = vec![0x5au8; 1 << 20];
    for off in (0..DISK).step_by(fill.len()) {
        ram.write_at(off, &fill, WriteFlags::default()).unwrap();
    }
    println!("size     op     copy+in-place µs  fused µs  plain copy µs  (thread CPU, medians)");
    for size in [4096usize, 65536, 1 << 20] {
        for op in ["read", "write"] {
            let mut buf = vec![0u8; size];
            let (mut a, mut b, mut p) = (Vec::new(), Vec::new(), Vec::new());
            let n = (DISK as usize / size).min(400);
            for i in 0..n {
                // Walk the disk so data comes from memory, not cache, as on a real RAM disk.
                let off = (i * size) as u64 % DISK;
                let t0 = cpu_ns();
                if op == "read" {
                    ram.read_at(off, &mut buf).unwrap();
                    c.decrypt(off / 512, &mut buf).unwrap();
                } else {
                    c.encrypt(off / 512, &mut buf).unwrap();
                    ram.write_at(off, &buf, WriteFlags::default()).unwrap();
                }
                let t1 = cpu_ns();
                let off2 = (DISK / 2 + off) % DISK;
                if op == "read" {
                    ram.read_transformed(off2, &mut buf, &Decrypt(&*c)).unwrap();
                } else {
                    ram.write_transformed(off2, &mut buf, &Encrypt(&*c), WriteFlags::default())
                        .unwrap();
                }
                let t2 = cpu_ns();
                if op == "read" {
                    ram.read_at(off, &mut buf).unwrap();
                } else {
                    ram.write_at(off, &buf, WriteFlags::default()).unwrap();
                }
                let t3 = cpu_ns();
                a.push(t1 - t0);
                b.push(t2 - t1);
                p.push(t3 - t2);
            }
            println!(
                "{size:>8} {op:<6} {:>16.1} {:>9.1} {:>14.1}",
                median(a) as f64 / 1e3,
                median(b) as f64 / 1e3,
                median(p) as f64 / 1e3
            );
        }
    }
}
