#!/usr/bin/env bash
# Generates the Python stubs (and their .pyi typings) from proto/ into client/, and links the
# .proto beside them (one file, two names) so the wheel ships the contract.
# Usage: scripts/gen_proto.sh [OUTDIR]   (OUTDIR defaults to client/; CI uses a temp dir to check freshness)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-client}"
python=${PYTHON:-python}
# protoc finds the mypy-protobuf plugins on PATH, beside the interpreter that has them.
export PATH="$(dirname "$(command -v "$python")"):$PATH"
rm -f "$out"/dsh/systemprompt/v1/system_prompt_pb2*.py "$out"/dsh/systemprompt/v1/system_prompt_pb2*.pyi
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
  -I proto \
  --python_out="$out" \
  --grpc_python_out="$out" \
  --mypy_out="$out" \
  --mypy_grpc_out="$out" \
  proto/dsh/systemprompt/v1/system_prompt.proto
stubs="$out"/dsh/systemprompt/v1
ln -sfn "$(realpath --relative-to="$stubs" proto/dsh/systemprompt/v1/system_prompt.proto)" \
  "$stubs"/system_prompt.proto
