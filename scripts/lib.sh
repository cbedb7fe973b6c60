# Shared by scripts/run.sh and scripts/test.sh (sourced, not run): root and
# apt-get helpers for a fresh Debian/Ubuntu machine.

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
