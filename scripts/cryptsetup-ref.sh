#!/usr/bin/env bash
# Builds an upstream cryptsetup release from source into a directory outside the project, as a
# second reference for the compatibility suite (../shared/cryptsetup-suite): the suite's tests
# come from cryptsetup 2.8.7-rc1 while the distribution ships 2.6.1, so their figures are only
# comparable with a binary of the same release.
#
#   scripts/cryptsetup-ref.sh [DEST] [REF]
#
# DEST  where the build goes (default /var/tmp/cryptsetup-2.8.7); afterwards
#       DEST/bin/{cryptsetup,veritysetup,integritysetup} are the tools (statically linked to
#       their own libcryptsetup, so nothing is installed system-wide and the siblings are found
#       by the suite's run.sh next to `cryptsetup`).
# REF   a git ref of upstream cryptsetup (default 38f95b70, "Add Release notes for
#       2.8.7-rc1", the commit the suite's tests were copied from).
# The source is $CRYPTSETUP_GIT (default https://gitlab.com/cryptsetup/cryptsetup.git; a local
# mirror works too).  Only this script is ours: the sources are cloned, never copied into
# the project.
#
# The configure options are fixed so that two runs give the same tool: OpenSSL crypto backend,
# libblkid and libargon2 enabled (the suite checks both), no SSH token, no asciidoctor man
# pages, no translations.
set -euo pipefail

DEST=${1:-/var/tmp/cryptsetup-2.8.7}
REF=${2:-38f95b70}
GIT=${CRYPTSETUP_GIT:-https://gitlab.com/cryptsetup/cryptsetup.git}

die() { echo "cryptsetup-ref.sh: $*" >&2; exit 1; }

# Build dependencies (Debian package names); installed only when missing.
deps=(git gcc make autoconf automake autopoint gettext libtool pkg-config
      libdevmapper-dev libjson-c-dev libssl-dev uuid-dev libpopt-dev libblkid-dev libargon2-dev)
missing=()
for p in "${deps[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  [ "$(id -u)" = 0 ] || die "missing packages (run as root or install them): ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# A bare clone, then an export of REF without the test images (tests/*.xz): the tools do not
# need them, the suite brings its own copies, and partial mirrors may lack those blobs.
GITDIR=$DEST/git
if [ ! -d "$GITDIR" ]; then
  mkdir -p "$DEST"
  git clone --quiet --bare "$GIT" "$GITDIR"
fi
git -C "$GITDIR" fetch --quiet --tags "$GIT" 2>/dev/null || true
COMMIT=$(git -C "$GITDIR" rev-parse --verify "$REF^{commit}") || die "no commit $REF in $GIT"
SRC=$DEST/src
rm -rf "$SRC"
mkdir -p "$SRC"
git -C "$GITDIR" archive --format=tar "$COMMIT" -- . ':(exclude)tests/*.xz' | tar -x -C "$SRC"

cd "$SRC"
./autogen.sh >/dev/null
# --disable-shared + --enable-static-cryptsetup would also link libc statically; keeping
# libcryptsetup private (not shared) is enough to not touch the system's libcryptsetup.
./configure --quiet --prefix="$DEST" \
  --disable-shared --enable-static \
  --with-crypto_backend=openssl \
  --enable-blkid --enable-libargon2 \
  --disable-ssh-token --disable-asciidoc --disable-nls \
  --enable-veritysetup --enable-integritysetup \
  --with-tmpfilesdir="$DEST/lib/tmpfiles.d" \
  --with-luks2-external-tokens-path="$DEST/lib/cryptsetup"
make -s -j"$(nproc)"
make -s install >/dev/null

for t in cryptsetup veritysetup integritysetup; do
  [ -x "$DEST/sbin/$t" ] || die "build produced no $t"
done
mkdir -p "$DEST/bin"
for t in cryptsetup veritysetup integritysetup; do
  ln -sf "../sbin/$t" "$DEST/bin/$t"
done
"$DEST/bin/cryptsetup" --version
echo "cryptsetup-ref.sh: built $COMMIT into $DEST/bin" >&2
