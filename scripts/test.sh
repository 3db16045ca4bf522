#!/usr/bin/env bash
# The whole test suite: installs what the tests need, then runs every crate's tests.
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CRYPTBLK_CRYPTSETUP_TESTS=${CRYPTBLK_CRYPTSETUP_TESTS:-$(cd .. && pwd)/shared/cryptsetup-tests}
cargo build --workspace --bins
cargo test --workspace --no-fail-fast "$@"
