"""Turns spec values into Triton expressions at symbolic indices.

The emitter computes "value v at index I" by inlining: a generic op's result at I is its body
evaluated at the iteration point p with out_map(p) = I, its inputs read at in_map(p); a reshape
re-indexes its source; arguments (and values another kernel materialized) are loaded. Every
expression is placed in the outermost scope where all the variables it uses are bound, so loop
invariants are hoisted, and cached there, so a value needed twice at one index is computed once.

Reductions over the kernel's column variable become `tl.sum/max/min(..., axis=1)`, in one block
or as a loop over column blocks (then placed before the loop that needs them).
"""
from __future__ import annotations

import math
import re
import operator
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

from kforge.kernels import BF16_RNE_SOURCE
from kforge.providers.builtin import indexing as ix
from kforge.reference import _domain_sizes, recognize_combiner
from kforge.spec import (AffineBinary, AffineConst, AffineDim, AffineExpr, ConstantOp, EmptyOp,
                         GenericOp, KernelSpec, PadOp, ReshapeOp)


# a tensor of this many elements or more is addressed in int64 (Emitter.wide_offsets)
WIDE_OFFSETS = 2 ** 31


class CannotGenerate(Exception):
    """The builtin generator does not handle this region (the loop then runs the reference)."""


TL_DTYPES = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32",
             "f64": "tl.float64", "i1": "tl.int1", "i8": "tl.int8", "i16": "tl.int16",
             "i32": "tl.int32", "i64": "tl.int64", "index": "tl.int64"}
TORCH_DTYPES = {"f16": "torch.float16", "bf16": "torch.bfloat16", "f32": "torch.float32",
                "f64": "torch.float64", "i1": "torch.bool", "i8": "torch.int8",
                "i16": "torch.int16", "i32": "torch.int32", "i64": "torch.int64",
                "index": "torch.int64"}

_BINARY = {"arith.addf": "+", "arith.addi": "+", "arith.subf": "-", "arith.subi": "-",
           "arith.mulf": "*", "arith.muli": "*", "arith.divf": "/", "arith.divsi": "//",
           "arith.remf": "%", "arith.remsi": "%", "arith.andi": "&", "arith.ori": "|",
           "arith.xori": "^"}
_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
         "/": lambda a, b: a / b}
_CALL2 = {"arith.maximumf": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
          "arith.minimumf": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
          "arith.maxnumf": "tl.maximum({0}, {1})", "arith.minnumf": "tl.minimum({0}, {1})",
          "arith.maxsi": "tl.maximum({0}, {1})", "arith.minsi": "tl.minimum({0}, {1})"}
_CASTS = ("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi",
          "arith.fptoui", "arith.index_cast", "arith.index_castui", "arith.extsi",
          "arith.extui", "arith.trunci")
_ORDERED = {"oeq": "==", "ogt": ">", "oge": ">=", "olt": "<", "ole": "<="}
_UNORDERED_NOT = {"ugt": "<=", "uge": "<", "ult": ">=", "ule": ">"}   # u<p> = not o<inverse>
_CMPI = {"eq": "==", "ne": "!=", "slt": "<", "sle": "<=", "sgt": ">", "sge": ">=",
         "ult": "<", "ule": "<=", "ugt": ">", "uge": ">="}
