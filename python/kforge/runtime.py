"""Running a compiled package: the linked IR's host plan (`linked_plan.json`), its kernel steps
through verified Triton kernels, region calls through their reference, fallback ops through
PyTorch. Needs only torch and triton (no MLIR, no torch-mlir).

    model = load_package("PKG")               # weights from the package
    model = load_package("PKG", module=net)   # weights bound from a live nn.Module
    y = model(x)

A kernel is used only where the linked plan calls it and the manifest records it as verified
for the device it runs on. A package compiled where its target device was absent holds
candidates: `kforge tune` (kforge.tune) verifies them, records the results and links again;
loading a package never changes it.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from kforge import fastlaunch, passcache
from kforge.errors import UserError
from kforge.modelfile import load_model_file
from kforge.package import Package, entry_config, open_package
from kforge.selection import (above_floor, meets, raised_regions, region_precision,
                              scheme_floors, selection_feeders)
from kforge.tune import pending_candidates, tune_package
from kforge.verify.interpreter import drop_overflow_checks


def use_interpreter(enabled: bool) -> None:
    """The cpu target runs kernels in the Triton interpreter. Triton reads TRITON_INTERPRET when
    it defines its own library functions (at import) and when @triton.jit decorates, so it is
    set for the whole process, and it must be set before triton is first imported."""
    if not enabled:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    standard = sys.modules.get("triton.language.standard")
    if standard is not None and type(getattr(standard, "sigmoid", None)).__name__ == \
            "JITFunction":
        raise UserError("the Triton interpreter (target cpu) must be on before triton is "
                        "imported: set TRITON_INTERPRET=1 in the environment, or call "
                        "kforge.compile/kforge.load before importing triton")


def load_kernel_module(path: Path, target: str):
    name = f"kforge_kernel_{path.parent.name}_{target}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    use_interpreter(target == "cpu")
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if target == "cpu":
        drop_overflow_checks()          # as on a GPU (kforge.verify.interpreter)
    return module


class PreparedKernel:
    """A verified kernel as the host plan calls it: launch(*args), with `prepare_weights`
    applied once per distinct set of weight tensors (one region may be called with several)."""

    def __init__(self, module, weight_indices: Sequence[int]):
        self.launch = module.launch
        self.prepare = getattr(module, "prepare_weights", None)
        self.weight_indices = tuple(weight_indices)
        self._prepared: dict = {}
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        # the IR's tensors carry no strides; a kernel reads dense row-major operands, and a
        # reference or fallback may have returned a view (a transpose) of another layout
        # (weights are made contiguous once, when they are bound)
        args = tuple(a.contiguous() if isinstance(a, torch.Tensor) and not a.is_contiguous()
                     and i not in self.weight_indices else a for i, a in enumerate(args))
        if self.prepare is not None and self.weight_indices:
            key = tuple((i, args[i].data_ptr(), tuple(args[i].shape))
                        for i in self.weight_indices)
            if key not in self._prepared:
                self._prepared[key] = self.prepare({i: args[i] for i in self.weight_indices})
            new = self._prepared[key]
            args = tuple(new.get(i, a) for i, a in enumerate(args))
        out = self.launch(*args)
        return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def default_device(target: str) -> str:
    """The torch device a target's kernels run on (cpu for a name no target has)."""
    from kforge.targets import get_target, target_names
    return get_target(target).device if target.partition(":")[0] in target_names() else "cpu"


def usable_kernels(package: Package, target: str) -> dict[str, dict]:
    """Manifest entries that may run here: verified, for this target, under a policy that
    meets what the region needs: the package's, or strict where it feeds a selection op
    (kforge.selection; a strict kernel meets bf16), and of a scheme above the region's floor
    where the whole-model check set one (the manifest's "finer_schemes")."""
    out = {}
    feeders = selection_feeders(package.plan)
    raised, floors = raised_regions(package.manifest), scheme_floors(package.manifest)
    for h, entry in package.manifest.get("kernels", {}).items():
        ver = entry.get("verification") or {}
        if entry.get("faster_than_pytorch") is False:
            continue          # a kernel-backed fallback slower than PyTorch's own op
        # a region that feeds a selection op needs a strict kernel (an older package's bf16
        # one runs its reference until `kforge tune` requalifies it)
        needed, _ = region_precision(package.precision, feeders, h, raised)
        held = ver.get("precision", entry.get("precision"))
        if entry.get("target") == target and ver.get("status") == "verified" and \
                meets(held, needed) and (meets(held, "strict") or
                                         above_floor(entry_config(entry), held, floors.get(h, 0))):
            # (a region whose floor the whole-model check raised runs its reference until
            # `kforge tune` verifies a kernel above it)
            out[h] = entry
    return out


