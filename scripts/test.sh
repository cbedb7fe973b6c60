#!/usr/bin/env bash
# Runs hookq's whole test suite on a fresh Debian/Ubuntu machine that has only
# a Rust toolchain: installs what the tests need (redis-server; python3 with
# the `standardwebhooks` library, which verifies our signatures), then checks
# formatting and lints, then runs every test (`cargo test`: unit, integration
# and doc tests).
#
# Tests start their own redis-server on private loopback ports, so a distro
# redis-server service that apt starts on 6379 does not matter; it is left
# running.
set -euo pipefail
cd "$(dirname "$0")/.."

# as_root, apt_install
source scripts/lib.sh

# redis-server: every integration test runs its own.
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi
echo "== $(redis-server --version | cut -d' ' -f1-3)"

# wrk: the benchmark's second load generator for single creates.
if ! command -v wrk >/dev/null 2>&1; then
  apt_install wrk
fi

# faketime (libfaketime): the clock-skew test runs daemons with shifted clocks.
if ! command -v faketime >/dev/null 2>&1; then
  apt_install faketime
fi

# python3 + standardwebhooks: the delivery tests check signatures with it.
if ! command -v python3 >/dev/null 2>&1; then
  apt_install python3 python3-pip
fi
if ! python3 -c 'import standardwebhooks' >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip
  fi
  echo "== pip install standardwebhooks"
  # Newer distros mark the system Python as externally managed (PEP 668).
  python3 -m pip install --quiet standardwebhooks 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages standardwebhooks
fi
echo "== python3 standardwebhooks ok"

# Formatting and lints, when the toolchain has them.
if cargo fmt --version >/dev/null 2>&1; then
  echo "== cargo fmt --check"
  cargo fmt --check
else
  echo "== cargo fmt: not installed, skipped"
fi
if cargo clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy --all-targets -- -D warnings"
  cargo clippy --all-targets --quiet -- -D warnings
else
  echo "== cargo clippy: not installed, skipped"
fi

# Every test. (Not --all-targets: that would also run the benchmark in full.)
echo "== cargo test"
cargo test

# The benchmark's smoke test: every scenario at tiny sizes, one run each, in a
# release build. No timing assertions; it fails if a scenario breaks.
echo "== benchmark smoke test (scripts/bench.sh --quick)"
cargo bench --quiet --bench bench -- --quick
