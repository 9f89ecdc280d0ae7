"""The correctness oracle: a PyTorch execution of a kernel spec or a whole host plan.

Every op record is executed with torch, on whatever device the inputs live:

* `generic`: the iteration domain is materialized as broadcastable index grids (one per
  iterator); each operand is read through its indexing map (a view for projected permutations,
  a gather for anything else: convolution windows `d0 + d3`, `floordiv`, constants); the body
  runs as tensor expressions over the whole domain. Reductions whose yield is `out (+|max|min|*)
  f(...)` are recognized and finished with torch.sum/amax/amin/prod over the reduction dims;
  contractions (`out + a * b` over projected-permutation maps) go to torch.einsum; any other
  combiner runs as a sequential loop over the reduction points only.
* `reshape`, `empty`, `constant`: torch.reshape, a NaN-filled tensor (reading an uninitialized
  tensor must never look right), torch.full / torch.tensor.

`reference_fn(spec)` returns `f(*args) -> tuple[Tensor, ...]`; `dtype=torch.float64` computes
all floating-point math in float64 (for measuring a kernel's error). `run_host_plan` runs a
whole host plan, calling verified kernels where given. `reference_source(spec)` renders the
region as readable PyTorch-flavoured text for prompts.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from kforge.errors import UserError
from kforge.spec import (AffineBinary, AffineConst, AffineDim, AffineExpr, AffineMap,
                         AffineSymbol, Body, CallStep, ConstantOp, EmptyOp, FallbackOp, GenericOp,
                         HostPlan, KernelSpec, KernelStep, OpaqueOp, PadOp, ReshapeOp,
                         affine_text, load_spec)

TORCH_DTYPES = {
    "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
    "i1": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
    "i64": torch.int64, "index": torch.int64,
}

# Reductions finished by torch: combiner op -> (torch reduction, elementwise combine)
_COMBINERS = {
    "arith.addf": ("sum", torch.add), "arith.addi": ("sum", torch.add),
    "arith.mulf": ("prod", torch.mul), "arith.muli": ("prod", torch.mul),
    "arith.maximumf": ("amax", torch.maximum), "arith.maxnumf": ("amax", torch.fmax),
    "arith.maxsi": ("amax", torch.maximum), "arith.maxui": ("amax", torch.maximum),
    "arith.minimumf": ("amin", torch.minimum), "arith.minnumf": ("amin", torch.fmin),
    "arith.minsi": ("amin", torch.minimum), "arith.minui": ("amin", torch.minimum),
}

# Above this many domain points a vectorized reduction is evaluated in slices of one
# reduction dimension, and an elementwise op in slices of one parallel dimension, to bound
# memory.
_MAX_DOMAIN_POINTS = 1 << 24

# A contraction whose operands must be widened (the float64 reference) casts them a slice of
# one output dimension at a time when the widened operands would take more than this many
# bytes: a 32768x32768 fp32 weight is 8.6 GB in float64, twice the region's own bytes
# (issue 13: verification within about 3x the region's inputs + weights + outputs).
_MAX_WIDENED_BYTES = 1 << 28


def torch_dtype(dtype: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise UserError(f"unknown element type {dtype!r}") from None


# ---------------------------------------------------------------------------------------------
# Affine maps over index grids
# ---------------------------------------------------------------------------------------------
def _eval_affine(e: AffineExpr, grids):
    if isinstance(e, AffineDim):
        return grids[e.d]
    if isinstance(e, AffineConst):
        return e.c
    if isinstance(e, AffineSymbol):
        raise UserError("affine symbols are not supported in kernel spec version 1")
    a, b = _eval_affine(e.lhs, grids), _eval_affine(e.rhs, grids)
    if e.op == "add":
        return a + b
    if e.op == "mul":
        return a * b
    if e.op == "mod":
        return a % b                  # python and torch % both floor: affine mod semantics
    if e.op == "floordiv":
        return a // b
    if e.op == "ceildiv":
        return -((-a) // b)
    raise UserError(f"unknown affine operator {e.op!r}")


def _grids(sizes: Sequence[int], device) -> list[torch.Tensor]:
    n = len(sizes)
    return [torch.arange(s, device=device).view([1] * i + [s] + [1] * (n - 1 - i))
            for i, s in enumerate(sizes)]


def _read_through_map(t: torch.Tensor, m: AffineMap, grids, n: int) -> torch.Tensor:
    """The operand as an n-d tensor broadcastable over the domain: result[p] = t[m(p)]."""
    if not m.results:
        return t.reshape([1] * n) if t.dim() else t.view([1] * n)
    if m.is_projected_permutation() or all(isinstance(r, (AffineDim, AffineConst))
                                           for r in m.results):
        dims = [r.d for r in m.results if isinstance(r, AffineDim)]
        if len(set(dims)) == len(dims):
            # a view: select constants, move the remaining axes into domain order
            index = tuple(r.c if isinstance(r, AffineConst) else slice(None) for r in m.results)
            v = t[index]
            order = sorted(range(len(dims)), key=lambda i: dims[i])
            v = v.permute(order)
            shape = [1] * n
            for i in order:
                shape[dims[i]] = v.shape[order.index(i)]
            v = v.reshape(shape)
            for d in range(n):       # a slice of the domain (chunked reductions)
                size = grids[d].shape[d]
                if v.shape[d] not in (1, size):
                    v = v.narrow(d, int(grids[d].reshape(-1)[0]), size)
            return v
    index = []
    for r in m.results:
        ix = _eval_affine(r, grids)
        index.append(ix if torch.is_tensor(ix) else
                     torch.full((), ix, dtype=torch.int64, device=t.device))
    v = t[tuple(index)]
    return v.reshape(list(v.shape) + [1] * (n - v.dim())) if v.dim() < n else v


def _write_through_map(values: torch.Tensor, m: AffineMap, grids, out, n: int, *,
                       shape=None, dtype=None, view: bool = False) -> torch.Tensor:
    """out[m(p)] = values[p] for every domain point p (values broadcastable over the domain).
    `out` may instead be a function making it, given with its `shape` and `dtype`: it is then
    called only where an indexed write needs it. `view`: where the map is a permutation, the
    result may be a view of `values` (a transpose or a broadcast holds no memory of its own)."""
    domain = [g.shape[i] for i, g in enumerate(grids)]
    if torch.is_tensor(out):
        shape, dtype = tuple(out.shape), out.dtype
    values = values.to(dtype)
    if not m.results:
        return values.expand(domain).reshape(-1)[-1].reshape(shape).clone()
    dims = [r.d for r in m.results if isinstance(r, AffineDim)]
    keep = sorted(set(dims))
    if (len(dims) == len(m.results) and len(keep) == len(dims)
            and all(domain[d] == 1 or d in keep for d in range(n))):
        v = values.expand(domain).reshape([domain[d] for d in keep])
        v = v.permute([keep.index(d) for d in dims]).reshape(shape)
        return v if view else v.contiguous()
    if not torch.is_tensor(out):
        out = out()
    index = []
    for r in m.results:
        ix = _eval_affine(r, grids)
        index.append(ix if torch.is_tensor(ix) else
                     torch.full((), ix, dtype=torch.int64, device=out.device))
    *index, values = torch.broadcast_tensors(*index, values)
    out[tuple(index)] = values
    return out


def _domain_sizes(op: GenericOp, tensors: Sequence[torch.Tensor]) -> list[int]:
    n = len(op.iterator_types)
    sizes: list[int | None] = [None] * n
    for t, m in zip(tensors, op.indexing_maps):
        for k, r in enumerate(m.results):
            if isinstance(r, AffineDim) and sizes[r.d] is None:
                sizes[r.d] = t.shape[k]
    for t, m in zip(tensors, op.indexing_maps):       # d = expr(others) - c, e.g. conv windows
        for k, r in enumerate(m.results):
            if isinstance(r, AffineBinary) and r.op == "add":
                missing = [d for d in _plain_add_dims(r) if sizes[d] is None]
                if len(missing) == 1 and all(sizes[d] is not None for d in _plain_add_dims(r)
                                             if d != missing[0]):
                    # extent of input k = sum of (extent-1) of the window dims + 1
                    known = sum(sizes[d] - 1 for d in _plain_add_dims(r) if d != missing[0])
                    sizes[missing[0]] = t.shape[k] - known
    if any(s is None for s in sizes):
        raise UserError(f"{op.name}: cannot infer the size of iteration dimension "
                        f"d{sizes.index(None)} from its operands")
    return sizes  # type: ignore[return-value]


def _plain_add_dims(e: AffineExpr) -> list[int]:
    if isinstance(e, AffineDim):
        return [e.d]
    if isinstance(e, AffineBinary) and e.op == "add":
        return _plain_add_dims(e.lhs) + _plain_add_dims(e.rhs)
    return []


# ---------------------------------------------------------------------------------------------
# Scalar bodies as tensor expressions
# ---------------------------------------------------------------------------------------------
def _cmpf(pred: str, a, b):
    nan = torch.isnan(a) | torch.isnan(b)
    ordered = {"oeq": torch.eq, "ogt": torch.gt, "oge": torch.ge, "olt": torch.lt,
               "ole": torch.le, "one": torch.ne}
    unordered = {"ueq": torch.eq, "ugt": torch.gt, "uge": torch.ge, "ult": torch.lt,
                 "ule": torch.le}
    if pred in ordered:
        return ordered[pred](a, b) & ~nan
    if pred in unordered:
        return unordered[pred](a, b) | nan
    if pred == "une":
        return torch.ne(a, b)
    if pred == "ord":
        return ~nan
    if pred == "uno":
        return nan
    if pred == "true":
        return torch.ones_like(nan)
    if pred == "false":
        return torch.zeros_like(nan)
    raise UserError(f"arith.cmpf: unknown predicate {pred!r}")


def _cmpi(pred: str, a, b):
    table = {"eq": torch.eq, "ne": torch.ne, "slt": torch.lt, "sle": torch.le, "sgt": torch.gt,
             "sge": torch.ge, "ult": torch.lt, "ule": torch.le, "ugt": torch.gt, "uge": torch.ge}
    if pred not in table:
        raise UserError(f"arith.cmpi: unknown predicate {pred!r}")
    return table[pred](a, b)


def _round_half_away(x):
    return torch.sign(x) * torch.floor(torch.abs(x) + 0.5)


_UNARY = {
    "arith.negf": torch.neg, "math.exp": torch.exp, "math.exp2": torch.exp2,
    "math.expm1": torch.expm1, "math.log": torch.log, "math.log1p": torch.log1p,
    "math.log2": torch.log2, "math.sqrt": torch.sqrt, "math.rsqrt": torch.rsqrt,
    "math.tanh": torch.tanh, "math.erf": torch.erf, "math.erfc": torch.erfc,
    "math.sin": torch.sin, "math.cos": torch.cos, "math.tan": torch.tan, "math.atan": torch.atan,
    "math.absf": torch.abs, "math.absi": torch.abs, "math.floor": torch.floor,
    "math.ceil": torch.ceil, "math.round": _round_half_away, "math.roundeven": torch.round,
    "math.trunc": torch.trunc, "math.sigmoid": torch.sigmoid,
}
_BINARY = {
    "arith.addf": torch.add, "arith.addi": torch.add, "arith.subf": torch.sub,
    "arith.subi": torch.sub, "arith.mulf": torch.mul, "arith.muli": torch.mul,
    "arith.divf": torch.div, "arith.remf": torch.fmod, "arith.remsi": torch.fmod,
    "arith.remui": torch.remainder,
    "arith.divsi": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "arith.divui": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum,
    "arith.maxnumf": torch.fmax, "arith.minnumf": torch.fmin,
    "arith.maxsi": torch.maximum, "arith.minsi": torch.minimum,
    "arith.maxui": torch.maximum, "arith.minui": torch.minimum,
    "arith.andi": torch.bitwise_and, "arith.ori": torch.bitwise_or,
    "arith.xori": torch.bitwise_xor, "math.powf": torch.pow, "math.fpowi": torch.pow,
    "math.atan2": torch.atan2,
}
_NARROW = (torch.bfloat16, torch.float16)
_CASTS = ("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi",
          "arith.fptoui", "arith.index_cast", "arith.index_castui", "arith.extsi",
          "arith.extui", "arith.trunci")


def round_operand(t: torch.Tensor, fmt: str | None) -> torch.Tensor:
    """`t` with its values rounded to a matrix-product operand format, dtype unchanged:
    "bf16" (round to nearest even, as a cast to bf16 does), "tf32" (fp32 with a 10-bit
    mantissa, round to nearest, ties away: cvt.rna.tf32); None: unchanged."""
    if fmt is None or not t.is_floating_point():
        return t
    if fmt == "bf16":
        return t.to(torch.bfloat16).to(t.dtype)
    if fmt == "tf32":
        bits = t.to(torch.float32).contiguous().view(torch.int32)
        bits = (bits + 0x1000) & ~0x1FFF          # add half of the dropped 13 bits, drop them
        return bits.view(torch.float32).to(t.dtype)
    raise ValueError(f"unknown operand format {fmt!r}")


class _Types:
    """Element types used for computing: the spec's own, or every float type widened; and
    the format contraction operands are rounded to first (None: not rounded)."""

    def __init__(self, float_dtype: torch.dtype | None, operand_format: str | None = None):
        self.float_dtype = float_dtype
        self.operand_format = operand_format
        # tensor.empty results read only as a linalg.generic's init: made as one NaN broadcast
        # over the shape (no memory), since the interpreter never writes an init in place
        self.broadcast_empties: frozenset = frozenset()

    def of(self, dtype: str) -> torch.dtype:
        t = torch_dtype(dtype)
        if self.float_dtype is not None and t.is_floating_point:
            return self.float_dtype
        return t

    def of_tensor(self, t: torch.Tensor) -> torch.dtype:
        if self.float_dtype is not None and t.dtype.is_floating_point:
            return self.float_dtype
        return t.dtype


def _eval_body(body: Body, env: dict, types: _Types, device, wanted: Sequence[str]) -> list:
    """Evaluate the statements `wanted` depends on; env maps block args to tensors."""
    needed = set()
    stack = list(wanted)
    while stack:
        name = stack.pop()
        if name in needed or name in env:
            continue
        needed.add(name)
        s = body.stmt(name)
        stack.extend(s.operands)
    # a statement's value goes once its last reader has run (a float64 GELU over a GEMM's
    # output held five full-size temporaries at once otherwise)
    last: dict[str, str] = {}
    for s in body.stmts:
        if s.id in needed:
            for o in s.operands:
                last[o] = s.id
    dead_after: dict[str, list[str]] = {}
    for o, reader in last.items():
        if o in needed and o not in wanted:
            dead_after.setdefault(reader, []).append(o)
    for s in body.stmts:
        if s.id not in needed:
            continue
        args = [env[o] for o in s.operands]
        dt = types.of(s.type) if s.type else None
        op = s.op
        if op == "arith.constant":
            # a fill, not a copy from host memory (CUDA graph capture refuses those)
            r = torch.full((), s.value, dtype=dt, device=device)
        elif op == "linalg.index":
            r = env[("index", s.dim)]
        elif op in _BINARY:
            r = _BINARY[op](*args)
        elif op in _UNARY:
            r = _UNARY[op](*args)
        elif op == "arith.select":
            r = torch.where(args[0], args[1], args[2])
        elif op == "arith.cmpf":
            r = _cmpf(s.predicate, *args)
        elif op == "arith.cmpi":
            r = _cmpi(s.predicate, *args)
        elif op == "arith.truncf" and types.float_dtype is None and dt in _NARROW \
                and getattr(body.stmt(s.operands[0]), "op", None) == "arith.constant":
            # a Python scalar in a 16-bit model (`x * 2.98`): torch-mlir narrows the constant,
            # eager PyTorch multiplies in fp32 by the scalar unrounded and rounds the product
            # once; a 0-dim fp32 tensor does the same here (the result stays bf16)
            r = args[0].to(torch.float32)
            dt = None
        elif op in _CASTS:
            r = args[0].to(dt)
        elif op == "arith.bitcast":
            r = args[0].contiguous().view(dt)
        else:
            raise UserError(f"the reference does not know the body op {op!r}")
        if dt is not None and r.dtype != dt:
            r = r.to(dt)
        env[s.id] = r
        del args, r
        for o in dead_after.get(s.id, ()):
            env.pop(o, None)
    return [env[w] for w in wanted]


def _depends_on(body: Body, name: str, on: set[str]) -> bool:
    if name in on:
        return True
    s = body.stmt(name)
    return s is not None and any(_depends_on(body, o, on) for o in s.operands)


def recognize_combiner(op: GenericOp, j: int) -> tuple[str, str] | None:
    """For output j of a reduction: (combiner op, the stmt id of f) when yield_j = out_j op f,
    with f independent of every output block argument; else None."""
    body = op.body
    out_args = set(body.args[op.num_inputs:])
    out_j = body.args[op.num_inputs + j]
    s = body.stmt(body.yields[j])
    if s is None or s.op not in _COMBINERS or len(s.operands) != 2:
        return None
    a, b = s.operands
    if a == out_j and not _depends_on(body, b, out_args):
        return s.op, b
    if b == out_j and not _depends_on(body, a, out_args):
        return s.op, a
    return None


def recognize_contraction(op: GenericOp, projected: bool = True
                          ) -> tuple[str, str, str] | None:
    """(lhs block arg, rhs block arg, combiner) when the body is out + a * b (casts allowed)
    with one output: a matmul/batch-matmul/einsum when the maps are projected permutations
    (projected=False also accepts convolution-style input maps such as d2 + d5)."""
    if len(op.results) != 1 or op.num_inputs != 2 or not op.reduction_dims:
        return None
    comb = recognize_combiner(op, 0)
    if comb is None or comb[0] not in ("arith.addf", "arith.addi"):
        return None
    body = op.body
    mul = body.stmt(comb[1])
    if mul is None or mul.op not in ("arith.mulf", "arith.muli"):
        return None

    def strip(name):
        s = body.stmt(name)
        while s is not None and s.op in ("arith.extf", "arith.sitofp", "arith.extsi"):
            name = s.operands[0]
            s = body.stmt(name)
        return name

    a, b = strip(mul.operands[0]), strip(mul.operands[1])
    ins = body.args[:2]
    if {a, b} != set(ins):
        return None
    maps = op.indexing_maps
    if not maps[2].is_projected_permutation():
        return None
    if projected and not all(m.is_projected_permutation() for m in maps):
        return None
    if any(d in op.reduction_dims for d in maps[2].result_dims()):
        return None
    return a, b, comb[0]


# ---------------------------------------------------------------------------------------------
# Executing op records
# ---------------------------------------------------------------------------------------------
def _resolve_shape(shape, name: str) -> list[int]:
    if any(s is None for s in shape):
        raise UserError(f"{name}: dynamic size without 'dynamic_sizes_from'")
    return list(shape)


def _exec_generic(op: GenericOp, env: dict, types: _Types, out_types, needed: set[str]):
    tensors = [env[o] for o in op.operands]
    device = tensors[0].device if tensors else torch.device("cpu")
    sizes = _domain_sizes(op, tensors)
    n = len(sizes)
    body = op.body
    ni = op.num_inputs
    inits = tensors[ni:]
    maps = op.indexing_maps
    red = op.reduction_dims

    # contraction fast path (a policy's operand rounding is applied to its operands there)
    con = recognize_contraction(op) if red else None
    if con is not None and op.results[0] in needed:
        return [_contract(op, con, tensors, inits[0], out_types[0], types.operand_format)]

    # a policy's operand rounding: both operands of a contraction (matmul or convolution)
    if types.operand_format is not None and red:
        con_any = recognize_contraction(op, projected=False)
        if con_any is not None:
            tensors = list(tensors)
            for arg in con_any[:2]:
                k = body.args.index(arg)
                tensors[k] = round_operand(tensors[k], types.operand_format)

    live = [j for j, r in enumerate(op.results) if r in needed]
    if not red and _moves_only(op, live):
        # a transpose, broadcast or copy computes nothing: its result is a view of its input,
        # in the input's own element type (widened where it is read, as every value is), so
        # that a float64 reference does not hold a widened copy of a transposed weight
        outs = [None] * len(inits)
        grids = _grids(sizes, device)
        for j in live:
            k = body.args.index(body.yields[j])
            y = _read_through_map(tensors[k], maps[k], grids, n)
            dt = out_types[j]
            if types.float_dtype is not None and dt == types.float_dtype and \
                    y.dtype.is_floating_point:
                dt = y.dtype
            outs[j] = _write_through_map(y, maps[ni + j], grids, None, n, view=True,
                                         shape=tuple(inits[j].shape), dtype=dt) \
                if _is_permutation(maps[ni + j], n) else None
        if all(outs[j] is not None for j in live):
            return [o if o is not None else _blank(inits[j], out_types[j], device)
                    for j, o in enumerate(outs)]
    if not red and math.prod(sizes) > _MAX_DOMAIN_POINTS and \
            all(_is_permutation(maps[ni + j], n) for j in live):
        return _exec_elementwise_sliced(op, tensors, inits, sizes, types, out_types, live,
                                        device)

    grids = _grids(sizes, device)
    env_b: dict = {}
    for i, (t, m) in enumerate(zip(tensors, maps)):
        if i < ni:
            env_b[body.args[i]] = _read_through_map(t, m, grids, n).to(types.of_tensor(t))
    for d in range(n):
        env_b[("index", d)] = grids[d]
    def blank(j):
        t, dt = inits[j], out_types[j]
        return (torch.full(tuple(t.shape), float("nan"), dtype=dt, device=device)
                if dt.is_floating_point else torch.zeros(tuple(t.shape), dtype=dt,
                                                         device=device))

    if not red:
        for j, init in enumerate(inits):
            env_b[body.args[ni + j]] = _read_through_map(init.to(out_types[j]), maps[ni + j],
                                                         grids, n)
        ys = _eval_body(body, env_b, types, device, [body.yields[j] for j in live])
        del env_b
        # an output is allocated only where it is written element by element (a map that is
        # not a permutation): otherwise the body's values become it, and a large elementwise
        # step holds its inputs and one result, not a NaN-filled copy beside them
        outs: list = [None] * len(inits)
        for j, y in zip(live, ys):
            outs[j] = _write_through_map(y, maps[ni + j], grids, lambda j=j: blank(j), n,
                                         shape=tuple(inits[j].shape), dtype=out_types[j])
        return [o if o is not None else blank(j) for j, o in enumerate(outs)]
    outs = [blank(j) for j in range(len(inits))]

    combiners = {j: recognize_combiner(op, j) for j in live}
    if all(c is not None for c in combiners.values()):
        points = math.prod(sizes)
        slice_dim = max(red, key=lambda d: sizes[d])
        chunk = sizes[slice_dim]
        if points > _MAX_DOMAIN_POINTS:
            chunk = max(1, _MAX_DOMAIN_POINTS // max(1, points // sizes[slice_dim]))
        accs: dict[int, torch.Tensor] = {}
        for start in range(0, sizes[slice_dim], chunk):
            if chunk != sizes[slice_dim]:
                sub_grids = list(grids)
                sub_grids[slice_dim] = grids[slice_dim].narrow(slice_dim, start,
                                                               min(chunk, sizes[slice_dim] - start))
                env_c = {k: v for k, v in env_b.items() if isinstance(k, tuple)}
                for d in range(n):
                    env_c[("index", d)] = sub_grids[d]
                for i, (t, m) in enumerate(zip(tensors[:ni], maps[:ni])):
                    env_c[body.args[i]] = _read_through_map(t, m, sub_grids, n).to(
                        types.of_tensor(t))
                cur_grids = sub_grids
            else:
                env_c, cur_grids = env_b, grids
            shape = [g.shape[i] for i, g in enumerate(cur_grids)]
            fs = _eval_body(body, env_c, types, device, [combiners[j][1] for j in live])
            for j, f in zip(live, fs):
                kind, combine = _COMBINERS[combiners[j][0]]
                f = f.expand(shape)
                r = getattr(torch, kind)(f, dim=red, keepdim=True)
                accs[j] = r if j not in accs else combine(accs[j], r)
        for j in live:
            init = _read_through_map(inits[j].to(out_types[j]), maps[ni + j], grids, n)
            _, combine = _COMBINERS[combiners[j][0]]
            total = combine(init, accs[j].to(out_types[j]))
            reduced_grids = [g if d not in red else g[tuple(slice(0, 1) if k == d else slice(None)
                                                           for k in range(n))]
                             for d, g in enumerate(grids)]
            outs[j] = _write_through_map(total, maps[ni + j], reduced_grids, outs[j], n)
        return outs

    # sequential: a loop over the reduction points, vectorized over the parallel dims
    par_grids = list(grids)
    for d in red:
        par_grids[d] = grids[d][tuple(slice(0, 1) if k == d else slice(None) for k in range(n))]
    accs = [_read_through_map(init.to(dt), maps[ni + j], par_grids, n)
            for j, (init, dt) in enumerate(zip(inits, out_types))]
    for point in itertools.product(*(range(sizes[d]) for d in red)):
        pg = list(par_grids)
        for d, v in zip(red, point):
            pg[d] = torch.full([1] * n, v, dtype=torch.int64, device=device)
        env_s = {("index", d): pg[d] for d in range(n)}
        for i, (t, m) in enumerate(zip(tensors[:ni], maps[:ni])):
            env_s[body.args[i]] = _read_through_map(t.to(types.of_tensor(t)), m, pg, n)
        for j in range(len(inits)):
            env_s[body.args[ni + j]] = accs[j]
        accs = [y.to(dt) for y, dt in zip(_eval_body(body, env_s, types, device, body.yields),
                                          out_types)]
    for j in live:
        outs[j] = _write_through_map(accs[j], maps[ni + j], par_grids, outs[j], n)
    return outs


def _blank(init: torch.Tensor, dt: torch.dtype, device) -> torch.Tensor:
    return (torch.full(tuple(init.shape), float("nan"), dtype=dt, device=device)
            if dt.is_floating_point else torch.zeros(tuple(init.shape), dtype=dt, device=device))


def _is_permutation(m: AffineMap, n: int) -> bool:
    """Every domain dimension, each once, and nothing else: a result of the domain's size."""
    dims = [r.d for r in m.results if isinstance(r, AffineDim)]
    return len(dims) == len(m.results) == n and sorted(dims) == list(range(n))


