"""Workload files: KernelBench format (`Model`, `get_inputs`, `get_init_inputs`) plus, in ours,
`FULL`/`SMOKE` size dicts and `TAGS`; `get_inputs(scale="smoke")` gives the tiny CPU variant.
Files without the `scale` argument (plain KernelBench files) run at their only size.

Two optional module attributes of ours:
* `VARIANTS = {"prefill": {"KFORGE_LLM_PHASE": "prefill"}, ...}`: one file, several workloads
  (`<file>.<variant>`), each run with those environment variables set while the module's
  functions run (and in the subprocesses that compile it). `FILE.py::VARIANT` selects one.
* `tokens_per_call()`: tokens one call processes (an LLM's batch x new tokens); the bench then
  reports tokens/s for every route.
"""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def scoped_environ(env: dict):
    """os.environ with `env` set for the duration; every variable restored (or unset) after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path
    env: tuple = ()     # (variable, value) pairs of a variant (VARIANTS), sorted

    def environment(self):
        """The variant's environment variables, set for the duration (restored after)."""
        return scoped_environ(dict(self.env))

    def module(self):
        spec = importlib.util.spec_from_file_location(
            f"kforge_workload_{self.name.replace('.', '_')}", self.path)
        mod = importlib.util.module_from_spec(spec)
        try:
            with self.environment():
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
        with self.environment():
            model = mod.Model(*_call_sized(mod.get_init_inputs, scale)).eval().to(device)
        return model, self.inputs(scale, device, seed + 1, mod)

    def inputs(self, scale: str, device: str, seed: int, mod=None):
        """Fresh inputs drawn under `seed` (used for correctness checks)."""
        import torch

        mod = mod or self.module()
        torch.manual_seed(seed)
        with self.environment():
            drawn = _call_sized(mod.get_inputs, scale)
        return [t.to(device) if isinstance(t, torch.Tensor) else t for t in drawn]

    def tokens_per_call(self, scale: str, mod=None) -> int | None:
        """The module's `tokens_per_call()` at `scale` (None where it has none)."""
        mod = mod or self.module()
        fn = getattr(mod, "tokens_per_call", None)
        if fn is None:
            return None
        with self.environment():
            return int(_call_sized(fn, scale))


def _variants(name: str, path: Path) -> list[Workload]:
    """The workloads of one file: itself, or one per entry of its VARIANTS."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"workload {path}: cannot be read: {exc}") from exc
    if "VARIANTS" not in text:                  # most files: no import needed
        return [Workload(name, path)]
    variants = getattr(Workload(name, path).module(), "VARIANTS", None)
    if not variants:
        return [Workload(name, path)]
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise UserError(f"workload {path}: VARIANTS must map a variant name to a dict of "
                        "environment variables")
    return [Workload(f"{name}.{v}", path, tuple(sorted((str(k), str(x)) for k, x in env.items())))
            for v, env in variants.items()]


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
        return [w for n, p in suite.items() for w in _variants(n, p)]
    found: dict[str, Workload] = {}

    def add(name: str, path: Path, only: str | None = None) -> None:
        ws = _variants(name, path)
        if only is not None:
            ws = [w for w in ws if w.name == f"{name}.{only}"]
            if not ws:
                raise UserError(f"{path}: no variant {only!r} (it has "
                                f"{', '.join(w.name for w in _variants(name, path))})")
        found.update({w.name: w for w in ws})

    for sel in selectors:
        file_part, _, variant = sel.partition("::")
        path = Path(file_part)
        if path.is_dir():
            for p in sorted(path.glob("*.py")):
                if not p.name.startswith("_"):
                    add(p.stem, p)
        elif path.suffix == ".py" and path.is_file():
            add(path.stem, path, variant or None)
        else:
            names = fnmatch.filter(suite, sel)
            if not names:
                raise UserError(f"no workload matches {sel!r} in {root} (known: "
                                f"{', '.join(list(suite)[:8])}...; `kforge bench --list` lists all)")
            for n in names:
                add(n, suite[n])
    return list(found.values())


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
