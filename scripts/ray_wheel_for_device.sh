#!/usr/bin/env bash
# Ray for the H200 device machine, whose image has no Ray and whose calls carry at most 64 MiB:
# PyPI's ray wheel for CPython 3.12 (79 MB) less its Java jars, RLlib, the LLM library and the
# dashboard's web UI (none of which kforge's Ray executor imports), repacked as a wheel (42 MB),
# and the four wheels its jsonschema needs that the image lacks. Writes .carry/ray/ (git-ignored).
#   bash scripts/ray_wheel_for_device.sh [RAY_VERSION]      (default 2.60.0, as pinned here)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-2.60.0}"
OUT=.carry/ray
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64)
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$TMP" "ray==$VERSION"
mkdir -p "$TMP/x" "$OUT"
(cd "$TMP/x" && unzip -q "$TMP"/ray-*.whl \
  && rm -rf ray/jars ray/rllib ray/llm ray/dashboard/client/build && find . -name '*.map' -delete \
  && python3 - <<'PY'
import csv, glob, os
record = glob.glob("*.dist-info/RECORD")[0]
rows = [r for r in csv.reader(open(record)) if r and os.path.exists(r[0])]
with open(record, "w", newline="") as f:
    csv.writer(f).writerows(rows)
PY
)
rm -f "$OUT"/*.whl
(cd "$TMP/x" && zip -q -r -9 "$OLDPWD/$OUT/$(basename "$TMP"/ray-*.whl)" .)
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$OUT" \
  jsonschema jsonschema-specifications referencing rpds-py
du -sh "$OUT"