def _moves_only(op: GenericOp, live: Sequence[int]) -> bool:
    """The op's live results are its inputs, unchanged (a transpose, a broadcast, a fill)."""
    body = op.body
    return bool(live) and all(body.yields[j] in body.args[:op.num_inputs] for j in live)


def _exec_elementwise_sliced(op: GenericOp, tensors, inits, sizes, types: _Types, out_types,
                             live, device) -> list:
    """A large elementwise op, a slice of its largest dimension at a time: its inputs are read
    and widened a slice at a time and its body's temporaries are slice-sized; each result
    (through a permutation map) is written slice by slice into one tensor. Elementwise, so the
    values are those of the whole computation."""
    body, ni, maps, n = op.body, op.num_inputs, op.indexing_maps, len(sizes)
    grids = _grids(sizes, device)
    d = max(range(n), key=lambda k: sizes[k])
    rest = math.prod(sizes) // sizes[d]
    step = max(1, _MAX_DOMAIN_POINTS // max(1, rest))
    outs = [None] * len(inits)
    for j in live:
        outs[j] = torch.empty(tuple(inits[j].shape), dtype=out_types[j], device=device)
    for start in range(0, sizes[d], step):
        length = min(step, sizes[d] - start)
        sub = list(grids)
        sub[d] = grids[d].narrow(d, start, length)
        env = {("index", k): sub[k] for k in range(n)}
        for i, (t, m) in enumerate(zip(tensors[:ni], maps[:ni])):
            env[body.args[i]] = _read_through_map(t, m, sub, n).to(types.of_tensor(t))
        for j, init in enumerate(inits):
            env[body.args[ni + j]] = _read_through_map(init, maps[ni + j], sub, n).to(
                out_types[j])
        ys = _eval_body(body, env, types, device, [body.yields[j] for j in live])
        del env
        shape = [g.shape[k] for k, g in enumerate(sub)]
        for j, y in zip(live, ys):
            dims = [r.d for r in maps[ni + j].results]
            outs[j].narrow(dims.index(d), start, length).copy_(
                y.to(out_types[j]).expand(shape).permute(dims))
        del ys
    return [o if o is not None else _blank(inits[j], out_types[j], device)
            for j, o in enumerate(outs)]


def _contract(op: GenericOp, con, tensors, init: torch.Tensor, dt: torch.dtype,
              operand_format: str | None) -> torch.Tensor:
    """init + einsum(a, b) in `dt`, the operands rounded to `operand_format` first. Where the
    operands must be widened and their widened copies would be large (_MAX_WIDENED_BYTES), in
    blocks of the output: each large operand is sliced along one output dimension it indexes
    and rounded and widened a slice at a time. Each element is the same dot product either way
    (its summation order is the library's, which may block a slice differently: float64
    rounding)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    body, maps = op.body, op.indexing_maps
    a_arg, b_arg, _ = con
    pair = (body.args.index(a_arg), body.args.index(b_arg))
    sub = lambda m: "".join(letters[d] for d in m.result_dims())
    equation = f"{sub(maps[pair[0]])},{sub(maps[pair[1]])}->{sub(maps[2])}"

    def operand(t):
        t = round_operand(t, operand_format)
        return t.to(dt) if t.dtype != dt else t

    widened = {k: tensors[k].numel() * dt.itemsize for k in pair
               if tensors[k].dtype != dt or operand_format is not None}
    out_dims = maps[2].result_dims()
    steps: dict[int, int] = {}            # output dimension -> slice length
    if sum(widened.values()) > _MAX_WIDENED_BYTES:
        share = _MAX_WIDENED_BYTES // 2
        for k in sorted(widened, key=widened.get, reverse=True):
            dims = [d for d in maps[k].result_dims() if d in out_dims]
            if widened[k] <= share or not dims:
                continue
            free = [d for d in dims if d not in steps] or dims
            extent = {d: tensors[k].shape[maps[k].result_dims().index(d)] for d in free}
            d = max(free, key=extent.get)
            step = max(1, extent[d] * share // widened[k])
            steps[d] = min(steps.get(d, extent[d]), step)
    if not steps:
        prod = torch.einsum(equation, operand(tensors[pair[0]]), operand(tensors[pair[1]]))
        init = init.to(dt)
        if prod.shape == init.shape and not torch._debug_has_internal_overlap(prod):
            # in place (IEEE addition commutes: the same bits as init + prod), so that a large
            # product (an LM head's float64 logits: 26 GB) is not held twice
            return prod.add_(init)
        return init + prod

    def sliced(t, m_dims, block):
        for d, (start, length) in block.items():
            if d in m_dims:
                t = t.narrow(m_dims.index(d), start, length)
        return t

    extents = {d: init.shape[out_dims.index(d)] for d in steps}
    whole = {k: operand(tensors[k]) for k in pair
             if not any(d in maps[k].result_dims() for d in steps)}
    out = torch.empty(tuple(init.shape), dtype=dt, device=tensors[pair[0]].device)
    ranges = [[(d, (s, min(steps[d], extents[d] - s))) for s in range(0, extents[d], steps[d])]
              for d in steps]
    for combo in itertools.product(*ranges):
        block = dict(combo)
        ops = [whole[k] if k in whole else
               operand(sliced(tensors[k], maps[k].result_dims(), block)) for k in pair]
        prod = torch.einsum(equation, *ops)
        del ops
        part = sliced(init, out_dims, block).to(dt)
        torch.add(prod, part, out=sliced(out, out_dims, block))
        del prod, part
    return out


def _exec_op(op, env: dict, tensor_type, types: _Types, needed: set[str], device):
    """Execute one op record; tensor_type(name) -> (shape, dtype string)."""
    if isinstance(op, GenericOp):
        out_types = [types.of(tensor_type(r)[1]) for r in op.results]
        for r, t in zip(op.results, _exec_generic(op, env, types, out_types, needed)):
            env[r] = t
    elif isinstance(op, ReshapeOp):
        src = env[op.operands[0]]
        shape = [-1 if s is None else s for s in tensor_type(op.results[0])[0]]
        env[op.results[0]] = src.reshape(shape)
    elif isinstance(op, EmptyOp):
        shape, dtype = tensor_type(op.results[0])
        shape = list(shape)
        dyn = iter(op.dynamic_sizes_from)
        for i, s in enumerate(shape):
            if s is None:
                try:
                    arg, dim = next(dyn)
                except StopIteration:
                    raise UserError(f"{op.results[0]}: dynamic size without "
                                    "'dynamic_sizes_from'") from None
                shape[i] = env[arg].shape[dim]
        dt = types.of(dtype)
        fill = float("nan") if dt.is_floating_point else 0
        if op.results[0] in types.broadcast_empties:
            env[op.results[0]] = torch.full((), fill, dtype=dt, device=device).expand(shape)
        else:
            env[op.results[0]] = torch.full(shape, fill, dtype=dt, device=device)
    elif isinstance(op, ConstantOp):
        shape, dtype = tensor_type(op.results[0])
        dt = types.of(dtype)
        if op.splat is not None:
            env[op.results[0]] = torch.full(_resolve_shape(shape, op.results[0]), op.splat,
                                            dtype=dt, device=device)
        else:
            env[op.results[0]] = _dense_constant(op, dt, device).reshape(shape)
    elif isinstance(op, PadOp):
        src = env[op.operands[0]]
        src = src.to(types.of_tensor(src))      # padded with the value in the widened type
        amounts = []
        for lo, hi in reversed(list(zip(op.low, op.high))):    # F.pad: last dim first
            amounts += [lo, hi]
        env[op.results[0]] = torch.nn.functional.pad(src, amounts, value=op.value)
    elif isinstance(op, FallbackOp):
        from kforge.fallbacks import run_fallback
        # widened like every other op (float64 for measuring a kernel's error)
        operands = [env[o].to(types.of_tensor(env[o])) for o in op.operands]
        outs = _batch_sliced(op.name, op.arg_list(), operands, device) or \
            run_fallback(op.name, op.arg_list(), operands, device)
        for r, t in zip(op.results, outs):
            env[r] = t
    elif isinstance(op, OpaqueOp):
        first = op.mlir.strip().splitlines()[0] if op.mlir.strip() else op.name
        raise UserError(f"cannot execute {op.name} (results {', '.join(op.results)}): kforge-opt "
                        f"exported it as an opaque step, which no runtime executes: {first}")
    else:
        raise UserError(f"the reference cannot execute {type(op).__name__}")


def _needed_values(ops, results) -> set[str]:
    needed = set(results)
    for op in reversed(ops):
        if any(r in needed for r in op.results):
            needed.update(op.operands)
    return needed


def _reads(op) -> list[str]:
    """The values an op record reads: its operands, and an empty's dynamic sizes' sources."""
    return list(getattr(op, "operands", ())) + \
        [name for name, _ in (getattr(op, "dynamic_sizes_from", None) or ())]


def _init_only_empties(ops, results: set[str]) -> frozenset:
    """The tensor.empty results that only linalg.generic ops read, and only as inits."""
    empties = {op.results[0] for op in ops if isinstance(op, EmptyOp)} - results
    for op in ops:
        reads = _reads(op)
        empties -= set(reads[:op.num_inputs]) if isinstance(op, GenericOp) else set(reads)
    return frozenset(empties)


def _last_uses(ops, keep: set[str]) -> list[list[str]]:
    """Per op, the values (not in `keep`) whose last reader it is, so that an interpreted
    region holds only its live values: a chain of large intermediates (a zero-filled
    accumulator, a transposed weight, a product) is not all alive at once."""
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        for name in _reads(op):
            last[name] = i
    out: list[list[str]] = [[] for _ in ops]
    for name, i in last.items():
        if name not in keep:
            out[i].append(name)
    return out


def reference_fn(spec: KernelSpec, dtype: torch.dtype | None = None,
                 operand_format: str | None = None) -> Callable[..., tuple[torch.Tensor, ...]]:
    """A PyTorch function computing the region: f(*args) -> tuple of results (spec order).

    dtype=None computes in the spec's element types; dtype=torch.float64 widens every
    floating-point computation (results come back in float64). operand_format ("tf32",
    "bf16") first rounds the two operands of every contraction to that format: the exact
    result of the arithmetic a reduced-precision policy allows (round_operand)."""
    types = _Types(dtype, operand_format)
    tensor_types = {t.name: (t.shape, t.dtype) for t in spec.args + spec.values}
    needed = _needed_values(spec.ops, spec.results)
    run = [op for op in spec.ops if any(r in needed for r in op.results)]
    dead_after = _last_uses(run, keep={a.name for a in spec.args} | set(spec.results))
    types.broadcast_empties = _init_only_empties(run, set(spec.results))

    def region(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(args) != len(spec.args):
            raise TypeError(f"{spec.name} takes {len(spec.args)} arguments, got {len(args)}")
        device = args[0].device if args else torch.device("cpu")
        env = {a.name: t for a, t in zip(spec.args, args)}
        for i, op in enumerate(run):
            _exec_op(op, env, tensor_types.__getitem__, types, needed, device)
            for name in dead_after[i]:      # a value goes once its last reader has run
                env.pop(name, None)
        # a result that is a view (a transpose, a broadcast: _moves_only) becomes a tensor of
        # its own, in the widened type
        return tuple(_as_result(env[r], types) for r in spec.results)

    region.__name__ = spec.name
    region.__qualname__ = spec.name
    return region


def _as_result(t: torch.Tensor, types: _Types) -> torch.Tensor:
    if types.float_dtype is not None and t.is_floating_point() and t.dtype != types.float_dtype:
        t = t.to(types.float_dtype)
    return t.contiguous()


# A constant's tensor per (op, device), made once: copying it from host memory on every run
# would cost a transfer each time, and a CUDA graph capture refuses such copies.
_CONSTANTS: dict = {}


# attention ops whose reference runs one sequence at a time when its score matrices would be
# large: a prefill's float64 SDPA ([8, 32, 2048, 2048] scores, 8 GB a matrix) ran out of the
# H200's memory beside other verifications (kforge.attention slices itself: attention_op)
_BATCH_SLICED = ("aten.scaled_dot_product_attention", "kforge.attention_kv")


def _batch_sliced(name: str, template, operands: list, device) -> tuple | None:
    """The op applied to each batch row of its operands (those whose first dimension is the
    batch: q, k, v, a per-sequence mask) and concatenated, where its score matrices would take
    more than attention_op.SLICE_BYTES; None where it runs whole."""
    from kforge.attention_op import SLICE_BYTES, score_bytes
    from kforge.fallbacks import run_fallback
    if name not in _BATCH_SLICED or not operands or operands[0].dim() != 4:
        return None
    q = operands[0]
    b = q.shape[0]
    skv = max((t.shape[2] for t in operands[1:] if t.dim() == 4), default=q.shape[2])
    if b < 2 or score_bytes(q, skv, b, q.shape[1]) <= SLICE_BYTES:
        return None
    parts = []
    for i in range(b):
        rows = [t[i:i + 1] if t.dim() == 4 and t.shape[0] == b else t for t in operands]
        parts.append(run_fallback(name, template, rows, device))
    return tuple(torch.cat([p[k] for p in parts], dim=0) for k in range(len(parts[0])))


def _dense_constant(op: ConstantOp, dt, device) -> torch.Tensor:
    key = (id(op), str(device), dt)
    hit = _CONSTANTS.get(key)
    if hit is None or hit[0] is not op:
        if len(_CONSTANTS) > 4096:
            _CONSTANTS.clear()
        hit = (op, torch.tensor(op.data, dtype=dt, device=device))
        _CONSTANTS[key] = hit
    return hit[1]


def run_host_plan(plan: HostPlan, specs: "Mapping[str, KernelSpec] | None",
                  inputs: Sequence[torch.Tensor], weights: Mapping[str, torch.Tensor],
                  kernels: "Mapping[str, Callable] | None" = None,
                  step_timer: "Callable | None" = None,
                  references: "dict[str, Callable] | None" = None) -> tuple[torch.Tensor, ...]:
    """Execute a host plan: region calls and (in a linked plan) kernel steps go to kernels[hash]
    when given, else to the reference of the region's spec (specs[hash], or `<hash>.json`
    beside the plan); fallback ops run through PyTorch; other steps run here.

    `inputs` are the plan inputs that are not weights, in order; `weights` maps weight names
    (the `weight` field of an input) to tensors."""
    opaque = [s for s in plan.steps if isinstance(s, OpaqueOp)]
    if opaque:
        raise UserError(f"host plan {plan.function}: cannot run: "
                        + "; ".join(f"{s.name} (results {', '.join(s.results)}) is an opaque step"
                                    for s in opaque)
                        + " — kforge-opt could not describe it as a record")
    specs = dict(specs or {})
    kernels = kernels or {}
    env: dict[str, torch.Tensor] = {}
    user_inputs = iter(inputs)
    for a in plan.inputs:
        if a.weight is not None:
            if a.weight not in weights:
                raise UserError(f"host plan {plan.function}: weight {a.weight!r} (input "
                                f"{a.name}) was not given")
            env[a.name] = weights[a.weight]
        else:
            try:
                env[a.name] = next(user_inputs)
            except StopIteration:
                n = sum(1 for x in plan.inputs if x.weight is None)
                raise UserError(f"host plan {plan.function}: expected {n} inputs, "
                                f"got {len(inputs)}") from None
    device = next(iter(env.values())).device if env else torch.device("cpu")
    tensor_types = {t.name: (t.shape, t.dtype) for t in plan.inputs + plan.values}
    types = _Types(None)
    # region references made here are kept in `references` when given (a runtime passes its
    # own dict, so they are built once, and may hold compiled ones)
    refs: dict[str, Callable] = references if references is not None else {}
    for i, step in enumerate(plan.steps):
        if step_timer is not None:
            step_timer(step, lambda: _run_step(i, step, plan, specs, kernels, refs, env,
                                               tensor_types, types, device))
        else:
            _run_step(i, step, plan, specs, kernels, refs, env, tensor_types, types, device)
    return tuple(env[o] for o in plan.outputs)


def _run_step(i, step, plan, specs, kernels, refs, env, tensor_types, types, device) -> None:
    if isinstance(step, (CallStep, KernelStep)):
        fn = kernels.get(step.call)
        if fn is None:
            if step.call not in refs:
                spec = specs.get(step.call)
                if spec is None:
                    if plan.directory is None:
                        raise UserError(f"host plan step {i}: no spec for region {step.call}")
                    spec = load_spec(Path(plan.directory) / f"{step.call}.json")
                refs[step.call] = reference_fn(spec)
            fn = refs[step.call]
        outs = fn(*(env[o] for o in step.operands))
        for r, t in zip(step.results, outs):
            # a region without tensor arguments (a mask built from indices) computes on the
            # CPU; its results belong on the plan's device
            env[r] = t if t.device == device else t.to(device)
    else:
        _exec_op(step, env, tensor_types.__getitem__, types, set(step.results), device)


# ---------------------------------------------------------------------------------------------
# A readable rendering for prompts
# ---------------------------------------------------------------------------------------------
_SYMBOL = {"arith.addf": "+", "arith.addi": "+", "arith.subf": "-", "arith.subi": "-",
           "arith.mulf": "*", "arith.muli": "*", "arith.divf": "/", "arith.divsi": "//",
           "arith.divui": "//", "arith.remf": "%", "arith.remsi": "%", "arith.andi": "&",
           "arith.ori": "|", "arith.xori": "^"}
_CMP = {"ogt": ">", "ugt": ">", "sgt": ">", "olt": "<", "ult": "<", "slt": "<", "oge": ">=",
        "uge": ">=", "sge": ">=", "ole": "<=", "ule": "<=", "sle": "<=", "oeq": "==",
        "ueq": "==", "eq": "==", "one": "!=", "une": "!=", "ne": "!="}
_REDUCE_WORD = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}


def _index_text(m: AffineMap) -> str:
    return ", ".join(affine_text(r) for r in m.results)


def _body_expr(op: GenericOp, operand_text: dict, name: str, depth: int = 0) -> str:
    body = op.body
    if name in operand_text:
        return operand_text[name]
    s = body.stmt(name)
    a = [_body_expr(op, operand_text, o, depth + 1) for o in s.operands]
    if s.op == "arith.constant":
        return repr(s.value)
    if s.op == "linalg.index":
        return f"d{s.dim}"
    if s.op in _SYMBOL:
        return f"({a[0]} {_SYMBOL[s.op]} {a[1]})"
    if s.op in ("arith.cmpf", "arith.cmpi"):
        return f"({a[0]} {_CMP.get(s.predicate, s.predicate)} {a[1]})"
    if s.op == "arith.select":
        return f"where({a[0]}, {a[1]}, {a[2]})"
    if s.op == "arith.negf":
        return f"(-{a[0]})"
    if s.op in _CASTS:
        return f"{a[0]}.to({s.type})"
    short = s.op.split(".", 1)[1]
    short = {"maximumf": "maximum", "minimumf": "minimum", "maxnumf": "fmax", "minnumf": "fmin",
             "absf": "abs", "powf": "pow", "fpowi": "pow"}.get(short, short)
    return f"{short}({', '.join(a)})"


def reference_source(spec: KernelSpec) -> str:
    """The region as readable PyTorch-flavoured pseudo-code (for prompts, not for running):
    each generic op as an indexed formula over its iteration domain."""
    def ttype(name):
        t = spec.tensor(name)
        return f"{t.dtype}[{', '.join('?' if s is None else str(s) for s in t.shape)}]"

    lines = [f"def {spec.name}({', '.join(f'{a.name}: {ttype(a.name)}' for a in spec.args)}):",
             "    # Notation: v[i, j] = expr defines every element; d0, d1, ... are loop indices;",
             "    # sum/max over dN means a reduction loop; weights: "
             + (", ".join(f"{a.name}={a.weight}" for a in spec.args if a.weight) or "none")]
    for op in spec.ops:
        if isinstance(op, GenericOp):
            sizes = "unknown"
            try:
                fake = [torch.empty([0 if s is None else s for s in spec.tensor(o).shape],
                                    device="meta") for o in op.operands]
                sizes = ", ".join(f"d{i}<{s}" for i, s in enumerate(_domain_sizes(op, fake)))
            except Exception:
                pass
            lines.append(f"    # {op.name}: {', '.join(op.iterator_types)} over ({sizes})")
            body = op.body
            texts = {}
            for i, (o, m) in enumerate(zip(op.operands, op.indexing_maps)):
                texts[body.args[i]] = f"{o}[{_index_text(m)}]" if m.results else o
            for j, r in enumerate(op.results):
                out_m = op.indexing_maps[op.num_inputs + j]
                target = f"{r}[{_index_text(out_m)}]"
                if not op.reduction_dims:
                    expr = _body_expr(op, texts, body.yields[j])
                    lines.append(f"    {target} = {expr}   # {ttype(r)}")
                    continue
                red = ", ".join(f"d{d}" for d in op.reduction_dims)
                con = recognize_contraction(op)
                comb = recognize_combiner(op, j)
                if comb is not None:
                    word = _REDUCE_WORD[_COMBINERS[comb[0]][0]]
                    init = texts[body.args[op.num_inputs + j]]
                    expr = _body_expr(op, texts, comb[1])
                    how = "  (a contraction)" if con else ""
                    lines.append(f"    {target} = {word}({init}, {word} over {red} of {expr})"
                                 f"   # {ttype(r)}{how}")
                else:
                    texts_seq = dict(texts)
                    expr = _body_expr(op, texts_seq, body.yields[j])
                    lines.append(f"    {target} = {expr}   # sequential over {red} in order; "
                                 f"{r} starts as {op.inits[j]}; {ttype(r)}")
        elif isinstance(op, ReshapeOp):
            lines.append(f"    {op.results[0]} = {op.operands[0]}.reshape("
                         f"{list(spec.tensor(op.results[0]).shape)})   # {op.name}")
        elif isinstance(op, EmptyOp):
            lines.append(f"    {op.results[0]} = torch.empty({list(spec.tensor(op.results[0]).shape)})"
                         f"   # {ttype(op.results[0])}, uninitialized")
        elif isinstance(op, PadOp):
            lines.append(f"    {op.results[0]} = pad({op.operands[0]}, low={list(op.low)}, "
                         f"high={list(op.high)}, value={op.value!r})   # {op.name}")
        elif isinstance(op, ConstantOp):
            val = op.splat if op.splat is not None else list(op.data or ())[:8]
            lines.append(f"    {op.results[0]} = constant({val})   # {ttype(op.results[0])}")
    lines.append(f"    return {', '.join(spec.results)}")
    return "\n".join(lines) + "\n"
