"""`import_model`: PyTorch model → linalg-on-tensors MLIR (MLIR 22) + safetensors weights.

Parameters and buffers become arguments of `@main` rather than constants in the IR: the model is
wrapped so that its weights are explicit inputs (`torch.func.functional_call`), which keeps the IR
small whatever the model's size, and lets a compiled package be bound to a live module's weights.
Argument order: the user's inputs, then `named_parameters()`, then `named_buffers()`.
torch.export traces with fake tensors, so no layer runs eagerly during import.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import os
import re
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from kforge.cache import atomic_write_text
from kforge.errors import UserError
from kforge.frontend.fallback import short_location
from kforge.frontend.fxgraph import graph_record, named_locations
from kforge.frontend.ir import finalize_module
from kforge.frontend.source import LoadedModel, load_model
from kforge.moe_op import experts_as_kforge_op

# Dialects that MLIR 22 (and so kforge-opt) knows. torch-mlir's linalg-on-tensors output may also
# contain its own `tm_tensor` ops (sort, cumsum, topk, scatter, ...), which upstream lacks.
UPSTREAM_DIALECTS = frozenset({
    "builtin", "func", "linalg", "tensor", "arith", "math", "cf", "scf", "complex",
    "ml_program", "bufferization", "affine", "sparse_tensor"})


@dataclass(frozen=True)
class ImportResult:
    mlir_path: Path
    weights_path: Path
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int | None, ...], ...]   # None: dynamic (the batch dimension)
    input_dtypes: tuple[str, ...]                       # MLIR spelling: f32, bf16, i64, ...
    weight_names: tuple[str, ...]                       # keys in the safetensors file, arg order
    weight_shapes: tuple[tuple[int, ...], ...]
    weight_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int | None, ...], ...]
    output_dtypes: tuple[str, ...]
    weight_bytes: int
    fx_graph_path: Path | None = None                   # <stem>.fx.json: the aten graph
    notes: tuple[str, ...] = ()                         # LoweredModel.notes


@dataclass(frozen=True)
class LoweredModel:
    """A model after torch-mlir, before the MLIR 22 clean-ups: what `import_model` writes out."""
    loaded: LoadedModel
    weight_names: tuple[str, ...]
    weights: tuple[torch.Tensor, ...]
    torch_mlir_text: str         # torch-mlir's linalg-on-tensors output, with its locations
    fx_graph: dict               # the aten graph it was imported from (frontend.fxgraph)
    notes: tuple[str, ...] = ()  # what the import changed in how the model runs, and why


def import_model(source: nn.Module | str | os.PathLike, out_path: str | os.PathLike, *,
                 dynamic_batch: bool = False,
                 example_inputs: Sequence[torch.Tensor] | None = None) -> ImportResult:
    """Imports `source` into `out_path` (.mlir) and `<stem>.safetensors` beside it.

    `source`: an `nn.Module` instance (then `example_inputs` is required), an import path
    `"pkg.module:Class"`, or a KernelBench-format file. With `dynamic_batch`, dimension 0 of every
    user input is one dynamic size. Nothing is written unless the whole import succeeds.
    """
    out_path = Path(out_path)
    if out_path.suffix == ".safetensors":
        raise UserError(f"{out_path}: the output is the .mlir file; the weights go beside it")
    lowered = lower_model(source, dynamic_batch=dynamic_batch, example_inputs=example_inputs)
    loaded, weight_names, weights = lowered.loaded, lowered.weight_names, lowered.weights
    weights_path = out_path.with_suffix(".safetensors")
    final = finalize_module(lowered.torch_mlir_text, weight_names=weight_names,
                            num_inputs=len(loaded.example_inputs),
                            weights_file=weights_path.name, origin=loaded.origin)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(out_path, weights_path, final.text, dict(zip(weight_names, weights)),
                      loaded.origin)
    fx_graph_path = out_path.with_suffix(".fx.json")
    atomic_write_text(fx_graph_path, json.dumps(lowered.fx_graph))
    n = len(loaded.example_inputs)
    return ImportResult(
        mlir_path=out_path, weights_path=weights_path,
        input_names=loaded.input_names,
        input_shapes=tuple(t.shape for t in final.arg_types[:n]),
        input_dtypes=tuple(t.dtype for t in final.arg_types[:n]),
        weight_names=tuple(weight_names),
        weight_shapes=tuple(t.shape for t in final.arg_types[n:]),
        weight_dtypes=tuple(t.dtype for t in final.arg_types[n:]),
        output_shapes=tuple(t.shape for t in final.result_types),
        output_dtypes=tuple(t.dtype for t in final.result_types),
        weight_bytes=sum(w.numel() * w.element_size() for w in weights),
        fx_graph_path=fx_graph_path, notes=lowered.notes)


def lower_model(source: nn.Module | str | os.PathLike, *, dynamic_batch: bool = False,
                example_inputs: Sequence[torch.Tensor] | None = None) -> LoweredModel:
    """Loads, exports (torch.export) and lowers (torch-mlir) a model; writes nothing."""
    loaded = load_model(source, example_inputs)
    weight_names, weights = _collect_weights(loaded.module)
    was_training = loaded.module.training
    loaded.module.eval()               # inference semantics: batch norm uses running stats
    try:
        # a transformers MoE's experts as one op KForge has a grouped-GEMM kernel for
        with experts_as_kforge_op(loaded.module) as notes:
            program = _export(loaded, weight_names, weights, dynamic_batch)
    finally:
        loaded.module.train(was_training)
    text, fx_graph = _lower_to_linalg(program, loaded.origin)
    return LoweredModel(loaded, tuple(weight_names), tuple(weights), text, fx_graph,
                        tuple(notes))


class _WeightsAsInputs(nn.Module):
    """forward(*inputs, *weights) == model(*inputs) with the given weights."""

    def __init__(self, model: nn.Module, weight_names: Sequence[str], num_inputs: int):
        super().__init__()
        # Not a submodule: torch.export would lift its parameters and torch-mlir freeze them in.
        object.__setattr__(self, "_model", model)
        self._weight_names = tuple(weight_names)
        self._num_inputs = num_inputs

    def forward(self, *args):
        inputs, weights = args[:self._num_inputs], args[self._num_inputs:]
        return torch.func.functional_call(self._model, dict(zip(self._weight_names, weights)),
                                          inputs)


def _collect_weights(model: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    names, tensors = [], []
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        names.append(name)
        tensors.append(tensor.detach())
    return names, tensors


def _export(loaded: LoadedModel, weight_names: list[str], weights: list[torch.Tensor],
            dynamic_batch: bool):
    inputs = list(loaded.example_inputs)
    dynamic_shapes = None
    if dynamic_batch:
        sizes = {tuple(t.shape[:1]) for t in inputs}
        if any(t.dim() == 0 for t in inputs) or len(sizes) != 1:
            raise UserError(f"{loaded.origin}: --dynamic-batch needs every input to have the same "
                            f"dimension 0 (got shapes {[tuple(t.shape) for t in inputs]})")
        if inputs[0].shape[0] == 1:
            # torch.export specializes sizes 0 and 1; trace with 2 (values are never computed).
            inputs = [torch.cat([t, t]) for t in inputs]
        batch = torch.export.Dim("batch")
        dynamic_shapes = (tuple([{0: batch}] * len(inputs) + [None] * len(weights)),)
    wrapper = _WeightsAsInputs(loaded.module, weight_names, len(inputs))
    # On failure torch.export prints its partial graph to stderr and logs a warning; the
    # UserError says what matters, so that noise is dropped (and kept when export succeeds).
    captured = io.StringIO()
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    try:
        shapes_log.setLevel(logging.ERROR)
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(captured):
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            program = torch.export.export(wrapper, tuple(inputs + weights),
                                          dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:     # torch raises many types here; all mean "cannot trace"
        raise UserError(_explain_export_failure(exc, loaded, dynamic_batch)) from None
    finally:
        shapes_log.setLevel(level)
    sys.stderr.write(captured.getvalue())
    mutated = list(program.graph_signature.user_inputs_to_mutate.values())
    if mutated:
        raise UserError(f"{loaded.origin}: the model writes to its inputs or buffers in forward "
                        f"({', '.join(mutated)}); only functional models are supported "
                        "(in-place updates of buffers, e.g. batch norm in training mode, are not)")
    return program


def _explain_export_failure(exc: Exception, loaded: LoadedModel, dynamic_batch: bool) -> str:
    text = str(exc).strip()
    summary = text.splitlines()[0] if text else type(exc).__name__
    user_frame = _user_frame(exc, loaded)
    where = f" at {user_frame}" if user_frame else ""
    if "data-dependent" in text or "data dependent" in text or "GuardOnDataDependent" in \
            type(exc).__name__:
        return (f"{loaded.origin}: torch.export cannot trace the model{where}: its control flow "
                f"depends on tensor values ({summary}). Rewrite the branch with tensor ops "
                "(torch.where, masking) or torch.cond, so that one graph covers every input")
    if dynamic_batch and ("Constraints violated" in text or "specializ" in text):
        return (f"{loaded.origin}: the batch dimension cannot be dynamic{where}: the model "
                f"fixes it to a constant ({summary}). Import without --dynamic-batch, or avoid "
                "hard-coded batch sizes (e.g. use x.view(x.shape[0], -1))")
    return f"{loaded.origin}: torch.export cannot trace the model{where}: {type(exc).__name__}: " \
           f"{_clip(text)}"


def _user_frame(exc: BaseException, loaded: LoadedModel) -> str | None:
    """The innermost place in the user's model source that the failure points at, `file:line`."""
    try:
        model_file = inspect.getsourcefile(type(loaded.module))
    except (TypeError, OSError):
        return None
    if not model_file:
        return None

    def is_model_file(name: str) -> bool:
        try:
            return os.path.samefile(name, model_file)
        except OSError:           # "<string>", deleted files, ...
            return False

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_model_file(f.filename)]
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    # torch.export reports the user's line in its message rather than in the traceback.
    for name, line in reversed(re.findall(r'File "([^"]+)", line (\d+)', str(exc))):
        if is_model_file(name):
            return f"{name}:{line}"
    return None


