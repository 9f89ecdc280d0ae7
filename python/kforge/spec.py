"""The kernel spec and the host plan as frozen dataclasses (schema: docs/kernel-spec.md).

`load_spec(path | dict)` and `load_host_plan(path | dict)` read the JSON that
`kforge-opt --kforge-export-regions` writes; `to_json(obj)` writes it back. Nothing here needs
MLIR: the Python half reads only these files. Errors name the file and the field that is wrong.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from kforge.errors import UserError

SPEC_SCHEMA = "kforge.kernel-spec"
PLAN_SCHEMA = "kforge.host-plan"
SCHEMA_VERSION = 1

FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")
INT_DTYPES = ("i1", "i8", "i16", "i32", "i64", "index")
DTYPES = FLOAT_DTYPES + INT_DTYPES


# ---------------------------------------------------------------------------------------------
# Affine expressions and maps
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AffineDim:
    d: int


@dataclass(frozen=True)
class AffineConst:
    c: int


@dataclass(frozen=True)
class AffineSymbol:
    s: int


@dataclass(frozen=True)
class AffineBinary:
    op: str          # add | mul | mod | floordiv | ceildiv
    lhs: "AffineExpr"
    rhs: "AffineExpr"


AffineExpr = Union[AffineDim, AffineConst, AffineSymbol, AffineBinary]
AFFINE_OPS = ("add", "mul", "mod", "floordiv", "ceildiv")


def affine_dims(expr: AffineExpr) -> set[int]:
    """The dimensions an affine expression reads."""
    if isinstance(expr, AffineDim):
        return {expr.d}
    if isinstance(expr, AffineBinary):
        return affine_dims(expr.lhs) | affine_dims(expr.rhs)
    return set()


def affine_text(expr: AffineExpr) -> str:
    if isinstance(expr, AffineDim):
        return f"d{expr.d}"
    if isinstance(expr, AffineConst):
        return str(expr.c)
    if isinstance(expr, AffineSymbol):
        return f"s{expr.s}"
    sym = {"add": "+", "mul": "*", "mod": "mod", "floordiv": "floordiv", "ceildiv": "ceildiv"}
    return f"({affine_text(expr.lhs)} {sym[expr.op]} {affine_text(expr.rhs)})"


@dataclass(frozen=True)
class AffineMap:
    num_dims: int
    results: tuple[AffineExpr, ...]
    text: str = ""

    def is_projected_permutation(self) -> bool:
        """Every result a distinct plain dimension (identity, transpose, broadcast, projection)."""
        dims = [r.d for r in self.results if isinstance(r, AffineDim)]
        return len(dims) == len(self.results) and len(set(dims)) == len(dims)

    def result_dims(self) -> tuple[int | None, ...]:
        """Per result: the dimension it is, or None when it is not a plain dimension."""
        return tuple(r.d if isinstance(r, AffineDim) else None for r in self.results)


# ---------------------------------------------------------------------------------------------
# Tensors, bodies, op records
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    name: str
    shape: tuple[int | None, ...]
    dtype: str
    weight: str | None = None


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int | None, ...]
    dtype: str


@dataclass(frozen=True)
class Stmt:
    id: str
    op: str
    operands: tuple[str, ...]
    type: str
    value: float | int | None = None      # arith.constant
    predicate: str | None = None          # arith.cmpf / arith.cmpi
    dim: int | None = None                # linalg.index


@dataclass(frozen=True)
class Body:
    args: tuple[str, ...]
    stmts: tuple[Stmt, ...]
    yields: tuple[str, ...]

    def stmt(self, name: str) -> Stmt | None:
        for s in self.stmts:
            if s.id == name:
                return s
        return None


@dataclass(frozen=True)
class GenericOp:
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    num_inputs: int
    iterator_types: tuple[str, ...]
    indexing_maps: tuple[AffineMap, ...]
    body: Body
    op: str = "generic"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.operands[: self.num_inputs]

    @property
    def inits(self) -> tuple[str, ...]:
        return self.operands[self.num_inputs:]

    @property
    def reduction_dims(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.iterator_types) if t == "reduction")

    @property
    def parallel_dims(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.iterator_types) if t == "parallel")


@dataclass(frozen=True)
class ReshapeOp:
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    reassociation: tuple[tuple[int, ...], ...]
    op: str = "reshape"


@dataclass(frozen=True)
class EmptyOp:
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    dynamic_sizes_from: tuple[tuple[str, int], ...] = ()
    op: str = "empty"


@dataclass(frozen=True)
class ConstantOp:
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    splat: float | int | None = None
    data: tuple[float | int, ...] | None = None
    op: str = "constant"


@dataclass(frozen=True)
class PadOp:
    """`tensor.pad` with static amounts and a constant value:
    {"op": "pad", "operands": [src], "results": [v], "low": [...], "high": [...], "value": x}."""
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    low: tuple[int, ...]
    high: tuple[int, ...]
    value: float | int = 0.0
    op: str = "pad"


@dataclass(frozen=True)
class OpaqueOp:
    """A host-plan step no record describes (kforge-opt keeps its MLIR text): runtimes refuse
    to execute it, naming it."""
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    mlir: str = ""
    op: str = "opaque"


@dataclass(frozen=True)
class FallbackOp:
    """A host-plan step PyTorch executes (docs/fallback-ops.md): `torch.ops.<name>` applied to
    `args`, the op's whole argument list, in which {"tensor": i} stands for operands[i]."""
    name: str                          # aten op, e.g. "aten.cumsum" or "aten.index.Tensor"
    operands: tuple[str, ...]
    results: tuple[str, ...]
    args: tuple = ()
    symbol: str = ""                   # the external function the IR calls
    op: str = "fallback"

    def arg_list(self) -> list:
        """`args` as the plan's JSON has it (lists and {"tensor": i} dicts)."""
        return _thaw(self.args)


