"""A warp-specialized persistent bf16 GEMM in Gluon, with the region's epilogue fused (opt-in:
KFORGE_BUILTIN_WS=1, config key WS; schemes._ws_configs). Verified and timed on an H100
(2026-12-07): schemes._ws_configs has the figures.

Triton's own `warp_specialize=True` gives no warp specialization on Hopper (2026-12-06g: no
`setmaxnreg` in its PTX), and the builtin's persistent TMA kernel runs 0.80-0.89x cuBLAS on
four shapes (2026-12-05f). This kernel splits the warps by role, as cuBLAS's Hopper kernels do:

* a loader partition (one warp, REGS[1] registers) walks the program's tiles and K steps and
  fills a ring of STAGES shared-memory stages by TMA: it waits until both consumers have
  released a stage (`empty`, two arrivals), announces the stage's bytes on `ready` and issues
  the A and B tile loads;
* two consumer partitions (one warpgroup each, REGS[0] registers: the default partition and a
  worker) share each BLOCK_M x BLOCK_N tile, BLOCK_M / 2 rows each. A consumer waits for a
  stage, issues its wgmma asynchronously, waits until only that one is outstanding (so the
  stage before is no longer read) and releases the stage before. After the tile's last step it
  drains, and runs the region's epilogue on its rows in EPI_SPLIT column slices (each slice
  moved to a blocked layout through shared memory, so that loads and stores are rows of
  contiguous elements), while the loader already fills the ring for the next tile.

The ping-pong schedule (config key PINGPONG) instead gives each consumer every other tile
whole (128 x 128, an accumulator of the same size): the loader fills the ring in tile order, so
one consumer's products run while the other's epilogue does, and each stage has one consumer.

Operands: a bf16 model's bf16 A where it lies (else the cast pass's bf16 copy) and the weight
cast to bf16 once; or fp16x1's planes (the split pass's fp16 A, the weight's fp16 plane), the
power-of-two scales undone on the tile before the epilogue.

All partitions derive the same tile sequence (grouped order; program p takes tiles p, p + P,
...) and the same global step count: step g uses slot g % STAGES with phase (g // STAGES) & 1.
An mbarrier arrive is issued by the partition's first thread: each consumer arrives once a
stage, after its own wait, as CUTLASS's consumers release a stage once a warpgroup.

The epilogue is the emitter's (gemm._emit_epilogue) on each slice, written with `gl.` for
`tl.`: its index vectors take Gluon's automatic layouts, resolved from the slice's. The
helpers it calls (@triton.jit combiners) are called as they are. sm_90 cross-compile, Triton
3.6 and 3.9: both compile (test/python/test_gemm_gluon.py). benchmarks/gemm/ws_gluon.py runs
the same template with a plain store as its epilogue, against cuBLAS (ws_ab.py).
"""
from __future__ import annotations

import re

# the kernel's LOAD argument, evaluated in launch(): the strict kernel's (Triton 3.6 names the
# TMA load async_copy_global_to_shared, later versions async_load)
from kforge.providers.builtin.gluon import LOAD

# the cooperative schedule (the generated module's imports are gluon.HEADER's)
CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, STAGES=3, EPI_SPLIT=4,
              num_warps=4)
# the ping-pong schedule: each consumer takes every other tile whole (128 x 128: its
# accumulator is the cooperative one's size), so one's epilogue overlaps the other's products
PINGPONG = dict(CONFIG, BLOCK_N=128, STAGES=4, PINGPONG=True)
MAXNREG = 168            # 12 warps' worth of the register file (9 warps, rounded by warpgroup)
REGS = (232, 40)         # consumer 1, loader (setmaxnreg); consumer 0 takes what is left
# what Gluon lacks of the names the emitter's epilogue may use
_NOT_IN_GLUON = ("broadcast_to", "dot", "make_tensor_descriptor", "range", "PropagateNan")