def _lower_to_linalg(program, origin: str) -> tuple[str, dict]:
    """torch-mlir: ExportedProgram → linalg-on-tensors text (fallback ops as external calls,
    every op located at its FX node), with its diagnostics captured; and the FX graph imported."""
    from torch_mlir import ir as tm_ir
    from torch_mlir.dialects import torch as torch_d
    context = tm_ir.Context()
    torch_d.register_dialect(context)
    diagnostics: list[str] = []

    def collect(diag) -> bool:
        diagnostics.append(f"{short_location(diag.location)}: {diag.message}")
        return True

    _views_to_reshapes(program.graph_module)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            program = program.run_decompositions(_decompositions())
    except Exception as exc:     # a decomposition that fails on this graph
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"{origin}: PyTorch's decompositions (run before torch-mlir) failed: "
                        f"{type(exc).__name__}: {_clip(first, 400)}") from None
    from kforge.frontend.attention_patterns import fuse_written_attention, simplify_kv_cache
    from kforge.frontend.constant_masks import fold_constant_masks
    fuse_written_attention(program.graph_module)
    simplify_kv_cache(program.graph_module)
    fold_constant_masks(program.graph_module)
    _as_strided_to_view(program.graph_module)
    fx_graph = graph_record(program.graph_module, _user_inputs(program))
    handler = context.attach_diagnostic_handler(collect)
    try:
        with named_locations():
            module = _import_with_fallbacks(program, context, origin, diagnostics)
    finally:
        handler.detach()
    _reject_foreign_ops(module, origin)
    return module.operation.get_asm(enable_debug_info=True), fx_graph


