"""`torch.compile(model, backend="kforge")`: KForge as a TorchDynamo backend.

    import torch
    fast = torch.compile(model, backend="kforge",
                         options={"precision": "tf32", "provider": "builtin"})
    y = fast(x)

Dynamo hands the backend one FX graph per piece of the model it captured (several where the
model has graph breaks). Each graph is compiled like `kforge.compile` compiles a module: the
frontend, `kforge-opt`, verified Triton kernels from the kernel cache or the provider; the
package goes to `<kernel cache>/packages/dynamo-<name>-<key>`, keyed by a hash of the graph's
code, its input shapes and dtypes, the options and KForge's own code, so a second run (another
process too) loads it instead of compiling again.

* Options: `torch.compile(..., options={...})` reaches the backend as one keyword argument,
  `options=`; keyword arguments given directly (`functools.partial(kforge_backend, ...)`) work
  too. Keys: those of `kforge.compile` (`target`, `provider`, `precision`, `rounds`,
  `time_budget`, `cache_dir`, `cache_mode`, `provider_options`, `progress`), plus `fallback`
  ("eager" (default): a graph KForge cannot compile runs eagerly, with one warning; "raise":
  the error propagates), `max_specializations` (signatures compiled per dynamic graph, 8) and
  `check` (True: before a package is used, it runs once on the example inputs against the
  graph in eager PyTorch, within 10x the policy's tolerance). `target` defaults to the device
  of the graph's inputs.
* Weights: dynamo passes a module's parameters and buffers as graph inputs; those inputs are
  KForge weights (`kforge.weight` arguments; `prepare_weights` runs once per distinct weight
  tensor), bound to the live tensors at every call, so the package follows the module.
* Dynamic shapes: a graph dynamo made dynamic (SymInt inputs, symbolic sizes) is compiled once
  per concrete signature at its first call with it, up to `max_specializations`; other
  signatures then run eagerly.
* Inference only: outputs carry no autograd history (a warning says so once per process when
  a graph is compiled with gradients enabled on inputs that require them).

`records` lists every graph this process handed to the backend (`GraphRecord`: status
"kforge", "eager" (fallback, with the reason), "empty" (nothing to compute) or "pending");
`reset_records()` clears it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
import os
import re
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch


def _interpreter_if_no_gpu() -> None:
    """Triton runs on a machine without a GPU only in its interpreter, which must be chosen
    before triton is first imported; torch._dynamo (imported below) imports triton."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    try:
        gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    except Exception:  # noqa: BLE001 - a broken driver means no GPU here
        gpu = False
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"


_interpreter_if_no_gpu()

import torch._dynamo  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

from kforge.errors import UserError  # noqa: E402

BACKEND_NAME = "kforge"
DEFAULTS: dict[str, Any] = {
    "target": None, "provider": "builtin", "precision": "strict", "rounds": 2,
    "time_budget": None, "cache_dir": None, "cache_mode": "use", "provider_options": None,
    "progress": False, "fallback": "eager", "max_specializations": 8, "check": True,
}
PACKAGE_MARKER = "dynamo.json"


class KForgeFallbackWarning(UserWarning):
    """A graph (or a call of it) runs eagerly because KForge could not compile or run it."""


@dataclasses.dataclass
class GraphRecord:
    index: int                      # 1, 2, ... in the order dynamo handed graphs over
    name: str                       # for messages: "graph 2 (forward at model.py:14)"
    ops: int                        # call nodes in the graph
    status: str                     # kforge | eager | empty | pending
    reason: str = ""                # why it runs eagerly
    packages: list = dataclasses.field(default_factory=list)   # Path per compiled signature
    reused: int = 0                 # packages loaded from the cache instead of compiled
    regions: int = 0                # fusion regions, summed over packages
    kernels: int = 0                # regions on a verified kernel, summed over packages
    options: dict = dataclasses.field(default_factory=dict)
    file: str = ""                  # the user's source file and line the graph starts at
    line: int = 0


records: list[GraphRecord] = []
_lock = threading.Lock()
_grad_warned = False


