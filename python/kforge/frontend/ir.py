"""The MLIR 22 side of the import: parse torch-mlir's text, clean it up, annotate weights, verify.

torch-mlir bundles a newer MLIR than the C++ half builds on, so everything here uses the MLIR
22.1.8 Python bindings (package `mlir`, from xtc-mlir-python-bindings): what they print is what
`kforge-opt` reads, and a construct MLIR 22 cannot parse is caught here, at import, with a message,
instead of later in `kforge-opt`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kforge.errors import UserError

ENTRY = "main"
WEIGHT_ATTR = "kforge.weight"
WEIGHTS_FILE_ATTR = "kforge.weights_file"


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int | None, ...]    # None: a dynamic dimension
    dtype: str                       # MLIR element type spelling: f32, bf16, i64, ...


@dataclass(frozen=True)
class FinalizedModule:
    text: str
    arg_types: tuple[TensorType, ...]
    result_types: tuple[TensorType, ...]
    asserts_removed: int


def finalize_module(text: str, *, weight_names: Sequence[str], num_inputs: int,
                    weights_file: str, origin: str) -> FinalizedModule:
    """Parses torch-mlir's output in MLIR 22, applies the clean-ups and the weights convention.

    - `cf.assert`s inside linalg op bodies are removed: torch-mlir emits them for cases it calls
      "unimplemented" (e.g. `1/x` at x == 0 in batch norm's reciprocal) where PyTorch simply
      returns inf, and a scalar body with control flow cannot become a kernel.
    - torch-mlir writes tanh-GELU's sqrt(2/pi) as 0.797724 (off by 2e-4 relative, which moves
      outputs by ~5e-5, half the strict tolerance); the constant that feeds `mulf` → `math.tanh`
      is restored to the exact value, so the IR computes what PyTorch computes;
    - weight arguments of `@main` get `{kforge.weight = "<name in the weights file>"}`;
    - the module gets `kforge.weights_file = "<file beside the IR>"`.
    """
    from mlir import ir

    diagnostics: list[str] = []

    def collect(diag) -> bool:
        diagnostics.append(f"{diag.location}: {diag.message}")
        return True

    with ir.Context() as ctx, ir.Location.unknown():
        handler = ctx.attach_diagnostic_handler(collect)
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise UserError(
                f"{origin}: torch-mlir produced IR that MLIR 22.1.8 cannot parse "
                f"(a frontend clean-up is missing; please report it):\n"
                f"{_first_lines(str(exc), diagnostics)}") from None
        entry = _entry_function(module, origin)
        removed = _remove_body_asserts(module)
        _exact_gelu_tanh_constant(module)
        arg_types = _function_types(entry, "function_type", inputs=True)
        expected = num_inputs + len(weight_names)
        if len(arg_types) != expected:
            raise UserError(f"{origin}: @{ENTRY} has {len(arg_types)} arguments, expected "
                            f"{num_inputs} inputs + {len(weight_names)} weights (internal error)")
        arg_attrs = []
        for index in range(expected):
            if index < num_inputs:
                arg_attrs.append(ir.DictAttr.get({}))
            else:
                name = weight_names[index - num_inputs]
                arg_attrs.append(ir.DictAttr.get({WEIGHT_ATTR: ir.StringAttr.get(name)}))
        entry.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_attrs)
        module.operation.attributes[WEIGHTS_FILE_ATTR] = ir.StringAttr.get(weights_file)
        try:
            module.operation.verify()
        except ir.MLIRError as exc:
            raise UserError(f"{origin}: the imported IR does not verify in MLIR 22.1.8 "
                            f"(internal error):\n{_first_lines(str(exc), diagnostics)}") from None
        result = FinalizedModule(
            text=module.operation.get_asm(enable_debug_info=True),
            arg_types=tuple(arg_types),
            result_types=tuple(_function_types(entry, "function_type", inputs=False)),
            asserts_removed=removed)
        handler.detach()
    return result


def _entry_function(module, origin: str):
    for op in module.body.operations:
        if op.operation.name == "func.func" and \
                str(op.attributes["sym_name"]).strip('"') == ENTRY:
            return op.operation
    raise UserError(f"{origin}: torch-mlir output has no @{ENTRY} function (internal error)")


TORCH_MLIR_SQRT_2_OVER_PI = 0.797724      # what torch-mlir's GELU(approximate="tanh") writes
SQRT_2_OVER_PI = 0.7978845608028654


def _exact_gelu_tanh_constant(module) -> int:
    """Replaces torch-mlir's rounded sqrt(2/pi) where it scales the argument of a tanh."""
    from mlir import ir

    fixed = []

    def feeds_tanh(value) -> bool:
        for use in value.uses:
            user = use.owner
            if user.name == "arith.mulf" and any(
                    u.owner.name == "math.tanh" for u in user.results[0].uses):
                return True
        return False

    def visit(op):
        if op.name == "arith.constant" and len(op.results) == 1:
            attr = op.attributes["value"]
            if isinstance(attr, ir.FloatAttr) and str(attr.type) == "f32" and \
                    abs(attr.value - TORCH_MLIR_SQRT_2_OVER_PI) < 1e-7 and \
                    feeds_tanh(op.results[0]):
                fixed.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in fixed:
        op.attributes["value"] = ir.FloatAttr.get(ir.F32Type.get(), SQRT_2_OVER_PI)
    return len(fixed)


def _remove_body_asserts(module) -> int:
    from mlir import ir

    doomed = []

    def visit(op):
        if op.name == "cf.assert" and op.parent is not None and \
                op.parent.name.startswith("linalg."):
            doomed.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in doomed:
        condition = op.operands[0]
        op.erase()
        producer = condition.owner            # the comparison that fed only the assert
        if isinstance(producer, ir.OpView):
            producer = producer.operation
        if isinstance(producer, ir.Operation) and producer.name.startswith("arith.") and \
                not any(True for _ in condition.uses):
            producer.erase()
    return len(doomed)


def _function_types(func_op, attr: str, *, inputs: bool) -> list[TensorType]:
    from mlir import ir

    ftype = ir.FunctionType(ir.TypeAttr(func_op.attributes[attr]).value)
    return [_tensor_type(t) for t in (ftype.inputs if inputs else ftype.results)]


def _tensor_type(t) -> TensorType:
    from mlir import ir

    try:
        ranked = ir.RankedTensorType(t)
    except ValueError:          # not a ranked tensor (e.g. a scalar index/int argument)
        return TensorType((), str(t))
    shape = tuple(None if ranked.is_dynamic_dim(i) else ranked.get_dim_size(i)
                  for i in range(ranked.rank))
    return TensorType(shape, str(ranked.element_type))


def _first_lines(message: str, diagnostics: list[str], limit: int = 20) -> str:
    lines = (diagnostics or message.splitlines())[:limit]
    return "\n".join(lines)