_HELPERS = '''\
@gluon.jit
def {name}_tile(t, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # output tile t in grouped order: GROUP_M row tiles a group, the group's columns in turn
    group = GROUP_M * num_pid_n
    first_m = (t // group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (t % group) % group_m
    pid_n = (t % group) // group_m
    return pid_m, pid_n


@gluon.jit
def {name}_load_old(a_d, b_d, bar, a_s, b_s, off_m, off_n, k0):
    # the A and B tiles of one K step, by TMA (Triton 3.6's name)
    tma.async_copy_global_to_shared(a_d, [off_m, k0], bar, a_s)
    tma.async_copy_global_to_shared(b_d, [off_n, k0], bar, b_s)


@gluon.jit
def {name}_load_new(a_d, b_d, bar, a_s, b_s, off_m, off_n, k0):
    # the same, with the TMA load's later name
    tma.async_load(a_d, [off_m, k0], bar, a_s)
    tma.async_load(b_d, [off_n, k0], bar, b_s)


@gluon.jit
def {name}_loader({params}, a_d, b_d, a_bufs, b_bufs, ready, empty, turn,
        ROLE: gl.constexpr,
        LOAD: gl.constexpr, {consts}):
    # the loader: every K step of every tile of this program, into the ring
    num_pid_m = ({M} + BLOCK_M - 1) // BLOCK_M
    num_pid_n = {num_pid_n}
    STEP_BYTES: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K * 2
    g = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = {name}_tile(t, num_pid_m, num_pid_n, GROUP_M)
        for k in range(({K} + BLOCK_K - 1) // BLOCK_K):
            slot = g % STAGES
            # a fresh mbarrier counts as its phase 1 done: the first round waits for nothing
            mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, STEP_BYTES)
            LOAD(a_d, b_d, bar, a_bufs.index(slot), b_bufs.index(slot), pid_m * BLOCK_M,
                 pid_n * BLOCK_N, k * BLOCK_K)
            g += 1


@gluon.jit
def {name}_consumer({params}, a_d, b_d, a_bufs, b_bufs, ready, empty, turn,
        ROLE: gl.constexpr,
        LOAD: gl.constexpr, {consts}):
    # consumer ROLE (0 or 1): {role_doc}
    HALF: gl.constexpr = BLOCK_M // 2
    ROWS: gl.constexpr = {rows}
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    blk: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    num_pid_m = ({M} + BLOCK_M - 1) // BLOCK_M
    num_pid_n = {num_pid_n}
    steps = ({K} + BLOCK_K - 1) // BLOCK_K
    g = {g0}
    i = 0
    for t in range({tile_range}):
        pid_m, pid_n = {name}_tile(t, num_pid_m, num_pid_n, GROUP_M){turn_wait}
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
        prev = 0
        for k in range(steps):
            slot = g % STAGES
            mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
            acc = warpgroup_mma({a_tile}, b_bufs.index(slot).permute((1, 0)), acc,
                                use_acc=k > 0, is_async=True)
            # the step before has retired: release its stage
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index(prev), pred=k > 0)
            prev = slot
            g += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(prev)){turn_arrive}
        i += 1
        # the epilogue on this consumer's rows, while the loader fills the ring{g_next}
        rm = pid_m * BLOCK_M + {row0}gl.arange(0, ROWS)[:, None]
{epilogue}


@gluon.jit
def {name}({params}, LOAD: gl.constexpr, {consts}):
    """{comment}"""
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)
    a_d = tma.make_tensor_descriptor({A}, [{M}, {K}], [{K}, 1], [BLOCK_M, BLOCK_K], smem)
    b_d = tma.make_tensor_descriptor({B}, [{B_ROWS}, {K}], [{K}, 1], [BLOCK_N, BLOCK_K], smem)
    a_bufs = gl.allocate_shared_memory(gl.{dtype}, [STAGES, BLOCK_M, BLOCK_K], smem)
    b_bufs = gl.allocate_shared_memory(gl.{dtype}, [STAGES, BLOCK_N, BLOCK_K], smem)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # ping-pong's turns: turn[c] completes a phase each time consumer c's products are done
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)        # the loader's expect, then the bytes
        mbarrier.init(empty.index(i), count={empty_count})        # {empty_doc}
    gl.warp_specialize([
        ({name}_consumer, ({params}, a_d, b_d, a_bufs, b_bufs, ready, empty, turn, 0,
                           LOAD,
                           {consts_args})),
        ({name}_consumer, ({params}, a_d, b_d, a_bufs, b_bufs, ready, empty, turn, 1,
                           LOAD,
                           {consts_args})),
        ({name}_loader, ({params}, a_d, b_d, a_bufs, b_bufs, ready, empty, turn, 1,
                           LOAD,
                         {consts_args})),
    ], [4, 1], [{reg_consumer}, {reg_loader}])
'''

