#!/usr/bin/env bash
# Issue 14, item 3 on held-out GEMMs, one device call (about 250 s): every configuration of the
# builtin's space for the 8 regions of benchmarks/profile/specs_holdout/ (shapes the cost model
# was not fitted on), bf16 then strict, timed, profiled and replayed (blind vs profile-driven).
#   run: bash benchmarks/profile/run_h200_holdout.sh   ($OUT: tuner.json, run.log)
# Env: KF_SPEC_DIRS (default the holdout dir; "benchmarks/profile/specs,benchmarks/profile/specs_holdout"
# for both, which needs about twice the time), KF_POLICIES, KF_BUDGET_S.
# The second held-out set (2026-12-04): KF_SPEC_DIRS=benchmarks/profile/specs_holdout2
# KF_BUDGET_S=210 (93 s on the H200, 345 configurations). The third (2026-12-04):
# KF_SPEC_DIRS=benchmarks/profile/specs_holdout3 KF_BUDGET_S=200 (345 configurations).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../device_env.sh"
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  KF_SPEC_DIRS="${KF_SPEC_DIRS:-benchmarks/profile/specs_holdout}" \
    KF_POLICIES="${KF_POLICIES:-bf16,strict}" KF_BUDGET_S="${KF_BUDGET_S:-235}" \
    timeout 290 $PY benchmarks/profile/bench_tuner.py
  echo "elapsed $(( $(date +%s) - START )) s"
} 2>&1 | tee "$OUT/run.log"
