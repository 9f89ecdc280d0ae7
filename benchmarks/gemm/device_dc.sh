#!/usr/bin/env bash
# Device calls D and C in one command (about 540 s; the machine stays warm only 30 s between
# calls, so two calls risk a second start). Carry .carry/ab/l2ws2, .carry/ab/l2, .whl,
# .carry/strict6 and .carry/strict7 (about 30 MB; build them here with build_dc.sh).
#   D (ws_device_d.sh): Llama-3-8B prefill with every GEMM on the warp-specialized kernel,
#     SwiGLU's paired tile included, tuned and timed A B B A against the TMA kernel's package;
#   C (gluon_device_c.sh): the Gluon fp16x3 default verified on the 32 strict packages not yet
#     run, 8 of them timed against the Triton kernel.
# D's files land in $OUT/d; C's pack_out packs them into rest.tgz. D_TUNE, D_LIMIT, C_LIMIT as
# in the two scripts (defaults here 100, 200 and 330 s).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT/d"
OUT="$OUT/d" D_TUNE="${D_TUNE:-100}" D_LIMIT="${D_LIMIT:-200}" bash "$HERE/ws_device_d.sh" \
  > "$OUT/d.txt" 2>&1
grep -v Warn "$OUT/d.txt" | tail -45
C_LIMIT="${C_LIMIT:-330}" bash "$HERE/gluon_device_c.sh" 2>&1 | tail -50