CONSTS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "STAGES", "EPI_N")


def to_gluon(lines: list[str]) -> list[str]:
    """The emitter's Triton lines with Gluon's names (`tl.` -> `gl.`); CannotGenerate where a
    line needs what Gluon lacks."""
    from kforge.providers.builtin.emitter import CannotGenerate
    out = []
    for line in lines:
        g = re.sub(r"\btl\.", "gl.", line)
        for name in _NOT_IN_GLUON:
            if f"gl.{name}" in g:
                raise CannotGenerate(f"the warp-specialized kernel's epilogue: gl.{name} does "
                                     "not exist in Gluon")
        out.append(g)
    return out


def kernel_source(name: str, params: list[str], a: str, b: str, M: int, N: int, K: int,
                  epilogue: list[str], comment: str = "", dtype: str = "bfloat16",
                  pingpong: bool = False, paired: bool = False) -> str:
    """The kernel `name` and its partitions and helpers, as module source. `params`: the
    kernel's pointer parameters (A's and B's among them: `a`, `b`); `epilogue`: the consumer's
    lines after its K loop, indented for the tile loop's body (8 spaces), with `acc` the
    consumer's [ROWS, BLOCK_N] accumulator and `rm` its rows; `dtype`: the operands' (bfloat16,
    or float16 for fp16x1's planes). `pingpong`: each consumer takes every other tile whole
    (ROWS = BLOCK_M), so that one's epilogue runs while the other's products do; else the two
    share each tile, HALF rows each (ROWS = HALF). `paired`: B is a weight and its partner's,
    their rows interleaved by BLOCK_N / 2 ([2N, K], prepare_weights' paired weights), so that a
    tile holds BLOCK_N / 2 columns of each product (N a multiple of BLOCK_N / 2)."""
    src = _HELPERS
    if pingpong:
        # consumer ROLE's tiles are the program's j-th with j % 2 == ROLE; its steps in the
        # ring are those of its tiles (the loader fills the ring in tile order)
        sched = {"{role_doc}": "every other tile of the program, whole",
                 "{rows}": "BLOCK_M", "{g0}": "ROLE * steps",
                 "{tile_range}": "gl.program_id(0) + ROLE * gl.num_programs(0), num_pid_m * "
                                 "num_pid_n, 2 * gl.num_programs(0)",
                 "{a_tile}": "a_bufs.index(slot)", "{row0}": "",
                 "{g_next}": "\n        g += steps  # past the other consumer's tile",
                 "{empty_count}": "1", "{empty_doc}": "the consumer of the step",
                 # a consumer's products start when the other's are done (CUTLASS's ordered
                 # math barrier): consumer 1's i-th tile after consumer 0's i-th, consumer 0's
                 # after consumer 1's (i-1)-th. Besides keeping the two out of phase, this keeps
                 # each waiter within one phase of a stage's barrier: without it consumer 1
                 # waits for a stage's round many rounds ahead, and a phase's parity cannot
                 # tell them apart (test_gluon_ws_protocol found the race)
                 "{turn_wait}": "\n        mbarrier.wait(turn.index(1 - ROLE), (i & 1) ^ (1 - ROLE))",
                 "{turn_arrive}": "\n        mbarrier.arrive(turn.index(ROLE))"}
    else:
        sched = {"{role_doc}": "rows [ROLE * HALF, ROLE * HALF + HALF) of every tile",
                 "{rows}": "HALF", "{g0}": "0",
                 "{tile_range}": "gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)",
                 "{a_tile}": "a_bufs.index(slot).slice(ROLE * HALF, HALF)",
                 "{row0}": "ROLE * HALF + ", "{g_next}": "",
                 "{empty_count}": "2", "{empty_doc}": "one arrival from each consumer",
                 "{turn_wait}": "", "{turn_arrive}": ""}
    for key, val in sched.items():
        src = src.replace(key, val)
    for key, val in (("{params}", ", ".join(params)),
                     ("{consts}", ", ".join(f"{c}: gl.constexpr" for c in CONSTS)),
                     ("{consts_args}", ", ".join(CONSTS)),
                     ("{epilogue}", "\n".join(epilogue)), ("{comment}", comment or name),
                     ("{reg_consumer}", str(REGS[0])), ("{reg_loader}", str(REGS[1])),
                     ("{num_pid_n}", f"{N} // (BLOCK_N // 2)" if paired
                      else f"({N} + BLOCK_N - 1) // BLOCK_N"),
                     ("{B_ROWS}", str(2 * N if paired else N)),
                     ("{A}", a), ("{B}", b), ("{M}", str(M)), ("{N}", str(N)),
                     ("{K}", str(K)), ("{dtype}", dtype), ("{name}", name)):
        src = src.replace(key, val)
    return src


