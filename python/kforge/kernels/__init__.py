"""Kernel templates the builtin Triton generator emits (GEMM first: see kforge.kernels.gemm)."""

# fp32 `x` rounded to bf16, to nearest even, and held as fp32: what a GPU's fp32 -> bf16
# conversion gives. The Triton interpreter's conversion truncates (measured, Triton 3.9:
# -1.35029 became -1.34375) and its bf16 arithmetic is wrong, so kernels for it round so before
# a bf16 store (kforge.kernels.attention, .moe) and the builtin's emitter holds bf16 values so.
BF16_RNE_SOURCE = ("@triton.jit\ndef _bf16_rne(x):\n"
                   "    u = x.to(tl.float32).to(tl.int32, bitcast=True)\n"
                   "    return ((u + 0x7FFF + ((u >> 16) & 1)) & -65536).to(tl.float32, "
                   "bitcast=True)\n")

# The power of two by which an fp16 split scales a slice of fp32 values (fp16x3 / fp16x1: a row
# of A, a weight's column, a tile of q, k or v) before rounding it to fp16, from the slice's
# largest magnitude `amax`: _pow2_exp(amax) is e with amax < 2**e (clamped to +-100 so that
# both powers stay normal; 0 for a zero slice), _pow2(15 - e) brings |x| under 2**15 (fp16's
# largest is 65504) and _pow2(e - 15) undoes it exactly. The builtin generator emits the same
# formula as lines (kforge.providers.builtin.gemm.POW2_*).
POW2_SOURCE = """
@triton.jit
def _pow2_exp(amax):
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126      # amax < 2**e (normal amax)
    return tl.where(amax > 0, tl.minimum(tl.maximum(e, -100), 100), 0)


@triton.jit
def _pow2(n):
    return ((127 + n) << 23).to(tl.float32, bitcast=True)       # 2**n, n in [-126, 127]
"""
