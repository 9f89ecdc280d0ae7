"""Compile error: the kernel uses an undefined name; reported as a compile error, not a crash.
kforge-adversarial: spec=add_relu expect=compile_error
"""
import torch
import triton
import triton.language as tl


@triton.jit
def add_relu_kernel(x_ptr, b_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)
    b = tl.load(b_ptr + cols, mask=cols < N)
    y = tl.maximum(x + b[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=mask)


@triton.jit
def broken_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * undefined_scale, mask=offs < N)


def launch(x, b):
    M, N = x.shape
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    broken_kernel[(1,)](x, out, M * N, BLOCK=256)
    return (out,)
