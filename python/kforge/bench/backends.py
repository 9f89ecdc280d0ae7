"""The contenders: PyTorch eager, torch.compile, and a KForge package.

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
import subprocess
import sys
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
    if target == "cuda":
        import torch
        torch.cuda.synchronize()


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


def kforge_loaded(package: Path, model, target: str, precision: str, tune: bool,
                  tune_timeout_s: float) -> Contender:
    """A package compiled elsewhere: verify/tune it here (`kforge tune PKG`), then kforge.load."""
    build_record = package.parent / f"{package.name}.build.json"   # from kforge.bench.packages
    record = {}
    if build_record.is_file():
        try:
            record = json.loads(build_record.read_text())
        except (OSError, ValueError):
            record = {}
    if record.get("status") == "failed":
        tail = " | ".join(record.get("log_tail", [])[-2:])
        raise ContenderUnavailable(f"`kforge compile` failed when the package was built "
                                   f"(exit {record.get('returncode')}): {tail}"[:500])
    if not package.exists():
        raise ContenderUnavailable(f"no package at {package} (build it with benchmarks/build_packages.sh)",
                                   "skipped")
    load_fn = _kforge_api("load")
    summary = package_summary(package)
    build_s = record.get("compile_s", summary.get("compile_s"))
    tune_s = None
    if tune:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "kforge.cli", "tune", str(package)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=tune_timeout_s,
                                  env=kforge_env())
        except subprocess.TimeoutExpired as exc:
            raise ContenderUnavailable(f"`kforge tune` took over {tune_timeout_s:.0f}s") from exc
        tune_s = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ContenderUnavailable(f"`kforge tune {package.name}` exited {proc.returncode}: "
                                       + " | ".join(tail)[:400])
        summary = package_summary(package)      # tuning records verification in the package
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


def package_summary(package: "Path | str | None") -> dict:
    """Regions, verified kernels and recorded compile time from a package's manifest and report
    (read defensively: fields the package does not have are left out)."""
    if not package:
        return {}
    package = Path(package)
    out: dict = {}
    manifest = package / "manifest.json"
    if manifest.is_file():
        try:
            kernels = json.loads(manifest.read_text()).get("kernels", {})
            status = [k.get("verification", {}).get("status") for k in kernels.values()]
            out["kernels"] = len(kernels)
            out["kernels_verified"] = sum(1 for s in status if s == "verified")
        except (OSError, ValueError, AttributeError):
            out["manifest_error"] = "unreadable manifest.json"
    for name in ("report.json", "package.json"):
        path = package / name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for key in ("compile_s", "compile_seconds", "elapsed_s"):
                if isinstance(data.get(key), (int, float)):
                    out["compile_s"] = float(data[key])
                    break
            if isinstance(data.get("regions"), list):
                out.setdefault("regions", len(data["regions"]))
    return out


def _package_path(compiled, workdir: Path) -> str | None:
    for attr in ("package", "package_dir", "path"):
        value = getattr(compiled, attr, None)
        if value:
            return str(value)
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
