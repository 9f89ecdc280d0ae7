"""Passes shared between a package's regions within one run of its plan.

A builtin kernel's operand pass (the fp16 planes and row scales of an activation, or its bf16
copy) is a function of its input tensors alone. Llama's Q, K and V projections are three regions
that each split the same normed activation, so a run would compute those planes three times.
A generated `launch` hands such a pass to `_shared_pass(key, inputs, run)` (the builtin's
host.SHARED_PASS: `key` is a digest of what the pass computes, whatever region it is in; `run()`
allocates its outputs and launches it). In a kernel module on its own that just calls `run()`.
`CompiledModel` rebinds the name to `shared_pass` below, which, while a plan runs
(`active_run`), returns the outputs of an earlier call with the same key on the same input
tensors (the same memory, shape, strides and dtype, and the same version counter: not written
since), and otherwise runs the pass and keeps its outputs.

Only the last `SIZE` outputs are kept (the passes of consecutive calls share; a held pass's
memory is a few activation-sized tensors at most), each with a reference to its inputs, so
their memory cannot be reused by a new tensor while the entry is held. Everything is dropped
when the run ends. KFORGE_SHARED_PASSES=0 turns sharing off.
"""
from __future__ import annotations

import contextlib
import os
import threading

SIZE = 2

_local = threading.local()


class PassCache:
    """The passes kept during one run of a plan, and how often they were served."""

    def __init__(self, size: int = SIZE):
        self.size = size
        self.entries: list[tuple] = []       # (key, inputs, their identity, outputs)
        self.hits = 0
        self.runs = 0

    @staticmethod
    def _identity(inputs) -> tuple:
        out = []
        for t in inputs:
            if hasattr(t, "data_ptr") and hasattr(t, "_version"):
                out.append((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype,
                            t.device, t._version))
            else:
                out.append(("value", t))
        return tuple(out)

    def serve(self, key: str, inputs: tuple, run):
        ident = self._identity(inputs)
        for i, (k, _, idn, outs) in enumerate(self.entries):
            if k == key and idn == ident:
                self.hits += 1
                self.entries.append(self.entries.pop(i))        # the most recent last
                return outs
        outs = run()
        self.runs += 1
        self.entries.append((key, tuple(inputs), ident, outs))
        del self.entries[:-self.size]
        return outs


def enabled() -> bool:
    return os.environ.get("KFORGE_SHARED_PASSES", "1") != "0"


def shared_pass(key: str, inputs: tuple, run):
    """A generated launch's `_shared_pass` inside a package's runtime."""
    cache = getattr(_local, "cache", None)
    if cache is None:
        return run()
    return cache.serve(key, inputs, run)


@contextlib.contextmanager
def active_run(cache: PassCache | None = None):
    """Passes are shared between the launches made inside this block (one run of a plan), then
    dropped. Nested blocks keep the outer one's cache."""
    if getattr(_local, "cache", None) is not None or not enabled():
        yield getattr(_local, "cache", None)
        return
    _local.cache = cache if cache is not None else PassCache()
    try:
        yield _local.cache
    finally:
        _local.cache.entries.clear()
        _local.cache = None


def bind(module) -> None:
    """Point a loaded kernel module's launch at `shared_pass` (where it has `_shared_pass`)."""
    launch = getattr(module, "launch", None)
    space = getattr(launch, "__globals__", None)
    if space is not None and "_shared_pass" in space:
        space["_shared_pass"] = shared_pass
