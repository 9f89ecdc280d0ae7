"""Targets: one small object per backend (cuda, xpu, cpu) answering the same questions.

Shaped like Triton's own backends: adding a target touches one module. A target knows its
torch device, how to time a kernel, which Triton configurations to try per kernel kind, its
peak throughputs (for roofline floors), which `tl.dot` input precisions each precision policy
may use, how to spell math functions the Triton interpreter lacks, and how to describe itself
in a prompt.
"""
from __future__ import annotations

from kforge.errors import UserError
from kforge.targets.base import Arch, Peaks, Target

_TARGETS = {
    "cuda": "kforge.targets.cuda:CudaTarget",
    "xpu": "kforge.targets.xpu:XpuTarget",
    "cpu": "kforge.targets.cpu:CpuTarget",
}


def get_target(name: str, **kwargs) -> Target:
    """The target called `name`: a backend (cuda | xpu | cpu) at its default architecture, or
    `backend:arch` (cuda:sm_90, xpu:bmg, xpu:pvc)."""
    if isinstance(name, Target):
        return name
    backend, _, arch = str(name).partition(":")
    if arch:
        kwargs["arch"] = arch
    try:
        path = _TARGETS[backend]
    except KeyError:
        raise UserError(f"unknown target {name!r}: choose one of {', '.join(_TARGETS)}") from None
    import importlib
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def target_names() -> tuple[str, ...]:
    return tuple(_TARGETS)


def local_target() -> Target:
    """The first device target whose device is here (cuda, then xpu), else cpu (the
    interpreter): what runs when the user names none."""
    for name in _TARGETS:
        target = get_target(name)
        if not target.interpreter and target.available():
            return target
    return get_target("cpu")


def split_target(name: str) -> tuple[str, str | None]:
    """("xpu", "bmg") for "xpu:bmg" after checking both; ("xpu", None) for "xpu"."""
    target = get_target(name)
    return target.name, (target.arch if ":" in str(name) else None)


__all__ = ["Arch", "Target", "Peaks", "get_target", "local_target", "split_target",
           "target_names"]
