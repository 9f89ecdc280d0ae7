source benchmarks/device_env.sh >/dev/null; carried_wheels; env_txt >/dev/null
export KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=4 KFORGE_LLM_BATCH=8 KFORGE_LLM_SEQ=2048
timeout 150 $PY benchmarks/gemm/store_ab.py .carry/l4new/bf16/llama3_8b.prefill 06986ab7a9461c30 --only base,pass --out $OUT/new > $OUT/sab_new.log 2>&1
timeout 120 $PY benchmarks/gemm/store_ab.py .carry/ab/one 048741d3b09e900f cd564d41812ca3e8 --only base,pass --out $OUT/old > $OUT/sab_old.log 2>&1
grep '"region"' $OUT/sab_new.log $OUT/sab_old.log | cut -c1-420
$PY -m kforge.bench.packages --tune --out .carry/l4new --jobs 1 --gpus 1 --workers local:4 --rounds 0 --timeout 250 --deadline $(( START + 400 )) --precision bf16 benchmarks/models/llama3_8b.py > $OUT/tune.log 2>&1
tail -4 $OUT/tune.log
L=$(( START + 575 - $(date +%s) )); echo "left $L"
[ $L -gt 40 ] && timeout $L $PY benchmarks/llm/time_package.py .carry/l4new/bf16/llama3_8b.prefill .carry/ab/one > $OUT/time.log 2>&1; cat $OUT/time.log | tail -3
$PY benchmarks/llm/package_kernels.py .carry/l4new/bf16/llama3_8b.prefill > $OUT/kernels.txt 2>&1
