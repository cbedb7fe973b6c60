#!/usr/bin/env bash
# Runs hookq's whole test suite on a fresh Debian/Ubuntu machine with a Rust
# toolchain: installs what the tests need (redis-server; the Python
# `standardwebhooks` library used to verify signatures), then checks
# formatting and lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root (or sudo) to run: $*" >&2; exit 1; fi
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server"
  apt_install redis-server
fi
echo "== $(redis-server --version | cut -d' ' -f1-3)"

if ! python3 -c 'import standardwebhooks' 2>/dev/null; then
  echo "== installing the standardwebhooks Python library (signature checks)"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip
  fi
  python3 -m pip install --quiet standardwebhooks 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages standardwebhooks
fi

echo "== cargo fmt --check"
cargo fmt --check
if cargo clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy"
  cargo clippy --all-targets --quiet -- -D warnings
fi
echo "== cargo test"
cargo test --all-targets
cargo test --doc --quiet
