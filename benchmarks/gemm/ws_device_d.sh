#!/usr/bin/env bash
# Device call D (2026-12-07) (about 200 s): Llama-3-8B prefill (2 layers, 4 x 1,024 tokens) with
# every GEMM on the warp-specialized Gluon kernel, SwiGLU's paired gate/up included
# (.carry/ab/l2ws2, KFORGE_BUILTIN_WS=1), then the TMA kernel's package (.carry/ab/l2): each
# tuned alone (so its regions' verification times are not shared with the other's), its
# regions' verdicts and kernel times printed, then both timed A B B A while D_LIMIT seconds
# remain. Carry .carry/ab/l2ws2, .carry/ab/l2 and .whl.
set -u
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/../device_env.sh"
carried_wheels; env_txt
export KFORGE_ZOO_SIZE=real KFORGE_LLM_LAYERS=2 KFORGE_LLM_BATCH=4 KFORGE_LLM_SEQ=1024
t0=$(date +%s)
for d in .carry/ab/l2ws2 .carry/ab/l2; do
  timeout "${D_TUNE:-120}" "$PY" -m kforge.bench.packages --tune --out "$d" --precision bf16 \
    --jobs 1 --gpus 1 --timeout "${D_TUNE:-120}" benchmarks/models/llama3_8b.py::prefill \
    > "$OUT/tune-$(basename "$d").log" 2>&1
  echo "$d tune rc=$? at $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/tune-$(basename "$d").log"
  "$PY" - "$d/bf16/llama3_8b.prefill" <<'PYEOF' | tee -a "$OUT/regions.txt"
import json, sys
from pathlib import Path
pkg = Path(sys.argv[1])
for h, e in json.loads((pkg / "manifest.json").read_text())["kernels"].items():
    src = (pkg / e["source"]).read_text() if (pkg / e["source"]).is_file() else ""
    kind = "ws-paired" if "interleaved" in src and "warp_specialize" in src else \
        "ws" if "warp_specialize" in src else "triton"
    v = e.get("verification") or {}
    print(f"{pkg.parts[-3]} {h} {kind:9s} {v.get('status')} {e.get('time_ms')} ms "
          f"{(v.get('reason') or '')[:120]}")
PYEOF
done
left=$(( ${D_LIMIT:-230} - ($(date +%s) - t0) ))
if [ "$left" -gt 30 ]; then
  timeout "$left" "$PY" benchmarks/llm/time_package.py .carry/ab/l2ws2/bf16/llama3_8b.prefill \
    .carry/ab/l2/bf16/llama3_8b.prefill .carry/ab/l2/bf16/llama3_8b.prefill \
    .carry/ab/l2ws2/bf16/llama3_8b.prefill 2>&1 | grep -v Warn | tee "$OUT/ab.txt"
fi
echo "done at $(( $(date +%s) - t0 )) s"
