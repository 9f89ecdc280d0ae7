# Sourced by run_h200.sh and remeasure_h200.sh, the device-machine scripts: the repository root
# as working directory, START (epoch seconds), OUT (created), PY, the Python path, the compiler
# caches, NVLink multicast off on hosts of several GPUs (KINDS.md), and PACKAGES.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START=$(date +%s)
OUT="${OUT:-$ROOT/out/bench}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/kforge-inductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kforge-triton}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# PACKAGES: the caller's, else the script's DEFAULT_PACKAGES (set before sourcing), else the suite's
PACKAGES="${PACKAGES:-${DEFAULT_PACKAGES:-.carry/bench}}"
