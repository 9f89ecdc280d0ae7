"""A shorter host path for the Triton launches of a package's kernels.

`kernel[grid](*args, **constexprs)` runs Triton's whole launch path every call: the argument
binder, the specialization key (a string built per call), the kernel cache lookup, the device
and stream queries, the global-value checks. On the H200 machine (2026-12-04, Triton 3.6) that
came to 41 us for a one-tensor-in split pass and 68 us for the persistent GEMM beside it, 176 us
for a bf16 GEMM package's `launch` whose GPU work is 68 us: step by step such a package ran at
the speed of its Python.

`fast_module(module)` gives a package kernel module's `launch` (and the other plain functions
of the module) a namespace in which each `@triton.jit` function is a `FastKernel`. Its first
launch for a launch site's key goes through Triton as before and keeps the `CompiledKernel` that
Triton returns; later launches with the same key call that compiled kernel's runner directly.
The key is what Triton specializes on for the arguments KForge's kernels pass: each tensor's
dtype, device and whether its address is 16-byte aligned, each int's value, each other
scalar's type, the value of each constexpr and of each other keyword argument (num_warps,
num_stages; a tensor passed by keyword keys by its kind, as above), and the grid. Anything
else (a grid function, an argument of another kind, a Triton whose compiled kernel does not
show the expected signature) takes Triton's path every time.

The kernels themselves still resolve their callees (helper `@triton.jit` functions) in the
module's own namespace, which is left unchanged. Changing Triton's knobs (debug, instrumentation)
after a key's first launch is not seen by that key. `KFORGE_FAST_LAUNCH=0` turns this off.
"""
from __future__ import annotations

import inspect
import os
import types

import torch


# compiled kernels kept per jit function (distinct keys: an int argument that changes every
# call would otherwise grow the table without end; past this, new keys take Triton's path)
MAX_KEYS = 64


def enabled() -> bool:
    return os.environ.get("KFORGE_FAST_LAUNCH", "1") != "0"


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.device, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return ("i", a)
    if isinstance(a, float):
        return float
    raise TypeError           # not a kind this path knows: Triton's own path


class FastKernel:
    """A `@triton.jit` function whose repeated launches skip Triton's per-call host work."""

    def __init__(self, fn):
        self.fn = fn
        self.params = list(inspect.signature(fn.fn).parameters.values())
        self.names = [p.name for p in self.params]
        # constexpr parameters are compiled in: their values, not their kinds, key a kernel
        kparams = getattr(fn, "params", None)
        self.constexpr = [bool(getattr(kp, "is_constexpr", False)) for kp in kparams] \
            if kparams and len(kparams) == len(self.params) else \
            ["constexpr" in str(p.annotation) for p in self.params]
        self.compiled: dict = {}
        self.slow_keys = 0          # launches that took Triton's path (first launches included)

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        if callable(grid):
            return self.fn[grid]

        def launch(*args, **kwargs):
            return self._launch(grid, args, kwargs)
        return launch

    def _values(self, args, kwargs):
        """Every parameter's value in signature order (Triton's bound arguments)."""
        rest = []
        for p in self.params[len(args):]:
            if p.name in kwargs:
                rest.append(kwargs[p.name])
            elif p.default is not inspect.Parameter.empty:
                rest.append(p.default)
            else:
                raise TypeError(f"missing argument {p.name}")
        return args + tuple(rest)

    def _launch(self, grid, args, kwargs):
        try:
            key = (tuple(grid),
                   tuple(sorted((k, _arg_key(v) if isinstance(v, torch.Tensor) else v)
                                for k, v in kwargs.items())),
                   tuple(("c", a) if const else _arg_key(a)
                         for a, const in zip(args, self.constexpr)))
            hash(key)
        except TypeError:
            self.slow_keys += 1
            return self.fn[grid](*args, **kwargs)
        hit = self.compiled.get(key)
        if hit is not None:
            run, grid3 = hit
            return run[grid3](*self._values(args, kwargs))
        self.slow_keys += 1
        kernel = self.fn[grid](*args, **kwargs)      # compiles if need be, and launches
        signature = getattr(getattr(kernel, "src", None), "signature", None)
        if hasattr(kernel, "__getitem__") and signature is not None \
                and len(signature) == len(self.params) and len(self.compiled) < MAX_KEYS:
            g = tuple(grid) + (1,) * (3 - len(grid))
            try:
                self._values(args, kwargs)
                self.compiled[key] = (kernel, g)
            except TypeError:
                pass
        return kernel


def fast_module(module) -> types.SimpleNamespace:
    """The module's plain functions (launch, prepare_weights, helpers) rebound to a namespace in
    which its jit functions are FastKernels; the module itself is not changed."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:                    # pragma: no cover - no triton
        return module
    space = dict(vars(module))
    for name, obj in list(space.items()):
        if isinstance(obj, JITFunction):
            space[name] = FastKernel(obj)
    for name, obj in list(space.items()):
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            fn = types.FunctionType(obj.__code__, space, obj.__name__, obj.__defaults__,
                                    obj.__closure__)
            fn.__kwdefaults__ = obj.__kwdefaults__
            fn.__doc__ = obj.__doc__
            space[name] = fn
    return types.SimpleNamespace(**space)
