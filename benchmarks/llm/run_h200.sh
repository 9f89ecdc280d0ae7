#!/usr/bin/env bash
# Issue 12's H200 run (device machine: torch, triton, transformers from the carried wheel; no
# MLIR): the LLM inference workloads of benchmarks/models (llama3_8b, gpt_oss_20b), prefill and
# decode, strict and bf16. Packages are built here first (where MLIR and torch-mlir are):
#
#   KFORGE_ZOO_SIZE=real PRECISION=strict,bf16 OUT=.carry/llm benchmarks/build_packages.sh \
#       benchmarks/models/llama3_8b.py benchmarks/models/gpt_oss_20b.py
#
# and carried as .carry/llm (weights stripped: the bench binds each package to the live model).
# Steps, each bounded so that one device call (10 minutes) holds them; STEPS picks a subset:
#   moe      the grouped MoE kernel against the PyTorch grouping (benchmarks/moe/bench_moe.py)
#   tune     verify (and, with ROUNDS>0, tune) every package's candidate kernels on the GPU,
#            several packages at a time, admitted by free GPU memory; tuned.tgz comes back
#   compile  (not by default) warm Inductor's caches for the fp32 torch.compile route in
#            parallel processes (cold times recorded)
#   bench    `kforge bench` on the LLM workloads with the packages: eager / torch.compile
#            (default and max-autotune-no-cudagraphs) on the fp32 model and on the model cast to
#            bf16, KForge strict and bf16; tokens/s, correctness, where KForge's time goes
# Writes env.txt, moe.json, tune.log, tuned.tgz, kernels.txt, precompile.log,
# bench.{json,md,png}, bench.log under $OUT; all but the results are packed into rest.tgz.
# One device call (10 minutes) holds `moe tune` for all four workloads, or `bench` for about
# one model (both phases; three torch.compile routes each): run
#   STEPS="moe tune" ...; then STEPS=bench WORKLOADS=benchmarks/models/llama3_8b.py ...
# with PACKAGES pointing at the tuned packages (tuned.tgz unpacked), and merge the bench.json
# files with `kforge bench --merge A/bench.json B/bench.json --out DIR`. KFORGE_LLM_LAYERS / _BATCH / _SEQ / _CONTEXT change the shapes (the
# packages must have been built with the same ones).
set -uo pipefail
DEFAULT_PACKAGES=.carry/llm
source "$(dirname "$0")/../device_env.sh"
STEPS="${STEPS:-moe tune bench}"
WORKLOADS="${WORKLOADS:-benchmarks/models/llama3_8b.py benchmarks/models/gpt_oss_20b.py}"
# the bench's workloads (e.g. benchmarks/models/llama3_8b.py::decode); by default the phases of
# $WORKLOADS that have a package in $PACKAGES, so that a folder of decode packages does not
# bench prefill without KForge (a whole device call lost to it once, 2026-12-04)
packaged() {
  local names="" d w f
  for d in "$PACKAGES"/*/*/; do
    [ -d "$d" ] || continue
    w="$(basename "$d")"
    f="benchmarks/models/${w%.*}.py"
    [[ " $WORKLOADS " == *" $f "* || " $WORKLOADS " == *" $f::${w##*.} "* ]] || continue
    [[ " $names " == *" $f::${w##*.} "* ]] || names="$names $f::${w##*.}"
  done
  echo "${names# }"
}
BENCH_WORKLOADS="${BENCH_WORKLOADS:-$(packaged)}"
BENCH_WORKLOADS="${BENCH_WORKLOADS:-$WORKLOADS}"
POLICIES="${POLICIES:-strict,bf16}"
BUDGET_S="${BUDGET_S:-560}"                  # this call's whole budget
export KFORGE_ZOO_SIZE="${KFORGE_ZOO_SIZE:-real}"
carried_wheels
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
  env | grep '^KFORGE_' | sort
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
left() { echo $(( START + BUDGET_S - $(date +%s) )); }
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has moe; then
  timeout "${MOE_S:-90}" $PY benchmarks/moe/bench_moe.py --out "$OUT/moe.json" > "$OUT/moe.log" 2>&1
  tail -12 "$OUT/moe.log"
fi
if has tune; then
  # TUNE_WORKERS=local:N: each package's regions over N processes (admitted by free memory,
  # timed runs alone on the GPU: kforge.workers.admission); RETRY_REJECTED=1: regions rejected
  # with a kernel this KForge now generates differently are verified again; REGENERATE=moe:
  # verified kernels of that kind (or region hash) generated anew, kept only if faster; CHECK=1:
  # each package's whole model against its eager model, regions raised to strict until it is
  # within the policy (`kforge tune --check`)
  $PY -m kforge.bench.packages --tune --out "$PACKAGES" --jobs "${TUNE_JOBS:-6}" --gpus 1 \
    ${TUNE_WORKERS:+--workers "$TUNE_WORKERS"} ${RETRY_REJECTED:+--retry-rejected} \
    ${REGENERATE:+--regenerate "$REGENERATE"} ${CHECK:+--check} \
    --rounds "${ROUNDS:-0}" --timeout "${TUNE_TIMEOUT:-300}" \
    --deadline "$(( START + ${TUNE_DEADLINE_S:-330} ))" --precision "$POLICIES" $WORKLOADS \
    > "$OUT/tune.log" 2>&1
  tail -20 "$OUT/tune.log"
  tar czf "$OUT/tuned.tgz" --exclude='*.safetensors' "$PACKAGES"
  # which candidate each region runs, its error and time (readable without unpacking)
  $PY benchmarks/llm/package_kernels.py "$PACKAGES"/*/*/ > "$OUT/kernels.txt" 2>&1
fi
if has compile; then
  # both torch.compile modes of the matched routes are compiled again by the bench; this
  # pre-pass only warms the shared caches, on 16 CPUs at once
  timeout "$(( $(left) / 2 ))" $PY -m kforge.bench.precompile --out "$OUT/compile-times" \
    --jobs 4 --timeout 240 $WORKLOADS > "$OUT/precompile.log" 2>&1
  tail -6 "$OUT/precompile.log"
fi
if has bench; then
  $PY -m kforge.cli bench $BENCH_WORKLOADS --target cuda --precision "$POLICIES" --packages "$PACKAGES" \
    --no-tune --out "$OUT" --checkpoint "$OUT/partial.json" --min-reps "${MIN_REPS:-10}" \
    --rep-ms "${REP_MS:-100}" --deadline "$(( START + BUDGET_S - 60 ))" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
# at most 8 files come back: the results first, the rest packed into rest.tgz
pack_out bench.json bench.md kernels.txt tuned.tgz moe.json run.log env.txt