def reset_records() -> None:
    """Forget the graphs recorded so far (numbering starts again at 1)."""
    with _lock:
        records.clear()


def kforge_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   options: dict | None = None, **kwargs) -> Callable:
    """The dynamo backend: returns a callable for `gm` that runs KForge's package for it (or,
    where KForge cannot compile it, `gm.forward`, after one KForgeFallbackWarning)."""
    kwargs.pop("mode", None)          # torch.compile(mode=...) means nothing to KForge
    opts = _resolve_options({**(options or {}), **kwargs})
    record = _new_record(gm, opts)
    if not any(_computes(n) for n in _call_nodes(gm)):
        record.status = "empty"
        return gm.forward
    try:
        plan = _GraphPlan(gm, example_inputs, record)
    except _Unsupported as exc:
        return _fallback(gm, record, opts, str(exc))
    if plan.dynamic:
        record.status = "pending"
        return _LazyGraph(gm, plan, record, opts)
    runner = _compile_signature(gm, plan, record, opts, list(example_inputs))
    return runner if runner is not None else gm.forward


# ---------------------------------------------------------------------------------------------
# options and records

def _resolve_options(given: dict) -> dict:
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise UserError(f"kforge backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(DEFAULTS)}")
    opts = {**DEFAULTS, **given}
    from kforge.cache import MODES
    from kforge.commands import PRECISIONS, PROVIDERS, TARGETS
    for key, allowed in (("target", TARGETS + (None,)), ("provider", PROVIDERS),
                         ("precision", PRECISIONS), ("cache_mode", MODES),
                         ("fallback", ("eager", "raise"))):
        if opts[key] not in allowed:
            raise UserError(f"kforge backend: option {key}={opts[key]!r}; expected one of "
                            f"{', '.join(repr(a) for a in allowed if a is not None)}")
    if not isinstance(opts["max_specializations"], int) or opts["max_specializations"] < 1:
        raise UserError("kforge backend: option max_specializations must be an integer >= 1")
    return opts


def _call_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


# Ops that compute nothing (views, sizes, indexing into tuples): a graph of these alone is
# "empty" and runs as it is.
_NO_COMPUTE_METHODS = {"view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute",
                       "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "expand_as",
                       "contiguous", "size", "dim", "narrow", "select", "split", "chunk",
                       "unbind", "detach", "numel", "stride", "__getitem__"}
_NO_COMPUTE_FUNCTIONS = {operator.getitem, torch.reshape, torch.flatten, torch.t,
                         torch.transpose, torch.permute, torch.squeeze, torch.unsqueeze,
                         torch.narrow, torch.select, torch.split, torch.chunk, torch.unbind,
                         torch.detach}


