"""GEMM kernel templates of the builtin generator: a tiled contraction (grouped tile order,
optional split-K) with the region's elementwise consumers fused on the accumulator tile and row
reductions over N fused when one tile spans the row; the persistent TMA kernel; and the passes
that write an operand's power-of-two-scaled fp16 planes (fp16x3, fp16x1) or its bf16 copy
before the GEMM (weights are prepared once at load instead: `host`).
"""
from __future__ import annotations

import math

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.analysis import Contraction, RegionShape, weight_source
from kforge.providers.builtin.builder import Builder, COL, ROW, ops_comment, store_tile
from kforge.providers.builtin.emitter import (BF16_RNE, TL_DTYPES, WIDE_OFFSETS, CannotGenerate,
                                              ColumnSpace, Emitter, KVar, Scope, Val, compose,
                                              domain_sizes)
from kforge.providers.builtin.schemes import (FP16X1, FP16X3, FP16_SCHEMES, bf16_a_source,
                                              tf32_scheme, tma_eligible)
from kforge.spec import AffineDim, GenericOp, KernelSpec, ReshapeOp


# the split pass reads a row of at most this many columns once (in registers: 64 fp32 values a
# thread at 16 warps; sm_90 cross-compile at K = 14336: 53 registers, no spills); longer rows
# twice. Raised from 8192 for Llama-3-8B's down projection (K = 14336), whose pass read each
# row twice in blocks of 2048: on the H200 (2026-12-06, benchmarks/results/
# 2026-12-06b-h200-gemm-regions) that pass and the region's norm kernel took 0.96 ms of a
# 3.73 ms region. Timed on the H100 (2026-12-06, 2026-12-06c-h100-sibling-split-profile): the
# region 4.05 -> 3.55 ms, its pass and norm kernel 1.38 -> 0.82 ms.
SPLIT_ONE_BLOCK = 16384

# the power of two by which fp16x3 / fp16x1 scale a row of an operand (the split pass: the whole
# row; INSPLIT: a K step of it) before rounding it to fp16, from its largest magnitude `amax`:
# amax < 2**e, so |x * 2**(15 - e)| < 2**15 (fp16's largest is 65504); e clamped to +-100 so
# that both powers stay normal, and a zero row scaled by 1
POW2_EXPONENT = ("e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126",
                 "e = tl.where(amax > 0, tl.minimum(tl.maximum(e, -100), 100), 0)")
POW2_SCALE = "((127 + 15 - e) << 23).to(tl.float32, bitcast=True)"      # 2**(15 - e)
POW2_UNSCALE = "((127 - 15 + e) << 23).to(tl.float32, bitcast=True)"    # 2**(e - 15)
# 2**e_b from a prepared weight's stored column exponents e_b (e - 15): the epilogue's undo of
# the column's scale; {ns}: tl, or gl in a Gluon kernel
POW2_COLUMN = "((e_b + 127) << 23).to({ns}.float32, bitcast=True)"


def build_split_pass(b: Builder, shape: RegionShape, side: str, planes: str, scale: str,
                     name: str, lo: bool = True) -> None:
    """The fp16x3 pass over one GEMM operand: for each of its rows (A: batch x M rows, B: batch
    x N rows; K columns) the power-of-two scale and the fp16 hi/lo planes, K-major (fp16x1:
    `lo` False, the hi plane alone)."""
    c = shape.contraction
    rows = c.extent(c.batch) * c.extent(c.m if side == "a" else c.n)
    K = c.extent(c.k)
    with ix.ranges({"rows": (0, rows), "cols": (0, K)}):
        _emit_split_pass(b, shape, side, planes, scale, name, rows, K, lo)


