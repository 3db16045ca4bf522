//! Feeds arbitrary decrypted TCRYPT headers to the parser and everything computed from one:
//! data offset and size on a device of any size, the volume key and layers of every cipher
//! chain, its data cipher (the legacy CBC engine included), the dump text and the key-file
//! pool. None may panic (the fields come from whoever made the
//! volume); offsets stay inside the device. The first input byte chooses whether the magic
//! and both CRC32s are fixed up, so the field handling behind the checks is reached.
#![no_main]

use cryptblk_cipher::SecretBytes;
use cryptblk_format::tcrypt::{pool_keyfiles, Prf, TcryptHeader, TcryptVolume, HEADER_LEN, TCRYPT_CHAINS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut plain = [0u8; HEADER_LEN];
    let n = rest.len().min(HEADER_LEN);
    plain[..n].copy_from_slice(&rest[..n]);
    if mode & 1 == 1 {
        plain[64..68].copy_from_slice(if mode & 2 == 2 { b"VERA" } else { b"TRUE" });
        let keys = crc32fast::hash(&plain[256..512]);
        plain[72..76].copy_from_slice(&keys.to_be_bytes());
        let fields = crc32fast::hash(&plain[64..252]);
        plain[252..256].copy_from_slice(&fields.to_be_bytes());
    }
    let device_size = rest
        .get(HEADER_LEN..HEADER_LEN + 8)
        .map_or(1 << 20, |b| u64::from_le_bytes(b.try_into().unwrap()));
    if let Some(header) = TcryptHeader::parse(&plain, true) {
        let chain = &TCRYPT_CHAINS[mode as usize % TCRYPT_CHAINS.len()];
        let header_offset = u64::from(mode) * 512;
        let vol = TcryptVolume {
            volume_key: chain.volume_key(header.keys.as_bytes()),
            header,
            prf: Prf::Argon2id,
            chain,
            header_offset,
            device_size,
            system: mode & 4 == 4,
        };
        let off = vol.data_offset_sectors();
        let len = vol.data_size_sectors();
        if off.saturating_mul(512) <= device_size {
            assert!(off.saturating_mul(512) + len * 512 <= device_size);
        }
        assert_eq!(vol.volume_key.len(), chain.volume_key_len());
        match vol.layers() {
            Some(layers) => assert_eq!(layers.len(), chain.ciphers.len()),
            None => assert!(!chain.kernel_mappable()),
        }
        // The whole chain (legacy CBC engine or stacked dm-crypt layers) keys from any key
        // area and round-trips a sector at the volume's IV offset.
        let cipher = vol.data_cipher(None).expect("every chain opens over a key area");
        let mut sector = [0u8; 512];
        let n = rest.len().min(512);
        sector[..n].copy_from_slice(&rest[..n]);
        let orig = sector;
        cipher.encrypt(u64::from(mode), &mut sector).unwrap();
        cipher.decrypt(u64::from(mode), &mut sector).unwrap();
        assert_eq!(sector, orig);
        let _ = vol.dump("fuzz", mode & 8 == 8);
    }
    let files: Vec<SecretBytes> = rest.chunks(97).map(SecretBytes::from_slice).collect();
    assert_eq!(pool_keyfiles(&files, 64).len(), 64);
});
