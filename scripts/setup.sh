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

log "main job: kforge import $EXAMPLE -o $OUT/model.mlir --print"
kforge import "$EXAMPLE" -o "$OUT/model.mlir" --print
log "main job: kforge regions $OUT/model.mlir -o $OUT/regions"
kforge regions "$OUT/model.mlir" -o "$OUT/regions"
log "done. Next: source .venv/bin/activate; kforge --help; build/bin/kforge-opt --help"