def _user_inputs(program) -> set[str] | None:
    """Names of the placeholders that are the program's inputs (the others are parameters,
    buffers and lifted constants, which the frozen import turns into literals)."""
    try:
        from torch.export.graph_signature import InputKind
        return {spec.arg.name for spec in program.graph_signature.input_specs
                if spec.kind == InputKind.USER_INPUT and hasattr(spec.arg, "name")}
    except Exception:  # noqa: BLE001 - an older torch: every placeholder counts, as before
        return None


# How many times the lowering is retried with the ops it could not convert outlined.
_MAX_LOWERING_ROUNDS = 4


def _import_with_fallbacks(program, context, origin: str, diagnostics: list[str]):
    """torch-mlir's FX import (raw torch dialect), fallback ops outlined, then its linalg
    pipeline; ops the linalg conversion leaves behind become fallbacks too (import again)."""
    from torch_mlir.compiler_utils import TorchMlirCompilerError, run_pipeline_with_repro_report
    from torch_mlir.extras.fx_importer import FxImporter

    from kforge.frontend.fallback import LINALG_PIPELINE, leftover_torch_ops, outline_fallbacks

    extra: frozenset[str] = frozenset()
    for _ in range(_MAX_LOWERING_ROUNDS):
        diagnostics.clear()
        importer = FxImporter(context=context)
        try:
            importer.import_frozen_program(program, func_name="main")
        except Exception as exc:     # the FX importer's own NotImplementedError, ValueError, ...
            raise UserError(f"{origin}: torch-mlir cannot import this model: "
                            f"{type(exc).__name__}: {_clip(str(exc))}") from None
        module = importer.module
        outline_fallbacks(module, extra)
        try:
            run_pipeline_with_repro_report(
                module, "builtin.module(func.func(torch-match-quantized-custom-ops), "
                "torchdynamo-export-to-torch-backend-pipeline)",
                "Lowering TorchFX IR -> Torch Backend IR")
            run_pipeline_with_repro_report(module, LINALG_PIPELINE,
                                           "Lowering Torch Backend IR -> Linalg-on-Tensors")
        except TorchMlirCompilerError as exc:
            failed = _failed_ops(diagnostics)
            if not failed or failed <= extra:
                raise UserError(_explain_lowering_failure(origin, diagnostics, str(exc))) \
                    from None
            extra = extra | failed
            continue
        left = leftover_torch_ops(module)
        if not left:
            return module
        if set(left) <= extra:
            break
        extra = extra | frozenset(left)
    listed = "; ".join(f"{name} (from {loc})" for name, loc in left.items())
    raise UserError(f"{origin}: torch-mlir could not lower {listed} to linalg, and running it "
                    "through PyTorch as a fallback op did not help either")