OpRecord = Union[GenericOp, ReshapeOp, EmptyOp, ConstantOp, PadOp, OpaqueOp, FallbackOp]


@dataclass(frozen=True)
class CallStep:
    call: str
    operands: tuple[str, ...]
    results: tuple[str, ...]


@dataclass(frozen=True)
class KernelStep:
    """A linked host plan's call of a verified kernel (a `kforge.custom_call` in the linked IR):
    region `kernel` (its hash) computed by the kernel `symbol` for `target`."""
    kernel: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    symbol: str = ""
    target: str = ""

    @property
    def call(self) -> str:          # the region it computes, as a CallStep names it
        return self.kernel


@dataclass(frozen=True)
class KernelSpec:
    hash: str
    name: str
    args: tuple[Arg, ...]
    values: tuple[Value, ...]
    ops: tuple[OpRecord, ...]
    results: tuple[str, ...]
    root_kind: str = "elementwise"
    fused: tuple[str, ...] = ()
    flops: int = 0
    min_bytes: int = 0
    version: int = SCHEMA_VERSION

    def tensor(self, name: str) -> Arg | Value:
        """The argument or value called `name`."""
        for t in self.args:
            if t.name == name:
                return t
        for t in self.values:
            if t.name == name:
                return t
        raise KeyError(f"{self.name}: no argument or value named {name!r}")

    def producer(self, name: str) -> OpRecord | None:
        """The op record that defines `name` (None for arguments)."""
        for op in self.ops:
            if name in op.results:
                return op
        return None

    def users(self, name: str) -> list[OpRecord]:
        return [op for op in self.ops if name in op.operands]


@dataclass(frozen=True)
class HostPlan:
    function: str
    inputs: tuple[Arg, ...]
    values: tuple[Value, ...]
    steps: tuple[Union[CallStep, KernelStep, OpRecord], ...]
    outputs: tuple[str, ...]
    version: int = SCHEMA_VERSION
    directory: str | None = None          # where the plan was read from (specs live beside it)

    def tensor(self, name: str) -> Arg | Value:
        for t in self.inputs + self.values:
            if t.name == name:
                return t
        raise KeyError(f"host plan {self.function}: no input or value named {name!r}")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
