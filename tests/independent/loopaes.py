#!/usr/bin/env python3
"""Independent model of loop-AES volumes as cryptsetup maps them, for cross-checking cryptblk.

Written from the documented behaviour (cryptsetup's loopaesOpen man page and key file rules,
dm-crypt's lmk IV), on pyca/cryptography and hashlib, sharing no code with cryptblk:

- key file: lines separated by LF, CR or NUL (empty lines skipped), all terminated and of
  one length; 1 key (aes-cbc-plain64), 64 keys (aes:64-cbc-lmk) or 65 keys (the 65th seeds
  the IV); each line hashed (sha256/sha384/sha512 for 16/24/32-byte keys, or --hash),
  truncated to the key size, first byte XOR 0x55 (64 keys) or 0xF4 (65 keys).
- multi-key sectors: key (sector + skip) mod 64; CBC with the lmk IV: the raw MD5 state
  (no padding) over [seed block of 64 bytes: first 16 bytes of key 65, zeros], plaintext
  bytes 16..512, and the words (sector low 32 bits, next 24 bits | 0x80000000, 4024, 0)
  little-endian. MD5's compression function is written here from RFC 1321 and checked
  against hashlib at start.

usage: loopaes.py key KEYFILE [--key-size BYTES] [--hash H]        -> "<spec> <hex key>"
       loopaes.py (encrypt|decrypt) KEYFILE [--key-size BYTES] [--hash H] [--skip SECTORS]
                  IN OUT      (the data area only; '-' for stdin/stdout)
"""
import argparse
import hashlib
import math
import struct
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

# RFC 1321: per-round shift amounts and T[i] = floor(abs(sin(i + 1)) * 2^32).
SHIFTS = [7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4
T = [int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF for i in range(64)]
MD5_INIT = (0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476)


def rotl(x, n):
    return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF


def md5_compress(state, block):
    x = struct.unpack("<16I", block)
    a, b, c, d = state
    for i in range(64):
        if i < 16:
            f, g = (b & c) | (~b & d), i
        elif i < 32:
            f, g = (d & b) | (~d & c), (5 * i + 1) % 16
        elif i < 48:
            f, g = b ^ c ^ d, (3 * i + 5) % 16
        else:
            f, g = c ^ (b | (~d & 0xFFFFFFFF)), (7 * i) % 16
        f &= 0xFFFFFFFF
        rotated = rotl((a + f + T[i] + x[g]) & 0xFFFFFFFF, SHIFTS[i])
        a, d, c, b = d, c, b, (b + rotated) & 0xFFFFFFFF
    return tuple((s + v) & 0xFFFFFFFF for s, v in zip(state, (a, b, c, d)))


def md5_raw(data):
    """The MD5 state after compressing `data` (whole 64-byte blocks), no padding."""
    assert len(data) % 64 == 0
    st = MD5_INIT
    for i in range(0, len(data), 64):
        st = md5_compress(st, data[i:i + 64])
    return struct.pack("<4I", *st)


def self_check():
    for msg in (b"", b"abc", bytes(range(256)) * 3):
        padded = msg + b"\x80" + bytes((55 - len(msg)) % 64) + struct.pack("<Q", 8 * len(msg))
        if md5_raw(padded) != hashlib.md5(msg).digest():
            raise SystemExit("loopaes.py: MD5 compression self-check failed")


def parse_keyfile(buf):
    keys, at = [], 0
    sep = b"\n\r\0"
    while at < len(buf) and len(keys) < 65:
        end = at
        while end < len(buf) and buf[end] not in sep:
            end += 1
        if end == len(buf):
            raise SystemExit("loopaes.py: unterminated key")
        keys.append(buf[at:end])
        at = end
        while at < len(buf) and buf[at] in sep:
            at += 1
    if at != len(buf) or len(keys) not in (1, 64, 65) or not keys[0] or \
            any(len(k) != len(keys[0]) for k in keys):
        raise SystemExit("loopaes.py: incompatible key file")
    return keys


def derive(buf, key_size, hash_name):
    lines = parse_keyfile(buf)
    hash_name = hash_name or {16: "sha256", 24: "sha384", 32: "sha512"}[key_size]
    tweak = {64: 0x55, 65: 0xF4}.get(len(lines), 0)
    keys = []
    for line in lines:
        k = bytearray(hashlib.new(hash_name, line).digest()[:key_size])
        assert len(k) == key_size
        k[0] ^= tweak
        keys.append(bytes(k))
    return keys


def lmk_iv(seed, sector, plain):
    data = b""
    if seed is not None:
        data += seed[:16] + bytes(48)
    data += plain[16:512]
    data += struct.pack("<4I", sector & 0xFFFFFFFF, ((sector >> 32) & 0xFFFFFF) | 0x80000000,
                        4024, 0)
    return md5_raw(data)


def xor16(a, b):
    return bytes(x ^ y for x, y in zip(a, b))


def process(direction, keys, data, skip):
    out = bytearray()
    multi = len(keys) > 1
    seed = keys[64] if len(keys) == 65 else None
    for i in range(0, len(data), 512):
        sector = i // 512 + skip
        chunk = data[i:i + 512]
        if not multi:
            iv = struct.pack("<Q", sector) + bytes(8)
            c = Cipher(algorithms.AES(keys[0]), modes.CBC(iv))
            op = c.encryptor() if direction == "encrypt" else c.decryptor()
            out += op.update(chunk) + op.finalize()
            continue
        key = keys[sector % 64]
        if direction == "encrypt":
            iv = lmk_iv(seed, sector, chunk)
            enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
            out += enc.update(chunk) + enc.finalize()
        else:
            dec = Cipher(algorithms.AES(key), modes.CBC(bytes(16))).decryptor()
            plain = dec.update(chunk) + dec.finalize()
            iv = lmk_iv(seed, sector, plain)
            out += xor16(plain[:16], iv) + plain[16:]
    return bytes(out)


def main():
    self_check()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op", choices=["key", "encrypt", "decrypt"])
    p.add_argument("keyfile")
    p.add_argument("--key-size", type=int, default=32, help="bytes per key (default 32)")
    p.add_argument("--hash")
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("input", nargs="?")
    p.add_argument("output", nargs="?")
    a = p.parse_intermixed_args()
    keys = derive(open(a.keyfile, "rb").read(), a.key_size, a.hash)
    if a.op == "key":
        spec = "aes-cbc-plain64" if len(keys) == 1 else "aes:64-cbc-lmk"
        print(spec, b"".join(keys).hex())
        return
    src = sys.stdin.buffer.read() if a.input == "-" else open(a.input, "rb").read()
    if len(src) % 512:
        raise SystemExit("loopaes.py: input is not a whole number of sectors")
    res = process(a.op, keys, src, a.skip)
    if a.output == "-":
        sys.stdout.buffer.write(res)
    else:
        with open(a.output, "wb") as f:
            f.write(res)


if __name__ == "__main__":
    main()