def _decompositions() -> dict:
    """torch-mlir's decomposition table, less attention: SDPA stays one op (a fallback op that
    gets a fused kernel, kforge.kernel_fallbacks) instead of its math decomposition."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    return {op: fn for op, fn in get_decomposition_table().items()
            if "scaled_dot_product" not in str(op)}


def _views_to_reshapes(graph_module) -> int:
    """`aten.view` -> `aten.reshape` in the exported (functional) graph.

    The graph has no mutation, so a view and a reshape compute the same values; but a
    decomposition may give a view's input other strides than eager did (GPT-2's Conv1D views
    the output of attention, which the SDPA decomposition leaves transposed), and re-tracing
    then fails with "Cannot view a tensor with shape ... and strides ...". A reshape of a
    contiguous tensor is still a view, so nothing is copied where eager copied nothing."""
    view, reshape = torch.ops.aten.view.default, torch.ops.aten.reshape.default
    count = 0
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target is view:
            node.target = reshape
            count += 1
    if count:
        graph_module.recompile()
    return count


def _as_strided_to_view(graph_module) -> int:
    """Rewrites `as_strided` that only reshapes a contiguous tensor into `view`.

    PyTorch's decompositions emit these (GroupNorm's ends with `as_strided(x, [N, C], [C, 1])` of a
    contiguous [N, G, C/G, 1] tensor). torch-mlir would turn each into a gather with constant
    index tensors the size of the activation (large constants in the IR, no fusion) and rejects
    them outright when a dimension is dynamic. As a view they lower to `tensor.collapse_shape`.
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    as_strided, view = torch.ops.aten.as_strided.default, torch.ops.aten.view.default
    rewritten = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target is not as_strided:
            continue
        source, out = node.args[0], node.meta.get("val")
        src = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)):
            continue
        if offset not in (None, 0) or not statically_known_true(src.storage_offset() == 0):
            continue
        if not (src.is_contiguous() and out.is_contiguous() and
                statically_known_true(src.numel() == out.numel())):
            continue
        with graph_module.graph.inserting_before(node):
            replacement = graph_module.graph.call_function(view, (source, node.args[1]))
        replacement.meta.update(node.meta)
        node.replace_all_uses_with(replacement)
        name = node.name
        graph_module.graph.erase_node(node)
        replacement.name = name          # the graph signature refers to outputs by name
        rewritten += 1
    if rewritten:
        graph_module.recompile()
    return rewritten


