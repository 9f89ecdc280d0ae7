"""Memory hog: allocates 3 GiB scratch per call. The sandbox's memory limit (the test sets 2 GiB)
stops it with an allocation error instead of letting it take the machine.
kforge-adversarial: spec=add_relu expect=out_of_memory memory_mb=2048
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
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], tl.maximum(x + b[None, :], 0.0),
             mask=mask)


def launch(x, b):
    M, N = x.shape
    scratch = torch.empty((3 * 2**30 // 4,), device=x.device, dtype=torch.float32)
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    add_relu_kernel[(triton.cdiv(M, 4),)](x, b, out, M, N, BLOCK_M=4, BLOCK_N=16)
    return (out,)
