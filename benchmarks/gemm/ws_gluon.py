"""A warp-specialized, persistent, TMA-fed Hopper GEMM in Gluon (issue 13 item 2): C = A @ B.T
for a bf16 activation A [M, K] and a weight B [N, K] as nn.Linear holds it, fp32 accumulation,
C in bf16 or fp32. A candidate against cuBLAS and the builtin's persistent TMA kernel; not yet
run on a GPU.

Why: Triton's own warp specialization (`tl.range(..., warp_specialize=True)`) compiles on
Hopper to the kernel without it (2026-12-06g's README: no `setmaxnreg`), and the builtin's
persistent TMA kernel runs 0.80-0.89x cuBLAS on four shapes (2026-12-05f). cuBLAS's Hopper
kernels split the warps by role; this kernel does the same with Gluon's `warp_specialize`:

* a **loader** partition (one warp, 40 registers) walks this program's tiles and K steps and
  fills a ring of STAGES shared-memory stages by TMA: it waits until a stage is released
  (`empty`, two arrivals), announces its bytes on `ready` and issues the A and B tile loads;
* two **consumer** partitions (one warpgroup each, 232 registers: the default partition and a
  worker) share each 128 x 256 output tile, 64 rows each (cuBLAS's "cooperative" form). A
  consumer waits for a stage (`ready`), issues its wgmma asynchronously, waits until only that
  one is outstanding (so the stage before is no longer read) and releases the stage before
  (`empty`). After the tile's last step it drains, casts and stores its 64 rows, while the
  loader already fills the ring for the next tile.

Both consumers and the loader derive the same tile sequence (grouped order, GROUP_M row tiles
a group; program p takes tiles p, p + P, ...) and the same global step count, so the ring's
slot and phase are arithmetic: step g uses slot g % STAGES with phase (g // STAGES) & 1.
An mbarrier's arrive is issued by the partition's first thread; each consumer arrives once a
stage, after its own wait, as CUTLASS's consumers release a stage once a warpgroup.

Shared memory: STAGES x (128 + 256) x 64 x 2 bytes (3 stages: 144 KiB) plus the epilogue's
layout change. TMA zero-fills past M, N and K; the store is masked. K % 8 == 0 (TMA's 16-byte
row pitch). Device-side descriptors: the caller sets Triton's allocator (launch() does).
Written for Triton 3.6's Gluon (the device image's); the TMA load's name differs in later
Tritons (3.9 here), so each name has its own helper and launch() passes the one that exists.
"""
from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_init,
                                                                warpgroup_mma_wait)

CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, STAGES=3, COALESCE=True)
NUM_WARPS = 4            # the default partition: consumer 0
MAXNREG = 168            # 12 warps' worth of the register file (9 warps, rounded by warpgroup)
REGS = (232, 40)         # consumer 1, loader (setmaxnreg)


@gluon.jit
def _tile(t, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # output tile t in grouped order: GROUP_M row tiles a group, the group's columns in turn
    group = GROUP_M * num_pid_n
    first_m = (t // group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (t % group) % group_m
    pid_n = (t % group) // group_m
    return pid_m, pid_n


@gluon.jit
def _load_old(a_d, b_d, bar, a_s, b_s, off_m, off_n, k0):
    # Triton 3.6's name for the TMA load
    tma.async_copy_global_to_shared(a_d, [off_m, k0], bar, a_s)
    tma.async_copy_global_to_shared(b_d, [off_n, k0], bar, b_s)


@gluon.jit
def _load_new(a_d, b_d, bar, a_s, b_s, off_m, off_n, k0):
    # the later name
    tma.async_load(a_d, [off_m, k0], bar, a_s)
    tma.async_load(b_d, [off_n, k0], bar, b_s)


@gluon.jit
def _loader(a_d, b_d, C, a_bufs, b_bufs, ready, empty, M, N, K, ROLE: gl.constexpr,
            LOAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
            COALESCE: gl.constexpr):
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    steps = gl.cdiv(K, BLOCK_K)
    STEP_BYTES: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K * 2
    g = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
        for k in range(steps):
            slot = g % STAGES
            # a fresh mbarrier counts as its phase 1 done: the first round waits for nothing
            mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, STEP_BYTES)
            LOAD(a_d, b_d, bar, a_bufs.index(slot), b_bufs.index(slot), pid_m * BLOCK_M,
                 pid_n * BLOCK_N, k * BLOCK_K)
            g += 1


@gluon.jit
def _consumer(a_d, b_d, C, a_bufs, b_bufs, ready, empty, M, N, K, ROLE: gl.constexpr,
              LOAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
              COALESCE: gl.constexpr):
    # consumer ROLE (0 or 1): rows [ROLE * HALF, ROLE * HALF + HALF) of every tile
    HALF: gl.constexpr = BLOCK_M // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    out: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    steps = gl.cdiv(K, BLOCK_K)
    g = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros([HALF, BLOCK_N], gl.float32, mma)
        prev = 0
        for k in range(steps):
            slot = g % STAGES
            mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(slot).slice(ROLE * HALF, HALF),
                                b_bufs.index(slot).permute((1, 0)), acc, use_acc=k > 0,
                                is_async=True)
            # the step before has retired: its stage is free (this consumer's half of it)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index(prev), pred=k > 0)
            prev = slot
            g += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(prev))
        # the epilogue, while the loader fills the ring for the next tile: COALESCE moves the
        # tile through shared memory into rows of 16-byte stores, else each thread stores its
        # wgmma fragments where they lie
        if COALESCE:
            c = gl.convert_layout(acc.to(C.dtype.element_ty), out)
            rows = pid_m * BLOCK_M + ROLE * HALF + gl.arange(0, HALF,
                                                             layout=gl.SliceLayout(1, out))
            cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out))
        else:
            c = acc.to(C.dtype.element_ty)
            rows = pid_m * BLOCK_M + ROLE * HALF + gl.arange(0, HALF,
                                                             layout=gl.SliceLayout(1, mma))
            cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        gl.store(C + rows[:, None].to(gl.int64) * N + cols[None, :], c, mask=mask)


