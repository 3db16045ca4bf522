//! Feeds arbitrary bytes to the loop-AES key file parser as a key file, with each key size
//! cryptsetup derives by default, and runs an accepted file's key through the dm-crypt
//! cipher it maps (`aes-cbc-plain64` or `aes:64-cbc-lmk`) on two sectors. Garbage must be an
//! error, never a panic.
#![no_main]

use cryptblk_cipher::{open_cipher, SectorOptions};
use cryptblk_format::loopaes::derive_key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for key_size in [16, 24, 32] {
        let Ok(k) = derive_key(data, key_size, None) else {
            continue;
        };
        assert_eq!(k.key.len(), k.keys_count * key_size);
        let c = open_cipher(&k.cipher_spec("aes"), k.key.as_bytes(), &SectorOptions::default())
            .expect("a derived key opens its cipher");
        let mut buf = [0x5au8; 1024];
        c.encrypt(7, &mut buf).unwrap();
        c.decrypt(7, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5a));
    }
});
