"""The bookkeeping one region's kernels share while they are generated: each kernel's
parameters, constexprs, body and launch (`Kernel`), the temporaries between kernels, the
weights that `prepare_weights` stores in another form, and the emitters (`Builder`).
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.emitter import Emitter, Scope, Val, is_float
from kforge.spec import GenericOp, KernelSpec


# the blocks a rows kernel's variables span (rows: [BLOCK_R, 1], cols: [1, BLOCK_C])
ROW, COL = ("BLOCK_R", "1"), ("1", "BLOCK_C")


@dataclass
class Kernel:
    name: str
    params: list[str]                 # pointer parameters, in call order
    tensors: list[str]                # the launch-side tensor expression for each parameter
    constexprs: dict                  # name -> value
    lines: list[str]
    grid: str
    num_warps: int
    num_stages: int | None = None
    comment: str = ""
    options: dict = field(default_factory=dict)     # backend launch keywords (xpu: grf_mode)
    outputs: list[str] = field(default_factory=list)  # the values it stores (last in tensors)
    # a pass whose outputs are a function of its inputs alone (an operand's fp16 planes or
    # bf16 copy): the package runtime may serve it from another region's launch on the same
    # inputs (host.assemble, kforge.passcache)
    shared: bool = False
    # the whole source of a kernel not written by the emitter (a @gluon.jit template:
    # kforge.providers.builtin.gluon); `lines` is then empty
    raw: str | None = None

    def source(self) -> str:
        if self.raw is not None:
            return self.raw
        sig = ", ".join(self.params + [f"{k}: tl.constexpr" for k in self.constexprs])
        head = ["@triton.jit", f"def {self.name}({sig}):"]
        if self.comment:
            head.append(f'    """{self.comment}"""')
        return "\n".join(head + self.lines) + "\n"

    def call(self, tensors: list[str] | None = None, name: str | None = None) -> str:
        tensors = self.tensors if tensors is None else tensors
        args = ", ".join(tensors + [f"{k}={v!r}" for k, v in self.constexprs.items()])
        opts = f", num_warps={self.num_warps}"
        if self.num_stages is not None:
            opts += f", num_stages={self.num_stages}"
        opts += "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"{name or self.name}[{self.grid}]({args}{opts})"


class Builder:
    """Shared bookkeeping for one region's kernels: pointer names, loads, emitters."""

    def __init__(self, spec: KernelSpec, target, precision: str):
        self.spec = spec
        self.target = target
        self.precision = precision
        self.kernels: list[Kernel] = []
        self.temporaries: dict[str, str] = {}       # value -> allocation expression
        # region arguments a TMA descriptor reads (16-byte aligned bases: host.assemble)
        self.descriptor_args: set[str] = set()
        self.split_sums: dict[str, int] = {}
        self.dot_loads: dict[str, set] = {}
        self.split_weights: set[str] = set()         # weights stored as tf32 hi/lo planes
        # fp16x3 / fp16x1 weights -> (their output-column dims, planes: 2 hi + lo, 1 hi alone)
        self.fp16_weights: dict[str, tuple[tuple, int]] = {}
        self.combiners: dict[str, None] = {}         # reduction combine functions to define
        self.math_used = False
        self.tma = False                             # in-kernel TMA descriptors
        self.gluon = False                           # a Gluon kernel (gluon.HEADER's imports)
        # a partner's weight read through its sibling's: weight -> (partner weight, rows a
        # block, N, K); prepare_weights interleaves their rows (host.PAIR_WEIGHTS)
        self.paired_weights: dict[str, tuple[str, int, int, int]] = {}
        # the GEMM kernel being built stores partial row reductions (kernels._build_stage,
        # PARTIAL): reduction result -> (its [M, parts] fp32 buffer, parts)
        self.gemm_partials: dict[str, tuple[str, int]] = {}
        # the rows kernel being built reduces those results from the partials
        self.rows_partials: dict[str, tuple[str, int]] = {}

    def snapshot(self) -> dict:
        """The bookkeeping so far, to undo a kernel that could not be generated."""
        return copy.deepcopy({k: v for k, v in vars(self).items()
                              if k not in ("spec", "target")})

    def restore(self, saved: dict) -> None:
        vars(self).update(saved)

    def pointers(self, extra: dict | None = None) -> dict[str, str]:
        ptrs = {a.name: a.name for a in self.spec.args}
        ptrs.update({v: f"{v}_tmp" for v in self.temporaries})
        ptrs.update(extra or {})
        return ptrs

    def emitter(self, kvars, columns=None) -> Emitter:
        em = Emitter(self.spec, self.target, kvars, self.pointers(), columns)
        em.split_sums = self.split_sums
        em.fast_math = self.precision == "bf16" and \
            os.environ.get("KFORGE_BUILTIN_FASTMATH", "1") != "0"
        em.widen16 = self.widen16
        em.demote64 = self.precision in ("bf16", "tf32") and \
            os.environ.get("KFORGE_BUILTIN_F64", "0") != "1"
        return em

    @property
    def widen16(self) -> bool:
        """A bf16 model's region under the bf16 policy (every float argument bf16): its
        intermediate values stay fp32 and are rounded to bf16 only where stored, as Inductor
        computes a bf16 model's fused ops. The model's literal arithmetic rounds after each op
        (torch-mlir writes that), and three fusions of the suite's bf16 models were then
        outside 1e-2 of eager fp32, as eager bf16 is (H100, 2026-12-07).
        KFORGE_BUILTIN_WIDEN16=0: round after each op, as the model is written."""
        floats = [a.dtype for a in self.spec.args if is_float(a.dtype)]
        return self.precision == "bf16" and bool(floats) and set(floats) == {"bf16"} \
            and os.environ.get("KFORGE_BUILTIN_WIDEN16", "1") != "0"

    def finish(self, em: Emitter, name: str, outputs: list[str], constexprs: dict, lines,
               grid: str, num_warps: int, num_stages=None, comment: str = "",
               out_params: dict | None = None, options: dict | None = None) -> Kernel:
        for t, how in em.loads.items():
            self.dot_loads.setdefault(t, set()).update(how)
        self.math_used |= em.math_used
        self.combiners.update(em.combiners_used)
        loaded = [a.name for a in self.spec.args if a.name in em.loads]
        loaded += [v for v in self.temporaries if v in em.loads]
        params = [em.pointers[t] for t in loaded]
        tensors = list(loaded)
        for o in outputs:
            params.append((out_params or {}).get(o, f"{o}_out"))
            tensors.append(o)
        k = Kernel(name, params, tensors, constexprs, lines, grid, num_warps, num_stages,
                   comment, dict(options or {}), list(outputs))
        self.kernels.append(k)
        return k

    def store(self, scope: Scope, em: Emitter, out: str, ptr: str, index: tuple, val: Val):
        t = self.spec.tensor(out)
        if em.widen16 and t.dtype == "bf16":
            val = Val(em.stored(val, t.dtype), val.deps, t.dtype)
        store_tile(scope, em, ptr, ix.ravel(index, t.shape), val)


def store_tile(scope: Scope, em: Emitter, ptr: str, offset: ix.Index, val: Val) -> None:
    """Store `val` at `ptr + offset`, masked to the kernel variables of both: a value that
    varies along a variable the offset does not (an N = 1 product's [BLOCK_M, BLOCK_N] tile
    stored at rm alone) is stored once, from its in-bounds elements, through a pointer
    broadcast to its block."""
    over = ix.variables(offset) | {v for v in val.deps if v in em.kvars}
    mask = em.mask_of(over)
    addr = em.address(ptr, offset, over)
    scope.emit(f"tl.store({addr}, {val.code}" + (f", mask={mask})" if mask else ")"))


def ops_comment(spec: KernelSpec, em: Emitter | None = None) -> str:
    names = list(em.ops_used) if em is not None else [
        op.name for op in spec.ops if isinstance(op, GenericOp)]
    return ", ".join(n for n in dict.fromkeys(names) if n != "linalg.fill") or "copy"
