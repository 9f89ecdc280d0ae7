"""Region analysis and kernel templates of the builtin generator.

A region becomes one or two Triton kernels of three kinds:

* elementwise: one program per BLOCK of output elements (a flat index unravelled per tensor);
* rows: one program per BLOCK_R rows; reductions over the trailing BLOCK_C columns, in one block
  or looped over column blocks when rows are long;
* gemm: a tiled contraction (grouped tile order, optional split-K) with the region's
  elementwise consumers fused on the accumulator tile, and row reductions over N fused when one
  tile spans the row (else a second, rows kernel reads the materialized product); under strict
  with fp16x3, pass kernels first write the operands' power-of-two-scaled fp16 hi/lo planes
  (weights are split once by prepare_weights instead).

`generate_source(spec, target, precision, config)` returns the candidate's Python source.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.emitter import (BF16_RNE, TL_DTYPES, TORCH_DTYPES, WIDE_OFFSETS,
                                              CannotGenerate, ColumnSpace, Emitter, KVar, Scope,
                                              Val, combine_function, compose, domain_sizes)
from kforge.reference import recognize_contraction
from kforge.spec import AffineDim, GenericOp, KernelSpec, ReshapeOp, affine_dims

# the blocks a rows kernel's variables span (rows: [BLOCK_R, 1], cols: [1, BLOCK_C])
ROW, COL = ("BLOCK_R", "1"), ("1", "BLOCK_C")

# ---------------------------------------------------------------------------------------------
# Region analysis
# ---------------------------------------------------------------------------------------------
@dataclass
class Contraction:
    op: GenericOp
    a: int                       # operand index of the tile-row (M) operand
    b: int
    batch: list[int]
    m: list[int]
    n: list[int]
    k: list[int]
    sizes: list[int]

    def extent(self, dims) -> int:
        return math.prod(self.sizes[d] for d in dims)


@dataclass
class RegionShape:
    """One stage of a region: the ops one kernel (or a GEMM and its rows kernel) computes.

    A region is cut into stages at its boundary ops, in program order: a contraction starts a
    stage, and so does a reduction of another shape than the current stage's. Everything
    elementwise is recomputed (inlined) wherever it is needed; only boundary results that a
    later stage reads are materialized (`materialize`)."""
    kind: str                                    # elementwise | rows | gemm
    outputs: list[str]                           # region results this stage stores
    contraction: Contraction | None = None
    reductions: list[GenericOp] = field(default_factory=list)
    rows: int = 0                                # reductions: rows x cols each
    cols: int = 0
    materialize: list[str] = field(default_factory=list)
    stages: list["RegionShape"] = field(default_factory=list)   # on the first stage: all

    @property
    def stores(self) -> list[str]:
        return list(dict.fromkeys(self.outputs + self.materialize))


def _needed_ops(spec: KernelSpec):
    needed = set(spec.results)
    ops = []
    for op in reversed(spec.ops):
        if any(r in needed for r in op.results):
            ops.append(op)
            needed.update(op.operands)
    return list(reversed(ops))


def _contraction(spec: KernelSpec, op: GenericOp) -> Contraction | None:
    con = recognize_contraction(op, projected=False)
    if con is None:
        return None
    body = op.body
    ia, ib = body.args.index(con[0]), body.args.index(con[1])
    maps = op.indexing_maps
    da = set().union(*(affine_dims(r) for r in maps[ia].results))
    db = set().union(*(affine_dims(r) for r in maps[ib].results))
    out = [r.d for r in maps[2].results]
    sizes = domain_sizes(spec, op)
    batch = [d for d in out if d in da and d in db]
    m = [d for d in out if d in da and d not in db]
    n = [d for d in out if d in db and d not in da]
    k = list(op.reduction_dims)
    if set(batch + m + n) != set(out) or set(batch + m + n + k) != set(range(len(sizes))):
        raise CannotGenerate(f"{op.name}: not a batched contraction")
    if any(d not in da or d not in db for d in k):
        raise CannotGenerate(f"{op.name}: a reduction dim missing from one operand")
    # the operand whose own dims lead the output supplies the tile rows (coalesced stores)
    if m and n and out.index(n[0]) < out.index(m[0]):
        ia, ib, m, n = ib, ia, n, m
    order = [d for r in maps[ia].results for d in sorted(affine_dims(r)) if d in k]
    k = list(dict.fromkeys(order + k))
    return Contraction(op, ia, ib, batch, m, n, k, sizes)


# How finely analyze_region cuts a region with row reductions; the provider's region_shape
# takes the first that the emitter generates for some configuration: FUSED (a GEMM's reductions
# on its tile or in its rows kernel), SPLIT (the reductions in a rows stage of their own,
# reading the stored product), NARROW (besides, rows stages store only one value per row; every
# wider output is finished by an elementwise stage from the stored product and those values).
FUSED, SPLIT, NARROW = 0, 1, 2


def analyze_region(spec: KernelSpec, cut: int = FUSED) -> RegionShape:
    """Cut the region into stages (see RegionShape); returns the first, with `.stages` all of
    them. Raises CannotGenerate when no template fits. `cut`: FUSED, SPLIT or NARROW (above)."""
    ops = _needed_ops(spec)
    results = [r for r in dict.fromkeys(spec.results) if spec.producer(r) is not None]
    for r in results:
        if any(s is None for s in spec.tensor(r).shape):
            raise CannotGenerate(f"{r} has a dynamic shape")
    stages = [RegionShape("elementwise", [])]
    stage_of: dict[str, int] = {}
    boundary: set[str] = set()
    for op in ops:
        cur = stages[-1]
        if isinstance(op, GenericOp) and op.reduction_dims:
            con = _contraction(spec, op)
            if con is not None and spec.tensor(op.results[0]).dtype.startswith(("f", "b")):
                if cur.contraction is not None or cur.reductions:
                    cur = RegionShape("gemm", [])
                    stages.append(cur)
                cur.kind, cur.contraction = "gemm", con
            else:
                sizes = domain_sizes(spec, op)
                r = math.prod(sizes[d] for d in op.parallel_dims)
                c = math.prod(sizes[d] for d in op.reduction_dims)
                if (cur.reductions and (cur.rows, cur.cols) != (r, c)) or (
                        cut >= SPLIT and cur.contraction is not None):
                    cur = RegionShape("rows", [])
                    stages.append(cur)
                if not cur.reductions:
                    cur.rows, cur.cols = r, c
                if cur.kind == "elementwise":
                    cur.kind = "rows"
                cur.reductions.append(op)
            boundary.update(op.results)
        for res in op.results:
            stage_of[res] = len(stages) - 1
    # an output its stage cannot store from its tile (a slice of a normalized row: Qwen3's
    # per-head q/k norm followed by RoPE's rotate_half halves) is computed by an elementwise
    # stage after the others, which recomputes it from their materialized boundary values
    tail = RegionShape("elementwise", [])
    for r in results:
        stage = stages[stage_of[r]]
        (stage if _storable(spec, stage, r, cut) else tail).outputs.append(r)
    if tail.outputs:
        stages.append(tail)
        for r in tail.outputs:
            stage_of[r] = len(stages) - 1
    # what each stage reads from earlier ones: walk back from its stores through everything
    # it recomputes, stopping at earlier boundary results (those are materialized)
    for j in reversed(range(len(stages))):
        seen: set[str] = set()
        todo = list(stages[j].stores)
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            op = spec.producer(v)
            if op is None:
                continue
            i = stage_of.get(v, j)
            if v in boundary and i < j:
                if v not in stages[i].materialize:
                    stages[i].materialize.append(v)
                continue
            todo.extend(op.operands)
    stages = [st for st in stages if st.stores]
    if not stages:
        raise CannotGenerate("the region computes nothing")
    first = stages[0]
    first.stages = stages
    return first


def _storable(spec: KernelSpec, stage: RegionShape, value: str, cut: int = FUSED) -> bool:
    """Whether `stage`'s kernel can store `value` from its tile: a stage with row reductions
    one value per row or (but under NARROW) a whole row (see _emit_rows)."""
    shape = spec.tensor(value).shape
    numel = math.prod(shape)
    if not stage.reductions:
        return True      # a GEMM stage without them finishes moved outputs itself (_epilogues)
    return numel == stage.rows or (cut < NARROW and numel == stage.rows * stage.cols and
                                   _row_index(shape, stage.rows, stage.cols) is not None)


def problem_of(spec: KernelSpec, shape: RegionShape) -> dict:
    """Sizes that configuration spaces depend on."""
    if shape.kind == "gemm":
        c = shape.contraction
        n = c.extent(c.n)
        full_rows = bool(shape.reductions) and shape.cols == n
        return {"M": c.extent(c.m), "N": n, "K": c.extent(c.k), "batch": c.extent(c.batch),
                "full_rows": full_rows, "reductions": bool(shape.reductions),
                "rows": shape.rows, "cols": shape.cols}
    if shape.kind == "rows":
        return {"rows": shape.rows, "cols": shape.cols}
    return {"numel": max(math.prod(spec.tensor(o).shape) for o in shape.stores)}


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
@dataclass
class Kernel:
    name: str
    params: list[str]                 # pointer parameters, in call order
    tensors: list[str]                # the launch-side tensor expression for each parameter
    constexprs: dict                  # name -> value
    lines: list[str]
    grid: str
    num_warps: int
    num_stages: int | None = None
    comment: str = ""
    options: dict = field(default_factory=dict)     # backend launch keywords (xpu: grf_mode)

    def source(self) -> str:
        sig = ", ".join(self.params + [f"{k}: tl.constexpr" for k in self.constexprs])
        head = [f"@triton.jit", f"def {self.name}({sig}):"]
        if self.comment:
            head.append(f'    """{self.comment}"""')
        return "\n".join(head + self.lines) + "\n"

    def call(self) -> str:
        args = ", ".join(self.tensors + [f"{k}={v!r}" for k, v in self.constexprs.items()])
        opts = f", num_warps={self.num_warps}"
        if self.num_stages is not None:
            opts += f", num_stages={self.num_stages}"
        opts += "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{self.name}[{self.grid}]({args}{opts})"


class _Builder:
    """Shared bookkeeping for one region's kernels: pointer names, loads, emitters."""

    def __init__(self, spec: KernelSpec, target, precision: str):
        self.spec = spec
        self.target = target
        self.precision = precision
        self.kernels: list[Kernel] = []
        self.temporaries: dict[str, str] = {}       # value -> allocation expression
        self.split_sums: dict[str, int] = {}
        self.dot_loads: dict[str, set] = {}
        self.split_weights: set[str] = set()         # weights stored as tf32 hi/lo planes
        # fp16x3 / fp16x1 weights -> (their output-column dims, planes: 2 hi + lo, 1 hi alone)
        self.fp16_weights: dict[str, tuple[tuple, int]] = {}
        self.combiners: dict[str, None] = {}         # reduction combine functions to define
        self.math_used = False
        self.tma = False                             # in-kernel TMA descriptors

    def snapshot(self) -> dict:
        """The bookkeeping so far, to undo a kernel that could not be generated."""
        return copy.deepcopy({k: v for k, v in vars(self).items()
                              if k not in ("spec", "target")})

    def restore(self, saved: dict) -> None:
        vars(self).update(saved)

    def pointers(self, extra: dict | None = None) -> dict[str, str]:
        ptrs = {a.name: a.name for a in self.spec.args}
        ptrs.update({v: f"{v}_tmp" for v in self.temporaries})
        ptrs.update(extra or {})
        return ptrs

    def emitter(self, kvars, columns=None) -> Emitter:
        em = Emitter(self.spec, self.target, kvars, self.pointers(), columns)
        em.split_sums = self.split_sums
        return em

    def finish(self, em: Emitter, name: str, outputs: list[str], constexprs: dict, lines,
               grid: str, num_warps: int, num_stages=None, comment: str = "",
               out_params: dict | None = None, options: dict | None = None) -> Kernel:
        for t, how in em.loads.items():
            self.dot_loads.setdefault(t, set()).update(how)
        self.math_used |= em.math_used
        self.combiners.update(em.combiners_used)
        loaded = [a.name for a in self.spec.args if a.name in em.loads]
        loaded += [v for v in self.temporaries if v in em.loads]
        params = [em.pointers[t] for t in loaded]
        tensors = list(loaded)
        for o in outputs:
            params.append((out_params or {}).get(o, f"{o}_out"))
            tensors.append(o)
        k = Kernel(name, params, tensors, constexprs, lines, grid, num_warps, num_stages,
                   comment, dict(options or {}))
        self.kernels.append(k)
        return k

    def store(self, scope: Scope, em: Emitter, out: str, ptr: str, index: tuple, val: Val):
        store_tile(scope, em, ptr, ix.ravel(index, self.spec.tensor(out).shape), val)


