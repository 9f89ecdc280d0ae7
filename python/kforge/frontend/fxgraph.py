"""The exported aten graph, as the IR's provenance refers to it.

Before torch-mlir imports the (decomposed) FX graph, `named_locations()` makes every op's MLIR
location carry the name of the FX node it comes from, `loc("fx:<node>"(<source location>))`.
Those names survive the lowering to linalg (conversion patterns keep their op's location), so
`kforge-opt`'s host plan can say, for each region call, which FX nodes the region computes and
which node each operand and result is (kforge.aten_regions turns that into the region's aten
program). `graph_record()` writes the graph itself as JSON (`model.fx.json` beside model.mlir):
placeholders in order, then each call as its aten op, its arguments (node references by name)
and the shapes and dtypes of its value.
"""
from __future__ import annotations

import contextlib
import operator

import torch

FX_GRAPH_SCHEMA = "kforge.fx-graph"
FX_GRAPH_VERSION = 1
LOCATION_PREFIX = "fx:"


@contextlib.contextmanager
def named_locations():
    """While active, torch-mlir's FX importer names each location after its FX node."""
    from torch_mlir.extras import fx_importer

    original = fx_importer.ContextCache.get_node_location

    def located(self, node):
        inner = original(self, node)
        name = f"{LOCATION_PREFIX}{node.name}"
        if inner is None:
            return fx_importer.Location.name(name, context=self._c)
        return fx_importer.Location.name(name, childLoc=inner, context=self._c)

    fx_importer.ContextCache.get_node_location = located
    try:
        yield
    finally:
        fx_importer.ContextCache.get_node_location = original


class _Unencodable(Exception):
    pass


def _encode(value):
    """An FX argument as JSON: {"node": name}, {"dtype": "float32"}, {"device": ...},
    {"layout"|"memory_format": ...}, scalars, lists; anything else is not encodable."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": str(value)}
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    raise _Unencodable(type(value).__name__)


def _value_meta(val):
    if isinstance(val, torch.Tensor):
        try:
            shape = [int(s) for s in val.shape]
        except (TypeError, ValueError):          # a symbolic size (dynamic batch)
            shape = None
        return {"shape": shape, "dtype": str(val.dtype).removeprefix("torch.")}
    if isinstance(val, (list, tuple)):
        return {"items": [_value_meta(v) for v in val]}
    return None


def _target_name(target) -> str | None:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)          # "aten.mm.default", "kforge.attention.default"
    return None


def graph_record(graph_module: torch.fx.GraphModule, user_inputs=None) -> dict:
    """The graph as JSON (see the module docstring). A call whose target is not an op overload
    (a Python function on sizes) or whose arguments cannot be written keeps `"op": null`: regions
    that contain it run their linalg reference instead. `user_inputs`: the placeholders that
    are the program's inputs (the imported function's arguments, in order); the others (lifted
    constants, frozen into the IR) are marked `"input": false`."""
    nodes = []
    for node in graph_module.graph.nodes:
        rec: dict = {"name": node.name, "kind": node.op}
        if node.op == "placeholder" and user_inputs is not None:
            rec["input"] = node.name in user_inputs
        if node.op == "call_function":
            rec["op"] = _target_name(node.target)
            try:
                rec["args"] = _encode(list(node.args))
                rec["kwargs"] = {k: _encode(v) for k, v in node.kwargs.items()}
            except _Unencodable as exc:
                rec["op"] = None
                rec["why"] = f"an argument of type {exc}"
            if rec["op"] is None and "why" not in rec:
                rec["why"] = f"target {getattr(node.target, '__name__', node.target)!s}"
        elif node.op == "output":
            rec["args"] = _encode(list(node.args[0]) if isinstance(node.args[0], (list, tuple))
                                  else [node.args[0]])
        meta = _value_meta(node.meta.get("val"))
        if meta is not None:
            rec["value"] = meta
        nodes.append(rec)
    return {"schema": FX_GRAPH_SCHEMA, "version": FX_GRAPH_VERSION, "nodes": nodes}


__all__ = ["named_locations", "graph_record", "FX_GRAPH_SCHEMA", "LOCATION_PREFIX"]
