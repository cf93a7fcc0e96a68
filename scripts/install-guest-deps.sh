#!/usr/bin/env bash
# Set up what the qemu guest validator needs, on Debian 12, as root, without interaction:
#   * qemu-system-x86 (installed with apt-get),
#   * a Debian cloud kernel image and a static busybox, unpacked from their .deb files into a
#     cache directory (never installed into /boot),
#   * the static guest workload (native/workload.c built with gcc -static into $cache/build).
# Idempotent: a second run finds everything in place and only prints the paths.
#
# Usage: scripts/install-guest-deps.sh [--with-6.12] [--cache DIR]
#   --with-6.12   also fetch the 6.12 cloud kernel (linux-image-6.12-cloud-amd64's dependency)
#   --cache DIR   cache directory (default: $SLABTUNE_CACHE, else ~/.cache/slabtune)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SLABTUNE_CACHE:-${HOME}/.cache/slabtune}"
with_612=0
while [ $# -gt 0 ]; do
    case "$1" in
        --with-6.12) with_612=1 ;;
        --cache) shift; cache="${1:?--cache needs a directory}" ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "install-guest-deps: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
export DEBIAN_FRONTEND=noninteractive

log() { echo "install-guest-deps: $*" >&2; }

# Package lists may be empty on a fresh image; refresh once if apt cannot see the kernel meta.
if ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
    log "apt lists lack linux-image-cloud-amd64; running apt-get update"
    apt-get update -q >/dev/null
fi

need_pkgs=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_pkgs+=(qemu-system-x86)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "apt-get install ${need_pkgs[*]}"
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The concrete image package a metapackage points at (e.g. linux-image-6.1.0-56-cloud-amd64).
resolve_kernel_pkg() {
    apt-cache depends "$1" 2>/dev/null \
        | awk '/^ *Depends: *linux-image-[0-9]/ {print $2; exit}'
}

# Fetch a .deb with apt-get download and unpack it under $cache/<package>/ (once).
fetch_unpack() {
    local pkg="$1" dest="$cache/$1"
    if [ -e "$dest/.unpacked" ]; then
        return 0
    fi
    local tmp
    tmp="$(mktemp -d "$cache/.dl.XXXXXX")"
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
    rm -rf "$dest"
    mkdir -p "$dest"
    dpkg-deb -x "$tmp"/*.deb "$dest"
    rm -rf "$tmp"
    touch "$dest/.unpacked"
    log "unpacked $pkg into $dest"
}

mkdir -p "$cache"

kernels=()
metas=(linux-image-cloud-amd64)
[ "$with_612" = 1 ] && metas+=(linux-image-6.12-cloud-amd64)
for meta in "${metas[@]}"; do
    pkg="$(resolve_kernel_pkg "$meta")"
    if [ -z "$pkg" ]; then
        log "cannot resolve the kernel package behind $meta"
        exit 1
    fi
    fetch_unpack "$pkg"
    img="$(ls "$cache/$pkg"/boot/vmlinuz-* 2>/dev/null | head -n1)"
    if [ -z "$img" ]; then
        log "no vmlinuz in $pkg"
        exit 1
    fi
    kernels+=("$img")
done

fetch_unpack busybox-static
busybox="$cache/busybox-static/bin/busybox"
[ -x "$busybox" ] || { log "no static busybox in busybox-static"; exit 1; }

# The same place slabtune.native.build_dir() builds into.
make -s -C "$repo/native" BUILD="$cache/build" workload >/dev/null
workload="$cache/build/workload"

# Stable names the Python side looks for first.
ln -sfn "${kernels[0]}" "$cache/bzImage"
[ "$with_612" = 1 ] && ln -sfn "${kernels[1]}" "$cache/bzImage-6.12"
ln -sfn "$busybox" "$cache/busybox"

echo "qemu=$(command -v qemu-system-x86_64)"
for k in "${kernels[@]}"; do echo "kernel=$k"; done
echo "bzImage=$cache/bzImage"
echo "busybox=$busybox"
echo "workload=$workload"
