#!/usr/bin/env bash
# Issue 14 on the H200, one device call: record the profiler fixtures, then the tuner measurement.
#   run: bash benchmarks/profile/run_h200.sh      ($OUT: fixtures.tar.gz, tuner.json, run.log)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../device_env.sh"
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  timeout 80 $PY benchmarks/profile/record_fixtures.py /tmp/kf-fixtures
  tar czf "$OUT/fixtures.tar.gz" -C /tmp kf-fixtures
  KF_BUDGET_S="${KF_BUDGET_S:-125}" timeout 160 $PY benchmarks/profile/bench_tuner.py
  echo "elapsed $(( $(date +%s) - START )) s"
} 2>&1 | tee "$OUT/run.log"