def sliced_epilogue(b, em, tile, con, outputs: list[str], slices: int, rows: str,
                    first_col: str, scale=None, partner=None) -> None:
    """The region's epilogue on the accumulator `acc` [rows, BLOCK_N] bound in `tile` (with
    `rm` and a layout `blk`), in `slices` column slices of EPI_N: each moved to `blk` through
    shared memory, `rn` its columns from `first_col`, then `scale(part, slice, i)`'s lines if
    given, then the emitter's (gemm._emit_epilogue: reading the product inlines to the slice;
    the caller writes the lines in Gluon's names, to_gluon). With `partner` (a paired
    weight's second product): the tile's first half of slices are the product's columns, its
    second half the partner's same columns; slice i of each is on the tile at once, the
    partner's bound where the region reads the partner's result (gemm.py's paired tiles)."""
    from kforge.providers.builtin.emitter import Scope, Val
    from kforge.providers.builtin.gemm import _emit_epilogue, output_tile_index, split_slices
    lines, accs = split_slices(["acc"], slices, rows, "gl")
    for line in lines:
        tile.emit(line)
    tile_index = output_tile_index(con)
    accs_p = []
    if partner is not None:
        accs, accs_p = accs[:slices // 2], accs[slices // 2:]
        partner_at = (partner.op.results[0], output_tile_index(partner))
    for i, a in enumerate(accs):
        part = Scope(tile, binds={"rn"}, depth=tile.depth,
                     header=f"# columns [{i} * EPI_N, {i + 1} * EPI_N) of the "
                     + ("tile" if partner is None else "product (the partner's: slice "
                        f"{i + len(accs)} of the tile)"))
        for x in [a] + accs_p[i:i + 1]:
            part.emit(f"{x} = gl.convert_layout({x}, blk)")
        part.emit(f"rn = {first_col} + {i} * EPI_N + gl.arange(0, EPI_N)[None, :]")
        if scale is not None:
            scale(part, a, i)
            if accs_p:
                scale(part, accs_p[i], i + len(accs))
        bound = {partner_at: Val(accs_p[i], frozenset({"rm", "rn"}), "f32")} if accs_p else {}
        _emit_epilogue(b, em, part, con, tile_index, outputs, "f32", frozenset({"rm", "rn"}),
                       acc=a, bound=bound)
        part.close()


def ws_eligible(b, stage, config: dict, fuse_rows: bool, split_k: int) -> str | None:
    """Why the stage cannot take the kernel, or None."""
    from kforge.providers.builtin.schemes import FP16X1, tma_eligible
    scheme = config.get("input_precision")
    if b.precision != "bf16" or scheme not in (None, FP16X1):
        return "the bf16 policy's bf16 operands or fp16x1 planes only"
    if b.target.interpreter or b.target.name != "cuda" or b.target.sm < 90:
        return "an sm_90 or later CUDA GPU only (the interpreter does not run Gluon)"
    if fuse_rows or split_k > 1 or b.gemm_partials or config.get("N_PARTS", 1) > 1:
        return "its epilogue on the tile (no fused row reduction, split-K or column parts)"
    paired = bool(config.get("PAIRED"))
    if (stage.partner is not None) != paired:
        return "a partner's product with PAIRED tiles, and PAIRED tiles for a partner only"
    if not tma_eligible(b.spec, b.target, b.precision, stage, scheme):
        return "a 2-D product of a K-major weight with K % 8 == 0"
    if paired:
        from kforge.providers.builtin.gemm import partner_fits_tma
        from kforge.providers.builtin.kernels import _both_products_in_one_kernel
        if config.get("PINGPONG") or not _both_products_in_one_kernel(stage, config):
            return "PAIRED: the cooperative schedule, 2 or 4 slices, N a multiple of BLOCK_N / 2"
        if not partner_fits_tma(b, stage.partner, scheme):
            return f"PAIRED: the partner {stage.partner.op.name}'s weight does not fit TMA"
    return None


def emit_gemm_ws(b, shape, outputs: list[str], config: dict, name: str, fuse_rows: bool,
                 split_k: int = 1) -> None:
    """The stage's product and its epilogue by the warp-specialized Gluon kernel (the caller
    is gemm._emit_gemm, inside its index ranges). A: a bf16 model's activation where it lies,
    else the cast pass's bf16 copy `<product>_a16` (kernels._build_stage makes it for a TMA
    configuration); B: the weight [N, K] in bf16 from prepare_weights."""
    from kforge.providers.builtin.analysis import weight_source
    from kforge.providers.builtin.builder import ops_comment
    from kforge.providers.builtin.emitter import CannotGenerate, KVar, Scope
    from kforge.providers.builtin.gemm import POW2_COLUMN, pair_weights
    from kforge.providers.builtin.schemes import FP16X1, bf16_a_source
    why = ws_eligible(b, shape, config, fuse_rows, split_k)
    if why:
        raise CannotGenerate(f"the warp-specialized kernel: {why}")
    spec, con = b.spec, shape.contraction
    op = con.op
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    BM, BN = config["BLOCK_M"], config["BLOCK_N"]
    slices = config.get("EPI_SPLIT", CONFIG["EPI_SPLIT"])
    pingpong = bool(config.get("PINGPONG"))
    if BM != 128 or BN % (slices * 16) or BN > (128 if pingpong else 256) \
            or slices not in (1, 2, 4):
        raise CannotGenerate("the warp-specialized kernel: BLOCK_M 128 (two consumers of 64 "
                             "rows, or of whole tiles with PINGPONG), BLOCK_N <= 256 (128 "
                             "with PINGPONG) in 1, 2 or 4 slices of >= 16 columns")
    rows = "BLOCK_M" if pingpong else "HALF"
    fp16 = config.get("input_precision") == FP16X1
    vc = op.results[0]
    weight = weight_source(spec, op.operands[con.b], widened=not fp16)
    partner = shape.partner          # (ws_eligible: with PAIRED tiles)
    weight_p = None
    if partner is not None:
        weight_p = weight_source(spec, partner.op.operands[partner.b], widened=not fp16)
    # bf16: a bf16 model's activation where it lies, else the cast pass's copy; fp16x1: the
    # split pass's fp16 plane of A (its first [M, K]), row scales in `<product>_as`
    a16 = f"{vc}_a16" if fp16 else bf16_a_source(spec, con) or f"{vc}_a16"
    b.descriptor_args.update({a16, weight, weight_p} & {a.name for a in spec.args})
    kvars = {"rm": KVar("rm", f"rm < {M}" if M % BM else None, (rows, "1")),
             "rn": KVar("rn", f"rn < {N}" if N % BN and partner is None else None,
                        ("1", "EPI_N"))}
    em = b.emitter(kvars)
    em.loads.setdefault(a16, set()).add("dot")
    em.loads.setdefault(weight, set()).add("dot")       # bf16 / fp16 from prepare_weights
    if weight_p is not None:
        pair_weights(b, em, op, partner, weight, weight_p, BN, N, K,
                     who="the warp-specialized kernel: ")
    tile = Scope(None, binds={"rm"}, depth=2)
    em.root = tile
    if fp16:
        # prepare_weights' flat [fp16 plane, column exponents] of the weight; the power-of-two
        # scales are undone on the tile (exact), as the TMA kernel's fp16x1
        b.fp16_weights[weight] = ((0,), 1)
        if weight_p is not None:
            b.fp16_weights[weight_p] = ((0,), 1)
        em.loads.setdefault(f"{vc}_as", set()).add("other")
        tile.emit(f"s_a = gl.load({em.pointers[f'{vc}_as']} + rm"
                  + (f", mask=rm < {M}, other=1.0)" if M % BM else ")") + "  # A's row scales")
    def scale(part, a, i):          # the weight's column exponents, stored after its plane
        if weight_p is None:
            part.emit(f"e_b = gl.load({em.pointers[weight]} + {N * K} + rn"
                      + (f", mask=rn < {N}, other=0.0)" if N % BN else ")") + ".to(gl.int32)")
        else:               # the paired weight's, interleaved as its rows: slice i of the tile
            part.emit(f"e_b = gl.load({em.pointers[weight]} + {2 * N * K} + pid_n * BLOCK_N + "
                      f"{i} * EPI_N + gl.arange(0, EPI_N)[None, :]).to(gl.int32)")
        part.emit(f"{a} = {a} * s_a * {POW2_COLUMN.format(ns='gl')}")

    sliced_epilogue(b, em, tile, con, outputs, slices, rows,
                    "pid_n * BLOCK_N" if partner is None else "pid_n * (BLOCK_N // 2)",
                    scale if fp16 else None, partner)
    constexprs = {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": config["BLOCK_K"],
                  "GROUP_M": config["GROUP_M"], "STAGES": config.get("STAGES", CONFIG["STAGES"]),
                  "EPI_N": BN // slices}
    tiles = -(-M // BM) * (N // (BN // 2) if partner is not None else -(-N // BN))
    programs = max(1, min(tiles, b.target.compute_units))
    comment = (f"{op.name} M={M} N={N} K={K}"
               + (f" and {partner.op.name}'s, their weights' rows interleaved"
                  if partner is not None else "")
               + "; warp-specialized (a TMA loader warp, two "
               f"consumer warpgroups {'taking tiles in turn' if pingpong else 'sharing a tile'})"
               f", persistent, {'fp16x1' if fp16 else 'bf16'} operands; epilogue: "
               f"{ops_comment(spec, em)}")
    k = b.finish(em, name, outputs, constexprs, [], f"({programs},)", CONFIG["num_warps"],
                 None, comment, options={"maxnreg": MAXNREG})
    k.raw = kernel_source(name, k.params, em.pointers[a16], em.pointers[weight], M, N, K,
                          to_gluon(tile.lines), comment, "float16" if fp16 else "bfloat16",
                          pingpong, paired=partner is not None)
    # LOAD goes first among the constexprs, after the pointers (kernel_source's signature)
    k.tensors.append(LOAD.replace("{name}", name))
    b.gluon = b.tma = True
