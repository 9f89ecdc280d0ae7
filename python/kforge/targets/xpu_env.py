"""The environment that compiles kernels for Intel GPUs: a virtual environment of its own with
PyPI's `triton-xpu`, made on first use.

`triton-xpu` installs a module called `triton`, so it can never share an environment with the
CUDA Triton the rest of KForge imports; kernels are compiled in a subprocess of this
environment's Python (kforge/targets/_xpu_worker.py), which borrows torch (for meta tensors
only) from the main environment. Where it lives: $KFORGE_XPU_VENV, else
$XDG_CACHE_HOME/kforge/xpu-venv (~/.cache/kforge/xpu-venv).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kforge.errors import UserError

REQUIREMENT = "triton-xpu==3.3.0b1"      # the one release on PyPI (2025-03)
_STAMP = "kforge-xpu-env.json"          # written last: a half-made environment is made again


def venv_path() -> Path:
    if os.environ.get("KFORGE_XPU_VENV"):
        return Path(os.environ["KFORGE_XPU_VENV"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kforge" / "xpu-venv"


def _python(root: Path) -> Path:
    return root / "bin" / "python"


def ready() -> bool:
    """The environment exists, complete, for this REQUIREMENT (nothing is installed)."""
    root = venv_path()
    try:
        stamp = json.loads((root / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("requirement") == REQUIREMENT and _python(root).exists()


def ensure(progress=None) -> Path:
    """The environment's Python, making the environment first where it is missing: `python -m
    venv` with this interpreter's base Python, then `pip install triton-xpu`. A UserError says
    what failed (no network, no venv module, a full disk) and how to point at another place."""
    root = venv_path()
    if ready():
        return _python(root)
    import fcntl
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        lock = open(root.parent / f"{root.name}.lock", "w")
    except OSError as exc:
        raise UserError(_failed(root, ["mkdir", str(root.parent)], str(exc))) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # two processes making it at once
        if ready():
            return _python(root)
        if progress:
            progress(f"making the xpu compile environment at {root} ({REQUIREMENT}, ~650 MB)")
        base = getattr(sys, "_base_executable", None) or sys.executable
        steps = [[base, "-m", "venv", "--clear", str(root)],
                 [str(_python(root)), "-m", "pip", "install", "--disable-pip-version-check",
                  "-q", REQUIREMENT]]
        for cmd in steps:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise UserError(_failed(root, cmd, str(exc))) from None
            if proc.returncode != 0:
                raise UserError(_failed(root, cmd, (proc.stderr or proc.stdout)[-1500:]))
        (root / _STAMP).write_text(json.dumps({"requirement": REQUIREMENT}) + "\n")
    return _python(root)


def _failed(root: Path, cmd: list[str], why: str) -> str:
    return (f"could not make the xpu compile environment at {root}: `{' '.join(cmd)}` failed:\n"
            f"{why.strip()}\nIt needs PyPI (pip install {REQUIREMENT}) once; set "
            "KFORGE_XPU_VENV to put it elsewhere, or to an environment made by hand with "
            f"`python3.11 -m venv DIR && DIR/bin/pip install {REQUIREMENT}` (then create "
            f"DIR/{_STAMP} with {json.dumps({'requirement': REQUIREMENT})}).")


def compile_jobs(jobs: list[dict], arch: str, properties: dict, warp_size: int,
                 timeout_s: float = 1200) -> tuple[str, list[list[dict]]]:
    """Compile each job ({"name", "source", "args": [[shape, torch dtype name]], "weights"})
    in the xpu environment; (its triton version, one list of kernel report dicts a job)."""
    python = ensure()
    import torch
    request = {"torch_path": str(Path(torch.__file__).resolve().parent.parent), "arch": arch,
               "properties": properties, "warp_size": warp_size, "jobs": jobs}
    worker = Path(__file__).with_name("_xpu_worker.py")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "PYTHONHOME")}
    with tempfile.TemporaryDirectory(prefix="kforge-xpu-") as tmp:
        answer = Path(tmp) / "answer.json"
        try:
            proc = subprocess.run([str(python), str(worker), str(answer)],
                                  input=json.dumps(request), capture_output=True, text=True,
                                  timeout=timeout_s, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise UserError(f"compiling {len(jobs)} kernel source(s) for xpu:{arch} took more "
                            f"than {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not answer.exists():
            raise UserError(f"the xpu compile worker ({python}) failed:\n"
                            f"{(proc.stderr or proc.stdout)[-2000:]}")
        doc = json.loads(answer.read_text())
    return doc["triton_version"], doc["results"]
