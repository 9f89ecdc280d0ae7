"""Compile a package's (or a candidate's) Triton kernels for a GPU that is not here.

Each target answers how (Target.cross_compile): cuda here, with the local Triton; xpu in an
environment of its own with `triton-xpu` (kforge.targets.xpu_env, kforge/targets/_xpu_worker.py,
which follows the same steps with that Triton and reports SPIR-V size and DPAS use).

For cuda, on a machine without the GPU, `kforge xcompile PKG` runs each kernel's `launch` on meta tensors
with Triton's launcher replaced by a compile for the target architecture (Triton's own argument
binder and specialization, then `triton.compile` for `GPUTarget("cuda", 90, 32)`, i.e. H100 /
H200), and reports per kernel: whether the matrix products became Hopper `wgmma`, whether TMA
moves its tiles, registers, spill stores and loads (ptxas -v), shared memory, a count of the PTX
instructions that show a loop's work (`ptx_profile`), and compile errors. It runs the local
Triton, which may differ from the GPU host's; the host's own verification is what decides.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kforge.errors import UserError
from kforge.verify.inputs import TORCH_DTYPES, signature_of

@dataclass
class KernelReport:
    name: str
    ok: bool
    error: str = ""
    mma: str = ""                 # "wgmma" (Hopper), "mma.sync" (Ampere-style), "dpas" (Intel)
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    compile_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    spirv_bytes: int | None = None    # xpu: size of the SPIR-V module
    block_io: bool = False            # xpu: 2D block loads used
    threads_per_warp: int | None = None   # xpu: the sub-group size compiled for
    grf_mode: str | None = None       # xpu: "large" = 256 registers a thread
    compiler: str = ""
    ptx_ops: dict = field(default_factory=dict)   # cuda: PTX_OPS counted in the kernel's PTX
    # cuda, where asked (compile_source's `sass`): the cubin's SASS (cuobjdump): instructions,
    # MUFU (special-function unit) instructions, branches and calls; empty otherwise
    sass: dict = field(default_factory=dict)

    @property
    def tma(self) -> bool:
        """cuda: tiles moved by TMA (cp.async.bulk.tensor in the PTX)."""
        return self.ptx_ops.get("tma", 0) > 0

    def to_json(self) -> dict:
        return asdict(self)


# What a kernel's PTX shows of its inner loop's work, where no GPU can time it (a proxy: counts
# of instructions in the text, not of executions): tensor-core products, TMA copies, cross-lane
# shuffles (reductions, layout changes), barriers, pre-Hopper async copies and the narrow ones
# among them, local memory (spills), and the PTX's length. Prepared fp16x1 attention against the
# per-tile one it replaced, 2026-12-05: 96 shuffles and 12 barriers against 384 and 54
# (benchmarks/attention/NOTES.md).
PTX_OPS = {
    "wgmma": r"wgmma\.mma_async",
    "mma.sync": r"\bmma\.sync",
    "tma": r"cp\.async\.bulk\.tensor",
    "tma_store": r"cp\.async\.bulk\.tensor\.\dd\.global\.shared",
    "shfl": r"shfl\.sync",
    "bar": r"\b(?:bar|barrier)\.sync",
    "cp.async": r"cp\.async\.(?:ca|cg)",
    # copies of 4 or 8 bytes (.cg takes 16 only): a tile whose loads did not vectorize (the
    # MoE up projection's weight tiles, 2026-12-06: a mask alternating every other column)
    "cp.async.narrow": r"cp\.async\.ca\b",
    "local": r"\b(?:ld|st)\.local",
    # the bf16 policy's fast math (CudaTarget.fast_math): one instruction per tanh
    "tanh.approx": r"\btanh\.approx\.f32",
}


def ptx_profile(ptx: str) -> dict[str, int]:
    """PTX_OPS counted in `ptx`, and its number of lines (`lines`)."""
    counts = {name: len(re.findall(pattern, ptx)) for name, pattern in PTX_OPS.items()}
    counts["lines"] = ptx.count("\n")
    return counts


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:   # noqa: BLE001
        return "not installed"


def sass_profile(cubin: bytes | None) -> dict[str, int]:
    """Counts of the SASS instructions in `cubin` (Triton's bundled cuobjdump): all of them,
    MUFU (special-function unit: ex2, lg2, rcp, tanh...) and branches / calls. Static counts,
    not executions, like ptx_profile, but after ptxas: PTX's `div.full.f32` and libdevice's
    tanhf are one line of PTX each and expand differently here. {} where it cannot be read."""
    if not cubin:
        return {}
    try:
        import triton
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if not tool.is_file():
            return {}
        with tempfile.TemporaryDirectory(prefix="kforge-sass-") as tmp:
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
            text = subprocess.run([str(tool), "-sass", str(path)], capture_output=True,
                                  text=True, timeout=120).stdout
    except Exception:   # noqa: BLE001 - a profile fact, never a failure
        return {}
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
    return {"instructions": len(ops), "mufu": sum(o.startswith("MUFU") for o in ops),
            "branches": sum(o.split(".")[0] in ("BRA", "CALL", "BRX", "JMP") for o in ops)}


def _ptxas_info(ptx: str, arch: int) -> tuple[int | None, int | None, int | None]:
    """(registers, spill store bytes, spill load bytes) from `ptxas -v`, or Nones."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        ptxas = get_ptxas(arch).path
    except Exception:   # noqa: BLE001 - older Triton: one ptxas
        try:
            from triton import knobs
            ptxas = knobs.nvidia.ptxas.path
        except Exception:   # noqa: BLE001
            return None, None, None
    with tempfile.TemporaryDirectory(prefix="kforge-ptxas-") as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", str(src), "-o",
                               str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                              timeout=300)
    text = proc.stdout + proc.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return (int(regs.group(1)) if regs else None,
            int(spill.group(1)) if spill else None, int(spill.group(2)) if spill else None)


