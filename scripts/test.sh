#!/usr/bin/env bash
# Runs hookq's whole test suite on a fresh Debian/Ubuntu machine that has only
# a Rust toolchain:
#   1. installs what the tests need: redis-server (every integration test
#      runs its own on a private loopback port), faketime (the clock-skew
#      test), chromium and chromium-driver (the console tests), wrk (the
#      benchmark's single-create load), nginx (the
#      benchmark's reference receiver; it runs its own on loopback ports),
#      systemd's `systemd-analyze` (the unit file check), podman and runc
#      (the container image test, unless docker works), python3 with the
#      `standardwebhooks` library (it verifies our signatures), and the
#      rustfmt and clippy components;
#   2. checks formatting (`cargo fmt --check`) and lints (`cargo clippy
#      --all-targets -D warnings`);
#   3. runs every test (`cargo test`: unit, integration, fuzz and doc tests),
#      then `scripts/lua-guards.sh --suite-passed` (each Lua guard deleted
#      in turn must fail the test named for it; the suite has just passed
#      with the scripts intact, so the named tests are not run intact
#      again; about 6 minutes);
#   4. fuzzes the HTTP API from its OpenAPI document (`scripts/api-fuzz.sh`:
#      schemathesis, installed with pip if missing) and runs the benchmark's
#      smoke test (`--quick`: every scenario at tiny sizes, release build, no
#      timing assertions) and checks its flags (`--help`, an unknown one);
#   5. fails if any process the suite started is still running, naming it,
#      or if the run changed a file git tracks (screenshots go to
#      target/screenshots; HOOKQ_SCREENSHOTS=docs refreshes docs/ on purpose).
#
# A distro redis-server service that apt starts on 6379, or nginx service on
# port 80, is not used by any test or the benchmark and is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

# as_root, apt_install
source scripts/lib.sh

# Every process this run starts inherits this mark; step 5 looks for it.
export HOOKQ_TEST_RUN="test-sh-$$-$(date +%s%N)"
started_at="$(mktemp)"

if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi
echo "== $(redis-server --version | cut -d' ' -f1-3)"
if ! command -v wrk >/dev/null 2>&1; then
  apt_install wrk
fi
# Debian puts nginx in /usr/sbin, which is not on a non-root user's PATH.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt_install nginx
fi
if ! command -v faketime >/dev/null 2>&1; then
  apt_install faketime
fi
# ops::systemd_unit_is_valid runs `systemd-analyze verify` on the unit file
# (no running systemd needed) and fails where it is missing.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  apt_install systemd
fi
# The console tests drive a real headless Chromium over WebDriver.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  apt_install chromium chromium-driver
fi
# The image test builds and runs the container image (scripts/image.sh) with
# docker or podman, whichever works (a docker CLI without its daemon does
# not); it runs podman's containers with runc (crun refuses some hosts'
# cgroups).
if ! docker info >/dev/null 2>&1 \
  && ! { podman info >/dev/null 2>&1 && { command -v runc || [ -x /usr/sbin/runc ]; } >/dev/null 2>&1; }; then
  apt_install podman runc
fi
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
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    echo "== rustup component add $component"
    rustup component add "$component" || {
      echo "cargo ${component/rustfmt/fmt} is missing and rustup could not add it" >&2
      exit 1
    }
  fi
done

# Step 5 compares git's view of the checkout before and after the run.
tracked_before="$(git status --porcelain --untracked-files=no 2>/dev/null | sort; git diff 2>/dev/null | sha256sum)"

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

# Every test. (Not --all-targets: that would also run the benchmark in full.)
echo "== cargo test"
cargo test

# Step 3 too: each safety guard of the Lua scripts, deleted in turn, fails the
# test named for it (the built test binary is patched per guard: no rebuilds).
echo "== Lua guards (scripts/lua-guards.sh --suite-passed)"
scripts/lua-guards.sh --suite-passed

# The API against its own OpenAPI document (schemathesis).
echo "== API fuzzing (scripts/api-fuzz.sh)"
scripts/api-fuzz.sh target/debug/hookq

echo "== benchmark smoke test (scripts/bench.sh --quick)"
cargo bench --quiet --bench bench -- --quick
# Its command line: a mistyped flag is refused (exit 2, naming it) and
# --help runs nothing, instead of either starting the half-hour full run
# (the timeout turns such a run into a failure here).
echo "== benchmark flags (--help, an unknown flag)"
timeout 60 cargo bench --quiet --bench bench -- --help | grep -q '^usage: scripts/bench.sh'
flag_rc=0
flag_err=$(timeout 60 cargo bench --quiet --bench bench -- --runz 3 2>&1 >/dev/null) || flag_rc=$?
if [ "$flag_rc" -eq 124 ] || ! grep -q 'unknown argument `--runz`' <<<"$flag_err"; then
  echo "the benchmark did not refuse --runz (exit $flag_rc): $flag_err" >&2
  exit 1
fi

# 5. Nothing the suite started may outlive it. /proc/<pid>/environ shows a
# process's environment as it was exec'd, so this shell (started before the
# export) does not match, and the loop below runs no program.
echo "== no process of this run is left"
leftovers=()
leftover_pids=()
for dir in /proc/[0-9]*; do
  pid="${dir#/proc/}"
  [ "$pid" = "$$" ] && continue
  found=0
  while IFS= read -r -d '' entry; do
    if [ "$entry" = "HOOKQ_TEST_RUN=$HOOKQ_TEST_RUN" ]; then
      found=1
      break
    fi
  done 2>/dev/null <"$dir/environ" || true
  if [ "$found" -eq 1 ]; then
    cmdline="$(tr '\0' ' ' <"$dir/cmdline" 2>/dev/null || true)"
    leftovers+=("pid $pid: $cmdline")
    leftover_pids+=("$pid")
  fi
done
shm_left="$(find /dev/shm -maxdepth 1 \( -name 'faketime_*' -o -name 'sem.faketime_*' \) \
  -newer "$started_at" 2>/dev/null || true)"
rm -f "$started_at"
if [ "${#leftovers[@]}" -gt 0 ] || [ -n "$shm_left" ]; then
  echo "the test suite left these behind:" >&2
  for line in "${leftovers[@]}"; do
    echo "  $line" >&2
  done
  # Killed so that they do not pile up on a machine that runs the suite often.
  for pid in "${leftover_pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ -n "$shm_left" ] && echo "$shm_left" | sed 's/^/  /' >&2
  exit 1
fi
tracked_after="$(git status --porcelain --untracked-files=no 2>/dev/null | sort; git diff 2>/dev/null | sha256sum)"
if [ "$tracked_before" != "$tracked_after" ] && [ "${HOOKQ_SCREENSHOTS:-}" != "docs" ]; then
  echo "the test suite changed files git tracks:" >&2
  git status --short --untracked-files=no >&2
  exit 1
fi
echo "== test suite passed"
