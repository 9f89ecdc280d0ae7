#!/usr/bin/env bash
# Device call B (written 2026-12-07, not yet run) (about 450 s): Llama-3-8B prefill (2 layers, 4 x 1,024 tokens)
# built three ways (.carry/ab/l2: TMA kernel; l2ws: cooperative WS first; l2pp: ping-pong
# first), verified and timed A B C C B A; then strict's Gluon fp16x3 kernel alone
# (fp16x3_ab.py) and eight strict packages with it (.carry/ab/gluon) and with A split in the
# pointer kernel (.carry/ab/insplit, KFORGE_BUILTIN_INSPLIT=1) against .carry/strict6.
# Carry .carry/ab/l2*, .carry/ab/gluon, .carry/ab/insplit, .carry/strict6 and .whl (transformers).
set -u
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/../device_env.sh"
carried_wheels; env_txt
O="$OUT"; mkdir -p "$O/llama" "$O/strict"
t0=$(date +%s)
KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=2 KFORGE_LLM_BATCH=4 KFORGE_LLM_SEQ=1024 AB_JOBS=1 \
  TUNE_TIMEOUT=150 OUT="$O/llama" timeout 230 bash benchmarks/ab_packages_h200.sh \
  .carry/ab/l2=bf16 .carry/ab/l2ws=bf16 .carry/ab/l2pp=bf16 > "$O/llama.log" 2>&1
echo "llama A/B rc=$? at $(( $(date +%s) - t0 )) s"; cat "$O/llama/ab.txt"
FP16X3_VARIANTS=base,gluon_pp OUT="$O/strict" timeout 100 $PY benchmarks/gemm/fp16x3_ab.py \
  > "$O/strict/fp16x3.log" 2>&1
echo "fp16x3_ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -15 "$O/strict/fp16x3.log"
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 60 ]; then
  AB_WORKLOADS="gemm_bias_relu gemm_gelu_erf gemm_clamp gemm_div chain_mish_tanh gemm_channel_scale gemm_gelu_tanh gemm_const_scale" \
  AB_JOBS=4 TUNE_TIMEOUT=100 OUT="$O/strict" timeout $left bash benchmarks/ab_packages_h200.sh \
    .carry/strict6=strict .carry/ab/gluon=strict .carry/ab/insplit=strict > "$O/strict.log" 2>&1
  echo "strict A/B rc=$? at $(( $(date +%s) - t0 )) s"; cat "$O/strict/ab.txt"
fi
pack_out env.txt llama/ab.txt llama/ab-tune.log strict/fp16x3_ab.json strict/ab.txt strict/ab-tune.log
