"""The Target interface and what all targets share."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from kforge.errors import UserError

# Kernel kinds the builtin provider generates (see docs/builtin-provider.md)
KERNEL_KINDS = ("elementwise", "rows", "gemm")


@dataclass(frozen=True)
class Peaks:
    """Peak throughputs used for roofline floors (FLOP/s per dot precision, bytes/s)."""
    fp32: float
    tf32: float
    bf16: float
    bytes_per_s: float

    def flops_for(self, precision: str) -> float:
        # strict: an fp32-accurate product costs three tensor-core products; the fastest such
        # scheme the builtin uses is fp16x3 (three 16-bit products, fp16 rate = bf16 rate),
        # so the floor is the faster of the 16-bit and TF32 rates over three. tf32: a TF32-grade
        # product is one 16-bit product of scaled fp16 operands (fp16x1), or one TF32 product.
        return {"strict": max(self.tf32, self.bf16) / 3, "tf32": max(self.tf32, self.bf16),
                "bf16": self.bf16}.get(precision, self.fp32)

    def floor_ms(self, flops: float, bytes_moved: float, precision: str) -> float:
        """The roofline floor: the slower of compute at peak and traffic at peak bandwidth."""
        compute = flops / self.flops_for(precision) if flops else 0.0
        memory = bytes_moved / self.bytes_per_s if bytes_moved else 0.0
        return max(compute, memory) * 1000


@dataclass(frozen=True)
class Arch:
    """One architecture of a backend, like the `arch` of Triton's GPUTarget, with what the
    builtin and the roofline need to know about the device."""
    name: str                   # "sm_90", "pvc", "bmg": what `--target BACKEND:NAME` spells
    device: str                 # the device this project assumes for it
    compute_units: int          # SMs (NVIDIA), Xe cores (Intel)
    peaks: Peaks
    shared_bytes: int           # shared memory / SLM per block
    properties: dict = field(default_factory=dict)   # the backend compiler's device properties
    source: str = ""            # where the figures come from


# Math functions that every Triton backend, the interpreter included, implements in core
# `tl`. Values are format strings over the operands.
CORE_MATH = {
    "math.exp": "tl.exp({0})", "math.exp2": "tl.exp2({0})", "math.log": "tl.log({0})",
    "math.log2": "tl.log2({0})", "math.sqrt": "tl.sqrt({0})", "math.rsqrt": "tl.rsqrt({0})",
    "math.erf": "tl.erf({0})", "math.sin": "tl.sin({0})", "math.cos": "tl.cos({0})",
    "math.absf": "tl.abs({0})", "math.absi": "tl.abs({0})", "math.floor": "tl.floor({0})",
    "math.ceil": "tl.ceil({0})", "math.sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
}
# (tl.sigmoid, tl.sum, tl.cdiv, tl.zeros... are @jit functions of triton.language: generated
# code avoids them, so that it also runs in an interpreter entered after triton was imported)


class Target:
    """One backend at one architecture: `Target(arch)` is Triton's GPUTarget(backend, arch,
    warp_size) plus the answers KForge needs from the vendor (is it here, how to time, its
    peaks, how to cross-compile for it, the builtin's configurations). Subclasses set the class
    attributes and override what differs."""
    name: str = "target"                # the backend: cuda | xpu | cpu
    device: str = "cpu"                 # torch device string
    interpreter: bool = False           # kernels run in the Triton interpreter
    warp_size: int = 1                  # threads per warp (NVIDIA) / sub-group (Intel)
    archs: dict = {}                    # name -> Arch; the first is the default
    bf16_dot_ok: bool = True            # False where bf16 tl.dot gives wrong results
    # False where bf16 arithmetic and comparisons give wrong results (the interpreter holds
    # bf16 as uint16): bf16 values are then held as fp32 rounded to bf16
    bf16_math_ok: bool = True
    math_imports: str = ""              # import lines the math spellings below need
    extra_math: dict = {}               # op -> format string, beyond CORE_MATH
    # op -> a faster, less exact spelling for fp32 values, used under the bf16 policy
    # (its tolerance is 1e-2; these err by about 5e-4 at most): KFORGE_BUILTIN_FASTMATH=0 off
    fast_math: dict = {}

    def __init__(self, arch: str | None = None):
        # `kforge compile --target xpu:bmg` sets KFORGE_XPU_ARCH for the whole process tree
        # (verifier workers included), since stages pass targets by backend name
        arch = arch or os.environ.get(f"KFORGE_{self.name.upper()}_ARCH") or next(iter(self.archs))
        if arch not in self.archs:
            raise UserError(f"unknown architecture {arch!r} for target {self.name}: choose one "
                            f"of {', '.join(self.archs)}")
        self.arch = arch

    @property
    def arch_info(self) -> Arch:
        return self.archs[self.arch]

    @property
    def peaks(self) -> Peaks:
        return self.arch_info.peaks

    @property
    def compute_units(self) -> int:
        return self.arch_info.compute_units

    @property
    def label(self) -> str:
        """`backend:arch`, as packages record it and `--target` accepts it."""
        return f"{self.name}:{self.arch}"

    # -- the device -----------------------------------------------------------------------
    def available(self) -> bool:
        """A device of this backend is visible to torch here."""
        return True

    def device_name(self) -> str:
        """The device's own name where it is here, else the architecture's assumed device."""
        return self.arch_info.device

    def device_info(self) -> dict:
        """What a benchmark report records about the device here ({} where it is absent)."""
        return {}

    def empty_cache(self) -> None:
        """Give the caching allocator's free blocks back (between benchmarks, after OOMs)."""

    # -- cross-compiling ------------------------------------------------------------------
    def can_cross_compile(self) -> bool:
        """Kernels can be compiled here for this target's architecture (no device needed)."""
        return False

    def cross_compile(self, jobs: list[dict]) -> list[list]:
        """Compile kernel sources for this architecture. jobs: {"name", "source", "args":
        [(shape, dtype)], "weights": argument indices}; one list of
        kforge.crosscompile.KernelReport per job."""
        raise UserError(f"target {self.name} has nothing to cross-compile: its kernels run "
                        "in the Triton interpreter")

    def screens_candidates(self) -> bool:
        """The builtin compiles its candidates for this target before proposing them: the
        device is absent and the compiler is here (KFORGE_XCOMPILE=0 turns it off)."""
        return (os.environ.get("KFORGE_XCOMPILE", "1") != "0" and not self.available()
                and self.can_cross_compile())

    def launch_options(self, config: dict) -> dict:
        """Backend-specific launch keywords that a builtin configuration carries."""
        return {}

    # -- precision ------------------------------------------------------------------------
    def dot_input_precisions(self, policy: str) -> tuple[str | None, ...]:
        """`tl.dot(input_precision=...)` values allowed for fp32 operands under `policy`,
        best first; None means operands are cast to bf16 (the bf16 policy)."""
        return {"strict": ("ieee",), "tf32": ("tf32",), "bf16": (None,)}[policy]

    # -- math -------------------------------------------------------------------------------
    def math(self, op: str) -> str | None:
        """Format string for a math op on this target, or None when it has none."""
        return self.extra_math.get(op) or CORE_MATH.get(op)

    # -- timing -----------------------------------------------------------------------------
    def time_ms(self, fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
        """Median wall-clock milliseconds of fn() (device targets override with events)."""
        fn()
        times = []
        deadline = time.perf_counter() + rep / 1000
        while len(times) < 3 or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
            if len(times) >= 50:
                break
        return statistics.median(times)

    def synchronize(self) -> None:
        pass

    # -- configurations -----------------------------------------------------------------------
    def configs(self, kind: str, problem: dict) -> list[dict]:
        """Triton configurations to try for a kernel of `kind`, best guess first.
        problem: sizes ({"numel"} | {"rows", "cols"} | {"M", "N", "K", "batch", "dtype_bytes"})
        and {"precision"}."""
        raise NotImplementedError

    # -- roofline -------------------------------------------------------------------------------
    def floor_ms(self, flops: float, bytes_moved: float, precision: str) -> float:
        """The roofline floor: the slower of compute at peak and traffic at peak bandwidth."""
        return self.peaks.floor_ms(flops, bytes_moved, precision)

    def describe(self) -> str:
        """A paragraph for prompts: what the kernels run on and what matters there."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Target {self.label}>"


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p
