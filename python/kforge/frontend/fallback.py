"""Fallback ops: what torch-mlir cannot (or should not) lower to linalg runs through PyTorch.

Every op of a traced model ends up in exactly one place: inside a fusion region (linalg), or
outside every region as a *fallback op* that PyTorch executes at run time (docs/fallback-ops.md).
The frontend decides which ops fall back on torch-mlir's raw `torch` dialect, before any
lowering: each such op becomes a call of an external function,

    %r = func.call @kforge.fallback.aten.cumsum.0(%x)
           : (!torch.vtensor<[2,5],f32>) -> !torch.vtensor<[2,5],f32>
    func.func private @kforge.fallback.aten.cumsum.0(!torch.vtensor<[2,5],f32>) -> ...
        attributes {kforge.fallback = "aten.cumsum", kforge.args = "[{\"tensor\": 0}, -1, null]"}

whose tensor operands are the op's tensors; the declaration's `kforge.args` holds the op's
whole argument list as JSON (`{"tensor": i}` for the i-th operand, numbers, booleans, strings,
null, lists, `{"device": "cpu"}`, `{"dtype": 6}`). torch-mlir's backend type conversion turns
the signature into builtin tensors like any other call, so the lowered module is plain upstream
MLIR: `kforge-opt` keeps the call where it is, regions form around it, and the host plan records
it as a `fallback` step that the runtime executes with `torch.ops.aten.<name>`.

Which ops fall back: `FALLBACK_OPS` (ops torch-mlir lowers to its own `tm_tensor` dialect,
which upstream MLIR lacks, and gathers/scatters whose linalg form — `tensor.extract` in a
generic body — no kernel spec describes), every `torch.operator` (an op torch-mlir has no
definition for), and every op the linalg conversion leaves behind (found by lowering, then
lowering again with those ops outlined).
"""
from __future__ import annotations

import json
import re

# aten op names (torch dialect spelling, without "torch.") that always run through PyTorch.
FALLBACK_OPS = frozenset({
    # torch-mlir lowers these to tm_tensor (scan, sort, topk, scatter, ...)
    "aten.cumsum", "aten.cumprod", "aten.sort", "aten.sort.stable", "aten.argsort",
    "aten.topk", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add",
    "aten.scatter_reduce.two", "aten.index_put", "aten._index_put_impl", "aten.index_add",
    "aten.histc", "aten.bincount", "aten.unique", "aten._unique2", "aten.searchsorted.Tensor",
    "aten.bucketize.Tensor", "aten.nonzero", "aten.masked_scatter", "aten.kthvalue",
    "aten.max.dim", "aten.min.dim", "aten.median.dim", "aten.mode", "aten.logcumsumexp",
    "aten.cummax", "aten.cummin", "aten.multinomial",
    # gathers: linalg.generic bodies with tensor.extract, which kernel specs do not describe
    "aten.embedding", "aten.index.Tensor", "aten.index_select", "aten.gather",
    "aten.take_along_dim",
    # attention: kept whole (the decomposition table's entry is dropped) and given a fused
    # kernel as a one-op region (kforge.kernel_fallbacks); its reference is torch's SDPA
    "aten.scaled_dot_product_attention",
    # concatenation: tensor.concat, which kernel specs do not describe (a copy at memory
    # speed); except a concatenation `kforge-opt --kforge-concat-to-generics` writes as an
    # elementwise select (`cat_is_elementwise`), which fuses with its producers and consumers
    "aten.cat",
    # writes into a slice (`x[..., a:b] = y` after functionalization: DeepSeek's attention
    # assembles its keys so): tensor.insert_slice, which neither kernel specs nor the host
    # plan describe (a copy at memory speed)
    "aten.slice_scatter", "aten.select_scatter",
})

