#!/usr/bin/env bash
# One device call (2026-12-06, twenty-seventh session): the SwiGLU region of the rebuilt 4-layer
# Llama-3-8B bf16 prefill package in its default form (.carry/l4new: the partner's GEMM, then
# the stage) and paired (.carry/l4pair, built with KFORGE_BUILTIN_PAIRED=1: one 128 x 256
# accumulator of both products) against the two regions it replaces (.carry/ab/one), the
# one-read split pass (.carry/split) against the two-read one; then the checked package
# (.carry/ab/one) and torch.compile on the bf16 model profiled kernel by kernel
# (benchmarks/llm/profile_package.py).
source "$(dirname "$0")/../device_env.sh" >/dev/null; carried_wheels; env_txt >/dev/null
export KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=4 KFORGE_LLM_BATCH=8 KFORGE_LLM_SEQ=2048
SAB="$PY benchmarks/gemm/store_ab.py"
timeout ${SAB_S:-70} $SAB .carry/l4new/bf16/llama3_8b.prefill 06986ab7a9461c30 --only base,pass --out $OUT/new > $OUT/sab_new.log 2>&1
timeout ${SAB_S:-70} $SAB .carry/l4pair/bf16/llama3_8b.prefill 06986ab7a9461c30 --only base,pass --out $OUT/pair > $OUT/sab_pair.log 2>&1
timeout ${SAB_S:-70} $SAB .carry/ab/one 048741d3b09e900f cd564d41812ca3e8 ee2fb2f8c882b2d8 --only base,pass --out $OUT/old > $OUT/sab_old.log 2>&1
timeout 40 $SAB .carry/split ee2fb2f8c882b2d8 --only base,pass --out $OUT/split > $OUT/sab_split.log 2>&1
grep -h '"region"' $OUT/sab_*.log | cut -c1-330
L=$(( START + ${BUDGET_S:-560} - $(date +%s) )); echo "left $L s for the profile"
[ $L -gt 60 ] && timeout $L $PY benchmarks/llm/profile_package.py .carry/ab/one --json $OUT/profile.json > $OUT/profile.log 2>&1
cat $OUT/profile.log | head -80
pack_out profile.log profile.json sab_new.log sab_pair.log sab_old.log sab_split.log env.txt