def _computes(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target not in _NO_COMPUTE_METHODS
    if node.op == "call_function":
        return node.target not in _NO_COMPUTE_FUNCTIONS
    return True


def _frame(nodes: list[torch.fx.Node]) -> tuple[str, str, int]:
    """(`forward at model.py:14`, file, line): the user's line the graph's first op comes
    from; for a graph of library modules alone (no user frame), the outermost module's class."""
    for node in nodes:
        trace = node.meta.get("stack_trace") or ""
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
        if frames:
            path, line, fn = frames[-1]
            resumed = re.fullmatch(r"torch_dynamo_resume_in_(\w+)_at_(\d+)", fn)
            if resumed:       # the code after a graph break
                return (f"{resumed.group(1)} at {Path(path).name}:{line}, after the graph "
                        f"break at line {resumed.group(2)}", path, int(line))
            return f"{fn} at {Path(path).name}:{line}", path, int(line)
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or {}
        for _path, cls in stack.values():
            return getattr(cls, "__qualname__", str(cls)), "", 0
    return "", "", 0


def _where(nodes: list[torch.fx.Node]) -> str:
    return _frame(nodes)[0]


def _new_record(gm: torch.fx.GraphModule, opts: dict) -> GraphRecord:
    nodes = _call_nodes(gm)
    where, file, line = _frame(nodes)
    with _lock:
        index = len(records) + 1
        name = f"graph {index}" + (f" ({where})" if where else "")
        record = GraphRecord(index=index, name=name, ops=len(nodes), status="pending",
                             file=file, line=line,
                             options={k: v for k, v in opts.items() if k != "provider_options"})
        records.append(record)
    return record


def _warn(record: GraphRecord, message: str) -> None:
    """One KForgeFallbackWarning, shown at the user's line the graph starts at where known."""
    if record.file:
        warnings.warn_explicit(message, KForgeFallbackWarning, record.file, record.line,
                               module=Path(record.file).stem)
    else:
        warnings.warn(message, KForgeFallbackWarning, stacklevel=3)


def _fallback(gm, record: GraphRecord, opts: dict, reason: str) -> Callable:
    reason = _clip(reason)
    if opts["fallback"] == "raise":
        raise UserError(f"kforge backend: {record.name}: {reason}")
    record.status, record.reason = "eager", reason
    _warn(record, f"kforge: {record.name} runs eagerly (PyTorch), not through KForge: {reason}")
    return gm.forward


def _clip(text: str, lines: int = 6, chars: int = 900) -> str:
    text = str(text).strip() or "(no message)"
    kept = text.splitlines()[:lines]
    out = "\n".join(kept)
    if len(out) > chars:
        out = out[:chars] + " ..."
    elif len(kept) < len(text.splitlines()):
        out += " ..."
    return out


# ---------------------------------------------------------------------------------------------
# what a graph's inputs and outputs are

class _Unsupported(Exception):
    """The graph is outside what this backend hands to KForge (the reason is the message)."""


_SOURCE_PART = re.compile(r"\._(?:modules|parameters|buffers)\['([^']+)'\]")


def _is_symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in value.shape)
    return False


