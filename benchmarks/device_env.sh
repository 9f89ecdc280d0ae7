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
PACKAGES_GIVEN="${PACKAGES:+1}"
PACKAGES="${PACKAGES:-${DEFAULT_PACKAGES:-.carry/bench}}"

# carried_wheels: the wheels carried in .whl (transformers, where the image's is older)
# installed into /tmp/site, first on the Python path; nothing when none are carried
carried_wheels() {
  ls .whl/*.whl >/dev/null 2>&1 || return 0
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
}

# env_txt: $OUT/env.txt (the date, the GPU and its clocks, torch and triton, the commit), printed
env_txt() {
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu \
      --format=csv
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
    git log -1 --format='code %h %s' 2>/dev/null
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}

# pack_out KEEP...: a device call brings back at most 8 files (the device README). Every file
# under $OUT except the named ones (paths relative to $OUT) goes into $OUT/rest.tgz, so that a
# run's logs do not crowd out its results (2026-12-05: a tuned package's archive and the strict
# step of ab_tma_h200.sh were left behind). Call it last.
pack_out() {
  local keep=" $* " f rest=()
  while IFS= read -r f; do
    f="${f#./}"
    [[ "$keep" == *" $f "* || "$f" == rest.tgz ]] || rest+=("$f")
  done < <(cd "$OUT" && find . -type f | sort)
  [ ${#rest[@]} -eq 0 ] && return 0
  (cd "$OUT" && tar czf rest.tgz "${rest[@]}" && rm -f "${rest[@]}" &&
    find . -mindepth 1 -type d -empty -delete)
  echo "packed ${#rest[@]} files into $OUT/rest.tgz"
}
