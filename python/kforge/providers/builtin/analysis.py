"""How the builtin generator reads a region: its contraction (if any), its row reductions, and
the stages it is cut into (a GEMM with its fused consumers, a rows kernel, an elementwise kernel).

`analyze_region(spec, cut)` answers; the templates (`rows`, `gemm`) and the scheme policy
(`schemes`) act on the answer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.emitter import REDUCERS, CannotGenerate, domain_sizes
from kforge.reference import recognize_combiner, recognize_contraction
from kforge.spec import GenericOp, KernelSpec, affine_dims


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
    # a sibling product of `contraction` (same A, same sizes and maps, another weight as B)
    # whose result the stage's epilogue reads: SwiGLU's gate beside its up projection. A kernel
    # may compute both from one pass over A (gemm.py's paired weights), or run the partner's
    # GEMM first (kernels._build_stage).
    partner: Contraction | None = None

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
    stages = _pair_siblings(spec, stages)
    first = stages[0]
    first.stages = stages
    return first


def siblings(spec: KernelSpec, c1: Contraction, c2: Contraction) -> bool:
    """Two products of one A (the same tensor, read by the same map) with the same sizes and
    maps, no batch, each B a weight of its own (f32, or a bf16 model's bf16): one pass over A
    serves both."""
    o1, o2 = c1.op, c2.op
    return (not c1.batch and not c2.batch and c1.sizes == c2.sizes
            and (c1.a, c1.b, c1.m, c1.n, c1.k) == (c2.a, c2.b, c2.m, c2.n, c2.k)
            and o1.operands[c1.a] == o2.operands[c2.a]
            and o1.indexing_maps == o2.indexing_maps
            and len(o1.body.stmts) == len(o2.body.stmts)
            and weight_source(spec, o1.operands[c1.b], widened=True) is not None
            and weight_source(spec, o2.operands[c2.b], widened=True) is not None
            and spec.tensor(o1.results[0]).dtype == spec.tensor(o2.results[0]).dtype)


def _pair_siblings(spec: KernelSpec, stages: list[RegionShape]) -> list[RegionShape]:
    """A GEMM stage that only materializes its product for the next GEMM stage, whose
    contraction is its sibling (`siblings`), becomes that stage's `partner`: one stage, two
    products of one A."""
    out: list[RegionShape] = []
    for i, st in enumerate(stages):
        prev = out[-1] if out else None
        if (prev is not None and prev.kind == "gemm" and st.kind == "gemm"
                and prev.partner is None and st.partner is None
                and not prev.reductions and not prev.outputs
                and prev.materialize == [prev.contraction.op.results[0]]
                and siblings(spec, prev.contraction, st.contraction)
                and not any(prev.materialize[0] in later.materialize or
                            prev.materialize[0] in later.outputs
                            for later in stages[i + 1:])):
            st.partner = prev.contraction
            out[-1] = st
            continue
        out.append(st)
    return out


def unpaired(stage: RegionShape) -> list[RegionShape]:
    """A stage with a partner as the two stages it was: the partner's GEMM storing its product,
    then the stage reading it (for kernels that compute one product at a time)."""
    if stage.partner is None:
        return [stage]
    p = stage.partner.op.results[0]
    first = RegionShape("gemm", [], contraction=stage.partner, materialize=[p])
    second = RegionShape(stage.kind, list(stage.outputs), contraction=stage.contraction,
                         reductions=list(stage.reductions), rows=stage.rows, cols=stage.cols,
                         materialize=list(stage.materialize))
    return [first, second]


def _storable(spec: KernelSpec, stage: RegionShape, value: str, cut: int = FUSED) -> bool:
    """Whether `stage`'s kernel can store `value` from its tile: a stage with row reductions
    one value per row or (but under NARROW) a whole row (see _emit_rows)."""
    shape = spec.tensor(value).shape
    numel = math.prod(shape)
    if not stage.reductions:
        return True      # a GEMM stage without them finishes moved outputs itself (_epilogues)
    return numel == stage.rows or (cut < NARROW and numel == stage.rows * stage.cols and
                                   row_index(shape, stage.rows, stage.cols) is not None)


def partial_reductions(spec: KernelSpec, stage: RegionShape) -> list[str] | None:
    """The reduction results of a GEMM stage whose row reductions a GEMM tile can reduce over
    its own columns and a rows kernel finish from the tiles' partials (kernels._build_stage,
    PARTIAL), or None: a 2-D product with no partner; every reduction over the product's N
    for each of its M rows; every combiner a sum, max or min (kforge's REDUCERS); no reduction
    reading another's result (a mean then a variance, a max then a sum of exponentials: those
    need the whole row); the stage storing only values of one per row."""
    con = stage.contraction
    if stage.kind != "gemm" or not stage.reductions or stage.partner is not None \
            or con is None or con.batch:
        return None
    M, N = con.extent(con.m), con.extent(con.n)
    if (stage.rows, stage.cols) != (M, N) \
            or any(math.prod(spec.tensor(o).shape) != M for o in stage.stores):
        return None
    # (a result nothing reads is left out: amax's index beside its value)
    used = lambda r: bool(spec.users(r)) or r in spec.results     # noqa: E731
    results = [r for op in stage.reductions for r in op.results if used(r)]
    vc = con.op.results[0]
    for op in stage.reductions:
        for j, r in enumerate(op.results):
            comb = recognize_combiner(op, j)
            if used(r) and (comb is None or comb[0] not in REDUCERS):
                return None
        # what the reduction reads, back to the product: no other reduction's result
        seen, todo = set(), list(op.operands[:op.num_inputs])
        while todo:
            v = todo.pop()
            if v in seen or v == vc:
                continue
            seen.add(v)
            if v in results:
                return None
            prod = spec.producer(v)
            if prod is not None:
                todo.extend(prod.operands)
    return results


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


def row_index(shape, rows: int, cols: int):
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


def is_widening(op) -> bool:
    """`op` is an elementwise generic whose body only widens its one input (`arith.extf`): a
    bf16 model's activation or weight as torch-mlir reads it into an f32 product."""
    return isinstance(op, GenericOp) and not op.reduction_dims and op.num_inputs == 1 \
        and len(op.body.stmts) == 1 and op.body.stmts[0].op == "arith.extf" \
        and op.body.stmts[0].operands[0] == op.body.args[0] \
        and op.body.yields[0] == op.body.stmts[0].id


def weight_source(spec: KernelSpec, name: str, widened: bool = False) -> str | None:
    """The weight argument `name` only moves (reshape, transpose, broadcast copy), when that
    argument is read nowhere else in the region: prepare_weights may then re-store it.
    `widened`: also a bf16 weight that `name` widens to f32 on the way (a bf16 model's Linear:
    torch-mlir widens the weight for the product), for kernels that read it as bf16."""
    seen = name
    while True:
        op = spec.producer(seen)
        if op is None:
            break
        if isinstance(op, GenericOp) and not op.reduction_dims and op.num_inputs == 1 \
                and op.body.yields[0] == op.body.args[0]:
            seen = op.operands[0]
        elif widened and is_widening(op):
            seen = op.operands[0]
        elif op.op == "reshape":
            seen = op.operands[0]
        else:
            return None
    arg = next((a for a in spec.args if a.name == seen), None)
    if arg is None or not arg.weight or arg.dtype not in (("f32", "bf16") if widened else ("f32",)):
        return None
    if len(spec.users(seen)) != 1 or seen in spec.results:
        return None
    return seen
