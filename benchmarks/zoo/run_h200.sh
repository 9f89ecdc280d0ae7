#!/usr/bin/env bash
# The zoo's H200 run (device machine: torch + triton only). Packages are built here by
#   KFORGE_ZOO_SIZE=real PRECISION=strict OUT=.carry/zoo benchmarks/build_packages.sh benchmarks/models/*.py
# and carried as .carry/zoo; transformers (the zoo's one extra dependency) as a wheel in .whl.
#   1. the attention kernel against torch's SDPA (benchmarks/attention/bench_attention.py);
#   2. verify the packages' candidate kernels on the GPU, several packages at a time;
#   3. time eager, torch.compile, KForge and KForge with every region on its reference, and
#      profile where KForge's time goes (benchmarks/zoo/measure_zoo.py).
# Writes env.txt, attention.json/.log, tune.log, tuned.tgz, zoo.json, run.log under $OUT.
# MODELS: the zoo files to tune (default all); MEASURE: the ones to time (default MODELS);
# SKIP_ATTENTION=1, SKIP_TUNE=1 skip those steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export KFORGE_ZOO_SIZE="${KFORGE_ZOO_SIZE:-real}"
PACKAGES="${PACKAGES:-.carry/zoo}"
START=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ -z "${SKIP_ATTENTION:-}" ]; then
  timeout "${ATTENTION_S:-150}" python3 benchmarks/attention/bench_attention.py --out "$OUT/attention.json" \
    --budget-s "$(( ${ATTENTION_S:-150} - 20 ))" > "$OUT/attention.log" 2>&1
  tail -25 "$OUT/attention.log"
fi
[ -z "${SKIP_TUNE:-}" ] && python3 -m kforge.bench.packages --tune --out "$PACKAGES" --jobs "${TUNE_JOBS:-6}" --gpus 1 \
  --timeout "${TUNE_TIMEOUT:-200}" --deadline "$(( START + ${TUNE_DEADLINE_S:-330} ))" \
  --precision strict ${MODELS:-benchmarks/models/*.py} > "$OUT/tune.log" 2>&1
tail -12 "$OUT/tune.log"
# the tuned packages (manifests, kernels, linked plans; no weights) come back for later calls
tar czf "$OUT/tuned.tgz" --exclude='*.safetensors' "$PACKAGES"
python3 benchmarks/zoo/measure_zoo.py --packages "$PACKAGES/strict" --out "$OUT/zoo.json" \
  $(for m in ${MEASURE:-${MODELS:-benchmarks/models/*.py}}; do basename "$m" .py; done) 2>&1 \
  | tee "$OUT/run.log"