@gluon.jit
def gemm_ws(A, B, C, M, N, K, LOAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
            COALESCE: gl.constexpr, REG_CONSUMER: gl.constexpr, REG_LOADER: gl.constexpr):
    """C[M, N] = A[M, K] @ B[N, K].T, bf16 operands, fp32 accumulation; persistent."""
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    a_d = tma.make_tensor_descriptor(A, [M, K], [K, 1], [BLOCK_M, BLOCK_K], smem)
    b_d = tma.make_tensor_descriptor(B, [N, K], [K, 1], [BLOCK_N, BLOCK_K], smem)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], smem)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)        # the loader's expect + the TMA bytes
        mbarrier.init(empty.index(i), count=2)        # one arrival from each consumer
    gl.warp_specialize([
        (_consumer, (a_d, b_d, C, a_bufs, b_bufs, ready, empty, M, N, K, 0, LOAD, BLOCK_M,
                     BLOCK_N, BLOCK_K, GROUP_M, STAGES, COALESCE)),
        (_consumer, (a_d, b_d, C, a_bufs, b_bufs, ready, empty, M, N, K, 1, LOAD, BLOCK_M,
                     BLOCK_N, BLOCK_K, GROUP_M, STAGES, COALESCE)),
        (_loader, (a_d, b_d, C, a_bufs, b_bufs, ready, empty, M, N, K, 1, LOAD, BLOCK_M,
                   BLOCK_N, BLOCK_K, GROUP_M, STAGES, COALESCE)),
    ], [4, 1], [REG_CONSUMER, REG_LOADER])


def load_helper():
    """The kernel's LOAD argument for this Triton."""
    return _load_new if hasattr(tma, "async_load") else _load_old


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch(a, b, c=None, **cfg):
    """c = a @ b.T on the GPU: a [M, K] and b [N, K] bf16, contiguous; c bf16 (default) or
    fp32, [M, N]."""
    import torch
    import triton
    cfg = dict(CONFIG, **cfg)
    M, K = a.shape
    N = b.shape[0]
    if c is None:
        c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=a.device))
    tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    sms = _sm_count(a.device.index or 0)
    gemm_ws[(min(tiles, sms),)](a, b, c, M, N, K, load_helper(), REG_CONSUMER=REGS[0],
                                REG_LOADER=REGS[1], num_warps=NUM_WARPS, maxnreg=MAXNREG,
                                **cfg)
    return c


def cross_compile(arch: int = 90, out_dtype: str = "bf16", **cfg) -> dict:
    """Compile for sm_`arch` without a GPU: {'ptx', 'ttgir', 'shared' (bytes)}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource
    consts = dict(CONFIG, **cfg)
    consts.update(LOAD=load_helper(), REG_CONSUMER=REGS[0], REG_LOADER=REGS[1])
    sig = {"A": "*bf16", "B": "*bf16", "C": f"*{out_dtype}", "M": "i32", "N": "i32",
           "K": "i32", "LOAD": "constexpr", **{k: "constexpr" for k in consts if k != "LOAD"}}
    order = ["A", "B", "C", "M", "N", "K", "LOAD", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M",
             "STAGES", "COALESCE", "REG_CONSUMER", "REG_LOADER"]
    src = GluonASTSource(gemm_ws, {k: sig[k] for k in order}, constexprs=consts)
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": NUM_WARPS, "maxnreg": MAXNREG})
    return {"ptx": kernel.asm.get("ptx", ""), "ttgir": kernel.asm.get("ttgir", ""),
            "shared": int(getattr(kernel.metadata, "shared", 0) or 0)}


if __name__ == "__main__":
    import re
    o = cross_compile(90)
    p = o["ptx"]
    print("shared", o["shared"], "| wgmma", p.count("wgmma.mma_async"), "| waits",
          re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", p), "| setmaxnreg",
          re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", p), "| tma loads",
          p.count("cp.async.bulk.tensor"))
