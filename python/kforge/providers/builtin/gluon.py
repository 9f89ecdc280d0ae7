"""The strict scheme's fp16x3 product in Gluon (config key GLUON; first on sm_90 GPUs unless
KFORGE_BUILTIN_GLUON=0: schemes._gluon_configs). H100, 2026-12-07: eight strict packages ran
1.06-1.09x faster with it than with the Triton kernel, all verified.

Triton keeps only a loop-carried accumulator's dot in flight, so the builtin's fp16x3 loop (a
K step's three products into a fresh `part`, then `acc += part` in exact fp32) waits for the
tensor cores after every product (`pendings = 0` in its TTGIR; 2026-12-07e's README). Here
the kernel issues the wgmma groups itself: step k's three products go out with no wait between
them into one of two parts that alternate in fixed registers, and only step k-1's part is
waited for (3 groups outstanding) and added. The accumulation is the builtin's. The two
halves of the unrolled loop are written out: a helper returning the parts moved in-flight
accumulators' registers, and ptxas then serialized every wgmma (its warning C7514).

The kernel computes the scaled fp32 product of a 2-D stage, A from the split pass's [2, M, K]
planes and row scales, B from prepare_weights' flat [hi, lo, column exponents] buffer of a
[N, K] weight. Where every output of the stage is an image of the product's tile, the region's
epilogue runs on the tile (_fused: the emitter's lines in Gluon's names, in column slices);
else (a row reduction) it stores the product into its own [M, N] buffer, and the rows kernel
reads it from there. Tiles 128 x 128 x 64, 8 warps, 3 stages of the four operand tiles (192
KiB of shared memory), one output tile a program in grouped order. TMA clips at the planes'
2M and 2N rows and K (a hi tile past M reads lo rows into output rows past M, which are not
stored). benchmarks/gemm/fp16x3_gluon.py times the same kernel alone (fp16x3_ab.py,
variant gluon_pp).
"""
from __future__ import annotations

# the generated module's imports when it holds a Gluon kernel
HEADER = """\
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_init,
                                                                warpgroup_mma_wait)
"""
# the kernel's LOAD argument, evaluated in launch(): the helper that loads a K step's tiles.
# Triton 3.6 (the H200 image's) names the TMA load async_copy_global_to_shared, later versions
# (3.9 here) async_load, and Triton's JIT resolves every attribute a kernel names, taken branch
# or not: each name lives in its own helper, and the kernel calls the one it is given (a
# module-level alias would be a value computed at import, which kforge.verify.static rejects)
LOAD = "{name}_load_new if hasattr(tma, 'async_load') else {name}_load_old"

CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, STAGES=3, num_warps=8)

