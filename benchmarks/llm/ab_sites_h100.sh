#!/usr/bin/env bash
# One device call: the A/B that 2026-12-06-h100-llama-prefill-sites left undone, and the
# per-region GEMM A/B against cuBLAS (benchmarks/gemm/store_ab.py), on the same card.
#   1. store_ab on the checked 4-layer package's own kernels (AB_ONE: the package as checked:
#      layer 0's calls split off and moved; its regions' kernels as generated)
#   2. `kforge tune` on AB_EVERY (benchmarks/llm/unsplit_package.py AB_ONE AB_EVERY: the same
#      moves applied to every layer): verifies the moved regions' new kernels
#   3. both packages timed by benchmarks/llm/time_package.py in one process
# Shapes: KFORGE_LLM_LAYERS/_BATCH/_SEQ as the packages were built (4 layers, 8 x 2048).
set -uo pipefail
source "$(dirname "$0")/../device_env.sh"
AB_ONE="${AB_ONE:-.carry/ab/one}"
AB_EVERY="${AB_EVERY:-.carry/ab/every}"
export KFORGE_ZOO_SIZE="${KFORGE_ZOO_SIZE:-real}" KFORGE_LLM_LAYERS="${KFORGE_LLM_LAYERS:-4}" \
  KFORGE_LLM_BATCH="${KFORGE_LLM_BATCH:-8}" KFORGE_LLM_SEQ="${KFORGE_LLM_SEQ:-2048}"
carried_wheels
env_txt
timeout "${STORE_AB_S:-200}" $PY benchmarks/gemm/store_ab.py "$AB_ONE" ${STORE_AB_REGIONS:-} \
  ${STORE_AB_SWEEP:+--sweep "$STORE_AB_SWEEP"} --out "$OUT" > "$OUT/store_ab.log" 2>&1
grep '"region"' "$OUT/store_ab.log" | cut -c1-400
timeout "${TUNE_S:-240}" $PY -m kforge.cli tune "$AB_EVERY" --rounds 0 > "$OUT/tune_every.log" 2>&1
tail -6 "$OUT/tune_every.log"
timeout "${TIME_S:-150}" $PY benchmarks/llm/time_package.py "$AB_ONE" "$AB_EVERY" > "$OUT/time.log" 2>&1
cat "$OUT/time.log"
