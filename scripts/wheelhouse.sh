#!/usr/bin/env bash
# Fills wheelhouse/ with every wheel the image installs: the project's own, built here, and
# its server extra's dependencies, downloaded as binary wheels for the image's Python and
# CPU (not the host's), so `docker build --network none` can install them with no index.
# Usage: scripts/wheelhouse.sh   (PYTHON=.venv/bin/python, IMAGE_PYTHON=3.11, WHEELHOUSE=wheelhouse)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
image_python=${IMAGE_PYTHON:-3.11}   # python:3.11-slim and Debian bookworm's python3 alike
out=${WHEELHOUSE:-wheelhouse}
arch=$(uname -m)

# The base images carry glibc 2.36: any manylinux wheel up to that tag runs there.
platforms=(--platform "manylinux2014_$arch")
for minor in $(seq 17 36); do
  platforms+=(--platform "manylinux_2_${minor}_$arch")
done

# The requirements, read from pyproject.toml, so this list cannot drift from it.
mapfile -t requirements < <("$python" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["server"]))
PY
)

find "$out" -name '*.whl' -delete 2>/dev/null || true
mkdir -p "$out"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" .
"$python" -m pip download --quiet --only-binary=:all: --dest "$out" \
  --implementation cp --python-version "$image_python" "${platforms[@]}" "${requirements[@]}"
# In-tree builds leave their scratch folder behind; the image never needs it.
rm -rf build/lib build/bdist.*
echo "wheelhouse: $(find "$out" -name '*.whl' | wc -l) wheels in $out/ for cp${image_python/./} $arch"
