#!/usr/bin/env bash
# One device call: the two kernels that hold Llama-3-8B's bf16 prefill package, in isolation at
# its shapes (2026-12-05d: attention 11 % of the step-by-step time at about 40 TFLOP/s, GEMMs
# 86 %). Writes env.txt, attn.log, attn_bhsd.json, attn_bshd.json, moe.{json,log}, sweep/ and
# (VERIFY_PACKAGES) verify.log, reports.md under $OUT (all but the results packed into
# rest.tgz).
#   attention  benchmarks/attention/bench_attention.py, B4 Hq32/Hkv8 S1024 D128 causal: fp32
#              tensors with bf16 dots and with fp16x1 (k, v prepared), and bf16 tensors, every
#              configuration of attention_configs; then fp16x1 in the [B, S, H, D] memory order
#              of a projection's output
#   moe        benchmarks/moe/bench_moe.py, gpt-oss-20b's layer at 4096 tokens, fp16x3 (strict, and
#              the bf16 package's, whose MoE is strict): every tile of moe_configs and one more
#   gemm       benchmarks/gemm/bench_builtin.py at M = 4096 tokens: Q/O (4096^2), gate/up
#              (14336 x 4096), down (4096 x 14336), LM head (128256 x 4096), K/V (1024 x 4096),
#              the builtin's first TMA tile against the variants in KF_TMA_VARIANTS, and cuBLAS
#
#   OUT=$OUT [STEPS='attention moe gemm'] [VERIFY_PACKAGES=DIR] \
#     bash benchmarks/llm/probe_prefill_h200.sh
#   (on the device, repository root)
set -uo pipefail
source "$(dirname "$0")/../device_env.sh"
carried_wheels
env_txt
STEPS="${STEPS:-attention moe gemm}"
has() { [[ " $STEPS " == *" $1 "* ]]; }
if [ -n "${VERIFY_PACKAGES:-}" ]; then
  # the packages' regions verified on this GPU as `kforge tune` does (no rounds), then each
  # package's report: which candidate each region runs and its time (the tuned folder itself
  # is more files than a call brings back)
  $PY -m kforge.bench.packages --tune --out "$VERIFY_PACKAGES" --jobs 2 --gpus 1 --rounds 0 \
    --timeout 200 --precision "${VERIFY_POLICIES:-bf16}" ${VERIFY_WORKLOADS:-benchmarks/models/llama3_8b.py} \
    > "$OUT/verify.log" 2>&1
  tail -3 "$OUT/verify.log"
  $PY benchmarks/llm/package_kernels.py "$VERIFY_PACKAGES"/*/*/ > "$OUT/reports.md" 2>&1
  cat "$OUT/reports.md"
fi
if has attention; then
timeout "${ATTN_S:-120}" $PY benchmarks/attention/bench_attention.py \
  --cases "${ATTN_CASES:-llama_fp32in_bf16,llama_bf16in_bf16,llama_fp32in_fp16x1}" --out "$OUT/attn_bhsd.json" --budget-s 80 \
  > "$OUT/attn.log" 2>&1
timeout "${ATTN_S:-60}" $PY benchmarks/attention/bench_attention.py --layout bshd \
  --cases llama_fp32in_fp16x1 --out "$OUT/attn_bshd.json" --budget-s 40 >> "$OUT/attn.log" 2>&1
grep -E "^(case|llama)" "$OUT/attn.log"
fi
if has moe; then
timeout "${MOE_S:-120}" $PY benchmarks/moe/bench_moe.py --out "$OUT/moe.json" --tokens 4096 \
  --dtypes fp32 --schemes ieee/fp16x3 \
  --extra-configs '[{"block_m": 128, "block_n": 64, "block_k": 32, "num_warps": 8, "num_stages": 6}]' \
  > "$OUT/moe.log" 2>&1
$PY -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("moe", r["tokens"], "pytorch", round(r["pytorch_ms"], 3), "ms")
    for t in r["schemes"]["ieee/fp16x3"]["tried"]:
        print("  ", t["config"], round(t.get("ms", -1), 3), "ms", round(t.get("tflops", 0)), "TFLOP/s", t.get("failed", ""))
' "$OUT/moe.json"
fi
if has gemm; then
mkdir -p "$OUT/sweep"
DEFAULT_VARIANTS='[{"GROUP_M": 8}, {"BLOCK_M": 256, "BLOCK_N": 128, "EPI_SPLIT": 2},
 {"num_stages": 3}, {"BLOCK_K": 128, "num_stages": 2}, {"GROUP_M": 4}, {"EPI_SPLIT": 2},
 {"GROUP_M": 32}]'
KF_POLICY=bf16 KF_SCHEMES=fp16x1 KF_BUDGET_S="${SWEEP_BUDGET_S:-200}" KF_PASSES=2 \
  OUT="$OUT/sweep" KF_SHAPES="${SWEEP_SHAPES:-4096,4096,4096;4096,14336,4096;4096,4096,14336;4096,128256,4096;4096,1024,4096}" \
  KF_TMA_VARIANTS="${KF_TMA_VARIANTS:-$DEFAULT_VARIANTS}" \
  timeout "${SWEEP_S:-240}" $PY benchmarks/gemm/bench_builtin.py > "$OUT/sweep/log.txt" 2>&1
grep -E "^\|" "$OUT/sweep/log.txt"
grep -E "x[0-9]+x[0-9]+ " "$OUT/sweep/log.txt" | sed -e 's/passes \[[^]]*\]//'
fi
echo "wall $(( $(date +%s) - START )) s"
pack_out reports.md attn_bhsd.json attn_bshd.json moe.json sweep/builtin_gemm.json run.log env.txt
