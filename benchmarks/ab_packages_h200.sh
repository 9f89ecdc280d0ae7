#!/usr/bin/env bash
# A/B of package folders built from the same workloads by two versions of the generator (an
# environment switch, a commit): on the device, verify every package of each folder on the GPU,
# then time each workload's packages in one process, twice, in the order A B ... then ... B A,
# so that drift over the run does not favour one side.
#
#   bash benchmarks/ab_packages_h200.sh DIR_A=POLICY DIR_B=POLICY [-- DIR_C=POLICY DIR_D=POLICY ...]
#
# Each group (separated by --) is one comparison; DIR is a folder of `build_packages.sh`
# (DIR/<policy>/<workload>/), POLICY the policy folder in it. AB_WORKLOADS="a b ...": only
# those workloads, verified and timed (default: every package of each group's first folder; a model's phase, e.g.
# llama3_8b.prefill, is tuned from its file in benchmarks/models). AB_TIME="a b ...": time only those
# of the verified ones (verifying is cheaper than timing). Groups are verified at once (the
# jobs share the GPU only while verifying; nothing is timed then). Writes $OUT/ab.txt (one line a
# package and pass: benchmarks/llm/time_package.py's) and $OUT/ab-tune.log, and leaves each
# folder's tune.json files in place (run_h200.sh's tuned.tar.gz does not cover them: the caller
# packs what it needs).
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
JOBS="${AB_JOBS:-6}"
# one space between names, whatever the caller wrote (the tests below match " name ")
# shellcheck disable=SC2116,SC2086
AB_WORKLOADS="$(echo ${AB_WORKLOADS:-})"; AB_TIME="$(echo ${AB_TIME:-})"

specs=(); groups=(); group=()
for a in "$@"; do
  if [ "$a" = -- ]; then groups+=("${group[*]}"); group=(); continue; fi
  [[ "$a" == *=* ]] || { echo "ab_packages_h200.sh: '$a' is not DIR=POLICY" >&2; exit 2; }
  specs+=("$a"); group+=("$a")
done
[ ${#group[@]} -gt 0 ] && groups+=("${group[*]}")
[ ${#specs[@]} -gt 0 ] || { echo "ab_packages_h200.sh: no DIR=POLICY given" >&2; exit 2; }

# The tune step's selectors for a folder's packages: a suite workload by its name, a model's
# phase (benchmarks/models/llama3_8b.py::prefill, package folder llama3_8b.prefill) by its file,
# which the suite's names do not reach (the whole suite, the default, would tune none of them).
selectors() {   # DIR/POLICY
  local d w stem
  for d in "$1"/*/; do
    w="$(basename "$d")"
    [ -n "${AB_WORKLOADS:-}" ] && [[ " $AB_WORKLOADS " != *" $w "* ]] && continue
    stem="${w%%.*}"
    if [ "$stem" != "$w" ] && [ -f "benchmarks/models/$stem.py" ]; then
      echo "benchmarks/models/$stem.py::${w#*.}"
    else
      echo "$w"
    fi
  done
}

# 1. Verify every folder's packages, all folders at once.
pids=()
for s in "${specs[@]}"; do
  dir="${s%%=*}"; policy="${s#*=}"
  mapfile -t sel < <(selectors "$dir/$policy")
  [ ${#sel[@]} -gt 0 ] || { echo "ab_packages_h200.sh: no package in $dir/$policy" >&2; exit 2; }
  "$PY" -m kforge.bench.packages --tune --out "$dir" --precision "$policy" --jobs "$JOBS" --gpus 1 \
    --timeout "${TUNE_TIMEOUT:-180}" "${sel[@]}" > "$OUT/ab-tune-$(basename "$dir")-$policy.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$OUT"/ab-tune-*.log > "$OUT/ab-tune.log"; rm -f "$OUT"/ab-tune-*.log
echo "verified: $(($(date +%s) - START)) s"

# 2. Time: per group, per workload of its first folder, every folder's package, A B ... B A.
order=()
for g in "${groups[@]}"; do
  read -r -a members <<< "$g"
  first="${members[0]}"
  for w in "${first%%=*}/${first#*=}"/*/; do
    w="$(basename "$w")"; row=()
    [ -n "${AB_WORKLOADS:-}" ] && [[ " $AB_WORKLOADS " != *" $w "* ]] && continue
    [ -n "${AB_TIME:-}" ] && [[ " $AB_TIME " != *" $w "* ]] && continue
    for m in "${members[@]}"; do
      p="${m%%=*}/${m#*=}/$w"; [ -d "$p" ] && row+=("$p")
    done
    order+=("${row[@]}")
    for ((i = ${#row[@]} - 1; i >= 0; i--)); do order+=("${row[$i]}"); done
  done
done
"$PY" benchmarks/llm/time_package.py "${order[@]}" 2>&1 | tee "$OUT/ab.txt"
echo "timed: $(($(date +%s) - START)) s"