class _Reader:
    """Reads one JSON document, remembering where it came from for error messages."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, what: str) -> UserError:
        return UserError(f"{self.source}: field {where}: {what}")

    def get(self, obj: Any, key: str, where: str, kind=None, default=...):
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected a JSON object, got {type(obj).__name__}")
        if key not in obj:
            if default is not ...:
                return default
            raise self.fail(f"{where}.{key}", "missing")
        value = obj[key]
        if kind is not None and not isinstance(value, kind):
            if value is None and default is None:
                return None
            raise self.fail(f"{where}.{key}",
                            f"expected {getattr(kind, '__name__', kind)}, got {value!r:.60}")
        return value

    def names(self, obj, key, where, default=...) -> tuple[str, ...]:
        items = self.get(obj, key, where, list, default)
        if items is None:
            return ()
        for i, n in enumerate(items):
            if not isinstance(n, str):
                raise self.fail(f"{where}.{key}[{i}]", f"expected a name, got {n!r}")
        return tuple(items)

    def header(self, doc, schema: str):
        if not isinstance(doc, dict):
            raise UserError(f"{self.source}: expected a JSON object at the top level")
        got = doc.get("schema")
        if got != schema:
            raise self.fail("schema", f"expected {schema!r}, got {got!r} "
                            "(is this file a kforge export?)")
        version = doc.get("version")
        if not isinstance(version, int):
            raise self.fail("version", f"expected an integer, got {version!r}")
        if version > SCHEMA_VERSION or version < 1:
            raise self.fail("version", f"version {version} is not supported by this kforge "
                            f"(it reads version {SCHEMA_VERSION}); upgrade kforge or re-export "
                            "with a matching kforge-opt")
        return version

    def tensor_type(self, obj, where):
        shape = self.get(obj, "shape", where, list)
        for i, d in enumerate(shape):
            if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 0):
                raise self.fail(f"{where}.shape[{i}]", f"expected a size or null, got {d!r}")
        dtype = self.get(obj, "dtype", where, str)
        if dtype not in DTYPES:
            raise self.fail(f"{where}.dtype", f"unknown element type {dtype!r} "
                            f"(known: {', '.join(DTYPES)})")
        return tuple(shape), dtype

    def arg(self, obj, where) -> Arg:
        shape, dtype = self.tensor_type(obj, where)
        weight = self.get(obj, "weight", where, str, None)
        return Arg(self.get(obj, "name", where, str), shape, dtype, weight)

    def value(self, obj, where) -> Value:
        shape, dtype = self.tensor_type(obj, where)
        return Value(self.get(obj, "name", where, str), shape, dtype)

    def affine(self, obj, where) -> AffineExpr:
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected an affine expression object, got {obj!r:.60}")
        if "d" in obj:
            return AffineDim(self.get(obj, "d", where, int))
        if "c" in obj:
            return AffineConst(self.get(obj, "c", where, int))
        if "s" in obj:
            return AffineSymbol(self.get(obj, "s", where, int))
        op = self.get(obj, "op", where, str)
        if op not in AFFINE_OPS:
            raise self.fail(f"{where}.op", f"unknown affine operator {op!r}")
        return AffineBinary(op, self.affine(obj.get("lhs"), f"{where}.lhs"),
                            self.affine(obj.get("rhs"), f"{where}.rhs"))

    def affine_map(self, obj, where) -> AffineMap:
        n = self.get(obj, "num_dims", where, int)
        results = self.get(obj, "results", where, list)
        exprs = tuple(self.affine(r, f"{where}.results[{i}]") for i, r in enumerate(results))
        for i, e in enumerate(exprs):
            bad = [d for d in affine_dims(e) if d >= n]
            if bad:
                raise self.fail(f"{where}.results[{i}]", f"uses d{bad[0]} but num_dims is {n}")
        return AffineMap(n, exprs, self.get(obj, "text", where, str, ""))

    def stmt(self, obj, where) -> Stmt:
        op = self.get(obj, "op", where, str)
        value = obj.get("value") if isinstance(obj, dict) else None
        if op == "arith.constant":
            if "value" not in obj:
                raise self.fail(f"{where}.value", "missing")
            value = _number(value, self, f"{where}.value")
        predicate = self.get(obj, "predicate", where, str, None)
        if op in ("arith.cmpf", "arith.cmpi") and predicate is None:
            raise self.fail(f"{where}.predicate", "missing")
        dim = self.get(obj, "dim", where, int, None)
        if op == "linalg.index" and dim is None:
            raise self.fail(f"{where}.dim", "missing")
        return Stmt(self.get(obj, "id", where, str), op, self.names(obj, "operands", where, ()),
                    self.get(obj, "type", where, str, ""), value, predicate, dim)

    def body(self, obj, where) -> Body:
        args = self.names(obj, "args", where)
        stmts = tuple(self.stmt(s, f"{where}.stmts[{i}]")
                      for i, s in enumerate(self.get(obj, "stmts", where, list)))
        yields = self.names(obj, "yields", where)
        known = set(args)
        for i, s in enumerate(stmts):
            for o in s.operands:
                if o not in known:
                    raise self.fail(f"{where}.stmts[{i}].operands",
                                    f"{o!r} is neither a block argument nor an earlier statement")
            known.add(s.id)
        for y in yields:
            if y not in known:
                raise self.fail(f"{where}.yields", f"{y!r} is not defined in the body")
        return Body(args, stmts, yields)

    def op_record(self, obj, where) -> OpRecord:
        kind = self.get(obj, "op", where, str)
        name = self.get(obj, "name", where, str, kind)
        operands = self.names(obj, "operands", where, ())
        results = self.names(obj, "results", where)
        if kind == "generic":
            num_inputs = self.get(obj, "num_inputs", where, int)
            iters = self.names(obj, "iterator_types", where)
            for i, t in enumerate(iters):
                if t not in ("parallel", "reduction"):
                    raise self.fail(f"{where}.iterator_types[{i}]", f"unknown iterator {t!r}")
            maps = tuple(self.affine_map(m, f"{where}.indexing_maps[{i}]")
                         for i, m in enumerate(self.get(obj, "indexing_maps", where, list)))
            if len(maps) != len(operands):
                raise self.fail(f"{where}.indexing_maps",
                                f"{len(maps)} maps for {len(operands)} operands")
            for i, m in enumerate(maps):
                if m.num_dims != len(iters):
                    raise self.fail(f"{where}.indexing_maps[{i}].num_dims",
                                    f"{m.num_dims}, but there are {len(iters)} iterators")
            body = self.body(self.get(obj, "body", where, dict), f"{where}.body")
            if len(body.args) != len(operands):
                raise self.fail(f"{where}.body.args",
                                f"{len(body.args)} block arguments for {len(operands)} operands")
            if len(body.yields) != len(results) or len(results) != len(operands) - num_inputs:
                raise self.fail(f"{where}.results",
                                f"{len(results)} results, {len(body.yields)} yields, "
                                f"{len(operands) - num_inputs} outputs: they must agree")
            return GenericOp(name, operands, results, num_inputs, iters, maps, body)
        if kind == "reshape":
            reassoc = self.get(obj, "reassociation", where, list)
            groups = []
            for i, g in enumerate(reassoc):
                if not isinstance(g, list) or not all(isinstance(x, int) for x in g):
                    raise self.fail(f"{where}.reassociation[{i}]", "expected a list of integers")
                groups.append(tuple(g))
            return ReshapeOp(name, operands, results, tuple(groups))
        if kind == "empty":
            dyn = self.get(obj, "dynamic_sizes_from", where, list, [])
            return EmptyOp(name, operands, results,
                           tuple((str(a), int(d)) for a, d in (dyn or [])))
        if kind == "constant":
            splat = obj.get("splat")
            data = obj.get("data")
            if splat is None and data is None:
                raise self.fail(where, "a constant needs 'splat' or 'data'")
            if splat is not None:
                splat = _number(splat, self, f"{where}.splat")
            if data is not None:
                data = tuple(_number(x, self, f"{where}.data[{i}]") for i, x in enumerate(data))
            return ConstantOp(name, operands, results, splat, data)
        if kind == "pad":
            low = self.get(obj, "low", where, list)
            high = self.get(obj, "high", where, list)
            for key, amounts in (("low", low), ("high", high)):
                if not all(isinstance(x, int) and not isinstance(x, bool) for x in amounts):
                    raise self.fail(f"{where}.{key}", "expected a list of static integers")
            value = _number(obj.get("value", 0.0), self, f"{where}.value")
            return PadOp(name, operands, results, tuple(low), tuple(high), value)
        if kind == "opaque":
            return OpaqueOp(name, operands, results, self.get(obj, "mlir", where, str, ""))
        if kind == "fallback":
            args = self.get(obj, "args", where, list, [])
            _check_fallback_args(args, len(operands), self, f"{where}.args")
            return FallbackOp(name, operands, results, _freeze(args),
                              self.get(obj, "symbol", where, str, ""))
        raise self.fail(f"{where}.op", f"unknown op record kind {kind!r} "
                        "(version 1 knows generic, reshape, empty, constant, pad, fallback, "
                        "opaque)")

    def check_names(self, defined: set[str], ops, results, where_results):
        for i, op in enumerate(ops):
            if isinstance(op, (CallStep, KernelStep)):
                where = f"steps[{i}]"
            else:
                where = f"ops[{i}]" if where_results == "results" else f"steps[{i}]"
            for o in op.operands:
                if o not in defined:
                    raise self.fail(f"{where}.operands", f"{o!r} is used before it is defined")
            defined.update(op.results)
        for r in results:
            if r not in defined:
                raise self.fail(where_results, f"{r!r} is not defined")


def _check_fallback_args(args, num_operands: int, reader: "_Reader", where: str) -> None:
    for i, a in enumerate(args):
        if isinstance(a, list):
            _check_fallback_args(a, num_operands, reader, f"{where}[{i}]")
        elif isinstance(a, dict):
            if "tensor" in a:
                t = a["tensor"]
                if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < num_operands:
                    raise reader.fail(f"{where}[{i}]", f"tensor index {t!r} is not one of the "
                                      f"{num_operands} operands")
            elif not ("device" in a or "dtype" in a):
                raise reader.fail(f"{where}[{i}]", f"unknown argument {a!r:.80}")
        elif not (a is None or isinstance(a, (bool, int, float, str))):
            raise reader.fail(f"{where}[{i}]", f"unknown argument {a!r:.80}")


def _freeze(x):
    """Lists to tuples, dicts to sorted item tuples: a FallbackOp stays hashable and frozen."""
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    return x


def _thaw(x):
    if isinstance(x, tuple):
        if x and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str)
                     and v[0] in ("tensor", "device", "dtype") for v in x):
            return {k: _thaw(v) for k, v in x}
        return [_thaw(v) for v in x]
    return x


def _number(x, reader: _Reader, where: str):
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, str) and x in ("inf", "-inf", "nan", "+inf"):
        return float(x)
    raise reader.fail(where, f"expected a number or 'inf'/'-inf'/'nan', got {x!r:.60}")


def _read(source) -> tuple[Any, str]:
    if isinstance(source, dict):
        return source, "<kernel spec>"
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        return json.loads(text), str(path)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: {exc}") from exc


def load_spec(source: "str | Path | dict") -> KernelSpec:
    """Read a kernel spec (`<hash>.json`) from a path or an already parsed dict."""
    doc, where = _read(source)
    r = _Reader(where)
    version = r.header(doc, SPEC_SCHEMA)
    args = tuple(r.arg(a, f"args[{i}]") for i, a in enumerate(r.get(doc, "args", "", list)))
    values = tuple(r.value(v, f"values[{i}]")
                   for i, v in enumerate(r.get(doc, "values", "", list, [])))
    ops = tuple(r.op_record(o, f"ops[{i}]") for i, o in enumerate(r.get(doc, "ops", "", list)))
    results = r.names(doc, "results", "")
    typed = {t.name for t in args + values}
    for i, op in enumerate(ops):
        for res in op.results:
            if res not in typed:
                raise r.fail(f"ops[{i}].results", f"{res!r} has no entry in 'values'")
    r.check_names({a.name for a in args}, ops, results, "results")
    return KernelSpec(
        hash=r.get(doc, "hash", "", str), name=r.get(doc, "name", "", str),
        args=args, values=values, ops=ops, results=results,
        root_kind=r.get(doc, "root_kind", "", str, "elementwise"),
        fused=tuple(r.get(doc, "fused", "", list, []) or ()),
        flops=int(r.get(doc, "flops", "", (int, float), 0) or 0),
        min_bytes=int(r.get(doc, "min_bytes", "", (int, float), 0) or 0),
        version=version)


def load_host_plan(source: "str | Path | dict") -> HostPlan:
    """Read a host plan (`host_plan.json`); region specs live beside it as `<hash>.json`."""
    doc, where = _read(source)
    r = _Reader(where)
    version = r.header(doc, PLAN_SCHEMA)
    inputs = tuple(r.arg(a, f"inputs[{i}]") for i, a in enumerate(r.get(doc, "inputs", "", list)))
    values = tuple(r.value(v, f"values[{i}]")
                   for i, v in enumerate(r.get(doc, "values", "", list, [])))
    steps = []
    for i, s in enumerate(r.get(doc, "steps", "", list)):
        if isinstance(s, dict) and "call" in s:
            steps.append(CallStep(r.get(s, "call", f"steps[{i}]", str),
                                  r.names(s, "operands", f"steps[{i}]"),
                                  r.names(s, "results", f"steps[{i}]")))
        elif isinstance(s, dict) and "kernel" in s:
            steps.append(KernelStep(r.get(s, "kernel", f"steps[{i}]", str),
                                    r.names(s, "operands", f"steps[{i}]"),
                                    r.names(s, "results", f"steps[{i}]"),
                                    r.get(s, "symbol", f"steps[{i}]", str, ""),
                                    r.get(s, "target", f"steps[{i}]", str, "")))
        else:
            steps.append(r.op_record(s, f"steps[{i}]"))
    outputs = r.names(doc, "outputs", "")
    r.check_names({a.name for a in inputs}, steps, outputs, "outputs")
    directory = None if isinstance(source, dict) else str(Path(source).parent)
    return HostPlan(r.get(doc, "function", "", str, "main"), inputs, values, tuple(steps),
                    outputs, version, directory)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------
def _num_json(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _affine_json(e: AffineExpr) -> dict:
    if isinstance(e, AffineDim):
        return {"d": e.d}
    if isinstance(e, AffineConst):
        return {"c": e.c}
    if isinstance(e, AffineSymbol):
        return {"s": e.s}
    return {"op": e.op, "lhs": _affine_json(e.lhs), "rhs": _affine_json(e.rhs)}


def _to_dict(obj) -> Any:
    if isinstance(obj, KernelSpec):
        return {"schema": SPEC_SCHEMA, "version": obj.version, "hash": obj.hash, "name": obj.name,
                "root_kind": obj.root_kind, "fused": list(obj.fused), "flops": obj.flops,
                "min_bytes": obj.min_bytes, "args": [_to_dict(a) for a in obj.args],
                "values": [_to_dict(v) for v in obj.values],
                "ops": [_to_dict(o) for o in obj.ops], "results": list(obj.results)}
    if isinstance(obj, HostPlan):
        return {"schema": PLAN_SCHEMA, "version": obj.version, "function": obj.function,
                "inputs": [_to_dict(a) for a in obj.inputs],
                "values": [_to_dict(v) for v in obj.values],
                "steps": [_to_dict(s) for s in obj.steps], "outputs": list(obj.outputs)}
    if isinstance(obj, Arg):
        return {"name": obj.name, "shape": list(obj.shape), "dtype": obj.dtype,
                "weight": obj.weight}
    if isinstance(obj, Value):
        return {"name": obj.name, "shape": list(obj.shape), "dtype": obj.dtype}
    if isinstance(obj, CallStep):
        return {"call": obj.call, "operands": list(obj.operands), "results": list(obj.results)}
    if isinstance(obj, KernelStep):
        return {"kernel": obj.kernel, "symbol": obj.symbol, "target": obj.target,
                "operands": list(obj.operands), "results": list(obj.results)}
    if isinstance(obj, GenericOp):
        return {"op": "generic", "name": obj.name, "operands": list(obj.operands),
                "num_inputs": obj.num_inputs, "results": list(obj.results),
                "iterator_types": list(obj.iterator_types),
                "indexing_maps": [{"num_dims": m.num_dims,
                                   "results": [_affine_json(e) for e in m.results],
                                   "text": m.text} for m in obj.indexing_maps],
                "body": _to_dict(obj.body)}
    if isinstance(obj, Body):
        return {"args": list(obj.args), "stmts": [_to_dict(s) for s in obj.stmts],
                "yields": list(obj.yields)}
    if isinstance(obj, Stmt):
        d = {"id": obj.id, "op": obj.op, "operands": list(obj.operands), "type": obj.type}
        if obj.op == "arith.constant":
            d["value"] = _num_json(obj.value)
        if obj.predicate is not None:
            d["predicate"] = obj.predicate
        if obj.dim is not None:
            d["dim"] = obj.dim
        return d
    if isinstance(obj, ReshapeOp):
        return {"op": "reshape", "name": obj.name, "operands": list(obj.operands),
                "results": list(obj.results), "reassociation": [list(g) for g in obj.reassociation]}
    if isinstance(obj, EmptyOp):
        d = {"op": "empty", "name": obj.name, "operands": list(obj.operands),
             "results": list(obj.results)}
        if obj.dynamic_sizes_from:
            d["dynamic_sizes_from"] = [list(x) for x in obj.dynamic_sizes_from]
        return d
    if isinstance(obj, ConstantOp):
        d = {"op": "constant", "name": obj.name, "operands": list(obj.operands),
             "results": list(obj.results)}
        if obj.splat is not None:
            d["splat"] = _num_json(obj.splat)
        if obj.data is not None:
            d["data"] = [_num_json(x) for x in obj.data]
        return d
    if isinstance(obj, PadOp):
        return {"op": "pad", "name": obj.name, "operands": list(obj.operands),
                "results": list(obj.results), "low": list(obj.low), "high": list(obj.high),
                "value": _num_json(obj.value)}
    if isinstance(obj, OpaqueOp):
        return {"op": "opaque", "name": obj.name, "operands": list(obj.operands),
                "results": list(obj.results), "mlir": obj.mlir}
    if isinstance(obj, FallbackOp):
        return {"op": "fallback", "name": obj.name, "symbol": obj.symbol,
                "args": _thaw(obj.args), "operands": list(obj.operands),
                "results": list(obj.results)}
    raise TypeError(f"to_json: cannot write {type(obj).__name__}")


def to_json(obj, path: "str | Path | None" = None) -> str:
    """The JSON text of a KernelSpec, HostPlan or any record in them; written to `path` if given."""
    text = json.dumps(_to_dict(obj), indent=1)
    if path is not None:
        Path(path).write_text(text + "\n")
    return text


def to_dict(obj) -> dict:
    """The JSON-ready dict of a KernelSpec, HostPlan or record."""
    return _to_dict(obj)