# reduction combiner -> (combine function of the candidate, neutral element, its expression).
# Reductions are spelled tl.reduce(x, axis, _sum) with these functions defined in the candidate
# rather than tl.sum/tl.max: those are @jit functions of triton.language, which the interpreter
# cannot run when triton was imported before TRITON_INTERPRET was set.
REDUCERS = {"arith.addf": ("_sum", 0.0, "({0} + {1})"),
            "arith.maximumf": ("_maximum", float("-inf"),
                               "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
            "arith.maxnumf": ("_maxnum", float("-inf"), "tl.maximum({0}, {1})"),
            "arith.minimumf": ("_minimum", float("inf"),
                               "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
            "arith.minnumf": ("_minnum", float("inf"), "tl.minimum({0}, {1})")}


# fp32 rounded to bf16's values (kept as fp32), to nearest-even as the GPU's conversion rounds:
# the CPU target's bf16 products. Triton's interpreter (3.9) truncates `.to(tl.bfloat16)`, which
# biased its bf16 products and rejected kernels on the CPU that the GPU would verify.
BF16_RNE = "_bf16_rne"
_HELPERS = {BF16_RNE: BF16_RNE_SOURCE,
            # the bf16 policy's fast math on NVIDIA GPUs (CudaTarget.fast_math): one MUFU
            # instruction each, in place of libdevice's tanhf / log1pf (tens of instructions)
            "_fast_tanh": "@triton.jit\ndef _fast_tanh(x):\n"
                          "    return tl.inline_asm_elementwise(\"tanh.approx.f32 $0, $1;\", "
                          "\"=r,r\", [x], dtype=tl.float32, is_pure=True, pack=1)\n",
            "_fast_log2": "@triton.jit\ndef _fast_log2(x):\n"
                          "    return tl.inline_asm_elementwise(\"lg2.approx.f32 $0, $1;\", "
                          "\"=r,r\", [x], dtype=tl.float32, is_pure=True, pack=1)\n"}


def combine_function(name: str) -> str:
    """Source of the @triton.jit combine function `name` (see REDUCERS), or of a helper."""
    if name in _HELPERS:
        return _HELPERS[name]
    expr = next(c for n, _, c in REDUCERS.values() if n == name).format("a", "b")
    if expr.startswith("(") and expr.endswith(")"):
        expr = expr[1:-1]
    return f"@triton.jit\ndef {name}(a, b):\n    return {expr}\n"


def literal(x) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return 'float("nan")'
        if math.isinf(x):
            return 'float("inf")' if x > 0 else 'float("-inf")'
        return repr(x)
    return repr(x)


def is_float(dtype: str) -> bool:
    """An MLIR float element type (f16, bf16, f32, f64)."""
    return dtype in ("f16", "bf16", "f32", "f64")


# 16-bit float types whose math ops compute in fp32 and round (stmt_value)
_NARROW_TL = ("bf16", "f16")

# ops whose bf16 result is one of their bf16 operands (or its negation): exact, no rounding
_EXACT_BF16 = ("arith.select", "arith.negf", "arith.maximumf", "arith.minimumf",
               "arith.maxnumf", "arith.minnumf", "math.absf")


@dataclass
class Val:
    """An emitted value: Triton code (a variable name or a literal), the kernel variables it
    depends on, and its MLIR element type."""
    code: str
    deps: frozenset
    dtype: str
    literal: object = None          # the Python number for constants
    zero_masked: bool = False       # a masked load with other=0 (safe as a dot operand)


@dataclass
class KVar:
    name: str
    mask: str | None                # in-bounds condition, None when always in bounds
    shape: tuple[str, ...] = ()     # the block it spans, "1" on the other axes: rm is
                                    # ("BLOCK_M", "1"); () for a scalar (a program id)


class Scope:
    def __init__(self, parent: "Scope | None", binds=(), header: str = "", depth: int = 1):
        self.parent = parent
        self.binds = set(binds)
        self.lines: list[str] = []
        self.cache: dict = {}
        self.header = header
        self.depth = depth

    def lookup(self, key):
        s = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None

    def emit(self, line: str):
        self.lines.append("    " * self.depth + line)

    def close(self):
        """Append this loop's header and body to the parent."""
        self.parent.lines.append("    " * self.parent.depth + self.header)
        self.parent.lines.extend(self.lines)


def domain_sizes(spec: KernelSpec, op: GenericOp) -> list[int]:
    shapes = []
    for o in op.operands:
        shape = spec.tensor(o).shape
        if any(s is None for s in shape):
            raise CannotGenerate(f"{o} has a dynamic shape (the builtin generator needs static "
                                 "shapes)")
        shapes.append(SimpleNamespace(shape=tuple(shape)))
    return _domain_sizes(op, shapes)


def compose(expr: AffineExpr, p: dict) -> ix.Index:
    if isinstance(expr, AffineDim):
        if expr.d not in p:
            raise CannotGenerate(f"iteration dimension d{expr.d} is not determined here")
        return p[expr.d]
    if isinstance(expr, AffineConst):
        return ix.const(expr.c)
    if isinstance(expr, AffineBinary):
        a, b = compose(expr.lhs, p), compose(expr.rhs, p)
        return {"add": ix.add, "mul": ix.mul, "floordiv": ix.floordiv, "mod": ix.mod,
                "ceildiv": ix.ceildiv}[expr.op](a, b)
    raise CannotGenerate("affine symbols are not supported")


@dataclass
class ColumnSpace:
    """How a kernel reduces: the column variable, its extent and its tile shape."""
    var: str                        # e.g. "cols" / "rn"
    extent: int                     # number of columns (the reduction extent)
    tile: str                       # e.g. "[BLOCK_R, BLOCK_C]"
    block: str = ""                 # the column block constexpr, for looped reductions
    looped: bool = False            # reductions loop over column blocks


def _scalar(value, dtype: str):
    """A constant's Python literal. An i1 constant is a bool, a scalar one or a splat tensor's
    (Gemma-2's mask `true & (i <= j)`): `1 & x` or `x ^ 1` on an i1 would be an int32 in
    Triton, and a tl.where on it deprecated; `True & x` stays i1."""
    if dtype.startswith(("f", "b")):
        return float(value)
    return bool(int(value)) if dtype == "i1" else int(value)


_PY_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
               ">": operator.gt, ">=": operator.ge}


def _fold_compare(op: str, pred: str, x, y) -> bool:
    """arith.cmpf / arith.cmpi of two constants, through the tables that spell them (_CMPI,
    _ORDERED, _UNORDERED_NOT): Python's float compares are IEEE's, false on a NaN, so o<p> is
    false and u<p> = not o<inverse> true where either is NaN."""
    if op == "arith.cmpi":
        if pred not in _CMPI:
            raise CannotGenerate(f"arith.cmpi {pred}")
        return _PY_COMPARE[_CMPI[pred]](x, y)
    if pred in _ORDERED:
        return _PY_COMPARE[_ORDERED[pred]](x, y)
    if pred in _UNORDERED_NOT:
        return not _PY_COMPARE[_UNORDERED_NOT[pred]](x, y)
    other = {"une": x != y, "one": x < y or x > y, "ueq": not (x < y or x > y),
             "ord": x == x and y == y, "uno": x != x or y != y, "true": True, "false": False}
    if pred not in other:
        raise CannotGenerate(f"arith.cmpf {pred}")
    return other[pred]


class Emitter:
    def __init__(self, spec: KernelSpec, target, kvars: dict[str, KVar],
                 pointers: dict[str, str], columns: ColumnSpace | None = None):
        self.spec = spec
        self.target = target
        # a tensor of the region holds WIDE_OFFSETS elements or more (gpt-oss's prefill
        # logits, 16384 x 201088): int32 offsets overflow there (an illegal address on the GPU,
        # measured), so every address of the kernel is computed in int64
        self.wide_offsets = any(math.prod(t.shape) >= WIDE_OFFSETS
                                for t in (*spec.args, *spec.values))
        self.kvars = kvars
        self.pointers = pointers            # tensor name -> kernel pointer parameter
        self.columns = columns
        self.counter = 0
        self.loads: dict[str, set[str]] = {}   # tensor -> {"dot", "other"}: how it is read
        self.dot_context = False               # loads are a matrix product's operands (operand_reads)
        self.math_used = False
        # the target's fast spellings of fp32 math (Target.fast_math), where the policy's
        # tolerance allows them (Builder.emitter: bf16)
        self.fast_math = False
        # a bf16 model's region under the bf16 policy (Builder.emitter): its bf16 values are
        # held as fp32 and not rounded between its ops, only where they are stored, as
        # Inductor computes a bf16 model's fused ops (`widen16`, docs/builtin-provider.md)
        self.widen16 = False
        # float64 values computed in fp32 (Builder.emitter: the bf16 and tf32 policies, whose
        # tolerance is 1e-2): torch-mlir widens a variance to f64, and a row of 8192 held in f64
        # doubles the registers of fuse_layer_norm_rows's kernel (0.81x the matched route,
        # H100 2026-12-07)
        self.demote64 = False
        self.root: Scope | None = None
        self.split_sums: dict[str, int] = {}    # materialized split-K partials: name -> slices
        self.ops_used: dict[str, None] = {}     # names of the ops this kernel computes, in order
        self.planes: set[str] = set()           # arguments stored as hi/lo planes
        self.combiners_used: dict[str, None] = {}   # reduction combine functions needed
        self.plane = 0                          # the plane being read (operand_reads)
        self.load_index: dict[str, tuple] = {}  # tensor -> the index it was last loaded at
        # partial row reductions (kernels._build_stage, PARTIAL): in the GEMM kernel a
        # reduction's result is its tile's partial (over the tile's columns, fp32, without the
        # initial value); in the rows kernel after it, a reduction result named here is
        # reduced from its partials: result -> (its [rows, parts] fp32 buffer, parts)
        self.raw_partials = False
        self.partials: dict[str, tuple[str, int]] = {}

    @contextmanager
    def operand_reads(self, plane: int = 0):
        """Values computed inside are a matrix product's operands: their loads count as `dot`
        reads (a weight read only so may be prepared at load), and a weight stored as planes
        (`planes`) is read at plane `plane` (0 hi, 1 lo)."""
        saved = self.dot_context, self.plane
        self.dot_context, self.plane = True, plane
        try:
            yield
        finally:
            self.dot_context, self.plane = saved

    # -- helpers --------------------------------------------------------------------------------
    def fresh(self, stem: str = "x") -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def placement(self, scope: Scope, deps) -> Scope:
        s = scope
        while s.parent is not None and not (s.binds & deps):
            s = s.parent
        return s

    def mask_of(self, deps) -> str | None:
        masks = [self.kvars[v].mask for v in sorted(deps) if v in self.kvars
                 and self.kvars[v].mask]
        if not masks:
            return None
        return " & ".join(masks) if len(masks) == 1 else " & ".join(f"({m})" for m in masks)

    def tile_of(self, names) -> str | None:
        """The block that values over the kernel variables `names` broadcast to
        ("[BLOCK_M, BLOCK_N]"), None when they are all scalars."""
        shapes = [self.kvars[v].shape for v in sorted(names)
                  if v in self.kvars and self.kvars[v].shape]
        if not shapes:
            return None
        tile = ["1"] * max(len(t) for t in shapes)
        for t in shapes:
            for axis, size in enumerate(t):
                if size != "1" and tile[axis] not in ("1", size):
                    raise CannotGenerate(f"kernel variables {sorted(names)} span {tile[axis]} "
                                         f"and {size} on one axis")
                if size != "1":
                    tile[axis] = size
        return f"[{', '.join(tile)}]"

    def address(self, ptr: str, offset: ix.Index, over, wide: bool = False) -> str:
        """`ptr + offset` as a block over the kernel variables `over` (those of the offset, the
        mask and, for a store, the value). Triton takes a load's mask and a store's value in
        the pointer's shape (3.3 refuses to broadcast them to it, 3.9 checks it), so an offset
        that does not vary along one of their axes (the column of an N = 1 product, a padded
        read of a 1x1 image) is broadcast explicitly. `wide`: this buffer needs int64 offsets
        though no tensor of the region does (a weight's hi/lo planes)."""
        wide = wide or self.wide_offsets
        addr = f"{ptr} + {ix.render(offset, wide)}" if offset != ix.ZERO else ptr
        tile = self.tile_of(over)
        if tile is not None and tile != self.tile_of(ix.variables(offset)):
            addr = f"tl.broadcast_to({addr}, {tile})"
        return addr

    def define(self, scope: Scope, deps, code: str, dtype: str, comment: str = "",
               stem: str = "x") -> Val:
        target = self.placement(scope, deps)
        name = self.fresh(stem)
        target.emit(f"{name} = {code}" + (f"  # {comment}" if comment else ""))
        return Val(name, frozenset(deps), dtype)

    # -- values -----------------------------------------------------------------------------------
    def value(self, name: str, index: tuple, scope: Scope) -> Val:
        key = ("value", name, index, self.plane)
        hit = scope.lookup(key)
        if hit is not None:
            return hit
        if name in self.pointers:
            val = self.load(name, index, scope)
        else:
            op = self.spec.producer(name)
            if op is None:
                raise CannotGenerate(f"{name} is not an argument of this kernel")
            if isinstance(op, GenericOp):
                val = self.generic_result(op, op.results.index(name), index, scope)
            elif isinstance(op, ReshapeOp):
                src = op.operands[0]
                flat = ix.ravel(index, self.spec.tensor(name).shape)
                val = self.value(src, ix.unravel(flat, self.spec.tensor(src).shape), scope)
            elif isinstance(op, ConstantOp):
                if op.splat is None:
                    raise CannotGenerate(f"dense constant {name} is not supported")
                dtype = self.spec.tensor(name).dtype
                v = _scalar(op.splat, dtype)
                val = Val(literal(v), frozenset(), dtype, literal=v)
            elif isinstance(op, PadOp):
                val = self.padded(op, index, scope)
            elif isinstance(op, EmptyOp):
                raise CannotGenerate(f"{name} reads an uninitialized tensor")
            else:
                raise CannotGenerate(f"unsupported op record {op}")
        self.placement(scope, val.deps).cache[key] = val
        return val

    def padded(self, op: PadOp, index: tuple, scope: Scope) -> Val:
        """A padded tensor at `index`: the source where in bounds (read at a clamped, always
        valid address), the pad value elsewhere."""
        src = op.operands[0]
        shape = self.spec.tensor(src).shape
        inner_index, conds = [], []
        for i, lo, hi, size in zip(index, op.low, op.high, shape):
            j = ix.add(i, ix.const(-lo))
            if lo or hi:
                b = ix.bounds(j)
                code = ix.render(j)
                if b is None or b[0] < 0:
                    conds.append(f"({code} >= 0)")
                if b is None or b[1] > size:
                    conds.append(f"({code} < {size})")
                j = ix.clamp(j, 0, size - 1)
            inner_index.append(j)
        inner = self.value(src, tuple(inner_index), scope)
        if not conds:
            return inner
        deps = set(inner.deps)
        for i in index:
            deps |= ix.variables(i)
        return self.define(scope, frozenset(deps), f"tl.where({' & '.join(conds)}, {inner.code}, "
                           f"{literal(op.value)})", inner.dtype, op.name)

    def load(self, name: str, index: tuple, scope: Scope) -> Val:
        t = self.spec.tensor(name)
        if any(s is None for s in t.shape):
            raise CannotGenerate(f"{name} has a dynamic shape")
        self.loads.setdefault(name, set()).add("dot" if self.dot_context else "other")
        self.load_index[name] = index
        offset = ix.ravel(index, t.shape)
        deps = ix.variables(offset)
        for i in index:
            deps |= ix.variables(i)
        mask = self.mask_of(deps)
        over = ix.variables(offset) | {v for v in deps if v in self.kvars and self.kvars[v].mask}
        ptr = self.pointers[name]
        other = ", other=0.0" if t.dtype.startswith(("f", "b")) else ", other=0"
        loads = []
        splits = self.split_sums.get(name, 1)
        plane = math.prod(t.shape)
        if name in self.planes:      # a weight stored as [hi, lo] planes by prepare_weights
            offset = ix.add(offset, ix.const(self.plane * plane))
        # the buffer read holds planes or split-K slices of the tensor, one after another: a
        # 32768 x 32768 weight's lo plane starts at 2**30 and ends past int32 (a compile error
        # on the H200, measured)
        wide = plane * (self.plane + splits) >= WIDE_OFFSETS
        for s in range(splits):     # split-K partial products are summed on the way in
            addr = self.address(ptr, ix.add(offset, ix.const(s * plane)), over, wide)
            loads.append(f"tl.load({addr}, mask={mask}{other})" if mask else f"tl.load({addr})")
        code = " + ".join(loads)
        if t.dtype == "bf16" and (not self.target.bf16_math_ok
                                  or self.widen16 and not self.dot_context):
            # bf16 values held as fp32 (Target.bf16_math_ok; widen16 but for a product's
            # operands, which the tensor cores take as bf16)
            code = f"({code}).to(tl.float32)"
        val = self.define(scope, deps, code, t.dtype, stem="x")
        val.zero_masked = True
        return val

    def generic_result(self, op: GenericOp, j: int, index: tuple, scope: Scope) -> Val:
        out_map = op.indexing_maps[op.num_inputs + j]
        sizes = domain_sizes(self.spec, op)
        p: dict[int, ix.Index] = {}
        for k, r in enumerate(out_map.results):
            if isinstance(r, AffineDim):
                p[r.d] = index[k]
            elif not isinstance(r, AffineConst):
                raise CannotGenerate(f"{op.name}: output map {out_map.text} is not invertible")
        for d in op.parallel_dims:
            if d not in p:
                if sizes[d] != 1:
                    raise CannotGenerate(f"{op.name}: parallel d{d} does not reach the output")
                p[d] = ix.ZERO
        self.ops_used.setdefault(op.name, None)
        if op.reduction_dims:
            return self.reduction(op, j, p, index, sizes, scope)
        return self.body_value(op, p, op.body.yields[j], scope)

    # -- bodies ------------------------------------------------------------------------------------
    def body_value(self, op: GenericOp, p: dict, name: str, scope: Scope) -> Val:
        body = op.body
        pkey = tuple(sorted(p.items()))
        if name in body.args:
            i = body.args.index(name)
            operand = op.operands[i]
            m = op.indexing_maps[i]
            if not m.results and not self.spec.tensor(operand).shape:
                return self.value(operand, (), scope)
            return self.value(operand, tuple(compose(r, p) for r in m.results), scope)
        key = ("stmt", id(op), name, pkey, self.plane)
        hit = scope.lookup(key)
        if hit is not None:
            return hit
        s = body.stmt(name)
        if s.op == "arith.constant":
            v = _scalar(s.value, s.type)
            val = Val(literal(v), frozenset(), s.type, literal=v)
        elif s.op == "linalg.index":
            i = p[s.dim]
            val = (Val(str(i.value), frozenset(), "index", literal=i.value)
                   if isinstance(i, ix.IConst) else
                   Val(ix.render(i), ix.variables(i), "index"))
        else:
            args = [self.body_value(op, p, o, scope) for o in s.operands]
            val = self.stmt_value(s, args, scope, op)
        self.placement(scope, val.deps).cache[key] = val
        return val

    def stmt_value(self, s, args: list[Val], scope: Scope, op: GenericOp) -> Val:
        deps = frozenset().union(*(a.deps for a in args)) if args else frozenset()
        a = [x.code for x in args]
        lits = [x.literal for x in args]
        comment = f"{s.op}"
        if s.op in _BINARY:
            sym = _BINARY[s.op]
            if all(v is not None for v in lits) and sym in _FOLD and s.type.startswith("f"):
                v = float(_FOLD[sym](*lits))
                return Val(literal(v), frozenset(), s.type, literal=v)
            code = f"{a[0]} {sym} {a[1]}"
        elif s.op in _CALL2:
            code = _CALL2[s.op].format(*a)
        elif s.op == "arith.negf":
            if lits[0] is not None:
                return Val(literal(-lits[0]), frozenset(), s.type, literal=-lits[0])
            code = f"-{a[0]}"
        elif s.op == "arith.select":
            code = f"tl.where({a[0]}, {a[1]}, {a[2]})"
        elif s.op in ("arith.cmpf", "arith.cmpi") and all(v is not None for v in lits):
            # folded here: spelled out, `~(0.5 >= 0.0)` is ~True, which Python makes -2 (true)
            v = _fold_compare(s.op, s.predicate, *lits)
            return Val(literal(v), frozenset(), "i1", literal=v)
        elif s.op == "arith.cmpf":
            code = self.cmpf(s.predicate, a[0], a[1])
        elif s.op == "arith.cmpi":
            if s.predicate not in _CMPI:
                raise CannotGenerate(f"arith.cmpi {s.predicate}")
            code = f"{a[0]} {_CMPI[s.predicate]} {a[1]}"
        elif s.op in _CASTS:
            if lits[0] is not None:
                v = float(lits[0]) if s.type.startswith(("f", "b")) else int(lits[0])
                if s.type == "f32":         # round the folded constant like truncf would
                    v = struct.unpack("f", struct.pack("f", v))[0]
                return Val(literal(v), frozenset(), s.type, literal=v)
            if args[0].dtype == s.type:
                return args[0]
            if self.demote64 and s.op == "arith.extf" and s.type == "f64":
                src = args[0]       # held as fp32: widening to f64 is free
                code = src.code if src.dtype == "f32" or (src.dtype == "bf16" and self.hold16) \
                    else f"{src.code}.to(tl.float32)"
                return Val(code, src.deps, s.type, literal=src.literal)
            if self.hold16 and "bf16" in (s.type, args[0].dtype) \
                    and is_float(s.type) and is_float(args[0].dtype):
                # bf16 values are held as fp32 rounded to bf16: widening is free, narrowing
                # rounds to nearest even as the GPU's conversion does
                if s.type != "bf16" and args[0].dtype == "bf16" and s.type in ("f32", "f64"):
                    return Val(args[0].code, args[0].deps, s.type, literal=args[0].literal)
                if s.type == "bf16" and self.widen16:
                    # not rounded here: a bf16 model's value is rounded where it is stored
                    code = a[0] if args[0].dtype in ("f32", "bf16") else f"{a[0]}.to(tl.float32)"
                    return Val(code, args[0].deps, s.type, literal=args[0].literal)
                if s.type == "bf16":
                    self.combiners_used[BF16_RNE] = None
                    src = a[0] if args[0].dtype == "f32" else f"{a[0]}.to(tl.float32)"
                    return self.define(scope, deps, f"{BF16_RNE}({src})", s.type, comment)
            code = f"{a[0]}.to({TL_DTYPES[s.type]})"
        elif s.op == "arith.bitcast":
            code = f"{a[0]}.to({TL_DTYPES[s.type]}, bitcast=True)"
        elif s.op == "math.powf" and lits[1] is not None and float(lits[1]) in (1.0, 2.0, 3.0,
                                                                               0.5):
            e = float(lits[1])
            code = {1.0: "{0}", 2.0: "{0} * {0}", 3.0: "{0} * {0} * {0}",
                    0.5: "tl.sqrt({0})"}[e].format(a[0])
        elif s.op == "math.fpowi" and lits[1] is not None and float(lits[1]).is_integer() \
                and 0 <= int(lits[1]) <= 8:
            # x ** n with a small constant n (torch-mlir's tanh-GELU writes x**3 this way):
            # exact repeated products, as the reference computes them.
            n = int(lits[1])
            if n == 0:
                return Val(literal(1.0), frozenset(), s.type, literal=1.0)
            code = " * ".join([a[0]] * n)
        else:
            # a 16-bit model's math (tanh, erf, exp... on bf16 values) where the target holds
            # bf16 as bf16: computed in fp32 and rounded once, as PyTorch computes a bf16 op
            # (libdevice has no bf16 functions: `libdevice.tanh` of a bf16 value did not
            # compile on the GPU, H100 2026-12-07, while the interpreter, which holds bf16
            # values as fp32, verified it)
            narrow = s.type in _NARROW_TL and self.target.bf16_math_ok \
                and not (s.type == "bf16" and self.widen16) and s.op not in _EXACT_BF16
            wide = s.type == "bf16" and self.widen16     # its arguments are fp32 already
            if narrow:
                a = [f"{x.code}.to(tl.float32)" if x.dtype in _NARROW_TL and x.literal is None
                     else x.code for x in args]      # a literal is a Python float already
            fmt = self.target.fast_math.get(s.op) \
                if self.fast_math and (s.type == "f32" or narrow or wide) else None
            for helper in re.findall(r"\b(_fast_\w+)\(", fmt or ""):
                self.combiners_used[helper] = None
            fmt = fmt or self.target.math(s.op)
            if fmt is None:
                raise CannotGenerate(f"no Triton spelling of {s.op} on target "
                                     f"{self.target.name}")
            if "libdevice" in fmt:
                self.math_used = True
            code = fmt.format(*a)
            if narrow:
                code = f"({code}).to({TL_DTYPES[s.type]})"
        if s.type == "bf16" and not self.target.bf16_math_ok and not self.widen16 \
                and s.op not in _EXACT_BF16:
            # bf16 arithmetic on fp32-held values: round each result as bf16 arithmetic would
            self.combiners_used[BF16_RNE] = None
            code = f"{BF16_RNE}({code})"
        return self.define(scope, deps, code, s.type, comment)

    @staticmethod
    def cmpf(pred: str, a: str, b: str) -> str:
        if pred in _ORDERED:
            return f"{a} {_ORDERED[pred]} {b}"
        if pred in _UNORDERED_NOT:
            return f"~({a} {_UNORDERED_NOT[pred]} {b})"
        other = {"une": f"{a} != {b}", "one": f"({a} < {b}) | ({a} > {b})",
                 "ueq": f"~(({a} < {b}) | ({a} > {b}))",
                 "ord": f"({a} == {a}) & ({b} == {b})", "uno": f"({a} != {a}) | ({b} != {b})"}
        if pred not in other:
            raise CannotGenerate(f"arith.cmpf {pred}")
        return other[pred]

    # -- reductions ---------------------------------------------------------------------------------
    def init_constant(self, name: str):
        """The constant a tensor is filled with, if it is a splat or a fill of a constant."""
        op = self.spec.producer(name)
        if isinstance(op, ConstantOp) and op.splat is not None:
            return float(op.splat)
        if isinstance(op, ReshapeOp):
            return self.init_constant(op.operands[0])
        if isinstance(op, GenericOp) and not op.reduction_dims:
            y = op.body.yields[op.results.index(name)]
            if y in op.body.args:
                src = op.operands[op.body.args.index(y)]
                if not self.spec.tensor(src).shape or not op.indexing_maps[
                        op.body.args.index(y)].results:
                    return self.init_constant(src)
            s = op.body.stmt(y)
            if s is not None and s.op == "arith.constant":
                return float(s.value)
        return None

    def reduction(self, op: GenericOp, j: int, p: dict, index: tuple, sizes, scope: Scope) -> Val:
        cols = self.columns
        if cols is None:
            raise CannotGenerate(f"{op.name}: a reduction in a kernel without a column space")
        comb = recognize_combiner(op, j)
        if comb is None or comb[0] not in REDUCERS:
            raise CannotGenerate(f"{op.name}: reduction combiner not supported")
        dtype = self.spec.tensor(op.results[j]).dtype
        if not is_float(dtype):
            raise CannotGenerate(f"{op.name}: integer reductions are not supported")
        # 16-bit reductions accumulate in fp32 (as PyTorch's do) and round once at the end
        acc_dtype = "f32" if dtype in ("bf16", "f16") or (dtype == "f64" and self.demote64) \
            else dtype
        reducer, neutral, combine = REDUCERS[comb[0]]
        self.combiners_used.setdefault(reducer, None)
        if op.results[j] in self.partials:
            r = self._reduce_partials(op.results[j], index, reducer, neutral, dtype)
            return self._with_init(op, j, index, scope, r, neutral, combine, dtype)
        red = op.reduction_dims
        extent = math.prod(sizes[d] for d in red)
        if extent != cols.extent:
            raise CannotGenerate(f"{op.name}: reduces {extent} elements, the kernel's rows have "
                                 f"{cols.extent}")
        idx_deps = frozenset().union(*(ix.variables(i) for i in index)) if index else frozenset()
        if cols.var in idx_deps:
            raise CannotGenerate(f"{op.name}: reduction result read at a column-dependent index")
        root = self.root
        col_index = ix.unravel(ix.IVar(cols.var), [sizes[d] for d in red])
        p = dict(p)
        for d, i in zip(red, col_index):
            p[d] = i
        col_mask = self.kvars[cols.var].mask
        if not cols.looped:
            f = self.body_value(op, p, comb[1], root)
            fcode = f.code
            if cols.var not in f.deps:
                fcode = f"tl.broadcast_to({fcode}, {cols.tile})"
            if acc_dtype != dtype:
                fcode = f"{fcode}.to(tl.float32)"
            if col_mask:
                fcode = f"tl.where({col_mask}, {fcode}, {literal(neutral)})"
            if self.raw_partials:       # the tile's partial: fp32, no initial value
                return self.define(root, f.deps - {cols.var},
                                   f"tl.reduce({fcode}, 1, {reducer}, keep_dims=True)", "f32",
                                   f"{op.name} ({comb[0]}), this tile's columns", stem="r")
            r = self.define(root, f.deps - {cols.var}, self.narrowed(
                f"tl.reduce({fcode}, 1, {reducer}, keep_dims=True)", dtype),
                dtype, f"{op.name} ({comb[0]})", stem="r")
        else:
            if self.raw_partials:
                raise CannotGenerate(f"{op.name}: partial reductions over looped columns")
            acc = self.fresh("acc")
            root.emit(f"{acc} = tl.full({cols.tile}, {literal(neutral)}, {TL_DTYPES[acc_dtype]})")
            loop = Scope(root, binds={cols.var}, depth=root.depth + 1,
                         header=f"for c0 in range(0, {cols.extent}, {cols.block}):")
            loop.emit(f"{cols.var} = c0 + tl.arange(0, {cols.block})[None, :]")
            loop.emit(f"{col_mask} = {cols.var} < {cols.extent}")
            f = self.body_value(op, p, comb[1], loop)
            loop.emit(f"{acc} = tl.where({col_mask}, {combine.format(acc, f.code)}, {acc})")
            loop.close()
            r = self.define(root, f.deps - {cols.var}, self.narrowed(
                f"tl.reduce({acc}, 1, {reducer}, keep_dims=True)", dtype),
                dtype, f"{op.name} ({comb[0]})", stem="r")
        return self._with_init(op, j, index, scope, r, neutral, combine, dtype)

    def _with_init(self, op: GenericOp, j: int, index: tuple, scope: Scope, r: Val, neutral,
                   combine: str, dtype: str) -> Val:
        """A reduction's value `r` combined with the op's initial value (none where it is the
        combiner's neutral element)."""
        init_name = op.inits[j]
        init_const = self.init_constant(init_name)
        if init_const is not None and (init_const == neutral or (
                math.isinf(neutral) and init_const == neutral)):
            return r
        init = self.value(init_name, index, scope)
        return self.define(scope, r.deps | init.deps, self.narrowed(
            combine.format(init.code, r.code), dtype), dtype, "combine with the initial value")

    def _reduce_partials(self, name: str, index: tuple, reducer: str, neutral,
                         dtype: str) -> Val:
        """The reduction result `name` at its row `index`, from the GEMM tiles' partials: its
        [rows, parts] fp32 buffer read over the kernel's columns (one block: parts is small),
        reduced by the same combiner."""
        cols = self.columns
        if cols.looped:
            raise CannotGenerate(f"{name}: partials are read in one block of columns")
        buf, parts = self.partials[name]
        ptr = self.pointers[buf]
        self.loads.setdefault(buf, set()).add("other")
        if parts != cols.extent:
            raise CannotGenerate(f"{name}: {parts} partials a row, the kernel's rows have "
                                 f"{cols.extent} columns")
        row = ix.ravel(index, self.spec.tensor(name).shape)
        deps = ix.variables(row) | {cols.var}
        mask = self.mask_of(deps)
        load = f"tl.load({ptr} + ({ix.render(row)}) * {parts} + {cols.var}"
        load += f", mask={mask}, other={literal(neutral)})" if mask else ")"
        x = self.define(self.root, deps, load, "f32", f"{name}: the tiles' partials", stem="x")
        return self.define(self.root, deps - {cols.var}, self.narrowed(
            f"tl.reduce({x.code}, 1, {reducer}, keep_dims=True)", dtype), dtype,
            f"{name} from its partials", stem="r")

    def narrowed(self, code: str, dtype: str) -> str:
        """`code`, an fp32 result, as a value of the 16-bit type `dtype` (fp32 rounded to bf16
        where the target holds bf16 values as fp32); other types unchanged."""
        if dtype not in ("bf16", "f16"):
            return code
        if dtype == "bf16" and self.widen16:
            return code             # held as fp32: rounded where it is stored (stored())
        if dtype == "bf16" and not self.target.bf16_math_ok:
            self.combiners_used[BF16_RNE] = None
            return f"{BF16_RNE}({code})"
        return f"({code}).to({TL_DTYPES[dtype]})"

    @property
    def hold16(self) -> bool:
        """bf16 values are held as fp32: where the target cannot compute on bf16 (rounded to
        bf16 after each op), or under widen16 (rounded only where stored)."""
        return self.widen16 or not self.target.bf16_math_ok

    def stored(self, val: Val, dtype: str) -> str:
        """The code of `val` as stored into a tensor of `dtype`: under widen16 a bf16 value held
        as fp32 is rounded to nearest even here (the interpreter's conversion truncates)."""
        if dtype != "bf16" or not self.widen16:
            return val.code
        if not self.target.bf16_math_ok:
            self.combiners_used[BF16_RNE] = None
            return f"{BF16_RNE}({val.code})"
        return f"({val.code}).to(tl.bfloat16)"