class _GraphPlan:
    """The roles of a graph's inputs (user input, weight, non-tensor value) and how to rebuild
    its outputs from the tensors the package computes."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 record: GraphRecord):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs):
            raise _Unsupported(f"{len(placeholders)} graph inputs but {len(example_inputs)} "
                               "example inputs")
        self.num_args = len(placeholders)
        self.inputs: list[int] = []                 # tensor args that are user inputs
        self.weights: list[tuple[int, str]] = []    # (arg index, weight path like fc1.weight)
        self.values: list[int] = []                 # non-tensor args (baked per signature)
        self.dynamic = False
        used: set[str] = set()
        for i, (node, ex) in enumerate(zip(placeholders, example_inputs)):
            meta = node.meta.get("example_value", ex)
            if _is_symbolic(meta) or _is_symbolic(ex):
                self.dynamic = True
            if isinstance(ex, torch.Tensor):
                name = _weight_name(node, ex, used)
                if name is None:
                    self.inputs.append(i)
                else:
                    used.add(name)
                    self.weights.append((i, name))
            elif isinstance(ex, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
                self.values.append(i)
                self.dynamic = True
            else:
                raise _Unsupported(f"graph input {node.name} is a {type(ex).__name__}, not a "
                                   "tensor or a number")
        if not self.inputs:      # the frontend needs a user input: weights become inputs
            self.inputs = sorted(i for i, _ in self.weights)
            self.weights = []
        if not self.inputs:
            raise _Unsupported("the graph has no tensor inputs")
        mutation = _input_mutation(gm, placeholders)
        if mutation:
            raise _Unsupported(f"it writes to an input, a parameter or a buffer in place "
                               f"({mutation}); KForge compiles functional graphs only")
        # outputs: leaves of the returned structure are graph inputs passed through, tensors
        # the graph computes (the package's results, each once), or constants
        index = {n: i for i, n in enumerate(placeholders)}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        leaves, self.out_spec = pytree.tree_flatten(output.args[0])
        self.out_leaves: list[tuple[str, Any]] = []
        self.computed: list[int] = []               # leaf positions the wrapper returns
        position: dict[torch.fx.Node, int] = {}
        for k, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.fx.Node):
                self.out_leaves.append(("const", leaf))
            elif leaf in index:
                self.out_leaves.append(("arg", index[leaf]))
            else:
                value = leaf.meta.get("example_value")
                if not isinstance(value, torch.Tensor):
                    raise _Unsupported(f"the graph returns a non-tensor value ({leaf.name}: "
                                       f"{type(value).__name__})")
                if leaf not in position:
                    position[leaf] = len(self.computed)
                    self.computed.append(k)
                self.out_leaves.append(("out", position[leaf]))
        if not self.computed:
            raise _Unsupported("the graph computes no tensor it returns")


_INPLACE_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul,
                      operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow,
                      operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul}
_INPLACE_DUNDERS = {f"__{op}__" for op in ("setitem", "iadd", "isub", "imul", "itruediv",
                                           "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
                                           "ilshift", "irshift", "imatmul")}
_NOT_WRITES = {"requires_grad_", "retain_grad", "share_memory_"}


def _writes_in_place(node: torch.fx.Node) -> list:
    """The arguments `node` writes to (empty: none)."""
    written = []
    if node.op == "call_method":
        name = str(node.target)
        if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_") and
                                        name not in _NOT_WRITES):
            written.append(node.args[0] if node.args else None)
    elif node.op == "call_function":
        target = node.target
        name = getattr(target, "__name__", "")
        schema = getattr(target, "_schema", None)
        if target in _INPLACE_FUNCTIONS or (schema is not None and schema.is_mutable) or \
                (name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES) \
                or node.kwargs.get("inplace") is True:
            written.append(node.args[0] if node.args else None)
        elif name == "batch_norm":      # in training mode it updates the running statistics
            stats = 1 if target is torch.nn.functional.batch_norm else 3
            running = node.kwargs.get("running_mean",
                                      node.args[stats] if len(node.args) > stats else None)
            training = node.kwargs.get("training", node.args[5] if len(node.args) > 5 else False)
            if running is not None and training is not False:
                written.append(running)
    elif node.op == "call_module" and getattr(node.graph.owning_module.get_submodule(
            node.target), "inplace", False) is True:
        written.append(node.args[0] if node.args else None)
    if "out" in node.kwargs:
        written.append(node.kwargs["out"])
    return written


def _input_mutation(gm: torch.fx.GraphModule, placeholders: list) -> str:
    """`add_ at line 12` for the first op that writes in place to a graph input (or a view of
    one: found by storage, from dynamo's fake example values); "" if there is none. Writes to
    the graph's own intermediates are left to the frontend (torch.export functionalizes them)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage(value):
        if isinstance(value, torch.Tensor):
            try:
                return StorageWeakRef(value.untyped_storage())
            except Exception:  # noqa: BLE001 - no storage to compare: treated as an input
                return None
        return None

    inputs = {storage(n.meta.get("example_value")) for n in placeholders} - {None}
    for node in gm.graph.nodes:
        for arg in _writes_in_place(node):
            leaves = pytree.tree_leaves(arg)
            refs = [storage(a.meta.get("example_value")) if isinstance(a, torch.fx.Node)
                    else None for a in leaves] or [None]
            if any(r is None or r in inputs for r in refs):
                line = _where([node])
                return f"{node.target}" + (f" in {line}" if line else "")
    return ""


def _weight_name(node: torch.fx.Node, example: torch.Tensor, used: set[str]) -> str | None:
    """`fc1.weight` for a module's parameter or buffer passed as a graph input, else None."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    try:
        text = source.name if isinstance(getattr(source, "name", None), str) else source.name()
    except Exception:  # noqa: BLE001 - no source: judge by the tensor alone
        text = ""
    is_weight = isinstance(example, torch.nn.Parameter) or "._parameters[" in text or \
        "._buffers[" in text
    if not is_weight:
        return None
    parts = _SOURCE_PART.findall(text)
    name = ".".join(parts)
    if not parts or name in used or any(
            not (p.isidentifier() or p.isdigit()) or hasattr(torch.nn.Module, p) or
            p == "_kforge_graph" for p in parts):
        name = node.name            # the placeholder's name: an identifier, unique
    return name


class _GraphWithWeights(torch.nn.Module):
    """forward(*user inputs) == the graph's computed outputs, with the graph's weight inputs as
    this module's buffers (so KForge's frontend makes them `kforge.weight` arguments) and its
    non-tensor inputs fixed to one signature's values."""

    def __init__(self, gm: torch.fx.GraphModule, plan: _GraphPlan, args: Sequence[Any]):
        super().__init__()
        self._kforge_graph = gm
        self._plan = plan
        self._values = {i: _concrete(args[i]) for i in plan.values}
        for i, name in plan.weights:
            *path, leaf = name.split(".")
            owner: torch.nn.Module = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_buffer(leaf, args[i].detach())

    def forward(self, *inputs):
        plan = self._plan
        args: list[Any] = [None] * plan.num_args
        for i, t in zip(plan.inputs, inputs):
            args[i] = t
        for i, name in plan.weights:
            args[i] = self.get_buffer(name)
        for i, v in self._values.items():
            args[i] = v
        leaves = pytree.tree_leaves(self._kforge_graph(*args))
        return tuple(leaves[k] for k in plan.computed)


