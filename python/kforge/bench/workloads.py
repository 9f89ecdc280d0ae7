"""Workload files: KernelBench format (`Model`, `get_inputs`, `get_init_inputs`) plus, in ours,
`FULL`/`SMOKE` size dicts and `TAGS`; `get_inputs(scale="smoke")` gives the tiny CPU variant.
Files without the `scale` argument (plain KernelBench files) run at their only size."""
from __future__ import annotations

import fnmatch
import importlib.util
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

from kforge.errors import UserError

SCALES = ("full", "smoke")


def default_dir() -> Path:
    """benchmarks/workloads of this checkout, or $KFORGE_WORKLOADS."""
    env = os.environ.get("KFORGE_WORKLOADS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "benchmarks" / "workloads"


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path

    def module(self):
        spec = importlib.util.spec_from_file_location(f"kforge_workload_{self.name}", self.path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            raise UserError(f"workload {self.path}: cannot be imported: {exc}") from exc
        for attr in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(mod, attr):
                raise UserError(f"workload {self.path}: missing `{attr}` (KernelBench format needs "
                                "Model, get_inputs and get_init_inputs)")
        return mod

    def tags(self) -> tuple[str, ...]:
        return tuple(getattr(self.module(), "TAGS", ()))

    def instantiate(self, scale: str, device: str, seed: int = 0):
        """(model, inputs) on `device`: weights drawn under `seed`, inputs under seed + 1."""
        import torch

        mod = self.module()
        torch.manual_seed(seed)
        model = mod.Model(*_call_sized(mod.get_init_inputs, scale)).eval().to(device)
        return model, self.inputs(scale, device, seed + 1, mod)

    def inputs(self, scale: str, device: str, seed: int, mod=None):
        """Fresh inputs drawn under `seed` (used for correctness checks)."""
        import torch

        mod = mod or self.module()
        torch.manual_seed(seed)
        return [t.to(device) if isinstance(t, torch.Tensor) else t
                for t in _call_sized(mod.get_inputs, scale)]


def _call_sized(fn, scale: str):
    if "scale" in inspect.signature(fn).parameters:
        return fn(scale=scale)
    return fn()


def discover(selectors: list[str] | None, root: Path | None = None) -> list[Workload]:
    """Workloads named by `selectors`: names in the suite folder, glob patterns over those names
    (`gemm_*`), files, or folders. No selector means the whole suite folder."""
    root = root or default_dir()
    suite = {p.stem: p for p in sorted(root.glob("*.py")) if not p.name.startswith("_")}
    if not selectors:
        if not suite:
            raise UserError(f"no workload files in {root}")
        return [Workload(n, p) for n, p in suite.items()]
    found: dict[str, Path] = {}
    for sel in selectors:
        path = Path(sel)
        if path.is_dir():
            found.update({p.stem: p for p in sorted(path.glob("*.py")) if not p.name.startswith("_")})
        elif path.suffix == ".py" and path.is_file():
            found[path.stem] = path
        else:
            names = fnmatch.filter(suite, sel)
            if not names:
                raise UserError(f"no workload matches {sel!r} in {root} (known: "
                                f"{', '.join(list(suite)[:8])}...; `kforge bench --list` lists all)")
            found.update({n: suite[n] for n in names})
    return [Workload(n, p) for n, p in found.items()]


def shard(workloads: list[Workload], index: int, count: int) -> list[Workload]:
    """Every count-th workload from index: shards of one suite run on several GPUs. End-to-end
    workloads (tag `transformer`) are dealt first, so that they open shard 0, 1, ...: a run
    cut short by its time budget still measures them."""
    if not 0 <= index < count:
        raise UserError(f"--shard {index}/{count}: index must be in [0, {count})")
    ordered = sorted(workloads, key=lambda w: "transformer" not in w.tags())
    return ordered[index::count]


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N)."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r}: expected I/N, e.g. 0/8") from None
    return index, count


def shards(workloads: list[Workload], specs: list[str]) -> list[Workload]:
    """The workloads of several shards ('I/N' each), in shard order, each once."""
    chosen: list[Workload] = []
    for text in specs:
        chosen += [w for w in shard(workloads, *parse_shard(text)) if w not in chosen]
    return chosen
