#!/usr/bin/env bash
# The LLM workloads at shapes no committed result uses, built and cross-compiled here (CPU).
# From the repository root: bash benchmarks/results/2026-12-07f-cpu-llm-odd-shapes/build.sh
# then, for each package, `kforge xcompile PKG` under the device's Triton (3.6).
set -u
source .venv/bin/activate
export KFORGE_ZOO_SIZE=real
for spec in "llama3_8b.py::prefill 3 3 777" "gpt_oss_20b.py::prefill 3 3 777" "llama3_8b.py::decode 3 17 1000" "gpt_oss_20b.py::decode 3 17 1000"; do
  set -- $spec
  if [[ $1 == *decode ]]; then extra="KFORGE_LLM_CONTEXT=$4"; else extra="KFORGE_LLM_SEQ=$4"; fi
  for pol in bf16 strict; do
    o=${SWEEP:-/tmp/sweep}/$(echo $1 | tr ':.' '__')-$pol
    env KFORGE_LLM_LAYERS=$2 KFORGE_LLM_BATCH=$3 $extra KFORGE_BUILTIN_WS=1 PRECISION=$pol OUT=$o JOBS=1 \
      bash benchmarks/build_packages.sh benchmarks/models/$1 > $o.log 2>&1
    echo "$1 $pol rc=$?"
  done
done
