#!/usr/bin/env bash
# One device call (2026-12-06): the sibling-products region of a rebuilt 4-layer Llama-3-8B
# bf16 prefill package (.carry/l4new) against the two regions it replaces (.carry/ab/one:
# 2026-12-06-h100-llama-prefill-sites' checked package), the split pass that reads a row of
# 14336 columns once (.carry/split: that package's down projection regenerated) against the
# one that reads it twice; then the new package verified and timed beside the old one.
source benchmarks/device_env.sh >/dev/null; carried_wheels; env_txt >/dev/null
export KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=4 KFORGE_LLM_BATCH=8 KFORGE_LLM_SEQ=2048
timeout 150 $PY benchmarks/gemm/store_ab.py .carry/l4new/bf16/llama3_8b.prefill 06986ab7a9461c30 --only base,pass --out $OUT/new > $OUT/sab_new.log 2>&1
timeout 120 $PY benchmarks/gemm/store_ab.py .carry/ab/one 048741d3b09e900f cd564d41812ca3e8 ee2fb2f8c882b2d8 --only base,pass --out $OUT/old > $OUT/sab_old.log 2>&1
timeout 60 $PY benchmarks/gemm/store_ab.py .carry/split ee2fb2f8c882b2d8 --only base,pass --out $OUT/split > $OUT/sab_split.log 2>&1
grep '"region"' $OUT/sab_new.log $OUT/sab_old.log $OUT/sab_split.log | cut -c1-420
$PY -m kforge.bench.packages --tune --out .carry/l4new --jobs 1 --gpus 1 --workers local:4 --rounds 0 --timeout 250 --deadline $(( START + 400 )) --precision bf16 benchmarks/models/llama3_8b.py > $OUT/tune.log 2>&1
tail -4 $OUT/tune.log
L=$(( START + 575 - $(date +%s) )); echo "left $L"
[ $L -gt 40 ] && timeout $L $PY benchmarks/llm/time_package.py .carry/l4new/bf16/llama3_8b.prefill .carry/ab/one > $OUT/time.log 2>&1; cat $OUT/time.log | tail -3
$PY benchmarks/llm/package_kernels.py .carry/l4new/bf16/llama3_8b.prefill > $OUT/kernels.txt 2>&1