# the lowering pipeline of torch-mlir's `torch-backend-to-linalg-on-tensors-backend-pipeline`
# without its last pass, `torch-verify-linalg-on-tensors-backend-contract`, which rejects any
# func.call; the frontend checks the result itself (no torch ops left, upstream dialects only)
LINALG_PIPELINE = (
    "builtin.module(func.func(torch-restructure-non-constant-axes),"
    "func.func(torch-fuse-quantized-ops),"
    "func.func(convert-torch-to-tmtensor{allow-non-finites=true}),"
    "func.func(canonicalize),"
    "func.func(convert-torch-to-linalg{allow-non-finites=true}),"
    "func.func(canonicalize),"
    "func.func(convert-torch-to-scf),func.func(convert-torch-to-arith),"
    "func.func(convert-torch-to-tensor),convert-torch-conversion-to-mlprogram,"
    "func.func(memref-expand),func.func(canonicalize),"
    "func.func(resolve-shaped-type-result-dims),func.func(cse),"
    "torch-func-backend-type-conversion,func.func(canonicalize),"
    "func.func(torch-finalizing-backend-type-conversion))")

SYMBOL_PREFIX = "kforge.fallback."


class CannotEncode(Exception):
    """An operand of a fallback op that is neither a tensor nor a constant we can write down."""


def aten_name(op) -> str:
    """`torch.aten.cumsum` -> `aten.cumsum`; `torch.operator "aten.histc"` -> `aten.histc`."""
    from torch_mlir import ir
    if op.operation.name == "torch.operator":
        name = ir.StringAttr(op.operation.attributes["name"]).value
        return name[len("torch."):] if name.startswith("torch.") else name
    return op.operation.name[len("torch."):]


def is_fallback(op, extra: frozenset[str]) -> bool:
    name = op.operation.name      # an OpView's .name may be its own "name" attribute
    if name == "torch.operator":
        return True
    if not name.startswith("torch.aten."):
        return False
    short = name[len("torch."):]
    if short in extra:
        return True
    return short in FALLBACK_OPS and not (short == "aten.cat" and cat_is_elementwise(op))


# most tensors a concatenation may join and still be an elementwise op: every output element
# reads each of them (ConcatToGenerics.cpp's `max-inputs` default)
CAT_MAX_INPUTS = 4


def cat_is_elementwise(op) -> bool:
    """True when `kforge-opt` writes this `torch.aten.cat` as a `linalg.generic`: 2 to
    CAT_MAX_INPUTS tensors of the result's dtype, of static, non-zero sizes along a constant
    dimension."""
    from torch_mlir import ir

    tensors, dim = op.operands[0], op.operands[1]
    owner = tensors.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "torch.prim.ListConstruct":
        return False
    if isinstance(dim.owner, ir.Block) or dim.owner.operation.name != "torch.constant.int":
        return False
    dim = ir.IntegerAttr(dim.owner.operation.attributes["value"]).value
    result = _vtensor(op.results[0].type)
    parts = [_vtensor(v.type) for v in owner.operation.operands]
    if result is None or not 2 <= len(parts) <= CAT_MAX_INPUTS or None in parts:
        return False
    shape, dtype = result
    if not shape or not -len(shape) <= dim < len(shape):
        return False
    dim %= len(shape)
    return all(d == dtype and len(p) == len(shape) and p[dim] not in (None, 0)
               for p, d in parts) and shape[dim] is not None


def _vtensor(type_) -> tuple[list[int | None], str] | None:
    """`!torch.vtensor<[4,?,32],f32>` -> ([4, None, 32], "f32"); None for anything else."""
    match = re.fullmatch(r"!torch\.vtensor<\[([^\]]*)\],(\w+)>", str(type_))
    if not match:
        return None
    dims = [d.strip() for d in match.group(1).split(",")] if match.group(1).strip() else []
    try:
        return [None if d == "?" else int(d) for d in dims], match.group(2)
    except ValueError:
        return None


def outline_fallbacks(module, extra: frozenset[str] = frozenset()) -> int:
    """Rewrites every fallback op of `module` (torch-mlir's raw torch dialect, in place) into a
    func.call of a private declaration; returns how many."""
    from torch_mlir import ir

    count = 0
    with module.context, ir.Location.unknown():
        funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
        for func in funcs:
            if not func.regions[0].blocks:
                continue
            for block in func.regions[0].blocks:
                for op in list(block.operations):
                    if is_fallback(op, extra):
                        _outline(module, op, count)
                        count += 1
    return count


