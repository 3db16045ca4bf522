#!/usr/bin/env bash
# The whole test suite: installs what the tests need, then runs every crate's tests.
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# No test may pass without having run: every early exit in a test is an explicit
# CRYPTBLK_SKIP_* (never set here) or a listed data condition, and every tool a test
# requires is installed above (issue 27). A second, seconds.
scripts/check-test-skips.py
export CRYPTBLK_CRYPTSETUP_TESTS=${CRYPTBLK_CRYPTSETUP_TESTS:-$(cd .. && pwd)/shared/cryptsetup-tests}
# The rbd: tests (crates/cli/tests/rbd.rs) run against a real one-node Ceph cluster and fail
# without one: unless CEPH_CONF already names a cluster, one is started here with
# ../shared/ceph/up.sh (about 10 s, root) and stopped on exit.
if [ -z "${CEPH_CONF:-}" ]; then
  ceph_up=$(cd .. && pwd)/shared/ceph/up.sh
  if [ -x "$ceph_up" ]; then
    export CEPH_DIR=${CEPH_DIR:-/tmp/cryptblk-test-ceph}
    "$ceph_up"
    trap '"$(dirname "$ceph_up")/down.sh"' EXIT
    export CEPH_CONF=$CEPH_DIR/ceph.conf
  else
    echo "test.sh: $ceph_up is missing and CEPH_CONF is unset: the rbd: tests will fail" >&2
  fi
fi
# Bins and tests together: `cargo test` unifies the dev-dependencies' features, and a build of
# the bins alone resolves them apart and compiled every dependency a second time (minutes).
cargo build --workspace --bins --tests
cargo test --workspace --no-fail-fast "$@"
