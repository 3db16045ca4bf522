//! Measures AWS-LC's raw AES-256-XTS routine (an internal, exported symbol) against the EVP
//! path cryptblk uses, to quantify the per-sector EVP overhead. Diagnostic only.

use aws_lc_sys as sys;
use std::time::Duration;

extern "C" {
    #[link_name = "aws_lc_0_47_0_aes_hw_xts_cipher"]
    fn aes_hw_xts_cipher(
        inp: *const u8,
        out: *mut u8,
        len: usize,
        key1: *const sys::AES_KEY,
        key2: *const sys::AES_KEY,
        iv: *const u8,
        enc: i32,
    ) -> i32;
}

fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let key: Vec<u8> = (0..64u8).collect();
    let mut k1 = sys::AES_KEY {
        rd_key: [0; 60],
        rounds: 0,
    };
    let mut k2 = sys::AES_KEY {
        rd_key: [0; 60],
        rounds: 0,
    };
    unsafe {
        sys::AES_set_encrypt_key(key.as_ptr(), 256, &mut k1);
        sys::AES_set_encrypt_key(key[32..].as_ptr(), 256, &mut k2);
    }
    let mut buf = vec![0u8; 4096];
    for _ in 0..3 {
        let start = cpu();
        let mut n = 0u64;
        while cpu() - start < Duration::from_secs(2) {
            for s in 0..64u64 {
                let mut iv = [0u8; 16];
                iv[..8].copy_from_slice(&(n + s).to_le_bytes());
                let p = buf.as_mut_ptr();
                unsafe { aes_hw_xts_cipher(p, p, 4096, &k1, &k2, iv.as_ptr(), 1) };
            }
            n += 64;
        }
        let secs = (cpu() - start).as_secs_f64();
        println!(
            "raw aes_hw_xts_cipher: {:.0} MB/s",
            n as f64 * 4096.0 / secs / 1e6
        );
        let t = cryptblk_cipher::measure(
            "aes-xts-plain64",
            64,
            4096,
            Some("aws-lc"),
            Duration::from_secs(2),
        )
        .unwrap();
        println!(
            "cryptblk aws-lc EVP:  {:.0} MB/s",
            t.encrypt_mb_s * 1.048576
        );
    }
}
