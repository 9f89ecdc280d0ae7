"""Kernel templates the builtin Triton generator emits (GEMM first: see kforge.kernels.gemm)."""

# fp32 `x` rounded to bf16, to nearest even, and held as fp32: what a GPU's fp32 -> bf16
# conversion gives. The Triton interpreter's conversion truncates (measured, Triton 3.9:
# -1.35029 became -1.34375) and its bf16 arithmetic is wrong, so kernels for it round so before
# a bf16 store (kforge.kernels.attention, .moe) and the builtin's emitter holds bf16 values so.
BF16_RNE_SOURCE = ("@triton.jit\ndef _bf16_rne(x):\n"
                   "    u = x.to(tl.float32).to(tl.int32, bitcast=True)\n"
                   "    return ((u + 0x7FFF + ((u >> 16) & 1)) & -65536).to(tl.float32, "
                   "bitcast=True)\n")