_KERNEL = '''\
@gluon.jit
def {name}_load_old(ah_s, al_s, bh_s, bl_s, a_d, b_d, ready, step, slot, off_m, off_n, M, N,
        BLOCK_K: gl.constexpr, STEP_BYTES: gl.constexpr):
    # the four operand tiles of K step `step` into stage `slot`, by TMA, on its barrier
    bar = ready.index(slot)
    mbarrier.expect(bar, STEP_BYTES)
    k0 = step * BLOCK_K
    tma.async_copy_global_to_shared(a_d, [off_m, k0], bar, ah_s.index(slot))
    tma.async_copy_global_to_shared(a_d, [M + off_m, k0], bar, al_s.index(slot))
    tma.async_copy_global_to_shared(b_d, [off_n, k0], bar, bh_s.index(slot))
    tma.async_copy_global_to_shared(b_d, [N + off_n, k0], bar, bl_s.index(slot))


@gluon.jit
def {name}_load_new(ah_s, al_s, bh_s, bl_s, a_d, b_d, ready, step, slot, off_m, off_n, M, N,
        BLOCK_K: gl.constexpr, STEP_BYTES: gl.constexpr):
    # the same, with the TMA load's later name
    bar = ready.index(slot)
    mbarrier.expect(bar, STEP_BYTES)
    k0 = step * BLOCK_K
    tma.async_load(a_d, [off_m, k0], bar, ah_s.index(slot))
    tma.async_load(a_d, [M + off_m, k0], bar, al_s.index(slot))
    tma.async_load(b_d, [off_n, k0], bar, bh_s.index(slot))
    tma.async_load(b_d, [N + off_n, k0], bar, bl_s.index(slot))


@gluon.jit
def {name}(A2, B2, SA, SB, C, M, N, K, LOAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
        GROUP_M: gl.constexpr, STAGES: gl.constexpr, EXPONENTS: gl.constexpr,
        num_warps: gl.constexpr{consts}):
    """fp16x3 product tile: {comment}"""
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
    a_d = tma.make_tensor_descriptor(A2, [2 * M, K], [K, 1], [BLOCK_M, BLOCK_K], smem)
    b_d = tma.make_tensor_descriptor(B2, [2 * N, K], [K, 1], [BLOCK_N, BLOCK_K], smem)
    ah_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], smem)
    al_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], smem)
    bh_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], smem)
    bl_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    STEP_BYTES: gl.constexpr = 2 * (BLOCK_M + BLOCK_N) * BLOCK_K * 2

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    # the two parts (carried: part_a retired, part_b in flight)
    part_a = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    part_b = warpgroup_mma_init(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma))
    steps = (K + BLOCK_K - 1) // BLOCK_K
    for i in gl.static_range(STAGES - 1):
        if i < steps:
            LOAD(ah_s, al_s, bh_s, bl_s, a_d, b_d, ready, i, i, off_m, off_n, M, N,
                    BLOCK_K, STEP_BYTES)
    for j in range(steps // 2):
        # step 2j into part_a while part_b (step 2j - 1) retires and is added
        k = 2 * j
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        part_a = warpgroup_mma(al_s.index(slot), bh_s.index(slot).permute((1, 0)), part_a,
                               use_acc=False, is_async=True)
        part_a = warpgroup_mma(ah_s.index(slot), bl_s.index(slot).permute((1, 0)), part_a,
                               is_async=True)
        part_a = warpgroup_mma(ah_s.index(slot), bh_s.index(slot).permute((1, 0)), part_a,
                               is_async=True)
        part_b = warpgroup_mma_wait(num_outstanding=3, deps=(part_b,))
        acc += part_b
        if k + STAGES - 1 < steps:
            LOAD(ah_s, al_s, bh_s, bl_s, a_d, b_d, ready, k + STAGES - 1,
                    (k + STAGES - 1) % STAGES, off_m, off_n, M, N, BLOCK_K, STEP_BYTES)
        # step 2j + 1 into part_b while part_a retires and is added
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
            LOAD(ah_s, al_s, bh_s, bl_s, a_d, b_d, ready, k + STAGES - 1,
                    (k + STAGES - 1) % STAGES, off_m, off_n, M, N, BLOCK_K, STEP_BYTES)
    if steps % 2 == 1:
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

    # undo the power-of-two scales (exact): A's row scales; B's column scales, or (EXPONENTS)
    # prepare_weights' column exponents stored after the weight's two planes
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    s_a = gl.load(SA + rows, mask=rows < M, other=1.0)
    if EXPONENTS:
        e_b = gl.load(SB + 2 * N * K + cols, mask=cols < N, other=0.0).to(gl.int32)
        s_b = ((e_b + 127) << 23).to(gl.float32, bitcast=True)
    else:
        s_b = gl.load(SB + cols, mask=cols < N, other=1.0)
    acc = acc * s_a[:, None] * s_b[None, :]
{epilogue}
'''

# the kernel's own end: the scaled product stored into C
_STORE = """\
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    gl.store(C + rows[:, None] * N + cols[None, :], acc, mask=mask)"""


def kernel_source(name: str, comment: str = "", params: list[str] | None = None,
                  epilogue: list[str] | None = None, consts: tuple[str, ...] = ()) -> str:
    """The Gluon kernel `name` (and its `name`_load helpers), as module source: by default
    with the pointer parameters A2, B2, SA, SB, C and the scaled product stored into C.
    `params` and `epilogue` (build_gluon_gemm's fused form): the pointer parameters, A's
    planes, the weight's buffer and A's row scales first, and the lines that follow the
    scales' undoing (indented 4 spaces) in place of the store; `consts`, the constexprs they
    need besides the kernel's own (EPI_N)."""
    src = _KERNEL.replace("{epilogue}", _STORE if epilogue is None else "\n".join(epilogue))
    src = src.replace("{consts}", "".join(f", {c}: gl.constexpr" for c in consts))
    if params is not None:
        a2, b2, sa = params[:3]
        src = src.replace("def {name}(A2, B2, SA, SB, C, M, N, K,",
                          "def {name}(" + ", ".join(params) + ", M, N, K,")
        for old, new in (("(A2,", f"({a2},"), ("(B2,", f"({b2},"), ("gl.load(SA +",
                         f"gl.load({sa} +"), ("gl.load(SB +", f"gl.load({b2} +")):
            src = src.replace(old, new)
    return src.replace("{name}", name).replace("{comment}", comment or name)


