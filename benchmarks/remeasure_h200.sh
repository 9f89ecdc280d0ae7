#!/usr/bin/env bash
# Re-measure one precision policy where its kernels changed, on the device machine (after a
# verifier or generator change that only some workloads feel; a whole-suite run of one policy
# does not fit one device call on a cold machine):
#   1. verify every package of PRECISION on the GPU (`kforge tune`, which repairs a rejected
#      builtin kernel with the builtin's next ones), TUNE_JOBS at a time;
#   2. list the workloads whose kernels are not the ones the packages were built with (a region
#      repaired, or left on its reference), plus those named in ALWAYS;
#   3. time those with benchmarks/run_h200.sh (SKIP_TUNE=1), which also merges and summarizes.
# Merge with the earlier whole-suite run here: kforge bench --merge EARLIER/bench.json
# OUT/bench.json --out DIR (the earlier policies stay, each with its own run's baselines).
# Writes $OUT/tune-summary.json (per workload: region -> status, repaired from which config)
# and $OUT/changed.txt beside run_h200.sh's files.
#
#   PRECISION=bf16 ALWAYS="gemm_layer_norm gemm_group_norm" bash benchmarks/remeasure_h200.sh
#   WORKLOADS="gemm_batch_norm_eval" ...   # verify and consider only these packages
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
PRECISION="${PRECISION:-bf16}"
NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
[ "${NGPU:-0}" -lt 1 ] && { echo "no CUDA device visible"; exit 1; }

# shellcheck disable=SC2086
"$PY" -m kforge.bench.packages --tune --out "$PACKAGES" --precision "$PRECISION" ${WORKLOADS:-} \
  --jobs "${TUNE_JOBS:-$((12 * NGPU))}" --gpus "$NGPU" --rounds 0 --timeout "${TUNE_TIMEOUT:-180}" \
  > "$OUT/tune.log" 2>&1
echo "tune: exit $?, $(($(date +%s) - START)) s"

"$PY" - "$PACKAGES" "$PRECISION" "$OUT" "${WORKLOADS:-}" ${ALWAYS:-} <<'EOF'
import json, sys
from pathlib import Path
root, policy, out, only = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4].split()
always = sys.argv[5:]
summary, changed = {}, set(always)
for pkg in sorted(p for p in (root / policy).iterdir() if (p / "manifest.json").is_file()
                  and (not only or p.name in only)):
    kernels = json.loads((pkg / "manifest.json").read_text()).get("kernels", {})
    regions = {}
    for h, e in kernels.items():
        status = (e.get("verification") or {}).get("status", e.get("status"))
        rep = e.get("repaired_from")
        regions[h] = {"status": status, "config": e.get("config"),
                      "repaired_from": rep and {"config": rep.get("config"), "reason": rep.get("reason"),
                                                "message": (rep.get("message") or "")[:300]}}
        if rep or status != "verified":
            changed.add(pkg.name)
    summary[pkg.name] = regions
(out / "tune-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
(out / "changed.txt").write_text(" ".join(sorted(changed)) + "\n")
print(f"{len(changed)} of {len(summary)} workloads to time: {' '.join(sorted(changed))}")
EOF
CHANGED="$(cat "$OUT/changed.txt")"
[ -z "${CHANGED// /}" ] && { echo "nothing changed: nothing to time"; exit 0; }
LEFT=$(( ${DEADLINE_S:-480} - ($(date +%s) - START) ))
BUDGET=$((LEFT - 60)); [ "$BUDGET" -lt 5 ] && BUDGET=5
WORKLOADS="$CHANGED" SKIP_TUNE=1 PRECISION="$PRECISION" SHARDS="$NGPU" OUT="$OUT" \
  BUDGET_S="$BUDGET" PREP_S=$((LEFT / 3)) bash benchmarks/run_h200.sh
# run.log holds the logs and bench.json the checkpoints: keep what comes back to 8 files
[ -f "$OUT/bench.json" ] && { cat "$OUT/tune.log" >> "$OUT/run.log"; rm -rf "$OUT/logs" "$OUT/partial" "$OUT/tune.log"; }
echo "total $(($(date +%s) - START)) s"
