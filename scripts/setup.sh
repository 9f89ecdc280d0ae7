#!/usr/bin/env bash
# README command #1. On a fresh machine: creates .venv, installs the pinned toolchain, builds
# kforge-opt and the pass plugin (scripts/bootstrap.sh), then runs the main job on a bundled
# example: import it through torch-mlir, print its linalg IR, and cut it into fusion regions
# with kforge-opt, printing the region statistics.
#   bash scripts/setup.sh [EXAMPLE.py]      (default: examples/mlp_gelu.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bootstrap.sh
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"

EXAMPLE="${1:-examples/mlp_gelu.py}"
OUT="out/$(basename "$EXAMPLE" .py)"
# Target: cuda when a GPU is visible, else the Triton interpreter on the CPU.
TARGET="$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"

log "main job 1/3: kforge import $EXAMPLE -o $OUT/model.mlir --print   (linalg IR)"
kforge import "$EXAMPLE" -o "$OUT/model.mlir" --print
log "main job 2/3: kforge regions $OUT/model.mlir   (fusion regions and their statistics)"
kforge regions "$OUT/model.mlir" -o "$OUT/regions"
log "main job 3/3: kforge compile $EXAMPLE --target $TARGET --provider builtin, then kforge run --check"
kforge compile "$EXAMPLE" -o "$OUT/pkg" --target "$TARGET" --provider builtin --precision strict
kforge run "$OUT/pkg" --check
log "done. Next: source .venv/bin/activate; kforge --help; build/bin/kforge-opt --help"
