#!/usr/bin/env bash
# Here (not on the device): build what device_dc.sh carries, about 25 minutes on two cores.
# `.carry/` is git-ignored and does not survive a session. Folders that exist are kept
# (REBUILD=1 rebuilds them).
#   .carry/ab/l2      Llama-3-8B prefill, 2 layers x 4 x 1,024 tokens, bf16, the TMA kernel
#   .carry/ab/l2ws2   the same with KFORGE_BUILTIN_WS=1 (every GEMM region on the WS kernel)
#   .carry/strict6    the strict suite without the Gluon fp16x3 kernel (KFORGE_BUILTIN_GLUON=0)
#   .carry/strict7    the strict suite with it (the default on sm_90)
#   .whl              transformers 5.24.0 (the device image's is older)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
[ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ] && source .venv/bin/activate
LLM=(KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=2 KFORGE_LLM_BATCH=4 KFORGE_LLM_SEQ=1024)
build() {   # build FOLDER ENV... -- ARGS...: benchmarks/build_packages.sh into FOLDER
  local out="$1"; shift
  if [ -d "$out" ] && [ "${REBUILD:-0}" != 1 ]; then echo "$out: kept"; return; fi
  rm -rf "$out"
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "$out: building"
  env "${envs[@]}" OUT="$out" bash benchmarks/build_packages.sh "$@"
}
build .carry/ab/l2 "${LLM[@]}" PRECISION=bf16 JOBS=1 -- benchmarks/models/llama3_8b.py::prefill
build .carry/ab/l2ws2 "${LLM[@]}" KFORGE_BUILTIN_WS=1 PRECISION=bf16 JOBS=1 -- \
  benchmarks/models/llama3_8b.py::prefill
build .carry/strict6 KFORGE_BUILTIN_GLUON=0 PRECISION=strict JOBS=2 --
build .carry/strict7 PRECISION=strict JOBS=2 --
ls .whl/transformers-5.24.0-*.whl >/dev/null 2>&1 ||
  python -m pip download -q transformers==5.24.0 --no-deps -d .whl
du -sh .carry/ab/l2 .carry/ab/l2ws2 .carry/strict6 .carry/strict7 .whl