def store_tile(scope: Scope, em: Emitter, ptr: str, offset: ix.Index, val: Val) -> None:
    """Store `val` at `ptr + offset`, masked to the kernel variables of both: a value that
    varies along a variable the offset does not (an N = 1 product's [BLOCK_M, BLOCK_N] tile
    stored at rm alone) is stored once, from its in-bounds elements, through a pointer
    broadcast to its block."""
    over = ix.variables(offset) | {v for v in val.deps if v in em.kvars}
    mask = em.mask_of(over)
    addr = em.address(ptr, offset, over)
    scope.emit(f"tl.store({addr}, {val.code}" + (f", mask={mask})" if mask else ")"))


def _ops_comment(spec: KernelSpec, em: Emitter | None = None) -> str:
    names = list(em.ops_used) if em is not None else [
        op.name for op in spec.ops if isinstance(op, GenericOp)]
    return ", ".join(n for n in dict.fromkeys(names) if n != "linalg.fill") or "copy"


def build_elementwise(b: _Builder, outputs: list[str], config: dict, name: str) -> None:
    sizes = {o: math.prod(b.spec.tensor(o).shape) for o in outputs}
    if len(set(sizes.values())) > 1:     # one launch covers one domain: the rest go unwritten
        raise CannotGenerate(f"{name}: one elementwise kernel for outputs of different sizes "
                             f"({', '.join(f'{o}: {n}' for o, n in sizes.items())})")
    numel = sizes[outputs[0]]
    with ix.ranges({"offs": (0, numel)}):
        _emit_elementwise(b, outputs, config, name)


def _emit_elementwise(b: _Builder, outputs: list[str], config: dict, name: str) -> None:
    spec = b.spec
    numel = math.prod(spec.tensor(outputs[0]).shape)
    BLOCK = config["BLOCK"]
    mask = "mask" if numel % BLOCK else None
    kvars = {"offs": KVar("offs", mask, ("BLOCK",))}
    em = b.emitter(kvars)
    root = Scope(None, binds={"offs"})
    em.root = root
    start = "pid.to(tl.int64) * BLOCK" if numel >= 2 ** 31 else "pid * BLOCK"
    root.emit("pid = tl.program_id(0)")
    root.emit(f"offs = {start} + tl.arange(0, BLOCK)")
    if mask:
        root.emit(f"mask = offs < {numel}")
    for o in outputs:
        index = ix.unravel(ix.IVar("offs"), spec.tensor(o).shape)
        val = em.value(o, index, root)
        root.emit(f"# {o}: {spec.tensor(o).dtype}{list(spec.tensor(o).shape)}")
        b.store(root, em, o, f"{o}_out", index, val)
    b.finish(em, name, outputs, {"BLOCK": BLOCK}, root.lines,
             f"(triton.cdiv({numel}, {BLOCK}),)", config["num_warps"],
             comment=f"elementwise over {numel} elements: {_ops_comment(spec, em)}")


