"""Executing fallback ops (docs/fallback-ops.md): host-plan steps that PyTorch runs.

A `FallbackOp` names an aten op (`aten.cumsum`, `aten.index.Tensor`, ...) and its whole argument
list; it runs as `torch.ops.aten.<op>[.<overload>](*args)`, the same kernel PyTorch eager runs
for that op, so a fallback costs what it costs in PyTorch. Needs only torch.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

from kforge.errors import UserError


@functools.lru_cache(maxsize=None)
def resolve(name: str):
    """The OpOverload a torch-mlir op name stands for: `aten.cumsum` -> aten::cumsum (its
    default overload), `aten.index.Tensor` -> aten::index.Tensor."""
    parts = name.split(".")
    if len(parts) < 2:
        raise UserError(f"fallback op {name!r}: expected a name like aten.cumsum")
    if parts[0] == "kforge":
        import kforge.attention_op  # noqa: F401 - registers torch.ops.kforge.*
        import kforge.moe_op  # noqa: F401
    namespace = getattr(torch.ops, parts[0])
    try:
        packet = getattr(namespace, parts[1])
    except (AttributeError, RuntimeError):
        packet = None
    if packet is None and parts[0] not in ("aten", "prims", "kforge"):
        # a library's own op (transformers::grouped_mm_fallback) exists once the library that
        # registers it is imported
        import importlib
        try:
            importlib.import_module(parts[0])
            packet = getattr(namespace, parts[1])
        except (ImportError, AttributeError, RuntimeError):
            packet = None
    if packet is None:
        raise UserError(f"fallback op {name}: this PyTorch ({torch.__version__}) has no "
                        f"operator {parts[0]}::{parts[1]}"
                        + ("" if parts[0] in ("aten", "prims") else
                           f"; it is registered by the Python package that defines it "
                           f"({parts[0]}?): install and import it before running the package"))
    overload = ".".join(parts[2:]) or "default"
    op = getattr(packet, overload, None)
    if op is None:
        raise UserError(f"fallback op {name}: this PyTorch ({torch.__version__}) has no "
                        f"overload {parts[0]}::{parts[1]}.{overload}")
    return op


def _split_kwargs(op, args: list):
    """torch-mlir lists every argument positionally; keyword-only ones (cumsum's dtype) go by
    name, as the schema says."""
    schema = op._schema.arguments
    positional, keywords = [], {}
    for spec, value in zip(schema, args):
        if spec.kwarg_only:
            keywords[spec.name] = value
        else:
            positional.append(value)
    return positional, keywords


def build_args(template, operands: Sequence[torch.Tensor], device: torch.device):
    """The op's arguments from the plan's template (FallbackOp.arg_list()): {"tensor": i} ->
    operands[i], a device -> the device the package runs on, lists recursively."""
    def build(a):
        if isinstance(a, dict):
            if "tensor" in a:
                return operands[a["tensor"]]
            if "device" in a:
                return device
            return a.get("dtype")
        if isinstance(a, (list, tuple)):
            return [build(v) for v in a]
        return a
    return [build(a) for a in template]


def run_fallback(name: str, template, operands: Sequence[torch.Tensor],
                 device: torch.device) -> tuple[torch.Tensor, ...]:
    op = resolve(name)
    positional, keywords = _split_kwargs(op, build_args(template, operands, device))
    try:
        out = op(*positional, **keywords)
    except torch.OutOfMemoryError:
        raise           # the device's, not the op's: callers wait and retry (kforge.verify)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in operands)
        raise UserError(f"fallback op {name} failed on operands ({shapes}): "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
            from None
    # the IR's tensors have no strides: a view PyTorch returns (a transpose, an index) is made
    # contiguous, as kernels downstream expect dense row-major operands
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    return tuple(t if not isinstance(t, torch.Tensor) or t.is_contiguous() else t.contiguous()
                 for t in outs)


__all__ = ["resolve", "build_args", "run_fallback"]
