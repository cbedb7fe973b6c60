#!/usr/bin/env bash
# Builds hookq's container image, hookq:<version> (the version of Cargo.toml),
# with podman or docker, whichever works here (`podman info` / `docker info`
# succeeds; a CLI without its daemon does not count). Nothing is pulled from
# a registry: the image is `FROM scratch` over a root filesystem this script
# assembles in a temp dir:
#   /hookq                       the binary (release build, or --binary PATH)
#   the libraries `ldd` lists    and the dynamic loader, at the paths ldd names
#   /etc/ssl/certs/ca-certificates.crt
#   /etc/passwd, /etc/group      root and the user hookq (uid/gid 10001)
#   /etc/nsswitch.conf           hosts: files dns (a Redis named by DNS)
#   /tmp                         mode 1777, empty
# The image runs as uid 10001, ENTRYPOINT ["/hookq"], CMD ["serve"], with
# HOOKQ_API__LISTEN=0.0.0.0:8080: give it HOOKQ_API__TOKENS (or [[api.keys]]
# in a config file), or the daemon refuses to serve an open API off loopback.
# It needs no writable file: run it with --read-only. docs/operations.md,
# "Containers", shows how to run it; deploy/compose.yaml runs it with Redis.
#
# Usage: scripts/image.sh [--binary PATH] [--engine podman|docker] [--tag NAME:TAG]
#   --binary PATH   package this build instead of `cargo build --release`
#   --engine NAME   use this engine (default: the first of podman, docker that works)
#   --tag NAME:TAG  tag the image so (default hookq:<version>)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '/^# Usage:/,/^#   --tag/s/^# \{0,1\}//p' "$0"
}

binary=""
engine=""
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --engine) engine="${2:?--engine needs podman or docker}"; shift 2 ;;
    --tag) tag="${2:?--tag needs NAME:TAG}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "image.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

# The package's version: the first `version = "..."` of [package].
version="$(awk -F'"' '/^\[package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{print $2; exit}' Cargo.toml)"
[ -n "$version" ] || { echo "image.sh: no version in Cargo.toml's [package]" >&2; exit 1; }
tag="${tag:-hookq:$version}"

# 1. An engine that works, not one that merely exists.
works() { command -v "$1" >/dev/null 2>&1 && "$1" info >/dev/null 2>&1; }
if [ -n "$engine" ]; then
  works "$engine" || { echo "image.sh: \`$engine info\` fails: $engine cannot build here" >&2; exit 1; }
elif works podman; then
  engine=podman
elif works docker; then
  engine=docker
else
  echo "image.sh: no container engine works here (neither \`podman info\` nor \`docker info\` succeeds);" \
    "install podman (apt-get install podman runc) or start docker's daemon" >&2
  exit 1
fi

# 2. The binary.
if [ -z "$binary" ]; then
  echo "== cargo build --release"
  cargo build --release --quiet
  binary=target/release/hookq
fi
[ -x "$binary" ] || { echo "image.sh: $binary is not an executable" >&2; exit 1; }

# 3. The root filesystem.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/hookq"

# The libraries and the loader at the paths ldd prints (`name => /path (addr)`
# and `/lib64/ld-linux-x86-64.so.2 (addr)`); linux-vdso is the kernel's.
if ldd_out="$(ldd "$binary" 2>&1)"; then
  if grep -q 'not found' <<<"$ldd_out"; then
    echo "image.sh: $binary needs libraries this machine lacks:" >&2
    grep 'not found' <<<"$ldd_out" >&2
    exit 1
  fi
  while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    chmod 0755 "$root$lib"
  done < <(grep -o '/[^ ]*' <<<"$ldd_out" | sort -u)
elif ! grep -q 'not a dynamic executable' <<<"$ldd_out"; then
  echo "image.sh: ldd $binary failed: $ldd_out" >&2
  exit 1
fi

certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || { echo "image.sh: $certs is missing (apt-get install ca-certificates)" >&2; exit 1; }
cp -L "$certs" "$root$certs"
chmod 0644 "$root$certs"

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/:/sbin/nologin
hookq:x:10001:10001:hookq:/nonexistent:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
hookq:x:10001:
EOF
echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"

cat >"$work/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
USER 10001:10001
ENV HOOKQ_API__LISTEN=0.0.0.0:8080
EXPOSE 8080
LABEL org.opencontainers.image.title="hookq" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.description="HTTP callbacks delivered at their due time, held in Redis"
ENTRYPOINT ["/hookq"]
CMD ["serve"]
EOF

# 4. The image. FROM scratch needs no pull; podman is told never to pull.
echo "== $engine build --tag $tag ($binary)"
pull=()
[ "$engine" = podman ] && pull=(--pull=never)
"$engine" build --quiet "${pull[@]}" --tag "$tag" --file "$work/Containerfile" "$work" >/dev/null

size_bytes="$("$engine" image inspect --format '{{.Size}}' "$tag")"
echo "== built $tag with $engine: $((size_bytes / 1000 / 1000)) MB ($size_bytes bytes); root filesystem: $(du -sh "$root" | cut -f1)"