def _concrete(value):
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


# ---------------------------------------------------------------------------------------------
# compiling one signature

class _Runner:
    """Calls a loaded package with a graph's arguments; rebuilds the graph's outputs."""

    def __init__(self, gm, plan: _GraphPlan, record: GraphRecord, compiled):
        self.gm, self.plan, self.record, self.compiled = gm, plan, record, compiled
        names = {name: i for i, name in plan.weights}
        self.fixed = {}          # weights that are not graph inputs (the graph's own tensors)
        self.bound = []          # (package weight name, arg index)
        for a in compiled.package.plan.inputs:
            if a.weight is None:
                continue
            if a.weight in names:
                self.bound.append((a.weight, names[a.weight]))
            else:
                self.fixed[a.weight] = compiled.weights[a.weight]
        self.failed = False

    def run_package(self, *args):
        """The graph's outputs computed by the package (raises where the package fails)."""
        plan = self.plan
        weights = dict(self.fixed)
        for name, i in self.bound:
            t = args[i].detach()
            weights[name] = t if t.is_contiguous() else t.contiguous()
        self.compiled.weights = weights
        inputs = [args[i].contiguous() for i in plan.inputs]
        with torch.no_grad():
            outs = self.compiled(*inputs)
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        leaves = []
        for kind, v in plan.out_leaves:
            leaves.append(outs[v] if kind == "out" else args[v] if kind == "arg" else v)
        return pytree.tree_unflatten(leaves, plan.out_spec)

    def __call__(self, *args):
        if self.failed:
            return self.gm.forward(*args)
        try:
            return self.run_package(*args)
        except Exception as exc:  # noqa: BLE001 - the user's model must still run
            self.failed = True
            self.record.status = "eager"
            self.record.reason = f"the compiled package failed at run time: " \
                                 f"{type(exc).__name__}: {_clip(exc, 3)}"
            _warn(self.record, f"kforge: {self.record.name} runs eagerly from now on: "
                               f"{self.record.reason}")
            return self.gm.forward(*args)


