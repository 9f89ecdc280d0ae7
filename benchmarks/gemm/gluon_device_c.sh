#!/usr/bin/env bash
# Device call C (2026-12-07) (about 330 s): the Gluon fp16x3 kernel, strict's default on sm_90+
# since 2026-12-07h, verified on the GPU in every suite package that takes it beyond the eight
# 07h timed, against the same packages built before (.carry/strict6, the Triton kernel), and a
# sample of them timed A B B A: row reductions after the stored product (layer norm, softmax,
# row sum, the vocabulary log-softmax), a transformer block, a long-K split. Carry .carry/strict6
# and .carry/strict7 (`PRECISION=strict OUT=.carry/strict7 JOBS=2 bash benchmarks/build_packages.sh`).
# C_TIME="a b": time those instead; C_LIMIT: seconds for the A/B (default 540).
set -u
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/../device_env.sh"
env_txt
O="$OUT"; mkdir -p "$O/strict"
t0=$(date +%s)
AB_WORKLOADS="chain_batch_norm_relu_max_pool chain_div_gelu_tanh_hardtanh chain_gelu_residual_layer_norm
  chain_hardswish_clamp_row_max chain_instance_norm_residual_mul chain_min_tanh_tanh_tall
  chain_scale_add_avg_pool_log_softmax chain_scale_sigmoid_row_sum chain_sub_logsumexp_relu
  gemm_avg_pool gemm_batch_norm_eval gemm_group_norm gemm_hardswish gemm_hardtanh
  gemm_instance_norm gemm_layer_norm gemm_leaky_relu gemm_log_softmax_vocab gemm_logsumexp
  gemm_max_const_long_k gemm_max_pool gemm_min_const gemm_mish gemm_residual_add gemm_row_max
  gemm_row_mean_tall gemm_row_min gemm_row_sum gemm_sigmoid gemm_silu gemm_softmax transformer_block" \
AB_TIME="${C_TIME:-gemm_layer_norm gemm_softmax gemm_row_sum gemm_log_softmax_vocab transformer_block
  chain_gelu_residual_layer_norm gemm_max_const_long_k gemm_silu}" \
  AB_JOBS=4 TUNE_TIMEOUT=120 OUT="$O/strict" timeout "${C_LIMIT:-540}" bash benchmarks/ab_packages_h200.sh \
  .carry/strict6=strict .carry/strict7=strict > "$O/strict.log" 2>&1
echo "strict A/B rc=$? at $(( $(date +%s) - t0 )) s"
grep -c " verified" "$O/strict/ab-tune.log"; grep -v " verified" "$O/strict/ab-tune.log" | cut -c1-200
cat "$O/strict/ab.txt" | grep -v Warn
pack_out env.txt strict/ab.txt strict/ab-tune.log strict.log
