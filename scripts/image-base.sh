#!/usr/bin/env bash
# Makes a local build image for the Dockerfile when none can be pulled (an air-gapped host, or
# no route to Docker Hub): Debian bookworm by debootstrap, with Python 3.11 and venv, the same
# Python and glibc as python:3.11-slim, and binutils (the build stage strips the wheels'
# extension modules), imported as BASE (dsh-system-prompt-build:bookworm). The image's final
# stage is cut from its files (deploy/docker/rootfs.py): none of it ships as a layer.
# Prints the image's name. Needs root (or sudo) and Debian's debootstrap (make image-tools).
# Usage: ENGINE=podman scripts/image-base.sh   (DEBIAN_MIRROR=http://deb.debian.org/debian)
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${ENGINE:-podman}
base=${BASE:-dsh-system-prompt-build:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs=build/image-base/rootfs
sudo=$([ "$(id -u)" = 0 ] || echo sudo)

if "$engine" image inspect "$base" >/dev/null 2>&1; then
  echo "$base"
  exit 0
fi
$sudo rm -rf "$rootfs"
mkdir -p "$(dirname "$rootfs")"
echo "image-base: debootstrap bookworm into $rootfs" >&2
$sudo debootstrap --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates,binutils \
  bookworm "$rootfs" "$mirror" >build/image-base/debootstrap.log 2>&1 \
  || { tail -20 build/image-base/debootstrap.log >&2; exit 1; }
# What a slim base leaves out: apt's caches and lists, documentation, manuals, translations.
$sudo rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info \
  "$rootfs"/usr/share/locale
$sudo tar -C "$rootfs" --numeric-owner -c . \
  | "$engine" import --change 'CMD ["python3"]' - "$base" >/dev/null
$sudo rm -rf "$rootfs"
echo "$base"