class CompiledModel:
    """A package bound to weights on a device; call it like the original module."""

    def __init__(self, package: Package, weights: dict[str, torch.Tensor], target: str,
                 use_kernels: bool = True, compile_references: bool | None = None):
        self.package = package
        self.target = target
        self.device = torch.device(default_device(target))
        self.weights = {k: v.to(self.device).contiguous() for k, v in weights.items()}
        self.kernels: dict[str, PreparedKernel] = {}
        if use_kernels:
            wanted = package.kernel_hashes()
            for h, entry in usable_kernels(package, target).items():
                if h not in package.specs or h not in wanted:
                    continue
                spec = package.specs[h]
                module = load_kernel_module(package.root / entry["source"], target)
                if self.device.type == "cuda" and fastlaunch.enabled():
                    module = fastlaunch.fast_module(module)     # repeated launches, less Python
                passcache.bind(module)      # operand passes shared between regions in a run
                widx = [i for i, a in enumerate(spec.args) if a.weight]
                self.kernels[h] = PreparedKernel(module, widx)

        # Regions without a kernel run the model's own aten ops where the compiler checked
        # that program (kforge.aten_regions; KFORGE_ATEN_REGIONS=0: never), else the reference's
        # interpretation of the linalg. On a GPU either is compiled (torch.compile, on first use)
        # unless KFORGE_COMPILE_REFERENCES=0.
        self.references: dict = {}
        self.shared_passes = (0, 0)     # (served, run) operand passes in the last plan run
        self.aten_regions: set[str] = set()
        if compile_references is None:
            compile_references = self.device.type == "cuda" and \
                os.environ.get("KFORGE_COMPILE_REFERENCES") != "0"
        self._prepare_references(compile_them=compile_references)
        from kforge.graphs import PlanGraphs, graphs_wanted
        self.graphs = PlanGraphs(self._run_plan, self.device) \
            if graphs_wanted(self.device) else None

    def _prepare_references(self, compile_them: bool) -> None:
        from kforge.aten_regions import load_programs
        from kforge.kernel_fallbacks import is_kernel_fallback
        from kforge.reference import reference_fn
        from kforge.verify.policy import get_policy
        policy = get_policy(self.package.precision)
        tolerance = (policy.atol, policy.rtol)
        programs = {} if os.environ.get("KFORGE_ATEN_REGIONS") == "0" else \
            load_programs(self.package.root / "regions")
        for h, base in self.package.site_regions.items():    # a split call: its region's
            if base in programs:
                programs[h] = programs[base]
        for h, spec in self.package.specs.items():
            if h in self.kernels or is_kernel_fallback(spec):
                continue          # a kernel-backed fallback's reference is PyTorch's op already
            if h in programs and not programs[h].checked and spec.args:
                # too large to check when compiling: checked at its first run (FirstUseCheck)
                from kforge.aten_regions import FirstUseCheck
                from kforge.verify.inputs import signature_of
                from kforge.verify.verifier import narrow_dtype
                program = programs[h].callable()
                if compile_them:
                    program = _CompiledReference(program, h, tolerance)
                self.references[h] = FirstUseCheck(program, reference_fn(spec), h,
                                                   narrow_dtype(signature_of(spec).args))
                self.aten_regions.add(h)
                continue
            if h in programs:
                fn = programs[h].callable()
                self.aten_regions.add(h)
            elif compile_them or not spec.args:
                fn = reference_fn(spec)
            else:
                continue          # run_host_plan interprets it
            if not spec.args:     # no operands: a constant (a mask from index ranges)
                self.references[h] = _ConstantRegion(fn, self.device)
                continue
            self.references[h] = _CompiledReference(fn, h, tolerance) if compile_them else fn

    @property
    def regions(self) -> list[str]:
        return self.package.region_hashes()

    def __call__(self, *inputs: torch.Tensor):
        outs = self.run(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, inputs, step_timer: Callable | None = None,
            graphs: bool = True) -> tuple[torch.Tensor, ...]:
        """The plan's outputs for `inputs` (moved to the device); `step_timer(step, run)`
        wraps each host-plan step (kforge.coverage.profile_plan). On a GPU the plan is
        replayed as a CUDA graph (kforge.graphs) unless KFORGE_CUDA_GRAPHS=0, `graphs` is
        False (one call: a capture would not pay) or a step cannot be captured."""
        args = [t.to(self.device) for t in inputs]
        if step_timer is None and graphs and self.graphs is not None:
            return self.graphs(args)
        return self._run_plan(args, step_timer)

    def _run_plan(self, args, step_timer: Callable | None = None) -> tuple[torch.Tensor, ...]:
        from kforge.reference import run_host_plan
        with torch.no_grad(), passcache.active_run() as cache:
            out = run_host_plan(self.package.plan, self.package.specs, args, self.weights,
                                kernels=self.kernels, references=self.references,
                                step_timer=step_timer)
            if cache is not None:       # this run's operand passes: (served, run)
                self.shared_passes = (cache.hits, cache.runs)
            return out

    forward = __call__

    def bind(self, module: torch.nn.Module) -> "CompiledModel":
        """Use the weights of a live module of the same architecture."""
        self.weights = module_weights(module, self.package, self.device)
        if self.graphs is not None:
            self.graphs.reset()             # the captured graphs read the old weights
        return self

    def describe(self) -> str:
        n = len(self.regions)
        rest = n - len(self.kernels)
        return (f"kforge package {self.package.root} on {self.target}: {len(self.kernels)}/{n} "
                f"regions by verified kernels, {len(self.aten_regions)} of the other {rest} by "
                "their aten ops (PyTorch), the rest by the reference")