def _gluon_source_cls(fn):
    """GluonASTSource where `fn` is a @gluon.jit kernel (kforge.providers.builtin.gluon), else
    None."""
    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    except Exception:   # noqa: BLE001 - a Triton without Gluon
        return None
    return GluonASTSource if isinstance(fn, GluonJITFunction) else None


def _dump_asm(asm: dict, name: str, fn: str) -> None:
    """With KFORGE_XCOMPILE_DUMP=DIR: the kernel's TTGIR and PTX as DIR/<source>.<kernel>.ttgir
    and .ptx, to read what the compiler made of it (the pipeline's waits, the matrix
    instructions) without a GPU."""
    out = os.environ.get("KFORGE_XCOMPILE_DUMP")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    for kind in ("ttgir", "ptx"):
        text = asm.get(kind)
        if isinstance(text, str) and text:
            (Path(out) / f"{name}.{fn}.{kind}").write_text(text)


def compile_source(source: str, arg_shapes: list[tuple[list[int], str]], arch: int = 90,
                   name: str = "candidate", weights: tuple[int, ...] = (),
                   sass: bool = False) -> list[KernelReport]:
    """Run `launch` from `source` on meta tensors of the given (shape, dtype) arguments (after
    `prepare_weights` of the `weights` argument indices, when the source defines it), compiling
    each kernel launch for sm_`arch` instead of running it. `sass`: also count its SASS
    (sass_profile: a cuobjdump run per kernel, so only where asked)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    reports: list[KernelReport] = []

    def compile_launch(fn, *args, grid=None, warmup=False, **kwargs):
        t0 = time.perf_counter()
        rep = KernelReport(fn.__name__, False, num_warps=kwargs.get("num_warps"),
                           num_stages=kwargs.get("num_stages"))
        reports.append(rep)
        try:
            kwargs.setdefault("debug", False)
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                                  specialization, options)
            source_cls = _gluon_source_cls(fn) or ASTSource     # a @gluon.jit kernel's own
            kernel = triton_compile(source_cls(fn, signature, constexprs, attrs), target=target,
                                    options=options.__dict__)
            ptx = kernel.asm.get("ptx", "")
            _dump_asm(kernel.asm, name, fn.__name__)
            rep.ptx_ops = ptx_profile(ptx)
            if sass:
                rep.sass = sass_profile(kernel.asm.get("cubin"))
            rep.mma = "wgmma" if rep.ptx_ops["wgmma"] else \
                "mma.sync" if rep.ptx_ops["mma.sync"] else ""
            rep.shared_bytes = int(getattr(kernel.metadata, "shared", 0) or 0)
            rep.registers, rep.spill_stores, rep.spill_loads = _ptxas_info(ptx, arch)
            rep.ok = True
        except Exception as exc:   # noqa: BLE001 - reported per kernel
            rep.error = f"{type(exc).__name__}: {str(exc).strip()[:1500]}"
        rep.compile_s = round(time.perf_counter() - t0, 2)
        return None

    _undo_interpreter_patches()
    _import_gluon()
    with tempfile.TemporaryDirectory(prefix="kforge-xcompile-") as tmp:
        path = Path(tmp) / f"{name}.py"          # @triton.jit needs a real file for its source
        path.write_text(source)
        interpret = os.environ.pop("TRITON_INTERPRET", None)   # real JITFunctions, not the interpreter's
        try:
            spec = importlib.util.spec_from_file_location(f"kforge_xcompile_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as exc:   # noqa: BLE001
            return [KernelReport(name, False,
                                 f"the source does not load: {type(exc).__name__}: {exc}")]
        finally:
            if interpret is not None:
                os.environ["TRITON_INTERPRET"] = interpret
        if not callable(module.__dict__.get("launch")):
            return [KernelReport(name, False, "the source defines no launch()")]
        args = [torch.empty(shape, dtype=TORCH_DTYPES[dtype], device="meta")
                for shape, dtype in arg_shapes]
        original = JITFunction.run
        JITFunction.run = compile_launch
        try:
            prepare = module.__dict__.get("prepare_weights")
            if callable(prepare) and weights:
                prepared = prepare({i: args[i] for i in weights})
                args = [prepared.get(i, a) for i, a in enumerate(args)]
            module.launch(*args)
        except Exception as exc:   # noqa: BLE001 - launch itself failed on meta tensors
            reports.append(KernelReport(name, False, f"launch() failed on meta tensors: "
                                        f"{type(exc).__name__}: {str(exc)[:500]}"))
        finally:
            JITFunction.run = original
    if not reports:
        reports.append(KernelReport(name, False, "launch() launched no Triton kernel"))
    return reports


# what Triton's interpreter replaces besides the language's builtins (triton/runtime/
# interpreter.py, _patch_lang): (owner, attribute) as the language had them when this module was
# imported, for _undo_interpreter_patches
_PLAIN_PATCHED = {
    "lang": ("range", "static_range", "static_assert", "static_print", "multiple_of",
             "max_contiguous", "max_constancy", "reduce", "associative_scan"),
    "tensor": ("__index__", "__bool__", "__repr__", "__str__", "T"),
    "dtype": ("to_ir",),
    "condition": ("__bool__",),
}
_ORIGINALS: dict = {}
_ABSENT = object()          # not an attribute of its own: the interpreter's is deleted


def _patch_owners() -> dict:
    import triton.language as tl
    core = tl.core
    return {"lang": (tl, core), "tensor": (core.tensor,), "dtype": (core.dtype,),
            "condition": (core.condition,)}


def _snapshot_language() -> None:
    """The attributes the interpreter patches, as they are now (at import: before any kernel of
    this process ran in the interpreter, in a normal run)."""
    try:
        owners = _patch_owners()
    except ImportError:
        return
    for kind, names in _PLAIN_PATCHED.items():
        for owner in owners[kind]:
            for name in names:
                value = owner.__dict__.get(name, _ABSENT)
                if value is _ABSENT or not _is_patch(value):
                    _ORIGINALS[(id(owner), name)] = value


def _is_patch(value) -> bool:
    return "interpreter" in getattr(value, "__module__", "") or \
        "_patch_" in getattr(value, "__qualname__", "") or \
        "_patch_" in getattr(getattr(value, "fget", None), "__qualname__", "")


def _undo_interpreter_patches() -> None:
    """Triton's interpreter replaces the builtins of `triton.language` (the module, `core`,
    `math`, the tensor and tensor-descriptor classes) and a few other attributes while it runs
    a kernel, and after some kernels (seen with the flash-attention kernel in one test process)
    leaves them replaced; a real compile in the same process then fails in the first builtin it
    meets (`tl.program_id`, or a tensor's `&`: "'block_argument' object has no attribute
    'dtype'"), or fails a broken source with another error than its own. Each replaced builtin
    keeps the original as its `member` default; the other attributes come from the snapshot
    taken when this module was imported."""
    import triton.language as tl
    core = tl.core
    for owner in (tl, core, tl.math, core.tensor, getattr(core, "tensor_descriptor_base", None)):
        if owner is None:
            continue
        for name, member in list(vars(owner).items()):
            if "_patch_attr" not in getattr(member, "__qualname__", ""):
                continue
            original = _unwrap_patch(member)
            if original is not None:
                setattr(owner, name, original)
    owners = _patch_owners()
    for kind, names in _PLAIN_PATCHED.items():
        for owner in owners[kind]:
            for name in names:
                original = _ORIGINALS.get((id(owner), name))
                current = owner.__dict__.get(name, _ABSENT)
                if original is None or current is original:
                    continue
                if original is _ABSENT:
                    if _is_patch(current):
                        delattr(owner, name)
                else:
                    setattr(owner, name, original)
    _undo_gluon_captures(tl, core)


def _unwrap_patch(member):
    """The builtin under an interpreter's replacement (its `member` default), through
    replacements of replacements (a kernel run while another's were in place); None where
    there is none."""
    while member is not None and "_patch_attr" in getattr(member, "__qualname__", ""):
        member = (getattr(member, "__kwdefaults__", None) or {}).get("member")
    return member


def _undo_gluon_captures(tl, core) -> None:
    """Gluon's language modules re-export builtins of triton.language (gl.exp, gl.sqrt,
    gl.reduce, ...), bound when Gluon is first imported. Triton imports Gluon to read a tensor
    descriptor's type, which happens while a TMA kernel runs in the interpreter: the modules
    then keep the interpreter's replacements for good, and a real compile of a Gluon kernel
    calling one fails ("Did you forget to add @triton.gluon.jit?"; seen once an interpreter
    test of a TMA kernel had run first, in a process with a cold Triton cache). Each is set back
    to the builtin it replaced (the language's own, restored above)."""
    if "triton.experimental.gluon.language._core" not in sys.modules:
        return                              # Gluon not imported (or not in this Triton)
    from triton.experimental.gluon.language._core import builtin
    for mname, mod in list(sys.modules.items()):
        if mod is None or not mname.startswith("triton.experimental.gluon.language"):
            continue
        for name, value in list(vars(mod).items()):
            inner = getattr(value, "__wrapped__", None)
            if inner is not None and "_patch_attr" in getattr(inner, "__qualname__", ""):
                # Gluon's own builtin() around the replacement (gl.exp = builtin(tl.math.exp))
                original = _unwrap_patch(inner)
                original = builtin(original) if original is not None else None
            elif "_patch_attr" in getattr(value, "__qualname__", ""):
                original = _unwrap_patch(value)
            elif _is_patch(value):
                original = next((o.__dict__[name] for o in (core, tl, tl.math)
                                 if name in o.__dict__ and not _is_patch(o.__dict__[name])),
                                None)
            else:
                continue
            if original is not None:
                setattr(mod, name, original)


_snapshot_language()


def _import_gluon() -> None:
    """Import Triton's Gluon (where this Triton has it) before a source that uses it loads.
    At its import Gluon wraps triton.language.standard's functions (cdiv, sum, max, ...) in
    its own JITFunctions, and asserts that they are JITFunctions unless the interpreter is on.
    Where triton.language was imported under TRITON_INTERPRET=1 (the test suite's processes)
    they are the interpreter's, so a first import of Gluon after the variable was cleared (a
    cross-compile) failed with a bare AssertionError: "the source does not load" for every
    Gluon kernel. The import sees the interpreter on there; Gluon's wrappers are its own
    JITFunctions of the same Python functions either way."""
    if "triton.experimental.gluon" in sys.modules:
        return
    try:
        import triton.language.standard as standard
        from triton.runtime.jit import JITFunction
    except ImportError:
        return
    saved = os.environ.get("TRITON_INTERPRET")
    if not isinstance(standard.cdiv, JITFunction):
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        pass
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def compile_candidate(source: str, spec, arch: int = 90, dynamic_size: int = 8,
                      name: str = "candidate", sass: bool = False) -> list[KernelReport]:
    """compile_source with a region's arguments: its spec's shapes (dynamic dimensions at
    `dynamic_size`), dtypes and weight arguments."""
    sig = signature_of(spec)
    return compile_source(source, [(list(a.concrete(dynamic_size)), a.dtype) for a in sig.args],
                          arch, name=name, weights=sig.weight_indices, sass=sass)


def candidate_job(source: str, spec, dynamic_size: int = 8, name: str = "candidate") -> dict:
    """A compile job (see Target.cross_compile) for one candidate of a region."""
    sig = signature_of(spec)
    return {"name": name, "source": source, "weights": tuple(sig.weight_indices),
            "args": [(list(a.concrete(dynamic_size)), a.dtype) for a in sig.args]}


def package_jobs(package, dynamic_size: int = 1024) -> dict[str, dict]:
    """One compile job (see Target.cross_compile) per kernel of an opened package."""
    from kforge.package import read_manifest
    jobs = {}
    for h, entry in read_manifest(package.root)["kernels"].items():
        spec = package.specs.get(h)
        if spec is None:
            continue
        sig = signature_of(spec)
        path = package.root / entry["source"]
        if not path.is_file():
            raise UserError(f"{package.root}: the manifest names the kernel of region {h} at "
                            f"{entry['source']}, which is missing: the package is incomplete "
                            "(copy it whole, or compile the model again)")
        jobs[h] = {"name": f"region_{h}", "source": path.read_text(),
                   "args": [(list(a.concrete(dynamic_size)), a.dtype) for a in sig.args],
                   "weights": tuple(sig.weight_indices)}
    return jobs


def compile_package(pkg: str | os.PathLike, target: str | None = None,
                    dynamic_size: int = 1024) -> dict[str, list[KernelReport]]:
    """Every kernel of a package compiled for `target` (cuda:sm_90, xpu:bmg, ...; default: the
    package's own target and architecture), dynamic dimensions at `dynamic_size`."""
    from kforge.package import open_package
    from kforge.targets import get_target
    package = open_package(pkg)
    recorded = package.meta.get("arch")
    if target is None:
        target = f"{package.target}:{recorded}" if recorded else package.target
    tgt = get_target(target)
    if tgt.name != package.target:
        raise UserError(f"{package.root} was compiled for {package.target}; its kernels are "
                        f"{package.target} kernels, so compile it for {package.target}[:ARCH], "
                        f"not {target} (or compile the model again with --target {target})")
    if tgt.name == "cuda" and not tgt.can_cross_compile():
        raise UserError(f"this Triton ({_triton_version()}) has no NVIDIA backend to compile "
                        "with")
    jobs = package_jobs(package, dynamic_size)
    reports = tgt.cross_compile(list(jobs.values()))
    return dict(zip(jobs, reports))
