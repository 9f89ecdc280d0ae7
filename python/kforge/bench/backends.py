"""The contenders: PyTorch eager, torch.compile, and a KForge package (the routes PyTorch
offers at each precision, built from these, are in kforge.bench.routes).

Each is turned into a `Contender`: a callable over the workload's inputs plus how long it took
to get it (compile time). A contender that cannot be built raises `ContenderUnavailable` with a
reason; the runner records the reason instead of a time. KForge packages come either from
`kforge.compile(...)` in this process, or from a folder compiled elsewhere (`--packages`), loaded
with `kforge.load(PKG, module)` and verified/tuned on this machine first (`kforge tune PKG`).
"""
from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# DESIGN.md, "Precision policies": tolerance of the check against the fp32 reference; the
# verifier's table is the source of truth where that stage is present.
# Policy name -> (atol, rtol).
try:
    from kforge.verify.policy import POLICIES as _POLICIES
    TOLERANCE = {name: (p.atol, p.rtol) for name, p in _POLICIES.items()}
except ImportError:
    TOLERANCE = {"strict": (1e-4, 1e-4), "tf32": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)}


class ContenderUnavailable(Exception):
    """A contender could not be built or run here; the message is the reason recorded.
    status: "skipped" when it is absent here (no package, stage not installed), "failed" when
    building it went wrong (compile, tune or load raised)."""

    def __init__(self, reason: str, status: str = "failed"):
        super().__init__(reason)
        self.status = status


@dataclass
class Contender:
    name: str
    fn: Callable
    compile_s: float | None = None      # total time to get a runnable version on this machine
    info: dict = field(default_factory=dict)


def _sync(target: str):
    from kforge.targets import get_target
    get_target(target).synchronize()


def eager(model) -> Contender:
    return Contender("eager", model, compile_s=0.0)


def torch_compile(model, inputs, target: str, mode: str | None) -> Contender:
    """torch.compile (Inductor); compile time is the first call, which compiles."""
    import torch

    try:
        compiled = torch.compile(model, mode=mode)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs)
        _sync(target)
        return Contender("torch.compile", compiled, compile_s=time.perf_counter() - t0,
                         info={"mode": mode or "default"})
    except Exception as exc:  # Inductor needs a C++ compiler on CPU, Triton on GPU...
        raise ContenderUnavailable(f"torch.compile failed: {type(exc).__name__}: {_first_line(exc)}") from exc


def _kforge_api(name: str):
    try:
        import kforge
    except ImportError as exc:
        raise ContenderUnavailable(f"kforge is not importable: {exc}", "skipped") from exc
    fn = getattr(kforge, name, None)
    if fn is None:
        raise ContenderUnavailable(f"kforge.{name} is not available in this build (package/runtime "
                                   "stage missing)", "skipped")
    return fn


