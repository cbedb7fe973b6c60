# Shared by the scripts (sourced, not run): root and apt-get helpers for a
# fresh Debian/Ubuntu machine, and the path of a binary cargo builds.

# Run a command as root: directly, through sudo, or fail saying why.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "need root (or sudo) to run: $*" >&2
    exit 1
  fi
}

# apt-get install, running apt-get update once first.
apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    echo "== apt-get update"
    as_root apt-get update -qq
    apt_updated=1
  fi
  echo "== apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The path of the executable target TARGET that a cargo build prints with
# `--message-format=json` on stdin (the last, if several).
cargo_executable() { # TARGET
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1" | tail -n1
}
