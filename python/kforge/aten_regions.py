"""Regions without a kernel run the model's own aten ops (docs/fallback-ops.md, "Regions").

A region is linalg; its reference (kforge.reference) interprets that linalg with torch, which is
right but slow: every broadcast, transpose and index grid of the linalg form is materialized.
A region without a verified kernel should cost what the same ops cost in PyTorch. So at compile
time each region gets an *aten program*: the FX nodes of the exported graph that compute its
results, cut at its operands, run op by op with `torch.ops` at run time.

The cut comes from provenance: every op's location names its FX node (kforge.frontend.fxgraph),
and `kforge-opt`'s host plan records, for each region call, the node behind each operand and
result (`origin`). From a call's results the program walks the FX graph backwards and stops at
values the call receives as operands. Every program is then checked against the region's linalg
reference on random inputs (the same draws verification uses); one that does not match exactly
enough — a cut that lands inside one aten op's lowering, a reshape the linalg does differently —
is dropped, with the reason in `regions/aten.json`, and that region keeps its reference.
A region too large to check on the compiling machine in reasonable time (above
KFORGE_ATEN_CHECK_GFLOP, default 50 GFLOP: a real LLM's prefill GEMMs are TFLOPs, minutes on a
CPU) gets its program unchecked; the runtime checks it at its first run, on the model's own
operands, against the reference (`FirstUseCheck`), and keeps the reference if they differ.

Needs only torch at run time (`AtenProgram`, `load_programs`); building needs the FX graph the
frontend wrote (`model.fx.json`) and the host plan as kforge-opt wrote it.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch

from kforge.cache import atomic_write_text
from kforge.errors import UserError
from kforge.verify.contract import NARROW_DTYPES, eps_of

PROGRAM_SCHEMA = "kforge.aten-program"
PROGRAM_VERSION = 1
SUMMARY = "aten.json"           # regions/aten.json: which regions got a program, and why not

_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
           "i1": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
           "index": "int64"}

# Ops a program may recompute although the region's IR has none of them (torch-mlir folds them
# away or CSE gives their op another node's location): cheap, layout-only or constant-making.
_CHEAP = {"view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "unsqueeze",
          "squeeze", "slice", "select", "clone", "alias", "_to_copy", "detach",
          "lift_fresh_copy", "arange", "full", "scalar_tensor", "zeros", "ones", "empty",
          "new_zeros", "new_ones", "full_like", "zeros_like", "ones_like", "unbind", "split",
          "split_with_sizes", "contiguous"}

_RESHAPES = {"aten.view.default": "aten.reshape.default",
             "aten._unsafe_view.default": "aten.reshape.default"}

# Most alternatives tried when a value's producer is ambiguous (a tuple's items of one shape).
_MAX_CHOICES = 16
_CHECK_SEEDS = (11,)          # one draw: a wrong cut differs everywhere; regions are big
CHECK_GFLOP = 50.0            # default KFORGE_ATEN_CHECK_GFLOP: above it, checked at first use


def check_budget_gflop() -> float:
    import os
    value = os.environ.get("KFORGE_ATEN_CHECK_GFLOP")
    try:
        return float(value) if value else CHECK_GFLOP
    except ValueError:
        raise UserError(f"KFORGE_ATEN_CHECK_GFLOP={value!r}: expected a number of GFLOP") from None


class _NoProgram(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# The program and its execution (torch only)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AtenProgram:
    """`inputs`: (value name, operand index, shape the FX value has); `ops`: FX node records
    (name, op, args, kwargs) in execution order; `outputs`: (value name, tuple item or None,
    the region result's shape)."""
    region: str
    inputs: tuple
    ops: tuple
    outputs: tuple
    checked: bool = True        # False: too large to check when compiling; checked at first use

    def to_json(self) -> dict:
        return {"schema": PROGRAM_SCHEMA, "version": PROGRAM_VERSION, "region": self.region,
                "inputs": [list(i) for i in self.inputs], "ops": list(self.ops),
                "outputs": [list(o) for o in self.outputs], "checked": self.checked}

    @staticmethod
    def from_json(doc: dict) -> "AtenProgram":
        if doc.get("schema") != PROGRAM_SCHEMA or doc.get("version") != PROGRAM_VERSION:
            raise UserError(f"not a {PROGRAM_SCHEMA} v{PROGRAM_VERSION} document")
        return AtenProgram(doc["region"],
                           tuple((n, i, tuple(shape)) for n, i, shape in doc["inputs"]),
                           tuple(doc["ops"]),
                           tuple((n, item, tuple(shape)) for n, item, shape in doc["outputs"]),
                           bool(doc.get("checked", True)))

    def callable(self):
        """f(*region_args) -> tuple of the region's results, by torch.ops: Python source made
        once (one call per op, arguments as literals), so a call costs what eager's dispatch
        of the same ops costs."""
        from kforge.fallbacks import resolve
        names = {}

        def var(node: str) -> str:
            return names.setdefault(node, f"v{len(names)}")

        scope: dict = {"torch": torch}
        lines = ["def run(*args):",
                 "    device = args[0].device if args else torch.device('cpu')"]
        for name, index, shape in self.inputs:
            lines.append(f"    {var(name)} = args[{int(index)}].reshape({list(shape)!r})")
        for i, op in enumerate(self.ops):
            target = op["op"]
            if target == "getitem":
                src, item = op["args"]
                lines.append(f"    {var(op['name'])} = {var(src['node'])}[{int(item)}]")
                continue
            # a view of a value whose strides differ from the export's (operands arrive dense)
            # is the same reshape; the graph is functional, so nothing can observe the copy
            scope[f"op{i}"] = resolve(_RESHAPES.get(target, target))
            args = [_literal(a, var) for a in op["args"]]
            args += [f"{k}={_literal(v, var)}" for k, v in op["kwargs"].items()]
            lines.append(f"    {var(op['name'])} = op{i}({', '.join(args)})")
        outs = []
        for name, item, shape in self.outputs:
            value = var(name) if item is None else f"{var(name)}[{int(item)}]"
            outs.append(f"{value}.reshape({list(shape)!r}).contiguous()")
        lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        source = "\n".join(lines) + "\n"
        exec(compile(source, f"<kforge aten program {self.region}>", "exec"), scope)
        run = scope["run"]
        run.source = source
        return run


def _literal(a, var) -> str:
    """An argument record (frontend.fxgraph) as Python source."""
    if isinstance(a, dict):
        if "node" in a:
            return var(a["node"])
        if "dtype" in a:
            return f"torch.{_identifier(a['dtype'])}"
        if "device" in a:
            return "device"             # the device the package runs on, not the export's
        if "layout" in a:
            return f"torch.{_identifier(a['layout'])}"
        if "memory_format" in a:
            return f"torch.{_identifier(a['memory_format'])}"
        if "float" in a:
            return f"float({str(a['float'])!r})"
        raise UserError(f"aten program: unknown argument record {a}")
    if isinstance(a, list):
        return "[" + ", ".join(_literal(v, var) for v in a) + "]"
    if a is None or isinstance(a, (bool, int, float, str)):
        return repr(a)
    raise UserError(f"aten program: unknown argument {a!r}")


def _identifier(text: str) -> str:
    if not str(text).isidentifier():
        raise UserError(f"aten program: {text!r} is not a torch attribute name")
    return str(text)


def load_programs(regions_dir: str | Path) -> dict[str, AtenProgram]:
    """The verified aten programs of a package's regions, by region hash ({} if none)."""
    regions_dir = Path(regions_dir)
    summary = regions_dir / SUMMARY
    if not summary.is_file():
        return {}
    try:
        doc = json.loads(summary.read_text())
        return {h: AtenProgram.from_json(json.loads((regions_dir / f"{h}.aten.json").read_text()))
                for h, entry in doc.get("regions", {}).items() if entry.get("program")}
    except (OSError, ValueError, KeyError, UserError) as exc:
        raise UserError(f"{regions_dir}: cannot read the regions' aten programs ({exc}); "
                        "recompile the package") from None


# ---------------------------------------------------------------------------------------------
# Building programs from provenance
# ---------------------------------------------------------------------------------------------
def _numel(shape) -> int:
    return math.prod(shape)


class _Builder:
    def __init__(self, fx: dict, plan: dict, step: dict):
        self.nodes = {n["name"]: n for n in fx["nodes"]}
        # the plan's inputs are the program's inputs in order: not its lifted constants (a
        # decoding step's empty cache tensors), which the frozen import made literals
        self.placeholders = [n["name"] for n in fx["nodes"]
                             if n["kind"] == "placeholder" and n.get("input", True)]
        self.input_names = [i["name"] for i in plan["inputs"]]
        self.step = step
        origin = step["origin"]
        self.region_nodes = set(origin["nodes"])
        self.canon = _value_classes(fx["nodes"])
        # FX value (its class: kforge-opt's CSE merged equal ops) -> the operands carrying it
        self.carriers: dict[str, list[int]] = {}
        for index, (name, node) in enumerate(zip(step["operands"], origin["operands"])):
            if node is None and name in self.input_names:
                k = self.input_names.index(name)
                node = self.placeholders[k] if k < len(self.placeholders) else None
            if node is not None:
                self.carriers.setdefault(self.canon.get(node, node), []).append(index)

    def build(self, shapes: Mapping[str, tuple], dtypes: Mapping[str, str]):
        """All programs consistent with the provenance (alternatives where a tuple's items or
        several operands could be meant), most likely first."""
        step = self.step
        # per result: the candidate (node, item) pairs
        result_choices = []
        for value, node in zip(step["results"], step["origin"]["results"]):
            if node is None or node not in self.nodes:
                raise _NoProgram(f"result {value} has no FX node")
            result_choices.append(self._items(node, shapes[value], dtypes[value]))
        for picks in itertools.islice(itertools.product(*result_choices), _MAX_CHOICES):
            yield from itertools.islice(self._program(picks, shapes, dtypes), _MAX_CHOICES)

    def _items(self, node: str, shape, dtype) -> list:
        meta = self.nodes[node].get("value") or {}
        if "items" in meta:
            out = [(node, i) for i, m in enumerate(meta["items"])
                   if m and m.get("shape") is not None and _numel(m["shape"]) == _numel(shape)
                   and m["dtype"] == _DTYPES.get(dtype)]
        else:
            out = [(node, None)] if meta.get("shape") is not None and \
                _numel(meta["shape"]) == _numel(shape) and meta["dtype"] == _DTYPES.get(dtype) \
                else []
        if not out:
            raise _NoProgram(f"FX node {node} does not have the region result's shape "
                             f"{list(shape)} {dtype}")
        return out

    def _program(self, picks, shapes, dtypes):
        """Backward slice from the picked results; each operand binding alternative once."""
        step = self.step
        operand_shapes = [shapes[v] for v in step["operands"]]
        operand_dtypes = [dtypes[v] for v in step["operands"]]
        order: list[str] = []
        bound: dict[str, list[int]] = {}
        visiting: set[str] = set()
        outside: list[str] = []

        def fits(name: str, index: int) -> bool:
            meta = self.nodes[name].get("value") or {}
            return meta.get("shape") is not None and \
                _numel(meta["shape"]) == _numel(operand_shapes[index]) and \
                meta.get("dtype") == _DTYPES.get(operand_dtypes[index])

        def need(name: str) -> None:
            if name in bound or name in order:
                return
            node = self.nodes.get(name)
            if node is None:
                raise _NoProgram(f"FX node {name} is not in the graph")
            carriers = [i for i in self.carriers.get(self.canon[name], []) if fits(name, i)]
            if node["kind"] == "call_function" and node.get("op") == "getitem":
                src = self.canon[node["args"][0]["node"]]
                carriers += [i for i in self.carriers.get(src, []) if fits(name, i)]
            if carriers:
                bound[name] = carriers
                return
            if node["kind"] != "call_function":
                raise _NoProgram(f"{name} ({node['kind']}) is not among the region's operands")
            if node.get("op") is None:
                raise _NoProgram(f"{name} cannot run as an aten op ({node.get('why')})")
            short = node["op"].split(".")[1] if node["op"] != "getitem" else "getitem"
            if name not in self.region_nodes and short not in _CHEAP and short != "getitem":
                # an op torch-mlir folded away (x * 1.0) or whose location CSE gave to another
                # node: recomputed here, but never a whole stretch of the graph
                outside.append(name)
                if len(outside) > max(4, len(self.region_nodes) // 2):
                    raise _NoProgram(f"{', '.join(outside[:6])} ... lie outside the region")
            if name in visiting:
                raise _NoProgram(f"cycle at {name}")
            visiting.add(name)
            for ref in _refs(node["args"]) + _refs(list(node["kwargs"].values())):
                need(ref)
            visiting.discard(name)
            order.append(name)
            if len(order) > 4 * len(self.region_nodes) + 16:
                raise _NoProgram("the slice grows far beyond the region")

        for node, _ in picks:
            need(node)
        names = list(bound)
        for choice in itertools.product(*(bound[n] for n in names)):
            inputs = tuple((n, i, tuple(self.nodes[n]["value"]["shape"]))
                           for n, i in zip(names, choice))
            ops = tuple({"name": n, "op": self.nodes[n]["op"], "args": self.nodes[n]["args"],
                         "kwargs": self.nodes[n]["kwargs"]} for n in order)
            outputs = tuple((node, item, tuple(shapes[v]))
                            for (node, item), v in zip(picks, step["results"]))
            yield AtenProgram(step["call"], inputs, ops, outputs)


def _value_classes(nodes: list[dict]) -> dict[str, str]:
    """Each FX value's representative among the values equal to it by construction (the same
    op of the same arguments), as CSE in the compiler merges them."""
    canon: dict[str, str] = {}
    seen: dict[str, str] = {}

    def rename(a):
        if isinstance(a, dict) and "node" in a:
            return {"node": canon.get(a["node"], a["node"])}
        if isinstance(a, list):
            return [rename(v) for v in a]
        return a

    for n in nodes:
        canon[n["name"]] = n["name"]
        if n["kind"] != "call_function" or not n.get("op"):
            continue
        key = json.dumps([n["op"], rename(n["args"]), rename(n["kwargs"])], sort_keys=True)
        canon[n["name"]] = seen.setdefault(key, n["name"])
    return canon


def _refs(args) -> list[str]:
    out = []
    for a in args:
        if isinstance(a, dict) and "node" in a:
            out.append(a["node"])
        elif isinstance(a, list):
            out.extend(_refs(a))
    return out


def _close(got: torch.Tensor, want: torch.Tensor, narrow: torch.dtype | None = None) -> bool:
    """`got` is the same math as `want`. `narrow`: the region's own 16-bit type, whose
    roundings its results carry (also a result it widens at the end)."""
    if got.shape != want.shape:
        return False
    if not want.dtype.is_floating_point:
        return bool(torch.equal(got.to(want.dtype), want))
    g, w = got.double(), want.double()
    nan = torch.isnan(w)
    if not torch.equal(nan, torch.isnan(g)):
        return False
    g, w = g[~nan], w[~nan]
    if not w.numel():
        return True
    finite = torch.isfinite(w)
    if not torch.equal(finite, torch.isfinite(g)) or not torch.equal(g[~finite], w[~finite]):
        return False
    g, w = g[finite], w[finite]
    rms = float(w.pow(2).mean().sqrt()) if w.numel() else 0.0
    # PyTorch's ops against the linalg form: same math, another summation order (and torch-mlir
    # sometimes computes statistics in f64); far below any policy's tolerance, far above noise.
    # A 16-bit result holds its roundings: another summation order moves an intermediate
    # rounding (a product's bf16 result before its activation) by a unit at a tie, and the
    # result by about as much, so the bound is a few units of its last place (H100,
    # 2026-12-07: cuBLAS's bf16 Linear + SiLU against the linalg form, the aten program was
    # dropped and the region ran its reference, 24x slower). A wrong program is off by the
    # values themselves.
    narrow = narrow if narrow is not None else want.dtype
    if narrow in NARROW_DTYPES:
        eps = eps_of(narrow)            # the spacing of its values at 1
        return bool(((g - w).abs() <= 2 * eps * (max(1.0, rms) + w.abs())).all())
    return bool(((g - w).abs() <= 1e-5 * max(1.0, rms) + 1e-4 * w.abs()).all())



def check_program(program: AtenProgram, spec, seeds: Sequence[int] = _CHECK_SEEDS) -> str:
    """'' if the program computes the region's reference on random inputs, else why not."""
    from kforge.reference import reference_fn
    from kforge.verify.inputs import make_inputs, signature_of
    from kforge.verify.verifier import narrow_dtype
    sig = signature_of(spec)
    narrow = narrow_dtype(sig.args)
    run = program.callable()
    ref = reference_fn(spec)
    for seed in seeds:
        args = make_inputs(sig, seed, dynamic_size=2)
        try:
            with torch.no_grad():
                want = ref(*args)
                got = run(*args)
        except Exception as exc:  # noqa: BLE001 - any failure of a candidate program
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if len(got) != len(want):
            return f"{len(got)} results, the region has {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            if not _close(g, w, narrow):
                return f"result {i} differs from the region's reference (seed {seed})"
    return ""


def build_programs(regions_dir: str | Path, fx_graph_path: str | Path,
                   specs: Mapping | None = None) -> dict:
    """Writes `regions/<hash>.aten.json` for every region whose aten program checks out, and
    `regions/aten.json` (per region: program or why not). Run on the host plan as kforge-opt
    wrote it (before kforge.kernel_fallbacks rewrites it). Returns the summary."""
    from kforge.spec import load_spec
    regions_dir = Path(regions_dir)
    plan = json.loads((regions_dir / "host_plan.json").read_text())
    fx_graph_path = Path(fx_graph_path)
    fx = json.loads(fx_graph_path.read_text()) if fx_graph_path.is_file() else None
    shapes, dtypes = _value_types(plan)
    summary: dict[str, dict] = {}
    for step in plan.get("steps", []):
        h = step.get("call")
        if h is None or summary.get(h, {}).get("program"):
            continue
        entry = summary.setdefault(h, {"program": False, "why": []})
        if fx is None:
            entry["why"].append("no FX graph (model.fx.json)")
            continue
        if "origin" not in step:
            entry["why"].append("the host plan has no provenance (kforge-opt too old?)")
            continue
        spec = specs[h] if specs is not None and h in specs else \
            load_spec(regions_dir / f"{h}.json")
        why = _first_program(regions_dir, fx, plan, step, spec, shapes, dtypes)
        if why.startswith(_DEFERRED):
            summary[h] = {"program": True, "checked": False, "why": why}
        elif why:
            entry["why"].append(why)
        else:
            summary[h] = {"program": True}
    for entry in summary.values():
        if not entry.get("program"):
            entry["why"] = "; ".join(dict.fromkeys(entry["why"]))[:600]
    doc = {"schema": "kforge.aten-programs", "version": 1, "regions": summary}
    atomic_write_text(regions_dir / SUMMARY, json.dumps(doc, indent=2))
    return doc


_DEFERRED = "not checked when compiling"


def _first_program(regions_dir, fx, plan, step, spec, shapes, dtypes) -> str:
    try:
        candidates = _Builder(fx, plan, step).build(shapes, dtypes)
        last = "no consistent program"
        gflop = float(getattr(spec, "flops", 0) or 0) / 1e9
        budget = check_budget_gflop()
        if gflop > budget:
            program = next(iter(candidates), None)
            if program is None:
                return last
            program = AtenProgram(program.region, program.inputs, program.ops, program.outputs,
                                  checked=False)
            atomic_write_text(regions_dir / f"{step['call']}.aten.json",
                              json.dumps(program.to_json()))
            return (f"{_DEFERRED}: {gflop:.0f} GFLOP is over KFORGE_ATEN_CHECK_GFLOP={budget:g}; "
                    "checked against the reference at its first run")
        for program in candidates:
            why = check_program(program, spec)
            if not why:
                atomic_write_text(regions_dir / f"{step['call']}.aten.json",
                                  json.dumps(program.to_json()))
                return ""
            last = why
        return last
    except _NoProgram as exc:
        return str(exc)


def _value_types(plan: dict) -> tuple[dict, dict]:
    """Shape and dtype of every named value of the plan (inputs and step results)."""
    shapes, dtypes = {}, {}
    for rec in plan.get("inputs", []):
        shapes[rec["name"]], dtypes[rec["name"]] = tuple(rec["shape"]), rec["dtype"]
    values = plan.get("values", {})
    items = values.items() if isinstance(values, dict) else \
        ((v["name"], v) for v in values)
    for name, rec in items:
        shapes[name], dtypes[name] = tuple(rec["shape"]), rec["dtype"]
    return shapes, dtypes


class FirstUseCheck:
    """An unchecked program (`checked` False): its first call also runs the region's reference
    on the same operands and compares them (`_close`); the program is kept if they agree, else
    the reference is used from then on, after one warning."""

    def __init__(self, program, reference, region: str, narrow: torch.dtype | None = None):
        self.program, self.reference, self.region = program, reference, region
        self.narrow = narrow            # the region's own 16-bit type (_close)
        self.state = "unchecked"        # unchecked | program | reference
        self.note = ""

    def __call__(self, *args):
        if self.state == "program":
            return self.program(*args)
        if self.state == "reference":
            return self.reference(*args)
        want = tuple(self.reference(*args))
        try:
            got = tuple(self.program(*args))
            why = "" if len(got) == len(want) and all(_close(g, w, self.narrow) for g, w in zip(got, want)) \
                else "its results differ from the reference's"
        except Exception as exc:  # noqa: BLE001 - any failure of the unchecked program
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        if why:
            import warnings
            self.state, self.note = "reference", f"aten program of region {self.region} " \
                f"dropped at its first run ({why}); the region runs its reference"
            warnings.warn(self.note, RuntimeWarning, stacklevel=2)
        else:
            self.state = "program"
        return want


__all__ = ["AtenProgram", "FirstUseCheck", "build_programs", "check_program", "load_programs"]
