#!/usr/bin/env bash
# The region A/B of sibling_ab_device.sh alone (no verification, no whole-model timing), for a
# device call of about two minutes: the paired SwiGLU region against the two it replaces, and
# the one-read split pass against the two-read one, by benchmarks/gemm/store_ab.py.
source "$(dirname "$0")/../device_env.sh" >/dev/null; env_txt >/dev/null
timeout 70 $PY benchmarks/gemm/store_ab.py .carry/l4new/bf16/llama3_8b.prefill 06986ab7a9461c30 --only base,pass --out $OUT/new > $OUT/sab_new.log 2>&1
timeout 60 $PY benchmarks/gemm/store_ab.py .carry/ab/one 048741d3b09e900f cd564d41812ca3e8 ee2fb2f8c882b2d8 --only base,pass --out $OUT/old > $OUT/sab_old.log 2>&1
timeout 30 $PY benchmarks/gemm/store_ab.py .carry/split ee2fb2f8c882b2d8 --only base,pass --out $OUT/split > $OUT/sab_split.log 2>&1
grep -h '"region"' $OUT/sab_new.log $OUT/sab_old.log $OUT/sab_split.log | cut -c1-330
