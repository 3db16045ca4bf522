#!/usr/bin/env python3
"""Independent model of dm-crypt sector encryption, for cross-checking cryptblk.

Written from the dm-crypt documentation on top of pyca/cryptography (OpenSSL), sharing no code
with cryptblk, so agreement between the two is evidence of kernel compatibility rather than of
self-consistency.

usage: dmcrypt.py (encrypt|decrypt) --cipher SPEC --key HEX [--sector-size N]
                  [--iv-offset SECTORS] [--iv-large-sectors] [--start-sector S] IN OUT

IN/OUT are files ('-' for stdin/stdout); the whole of IN is processed, starting at 512-byte
sector --start-sector of the mapping.
"""
import argparse
import hashlib
import struct
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def parse_spec(spec):
    if spec.startswith("capi:"):
        body, _, iv = spec[5:].partition(")-")
        mode, _, cipher = body.partition("(")
        return cipher.rstrip(")"), mode, iv or "null"
    parts = spec.split("-", 2)
    if len(parts) == 2:
        parts.append("null")
    return parts[0], parts[1], parts[2]


def block_cipher(name, key):
    if name == "aes":
        return algorithms.AES(key)
    raise SystemExit(f"dmcrypt.py: unsupported cipher {name}")


def make_iv(ivmode, key, sector, cipher_name, mode, sector_size):
    ivname, _, ivopt = ivmode.partition(":")
    if ivname == "null":
        return bytes(16)
    if ivname == "plain":
        return struct.pack("<I", sector & 0xFFFFFFFF) + bytes(12)
    if ivname == "plain64":
        return struct.pack("<Q", sector) + bytes(8)
    if ivname == "plain64be":
        return bytes(8) + struct.pack(">Q", sector)
    if ivname == "essiv":
        # For XTS only the first half of the key keys the data cipher, but ESSIV hashes the
        # whole key, as dm-crypt does.
        salt = hashlib.new(ivopt, key).digest()
        enc = Cipher(block_cipher(cipher_name, salt), modes.ECB()).encryptor()
        return enc.update(struct.pack("<Q", sector) + bytes(8)) + enc.finalize()
    if ivname == "benbi":
        shift = 9 - 4  # 16-byte cipher blocks
        return bytes(8) + struct.pack(">Q", (sector << shift) + 1)
    raise SystemExit(f"dmcrypt.py: unsupported IV mode {ivmode}")


def process(direction, spec, key, data, sector_size, iv_offset, large, start):
    cipher_name, mode, ivmode = parse_spec(spec)
    out = bytearray()
    step = sector_size // 512
    for i in range(0, len(data), sector_size):
        sector512 = start + (i // 512) + iv_offset
        ivsector = sector512 // step if large else sector512
        chunk = data[i:i + sector_size]
        if cipher_name == "cipher_null":
            out += chunk
            continue
        iv = make_iv(ivmode, key, ivsector, cipher_name, mode, sector_size)
        if mode == "xts":
            c = Cipher(algorithms.AES(key), modes.XTS(iv))
        elif mode == "cbc":
            c = Cipher(block_cipher(cipher_name, key), modes.CBC(iv))
        elif mode == "ecb":
            c = Cipher(block_cipher(cipher_name, key), modes.ECB())
        else:
            raise SystemExit(f"dmcrypt.py: unsupported mode {mode}")
        op = c.encryptor() if direction == "encrypt" else c.decryptor()
        out += op.update(chunk) + op.finalize()
    return bytes(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("direction", choices=["encrypt", "decrypt"])
    p.add_argument("--cipher", required=True)
    p.add_argument("--key", required=True, help="hex volume key ('-' for cipher_null)")
    p.add_argument("--sector-size", type=int, default=512)
    p.add_argument("--iv-offset", type=int, default=0)
    p.add_argument("--iv-large-sectors", action="store_true")
    p.add_argument("--start-sector", type=int, default=0)
    p.add_argument("input")
    p.add_argument("output")
    a = p.parse_args()
    key = b"" if a.key == "-" else bytes.fromhex(a.key)
    src = sys.stdin.buffer.read() if a.input == "-" else open(a.input, "rb").read()
    if len(src) % a.sector_size:
        raise SystemExit("dmcrypt.py: input is not a whole number of sectors")
    res = process(a.direction, a.cipher, key, src, a.sector_size, a.iv_offset,
                  a.iv_large_sectors, a.start_sector)
    if a.output == "-":
        sys.stdout.buffer.write(res)
    else:
        with open(a.output, "wb") as f:
            f.write(res)


if __name__ == "__main__":
    main()