def build_gluon_gemm(b, stage, config: dict, name: str, outputs: list[str] | None = None
                     ) -> None:
    """The stage's scaled fp32 product into its own buffer (the caller makes it a temporary),
    by the Gluon kernel: A's planes and row scales from the split pass (`<vc>_a16`,
    `<vc>_as`), the weight's planes and column exponents from prepare_weights. 2-D, one
    product, the weight [N, K] read as it lies (schemes.tma_eligible), on a GPU. `outputs`:
    the region's epilogue fused instead, storing those (_fused)."""
    from kforge.providers.builtin.analysis import weight_source
    from kforge.providers.builtin.builder import Kernel
    from kforge.providers.builtin.emitter import CannotGenerate
    spec, con = b.spec, stage.contraction
    op = con.op
    vc = op.results[0]
    weight = weight_source(spec, op.operands[con.b])
    if weight is None or con.batch or stage.partner is not None or b.target.interpreter:
        raise CannotGenerate(f"{op.name}: the Gluon fp16x3 kernel takes a 2-D product of a "
                             "weight, one product, on a GPU")
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    if K % 8 or tuple(spec.tensor(vc).shape) != (M, N):
        raise CannotGenerate(f"{op.name}: the Gluon kernel's product is [M, N] with K % 8 == 0")
    if 2 * N * K + N >= 2 ** 31 or M * N >= 2 ** 31:
        raise CannotGenerate(f"{op.name}: the Gluon kernel's offsets are int32 (the weight's "
                             "column exponents sit after its two planes)")
    b.fp16_weights[weight] = ((0,), 2)          # [hi plane, lo plane, column exponents]
    BM, BN = config["BLOCK_M"], config["BLOCK_N"]
    constexprs = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    constexprs.update(STAGES=config.get("STAGES", CONFIG["STAGES"]), EXPONENTS=True)
    tiles = -(-M // BM) * -(-N // BN)
    b.gluon = b.tma = True                      # its descriptors are made in the kernel
    if outputs is not None:
        _fused(b, con, outputs, config, name, weight, constexprs, f"({tiles},)")
        return
    b.kernels.append(Kernel(
        name, ["A2", "B2", "SA", "SB", "C"],
        [f"{vc}_a16", weight, f"{vc}_as", weight, vc, str(M), str(N), str(K),
         LOAD.replace("{name}", name)],
        constexprs, [], f"({tiles},)", config["num_warps"], None,
        outputs=[vc], raw=kernel_source(name, f"{op.name} {M} x {N} x {K}, fp16x3, in Gluon")))


def _fused(b, con, outputs: list[str], config: dict, name: str, weight: str, constexprs: dict,
           grid: str) -> None:
    """The kernel with the region's epilogue on its tile in place of the product's store: the
    emitter's lines (gemm._emit_epilogue) in Gluon's names (gluon_ws.to_gluon), on the scaled
    accumulator in EPI_SPLIT column slices, each moved to a blocked layout of the kernel's
    warps through shared memory first (gluon_ws's consumers do the same)."""
    from kforge.providers.builtin.builder import ops_comment
    from kforge.providers.builtin.emitter import CannotGenerate, KVar, Scope
    from kforge.providers.builtin.gluon_ws import sliced_epilogue, to_gluon
    spec, op = b.spec, con.op
    vc = op.results[0]
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    BM, BN = config["BLOCK_M"], config["BLOCK_N"]
    slices = config.get("EPI_SPLIT", 2)
    if BN % (slices * 16) or slices not in (1, 2, 4):
        raise CannotGenerate("the Gluon kernel's epilogue: 1, 2 or 4 slices of >= 16 columns")
    kvars = {"rm": KVar("rm", f"rm < {M}" if M % BM else None, ("BLOCK_M", "1")),
             "rn": KVar("rn", f"rn < {N}" if N % BN else None, ("1", "EPI_N"))}
    em = b.emitter(kvars)
    a16, scales = f"{vc}_a16", f"{vc}_as"
    em.loads.setdefault(a16, set()).add("dot")
    em.loads.setdefault(weight, set()).add("dot")
    em.loads.setdefault(scales, set()).add("other")
    tile = Scope(None, binds={"rm"}, depth=1)
    em.root = tile
    warps = config["num_warps"]
    tile.emit(f"blk: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [{warps}, 1], [1, 0])")
    tile.emit("rm = off_m + gl.arange(0, BLOCK_M)[:, None]")
    sliced_epilogue(b, em, tile, con, outputs, slices, "BLOCK_M", "off_n")
    constexprs = dict(constexprs, EPI_N=BN // slices)
    comment = (f"{op.name} {M} x {N} x {K}, fp16x3, in Gluon; epilogue: "
               f"{ops_comment(spec, em)}")
    k = b.finish(em, name, outputs, constexprs, [], grid, config["num_warps"], None, comment)
    # A's planes, the weight's buffer, A's row scales first (kernel_source's fused signature)
    first = [em.pointers[a16], em.pointers[weight], em.pointers[scales]]
    order = first + [p for p in k.params if p not in first]
    tensors = dict(zip(k.params, k.tensors))
    k.params, k.tensors = order, [tensors[p] for p in order]
    k.raw = kernel_source(name, comment, k.params, to_gluon(tile.lines), ("EPI_N",))
    k.tensors += [str(M), str(N), str(K), LOAD.replace("{name}", name)]