def _compile_signature(gm, plan: _GraphPlan, record: GraphRecord, opts: dict,
                       args: list) -> _Runner | None:
    """Compile (or load from the cache) the package for one concrete signature of `gm`.
    Returns None where the graph runs eagerly (after the warning, or for an empty package)."""
    _warn_grad_once(args)
    try:
        runner = _outside_dynamo(_build, gm, plan, record, opts, args)
    except UserError as exc:
        _fallback(gm, record, opts, str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - any failure of the toolchain: the model still runs
        _fallback(gm, record, opts, f"{type(exc).__name__}: {exc}")
        return None
    if runner is None:
        if record.status != "kforge":
            record.status = "empty"
        return None
    record.status = "kforge"
    return runner


def _outside_dynamo(fn, *args):
    """Run `fn` in a thread of its own: dynamo's thread-local state while it calls a backend
    (its tracing context and fake mode: torch.load would make meta tensors) stays out of it."""
    result: list = []
    error: list = []

    def work():
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=work, name="kforge-dynamo-compile", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _build(gm, plan: _GraphPlan, record: GraphRecord, opts: dict, args: list):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    devices = sorted({t.device.type for t in tensors})
    if len(devices) != 1:
        raise UserError(f"the graph's tensors are on several devices ({', '.join(devices)})")
    target = opts["target"] or devices[0]
    from kforge.commands import TARGETS
    if target not in TARGETS:
        raise UserError(f"its tensors are on {devices[0]}, which KForge has no target for "
                        f"(targets: {', '.join(TARGETS)})")
    from kforge.targets import get_target
    if get_target(target).device != devices[0]:
        raise UserError(f"target {target!r}, but the graph's tensors are on {devices[0]}")
    if target == "cpu":
        _require_interpreter()
    from kforge.cache import default_root
    key = _cache_key(gm, plan, opts, args, target)
    root = Path(opts["cache_dir"] or default_root())
    pkg = root / "packages" / f"dynamo-{_slug(record.name)}-{key[:16]}"
    wrapper = _GraphWithWeights(gm, plan, args)
    compiled = None
    if opts["cache_mode"] in ("use", "only"):
        compiled = _load_existing(pkg, key, wrapper, target)
    if compiled is not None:
        record.reused += 1
    else:
        try:
            compiled = _compile_package(pkg, key, wrapper, plan, args, opts, target)
        except UserError as exc:       # the frontend names the wrapper; the record names more
            raise UserError(_strip_origin(str(exc), wrapper)) from None
    record.packages.append(pkg)
    regions, kernels = len(compiled.regions), len(compiled.kernels)
    record.regions += regions
    record.kernels += kernels
    if regions == 0:
        return None
    runner = _Runner(gm, plan, record, compiled)
    if opts["check"]:
        problem = _check_against_eager(gm, runner, args, opts["precision"])
        if problem:
            raise UserError(f"its package {pkg.name} {problem}")
    return runner


def _strip_origin(message: str, wrapper) -> str:
    for origin in (repr(wrapper), type(wrapper).__name__):
        if message.startswith(origin + ": "):
            return message[len(origin) + 2:]
    return message


def _check_against_eager(gm, runner: "_Runner", args: list, precision: str) -> str | None:
    """Run the package and the graph (eagerly) on the example inputs; what is wrong, or None.
    A safety net for a whole program the frontend or the host plan got wrong, so the bound is
    loose (10x the policy's tolerance): region kernels are verified one by one, separately."""
    from kforge.verify.policy import get_policy
    policy = get_policy(precision)
    cuda = sorted({a.device.index or 0 for a in args
                   if isinstance(a, torch.Tensor) and a.device.type == "cuda"})
    with torch.no_grad(), torch.random.fork_rng(devices=cuda):
        want = pytree.tree_leaves(gm.forward(*args))
    try:
        got = pytree.tree_leaves(runner.run_package(*args))
    except Exception as exc:  # noqa: BLE001 - reported as the reason to run eagerly
        return f"fails on the example inputs: {type(exc).__name__}: {_clip(exc, 3)}"
    if len(got) != len(want):
        return f"returns {len(got)} values, the graph {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            what = (f"{list(g.shape)} {g.dtype}" if isinstance(g, torch.Tensor)
                    else type(g).__name__)
            return f"returns {what} for output {k}; the graph returns {list(w.shape)} {w.dtype}"
        if not w.is_floating_point():
            if not torch.equal(g.cpu(), w.cpu()):
                return f"differs from eager PyTorch on output {k} (integer values)"
            continue
        gd, wd = g.detach().double().cpu(), w.detach().double().cpu()
        finite = torch.isfinite(wd)
        scale = max(1.0, float(wd[finite].pow(2).mean().sqrt())) if finite.any() else 1.0
        err = (gd - wd).abs()
        bound = 10 * (policy.atol * scale + policy.rtol * wd.abs())
        bad = torch.where(finite, ~(err <= bound), ~((gd == wd) | (gd.isnan() & wd.isnan())))
        if bad.any():
            worst = float(err[finite].max()) if finite.any() else float("nan")
            return (f"differs from eager PyTorch on the example inputs: output {k}, "
                    f"{int(bad.sum())} of {bad.numel()} elements beyond 10x the {policy.name} "
                    f"tolerance (max abs error {worst:.3g})")
    return None


