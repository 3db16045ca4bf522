//! Cross-check of the authenticated sector ciphers against pyca/cryptography (an
//! independent AES-GCM, AES-CCM, ChaCha20-Poly1305, HMAC, AES-XTS and AES-CBC): sectors sealed by
//! cryptblk are opened by a small Python model of dm-crypt's AEAD layout (tuple = tag ||
//! stored IV; associated data = le64 sector || IV; authenc = HMAC(auth key, AD ||
//! ciphertext) truncated; ESSIV salt = H(enc key || auth key)), and the reverse direction
//! is covered by a flipped bit failing here. The kernel itself is the reference in
//! cryptblk-dm's aead_kernel tests; this pins the primitives independently.
//!
//! python3 with `cryptography` is required; set CRYPTBLK_SKIP_PYTHON=1 to skip explicitly.

use cryptblk_cipher::aead::{open_aead_cipher, AeadOptions};
use std::process::Command;

const MODEL: &str = r#"
import sys, hmac, hashlib
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESCCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
spec, key, ss, tuple_size, sector, ct, meta, plain = sys.argv[1:]
key, ct, meta, plain = (bytes.fromhex(x) for x in (key, ct, meta, plain))
ss, tuple_size, sector = int(ss), int(tuple_size), int(sector)
alg, ivmode = spec[len('capi:'):].rsplit('-', 1)
ivlen = {'gcm(aes)': 12, 'rfc7539(chacha20,poly1305)': 12, 'rfc4309(ccm(aes))': 8,
         'rfc4106(gcm(aes))': 8}.get(alg, 16)
stored = ivlen if ivmode == 'random' else 0
taglen = tuple_size - stored
out = b''
for k in range(len(ct) // ss):
    s = sector + k * ss // 512
    c = ct[k*ss:(k+1)*ss]
    t = meta[k*tuple_size:(k+1)*tuple_size]
    tag, iv = t[:taglen], t[taglen:taglen+stored]
    if ivmode == 'plain64':
        iv = s.to_bytes(8, 'little') + bytes(ivlen - 8)
    if alg == 'gcm(aes)':
        p = AESGCM(key).decrypt(iv, c + tag, s.to_bytes(8, 'little') + iv)
    elif alg == 'rfc4106(gcm(aes))':
        # RFC 4106: nonce = 4-byte salt (key tail) || IV; the trailing IV is not in the AAD.
        p = AESGCM(key[:-4]).decrypt(key[-4:] + iv, c + tag, s.to_bytes(8, 'little'))
    elif alg == 'rfc4309(ccm(aes))':
        # RFC 4309: nonce = 3-byte salt (key tail) || IV; the trailing IV is not in the AAD.
        p = AESCCM(key[:-3], tag_length=16).decrypt(key[-3:] + iv, c + tag, s.to_bytes(8, 'little'))
    elif alg == 'rfc7539(chacha20,poly1305)':
        p = ChaCha20Poly1305(key).decrypt(iv, c + tag, s.to_bytes(8, 'little') + iv)
    else:
        h = alg[len('authenc(hmac('):alg.index(')')]
        hl = hashlib.new(h).digest_size
        ek, ak = key[:-hl], key[-hl:]
        if ivmode.startswith('essiv:'):
            salt = hashlib.new(ivmode[6:], ek + ak).digest()
            e = Cipher(algorithms.AES(salt), modes.ECB()).encryptor()
            iv = e.update(s.to_bytes(8, 'little') + bytes(8)) + e.finalize()
        ad = s.to_bytes(8, 'little') + iv
        want = hmac.new(ak, ad + c, h).digest()[:taglen]
        assert hmac.compare_digest(want, tag), 'hmac mismatch at sector %d' % s
        mode = modes.XTS(iv) if 'xts(aes)' in alg else modes.CBC(iv)
        d = Cipher(algorithms.AES(ek), mode).decryptor()
        p = d.update(c) + d.finalize()
    out += p
assert out == plain, 'plaintext differs'
print('ok')
"#;

fn python_ok() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers.aead"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CRYPTBLK_SKIP_PYTHON").as_deref() == Ok("1"),
            "python3 with cryptography is required (CRYPTBLK_SKIP_PYTHON=1 skips)"
        );
        eprintln!("SKIPPED: no python3 cryptography and CRYPTBLK_SKIP_PYTHON=1");
    }
    ok
}

#[test]
fn pyca_opens_what_cryptblk_sealed() {
    if !python_ok() {
        return;
    }
    let cases: [(&str, usize, usize, usize); 10] = [
        ("capi:rfc4106(gcm(aes))-random", 36, 24, 512),
        ("capi:rfc4309(ccm(aes))-random", 19, 24, 512),
        ("capi:rfc4309(ccm(aes))-random", 35, 24, 4096),
        ("capi:gcm(aes)-random", 32, 28, 512),
        ("capi:gcm(aes)-random", 16, 28, 4096),
        ("capi:rfc7539(chacha20,poly1305)-random", 32, 28, 512),
        ("capi:rfc7539(chacha20,poly1305)-plain64", 32, 16, 4096),
        ("capi:authenc(hmac(sha256),xts(aes))-random", 96, 48, 512),
        ("capi:authenc(hmac(sha256),xts(aes))-plain64", 96, 20, 512),
        (
            "capi:authenc(hmac(sha512),cbc(aes))-essiv:sha256",
            96,
            64,
            4096,
        ),
    ];
    for (spec, klen, tuple, ss) in cases {
        let key: Vec<u8> = (0..klen).map(|i| (i * 7 + 1) as u8).collect();
        let opts = AeadOptions {
            sector_size: ss,
            iv_offset: 0,
            iv_large_sectors: false,
            tuple_size: tuple,
            authenticated: true,
            integrity_key_size: None,
        };
        let c = open_aead_cipher(spec, &key, &opts).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let plain: Vec<u8> = (0..2 * ss).map(|i| (i % 251) as u8).collect();
        let mut buf = plain.clone();
        let mut meta = vec![0u8; 2 * tuple];
        let sector = 64;
        c.encrypt(sector, &mut buf, &mut meta).unwrap();
        let out = Command::new("python3")
            .args([
                "-c",
                MODEL,
                spec,
                &hex::encode(&key),
                &ss.to_string(),
                &tuple.to_string(),
                &sector.to_string(),
                &hex::encode(&buf),
                &hex::encode(&meta),
                &hex::encode(&plain),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stdout.starts_with(b"ok"),
            "{spec} ({ss}-byte sectors): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
