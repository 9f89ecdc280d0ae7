"""Kernel templates the builtin Triton generator emits (GEMM first: see kforge.kernels.gemm)."""
