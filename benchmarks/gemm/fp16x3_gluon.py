"""The strict scheme's fp16x3 GEMM in Gluon, with the tensor cores kept busy across the exact
fp32 adds: a candidate for benchmarks/gemm/fp16x3_ab.py (variant `gluon_pp`).

Why: the builtin's Triton loop takes each K step's three products (a_lo·b_hi, a_hi·b_lo,
a_hi·b_hi) into a fresh fp32 `part`, then `acc += part` in exact fp32 (chaining all of K in the
tensor core's accumulator truncates: NOTES.md run 1). Triton keeps only a loop-carried
accumulator's dot in flight, so its TTGIR waits (`pendings = 0`) after every one of the three
products (2026-12-07e's README; 2026-12-06g measured every Triton form of the loop slower or
no faster). The tensor cores drain three times a step.

Here the step's products are issued as wgmma groups by hand (Gluon's `warpgroup_mma`,
`is_async=True`), into one of two alternating parts: step k's three groups chain into its part
without a wait between them, and only then does the kernel wait until step k-1's groups have
retired (`warpgroup_mma_wait(num_outstanding=3)`), add that part to the accumulator in fp32,
and refill step k-1's shared-memory stage by TMA. The tensor cores always have the current
step's products queued while the previous part is added.

Operands are the fp16 planes fp16x3_ab.planes makes: [2, R, K] (hi, then lo) of power-of-two
scaled rows, scales undone after the product, as the builtin's split pass and prepared weights
hold them. The accumulation is the builtin's (a fresh part a 64-deep step, added in fp32): the
error should match `base`, which fp16x3_ab.py measures beside it.

Tiles: 128 x 128 x 64, 8 warps (two warpgroups, 16 rows a warp), 3 stages of the four operand
tiles (192 KiB of shared memory), one output tile a program in grouped order. M and N multiples
of 128 and K of 64 (the harness's shapes). Device-side tensor descriptors: the caller sets
Triton's allocator (launch() does).

Written against Triton 3.6's Gluon (the device image's). Cross-compiled for sm_90 here; not yet
run on a GPU.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_init,
                                                                warpgroup_mma_wait)

# Triton 3.6 (the device image's) names the TMA load async_copy_global_to_shared; later
# versions (3.9 here) async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _load_step(ah_d, al_d, bh_d, bl_d, ah_s, al_s, bh_s, bl_s, ready, step, slot, off_m, off_n,
               M, N, BLOCK_K: gl.constexpr, STEP_BYTES: gl.constexpr):
    """The four operand tiles of K step `step` into shared-memory stage `slot`, by TMA, all
    counted on that stage's barrier (STEP_BYTES: the four tiles' bytes)."""
    bar = ready.index(slot)
    mbarrier.expect(bar, STEP_BYTES)
    k0 = step * BLOCK_K
    _tma_load(ah_d, [off_m, k0], bar, ah_s.index(slot))
    _tma_load(al_d, [M + off_m, k0], bar, al_s.index(slot))
    _tma_load(bh_d, [off_n, k0], bar, bh_s.index(slot))
    _tma_load(bl_d, [N + off_n, k0], bar, bl_s.index(slot))


@gluon.jit
def fp16x3_pingpong(A2, B2, SA, SB, C, M, N, K,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    # the program's output tile, grouped (GROUP_M row tiles share their B tiles in L2)
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    # A2: [2M, K] (hi rows, then lo rows); B2: [2N, K] likewise, K-major
    ah_d = tma.make_tensor_descriptor(A2, [2 * M, K], [K, 1], [BLOCK_M, BLOCK_K], smem)
    al_d = ah_d
    bh_d = tma.make_tensor_descriptor(B2, [2 * N, K], [K, 1], [BLOCK_N, BLOCK_K], smem)
    bl_d = bh_d
    ah_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], smem)
    al_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], smem)
    bh_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], smem)
    bl_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    STEP_BYTES: gl.constexpr = 2 * (BLOCK_M + BLOCK_N) * BLOCK_K * 2   # hi and lo, fp16

    # 16 rows a warp, the whole tile's columns: one m64nNk16 wgmma per warpgroup and K slice
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    # two parts with fixed registers, the loop unrolled by two: steps 2j into part_a and
    # 2j + 1 into part_b. A part is written only by its step's wgmma groups (use_acc=False
    # zeroes it) and read only by the fp32 add after its wait, so no register of an in-flight
    # group is read or copied (a loop-carried swap of one part into another made ptxas
    # serialize every wgmma of the function: C7514)
    # (carried: part_a as a retired tensor, part_b as an in-flight accumulator)
    part_a = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    part_b = warpgroup_mma_init(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma))
    steps = K // BLOCK_K
    for i in gl.static_range(STAGES - 1):                   # the pipeline's first stages
        if i < steps:
            _load_step(ah_d, al_d, bh_d, bl_d, ah_s, al_s, bh_s, bl_s, ready, i, i, off_m,
                       off_n, M, N, BLOCK_K, STEP_BYTES)
    # (the two halves below are the same step written twice on purpose: a @gluon.jit helper
    # returning the parts moved the in-flight accumulators' registers, and ptxas serialized
    # every wgmma again, C7514; test_gemm_gluon.py checks for that warning)
    for j in range(steps // 2):
        k = 2 * j
        # step k into part_a: three groups chained in the tensor cores, no wait between
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        part_a = warpgroup_mma(al_s.index(slot), bh_s.index(slot).permute((1, 0)), part_a,
                               use_acc=False, is_async=True)
        part_a = warpgroup_mma(ah_s.index(slot), bl_s.index(slot).permute((1, 0)), part_a,
                               is_async=True)
        part_a = warpgroup_mma(ah_s.index(slot), bh_s.index(slot).permute((1, 0)), part_a,
                               is_async=True)
        # step k-1's groups (part_b) have retired once only step k's three are outstanding
        part_b = warpgroup_mma_wait(num_outstanding=3, deps=(part_b,))
        acc += part_b                                       # exact fp32, as the builtin's
        if k + STAGES - 1 < steps:                          # step k-1's stage is free
            _load_step(ah_d, al_d, bh_d, bl_d, ah_s, al_s, bh_s, bl_s, ready, k + STAGES - 1,
                       (k + STAGES - 1) % STAGES, off_m, off_n, M, N, BLOCK_K, STEP_BYTES)
        # step k + 1 into part_b; then part_a's groups retire and are added
        k = k + 1
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        part_b = warpgroup_mma(al_s.index(slot), bh_s.index(slot).permute((1, 0)), part_b,
                               use_acc=False, is_async=True)
        part_b = warpgroup_mma(ah_s.index(slot), bl_s.index(slot).permute((1, 0)), part_b,
                               is_async=True)
        part_b = warpgroup_mma(ah_s.index(slot), bh_s.index(slot).permute((1, 0)), part_b,
                               is_async=True)
        part_a = warpgroup_mma_wait(num_outstanding=3, deps=(part_a,))
        acc += part_a
        if k + STAGES - 1 < steps:
            _load_step(ah_d, al_d, bh_d, bl_d, ah_s, al_s, bh_s, bl_s, ready, k + STAGES - 1,
                       (k + STAGES - 1) % STAGES, off_m, off_n, M, N, BLOCK_K, STEP_BYTES)
    if steps % 2 == 1:                                      # the last, odd step
        k = steps - 1
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        last = warpgroup_mma(al_s.index(slot), bh_s.index(slot).permute((1, 0)), part_a,
                             use_acc=False, is_async=True)
        last = warpgroup_mma(ah_s.index(slot), bl_s.index(slot).permute((1, 0)), last,
                             is_async=True)
        last = warpgroup_mma(ah_s.index(slot), bh_s.index(slot).permute((1, 0)), last,
                             is_async=True)
        acc += warpgroup_mma_wait(num_outstanding=3, deps=(part_b,))
        acc += warpgroup_mma_wait(num_outstanding=0, deps=(last,))
    else:
        acc += warpgroup_mma_wait(num_outstanding=0, deps=(part_b,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    # undo the power-of-two scales (exact) and store the fp32 tile
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    acc = acc * gl.load(SA + rows)[:, None] * gl.load(SB + cols)[None, :]
    gl.store(C + rows[:, None] * N + cols[None, :], acc)


CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, STAGES=3, num_warps=8)


def launch(a2, b2, sa, sb, c, **cfg):
    """c = (a2[0] scaled) @ (b2[0] scaled).T through the three products, a2 / b2 the [2, R, K]
    planes (fp16x3_ab.planes). On the GPU."""
    import torch
    import triton
    cfg = dict(CONFIG, **cfg)
    _, M, K = a2.shape
    N = b2.shape[1]
    if M % cfg["BLOCK_M"] or N % cfg["BLOCK_N"] or K % cfg["BLOCK_K"]:
        raise ValueError(f"fp16x3_pingpong takes M, N multiples of {cfg['BLOCK_M']} and "
                         f"{cfg['BLOCK_N']}, K of {cfg['BLOCK_K']}: {M}, {N}, {K}")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=a2.device))
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    num_warps = cfg.pop("num_warps")
    fp16x3_pingpong[grid](a2, b2, sa, sb, c, M, N, K, num_warps=num_warps, **cfg)
    return c


def cross_compile(arch: int = 90) -> dict:
    """Compile the kernel for sm_`arch` without a GPU (Triton's own compiler, as kforge
    xcompile does for generated kernels): {'ptx': ..., 'ttgir': ..., 'shared': bytes}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource
    cfg = dict(CONFIG)
    num_warps = cfg.pop("num_warps")
    sig = {"A2": "*fp16", "B2": "*fp16", "SA": "*fp32", "SB": "*fp32", "C": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", **{k: "constexpr" for k in cfg},
           "num_warps": "constexpr"}
    src = GluonASTSource(fp16x3_pingpong, sig, constexprs=dict(cfg, num_warps=num_warps))
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps})
    return {"ptx": kernel.asm.get("ptx", ""), "ttgir": kernel.asm.get("ttgir", ""),
            "shared": int(getattr(kernel.metadata, "shared", 0) or 0)}


if __name__ == "__main__":
    import re
    out = cross_compile()
    ptx = out["ptx"]
    print("shared bytes", out["shared"], "| wgmma", ptx.count("wgmma.mma_async"),
          "| wait_group", re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx),
          "| cp.async.bulk.tensor", ptx.count("cp.async.bulk.tensor"))
