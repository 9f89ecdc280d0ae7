#!/usr/bin/env bash
# Creates .venv, installs the pinned toolchain (torch CPU, torch-mlir, MLIR/LLVM 22.1.8 from PyPI),
# installs kforge in editable mode and builds kforge-opt and the pass plugin into build/.
# Idempotent: a second run only rebuilds what changed. Sourced by setup.sh and test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KFORGE_VENV:-$ROOT/.venv}"
BUILD="${KFORGE_BUILD:-$ROOT/build}"
PY="${PYTHON:-python3}"

log() { printf '\033[1m[kforge setup]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

STAMP="$VENV/.kforge-deps"
DEPS_HASH="$(sha256sum "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$DEPS_HASH" ]; then
  # the toolchain takes about 4.5 GB in the venv; a full disk otherwise fails deep inside pip
  FREE_KB="$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print $4}')"
  if [ -n "$FREE_KB" ] && [ "$FREE_KB" -lt 6000000 ]; then
    log "error: $(( FREE_KB / 1024 )) MiB free on the disk of $VENV; the toolchain needs about 6 GB" >&2
    log "free some space (old clones, caches), or set KFORGE_VENV to a disk with room" >&2
    exit 1
  fi
  log "installing Python packages (torch 2.13.0 CPU, torch-mlir, MLIR/LLVM 22.1.8, triton, ray)"
  python -m pip install -q --upgrade pip
  # torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e "$ROOT[compile,agents,dev]"
  echo "$DEPS_HASH" > "$STAMP"
fi

SITE="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
MLIR_DIR="${MLIR_DIR:-$SITE/mlir/lib/cmake/mlir}"
LLVM_DIR="${LLVM_DIR:-$SITE/llvm/lib/cmake/llvm}"
export PATH="$SITE/llvm/bin:$SITE/mlir/bin:$PATH"

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring the C++ build against MLIR 22 ($MLIR_DIR)"
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$MLIR_DIR" -DLLVM_DIR="$LLVM_DIR" \
    -DLLVM_EXTERNAL_LIT="$VENV/bin/lit" >/dev/null
fi
log "building kforge-opt and the pass plugin"
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | grep -E 'error|warning: unused|Error' || true
cmake --build "$BUILD" -j "$(nproc)" >/dev/null   # fails loudly if the build is broken
export PATH="$BUILD/bin:$PATH"
export KFORGE_OPT="$BUILD/bin/kforge-opt"
