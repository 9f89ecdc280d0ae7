#!/usr/bin/env bash
# Build the folder of KForge packages that benchmarks/run_h200.sh carries to the GPU machine:
# every workload compiled for --target cuda under each precision policy, here (where MLIR and
# torch-mlir are installed), weights left out (the bench binds packages to live modules).
#
#   benchmarks/build_packages.sh                      # whole suite, strict,tf32,bf16 -> .carry/bench
#   benchmarks/build_packages.sh gemm_bias_relu 'chain_*'
#   PRECISION=strict OUT=.carry/bench JOBS=2 benchmarks/build_packages.sh --skip-existing
# The first policy runs the whole `kforge compile`; the others reuse its regions (synth only).
#
# `.carry/` is git-ignored; name `.carry/bench` in the device call's `carry` (64 MiB at most).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ] && source .venv/bin/activate
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec python -m kforge.bench.packages --out "${OUT:-.carry/bench}" --target "${TARGET:-cuda}" \
  --precision "${PRECISION:-strict,tf32,bf16}" --jobs "${JOBS:-1}" "$@"
