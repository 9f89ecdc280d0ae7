"""The frontend's calls into `kforge-opt`: linalg statistics and region formation + export.

`kforge-opt` does the work (the C++ passes); this module only builds the command line, runs it
through `kforge.tools.run_tool` and reads back what it wrote. It adapts to the passes the
installed `kforge-opt` has, read from its `--help`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kforge.errors import UserError
from kforge.tools import kforge_opt, run_tool

OUTLINED_IR = "outlined.mlir"     # the input module after the pipeline, written into out_dir


@dataclass(frozen=True)
class RegionStats:
    """One function's linalg statistics, from `--kforge-print-region-stats=json=true`."""
    function: str
    linalg_ops: int
    contractions: int
    convolutions: int
    reductions: int
    elementwise: int
    flops: int
    ops: tuple[tuple[str, int], ...]     # (op name, count), sorted by name


def region_stats(mlir_path: str | os.PathLike) -> list[RegionStats]:
    """Runs `kforge-opt --kforge-print-region-stats` on a module (the IR is left unchanged)."""
    mlir_path = _existing(mlir_path)
    proc = run_tool([kforge_opt(), mlir_path,
                     "--kforge-print-region-stats=json=true to-stdout=true", "-o", os.devnull],
                    what=str(mlir_path))
    stats = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        stats.append(RegionStats(
            function=record["function"], linalg_ops=record["linalg_ops"],
            contractions=record["contractions"], convolutions=record["convolutions"],
            reductions=record["reductions"], elementwise=record["elementwise"],
            flops=record["flops"], ops=tuple(sorted(record.get("ops", {}).items()))))
    return stats


def form_regions(mlir_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Cuts a module into fusion regions and exports them into `out_dir`.

    Writes `out_dir/<hash>.mlir` + `<hash>.json` per region and `host_plan.json`
    (docs/kernel-spec.md), plus `out_dir/outlined.mlir`, the module after outlining.
    Returns `out_dir`.
    """
    mlir_path = _existing(mlir_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = kforge_opt()
    # Export into a fresh directory, then replace the previous run's region files: a failed run
    # leaves the old ones, and no stale region from an earlier version of the model survives.
    staging = Path(tempfile.mkdtemp(prefix=".regions-", dir=out_dir.parent))
    try:
        passes = _region_pass_flags(str(tool), staging)
        run_tool([tool, mlir_path, *passes, "-o", staging / OUTLINED_IR], what=str(mlir_path))
        for old in out_dir.iterdir():
            if _is_region_file(old.name):
                old.unlink()
        for new in staging.iterdir():
            os.replace(new, out_dir / new.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _is_region_file(name: str) -> bool:
    return name in (OUTLINED_IR, "host_plan.json") or \
        re.fullmatch(r"[0-9a-f]{16}\.(json|mlir)", name) is not None


def compile_half_missing() -> str:
    """Why this machine cannot compile models ('' when it can): torch-mlir absent, or a
    kforge-opt that cannot export regions."""
    try:
        import torch_mlir  # noqa: F401
    except ImportError:
        return "torch-mlir is not installed"
    if not supports_region_export():
        return "kforge-opt cannot export regions (build it with scripts/setup.sh)"
    return ""


def supports_region_export() -> bool:
    """Whether the installed kforge-opt can form and export regions (not only print stats)."""
    try:
        return bool(_kforge_opt_flags(str(kforge_opt())) & {"--kforge-export-regions",
                                                            "--kforge-pipeline"})
    except UserError:
        return False


def _region_pass_flags(tool: str, out_dir: Path) -> list[str]:
    flags = _kforge_opt_flags(tool)
    help_text = _kforge_opt_help(tool)
    if "--kforge-pipeline" in flags and "export-dir" in help_text:
        return [f"--kforge-pipeline=export-dir={out_dir}"]
    if "--kforge-export-regions" in flags:
        export = f"--kforge-export-regions=dir={out_dir}"
        if "--host-plan" in help_text:
            export += " host-plan=true"
        if "--kforge-pipeline" in flags:
            return ["--kforge-pipeline", export]
        if {"--kforge-form-regions", "--kforge-outline-regions"} <= flags:
            return ["--kforge-form-regions", "--kforge-outline-regions", export]
    raise UserError(f"{tool} cannot export regions yet (it has no --kforge-export-regions); "
                    "rebuild it from the current sources with `bash scripts/setup.sh`")


@lru_cache(maxsize=4)
def _kforge_opt_help(tool: str) -> str:
    return run_tool([tool, "--help"]).stdout


def _kforge_opt_flags(tool: str) -> set[str]:
    flags = set()
    for line in _kforge_opt_help(tool).splitlines():
        word = line.strip().split(" ", 1)[0].split("=", 1)[0]
        if word.startswith("--kforge-"):
            flags.add(word)
    return flags


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    return path


def read_region_specs(out_dir: str | os.PathLike) -> list[dict]:
    """The kernel specs in `out_dir`, as plain JSON objects, for reports (kforge.spec parses them
    into dataclasses for real use)."""
    specs = []
    for path in sorted(Path(out_dir).glob("*.json")):
        if path.name == "host_plan.json":
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{path}: unreadable kernel spec: {exc}") from None
        if record.get("schema") == "kforge.kernel-spec":
            specs.append(record)
    return specs