def _require_interpreter() -> None:
    from kforge.runtime import use_interpreter
    try:
        use_interpreter(True)
    except UserError:
        raise UserError("the cpu target runs kernels in the Triton interpreter, which must be on "
                        "before triton is imported, and torch._dynamo imported triton first: set "
                        "TRITON_INTERPRET=1 in the environment, or `import kforge.dynamo` "
                        "before torch.compile runs") from None


def _warn_grad_once(args) -> None:
    global _grad_warned
    if _grad_warned or not torch.is_grad_enabled():
        return
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        _grad_warned = True
        warnings.warn("kforge: the backend compiles for inference: outputs of KForge-compiled "
                      "graphs carry no gradients (run the model under torch.no_grad() or "
                      "torch.inference_mode(); this warning is shown once)", UserWarning,
                      stacklevel=3)


def _slug(name: str) -> str:
    m = re.search(r"\((\w+) at ([\w.-]+?)(?:\.py)?:(\d+)", name)
    text = f"{m.group(2)}-{m.group(1)}-{m.group(3)}" if m else "graph"
    return re.sub(r"[^\w.-]", "_", text)[:60]


def _load_existing(pkg: Path, key: str, wrapper, target: str):
    marker = pkg / PACKAGE_MARKER
    try:
        if json.loads(marker.read_text()).get("key") != key:
            return None
    except (OSError, ValueError):
        return None
    from kforge.runtime import load_package
    try:
        return load_package(pkg, module=wrapper, target=target)
    except Exception:  # noqa: BLE001 - a damaged package is compiled again
        return None