class _ConstantRegion:
    """A region without operands computes the same tensors every run: once, on the device."""

    def __init__(self, fn, device):
        self.fn, self.device, self.value = fn, device, None

    def __call__(self):
        if self.value is None:
            self.value = tuple(t.to(self.device) for t in self.fn())
        return self.value


class _CompiledReference:
    """A region's reference under torch.compile (Inductor), built at its first call and kept
    only if its results there match the plain reference's at the package's tolerance (Inductor
    may pick other algorithms: cuDNN's TF32 convolutions, other reduction orders); otherwise,
    or if compiling fails, the plain reference, after one warning."""

    def __init__(self, fn, region: str, tolerance: tuple[float, float] = (1e-4, 1e-4)):
        self.fn = fn
        self.region = region
        self.tolerance = tolerance
        self.compiled = None
        self.note = ""

    def __call__(self, *args):
        if self.compiled is None:
            import torch._dynamo
            # every region's reference is the same Python function over another spec: dynamo
            # counts them as recompilations of one frame
            for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob,
                            max(getattr(torch._dynamo.config, knob), 4096))
            try:
                compiled = torch.compile(self.fn, dynamic=False, fullgraph=True)
                out = compiled(*args)
                plain = self.fn(*args)
                why = _mismatch(out, plain, self.tolerance)
                if why:
                    self.note = f"compiled reference differs from the plain one ({why})"
                    self._fall_back(self.note)
                    return plain
                self.compiled = compiled
                return out
            except Exception as exc:   # noqa: BLE001 - any compiler failure: run it plainly
                self.note = (f"torch.compile of its reference failed ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''})")
                self._fall_back(self.note)
        return self.compiled(*args)

    def _fall_back(self, why: str) -> None:
        import warnings
        warnings.warn(f"region {self.region}: {why}; it runs op by op", stacklevel=3)
        self.compiled = self.fn


def _mismatch(got, want, tolerance: tuple[float, float]) -> str:
    """'' if every result matches at (atol, rtol), the atol scaled by the result's RMS."""
    atol, rtol = tolerance
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"result {i}: {tuple(g.shape)} {g.dtype} against {tuple(w.shape)} {w.dtype}"
        if not w.dtype.is_floating_point:
            if not torch.equal(g, w):
                return f"result {i} differs"
            continue
        g64, w64 = g.double(), w.double()
        scale = max(1.0, float(w64.pow(2).mean().sqrt())) if w64.numel() else 1.0
        if not torch.allclose(g64, w64, atol=atol * scale, rtol=rtol, equal_nan=True):
            return f"result {i}: max |diff| {float((g64 - w64).abs().max()):.2e}"
    return ""


def module_weights(module: torch.nn.Module, package: Package, device) -> dict:
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    needed = [a.weight for a in package.plan.inputs if a.weight]
    missing = [n for n in needed if n not in state]
    if missing:
        raise UserError(f"the module has no weights named {', '.join(missing[:5])}; it must be "
                        f"the architecture the package was compiled from")
    out = {}
    for a in package.plan.inputs:
        if a.weight:
            t = state[a.weight].detach()
            shape = tuple(a.shape)
            if any(d is not None and d != s for d, s in zip(shape, t.shape)) or \
                    len(shape) != t.dim():
                raise UserError(f"weight {a.weight}: the module has shape {list(t.shape)}, the "
                                f"package expects {list(shape)}")
            out[a.weight] = t.to(device).contiguous()
    return out


