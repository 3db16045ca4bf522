#!/usr/bin/env python3
"""Independent model of a FileVault2 (CoreStorage) volume, for cross-checking cryptblk.

Written from the public CoreStorage documentation (libfvde's "FileVault Drive Encryption"
format description) on top of pyca/cryptography, sharing no code with cryptblk. It builds a
small synthetic volume that cryptsetup's fvault2Dump reads, so that cryptblk can be compared
with cryptsetup on layouts other than cryptsetup's one test image.

usage: fvault2.py IMAGE PLAINTEXT [--passphrase P] [--iterations N] [--block-size B]
                  [--lv-block N] [--lv-size BYTES] [--seed S] [--shuffle]

Writes IMAGE (a sparse file ending where the logical volume ends) and PLAINTEXT (the logical
volume's decrypted contents: a pattern the model encrypted into IMAGE), and prints the volume
key in hex on standard output.
"""
import argparse
import base64
import hashlib
import random
import struct
import uuid

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.keywrap import aes_key_wrap

MD_BLOCK = 8192


def crc_register(data):
    """CRC-32C (Castagnoli, reflected) seeded with 0xffffffff, without the final inversion."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc


def seal(block):
    """Fills in the checksum and seed of a block (both in its first 8 bytes)."""
    block[4:8] = struct.pack("<I", 0xFFFFFFFF)
    block[0:4] = struct.pack("<I", crc_register(bytes(block[8:])))
    return block


def md_block(block_type, number):
    b = bytearray(MD_BLOCK)
    struct.pack_into("<HH", b, 8, 1, block_type)
    struct.pack_into("<Q", b, 32, number)
    struct.pack_into("<I", b, 48, MD_BLOCK)
    return b


def xts(key, index, data, encrypt=True):
    c = Cipher(algorithms.AES(key), modes.XTS(struct.pack("<QQ", index, 0)))
    op = c.encryptor() if encrypt else c.decryptor()
    return op.update(bytes(data)) + op.finalize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("plaintext")
    ap.add_argument("--passphrase", default="synthetic")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--block-size", type=int, default=4096)
    ap.add_argument("--lv-block", type=int, default=16)
    ap.add_argument("--lv-size", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shuffle", action="store_true",
                    help="metadata blocks in another order, with an unknown type and a stale "
                         "copy of the logical volume plist before the current one")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    rbytes = lambda n: bytes(rnd.getrandbits(8) for _ in range(n))
    bs = a.block_size

    pv_uuid = uuid.UUID(bytes=rbytes(16))
    family = uuid.UUID(bytes=rbytes(16))
    md_key_half = rbytes(16)
    salt = rbytes(16)
    kek = rbytes(16)
    vk_half = rbytes(16)
    volume_key = vk_half + hashlib.sha256(vk_half + family.bytes).digest()[:16]

    # Physical volume header.
    pv = bytearray(512)
    struct.pack_into("<HH", pv, 8, 1, 0x10)
    struct.pack_into("<Q", pv, 64, a.lv_block * bs + a.lv_size)
    pv[88:90] = b"CS"
    struct.pack_into("<I", pv, 90, 1)
    disklabel_block = 1
    struct.pack_into("<IIQ", pv, 96, bs, 4 * MD_BLOCK, disklabel_block)
    struct.pack_into("<II", pv, 168, 16, 2)
    pv[176:192] = md_key_half
    pv[304:320] = pv_uuid.bytes
    seal(pv)

    # Encrypted metadata, after the disk label.
    md_start_block = disklabel_block + (MD_BLOCK + 64 + bs - 1) // bs
    md_key = md_key_half + pv_uuid.bytes

    pass_key = hashlib.pbkdf2_hmac("sha256", a.passphrase.encode(), salt, a.iterations, 16)
    pwk = bytearray(284)
    struct.pack_into("<II", pwk, 0, 3, 16)
    pwk[8:24] = salt
    struct.pack_into("<II", pwk, 24, 16, 24)
    pwk[32:56] = aes_key_wrap(pass_key, kek)
    struct.pack_into("<I", pwk, 168, a.iterations)
    kwvk = bytearray(256)
    struct.pack_into("<II", kwvk, 0, 2, 24)
    kwvk[8:32] = aes_key_wrap(kek, vk_half)
    b64 = lambda b: base64.b64encode(bytes(b)).decode()
    context = (
        '<dict ID="0"><key>com.apple.corestorage.lvf.encryption.context</key><dict ID="1">'
        '<key>CryptoUsers</key><array ID="2"><dict ID="3"><key>PassphraseWrappedKEKStruct</key>'
        f'<data ID="4">{b64(pwk)}</data><key>WrapVersion</key><integer size="32" ID="5">0x1'
        '</integer></dict></array><key>WrappedVolumeKeys</key><array ID="6"><dict ID="7">'
        '<key>BlockAlgorithm</key><string ID="8">None</string><key>KEKWrappedVolumeKeyStruct'
        '</key><data ID="9"></data></dict><dict ID="10"><key>BlockAlgorithm</key><string ID="11">'
        f'AES-XTS</string><key>KEKWrappedVolumeKeyStruct</key><data ID="12">{b64(kwvk)}</data>'
        '</dict></array></dict></dict>'
    ).encode()

    def lv_plist(size, fam):
        return (
            '<dict ID="0"><key>com.apple.corestorage.lv.familyUUID</key><string ID="1">'
            f'{str(fam).upper()}</string><key>com.apple.corestorage.lv.name</key>'
            '<string ID="2">Synthetic</string><key>com.apple.corestorage.lv.size</key>'
            f'<integer size="64" ID="3">{hex(size)}</integer></dict>'
        ).encode()

    def xml_block(block_type, number, xml, at):
        b = md_block(block_type, number)
        off = 64 + 256
        b[off:off + len(xml)] = xml
        struct.pack_into("<II", b, at, off, len(xml) + 1)
        return b

    b0305 = md_block(0x0305, 0)
    struct.pack_into("<I", b0305, 64, 1)
    struct.pack_into("<I", b0305, 104, a.lv_block)
    b0019 = xml_block(0x0019, 1, context, 112)
    struct.pack_into("<II", b0019, 104, len(context), len(context))
    b001a = xml_block(0x001A, 2, lv_plist(a.lv_size, family), 128)
    blocks = [b0305, b0019, b001a]
    if a.shuffle:
        stale = xml_block(0x001A, 3, lv_plist(a.lv_size * 2, uuid.UUID(bytes=rbytes(16))), 128)
        unknown = md_block(0x0010, 4)
        blocks = [stale, b0019, unknown, b0305, b001a]
    md = b"".join(xts(md_key, i, seal(b)) for i, b in enumerate(blocks))

    label = md_block(0x0011, 0)
    struct.pack_into("<I", label, 64, 4 * MD_BLOCK)
    struct.pack_into("<I", label, 220, MD_BLOCK)
    seal(label)
    vgd = bytearray(40)
    struct.pack_into("<Q", vgd, 8, 64)  # more blocks than written: the first zero one ends them
    struct.pack_into("<Q", vgd, 32, md_start_block)

    lv_at = a.lv_block * bs
    assert md_start_block * bs + len(md) <= lv_at, "metadata overlaps the logical volume"
    plain = bytearray()
    for s in range(a.lv_size // 512):
        plain += struct.pack("<Q", s) * 8 + rbytes(448) if s % 7 == 0 else bytes(512)
    with open(a.image, "wb") as f:
        f.truncate(lv_at + a.lv_size)
        f.write(pv)
        f.seek(disklabel_block * bs)
        f.write(label)
        f.write(vgd)
        f.seek(md_start_block * bs)
        f.write(md)
        # Every sector is written: zero plaintext has ciphertext of its own.
        f.seek(lv_at)
        for s in range(a.lv_size // 512):
            f.write(xts(volume_key, s, plain[s * 512:(s + 1) * 512]))
    with open(a.plaintext, "wb") as f:
        f.write(plain)
    print(volume_key.hex())


if __name__ == "__main__":
    main()
