#!/usr/bin/env bash
# The whole test suite: sets everything up if needed, then runs the lit suite (C++ passes,
# kforge-opt, the plugin in upstream mlir-opt) and pytest (Python half). Exit status is non-zero
# when any test fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
status=0
echo "== lit: test/ =="
lit -sv "$BUILD/test" || status=1
echo "== pytest: test/python =="
python -m pytest -q -n 2 --durations=25 test/python "$@" || status=1
exit $status