def package_weights(package: Package) -> dict[str, torch.Tensor]:
    path = package.weights_path()
    if path is None or not path.is_file():
        raise UserError(f"{package.root}: the package's weights file "
                        f"({path or 'none recorded'}) is missing; bind a live module with "
                        "kforge.load(PKG, module)")
    from safetensors.torch import load_file
    return load_file(str(path))


def load_package(pkg: str | os.PathLike, module: torch.nn.Module | None = None, *,
                 target: str | None = None, tune: bool = False,
                 use_kernels: bool = True) -> CompiledModel:
    """Load a package; it runs what its linked plan says. Loading never changes the package:
    candidate kernels (compiled where the device was absent) stay unused until `kforge tune`
    verifies them — or pass tune=True to run that step first, explicitly."""
    from kforge.verify import target_available
    package = open_package(pkg)
    target = target or package.target
    use_interpreter(target == "cpu")
    if not target_available(target):
        raise UserError(f"{package.root} targets {target}, and this machine has no {target} "
                        "device; run it where the device is, or pass --target cpu to run it "
                        "here (by the reference, and kernels verified for cpu if any)")
    if tune and target == package.target and pending_candidates(package, target):
        tune_package(package.root)
        package = open_package(pkg)
    if module is not None:
        weights = module_weights(module, package, "cpu")
    else:
        weights = package_weights(package)
    return CompiledModel(package, weights, target, use_kernels=use_kernels)


def read_inputs(path: str | os.PathLike) -> list[torch.Tensor]:
    """Inputs for `kforge run --inputs`: a torch.save'd tensor/list/tuple/dict, or a
    .safetensors file (tensors in key order input0, input1, ... or sorted keys)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such inputs file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        data = load_file(str(path))
    else:
        data = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, dict):
        return [data[k] for k in sorted(data, key=lambda k: (len(k), k))]
    if isinstance(data, (list, tuple)):
        return list(data)
    raise UserError(f"{path}: expected a tensor, a list/tuple or a dict of tensors")


def load_package_weights(module: torch.nn.Module, package: Package, path) -> None:
    """The package's weights into `module`, built from its model file at `path`; a tensor of
    another shape is a clear error (names the module lacks: module_weights says which)."""
    try:
        module.load_state_dict(package_weights(package), strict=False)
    except RuntimeError as exc:
        raise UserError(f"{package.root}: its weights do not fit the model in {path}: "
                        f"{str(exc).strip()[:300]}") from None


def eager_model(package: Package):
    """The original model, in eager PyTorch, with the package's weights."""
    path = package.model_path()
    if path is None:
        raise UserError(f"{package.root}: --check needs the model source; the package has no "
                        "model.py and its origin is gone")
    model, _ = load_model_file(path, with_model=True)
    load_package_weights(model, package, path)
    return model


def eager_outputs(package: Package, inputs: Sequence[torch.Tensor]):
    """The original model's outputs, in eager PyTorch, with the package's weights."""
    model = eager_model(package)
    with torch.no_grad():
        out = model(*inputs)
    return out


def max_error(a, b) -> tuple[float, float]:
    """(max abs error, max relative error) over all outputs."""
    a = [a] if isinstance(a, torch.Tensor) else list(a)
    b = [b] if isinstance(b, torch.Tensor) else list(b)
    if len(a) != len(b):
        raise UserError(f"the package returns {len(a)} outputs, eager returns {len(b)}")
    abs_err = rel = 0.0
    for x, y in zip(a, b):
        x, y = x.detach().double().cpu(), y.detach().double().cpu()
        if x.shape != y.shape:
            raise UserError(f"output shape {list(x.shape)} differs from eager {list(y.shape)}")
        d = (x - y).abs()
        if not d.numel():
            continue
        abs_err = max(abs_err, float(d.max()))
        big = y.abs() > 1e-3 * float(y.abs().max())     # relative error where it means something
        if big.any():
            rel = max(rel, float((d[big] / y[big].abs()).max()))
    return abs_err, rel


__all__ = ["CompiledModel", "load_package", "tune_package", "read_inputs", "eager_model",
           "eager_outputs", "max_error", "load_model_file"]