def _row_index(shape, rows: int, cols: int):
    """The index of a [rows x cols]-shaped tensor element at (rows, cols): shape is
    [row dims..., one dim split as q row groups x r columns, column dims...], e.g. [M, N] seen
    as M*G rows of N/G columns for a group norm. None when the shape does not split so."""
    R, C = ix.IVar("rows"), ix.IVar("cols")
    for j in range(len(shape)):
        outer = math.prod(shape[:j])
        if rows % outer:
            continue
        q = rows // outer
        if shape[j] % q or (shape[j] // q) * math.prod(shape[j + 1:]) != cols:
            continue
        r = shape[j] // q
        inner = ix.unravel(C, (r,) + tuple(shape[j + 1:]))
        mid = ix.add(ix.mul(ix.mod(R, ix.const(q)), ix.const(r)), inner[0])
        return ix.unravel(ix.floordiv(R, ix.const(q)), shape[:j]) + (mid,) + inner[1:]
    return None


def build_rows(b: _Builder, outputs: list[str], rows: int, cols: int, config: dict,
               name: str) -> None:
    with ix.ranges({"rows": (0, rows), "cols": (0, cols)}):
        _emit_rows(b, outputs, rows, cols, config, name)


def _emit_rows(b: _Builder, outputs: list[str], rows: int, cols: int, config: dict,
               name: str) -> None:
    spec = b.spec
    BR, BC = config["BLOCK_R"], config["BLOCK_C"]
    looped = BC < cols
    row_mask = "row_mask" if rows % BR else None
    col_mask = "col_mask" if (looped or cols % BC) else None
    kvars = {"rows": KVar("rows", row_mask, ROW), "cols": KVar("cols", col_mask, COL)}
    columns = ColumnSpace("cols", cols, "[BLOCK_R, BLOCK_C]", "BLOCK_C", looped)
    em = b.emitter(kvars, columns)
    root = Scope(None, binds={"rows"} if looped else {"rows", "cols"})
    em.root = root
    root.emit("pid = tl.program_id(0)")
    root.emit("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    if row_mask:
        root.emit(f"row_mask = rows < {rows}")
    if not looped:
        root.emit("cols = tl.arange(0, BLOCK_C)[None, :]")
        if col_mask:
            root.emit(f"col_mask = cols < {cols}")
    wide, narrow = [], []
    for o in outputs:
        shape = spec.tensor(o).shape
        numel = math.prod(shape)
        if numel == rows * cols and _row_index(shape, rows, cols) is not None:
            wide.append(o)
        elif numel == rows:
            narrow.append(o)
        else:
            raise CannotGenerate(f"{o} is neither one value per row nor a row of {cols}")
    for o in narrow:
        shape = spec.tensor(o).shape
        index = ix.unravel(ix.IVar("rows"), shape)
        val = em.value(o, index, root)
        b.store(root, em, o, f"{o}_out", index, val)
    scope = root
    if looped and wide:
        scope = Scope(root, binds={"cols"}, depth=2,
                      header=f"for c0 in range(0, {cols}, BLOCK_C):")
        scope.emit("cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        scope.emit(f"col_mask = cols < {cols}")
    for o in wide:
        index = _row_index(spec.tensor(o).shape, rows, cols)
        val = em.value(o, index, scope)
        b.store(scope, em, o, f"{o}_out", index, val)
    if scope is not root:
        scope.close()
    how = "looped over column blocks" if looped else "one block per row"
    b.finish(em, name, outputs, {"BLOCK_R": BR, "BLOCK_C": BC}, root.lines,
             f"(triton.cdiv({rows}, {BR}),)", config["num_warps"],
             comment=f"{rows} rows of {cols}, {how}: {_ops_comment(spec, em)}")


# ---------------------------------------------------------------------------------------------
# fp16x3: fp32-accurate products on fp16 tensor cores
# ---------------------------------------------------------------------------------------------
# x = s * (hi + lo) with hi = fp16(x / s), lo = fp16(x / s - hi) and s a power of two per row of
# A and per output column of B, chosen so that max |x / s| over the row (column) is below 2**15:
# fp16 cannot overflow (max 65504), and lo (2**-11 below hi) stays far above fp16's subnormals
# for every element that matters to the row's dot products. Three fp16 products per K step
# (lo*hi + hi*lo + hi*hi; lo*lo is below fp32's rounding) run at twice the tf32 rate with tf32's
# 11-bit significands; the scales are undone exactly on the accumulator (benchmarks/gemm/NOTES.md:
# more accurate than cuBLAS fp32, 3.35x eager on the H200). Weights are scaled and split once in
# prepare_weights; activations (A, and B when it is not a weight) by a pass kernel per call that
# writes fp16 [hi, lo] planes K-major plus one fp32 scale per row.
FP16X3 = "fp16x3"
# fp16x1: the same power-of-two-scaled fp16 operands, hi planes only, one product per K step: the
# bf16 rate with fp16's 11-bit significands (operand rounding 8x smaller than bf16's), for
# bf16-policy regions whose output amplifies operand rounding (a norm over the GEMM output
# divides by a small spread) past the 1e-2 tolerance. The scales keep fp16 from overflowing.
FP16X1 = "fp16x1"
FP16_SCHEMES = (FP16X3, FP16X1)


def fp16x3_eligible(spec: KernelSpec, stage: RegionShape) -> bool:
    """fp16x3 applies to fp32 contractions with an fp32 result."""
    if stage.kind != "gemm":
        return False
    op = stage.contraction.op
    return all(spec.tensor(v).dtype == "f32"
               for v in (op.operands[stage.contraction.a], op.operands[stage.contraction.b],
                         op.results[0]))


def gemm_input_precisions(spec: KernelSpec, target, precision: str,
                          stage: RegionShape) -> tuple:
    """The contraction schemes to try under `precision`, best first: the target's list, with
    fp16x3 first on GPUs (measured fastest strict scheme) and last in the interpreter (tested,
    not timed); under bf16 and tf32, fp16x1 first on GPUs wherever its pass pays."""
    schemes = tuple(target.dot_input_precisions(precision))
    if precision == "bf16" and fp16x3_eligible(spec, stage):
        # for products whose bf16-rounded operands miss the 1e-2 tolerance: first fp16x1 (the
        # bf16 rate, 8x finer rounding), last fp32 operands at the tf32 policy's precision
        # (the interpreter: ieee)
        fallbacks = (FP16X1,) + tuple(p for p in target.dot_input_precisions("tf32")
                                      if p not in schemes)[:1]
        if not target.interpreter and fp16x1_first(spec, target, stage):
            return fallbacks[:1] + schemes + fallbacks[1:]
        return schemes + fallbacks
    if precision == "tf32" and fp16x3_eligible(spec, stage):
        own = _tf32_own_schemes(spec, target, stage, schemes)
        if target.interpreter:
            # (tested, not timed: the tf32 kernel stays the tests' first candidate)
            return own[:1] + (FP16X1,) + own[1:]
        if fp16x1_first(spec, target, stage):
            # fp16x1 products round each operand to 11 significant bits, as TF32 does (fp16's
            # 10 stored bits + the implicit one; the power-of-two scales per row of A and per
            # column of B keep every element that matters to a row's products in fp16's normal
            # range), on the 16-bit tensor cores at twice the TF32 rate, reading 2-byte weights
            # instead of 4: first wherever its pass pays (fp16x1_first); then tf32's own
            # schemes, fp16x3 (fp32-accurate) for what the verifier rejects
            return (FP16X1,) + own
        return own
    if precision != "strict" or not fp16x3_eligible(spec, stage) or FP16X3 in schemes:
        return schemes
    if target.interpreter:
        return schemes + (FP16X3,)
    if fp16x3_pass_pays(spec, target, stage):
        return (FP16X3,) + schemes
    return schemes[:1] + (FP16X3,) + schemes[1:]


def _tf32_own_schemes(spec: KernelSpec, target, stage: RegionShape, schemes: tuple) -> tuple:
    """The tf32 policy's schemes for an fp32 contraction, fp16x1 aside: the target's tf32, with
    fp16x3 first for an N-major B and last elsewhere (the interpreter: tf32 alone)."""
    if not target.interpreter and _b_n_major(spec, stage.contraction):
        # Hopper's tf32 wgmma takes B only K-major: an N-major B (bmm's second operand, or
        # `x @ W`, read as it is in memory) drops tf32 to ~70 TFLOP/s on the H200 (bmm
        # 16x2048x1024x2048: 1.91 ms tf32 vs 1.26 ms fp16x3; x @ W + leaky ReLU + softmax
        # 4096x2048x4096: 1.55x vs 3.19x over torch.compile). 16-bit wgmma takes either
        # layout, and fp16x3 is more accurate than tf32, so it is a valid tf32-policy kernel.
        return (FP16X3,) + schemes
    if target.interpreter:
        return schemes
    # the fallback for a tf32 kernel the verifier rejects (its half-tolerance margin: tf32
    # rounding amplified by a norm after the product): fp32-accurate, at 3/4 of the rate
    return schemes + (FP16X3,)


def fp16x1_first(spec: KernelSpec, target, stage: RegionShape) -> bool:
    """Whether a GPU kernel under bf16 tries fp16x1 before bf16 operands (and under tf32
    before TF32's own products, which take twice as long as the time this compares with):
    wherever its activation pass (A read twice in fp32, one fp16 plane written: 10 bytes an
    element) costs no more than the product itself at the bf16 rate. Both run on the same
    16-bit tensor cores, and fp16x1 rounds 8x finer. bf16 operands spend most of the policy's
    1e-2 in one product, so a model of several layers of them misses it at its output although
    every region passes its own check (H200, 2026-12-02, four Llama-3-8B layers: decode max abs
    0.051 on the logits against about 1e-2; prefill 0.018, 1.8x the allowance); fp16x1
    products kept decode within it (emulated: 0.71 of the allowance; measured: correct).
    A decode step's GEMM (few rows) is bound by reading its weights, and fp16x1 reads as many
    (2 bytes a weight) as bf16. Small GEMMs whose A is large against the product (a
    convolution's implicit GEMM, a narrow N) keep bf16 operands first and fp16x1 second."""
    if decode_shaped(stage):
        return True
    c = stage.contraction
    batch, M, N, K = c.extent(c.batch), c.extent(c.m), c.extent(c.n), c.extent(c.k)
    pass_s = 10 * batch * M * K / target.peaks.bytes_per_s
    product_s = 2 * batch * M * N * K / target.peaks.bf16
    return pass_s <= product_s


def decode_shaped(stage: RegionShape, rows: int = 128) -> bool:
    """A GEMM of at most `rows` output rows (batch x M): a decode step's projections, bound by
    reading the weights."""
    c = stage.contraction
    return c is not None and c.extent(c.batch) * c.extent(c.m) <= rows


def _b_n_major(spec: KernelSpec, c: Contraction) -> bool:
    """B is a region argument read as it lies (no producer op: bmm's second operand, or a
    weight used as `x @ W`), and its contiguous (last) dimension is an output-column (N)
    dimension. (nn.Linear's weight reaches the product through a transpose: K-major.)"""
    name = c.op.operands[c.b]
    if spec.producer(name) is not None:
        return False
    if not any(a.name == name for a in spec.args):
        return False
    results = c.op.indexing_maps[c.b].results
    return bool(results) and isinstance(results[-1], AffineDim) and results[-1].d in c.n


def fp16x3_pass_pays(spec: KernelSpec, target, stage: RegionShape) -> bool:
    """Whether fp16x3's operand passes cost less than its products save over 3xtf32 (three tf32
    products at a third of the tf32 peak): a pass reads its operand twice in fp32 and writes
    two fp16 planes, 12 bytes an element. A convolution's implicit GEMM has an A of
    (kernel window) times the input's size, so small ones stay with 3xtf32 first (measured on
    the H200: 16x64x34x34 conv, fp16x3 0.072 ms vs eager 0.043 ms)."""
    c = stage.contraction
    batch, M, N, K = c.extent(c.batch), c.extent(c.m), c.extent(c.n), c.extent(c.k)
    elements = batch * M * K
    if _weight_source(spec, c.op.operands[c.b]) is None:
        elements += batch * N * K
    pass_s = 12 * elements / target.peaks.bytes_per_s
    saved_s = 2 * batch * M * N * K * 3 * (1 / target.peaks.tf32 - 1 / target.peaks.bf16)
    return pass_s < saved_s


def fp16x3_configs(configs: list[dict]) -> list[dict]:
    """GEMM tiles for fp16x3: 2-byte operands take BLOCK_K 64; the per-step partial product
    doubles the accumulator registers, so at most 64 fp32 values of each a thread (128x128 with
    8 warps; 128x256 spills); stages capped by shared memory (4 fp16 planes per stage)."""
    out, seen = [], set()
    for c in configs:
        c = dict(c)
        if c["BLOCK_M"] * c["BLOCK_N"] > 64 * 32 * c["num_warps"]:
            continue
        per_stage = 2 * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2
        c["num_stages"] = max(1, min(c["num_stages"] or 1, 220 * 1024 // per_stage))
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


SPLIT_ONE_BLOCK = 8192     # the split pass reads a row of at most this many columns once


def build_split_pass(b: _Builder, shape: RegionShape, side: str, planes: str, scale: str,
                     name: str, lo: bool = True) -> None:
    """The fp16x3 pass over one GEMM operand: for each of its rows (A: batch x M rows, B: batch
    x N rows; K columns) the power-of-two scale and the fp16 hi/lo planes, K-major (fp16x1:
    `lo` False, the hi plane alone)."""
    c = shape.contraction
    rows = c.extent(c.batch) * c.extent(c.m if side == "a" else c.n)
    K = c.extent(c.k)
    with ix.ranges({"rows": (0, rows), "cols": (0, K)}):
        _emit_split_pass(b, shape, side, planes, scale, name, rows, K, lo)


def _emit_split_pass(b: _Builder, shape: RegionShape, side: str, planes: str, scale: str,
                     name: str, rows: int, K: int, lo: bool = True) -> None:
    c = shape.contraction
    op = c.op
    # a row of up to 8192 columns is one block, read once (its max, then its planes, from the
    # same registers); longer rows loop over blocks of 2048 twice (the second read from L2)
    single = K <= SPLIT_ONE_BLOCK
    BC = 1 << (K - 1).bit_length() if single else 2048
    BR = max(1, min(2048 // BC, 1 << (rows - 1).bit_length()))
    warps = 8 if BC >= 4096 else 4
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
    at.emit("e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126")
    at.emit("e = tl.where(amax > 0, tl.minimum(tl.maximum(e, -100), 100), 0)   # zero rows: 1")
    at.emit("scale = ((127 + 15 - e) << 23).to(tl.float32, bitcast=True)   # 2**(15 - e)")
    mask = em.mask_of({"rows"})
    at.emit(f"tl.store({scale}_out + rows, ((127 - 15 + e) << 23).to(tl.float32, bitcast=True)"
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


def build_gemm(b: _Builder, shape: RegionShape, outputs: list[str], config: dict, name: str,
               fuse_rows: bool, split_k: int = 1) -> None:
    c = shape.contraction
    M, N, K = c.extent(c.m), c.extent(c.n), c.extent(c.k)
    table = {"rm": (0, M), "rm_a": (0, M), "rn": (0, N), "rn_b": (0, N), "ka": (0, K),
             "kb": (0, K), "batch": (0, c.extent(c.batch))}
    with ix.ranges(table):
        _emit_gemm(b, shape, outputs, config, name, fuse_rows, split_k)


def _emit_gemm(b: _Builder, shape: RegionShape, outputs: list[str], config: dict, name: str,
               fuse_rows: bool, split_k: int = 1) -> None:
    if config.get("TMA"):
        _emit_gemm_tma(b, shape, outputs, config, name, fuse_rows)
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
                                   products=3 if impl == FP16X3 else 1)
    else:
        body = op.body
        b_weight = _weight_source(spec, op.operands[con.b])
        em.dot_context = True
        a = em.body_value(op, p_a, body.args[con.a], loop)
        split_b = impl == "3xtf32" and b_weight is not None and a.dtype == "f32"
        if split_b:
            em.planes.add(b_weight)
        bb = em.body_value(op, p_b, body.args[con.b], loop)
        a_code = _dot_operand(a, (row_a.name, "ka"), "[BLOCK_M, BLOCK_K]", kvars["ka"].mask)
        b_code = _dot_operand(bb, ("kb", col_b.name), "[BLOCK_K, BLOCK_N]", kvars["kb"].mask)
        if split_b:
            em.plane = 1
            b_lo = em.body_value(op, p_b, body.args[con.b], loop)
            em.plane = 0
            b.split_weights.add(b_weight)
        em.dot_context = False
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
        ws = f"{vc}_tmp"
        plane = batch * M * N
        offset = ix.ravel(tile_index, spec.tensor(vc).shape)
        store_tile(root, em, f"{ws} + pid_k * {plane}", offset, Val("acc", tile_deps, acc_dtype))
        b.finish(em, name, [], {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK,
                                "GROUP_M": config["GROUP_M"]}, root.lines,
                 _gemm_grid(M, N, BM, BN, batch if con.batch else None, split_k),
                 config["num_warps"], config.get("num_stages"),
                 options=b.target.launch_options(config),
                 comment=f"split-K partial products ({split_k} slices of K={K}) of {op.name}"
                 + (f"; products: {impl}" if impl else ""))
        b.kernels[-1].params.append(ws)
        b.kernels[-1].tensors.append(vc)
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
             + f"; epilogue: {_ops_comment(spec, em)}{fused}")


def _emit_grouped_tile(scope: Scope, tile: str) -> None:
    """pid_m, pid_n of output tile `tile` in grouped order (`num_pid_m` and `group`, GROUP_M
    row tiles by num_pid_n, already bound): the pointer kernel's program, the persistent
    kernel's loop variable."""
    scope.emit(f"first_m = ({tile} // group) * GROUP_M")
    scope.emit("group_m = min(num_pid_m - first_m, GROUP_M)")
    scope.emit(f"pid_m = first_m + ({tile} % group) % group_m")
    scope.emit(f"pid_n = ({tile} % group) // group_m")


def _emit_epilogue(b: _Builder, em: Emitter, scope: Scope, con: Contraction, tile_index: tuple,
                   outputs: list[str], acc_dtype: str, tile_deps: frozenset,
                   acc: str = "acc") -> None:
    """The region's ops on the accumulator tile `acc` (bound in `scope`) and the stores of
    `outputs`: reading the product inlines to the tile."""
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
    scope.emit(f"# epilogue on the accumulator tile")
    for o in outputs:
        index = tile_index_of(spec, vc, tile_index, o)
        if index is None:
            raise CannotGenerate(f"{o} does not have the contraction's shape")
        val = em.value(o, index, scope)
        b.store(scope, em, o, f"{o}_out", index, val)


# ---------------------------------------------------------------------------------------------
# The persistent TMA GEMM (bf16 policy: bf16 operands or fp16x1)
# ---------------------------------------------------------------------------------------------
# Offered first where it fits (tma_configs); KFORGE_BUILTIN_TMA=0 never, =1 also where the
# measured rule below leaves it out. H200, 2026-12-04 (benchmarks/results/
# 2026-12-04b-h200-builtin-tma), its first tile against the pointer kernel the builtin took
# first: fp16x1 1.03-1.54x faster on 6 of 8 shapes (8192^3 1.761 vs 1.811 ms; 4096^3 0.229 vs
# 0.288; 256 x 4096^2 0.042 vs 0.065), even on 512 x 8192^2 (0.153 vs 0.150; its second tile
# 0.129) and a fused norm + softmax over N = 128 (0.108 vs 0.108); bf16 operands (plus a cast
# pass) 1.17-1.20x faster on the four largest, even at 4096^3 and 512 x 8192^2, slower where
# few tiles fill the SMs (256 x 4096^2: 0.050 vs 0.037) and with a fused row reduction over
# N = 128 (0.106 vs 0.064: the cast pass is most of the time).
#
# tf32 (the tf32 policy's scheme) on the same kernel: A and the weight read by TMA in fp32 as they
# lie, no pass at all (kernels/gemm.py's persistent tf32 kernel ran 13 % ahead of the pointer
# kernel's tiles on the H200, NOTES.md run 4). Not timed in the builtin yet: only with
# KFORGE_BUILTIN_TMA=1.
#
# fp16x3 (the strict policy's scheme, and tf32's where fp16x3 is offered) on the same kernel: A's
# hi and lo planes from the split pass and the weight's from prepare_weights, four tiles a K
# step, the three products into a fresh `part` as the pointer kernel does. Not timed on a GPU
# yet: offered only with KFORGE_BUILTIN_TMA=1 (first for its scheme then), never by default.
TMA_ENV = "KFORGE_BUILTIN_TMA"
TMA_DEFAULT = True


def tma_wanted(target) -> bool:
    """Whether the persistent TMA kernel is offered: KFORGE_BUILTIN_TMA=0/1, else TMA_DEFAULT on
    GPUs (the interpreter runs it only when asked: tested, not timed)."""
    env = os.environ.get(TMA_ENV)
    if env in ("0", "1"):
        return env == "1"
    return TMA_DEFAULT and not target.interpreter


def tma_eligible(spec: KernelSpec, target, precision: str, stage: RegionShape,
                 scheme: str | None = None) -> bool:
    """Whether the persistent TMA kernel fits this GEMM stage under the bf16 policy with bf16
    operands (scheme None) or fp16x1 (A's fp16 plane from the split pass, the weight's fp16
    plane from prepare_weights, the power-of-two scales undone on the tile; under tf32 too),
    under strict and tf32 with fp16x3 (both planes of each), or under tf32 with its own scheme
    (A, an argument read as it lies, and the weight both in fp32, no pass): a 2-D product (no
    batch) whose B is a weight [N, K] read as it lies (nn.Linear's weight, cast to bf16 or split
    to its fp16 planes once by prepare_weights), K a multiple of 8 (TMA's 16-byte aligned
    rows), an fp32 product and int32 offsets throughout, on sm_90 or later (or the
    interpreter). Under bf16 operands A is cast to a bf16 [M, K] copy by a pass. The output is
    stored with masked tl.store, so N needs no alignment."""
    if stage.kind != "gemm" or target.name not in ("cuda", "cpu"):
        return False
    tf32 = precision == "tf32" and scheme == _tf32_scheme(target)
    if precision == "bf16" or (precision == "tf32" and scheme == FP16X1):
        if scheme not in (None, FP16X1):
            return False
    elif not tf32 and (precision not in ("strict", "tf32") or scheme != FP16X3):
        return False
    if scheme in FP16_SCHEMES and not fp16x3_eligible(spec, stage):
        return False
    if target.name == "cuda" and target.sm < 90:        # TMA is Hopper's
        return False
    con = stage.contraction
    op = con.op
    N, K = con.extent(con.n), con.extent(con.k)
    if con.batch or K % 8 or spec.tensor(op.results[0]).dtype != "f32":
        return False
    if spec.tensor(op.operands[con.a]).dtype not in ("f32", "bf16", "f16"):
        return False
    if any(math.prod(t.shape) >= WIDE_OFFSETS for t in (*spec.args, *spec.values)):
        return False
    M = con.extent(con.m)
    if scheme == FP16X3 and 2 * max(M, N) * K + N >= WIDE_OFFSETS:
        return False            # both planes (and the exponents after them) in int32 offsets
    if tf32 and not (spec.tensor(op.operands[con.a]).dtype == "f32" and _a_as_it_lies(spec, con)):
        return False            # tf32 reads A by TMA where it lies: no pass to compute it
    weight = _weight_source(spec, op.operands[con.b])
    if weight is None or tuple(spec.tensor(weight).shape) != (N, K):
        return False
    return _weight_read_index(spec, target, con, weight) == (ix.IVar("rn"), ix.IVar("kb"))


def _tf32_scheme(target):
    """The tf32 policy's own product scheme on this target ("tf32"; the interpreter: "ieee")."""
    return target.dot_input_precisions("tf32")[0]


def _a_as_it_lies(spec: KernelSpec, con: Contraction) -> bool:
    """A is a region argument [M, K] read as it lies (row m, column k): a descriptor can read
    it with no pass."""
    name = con.op.operands[con.a]
    if spec.producer(name) is not None or not any(a.name == name for a in spec.args):
        return False
    results = con.op.indexing_maps[con.a].results
    return len(con.m) == 1 and len(con.k) == 1 and len(results) == 2 \
        and all(isinstance(r, AffineDim) for r in results) \
        and [r.d for r in results] == [con.m[0], con.k[0]] \
        and tuple(spec.tensor(name).shape) == (con.extent(con.m), con.extent(con.k))


def _weight_read_index(spec: KernelSpec, target, con: Contraction, weight: str):
    """The index at which the product reads `weight` for its B tile [kb, rn] (None when the
    emitter cannot read it)."""
    N, K = con.extent(con.n), con.extent(con.k)
    kvars = {"rn": KVar("rn", None, ("1", "BLOCK_N")), "kb": KVar("kb", None, ("BLOCK_K", "1"))}
    em = Emitter(spec, target, kvars, {weight: weight})
    p = dict(zip(con.n, ix.unravel(ix.IVar("rn"), [con.sizes[d] for d in con.n])))
    p.update(zip(con.k, ix.unravel(ix.IVar("kb"), [con.sizes[d] for d in con.k])))
    with ix.ranges({"rn": (0, N), "kb": (0, K)}):
        try:
            em.body_value(con.op, p, con.op.body.args[con.b], Scope(None, binds={"rn", "kb"}))
        except CannotGenerate:
            return None
    return em.load_index.get(weight)


def tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                scheme: str | None = None) -> list[dict]:
    """The TMA kernel's configurations for `scheme` (bf16 operands or fp16x1), where it is
    wanted (tma_wanted) and the stage qualifies (tma_eligible) and, on a GPU, has more than 128
    rows (a decode step's GEMM reads its weights: the pointer kernel's decode tiles) and, for
    bf16 operands, at least a wave of 128 x 128 tiles and no row reduction (unless
    KFORGE_BUILTIN_TMA=1); else none. The tiles and pipelines tma2 measured best on the H200
    (benchmarks/gemm/NOTES.md runs 5-7): beyond 512 rows 128x256x64, 8 warps, 4 stages,
    GROUP_M 16, the epilogue in 4 column slices, the tile loop flattened with the K loop
    (229408 bytes of shared memory), then the same not flattened (fewer registers where an
    epilogue would spill), then the tile before the slices (3 stages); up to 512 rows
    128x128x64 with 6 stages and 2 slices, flattened, then 4 stages not, then 4 stages with
    the whole-tile epilogue. Not timed in this kernel yet (tma2, the same structure with a
    TMA-store epilogue, ran 1.04-1.13x its predecessor at M >= 8192). A row reduction fused
    over the tile keeps the target's first two tiles (BLOCK_N spans N) of at most 64
    accumulator values a thread, and a whole-tile epilogue; the interpreter too (tested, not
    timed)."""
    if not tma_wanted(target) or not tma_eligible(spec, target, precision, stage, scheme):
        return []
    if decode_shaped(stage) and not target.interpreter:     # (the interpreter: tested, not timed)
        return []
    con = stage.contraction
    if precision != "bf16" and scheme != FP16X1:     # strict / tf32: fp16x3, or tf32's own
        return _opt_in_tma_configs(spec, target, precision, stage, scheme)
    if _starved_by_tma(spec, target, precision, stage, scheme):
        return []
    if scheme is None and not target.interpreter and os.environ.get(TMA_ENV) != "1" and (
            stage.reductions or _tiles_128(con) < target.compute_units):
        # bf16 operands: its cast pass pays only where a wave of 128 x 128 tiles fills the SMs
        # and the stage has no row reduction (measured with a fused one: see TMA_DEFAULT)
        return []
    problem = dict(problem_of(spec, stage), precision=precision)
    tiles = [c for c in target.configs("gemm", dict(problem, precision="bf16"))
             if c.get("SPLIT_K", 1) == 1]
    # the target fuses the row reduction into the tile where its tiles span N
    fused = bool(stage.reductions and problem.get("full_rows") and tiles) \
        and tiles[0]["BLOCK_N"] >= con.extent(con.n)
    keep = 2                # TMA configurations offered: the target's first two, or `own`
    if fused and not target.interpreter:
        # row reductions on the tile hold the row's values beside the accumulator: at most 64
        # accumulator values a thread (sm_90, 128x128 with 4 warps: 72 bytes of spills)
        tiles = [c for c in tiles if c["BLOCK_M"] * c["BLOCK_N"] <= 64 * 32 * c["num_warps"]]
    if not fused and not target.interpreter:
        # (a reduction over a wider N runs in a rows kernel after the GEMM: the GEMM's own
        # tiles; H200 2026-12-04, 4096^3 + GELU + residual + layer norm: 128x128 tiles 0.376 ms
        # against the pointer kernel's 128x256 0.315)
        M = con.extent(con.m)
        # (third: the tile as it was before the slices, measured on the H200 2026-12-04/05,
        # for the tuner to fall back on where the new pipeline times slower)
        own = [_cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4, FLATTEN=True),
               _cfg_tile(128, 256, 64, 8, 4, 16, EPI_SPLIT=4),
               _cfg_tile(128, 256, 64, 8, 3, 16)] if M > 512 else \
            [_cfg_tile(128, 128, 64, 8, 6, 16, EPI_SPLIT=2, FLATTEN=True),
             _cfg_tile(128, 128, 64, 8, 4, 16, EPI_SPLIT=2),
             _cfg_tile(128, 128, 64, 8, 4, 16)]
        tiles, keep = own + tiles, len(own)
    out, seen = [], set()
    for c in tiles:
        c = dict(c, TMA=True)           # (config_space adds the scheme's input_precision)
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out[:keep]


def _starved_by_tma(spec: KernelSpec, target, precision: str, stage: RegionShape,
                    scheme: str | None) -> bool:
    """A GEMM whose 128 x 128 output tiles fill under a quarter of the GPU's SMs while the
    pointer kernel's first tiles for the scheme split K: the TMA kernel (one program a tile, no
    split-K) would leave most SMs idle. H200, 2026-12-05, gemm_max_const_long_k (256 x 1024,
    K = 32768) under tf32's fp16x1: 16 programs, 0.207 ms, what 16 SMs at the 16-bit rate take
    (0.204 ms), 0.63x the TF32 route; the split-K pointer tiles run 128 programs. Not for the
    interpreter (tested, not timed) or with KFORGE_BUILTIN_TMA=1."""
    if target.interpreter or os.environ.get(TMA_ENV) == "1":
        return False
    if _tiles_128(stage.contraction) * 4 >= target.compute_units:
        return False
    first = stage_configs(spec, target, precision, stage, scheme)[:1]
    return bool(first) and first[0].get("SPLIT_K", 1) > 1


def _tiles_128(con: Contraction) -> int:
    """The product's 128 x 128 output tiles (the TMA kernel's programs at its smallest tile)."""
    return -(-con.extent(con.batch) * con.extent(con.m) // 128) * -(-con.extent(con.n) // 128)


def _opt_in_tma_configs(spec: KernelSpec, target, precision: str, stage: RegionShape,
                        scheme: str) -> list:
    """strict's fp16x3 and tf32 on the TMA kernel: only with KFORGE_BUILTIN_TMA=1 (not timed
    on a GPU yet), and not where a row reduction is fused over the tile (fp16x3's `part`
    accumulator doubles the registers). fp16x3: 128 x 128 x 64 tiles, 8 warps (acc and part:
    128 values a thread), 3 stages of four 16 KiB tiles, then BLOCK_K 32 with 4 stages. tf32:
    kernels/gemm.py's persistent tf32 tiles (NOTES.md run 4), 256 x 128 x 32 with 8 warps and
    3 stages where M >= 1024 and N >= 8192, else 128 x 128 x 32 with 4 stages first (fp32
    tiles: 32-48 KiB a stage). The interpreter: the target's first tile."""
    if os.environ.get(TMA_ENV) != "1":
        return []
    problem = dict(problem_of(spec, stage), precision=precision)
    if stage.reductions and problem.get("full_rows"):
        return []
    con = stage.contraction
    if target.interpreter:
        tiles = [c for c in target.configs("gemm", dict(problem, precision="bf16"))
                 if c.get("SPLIT_K", 1) == 1][:1]
    elif scheme == FP16X3:
        # first the tile in two column parts (N_PARTS: A's planes read once for 256 columns;
        # 48 KiB a stage at BLOCK_K 32), where N spans more than one 128-column tile
        tiles = [_cfg_tile(128, 128, 64, 8, 3, 16), _cfg_tile(128, 128, 32, 8, 4, 16)]
        if con.extent(con.n) > 128:
            tiles.insert(0, _cfg_tile(128, 256, 32, 8, 4, 16, N_PARTS=2))
    else:
        tiles = [_cfg_tile(256, 128, 32, 8, 3, 16), _cfg_tile(128, 128, 32, 8, 4, 16)]
        if not (con.extent(con.m) >= 1024 and con.extent(con.n) >= 8192):
            tiles.reverse()
    return [dict(c, TMA=True) for c in tiles]


def _cfg_tile(bm, bn, bk, warps, stages, group_m, **keys) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, "SPLIT_K": 1,
            "num_warps": warps, "num_stages": stages, **keys}


def build_cast_pass(b: _Builder, shape: RegionShape, out: str, name: str) -> None:
    """The pass that writes the GEMM's A as a bf16 [M, K] copy for the TMA kernel's
    descriptor (A's producers, if any, computed on the way)."""
    con = shape.contraction
    M, K = con.extent(con.m), con.extent(con.k)
    with ix.ranges({"rows": (0, M), "cols": (0, K)}):
        _emit_cast_pass(b, shape, out, name, M, K)


def _emit_cast_pass(b: _Builder, shape: RegionShape, out: str, name: str, M: int,
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


def _emit_gemm_tma(b: _Builder, shape: RegionShape, outputs: list[str], config: dict,
                   name: str, fuse_rows: bool) -> None:
    """A persistent GEMM: min(tiles, SMs) programs walk the output tiles in grouped order; A
    (the cast pass's bf16 copy) and B (the bf16 weight [N, K]) arrive through in-kernel TMA
    descriptors, num_stages deep; fp32 accumulation; the region's epilogue on the tile, stored
    with masked tl.store."""
    spec, target, con = b.spec, b.target, shape.contraction
    op = con.op
    M, N, K = con.extent(con.m), con.extent(con.n), con.extent(con.k)
    BM, BN, BK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    if fuse_rows and BN < N:
        raise CannotGenerate("fused row reductions need BLOCK_N >= N")
    scheme = config.get("input_precision")
    if not tma_eligible(spec, target, b.precision, shape, scheme) \
            or config.get("SPLIT_K", 1) > 1:
        raise CannotGenerate(f"{op.name}: the TMA kernel takes 2-D bf16, fp16x1, fp16x3 or "
                             "tf32 products of a K-major weight with K % 8 == 0, without "
                             "split-K")
    weight = _weight_source(spec, op.operands[con.b])
    # bf16: the cast pass's copy; fp16x1 / fp16x3: the split's planes ([hi, lo]: rows M..2M-1
    # of the descriptor hold lo; a hi tile past M reads lo rows into output rows past M, which
    # are not stored)
    a16 = f"{op.results[0]}_a16"
    planes = 2 if scheme == FP16X3 else 1
    tf32 = b.precision == "tf32" and scheme == _tf32_scheme(target)
    if tf32:                            # A itself, fp32, where it lies
        a16 = op.operands[con.a]
    # the epilogue in column slices of EPI_N (epi_slices of them), as tma2's: the epilogue's
    # values are [BLOCK_M, EPI_N] at a time, beside the accumulator (sm_90 cross-compile of
    # the suite's 43 TMA GEMM regions under tf32, 42 at 128x256x64: whole-tile epilogues took
    # 193-255 registers and 6 of them spilled 64-792 bytes, which made the spill screen pass
    # over the tile; in 4 slices 162-244 registers, none spilled), and each slice's store
    # converts a slice, not the tile, through shared memory (a fused row reduction needs the
    # whole row: one slice)
    epi_slices = 1 if fuse_rows else config.get("EPI_SPLIT", 1)
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
    kvars = {"rm": KVar("rm", "rm < %d" % M if M % BM else None, ("BLOCK_M", "1")),
             "rn": KVar("rn", "rn < %d" % N if N % BN else None, ("1", epi_n))}
    columns = ColumnSpace("rn", N, "[BLOCK_M, BLOCK_N]") if fuse_rows else None
    em = b.emitter(kvars, columns)
    em.loads.setdefault(a16, set()).add("dot")
    em.loads.setdefault(weight, set()).add("dot")       # bf16 / fp16 from prepare_weights
    if scheme in FP16_SCHEMES:
        em.loads.setdefault(f"{op.results[0]}_as", set()).add("other")
        b.fp16_weights[weight] = ((0,), planes)         # [hi (, lo) plane, column exponents]
    top = Scope(None)
    tiles = -(-M // BM) * -(-N // BN)
    programs = max(1, min(tiles, target.compute_units))
    top.emit("pid = tl.program_id(0)")
    top.emit(f"num_pid_m = ({M} + BLOCK_M - 1) // BLOCK_M")
    top.emit(f"num_pid_n = ({N} + BLOCK_N - 1) // BLOCK_N")
    top.emit("group = GROUP_M * num_pid_n")
    top.emit(f"a_desc = tl.make_tensor_descriptor({em.pointers[a16]}, shape=[{planes * M}, "
             f"{K}], strides=[{K}, 1], block_shape=[BLOCK_M, BLOCK_K])")
    w_rows = "BLOCK_N" if n_parts == 1 else "EPI_N"
    top.emit(f"w_desc = tl.make_tensor_descriptor({em.pointers[weight]}, shape=[{planes * N}, "
             f"{K}], strides=[{K}, 1], block_shape=[{w_rows}, BLOCK_K])")
    # FLATTEN: one software pipeline over (tile, K step), the next tile's loads in flight
    # during this tile's epilogue (tma2's); else only the K loop is pipelined. Flattened, the
    # epilogue's store takes a buffer of the slice it converts beside the stages (sm_90
    # cross-compile, 128x256x64: whole tile and 3 stages 278552 bytes of shared memory against
    # the H200's 232448; 4 slices and 4 stages 229408; K loop alone, 4 stages, 196640)
    top.emit("# persistent: NUM_SMS programs walk the tiles in grouped order (GROUP_M row tiles "
             "share their B tiles in L2)")
    pipe = "flatten=True" if config.get("FLATTEN") else "num_stages=1"
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
    loop = Scope(tile, depth=3, header=f"for k0 in range(0, {K}, BLOCK_K):")
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
    p_out = dict(zip(con.m, ix.unravel(ix.IVar("rm"), [con.sizes[d] for d in con.m])))
    p_out.update(zip(con.n, ix.unravel(ix.IVar("rn"), [con.sizes[d] for d in con.n])))
    tile_index = tuple(compose(r, p_out) for r in op.indexing_maps[op.num_inputs].results)
    accs = parts
    if epi_slices > len(accs):
        tile.emit(f"# the epilogue in {epi_slices} column slices of EPI_N (halves of halves: "
                  "reshape, permute, split)")
    while len(accs) < epi_slices:
        halves = []
        for a in accs:
            tile.emit(f"{a}_0, {a}_1 = tl.split(tl.permute(tl.reshape({a}, (BLOCK_M, 2, "
                      f"BLOCK_N // {2 * len(accs)})), (0, 2, 1)))")
            halves += [f"{a}_0", f"{a}_1"]
        accs = halves
    for i, a in enumerate(accs):
        part = tile
        if epi_slices > 1:
            part = Scope(tile, binds={"rn"}, depth=2,
                         header=f"# columns [{i} * EPI_N, {i + 1} * EPI_N) of the tile")
            part.emit(f"rn = pid_n * BLOCK_N + {i} * EPI_N + tl.arange(0, EPI_N)[None, :]")
        if scheme in FP16_SCHEMES:
            part.emit(f"e_b = tl.load({em.pointers[weight]} + {planes * N * K} + rn"
                      + (f", mask=rn < {N}, other=0.0)" if N % BN else ")") + ".to(tl.int32)")
            part.emit(f"{a} = {a} * s_a * ((e_b + 127) << 23).to(tl.float32, bitcast=True)")
        _emit_epilogue(b, em, part, con, tile_index, outputs, "f32", frozenset({"rm", "rn"}),
                       acc=a)
        if part is not tile:
            part.close()
    tile.close()
    b.tma = True
    fused = "; row reductions fused (one tile spans N)" if fuse_rows else ""
    constexprs = {"BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "GROUP_M": config["GROUP_M"],
                  "NUM_SMS": programs}
    if epi_slices > 1:
        constexprs["EPI_N"] = BN // epi_slices
    b.finish(em, name, outputs, constexprs, top.lines,
             f"({programs},)", config["num_warps"], config.get("num_stages"),
             options=target.launch_options(config),
             comment=f"{op.name} M={M} N={N} K={K}; persistent, operands by TMA "
             f"({scheme or 'bf16'}{', fp32 operands as they lie' if tf32 else ''})"
             + f"; epilogue: {_ops_comment(spec, em)}{fused}")


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


def _fp16x3_step(b: _Builder, em: Emitter, con: Contraction, loop: Scope, p_b: dict,
                 row_a: str, col_b: str, kvars: dict, products: int = 3) -> list[str]:
    """One K step of fp16x3 (see FP16X3; products=1: fp16x1, the hi planes alone) into `loop`;
    returns the lines that undo the operand scales on the accumulator after the loop."""
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
    sa = plane_loads("a", row_a, "ka", M)
    b_weight = _weight_source(spec, op.operands[con.b])
    if b_weight is not None:        # hi/lo planes and column exponents from prepare_weights
        em.planes.add(b_weight)
        em.dot_context = True
        hi = em.body_value(op, p_b, op.body.args[con.b], loop)
        if products == 3:
            em.plane = 1
            lo = em.body_value(op, p_b, op.body.args[con.b], loop)
            em.plane = 0
        em.dot_context = False
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
        sb = "((e_b + 127) << 23).to(tl.float32, bitcast=True)"
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
    loop.emit(f"acc += part  # {op.name}")
    return undo + [f"acc = acc * {sa} * {sb}"]


def _weight_source(spec: KernelSpec, name: str) -> str | None:
    """The weight argument `name` only moves (reshape, transpose, broadcast copy), when that
    argument is read nowhere else in the region: prepare_weights may then re-store it."""
    seen = name
    while True:
        op = spec.producer(seen)
        if op is None:
            break
        if isinstance(op, GenericOp) and not op.reduction_dims and op.num_inputs == 1 \
                and op.body.yields[0] == op.body.args[0]:
            seen = op.operands[0]
        elif op.op == "reshape":
            seen = op.operands[0]
        else:
            return None
    arg = next((a for a in spec.args if a.name == seen), None)
    if arg is None or not arg.weight or arg.dtype != "f32":
        return None
    if len(spec.users(seen)) != 1 or seen in spec.results:
        return None
    return seen


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


# ---------------------------------------------------------------------------------------------
# The candidate source
# ---------------------------------------------------------------------------------------------
def generate_source(spec: KernelSpec, target, precision: str, config: dict,
                    shape: RegionShape | None = None) -> str:
    """The Python source of one candidate (kernels, optional prepare_weights, launch).
    `config` tunes the first stage; later stages take their kind's first configuration.
    `shape`: the region's cut (default: the fused one; the provider passes the cut its
    region_shape chose)."""
    shape = shape or analyze_region(spec)
    b = _Builder(spec, target, precision)
    stages = shape.stages or [shape]
    for i, stage in enumerate(stages):
        cfg = config if i == 0 else _default_config(spec, target, precision, stage)
        stem = spec.name if len(stages) == 1 else f"{spec.name}_{i}"
        _build_stage(b, stage, cfg, stem)
        for v in stage.materialize:
            b.temporaries.setdefault(v, None)
    return _assemble(b, shape, config)


def stage_configs(spec, target, precision: str, stage: RegionShape,
                  scheme: str | None = None) -> list[dict]:
    """The target's configurations for a stage; for a GEMM, those that suit `scheme` (fp16x3
    takes the 2-byte-operand tiles, see fp16x3_configs). No split-K with row reductions."""
    problem = dict(problem_of(spec, stage), precision=precision)
    if scheme == FP16X3 and not target.interpreter:
        configs = fp16x3_configs(target.configs("gemm", dict(problem, precision="bf16")))
    elif scheme == FP16X1:          # 16-bit operands, one product: bf16's tiles, two of them
        configs = target.configs(stage.kind, dict(problem, precision="bf16"))[:2]
    elif precision == "bf16" and scheme:     # the fp32-operand fallback: fp32 tiles, two
        configs = target.configs(stage.kind, dict(problem, precision="tf32"))[:2]
    else:
        configs = target.configs(stage.kind, problem)
    return [dict(c) for c in configs if not (stage.reductions and c.get("SPLIT_K", 1) > 1)]


def _default_config(spec, target, precision: str, stage: RegionShape) -> dict:
    scheme = None
    if stage.kind == "gemm":
        scheme = gemm_input_precisions(spec, target, precision, stage)[0]
    configs = stage_configs(spec, target, precision, stage, scheme)
    if not configs:
        raise CannotGenerate(f"no {stage.kind} configuration for a later stage")
    config = dict(configs[0])
    if scheme:
        config["input_precision"] = scheme
    return config


def _build_stage(b: _Builder, stage: RegionShape, config: dict, stem: str) -> None:
    spec, target = b.spec, b.target
    outputs = stage.stores
    if stage.kind == "elementwise":
        _elementwise_by_size(b, outputs, config, f"{stem}_elementwise")
        return
    if stage.kind == "rows":
        build_rows(b, outputs, stage.rows, stage.cols, config, f"{stem}_rows")
        return
    con = stage.contraction
    vc = con.op.results[0]
    vc_numel = math.prod(spec.tensor(vc).shape)
    split_k = config.get("SPLIT_K", 1)
    if stage.reductions and split_k > 1:
        raise CannotGenerate("split-K with row reductions is not generated")
    fuse = (bool(stage.reductions) and config["BLOCK_N"] >= con.extent(con.n)
            and stage.cols == con.extent(con.n)
            and all(math.prod(spec.tensor(o).shape) == vc_numel for o in outputs))
    if config.get("input_precision") in FP16_SCHEMES:
        scheme = config["input_precision"]
        if not fp16x3_eligible(spec, stage):
            raise CannotGenerate(f"{scheme} needs fp32 operands and an fp32 result")
        n_planes = 2 if scheme == FP16X3 else 1
        # the operands' fp16 planes and scales: A always by a pass; B by prepare_weights when it
        # is a weight, else by a pass too
        sides = ["a"] + ([] if _weight_source(spec, con.op.operands[con.b]) else ["b"])
        for side in sides:
            rows = con.extent(con.batch) * con.extent(con.m if side == "a" else con.n)
            K = con.extent(con.k)
            planes, scale = f"{vc}_{side}16", f"{vc}_{side}s"
            b.temporaries[planes] = (f"torch.empty(({n_planes}, {rows}, {K}), device=device, "
                                     f"dtype=torch.float16)  # {scheme} planes of "
                                     f"{side.upper()}")
            b.temporaries[scale] = (f"torch.empty(({rows},), device=device, "
                                    f"dtype=torch.float32)  # its row scales")
        for side in sides:
            build_split_pass(b, stage, side, f"{vc}_{side}16", f"{vc}_{side}s",
                             f"{stem}_split_{side}", lo=scheme == FP16X3)
    if config.get("TMA") and config.get("input_precision") is None:
        # the TMA kernel's A: a bf16 [M, K] copy that a descriptor can read (fp16x1 reads the
        # split pass's fp16 plane)
        a16 = f"{vc}_a16"
        b.temporaries[a16] = (f"torch.empty(({con.extent(con.m)}, {con.extent(con.k)}), "
                              "device=device, dtype=torch.bfloat16)  # A in bf16 for TMA")
        build_cast_pass(b, stage, a16, f"{stem}_cast_a")
    if split_k > 1:
        ws_shape = (split_k,) + tuple(spec.tensor(vc).shape)
        b.temporaries[vc] = (f"torch.empty({ws_shape!r}, device=device, "
                             "dtype=torch.float32)  # split-K partial products")
        build_gemm(b, stage, [], config, f"{stem}_gemm_partial", False, split_k)
        b.split_sums[vc] = split_k
        _epilogues(b, outputs, config, stem)
    elif stage.reductions and not fuse:
        build_gemm(b, stage, [vc], config, f"{stem}_gemm", False)
        b.temporaries[vc] = None            # the product, read back by the rows kernel
        rows_config = config.get("rows") or target.configs(
            "rows", {"rows": stage.rows, "cols": stage.cols})[0]
        # the GEMM kernel stored the product; the rows kernel stores the rest
        build_rows(b, [o for o in outputs if o != vc], stage.rows, stage.cols, rows_config,
                   f"{stem}_rows")
    elif not stage.reductions:
        if gemm_outputs_on_tile(spec, stage):
            saved = b.snapshot()
            try:
                build_gemm(b, stage, outputs, config, f"{stem}_gemm", False)
                return
            except CannotGenerate:      # an output index that does not fold back to the tile
                b.restore(saved)
        # outputs that are not the tile moved (slices of the product: q, k, v of one
        # projection): the GEMM stores the product, elementwise kernels finish from it
        build_gemm(b, stage, [vc], config, f"{stem}_gemm", False)
        b.temporaries[vc] = None
        _epilogues(b, outputs, config, stem)
    else:
        build_gemm(b, stage, outputs, config, f"{stem}_gemm", fuse)


def _epilogues(b: _Builder, outputs: list[str], config: dict, stem: str) -> None:
    """Elementwise kernels that finish a stored GEMM product into the region's outputs (q and k
    rotated by RoPE are [.., 64] halves and [.., 128] wholes of one product)."""
    _elementwise_by_size(b, outputs, config.get("epilogue", {"BLOCK": 1024, "num_warps": 4}),
                         f"{stem}_epilogue")


def _elementwise_by_size(b: _Builder, outputs: list[str], config: dict, name: str) -> None:
    """One elementwise kernel per output size (a launch covers one domain), `name`, or
    `name_0`, `name_1`, ... where there are several."""
    groups: dict[int, list[str]] = {}
    for o in outputs:
        groups.setdefault(math.prod(b.spec.tensor(o).shape), []).append(o)
    for i, group in enumerate(groups.values()):
        build_elementwise(b, group, config, name + ("" if len(groups) == 1 else f"_{i}"))


# fp16x3 / fp16x1 weights, split once at load. A block of at most `block` elements at a time
# (one dim's rows, single indices of the dims before it), written into the preallocated planes:
# the temporaries are a few blocks, not a few weights (split whole, a 32768x32768 fp32 weight
# held 3.5 weight-sized temporaries: 4.06x the region's bytes in the verifier's worker, H200).
# Elementwise, and the column max is exact however it is blocked: the planes are the same values.
FP16_PREPARE_WEIGHTS = """\
def prepare_weights(weights, block=1 << 24):
    # fp16x3 / fp16x1: each matrix weight scaled per output column by a power of two (column
    # max < 2**15), split into fp16 hi + lo (fp16x1: hi alone), stored flat: [hi plane, lo
    # plane, column exponents e - 15]; computed a block of at most `block` elements at a time
    def blocks(shape):
        # index tuples covering `shape`: rows of its first dim, or one row and blocks of the rest
        if not shape:
            yield ()
            return
        inner = shape[1:].numel()
        if inner <= block:
            rows = max(1, block // max(inner, 1))
            for r in range(0, shape[0], rows):
                yield (slice(r, min(r + rows, shape[0])),)
        else:
            for r in range(shape[0]):
                for rest in blocks(shape[1:]):
                    yield (slice(r, r + 1),) + rest

    def columns(blk, k_dims):
        # a block's index into a per-column tensor (size 1 along the K dims)
        return tuple(slice(None) if d in k_dims else s for d, s in enumerate(blk))

    out = dict(weights)
    for i, (n_dims, planes) in FP16_WEIGHTS.items():  # weight: its output-column dims, planes
        w = weights[i]
        k_dims = tuple(d for d in range(w.dim()) if d not in n_dims)
        amax = torch.zeros([1 if d in k_dims else n for d, n in enumerate(w.shape)],
                           device=w.device, dtype=torch.float32)
        for blk in blocks(w.shape):
            part = w[blk].to(torch.float32).abs()
            part = part.amax(dim=k_dims, keepdim=True) if k_dims else part
            col = amax[columns(blk, k_dims)]
            torch.maximum(col, part, out=col)
        e = torch.frexp(amax)[1].clamp(-100, 100)            # amax < 2**e
        e = torch.where(amax > 0, e, torch.zeros_like(e))     # zero columns
        scale = torch.ldexp(torch.ones_like(amax), 15 - e)
        n = w.numel()
        flat = torch.empty(planes * n + amax.numel(), device=w.device, dtype=torch.float16)
        hi = flat[:n].view(w.shape)
        lo = flat[n:2 * n].view(w.shape) if planes == 2 else None
        for blk in blocks(w.shape):
            ws = w[blk].to(torch.float32) * scale[columns(blk, k_dims)]
            h = ws.to(torch.float16)
            hi[blk] = h
            if lo is not None:
                lo[blk] = ws.sub_(h.to(torch.float32)).to(torch.float16)
        flat[planes * n:] = (e - 15).to(torch.float16).reshape(-1)
        out[i] = flat
    return out
"""


# 3xtf32 weights, split once at load a block at a time into the preallocated planes (split
# whole: the rounding's int32 temporaries, w - hi and the stack, 4 weight-sized at once).
TF32_PREPARE_WEIGHTS = """\
def prepare_weights(weights, block=1 << 24):
    # matrix weights stored once as [hi, lo] planes: hi rounded to tf32 (10 mantissa bits),
    # lo = w - hi exactly; computed a block of at most `block` elements at a time
    out = dict(weights)
    for i in TF32_WEIGHTS:
        w = weights[i].to(torch.float32).contiguous().view(-1)
        planes = torch.empty((2, w.numel()), device=w.device, dtype=torch.float32)
        for k in range(0, w.numel(), block):
            x = w[k:k + block]
            hi = ((x.view(torch.int32) + 0x1000) & -8192).view(torch.float32)
            planes[0, k:k + block] = hi
            planes[1, k:k + block] = x - hi
        out[i] = planes.view((2,) + tuple(weights[i].shape))
    return out
"""


def _assemble(b: _Builder, shape: RegionShape, config: dict) -> str:
    spec, target = b.spec, b.target
    args = [a.name for a in spec.args]
    lines = [f'"""KForge builtin kernel for region {spec.hash} ({spec.name}).',
             "",
             f"Fused: {', '.join(spec.fused) or _ops_comment(spec)}. "
             f"Kind: {' + '.join(st.kind for st in (shape.stages or [shape]))}. "
             f"Precision: {b.precision}. Target: {target.name}.",
             f"Config: {config}",
             '"""',
             "import torch",
             "import triton",
             "import triton.language as tl"]
    if b.math_used and target.math_imports:
        lines.append(target.math_imports)
    lines.append("")
    for name in b.combiners:
        lines += ["", combine_function(name)]
    for k in b.kernels:
        lines += ["", k.source()]
    prepared = []
    if b.precision == "bf16" and not config.get("input_precision"):
        for i, a in enumerate(spec.args):
            if a.weight and b.dot_loads.get(a.name) == {"dot"} and a.dtype == "f32":
                prepared.append(i)
    split = [i for i, a in enumerate(spec.args) if a.name in b.split_weights]
    fp16 = {i: b.fp16_weights[a.name] for i, a in enumerate(spec.args)
            if a.name in b.fp16_weights}
    if fp16:
        lines += ["", FP16_PREPARE_WEIGHTS.replace("FP16_WEIGHTS", repr(fp16))]
    elif prepared:
        lines += ["", "def prepare_weights(weights):",
                  "    # weights read only as matrix operands are cast to bf16 once, at load",
                  f"    return {{i: (w.to(torch.bfloat16) if i in {tuple(prepared)!r} else w)"
                  " for i, w in weights.items()}", ""]
    elif split:
        lines += ["", TF32_PREPARE_WEIGHTS.replace("TF32_WEIGHTS", repr(tuple(split)))]
    lines += ["", f"def launch({', '.join(args)}):"]
    lines.append(f"    for t in ({', '.join(args)}{',' if len(args) == 1 else ''}):")
    lines.append("        if not t.is_contiguous():")
    lines.append(f'            raise ValueError("{spec.name}: arguments must be contiguous")')
    # a region without operands (a mask from index ranges) computes on the target's device
    lines.append(f"    device = {args[0]}.device" if args else f"    device = {b.target.device!r}")
    for v, alloc in b.temporaries.items():
        if v in shape.outputs or any(v in st.outputs for st in shape.stages):
            continue                          # a region result, allocated below
        if alloc is None:
            t = spec.tensor(v)
            alloc = (f"torch.empty({tuple(t.shape)!r}, device=device, "
                     f"dtype={TORCH_DTYPES[t.dtype]})")
        lines.append(f"    {v} = {alloc}")
    for o in dict.fromkeys(o for st in (shape.stages or [shape]) for o in st.outputs):
        t = spec.tensor(o)
        lines.append(f"    {o} = torch.empty({tuple(t.shape)!r}, device=device, "
                     f"dtype={TORCH_DTYPES[t.dtype]})")
    if b.tma:
        lines.append("    # tl.make_tensor_descriptor writes the descriptors to scratch memory "
                     "it takes from this allocator")
        lines.append("    triton.set_allocator(lambda size, alignment, stream: "
                     "torch.empty(size, device=device, dtype=torch.int8))")
    for k in b.kernels:
        lines.append(f"    {k.call()}")
    lines.append(f"    return ({', '.join(spec.results)}{',' if len(spec.results) == 1 else ''})")
    return "\n".join(lines) + "\n"
