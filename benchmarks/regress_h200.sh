#!/usr/bin/env bash
# One device call that checks, on the H200, kernels changed on a machine without a GPU since the
# last GPU run: the GPU tests (fast launch path, CUDA graphs, every attention configuration on the
# GPU, the value-head-dim cases included); the attention kernel's current source against an older
# checkout of python/kforge ($OLD, e.g. `git archive <commit> python/kforge | tar -x -C .carry/old`)
# on the same cases and first configurations; DeepSeek-V3's head dims (192/128) over every
# configuration; the MoE kernel's program orders (bench_moe.py --group-m). Writes env.txt,
# tests.log, attention-{new,old,mla}.json and .log, moe.json and .log under $OUT.
#
#   OUT=$OUT OLD=.carry/old-att bash benchmarks/regress_h200.sh      (carry .carry/old-att)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
OLD="${OLD:-}"
env_txt
timeout "${TESTS_S:-240}" $PY -m pytest -q -p no:cacheprovider test/python/test_fastlaunch.py \
  test/python/test_graphs.py test/python/test_attention_kernel.py -k "gpu or fastlaunch or graph" \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
SAME="${ATT_CASES:-mha_causal_bf16,gqa_causal_bf16,decode_gqa_bf16,mha_causal_fp32,gptoss_swa_sinks_bf16}"
timeout 150 $PY benchmarks/attention/bench_attention.py --quick --cases "$SAME" \
  --out "$OUT/attention-new.json" > "$OUT/attention-new.log" 2>&1
tail -8 "$OUT/attention-new.log"
if [ -n "$OLD" ] && [ -d "$OLD/python/kforge" ]; then
  # the same bench script, run from the old tree so that it imports the old package
  mkdir -p "$OLD/benchmarks/attention"
  cp benchmarks/attention/bench_attention.py "$OLD/benchmarks/attention/"
  timeout 150 $PY "$OLD/benchmarks/attention/bench_attention.py" --quick --cases "$SAME" \
    --out "$OUT/attention-old.json" > "$OUT/attention-old.log" 2>&1
  tail -8 "$OUT/attention-old.log"
fi
timeout "${MLA_S:-120}" $PY benchmarks/attention/bench_attention.py --budget-s "${MLA_BUDGET_S:-90}" \
  --cases mla_causal_bf16,mla_causal_fp32 --out "$OUT/attention-mla.json" \
  > "$OUT/attention-mla.log" 2>&1
tail -4 "$OUT/attention-mla.log"
timeout "${MOE_S:-200}" $PY benchmarks/moe/bench_moe.py --out "$OUT/moe.json" --dtypes fp32 \
  --schemes ieee/fp16x3 --tokens ${MOE_TOKENS:-4096 16384} --max-configs "${MOE_CONFIGS:-2}" \
  --group-m ${MOE_GROUPS:-8 16 1000000} > "$OUT/moe.log" 2>&1
$PY - "$OUT/moe.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    for s, v in r["schemes"].items():
        for t in v["tried"]:
            print(r["tokens"], s, t["config"], round(t.get("ms", -1), 3), t.get("err"), t.get("failed", ""))
PY
echo "wall $(( $(date +%s) - START )) s"