def _outline(module, op, index: int) -> None:
    from torch_mlir import ir

    name = aten_name(op)
    tensors: list = []

    def encode(value):
        if _is_tensor(value.type):
            tensors.append(value)
            return {"tensor": len(tensors) - 1}
        owner = value.owner
        if isinstance(owner, ir.Block):
            raise CannotEncode(f"a block argument of type {value.type}")
        owner = owner.operation
        kind = owner.name
        if kind == "torch.constant.none":
            return None
        if kind == "torch.constant.int":
            return ir.IntegerAttr(owner.attributes["value"]).value
        if kind == "torch.constant.float":
            return ir.FloatAttr(owner.attributes["value"]).value
        if kind == "torch.constant.bool":
            attr = owner.attributes["value"]
            return bool(ir.BoolAttr(attr).value) if isinstance(attr, ir.BoolAttr) else \
                bool(ir.IntegerAttr(attr).value)
        if kind == "torch.constant.str":
            return ir.StringAttr(owner.attributes["value"]).value
        if kind == "torch.constant.device":
            return {"device": ir.StringAttr(owner.attributes["value"]).value}
        if kind == "torch.prim.ListConstruct":
            return [encode(v) for v in owner.operands]
        raise CannotEncode(f"{kind} (a value computed at run time)")

    try:
        template = [encode(v) for v in op.operands]
    except CannotEncode as exc:
        from kforge.errors import UserError
        raise UserError(f"{_location(op)}: {name} must run through PyTorch, and one of its "
                        f"arguments is {exc}; kforge cannot pass that to a fallback op yet") \
            from None
    symbol = f"{SYMBOL_PREFIX}{name}.{index}"
    result_types = [r.type for r in op.results]
    ftype = ir.FunctionType.get([t.type for t in tensors], result_types)
    # The attributes go on the declaration (one per call site): torch-mlir's type conversion
    # rebuilds calls and drops their discardable attributes, but keeps a function's.
    ir.Operation.create(
        "func.func", regions=1, ip=ir.InsertionPoint(module.body),
        attributes={"sym_name": ir.StringAttr.get(symbol),
                    "function_type": ir.TypeAttr.get(ftype),
                    "sym_visibility": ir.StringAttr.get("private"),
                    "kforge.fallback": ir.StringAttr.get(name),
                    "kforge.args": ir.StringAttr.get(json.dumps(template))})
    call = ir.Operation.create(
        "func.call", results=result_types, operands=tensors, loc=op.location,
        ip=ir.InsertionPoint(op), attributes={"callee": ir.FlatSymbolRefAttr.get(symbol)})
    for old, new in zip(op.results, call.results):
        old.replace_all_uses_with(new)
    op.erase()


def leftover_torch_ops(module) -> dict[str, str]:
    """Torch-dialect ops the lowering left (the linalg conversion failed on them), by aten name,
    with the first location of each."""
    from torch_mlir import ir

    found: dict[str, str] = {}

    def visit(op):
        name = op.operation.name
        if name.startswith("torch.aten.") or name == "torch.operator":
            short = aten_name(op)
            found.setdefault(short, _location(op))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _is_tensor(type_) -> bool:
    text = str(type_)
    return text.startswith("!torch.vtensor") or text.startswith("!torch.tensor")


def short_location(location) -> str:
    """`file:line` of an MLIR location (torch-mlir's FX import names the model's source line)."""
    text = str(location)
    match = re.search(r'"([^"]+)":(\d+)', text)
    return f"{match.group(1)}:{match.group(2)}" if match else text


def _location(op) -> str:
    return short_location(op.location)


__all__ = ["FALLBACK_OPS", "LINALG_PIPELINE", "outline_fallbacks", "leftover_torch_ops",
           "short_location"]
