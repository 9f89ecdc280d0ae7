"""Crash: the kernel reads far outside its input, which kills the process (SIGSEGV).
kforge-adversarial: spec=add_relu expect=crash
"""
import torch
import triton
import triton.language as tl


@triton.jit
def bad_kernel(x_ptr, out_ptr, M, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs + (1 << 44), mask=offs < M * N)
    tl.store(out_ptr + offs, x, mask=offs < M * N)


def launch(x, b):
    M, N = x.shape
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    bad_kernel[(1,)](x, out, M, N, BLOCK=256)
    return (out,)