def _failed_ops(diagnostics: list[str]) -> frozenset[str]:
    """The aten ops torch-mlir's diagnostics say it could not convert."""
    text = "\n".join(diagnostics)
    return frozenset(re.findall(r'name = "torch\.(aten\.[\w.]+)"', text)) | \
        frozenset(re.findall(r"operation 'torch\.(aten\.[\w.]+)'", text))


def _explain_lowering_failure(origin: str, diagnostics: list[str], fallback: str) -> str:
    ops = sorted(_failed_ops(diagnostics))
    detail = "\n".join(_clip(d, 400) for d in diagnostics[:8]) or _clip(fallback)
    if ops:
        return (f"{origin}: torch-mlir cannot lower {', '.join(ops)} to linalg; replace it with "
                f"supported ops or keep it out of the compiled model:\n{detail}")
    return f"{origin}: torch-mlir failed to lower the model to linalg:\n{detail}"


def _reject_foreign_ops(module, origin: str) -> None:
    """Ops that MLIR 22 cannot parse (torch-mlir's own tm_tensor, leftover torch ops)."""
    from torch_mlir import ir as tm_ir

    foreign: dict[str, str] = {}

    def visit(op):
        dialect = op.name.split(".", 1)[0]
        if dialect not in UPSTREAM_DIALECTS and op.name not in foreign and \
                not op.name.endswith(".yield"):
            foreign[op.name] = short_location(op.location)
        return tm_ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if foreign:
        listed = "; ".join(f"{name} (from {loc})" for name, loc in foreign.items())
        raise UserError(f"{origin}: torch-mlir lowers part of this model to ops that upstream "
                        f"MLIR 22 and kforge-opt do not have: {listed}. Typical causes: sort, "
                        "topk, cumsum, scatter; replace them or keep them out of the model")


def _write_atomically(mlir_path: Path, weights_path: Path, text: str,
                      weights: dict[str, torch.Tensor], origin: str) -> None:
    """Both files appear together or not at all; an existing pair survives a failed import."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in weights.items():
        tensor = tensor.contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if tensor.numel() and key in seen:    # safetensors refuses shared storage
            tensor = tensor.clone()
        seen.add(key)
        tensors[name] = tensor
    directory = mlir_path.parent
    mode = _default_file_mode()       # mkstemp's files are 0600; give ours the usual mode
    temps = []
    try:
        fd, tmp_weights = tempfile.mkstemp(prefix=f".{weights_path.name}.", dir=directory)
        os.close(fd)
        temps.append(tmp_weights)
        save_file(tensors, tmp_weights, metadata={"format": "pt", "kforge.source": str(origin)})
        os.chmod(tmp_weights, mode)
        fd, tmp_mlir = tempfile.mkstemp(prefix=f".{mlir_path.name}.", dir=directory)
        temps.append(tmp_mlir)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp_mlir, mode)
        os.replace(tmp_weights, weights_path)
        os.replace(tmp_mlir, mlir_path)
    finally:
        for tmp in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _clip(text: str, limit: int = 1200) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


__all__ = ["ImportResult", "LoweredModel", "import_model", "lower_model"]
