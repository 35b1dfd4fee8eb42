#!/usr/bin/env bash
# make image-test: the image built and run as a user deploys it (tests/image).
#
# Keeps all of podman's state under build/containers/ (images, containers, volumes, its
# config), never the host's: a run starts from nothing but what it pulls or makes, and two
# clones on one machine never meet. Builds the image offline (scripts/image.sh: wheelhouse,
# --network none, a debootstrap base when python:3.11-slim cannot be pulled), then runs the
# tests against it. Podman and the rest come from Debian (make image-tools).
# Usage: scripts/image-test.sh [pytest args]        the tests (make image-test)
#        scripts/image-test.sh --bench [--write]   the image's figures (make bench-image)
#        (PYTHON=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
state=$PWD/build/containers
mkdir -p "$state"

# This machine's quirks, seen on a Debian bookworm VM: crun refuses its hybrid cgroups (runc
# works); podman's default rlimits (nofile and nproc 1048576) are above the hard limits and
# root here may not raise them (no CAP_SYS_RESOURCE), so no container starts until they are
# set: nofile to this shell's hard limit (at most 65536), nproc to 4096 (conmon itself runs
# with 32768 here, and runc fails above that); no systemd, so cgroupfs and a file for events.
# tmp_dir keeps podman's locks away from another clone's.
nofile=$(ulimit -Hn)
if [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; then nofile=65536; fi
cat >"$state/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$state/tmp"
CONF
cat >"$state/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$state/storage"
runroot = "$state/run"
CONF
export CONTAINERS_CONF=$state/containers.conf CONTAINERS_STORAGE_CONF=$state/storage.conf
export ENGINE=podman PYTHON=$python

started=$(date +%s)
DSP_IMAGE=$(scripts/image.sh | tail -1)
export DSP_IMAGE
echo "image-test: built $DSP_IMAGE in $(($(date +%s) - started)) s"
if [ "${1:-}" = --bench ]; then
  shift
  exec "$python" -m bench.image "$DSP_IMAGE" "$@"
fi
"$python" -m pytest -q -p no:cacheprovider tests/image "$@"
echo "image-test: done in $(($(date +%s) - started)) s"