def _compile_package(pkg: Path, key: str, wrapper, plan: _GraphPlan, args: list, opts: dict,
                     target: str):
    """kforge.compile into a fresh directory beside `pkg`, then moved into place, so that an
    interrupted compile or a concurrent process never leaves a half package under the key."""
    from kforge import api
    from kforge.runtime import load_package
    pkg.parent.mkdir(parents=True, exist_ok=True)
    tmp = pkg.with_name(f"{pkg.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    inputs = [args[i].detach().contiguous() for i in plan.inputs]
    try:
        api.compile(wrapper, inputs, target=target, provider=opts["provider"],
                    precision=opts["precision"], out=tmp, cache_mode=opts["cache_mode"],
                    cache_dir=opts["cache_dir"], rounds=opts["rounds"],
                    time_budget=opts["time_budget"], provider_options=opts["provider_options"],
                    progress=opts["progress"])
        (tmp / PACKAGE_MARKER).write_text(json.dumps({
            "schema": "kforge.dynamo-graph", "key": key,
            "inputs": [list(args[i].shape) for i in plan.inputs],
            "weights": [name for _, name in plan.weights],
            "code": wrapper._kforge_graph.code}, indent=2))
        _name_in_report(tmp, pkg)
        if pkg.exists():
            shutil.rmtree(pkg, ignore_errors=True)
        try:
            os.replace(tmp, pkg)
        except OSError:
            if not (pkg / PACKAGE_MARKER).is_file():   # no concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_package(pkg, module=wrapper, target=target)


def _name_in_report(tmp: Path, pkg: Path) -> None:
    """The report names the package where it will lie, not the directory it was built in."""
    from kforge.cache import atomic_write_text
    from kforge.package import report_markdown
    path = tmp / "report.json"
    if not path.is_file():
        return
    doc = json.loads(path.read_text())
    doc["package"] = str(pkg)
    atomic_write_text(path, json.dumps(doc, indent=2))
    atomic_write_text(tmp / "report.md", report_markdown(doc))


def _cache_key(gm, plan: _GraphPlan, opts: dict, args: list, target: str) -> str:
    from kforge import __version__
    h = hashlib.sha256()

    def put(obj) -> None:
        h.update(json.dumps(obj, sort_keys=True, default=str).encode())
        h.update(b"\0")

    for name, mod in gm.named_modules():
        if isinstance(mod, torch.fx.GraphModule):
            put([name, mod.code])
    for node in gm.graph.nodes:        # tensors held by the graph itself: their values count
        if node.op == "get_attr":
            value = _getattr_path(gm, node.target)
            if isinstance(value, torch.Tensor):
                data = value.detach().cpu().contiguous()
                put([node.target, list(data.shape), str(data.dtype),
                     hashlib.sha256(data.reshape(-1).view(torch.uint8).numpy().tobytes()
                                    if data.numel() else b"").hexdigest()])
    put([["input", i, list(args[i].shape), str(args[i].dtype)] for i in plan.inputs])
    put([["weight", i, n, list(args[i].shape), str(args[i].dtype)] for i, n in plan.weights])
    put([["value", i, repr(_concrete(args[i]))] for i in plan.values])
    provider_options = {k: v for k, v in (opts["provider_options"] or {}).items()
                        if not any(s in k.lower() for s in ("key", "token", "secret", "password"))}
    put({"target": target, "precision": opts["precision"], "provider": opts["provider"],
         "provider_options": provider_options, "rounds": opts["rounds"],
         "time_budget": opts["time_budget"]})
    put([__version__, torch.__version__, _toolchain_digest()])
    return h.hexdigest()


def _getattr_path(obj, target: str):
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


@functools.lru_cache(maxsize=1)
def _toolchain_digest() -> str:
    """KForge's Python sources and kforge-opt: a package compiled by other code is not reused
    (the kernel cache still makes compiling it again fast)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    try:
        from kforge.tools import kforge_opt
        st = kforge_opt().stat()
        h.update(f"kforge-opt {st.st_size} {st.st_mtime_ns}".encode())
    except Exception:  # noqa: BLE001 - absent: the compile will say so
        pass
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# dynamic graphs: one package per concrete signature

class _LazyGraph:
    def __init__(self, gm, plan: _GraphPlan, record: GraphRecord, opts: dict):
        self.gm, self.plan, self.record, self.opts = gm, plan, record, opts
        self.runners: dict[tuple, Callable] = {}
        self.closed = False          # new signatures run eagerly (limit reached, or failure)
        self._lock = threading.Lock()

    def __call__(self, *args):
        sig = tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                    else (type(a).__name__, a) for a in args)
        runner = self.runners.get(sig)
        if runner is None:
            if self.closed:
                return self.gm.forward(*args)
            with self._lock:
                runner = self.runners.get(sig) or self._specialize(sig, list(args))
        return runner(*args)

    def _specialize(self, sig: tuple, args: list) -> Callable:
        if self.closed:
            return self.gm.forward
        if len(self.runners) >= self.opts["max_specializations"]:
            self.closed = True
            self.record.reason = (f"dynamic graph: {len(self.runners)} signatures compiled "
                                  f"(max_specializations); new ones run eagerly")
            _warn(self.record, f"kforge: {self.record.name}: {self.record.reason}")
            return self.gm.forward
        runner = _compile_signature(self.gm, self.plan, self.record, self.opts, args)
        if runner is None and self.record.reason:
            self.closed = True       # KForge cannot compile this graph: not retried per shape
            return self.gm.forward
        runner = runner or self.gm.forward      # an empty package: the graph as it is
        self.runners[sig] = runner
        return runner


# ---------------------------------------------------------------------------------------------
# registration: `backend="kforge"` after `import kforge.dynamo`; without the import, through
# the `torch_dynamo_backends` entry point (pyproject.toml). When torch loads the module through
# the entry point, it registers the function itself right after the import, and would refuse a
# second registration under the same name: so register here only if the entry point is not
# what torch is about to use.

def _register() -> None:
    from torch._dynamo.backends import registry
    if BACKEND_NAME in registry._COMPILER_FNS:
        return
    if registry._BACKENDS.get(BACKEND_NAME) is not None:    # the discovered entry point
        return
    registry.register_backend(kforge_backend, name=BACKEND_NAME)


_register()
