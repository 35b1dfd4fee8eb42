#!/usr/bin/env bash
# Builds the sidecar's image, dsh-system-prompt:VERSION (pyproject's version), offline: the
# wheels come from wheelhouse/ (scripts/wheelhouse.sh, on this host) and the build runs with
# --network none. Uses docker when its daemon answers, else podman. The build stage runs on
# PYTHON_IMAGE (python:3.11-slim) when it is here or can be pulled, else on a local Debian
# bookworm image (scripts/image-base.sh); the image is distroless, cut from it, on its runtime
# stage, tagged RUNTIME_IMAGE (dsh-system-prompt-runtime:VERSION). Prints the tag last.
# Usage: scripts/image.sh   (ENGINE=docker|podman, IMAGE=tag, RUNTIME_IMAGE=tag,
#                            PYTHON_IMAGE=base, PYTHON=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}

engine=${ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null; then
    engine=podman
  else
    echo "image: neither a docker daemon nor podman here (make image-tools installs podman)" >&2
    exit 2
  fi
fi
version=$("$python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
tag=${IMAGE:-dsh-system-prompt:$version}
runtime=${RUNTIME_IMAGE:-dsh-system-prompt-runtime:$version}

base=${PYTHON_IMAGE:-python:3.11-slim}
if ! "$engine" image inspect "$base" >/dev/null 2>&1 \
  && ! "$engine" pull --quiet "$base" >/dev/null 2>&1; then
  echo "image: $base cannot be pulled; using a local bookworm base" >&2
  base=$(ENGINE=$engine scripts/image-base.sh)
fi

PYTHON=$python scripts/wheelhouse.sh >&2
flags=(--network none --build-arg "PYTHON_IMAGE=$base" --build-arg "RUNTIME_IMAGE=$runtime")
if [ "$engine" = podman ]; then
  # The OCI image format has no HEALTHCHECK: podman keeps it only in Docker's format.
  flags+=(--format docker)
fi
# The runtime stage first, tagged: it is the base the image's label names, and the second
# build takes it (and the build stage) from the cache, the same layers.
echo "image: $engine build ${flags[*]} --target runtime --tag $runtime ." >&2
"$engine" build "${flags[@]}" --target runtime --tag "$runtime" . >&2
echo "image: $engine build ${flags[*]} --tag $tag ." >&2
"$engine" build "${flags[@]}" --tag "$tag" . >&2
echo "$tag"