def _emit_split_pass(b: Builder, shape: RegionShape, side: str, planes: str, scale: str,
                     name: str, rows: int, K: int, lo: bool = True) -> None:
    c = shape.contraction
    op = c.op
    # a row of up to SPLIT_ONE_BLOCK columns is one block, read once (its max, then its planes,
    # from the same registers); longer rows loop over blocks of 2048 twice
    single = K <= SPLIT_ONE_BLOCK
    BC = 1 << (K - 1).bit_length() if single else 2048
    BR = max(1, min(2048 // BC, 1 << (rows - 1).bit_length()))
    warps = 16 if BC >= 16384 else 8 if BC >= 4096 else 4
    row_mask = "row_mask" if rows % BR else None
    col_mask = "col_mask" if K % BC else None
    kvars = {"rows": KVar("rows", row_mask, ROW), "cols": KVar("cols", col_mask, COL)}
    em = b.emitter(kvars)
    root = Scope(None, binds={"rows"})
    em.root = root
    dims = c.batch + (c.m if side == "a" else c.n)
    p = dict(zip(dims, ix.unravel(ix.IVar("rows"), [c.sizes[d] for d in dims])))
    p.update(zip(c.k, ix.unravel(ix.IVar("cols"), [c.sizes[d] for d in c.k])))
    arg = op.body.args[c.a if side == "a" else c.b]
    big = 2 * rows * K >= 2 ** 31
    root.emit("pid = tl.program_id(0)")
    root.emit("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    if row_mask:
        root.emit(f"row_mask = rows < {rows}")
    if not single:
        root.emit("amax = tl.full([BLOCK_R, BLOCK_C], 0.0, tl.float32)")

    def loop():
        sc = Scope(root, binds={"cols"}, depth=2, header=f"for c0 in range(0, {K}, BLOCK_C):")
        sc.emit("cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        if col_mask:
            sc.emit(f"col_mask = cols < {K}")
        x = em.body_value(op, p, arg, sc)
        code = x.code if "cols" in x.deps else f"tl.broadcast_to({x.code}, [BLOCK_R, BLOCK_C])"
        return sc, code

    b.combiners.setdefault("_maxnum", None)
    sc, x = loop()
    if single:              # one iteration: the row's values stay in registers
        sc.emit(f"xr = {x}")
        x = "xr"
    absx = f"tl.where(col_mask, tl.abs({x}), 0.0)" if col_mask else f"tl.abs({x})"
    if single:
        sc.emit(f"amax = tl.reduce({absx}, 1, _maxnum, keep_dims=True)")
    else:
        sc.emit(f"amax = tl.maximum(amax, {absx})")
        sc.close()
        root.emit("amax = tl.reduce(amax, 1, _maxnum, keep_dims=True)")
    at = sc if single else root
    at.emit("# power-of-two scale per row: amax < 2**e, so |x * 2**(15 - e)| < 2**15 (fp16 max "
            "65504)")
    at.emit(POW2_EXPONENT[0])
    at.emit(f"{POW2_EXPONENT[1]}   # zero rows: 1")
    at.emit(f"scale = {POW2_SCALE}   # 2**(15 - e)")
    mask = em.mask_of({"rows"})
    at.emit(f"tl.store({scale}_out + rows, {POW2_UNSCALE}"
            + (f", mask={mask})" if mask else ")") + "   # 2**(e - 15), undone on the product")
    if not single:
        sc, x = loop()
    sc.emit(f"x = {x} * scale")
    sc.emit("hi = x.to(tl.float16)")
    offs = f"{'rows.to(tl.int64)' if big else 'rows'} * {K} + cols"
    smask = em.mask_of({"rows", "cols"})
    m = f", mask={smask})" if smask else ")"
    sc.emit(f"tl.store({planes}_out + {offs}, hi{m}")
    if lo:
        sc.emit(f"tl.store({planes}_out + {rows * K} + {offs}, (x - hi.to(tl.float32))"
                f".to(tl.float16){m}")
    sc.close()
    what = "A (rows: batch x M)" if side == "a" else "B (rows: batch x N)"
    b.finish(em, name, [planes, scale], {"BLOCK_R": BR, "BLOCK_C": BC}, root.lines,
             f"(triton.cdiv({rows}, {BR}),)", warps,
             comment=f"fp16x{3 if lo else 1} split of {op.name}'s {what}: {rows} rows of K={K} "
                     f"-> fp16 {'[hi, lo] planes' if lo else 'plane'} of the row scaled by a "
                     "power of two, and the scale",
             out_params={planes: f"{planes}_out", scale: f"{scale}_out"})
    b.kernels[-1].shared = True        # its planes: a function of A alone


def _fp16x3_weight_dims(index: tuple, col: str) -> tuple | None:
    """The dims of a weight (read at `index` as the B operand) that follow the output column,
    when every other dim follows only K (or nothing): then a scale per output column is a
    scale per slice of those dims."""
    n_dims = []
    for j, i in enumerate(index):
        v = ix.variables(i)
        if col in v or "rn" in v:
            if "kb" in v:
                return None
            n_dims.append(j)
    return tuple(n_dims)


def build_gemm(b: Builder, shape: RegionShape, outputs: list[str], config: dict, name: str,
               fuse_rows: bool, split_k: int = 1) -> None:
    c = shape.contraction
    M, N, K = c.extent(c.m), c.extent(c.n), c.extent(c.k)
    table = {"rm": (0, M), "rm_a": (0, M), "rn": (0, N), "rn_b": (0, N), "ka": (0, K),
             "kb": (0, K), "batch": (0, c.extent(c.batch))}
    with ix.ranges(table):
        _emit_gemm(b, shape, outputs, config, name, fuse_rows, split_k)


def _emit_gemm(b: Builder, shape: RegionShape, outputs: list[str], config: dict, name: str,
               fuse_rows: bool, split_k: int = 1) -> None:
    if config.get("WS"):
        from kforge.providers.builtin.gluon_ws import emit_gemm_ws
        emit_gemm_ws(b, shape, outputs, config, name, fuse_rows, split_k)
        return
    if config.get("TMA"):
        _emit_gemm_tma(b, shape, outputs, config, name, fuse_rows, split_k)
        return
    spec, target, con = b.spec, b.target, shape.contraction
    op = con.op
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    batch = con.extent(con.batch)
    BM, BN, BK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if fuse_rows and BN < N:
        raise CannotGenerate("fused row reductions need BLOCK_N >= N")
    kvars = {"rm": KVar("rm", "rm < %d" % M if M % BM else None, ("BLOCK_M", "1")),
             "rn": KVar("rn", "rn < %d" % N if N % BN else None, ("1", "BLOCK_N")),
             "batch": KVar("batch", None),
             "ka": KVar("ka", "ka < %d" % K if K % (BK * split_k) else None, ("1", "BLOCK_K")),
             "kb": KVar("kb", "kb < %d" % K if K % (BK * split_k) else None, ("BLOCK_K", "1"))}
    if b.gemm_partials:
        raise CannotGenerate("partial row reductions: on the TMA kernel")
    columns = ColumnSpace("rn", N, "[BLOCK_M, BLOCK_N]") if fuse_rows else None
    em = b.emitter(kvars, columns)
    root = Scope(None, binds={"rm", "rn", "batch"})
    em.root = root
    root.emit("pid = tl.program_id(0)")
    if con.batch:
        root.emit("batch = tl.program_id(1)")
    if split_k > 1:
        root.emit(f"pid_k = tl.program_id({2 if con.batch else 1})")
    root.emit(f"num_pid_m = ({M} + BLOCK_M - 1) // BLOCK_M")
    root.emit(f"num_pid_n = ({N} + BLOCK_N - 1) // BLOCK_N")
    root.emit("# grouped tile order: GROUP_M row tiles share their B tiles in L2")
    root.emit("group = GROUP_M * num_pid_n")
    _emit_grouped_tile(root, "pid")
    root.emit("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
    root.emit("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    bvar, mvar, nvar = ix.IVar("batch"), ix.IVar("rm"), ix.IVar("rn")
    p_out = {}
    for dims, var in ((con.batch, bvar), (con.m, mvar), (con.n, nvar)):
        for d, i in zip(dims, ix.unravel(var, [con.sizes[d] for d in dims])):
            p_out[d] = i
    # operand rows/columns past the edge wrap around (rm % M): loads need no M/N mask, only
    # the stores are masked
    row_a, col_b = mvar, nvar
    if M % BM:
        root.emit(f"rm_a = rm % {M}")
        kvars["rm_a"] = KVar("rm_a", None, kvars["rm"].shape)
        row_a = ix.IVar("rm_a")
    if N % BN:
        root.emit(f"rn_b = rn % {N}")
        kvars["rn_b"] = KVar("rn_b", None, kvars["rn"].shape)
        col_b = ix.IVar("rn_b")
    root.binds |= {"rm_a", "rn_b"}
    p_a = {d: p_out[d] for d in con.batch}
    p_b = {d: p_out[d] for d in con.batch}
    p_a.update(zip(con.m, ix.unravel(row_a, [con.sizes[d] for d in con.m])))
    p_b.update(zip(con.n, ix.unravel(col_b, [con.sizes[d] for d in con.n])))
    ksizes = [con.sizes[d] for d in con.k]
    for d, i in zip(con.k, ix.unravel(ix.IVar("ka"), ksizes)):
        p_a[d] = i
    for d, i in zip(con.k, ix.unravel(ix.IVar("kb"), ksizes)):
        p_b[d] = i
    acc_dtype = "f64" if spec.tensor(op.results[0]).dtype == "f64" else "f32"
    root.emit(f"acc = tl.full([BLOCK_M, BLOCK_N], 0.0, {TL_DTYPES[acc_dtype]})")
    if split_k > 1:
        header = f"for k0 in range(pid_k * BLOCK_K, {K}, BLOCK_K * {split_k}):"
    else:
        header = f"for k0 in range(0, {K}, BLOCK_K):"
    loop = Scope(root, binds={"ka", "kb"}, depth=2, header=header)
    loop.emit("ka = k0 + tl.arange(0, BLOCK_K)[None, :]")
    loop.emit("kb = k0 + tl.arange(0, BLOCK_K)[:, None]")
    impl = config.get("input_precision")
    scale_lines = []
    if impl in FP16_SCHEMES:
        scale_lines = _fp16x3_step(b, em, con, loop, p_b, row_a.name, col_b.name, kvars,
                                   products=3 if impl == FP16X3 else 1,
                                   p_a=p_a if config.get("INSPLIT") else None)
    else:
        body = op.body
        b_weight = weight_source(spec, op.operands[con.b])
        with em.operand_reads():
            a = em.body_value(op, p_a, body.args[con.a], loop)
            split_b = impl == "3xtf32" and b_weight is not None and a.dtype == "f32"
            if split_b:
                em.planes.add(b_weight)
            bb = em.body_value(op, p_b, body.args[con.b], loop)
        a_code = _dot_operand(a, (row_a.name, "ka"), "[BLOCK_M, BLOCK_K]", kvars["ka"].mask)
        b_code = _dot_operand(bb, ("kb", col_b.name), "[BLOCK_K, BLOCK_N]", kvars["kb"].mask)
        if split_b:
            with em.operand_reads(plane=1):
                b_lo = em.body_value(op, p_b, body.args[con.b], loop)
            b.split_weights.add(b_weight)
        dtype = a.dtype
        if impl == "3xtf32" and dtype == "f32":
            # fp32-accurate on tf32 tensor cores: x = hi + lo with hi rounded to tf32; three
            # products per K step accumulate into `part`, which is added to acc in exact fp32
            # (chaining all of K inside the tensor core truncates: measured 5.9e-5 error at K=8192)
            tf32_hi = "(({}.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)"
            if not a_code.isidentifier():
                loop.emit(f"a = {a_code}")
                a_code = "a"
            loop.emit(f"a_hi = {tf32_hi.format(a_code)}")
            loop.emit(f"a_lo = {a_code} - a_hi")
            if split_b:
                loop.emit(f"b_hi = {b_code}")
                b_lo_code = _dot_operand(b_lo, ("kb", col_b.name), "[BLOCK_K, BLOCK_N]",
                                         kvars["kb"].mask)
                loop.emit(f"b_lo = {b_lo_code}")
            else:
                if not b_code.isidentifier():
                    loop.emit(f"b = {b_code}")
                    b_code = "b"
                loop.emit(f"b_hi = {tf32_hi.format(b_code)}")
                loop.emit(f"b_lo = {b_code} - b_hi")
            loop.emit('part = tl.dot(a_lo, b_hi, input_precision="tf32")')
            loop.emit('part = tl.dot(a_hi, b_lo, part, input_precision="tf32")')
            loop.emit('part = tl.dot(a_hi, b_hi, part, input_precision="tf32")')
            dot = None
            loop.emit(f"acc += part  # {op.name}")
        elif b.precision == "bf16" and not impl and dtype in ("f32", "bf16", "f16"):
            if target.bf16_dot_ok:
                a_code, b_code = f"{a_code}.to(tl.bfloat16)", f"{b_code}.to(tl.bfloat16)"
            else:       # the interpreter: bf16 values (rounded as the GPU does), fp32 products
                b.combiners.setdefault(BF16_RNE, None)
                a_code, b_code = f"{BF16_RNE}({a_code})", f"{BF16_RNE}({b_code})"
            dot = f"tl.dot({a_code}, {b_code}, acc)"
        elif dtype == "f32":
            dot = f"tl.dot({a_code}, {b_code}, acc, input_precision=\"{config['input_precision']}\")"
        elif dtype == "bf16" and not target.bf16_dot_ok:
            dot = f"tl.dot({a_code}.to(tl.float32), {b_code}.to(tl.float32), acc)"
        else:
            dot = f"tl.dot({a_code}, {b_code}, acc)"
        if dot is not None:
            loop.emit(f"acc = {dot}  # {op.name}")
    loop.close()
    for line in scale_lines:
        root.emit(line)
    out_map = op.indexing_maps[op.num_inputs]
    tile_index = tuple(compose(r, p_out) for r in out_map.results)
    vc = op.results[0]
    tile_deps = frozenset({"rm", "rn"} | ({"batch"} if con.batch else set()))
    if split_k > 1:
        _store_split_k_slice(b, em, root, vc, batch * M * N, tile_index,
                             Val("acc", tile_deps, acc_dtype))
        _finish_split_k(b, em, name, vc, root.lines, config,
                        {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK,
                         "GROUP_M": config["GROUP_M"]},
                        _gemm_grid(M, N, BM, BN, batch if con.batch else None, split_k),
                        f"split-K partial products ({split_k} slices of K={K}) of {op.name}"
                        + (f"; products: {impl}" if impl else ""))
        return
    _emit_epilogue(b, em, root, con, tile_index, outputs, acc_dtype, tile_deps)
    fused = "; row reductions fused (one tile spans N)" if fuse_rows else ""
    b.finish(em, name, outputs, {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK,
                                 "GROUP_M": config["GROUP_M"]}, root.lines,
             _gemm_grid(M, N, BM, BN, batch if con.batch else None, 1),
             config["num_warps"], config.get("num_stages"),
             options=b.target.launch_options(config),
             comment=f"{op.name} M={M} N={N} K={K}" + (f" batch={batch}" if con.batch else "")
             + (f"; products: {impl}" if impl else "")
             + f"; epilogue: {ops_comment(spec, em)}{fused}")


def _store_split_k_slice(b: Builder, em: Emitter, scope: Scope, vc: str, plane: int,
                         tile_index: tuple, acc: Val) -> None:
    """A split-K program's partial product of `vc` into its K slice `pid_k` of the workspace
    `<vc>_tmp` [SPLIT_K, *vc's shape] (`plane`: vc's elements)."""
    store_tile(scope, em, f"{vc}_tmp + pid_k * {plane}",
               ix.ravel(tile_index, b.spec.tensor(vc).shape), acc)


def _finish_split_k(b: Builder, em: Emitter, name: str, vc: str, lines, config: dict,
                    constexprs: dict, grid: str, comment: str) -> None:
    """The split-K GEMM kernel (pointer or TMA): no region output, the workspace of `vc` its
    last parameter; the epilogue kernel after it sums the slices (Builder.split_sums)."""
    b.finish(em, name, [], constexprs, lines, grid, config["num_warps"],
             config.get("num_stages"), options=b.target.launch_options(config), comment=comment)
    b.kernels[-1].params.append(f"{vc}_tmp")
    b.kernels[-1].tensors.append(vc)


def output_tile_index(con: Contraction) -> tuple:
    """The product's output index on a 2-D tile's rows `rm` and columns `rn` (the persistent
    kernels' epilogues)."""
    op = con.op
    p_out = dict(zip(con.m, ix.unravel(ix.IVar("rm"), [con.sizes[d] for d in con.m])))
    p_out.update(zip(con.n, ix.unravel(ix.IVar("rn"), [con.sizes[d] for d in con.n])))
    return tuple(compose(r, p_out) for r in op.indexing_maps[op.num_inputs].results)


def partner_fits_tma(b: Builder, partner: Contraction, scheme) -> bool:
    """A paired tile's partner product (SwiGLU's other half): its weight is read by TMA like
    the product's own, so it must fit a descriptor too (the TMA and warp-specialized kernels'
    paired tiles)."""
    return tma_eligible(b.spec, b.target, b.precision, RegionShape("gemm", [], contraction=partner),
                        scheme)


def pair_weights(b: Builder, em: Emitter, op, partner: Contraction, weight: str, weight_p: str,
                 BN: int, N: int, K: int, who: str = "") -> None:
    """Record a paired tile's interleaved weight (prepare_weights lays the two weights' rows
    out by BLOCK_N / 2 under `weight`), once both products are known to start from zero: the
    one accumulator holds both, so neither can start from its own init. `who` prefixes the
    error."""
    if em.init_constant(op.inits[0]) != 0.0 or em.init_constant(partner.op.inits[0]) != 0.0:
        raise CannotGenerate(f"{who}a partner product: both products start from zero")
    b.paired_weights[weight] = (weight_p, BN // 2, N, K)


def split_slices(accs: list[str], slices: int, rows: str = "BLOCK_M",
                 ns: str = "tl") -> tuple[list[str], list[str]]:
    """Lines that split the accumulators `accs` (the tile's columns, in order, each [rows,
    BLOCK_N // len(accs)]) in halves of halves (reshape, permute, split) until there are
    `slices`, and the slices' names in column order. `ns`: the language's module name (tl, or
    gl for a Gluon kernel)."""
    lines = []
    while len(accs) < slices:
        halves = []
        for a in accs:
            lines.append(f"{a}_0, {a}_1 = {ns}.split({ns}.permute({ns}.reshape({a}, ({rows}, 2, "
                         f"BLOCK_N // {2 * len(accs)})), (0, 2, 1)))")
            halves += [f"{a}_0", f"{a}_1"]
        accs = halves
    return lines, accs


def _emit_grouped_tile(scope: Scope, tile: str) -> None:
    """pid_m, pid_n of output tile `tile` in grouped order (`num_pid_m` and `group`, GROUP_M
    row tiles by num_pid_n, already bound): the pointer kernel's program, the persistent
    kernel's loop variable."""
    scope.emit(f"first_m = ({tile} // group) * GROUP_M")
    scope.emit("group_m = min(num_pid_m - first_m, GROUP_M)")
    scope.emit(f"pid_m = first_m + ({tile} % group) % group_m")
    scope.emit(f"pid_n = ({tile} % group) // group_m")


def _tma_store_outputs(b: Builder, top: Scope, con: Contraction, tile_index: tuple,
                       outputs: list[str], epi_n: str) -> dict[str, str]:
    """TMA_STORE: the outputs the persistent kernel stores through a descriptor (the slice
    staged in shared memory, one bulk copy, clipped at M and N by the hardware) instead of
    tl.store, each with its descriptor made at the top of the kernel. An output qualifies when
    it is fp32, laid out as the product's [M, N] tile (stored at rm * N + rn) and N % 4 == 0
    (16-byte rows); the others keep tl.store."""
    spec, vc = b.spec, con.op.results[0]
    M, N = con.extent(con.m), con.extent(con.n)
    plain = ix.render(ix.add(ix.mul(ix.IVar("rm"), ix.const(N)), ix.IVar("rn")))
    out = {}
    for o in outputs:
        t = spec.tensor(o)
        index = tile_index_of(spec, vc, tile_index, o)
        if index is None or t.dtype != "f32" or N % 4 or con.batch \
                or math.prod(t.shape) != M * N or ix.render(ix.ravel(index, t.shape)) != plain:
            continue
        top.emit(f"{o}_desc = tl.make_tensor_descriptor({o}_out, shape=[{M}, {N}], "
                 f"strides=[{N}, 1], block_shape=[BLOCK_M, {epi_n}])  # {o}, stored by TMA")
        out[o] = f"{o}_desc"
    return out


def _emit_epilogue(b: Builder, em: Emitter, scope: Scope, con: Contraction, tile_index: tuple,
                   outputs: list[str], acc_dtype: str, tile_deps: frozenset,
                   acc: str = "acc", tma_out: dict | None = None,
                   bound: dict | None = None, partials: dict | None = None) -> None:
    """The region's ops on the accumulator tile `acc` (bound in `scope`) and the stores of
    `outputs`: reading the product inlines to the tile. `tma_out`: {output: (its descriptor,
    the slice's first column)} for outputs stored by TMA (see _tma_store_outputs). `bound`:
    {(value, its tile index): Val} of other values already on the tile (a partner's product)."""
    spec, op = b.spec, con.op
    vc = op.results[0]
    vc_dtype = spec.tensor(vc).dtype
    acc_val = Val(acc, tile_deps, acc_dtype)
    if vc_dtype != acc_dtype:
        acc_val = em.define(scope, tile_deps, f"{acc}.to({TL_DTYPES[vc_dtype]})", vc_dtype)
    init_const = em.init_constant(op.inits[0])
    if init_const != 0.0:
        init = em.value(op.inits[0], tile_index, scope)
        acc_val = em.define(scope, tile_deps | init.deps, f"{acc_val.code} + {init.code}",
                            vc_dtype, "the contraction's initial value")
    scope.cache[("value", vc, tile_index, 0)] = acc_val
    for (name, index), val in (bound or {}).items():
        if spec.tensor(name).dtype != "f32":
            raise CannotGenerate(f"{name}: a product bound on the tile is fp32")
        scope.cache[("value", name, index, 0)] = val
    scope.emit("# epilogue on the accumulator tile")
    for o in outputs:
        index = tile_index_of(spec, vc, tile_index, o)
        if index is None:
            raise CannotGenerate(f"{o} does not have the contraction's shape")
        val = em.value(o, index, scope)
        if o in (tma_out or {}) and {"rm", "rn"} <= set(val.deps) and val.dtype == "f32":
            desc, col = tma_out[o]
            scope.emit(f"{desc}.store([pid_m * BLOCK_M, {col}], {val.code})")
        else:
            b.store(scope, em, o, f"{o}_out", index, val)
    # partial row reductions: each reduction's partial over this tile's columns, stored at
    # (row, pid_n) of its [M, parts] fp32 buffer (the rows kernel after reduces them)
    for r, (ws, parts) in (partials or {}).items():
        val = em.value(r, ix.unravel(ix.IVar("rm"), spec.tensor(r).shape), scope)
        mask = em.mask_of({"rm"})
        scope.emit(f"tl.store({ws}_out + rm * {parts} + pid_n, {val.code}"
                   + (f", mask={mask})" if mask else ")") + f"  # {r}'s partials")


def build_cast_pass(b: Builder, shape: RegionShape, out: str, name: str) -> None:
    """The pass that writes the GEMM's A as a bf16 [M, K] copy for the TMA kernel's
    descriptor (A's producers, if any, computed on the way)."""
    con = shape.contraction
    M, K = con.extent(con.m), con.extent(con.k)
    with ix.ranges({"rows": (0, M), "cols": (0, K)}):
        _emit_cast_pass(b, shape, out, name, M, K)


def _emit_cast_pass(b: Builder, shape: RegionShape, out: str, name: str, M: int,
                    K: int) -> None:
    con = shape.contraction
    op = con.op
    BC = min(256, 1 << (K - 1).bit_length())
    BR = max(1, min(4096 // BC, 1 << (M - 1).bit_length()))
    kvars = {"rows": KVar("rows", f"rows < {M}" if M % BR else None, ROW),
             "cols": KVar("cols", f"cols < {K}" if K % BC else None, COL)}
    em = b.emitter(kvars)
    root = Scope(None, binds={"rows", "cols"})
    em.root = root
    root.emit("rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    root.emit("cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]")
    p = dict(zip(con.m, ix.unravel(ix.IVar("rows"), [con.sizes[d] for d in con.m])))
    p.update(zip(con.k, ix.unravel(ix.IVar("cols"), [con.sizes[d] for d in con.k])))
    x = em.body_value(op, p, op.body.args[con.a], root)
    code = x.code if {"rows", "cols"} <= x.deps else \
        f"tl.broadcast_to({x.code}, [BLOCK_R, BLOCK_C])"
    if b.target.bf16_dot_ok:
        code = f"{code}.to(tl.bfloat16)"
    else:           # the interpreter truncates .to(tl.bfloat16): round to nearest even first
        b.combiners.setdefault(BF16_RNE, None)
        code = f"{BF16_RNE}({code}).to(tl.bfloat16)"
    store_tile(root, em, f"{out}_out", ix.add(ix.mul(ix.IVar("rows"), ix.const(K)),
                                              ix.IVar("cols")), Val(code, x.deps, "bf16"))
    b.finish(em, name, [out], {"BLOCK_R": BR, "BLOCK_C": BC}, root.lines,
             f"(triton.cdiv({M}, {BR}), triton.cdiv({K}, {BC}))", 4,
             comment=f"{op.name}'s A ({M} x {K}) cast to bf16 for the TMA GEMM's descriptor",
             out_params={out: f"{out}_out"})
    b.kernels[-1].shared = True        # its copy: a function of A alone


def _emit_gemm_tma(b: Builder, shape: RegionShape, outputs: list[str], config: dict,
                   name: str, fuse_rows: bool, split_k: int = 1) -> None:
    """A persistent GEMM: min(tiles, SMs) programs walk the output tiles in grouped order; A
    (the cast pass's bf16 copy) and B (the bf16 weight [N, K]) arrive through in-kernel TMA
    descriptors, num_stages deep; fp32 accumulation; the region's epilogue on the tile, stored
    with masked tl.store. split_k > 1 (bf16 operands, no partner, row reduction or column
    parts): the programs walk (K slice, tile) units, each K slice every split_k-th BLOCK_K
    step of K, and store their fp32 partial products into the workspace `<product>_tmp`
    [split_k, M, N]; the epilogue kernel sums the slices (as the pointer kernel's split-K)."""
    spec, target, con = b.spec, b.target, shape.contraction
    op = con.op
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    BM, BN, BK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if fuse_rows and BN < N:
        raise CannotGenerate("fused row reductions need BLOCK_N >= N")
    scheme = config.get("input_precision")
    if not tma_eligible(spec, target, b.precision, shape, scheme):
        raise CannotGenerate(f"{op.name}: the TMA kernel takes 2-D bf16, fp16x1, fp16x3 or "
                             "tf32 products of a K-major weight with K % 8 == 0")
    if split_k > 1 and (scheme is not None or b.precision != "bf16" or fuse_rows
                        or shape.partner is not None or config.get("N_PARTS", 1) > 1
                        or config.get("PAIRED")):
        raise CannotGenerate(f"{op.name}: split-K on the TMA kernel takes bf16 operands, "
                             "one product and no fused row reduction")
    bf16_ops = b.precision == "bf16" and not scheme
    weight = weight_source(spec, op.operands[con.b], widened=bf16_ops)
    # bf16: the cast pass's copy; fp16x1 / fp16x3: the split's planes ([hi, lo]: rows M..2M-1
    # of the descriptor hold lo; a hi tile past M reads lo rows into output rows past M, which
    # are not stored)
    a16 = f"{op.results[0]}_a16"
    planes = 2 if scheme == FP16X3 else 1
    tf32 = b.precision == "tf32" and scheme == tf32_scheme(target)
    if tf32:                            # A itself, fp32, where it lies
        a16 = op.operands[con.a]
    elif bf16_ops and bf16_a_source(spec, con):     # a bf16 model's activation, where it lies
        a16 = bf16_a_source(spec, con)
    # the epilogue in column slices of EPI_N (epi_slices of them), as tma2's: the epilogue's
    # values are [BLOCK_M, EPI_N] at a time, beside the accumulator (sm_90 cross-compile of
    # the suite's 43 TMA GEMM regions under tf32, 42 at 128x256x64: whole-tile epilogues took
    # 193-255 registers and 6 of them spilled 64-792 bytes, which made the spill screen pass
    # over the tile; in 4 slices 162-244 registers, none spilled), and each slice's store
    # converts a slice, not the tile, through shared memory (a fused row reduction needs the
    # whole row: one slice)
    partial = bool(b.gemm_partials)
    if partial and (split_k > 1 or shape.partner is not None or config.get("N_PARTS", 1) > 1):
        raise CannotGenerate("partial row reductions: one product, no split-K or column parts")
    epi_slices = 1 if fuse_rows or partial or split_k > 1 else config.get("EPI_SPLIT", 1)
    # N_PARTS (fp16x3): the tile's columns in parts, each with its own accumulator and its own
    # fresh `part` a K step, sharing the step's A tiles. A 128 x 256 tile reads A's two planes
    # once for 256 columns instead of twice for two 128-column tiles, with the registers of
    # two 128 x 128 accumulators and one `part` (one 128 x 256 accumulator and a part of its
    # size would not fit): the operand traffic a product drops by a quarter. The epilogue
    # then runs on the parts as its slices.
    n_parts = config.get("N_PARTS", 1)
    if n_parts > 1:
        if scheme != FP16X3 or fuse_rows or n_parts != 2:
            raise CannotGenerate("N_PARTS: 2 parts of an fp16x3 tile without a fused row "
                                 "reduction")
        epi_slices = n_parts
    if epi_slices not in (1, 2, 4) or BN % (epi_slices * 16):
        raise CannotGenerate(f"EPI_SPLIT {epi_slices}: 1, 2 or 4 slices of at least 16 of the "
                             f"tile's {BN} columns")
    epi_n = "BLOCK_N" if epi_slices == 1 else "EPI_N"
    # a partner (SwiGLU's gate beside its up projection): prepare_weights interleaves the two
    # weights' rows in blocks of HALF = BLOCK_N / 2 (paired_weights), so that one tile's
    # product holds HALF columns of this product and the same HALF columns of the partner's,
    # read through one descriptor by the kernel's one dot; the epilogue's slices in the first
    # half are this product's, those in the second the partner's, bound where the region reads
    # the partner's result
    partner = shape.partner
    weight_p = None
    if partner is not None:
        if n_parts > 1 or tf32 or scheme not in (None, FP16X1) or fuse_rows \
                or epi_slices < 2 or N % (BN // 2):
            raise CannotGenerate("a partner product: bf16 or fp16x1 operands, one column part, "
                                 "no fused row reduction, 2 or 4 slices, N a multiple of "
                                 "BLOCK_N / 2")
        if not partner_fits_tma(b, partner, scheme):
            raise CannotGenerate(f"{partner.op.name}: the partner's weight does not fit TMA")
        weight_p = weight_source(spec, partner.op.operands[partner.b], widened=bf16_ops)
    b.descriptor_args.update({a16, weight, weight_p} & {a.name for a in spec.args})
    kvars = {"rm": KVar("rm", "rm < %d" % M if M % BM else None, ("BLOCK_M", "1")),
             "rn": KVar("rn", "rn < %d" % N if N % BN else None, ("1", epi_n))}
    columns = ColumnSpace("rn", N, "[BLOCK_M, BLOCK_N]") if fuse_rows or partial else None
    em = b.emitter(kvars, columns)
    em.raw_partials = partial
    em.loads.setdefault(a16, set()).add("dot")
    em.loads.setdefault(weight, set()).add("dot")       # bf16 / fp16 from prepare_weights
    if weight_p is not None:
        pair_weights(b, em, op, partner, weight, weight_p, BN, N, K)
    if scheme in FP16_SCHEMES:
        em.loads.setdefault(f"{op.results[0]}_as", set()).add("other")
        b.fp16_weights[weight] = ((0,), planes)         # [hi (, lo) plane, column exponents]
        if weight_p is not None:
            b.fp16_weights[weight_p] = ((0,), planes)
    top = Scope(None)
    tiles = -(-M // BM) * (N // (BN // 2) if weight_p is not None else -(-N // BN))
    programs = max(1, min(tiles * split_k, target.compute_units))
    top.emit("pid = tl.program_id(0)")
    top.emit(f"num_pid_m = ({M} + BLOCK_M - 1) // BLOCK_M")
    if weight_p is not None:        # a tile: BLOCK_N / 2 output columns of each product
        top.emit(f"num_pid_n = {N} // (BLOCK_N // 2)")
    else:
        top.emit(f"num_pid_n = ({N} + BLOCK_N - 1) // BLOCK_N")
    top.emit("group = GROUP_M * num_pid_n")
    top.emit(f"a_desc = tl.make_tensor_descriptor({em.pointers[a16]}, shape=[{planes * M}, "
             f"{K}], strides=[{K}, 1], block_shape=[BLOCK_M, BLOCK_K])")
    w_rows = "BLOCK_N" if n_parts == 1 else "EPI_N"
    w_n = 2 * N if weight_p is not None else planes * N     # paired: both weights' rows
    top.emit(f"w_desc = tl.make_tensor_descriptor({em.pointers[weight]}, shape=[{w_n}, "
             f"{K}], strides=[{K}, 1], block_shape=[{w_rows}, BLOCK_K])"
             + (f"  # {weight}'s rows and {weight_p}'s, interleaved by BLOCK_N / 2"
                if weight_p is not None else ""))
    # FLATTEN: one software pipeline over (tile, K step), the next tile's loads in flight
    # during this tile's epilogue (tma2's); else only the K loop is pipelined. Flattened, the
    # epilogue's store takes a buffer of the slice it converts beside the stages (sm_90
    # cross-compile, 128x256x64: whole tile and 3 stages 278552 bytes of shared memory against
    # the H200's 232448; 4 slices and 4 stages 229408; K loop alone, 4 stages, 196640)
    top.emit("# persistent: NUM_SMS programs walk the tiles in grouped order (GROUP_M row tiles "
             "share their B tiles in L2)")
    pipe = "flatten=True" if config.get("FLATTEN") else "num_stages=1"
    if split_k > 1:
        # units of (K slice, tile): the programs that run at once take neighbouring tiles of
        # one K slice (their A and B blocks shared in L2)
        units = f"num_pid_m * num_pid_n * {split_k}"
        tile = Scope(top, binds={"rm", "rn"}, depth=2,
                     header=f"for unit in tl.range(pid, {units}, NUM_SMS, {pipe}):")
        tile.emit("pid_k = unit // (num_pid_m * num_pid_n)")
        tile.emit("tile = unit % (num_pid_m * num_pid_n)")
    else:
        tile = Scope(top, binds={"rm", "rn"} if epi_slices == 1 else {"rm"}, depth=2,
                     header=f"for tile in tl.range(pid, num_pid_m * num_pid_n, NUM_SMS, {pipe}):")
    em.root = tile
    _emit_grouped_tile(tile, "tile")
    tile.emit("rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
    if epi_slices == 1:
        tile.emit("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    parts = [f"acc_{j}" for j in range(n_parts)] if n_parts > 1 else ["acc"]
    for a in parts:
        tile.emit(f"{a} = tl.full([BLOCK_M, {w_rows}], 0.0, tl.float32)")
    loop = Scope(tile, depth=3, header=f"for k0 in range(pid_k * BLOCK_K, {K}, BLOCK_K * "
                 f"{split_k}):" if split_k > 1 else f"for k0 in range(0, {K}, BLOCK_K):")
    if scheme == FP16X3:
        loop.emit("a_hi = a_desc.load([pid_m * BLOCK_M, k0])  # A's hi plane, zero past K")
        loop.emit(f"a_lo = a_desc.load([{M} + pid_m * BLOCK_M, k0])  # its lo plane")
        opts = ', input_precision="ieee"' if target.interpreter else ""
        # per column part (one, or N_PARTS sharing A's planes): the three products into a
        # fresh `part`, added to its accumulator in exact fp32 (as the pointer kernel's fp16x3
        # step: chaining all of K in the tensor core's accumulator truncates)
        for j, a in enumerate(parts):
            col = "pid_n * BLOCK_N" + (f" + {j} * EPI_N" if n_parts > 1 else "")
            if n_parts > 1:
                loop.emit(f"# columns [{j} * EPI_N, {j + 1} * EPI_N)")
            loop.emit(f"w_hi = w_desc.load([{col}, k0]).T  # {weight}'s hi plane [N, K]")
            loop.emit(f"w_lo = w_desc.load([{N} + {col}, k0]).T  # its lo plane")
            if target.interpreter:          # fp16 values, fp32 products
                for v in ("a_hi", "a_lo", "w_hi", "w_lo")[2 if j else 0:]:
                    loop.emit(f"{v} = {v}.to(tl.float32)")
            loop.emit(f"part = tl.dot(a_lo, w_hi{opts})")
            loop.emit(f"part = tl.dot(a_hi, w_lo, part{opts})")
            loop.emit(f"part = tl.dot(a_hi, w_hi, part{opts})")
            loop.emit(f"{a} += part  # {op.name}")
    elif tf32:
        loop.emit("a = a_desc.load([pid_m * BLOCK_M, k0])  # fp32, zero past M and K")
        loop.emit(f"w = w_desc.load([pid_n * BLOCK_N, k0])  # {weight} [N, K] fp32 tile")
        loop.emit(f"acc = tl.dot(a, w.T, acc, input_precision=\"{scheme}\")  # {op.name}")
    else:
        loop.emit("a = a_desc.load([pid_m * BLOCK_M, k0])  # zero past M and K")
        loop.emit(f"w = w_desc.load([pid_n * BLOCK_N, k0])  # {weight} [N, K] tile, zero past "
                  "N, K")
        if target.bf16_dot_ok:
            loop.emit(f"acc = tl.dot(a, w.T, acc)  # {op.name}")
        else:               # the interpreter: 16-bit values, fp32 products
            loop.emit(f"acc = tl.dot(a.to(tl.float32), w.T.to(tl.float32), acc)  # {op.name}")
    loop.close()
    if scheme in FP16_SCHEMES:
        tile.emit("# undo the power-of-two operand scales (exact): A's row scales, the "
                  "weight's column exponents (stored after its plane)")
        tile.emit(f"s_a = tl.load({em.pointers[f'{op.results[0]}_as']} + rm"
                  + (f", mask=rm < {M}, other=1.0)" if M % BM else ")"))
    tile_index = output_tile_index(con)
    if split_k > 1:
        # the K slice's partial product into the workspace; the epilogue kernel sums them
        _store_split_k_slice(b, em, tile, op.results[0], M * N, tile_index,
                             Val("acc", frozenset({"rm", "rn"}), "f32"))
        tile.close()
        b.tma = True
        _finish_split_k(b, em, name, op.results[0], top.lines, config,
                        {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK,
                         "GROUP_M": config["GROUP_M"], "NUM_SMS": programs}, f"({programs},)",
                        f"split-K partial products ({split_k} slices of K={K}) of {op.name} "
                        f"M={M} N={N}; persistent, operands by TMA (bf16)")
        return
    tma_out = _tma_store_outputs(b, top, con, tile_index, outputs, epi_n) \
        if config.get("TMA_STORE") else {}
    accs = parts
    if epi_slices > len(accs):
        tile.emit(f"# the epilogue in {epi_slices} column slices of EPI_N (halves of halves: "
                  "reshape, permute, split)")
    lines, accs = split_slices(accs, epi_slices)
    for line in lines:
        tile.emit(line)
    accs_p = []
    if weight_p is not None:        # the second half's slices: the partner's product
        accs, accs_p = accs[:epi_slices // 2], accs[epi_slices // 2:]
    tile_index_p = output_tile_index(partner) if weight_p is not None else None
    for i, a in enumerate(accs):
        part = tile
        first = "pid_n * BLOCK_N" if weight_p is None else "pid_n * (BLOCK_N // 2)"
        if epi_slices > 1:
            part = Scope(tile, binds={"rn"}, depth=2,
                         header=f"# columns [{i} * EPI_N, {i + 1} * EPI_N) of the tile")
            part.emit(f"rn = {first} + {i} * EPI_N + tl.arange(0, EPI_N)[None, :]")
        if scheme in FP16_SCHEMES and weight_p is None:
            part.emit(f"e_b = tl.load({em.pointers[weight]} + {planes * N * K} + rn"
                      + (f", mask=rn < {N}, other=0.0)" if N % BN else ")") + ".to(tl.int32)")
            part.emit(f"{a} = {a} * s_a * {POW2_COLUMN.format(ns='tl')}")
        elif scheme in FP16_SCHEMES:
            # the paired weight's column exponents, interleaved as its rows: this product's
            # at the tile's first half, the partner's at its second
            for acc_name, at in ((a, f"pid_n * BLOCK_N + {i} * EPI_N"),
                                 (accs_p[i], f"pid_n * BLOCK_N + BLOCK_N // 2 + {i} * EPI_N")):
                part.emit(f"e_b = tl.load({em.pointers[weight]} + {2 * N * K} + {at} + "
                          "tl.arange(0, EPI_N)[None, :]).to(tl.int32)")
                part.emit(f"{acc_name} = {acc_name} * s_a * {POW2_COLUMN.format(ns='tl')}")
        col = first + (f" + {i} * EPI_N" if epi_slices > 1 else "")
        bound = {}
        if weight_p is not None:
            bound[(partner.op.results[0], tile_index_p)] = Val(
                accs_p[i], frozenset({"rm", "rn"}), "f32")
        _emit_epilogue(b, em, part, con, tile_index, [] if partial else outputs, "f32",
                       frozenset({"rm", "rn"}), acc=a,
                       tma_out={o: (d, col) for o, d in tma_out.items()}, bound=bound,
                       partials=b.gemm_partials)
        if part is not tile:
            part.close()
    tile.close()
    b.tma = True
    fused = "; row reductions fused (one tile spans N)" if fuse_rows else ""
    if partial:
        fused = "; row reductions' partials over the tile's columns"
    constexprs = {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "GROUP_M": config["GROUP_M"],
                  "NUM_SMS": programs}
    if epi_slices > 1:
        constexprs["EPI_N"] = BN // epi_slices
    b.finish(em, name, outputs, constexprs, top.lines,
             f"({programs},)", config["num_warps"], config.get("num_stages"),
             options=target.launch_options(config),
             comment=f"{op.name} M={M} N={N} K={K}; persistent, operands by TMA "
             f"({scheme or 'bf16'}{', fp32 operands as they lie' if tf32 else ''})"
             + f"; epilogue: {ops_comment(spec, em)}{fused}")


def tile_index_of(spec: KernelSpec, vc: str, tile_index: tuple, out: str):
    """The index of `out` that the GEMM tile's element `tile_index` of `vc` becomes, when out
    is vc moved by reshapes (a flat index re-unravelled: [B*S, N] -> [B, S, N]) and elementwise
    generics that read it through a permutation (a head transpose): the epilogue then computes
    `out` on the accumulator tile, and reading it back inlines to the tile itself. None when out
    is no such image of vc (a slice of it, a reduction of it)."""
    todo, seen = [(vc, tile_index)], set()
    while todo:
        v, index = todo.pop()
        if v == out:
            return index
        if v in seen:
            continue
        seen.add(v)
        vshape = tuple(spec.tensor(v).shape)
        for op in spec.users(v):
            if isinstance(op, ReshapeOp):
                rshape = tuple(spec.tensor(op.results[0]).shape)
                todo.append((op.results[0], ix.unravel(ix.ravel(index, vshape), rshape)))
                continue
            if not isinstance(op, GenericOp) or op.reduction_dims:
                continue
            sizes = domain_sizes(spec, op)
            for i in range(op.num_inputs):
                if op.operands[i] != v:
                    continue
                results = op.indexing_maps[i].results
                if not all(isinstance(r, AffineDim) for r in results) or \
                        len({r.d for r in results}) != len(results):
                    continue
                p = {r.d: index[k] for k, r in enumerate(results)}
                if any(d not in p and sizes[d] != 1 for d in op.parallel_dims):
                    continue
                p.update({d: ix.ZERO for d in op.parallel_dims if d not in p})
                for j, res in enumerate(op.results):
                    omap = op.indexing_maps[op.num_inputs + j]
                    todo.append((res, tuple(compose(r, p) for r in omap.results)))
    return None


def gemm_outputs_on_tile(spec: KernelSpec, stage: "RegionShape") -> bool:
    """Whether every store of a GEMM stage is an image of the product's tile (tile_index_of)."""
    con = stage.contraction
    vc = con.op.results[0]
    dummy = tuple(ix.IVar(f"i{k}") for k in range(len(spec.tensor(vc).shape)))
    return all(tile_index_of(spec, vc, dummy, o) is not None for o in stage.stores)


def _fp16x3_step(b: Builder, em: Emitter, con: Contraction, loop: Scope, p_b: dict,
                 row_a: str, col_b: str, kvars: dict, products: int = 3,
                 p_a: dict | None = None) -> list[str]:
    """One K step of fp16x3 (see FP16X3; products=1: fp16x1, the hi planes alone) into `loop`;
    returns the lines that undo the operand scales on the accumulator after the loop.
    `p_a` (fp16x3, config key INSPLIT): A's planes are made in the kernel from its fp32 tile
    (_split_a_in_kernel), with no pass before it."""
    spec, op = b.spec, con.op
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    vc = op.results[0]
    batch = con.extent(con.batch) if con.batch else 1
    kmask = kvars["ka"].mask
    big = 2 * batch * max(M, N) * K >= 2 ** 31

    def plane_loads(side: str, row: str, kvar: str, rows: int):
        planes = f"{vc}_{side}16"
        em.loads.setdefault(planes, set()).add("dot")
        r = f"batch * {rows} + {row}" if con.batch else row
        offs = f"{f'({r}).to(tl.int64)' if big else f'({r})' if con.batch else r} * {K} + {kvar}"
        mask = f", mask={kvars[kvar].mask}, other=0.0)" if kmask else ")"
        ptr = em.pointers[planes]
        loop.emit(f"{side}_hi = tl.load({ptr} + {offs}{mask}")
        if products == 3:
            loop.emit(f"{side}_lo = tl.load({ptr} + {batch * rows * K} + {offs}{mask}")
        em.loads.setdefault(f"{vc}_{side}s", set()).add("other")
        return f"tl.load({em.pointers[f'{vc}_{side}s']} + {r})"

    loop.emit(f"# fp16x{products}: planes of the operands scaled per row / column by powers of two")
    undo = ["# undo the power-of-two operand scales (exact): row scales of A, column scales of B"]
    if p_a is not None:
        if products != 3:
            raise CannotGenerate("INSPLIT: the fp16x3 scheme")
        _split_a_in_kernel(b, em, con, loop, p_a, row_a, kvars)
        sa = None           # A's scale is each step's, undone on its part
    else:
        sa = plane_loads("a", row_a, "ka", M)
    b_weight = weight_source(spec, op.operands[con.b])
    if b_weight is not None:        # hi/lo planes and column exponents from prepare_weights
        em.planes.add(b_weight)
        with em.operand_reads():
            hi = em.body_value(op, p_b, op.body.args[con.b], loop)
        if products == 3:
            with em.operand_reads(plane=1):
                lo = em.body_value(op, p_b, op.body.args[con.b], loop)
        wshape = spec.tensor(b_weight).shape
        index = em.load_index[b_weight]
        n_dims = _fp16x3_weight_dims(index, col_b)
        if n_dims is None:
            raise CannotGenerate(f"{b_weight}: an index mixes K and N; no per-column fp16x3 scale")
        loop.emit(f"b_hi = {_dot_operand(hi, ('kb', col_b), '[BLOCK_K, BLOCK_N]', kmask)}"
                  f"  # {b_weight}'s hi plane (prepare_weights)")
        if products == 3:
            loop.emit(f"b_lo = {_dot_operand(lo, ('kb', col_b), '[BLOCK_K, BLOCK_N]', kmask)}"
                      f"  # {b_weight}'s lo plane")
        n_index = ix.ravel(tuple(index[j] for j in n_dims), tuple(wshape[j] for j in n_dims))
        planes = 2 if products == 3 else 1          # the exponents follow the planes
        tail = ix.add(n_index, ix.const(planes * math.prod(wshape)))
        wide = planes * math.prod(wshape) + math.prod(wshape[j] for j in n_dims) >= WIDE_OFFSETS
        undo.append(f"e_b = tl.load({em.pointers[b_weight]} + {ix.render(tail, wide)})"
                    ".to(tl.int32)  # B's column exponents e - 15 (after its planes)")
        sb = POW2_COLUMN.format(ns="tl")
        b.fp16_weights[b_weight] = (n_dims, planes)
    else:
        sb = plane_loads("b", col_b, "kb", N)
    a_hi, a_lo, b_hi, b_lo = "a_hi", "a_lo", "b_hi", "b_lo"
    opts = ""
    if b.target.interpreter:            # fp16 values, fp32 products (like bf16 there)
        a_hi, a_lo, b_hi, b_lo = (f"{x}.to(tl.float32)" for x in (a_hi, a_lo, b_hi, b_lo))
        opts = ', input_precision="ieee"'
    if products == 1:      # within 1e-2: the tensor core's accumulator carries all of K
        loop.emit(f"acc = tl.dot({a_hi}, {b_hi}, acc{opts})  # {op.name}")
        return undo + [f"acc = acc * {sa} * {sb}"]
    # each step's three products go to a fresh `part`, added to acc in exact fp32 (chaining
    # all of K in the tensor core's accumulator truncates; NOTES.md run 1)
    loop.emit(f"part = tl.dot({a_lo}, {b_hi}{opts})")
    loop.emit(f"part = tl.dot({a_hi}, {b_lo}, part{opts})")
    loop.emit(f"part = tl.dot({a_hi}, {b_hi}, part{opts})")
    if sa is None:          # (INSPLIT) the step's A scale undone on its part (exact)
        loop.emit(f"acc += part * a_unscale  # {op.name}")
        return undo + [f"acc = acc * {sb}"]
    loop.emit(f"acc += part  # {op.name}")
    return undo + [f"acc = acc * {sa} * {sb}"]


def _split_a_in_kernel(b: Builder, em: Emitter, con: Contraction, loop: Scope, p_a: dict,
                       row_a: str, kvars: dict) -> None:
    """fp16x3's A planes made in the kernel (config key INSPLIT) from the fp32 [BLOCK_M,
    BLOCK_K] tile it loads, in place of the split pass: each row of the tile scaled by the
    power of two that the pass takes for the whole row (POW2_EXPONENT), but from this K
    step's values alone, so no value is scaled less than the pass would scale it; the step's
    `part` is multiplied back by it (exact). The kernel reads 4 bytes an element of A, as the
    two planes are; the pass's read and write of A are gone. Emits `a_hi`, `a_lo` and
    `a_unscale` into `loop`."""
    op = con.op
    with em.operand_reads():
        a = em.body_value(op, p_a, op.body.args[con.a], loop)
    if a.dtype != "f32":
        raise CannotGenerate("INSPLIT: an fp32 A")
    b.combiners.setdefault("_maxnum", None)
    loop.emit("# A's fp16 hi/lo planes in the kernel, each row of the step scaled by a power of "
              "two: |a * 2**(15 - e)| < 2**15")
    loop.emit(f"a = {_dot_operand(a, (row_a, 'ka'), '[BLOCK_M, BLOCK_K]', kvars['ka'].mask)}")
    loop.emit("amax = tl.reduce(tl.abs(a), 1, _maxnum, keep_dims=True)")
    for line in POW2_EXPONENT:
        loop.emit(line)
    loop.emit(f"a = a * {POW2_SCALE}")
    loop.emit("a_hi = a.to(tl.float16)")
    loop.emit("a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)")
    loop.emit(f"a_unscale = {POW2_UNSCALE}   # 2**(e - 15)")


def _dot_operand(v: Val, axes, tile: str, kmask: str | None) -> str:
    """A full [rows, K] / [K, cols] tile, zero past K (a K-masked load already is)."""
    code = v.code
    if not all(a in v.deps for a in axes):
        code = f"tl.broadcast_to({code}, {tile})"
    kvar = axes[0] if axes[0] in ("ka", "kb") else axes[1]
    if kmask and not (v.zero_masked and kvar in v.deps):
        code = f"tl.where({kmask}, {code}, 0.0)"
    return code


def _gemm_grid(M, N, BM, BN, batch, split_k) -> str:
    dims = [f"triton.cdiv({M}, {BM}) * triton.cdiv({N}, {BN})"]
    if batch is not None:
        dims.append(str(batch))
    if split_k > 1:
        dims.append(str(split_k))
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
