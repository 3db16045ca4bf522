#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for N seconds each (default 60), one after another, at low
# priority. Needs a nightly toolchain; installs cargo-fuzz if it is missing. Not part of CI:
# long runs belong on a quiet machine.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
if ! cargo fuzz --help >/dev/null 2>&1; then
    cargo install cargo-fuzz
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s"
    # The committed seeds stay as they are: new inputs go to a scratch corpus.
    scratch=$(mktemp -d)
    nice -n 19 cargo +nightly fuzz run "$t" "$scratch" "corpus/$t" -- -max_total_time="$secs" \
        2>&1 | grep -E '^(#[0-9]+ +DONE|==[0-9]+==|SUMMARY|Done [0-9]+ runs)' || true
    rm -rf "$scratch"
    # A finding leaves an artifact; stop at the first so it can be looked at.
    if compgen -G "artifacts/$t/*" >/dev/null; then
        echo "$t: findings in fuzz/artifacts/$t" >&2
        exit 1
    fi
done
