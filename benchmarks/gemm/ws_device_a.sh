#!/usr/bin/env bash
# Device call A (written 2026-12-07, not yet run) (about 450 s): the warp-specialized Gluon GEMM alone against cuBLAS
# (ws_ab.py), then, if both builtin schedules pass their check, packages of six workloads,
# verified and timed A B C ... C B A: under bf16 (fp32 models) built three ways, the TMA kernel
# (.carry/bench7), the cooperative WS schedule first (.carry/ab/ws, KFORGE_BUILTIN_WS=1) and the
# ping-pong first (.carry/ab/pp, KFORGE_BUILTIN_WS=pingpong); under bf16-model the first two.
# Carry those three folders.
set -u
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/../device_env.sh"
env_txt
O="$OUT"
t0=$(date +%s)
timeout 200 env OUT="$O" WS_CHECK_S=90 $PY benchmarks/gemm/ws_ab.py > "$O/ws_ab.log" 2>&1
rc=$?; echo "ws_ab rc=$rc at $(( $(date +%s) - t0 )) s" >> "$O/ws_ab.log"; cat "$O/ws_ab.log"
if [ $rc -eq 0 ]; then
  AB_WORKLOADS="gemm_bias_relu gemm_gelu_erf gemm_max_const_long_k gemm_layer_norm chain_mish_tanh transformer_block" \
  AB_JOBS=2 TUNE_TIMEOUT=120 OUT="$O/ab" timeout $(( 560 - ($(date +%s) - t0) )) \
    bash benchmarks/ab_packages_h200.sh .carry/bench7=bf16 .carry/ab/ws=bf16 .carry/ab/pp=bf16 \
    -- .carry/bench7=bf16-model .carry/ab/ws=bf16-model > "$O/ab.log" 2>&1
  echo "package A/B rc=$? at $(( $(date +%s) - t0 )) s"; grep -c "verified" "$O/ab/ab-tune.log"
fi
pack_out env.txt ws_ab.json ws_ab.log ab/ab.txt ab/ab-tune.log