def _call_accepting(fn, args: tuple, required: dict, optional: dict):
    """Call fn(*args, **required) plus those `optional` keywords its signature names (the API is
    young; an output folder, say, is passed only where the function takes one)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    extra = {k: v for k, v in optional.items() if k in params}
    return fn(*args, **required, **extra)


def kforge_compiled(model, inputs, target: str, precision: str, provider: str,
                    workdir: Path) -> Contender:
    """Compile in this process through the Python API: kforge.compile(model, example_inputs, ...)."""
    compile_fn = _kforge_api("compile")
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        compiled = _call_accepting(
            compile_fn, (model, list(inputs)),
            dict(target=target, provider=provider, precision=precision),
            dict(out=str(workdir), output=str(workdir), package_dir=str(workdir),
                 workdir=str(workdir)))
    except ContenderUnavailable:
        raise
    except Exception as exc:
        raise ContenderUnavailable(f"kforge.compile failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    _sync(target)
    return Contender(f"kforge[{precision}]", compiled, compile_s=time.perf_counter() - t0,
                     info={"source": "kforge.compile", "package": _package_path(compiled, workdir),
                           **package_summary(_package_path(compiled, workdir))})


def kforge_loaded(package: Path, model, target: str, precision: str, tune: bool) -> Contender:
    """A package compiled elsewhere: verify (and tune) its candidate kernels on this machine,
    unless a parallel pre-pass already did (`python -m kforge.bench.packages --tune`, which
    leaves <workload>.tune.json beside the package), then bind it with kforge.load(PKG, module).
    Compile time = build time where it was compiled + tune time here + load time."""
    build = _read_json(package.parent / f"{package.name}.build.json")   # kforge.bench.packages
    if build.get("status") == "failed":
        tail = " | ".join(build.get("log_tail", [])[-2:])
        raise ContenderUnavailable(f"`kforge compile` failed when the package was built "
                                   f"(exit {build.get('returncode')}): {tail}"[:500])
    if not package.exists():
        raise ContenderUnavailable(f"no package at {package} (build it with benchmarks/build_packages.sh)",
                                   "skipped")
    load_fn = _kforge_api("load")
    summary = package_summary(package)
    build_s = build.get("compile_s", summary.get("compile_s"))
    pretune = _read_json(package.parent / f"{package.name}.tune.json")
    tune_s = pretune.get("tune_s")
    if tune:
        t0 = time.perf_counter()
        try:
            from kforge.package import open_package
            from kforge.runtime import pending_candidates, tune_package
            if pending_candidates(open_package(package), target):
                tune_package(package)
                tune_s = (tune_s or 0.0) + time.perf_counter() - t0
        except ImportError as exc:
            raise ContenderUnavailable(f"kforge's runtime cannot tune here: {exc}", "skipped") from exc
        except Exception as exc:
            raise ContenderUnavailable(f"tuning {package} failed: {type(exc).__name__}: "
                                       f"{_first_line(exc)}") from exc
        summary = package_summary(package)      # tuning records verification in the manifest
    t0 = time.perf_counter()
    try:
        fn = _call_accepting(load_fn, (str(package), model), {}, dict(target=target))
    except Exception as exc:
        raise ContenderUnavailable(f"kforge.load failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    load_s = time.perf_counter() - t0
    total = sum(x for x in (build_s, tune_s, load_s) if x is not None)
    return Contender(f"kforge[{precision}]", fn, compile_s=total,
                     info={"source": "package", "package": str(package), "build_s": build_s,
                           "tune_s": tune_s, "load_s": load_s, **summary})


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def package_summary(package: "Path | str | None") -> dict:
    """Regions, verified kernels and compile time from a package's manifest and report.json
    (read defensively: fields the package does not have are left out)."""
    if not package:
        return {}
    package = Path(package)
    out: dict = {}
    manifest = package / "manifest.json"
    if manifest.is_file():
        try:
            kernels = json.loads(manifest.read_text()).get("kernels", {})
            status = [(k.get("verification") or {}).get("status") for k in kernels.values()]
            out["kernels"] = len(kernels)
            out["kernels_verified"] = sum(1 for s in status if s == "verified")
            out["kernels_rejected"] = sum(1 for s in status if s == "rejected")
        except (OSError, ValueError, AttributeError):
            out["manifest_error"] = "unreadable manifest.json"
    report = package / "report.json"
    if report.is_file():
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            data = {}
        if isinstance(data.get("elapsed_s"), (int, float)):
            out["compile_s"] = float(data["elapsed_s"])
        summary = data.get("summary") or {}
        for key in ("regions", "verified", "candidate", "reference"):
            if isinstance(summary.get(key), int):
                out[f"regions_{key}" if key != "regions" else "regions"] = summary[key]
    return out


def _package_path(compiled, workdir: Path) -> str | None:
    package = getattr(compiled, "package", None)          # kforge.runtime.CompiledModel
    root = getattr(package, "root", package)
    if root:
        return str(root)
    return str(workdir) if (workdir / "manifest.json").exists() else None


def kforge_env() -> dict:
    """The environment for a `python -m kforge.cli` child: this kforge first on its path."""
    env = os.environ.copy()
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else ""
