#!/usr/bin/env python3
"""Writes the Debian package's copyright file: cryptblk's own licence, then every Rust crate
linked into the cryptblk binary (cargo tree, normal edges, for this target and the default
features) with its licence expression and the licence texts the crate ships (identical texts
are printed once), then the C libraries: AWS-LC (built into aws-lc-sys, statically linked)
and the shared libraries the package loads when used and Recommends (librbd, tpm2-tss), which keep their own
copyright files in their Debian packages.

    scripts/deb-copyright.py OUT [cargo tree options, e.g. --no-default-features]

Licence texts are read from the crates' sources in Cargo's registry (the build downloaded
them), so this runs offline. What cargo-about does, in a page of Python: cargo-about is not
in a registry as a prebuilt binary, and building it costs minutes on CI's two cores.
"""

import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENSE_PREFIXES = ("license", "licence", "copying", "notice", "copyright", "unlicense")
# Crates that bundle C code under its own licence, in a subdirectory.
BUNDLED = {"aws-lc-sys": ["aws-lc/LICENSE"]}


def cargo(*args):
    return subprocess.run(
        ["cargo", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def linked_crates(extra):
    """(name, version) of every package the cryptblk binary is built from."""
    out = cargo(
        "tree", "--offline", "--locked", "-p", "cryptblk", "-e", "normal",
        "--target", "x86_64-unknown-linux-gnu", "--prefix", "none", "--no-dedupe",
        "-f", "{p}", *extra,
    )
    crates = set()
    for line in out.splitlines():
        parts = line.replace(" (*)", "").split()
        if len(parts) >= 2:
            crates.add((parts[0], parts[1].lstrip("v")))
    return crates


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: deb-copyright.py OUT [cargo tree options]")
    out_path, extra = sys.argv[1], sys.argv[2:]
    meta = json.loads(cargo("metadata", "--offline", "--locked", "--format-version", "1"))
    by_id = {(p["name"], p["version"]): p for p in meta["packages"]}
    crates = sorted(linked_crates(extra))
    texts = {}  # digest -> (text, [crate names])
    rows = []
    for name, version in crates:
        pkg = by_id[(name, version)]
        if pkg.get("source") is None:
            continue  # cryptblk's own crates: the first stanza
        crate_dir = os.path.dirname(pkg["manifest_path"])
        files = sorted(
            f for f in os.listdir(crate_dir)
            if f.lower().startswith(LICENSE_PREFIXES) and os.path.isfile(os.path.join(crate_dir, f))
        ) + [f for f in BUNDLED.get(name, []) if os.path.isfile(os.path.join(crate_dir, f))]
        refs = []
        for f in files:
            with open(os.path.join(crate_dir, f), encoding="utf-8", errors="replace") as fh:
                text = fh.read().strip()
            # Copies that differ only in line breaks and indentation are one text.
            digest = hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:12]
            texts.setdefault(digest, (text, []))[1].append(f"{name} {version} ({f})")
            refs.append(digest)
        expr = pkg.get("license") or f"see {pkg.get('license_file')}"
        rows.append((name, version, expr, refs))

    with open(out_path, "w", encoding="utf-8") as out:
        w = out.write
        # Plain text in DEP-5's style, not its machine-readable format: crates are listed
        # by name, not by the file patterns DEP-5 stanzas need.
        w("Upstream-Name: cryptblk\n\n")
        w("Files: *\nCopyright: The cryptblk authors\nLicense: Apache-2.0 or MIT\n")
        w(" On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0;\n")
        w(" the MIT licence text follows.\n .\n")
        with open(os.path.join(ROOT, "LICENSE-MIT"), encoding="utf-8") as fh:
            for line in fh.read().strip().splitlines():
                w(f" {line}\n" if line.strip() else " .\n")
        w("\nComment: C libraries\n")
        w(" AWS-LC is compiled into the binary by the aws-lc-sys crate (ISC, Apache-2.0,\n")
        w(" OpenSSL and SSLeay licences; its LICENSE file is reproduced below with\n")
        w(" aws-lc-sys's). librbd (Ceph, LGPL-2.1) and tpm2-tss (libtss2-esys and friends,\n")
        w(" BSD-2-Clause) are shared libraries this package depends on; their copyright\n")
        w(" files are in /usr/share/doc/librbd1/ and /usr/share/doc/libtss2-esys-3.0.2-0/.\n")
        w(f"\nComment: Rust crates linked into /usr/bin/cryptblk ({len(rows)})\n")
        for name, version, expr, refs in rows:
            tags = ", ".join(refs) if refs else "no licence file shipped"
            w(f" {name} {version}: {expr} [texts: {tags}]\n")
        w("\nComment: Licence texts shipped by those crates, each once, by digest\n")
        for digest, (text, users) in sorted(texts.items()):
            w(f"\n--- {digest}: {', '.join(users[:6])}")
            w(f" and {len(users) - 6} more\n" if len(users) > 6 else "\n")
            w(text + "\n")
    print(f"{out_path}: {len(rows)} crates, {len(texts)} distinct licence texts")


if __name__ == "__main__":
    main()
