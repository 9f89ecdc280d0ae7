"""GEMM + fused epilogue templates for the builtin Triton generator, one per precision policy.

    out[M, N] = epilogue(A[M, K] @ B[K, N] (+ bias[N]))         (fp32 accumulate, fp32 out)

`render_gemm(name, precision=..., epilogue=..., ...)` returns the Python source of a KForge
candidate (see kforge.providers.base.Candidate): Triton kernels, `prepare_weights(weights)` and
`launch(*args)`. The source needs only torch and triton (>= 3.6); it runs on CUDA (on Hopper
tl.dot lowers to wgmma; checked in the PTX on an H200) and under TRITON_INTERPRET=1 on the CPU.
Measurements and the reasons behind every default: benchmarks/gemm/NOTES.md.

Interface
---------
render_gemm(name, *, precision="strict", epilogue="", epilogue_args=(), has_bias=False,
            a_layout="mk", b_layout="nk", arg_order=None, impl=None, a_prep=None,
            config=None, acc_flush=None, tma=None) -> str

* A (the activation) is row-major [..., K] (a_layout "mk"; leading dims are flattened into M).
* B (the weight) is either [K, N] (b_layout "kn") or nn.Linear's [N, K] (b_layout "nk").
  `prepare_weights` always re-stores it K-major ([N, K] rows), in the form the scheme needs
  (fp32 [N, K]; fp32 or bf16 hi/lo planes [2, N, K]; fp16 scaled hi/lo [2, N, K + 2 rounded up to 16]; bf16
  [N, K]). `launch` expects that prepared form (the Candidate contract calls prepare_weights first).
* has_bias: a per-column vector `bias[N]` is added to acc (fp32) before the epilogue snippet.
* epilogue: Triton statements (one per line, no indentation needed) that update `acc`, the fp32
  [BLOCK_M, BLOCK_N] accumulator tile. In scope: `acc`, `offs_m` [BLOCK_M] and `offs_n`
  [BLOCK_N] (global row/column indices), `mask_m`, `mask_n`, `M`, `N`, `tl`, and each epilogue
  argument, already loaded (out-of-range lanes read 0):
      ("name", "col")    -> `name`: fp32 [BLOCK_N] vector, element n of a length-N tensor
      ("name", "row")    -> `name`: fp32 [BLOCK_M] vector, element m of a length-M tensor
      ("name", "tile")   -> `name`: fp32 [BLOCK_M, BLOCK_N] tile of an [M, N] tensor (any strides;
                            leading dims flattened like A's)
      ("name", "scalar") -> `name`: a Python float passed to the kernel
  e.g. has_bias=True, epilogue="acc = tl.maximum(acc, 0.0)" is Linear+ReLU. The same snippet runs
  in the GEMM kernel, the persistent TMA kernel and the split-K reduce kernel.
* arg_order: the order of launch's parameters by name ("a", "b", "bias", epilogue arg names);
  default: a, b, [bias], epilogue args in the order given. prepare_weights receives
  {index of "b": weight} and returns the prepared weight under the same index.
* Output: a new fp32 tensor a.shape[:-1] + (N,); launch returns (out,).
* precision: "strict" (fp32-accurate, atol=rtol=1e-4), "tf32", "bf16" (see DESIGN.md).
  impl picks the scheme inside a policy (defaults in DEFAULTS, measured):
      strict: "fp16x3" (default) A and B scaled by powers of two per row / per output column so
                that |x| < 2**15, split into fp16 hi + lo (B once in prepare_weights, A by a
                small Triton pass per call), acc += a_lo@b_hi + a_hi@b_lo + a_hi@b_hi on fp16
                tensor cores (11-bit significands like tf32, at twice the tf32 rate), scales
                undone exactly in the epilogue. Most accurate and fastest of the strict schemes.
              "3xtf32" tf32 hi/lo split (A in-kernel by bit rounding, B in prepare_weights),
                three tf32 products. As accurate, ~1.6x slower.
              "bf16x3" bf16 hi/lo, three bf16 products: ~4e-6 relative error, passes 1e-4 only on
                well-scaled data (fails U(-1,1) unscaled at K >= 8192): not a safe default.
              "tf32x3" / "tri-bf16x3" / "tri-bf16x6": Triton's built-in input_precision modes.
              "ieee": plain fp32 FMA (no tensor cores).
      tf32:   "tf32"      bf16: "bf16"
* a_prep: "kernel" (split/cast A inside the GEMM) or "pass" (a small Triton pass writes A's
  split/cast planes first: one read + one write of A, a cleaner main loop). fp16x3 needs "pass".
* acc_flush: for the split schemes, each K step's three products go to a fresh tensor-core
  accumulator that is then added to the running fp32 sum (default on: wgmma accumulation is not
  round-to-nearest, and chained over all of K its error grew ~linearly in K and failed 1e-4).
* tma: use the persistent kernel (one program per SM, tiles in grouped order, operands by TMA
  through host-side TensorDescriptors) when SPLIT_K == 1 and rows are 16-byte aligned; else the
  pointer kernel (cp.async pipelining, grouped order, optional split-K with a reduce kernel).
* bf16 scheme only, a second persistent kernel (`tma2`): descriptors made in the kernel, A cast by
  the pass or loaded fp32 and cast in registers, split-K as work items of the persistent loop, the
  epilogue stored by TMA in column slices. A config carrying TMA2_KEYS (EPI_SPLIT, A_FP32, WS,
  FLATTEN) runs it; the bf16 defaults do (H200 2026-12-03/04: its GEMM alone ran at 0.95-1.06 of
  cuBLAS bf16 for M >= 256; NOTES.md runs 5-7). Operands it cannot take (K % 8, N % 4) fall back
  to the kernels above with tiles of at most 128x128 and 3 stages.
* config: the default launch configuration baked into the source as CONFIG (a dict with BLOCK_M,
  BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages). `launch_with_config(cfg, *args)`
  runs with an explicit one (the tuner's entry point; no triton.autotune anywhere); `_run(args,
  cfg)` also returns the compiled kernels (for asm / register checks).

Configuration spaces: `config_space(precision, impl=None, M=None, tma=None)` (list of dicts;
split-K configs only for small M on the pointer kernel), `default_config(precision, impl, M, N, K,
tma)` (the measured best per shape class), `default_options(precision)` (impl, a_prep, tma).
"""
from __future__ import annotations

import re
import textwrap
from typing import Iterable, Sequence

from kforge.kernels import POW2_SOURCE

PRECISIONS = ("strict", "tf32", "bf16")
IMPLS = {
    "strict": ("fp16x3", "3xtf32", "bf16x3", "tf32x3", "ieee", "tri-bf16x3", "tri-bf16x6"),
    "tf32": ("tf32",),
    "bf16": ("bf16",),
}
DEFAULT_IMPL = {"strict": "fp16x3", "tf32": "tf32", "bf16": "bf16"}
# per impl: (a_prep, tma) that measured best on the H200 (NOTES.md, runs 2-4)
IMPL_OPTIONS = {
    "fp16x3": ("pass", False),
    "3xtf32": ("kernel", True),
    "bf16x3": ("pass", False),
    "tf32x3": ("kernel", False),
    "tri-bf16x3": ("kernel", False),
    "tri-bf16x6": ("kernel", False),
    "ieee": ("kernel", False),
    "tf32": ("kernel", True),
    "bf16": ("pass", True),
}
EPILOGUE_KINDS = ("col", "row", "tile", "scalar")


def default_options(precision: str) -> dict:
    """impl, a_prep and tma of the policy's default scheme."""
    impl = DEFAULT_IMPL[precision]
    a_prep, tma = IMPL_OPTIONS[impl]
    return {"impl": impl, "a_prep": a_prep, "tma": tma}


def _cfg(bm, bn, bk, warps, stages, group_m=8, split_k=1):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "SPLIT_K": split_k, "num_warps": warps, "num_stages": stages}


# the bf16 scheme's second persistent kernel (tma2) reads these extra keys; a config with them
# runs that kernel: EPI_SPLIT (epilogue column slices, 1/2/4), A_FP32 (cast A in registers
# instead of the pass), WS (Triton's Hopper warp specialization), FLATTEN (one pipeline over
# tiles and K steps; default: on unless WS)
TMA2_KEYS = ("EPI_SPLIT", "A_FP32", "WS", "FLATTEN")


def _t2(bm, bn, bk, warps, stages, epi_split, group_m=16, split_k=1, a_fp32=False,
        flatten=True):
    return dict(_cfg(bm, bn, bk, warps, stages, group_m, split_k), EPI_SPLIT=epi_split,
                A_FP32=a_fp32, WS=False, FLATTEN=flatten)


# Shared memory per stage = (A planes * BM + B planes * BN) * BK * bytes; a block gets at most
# 232448 B on the H200. The persistent TMA kernel also keeps the epilogue's layout-conversion
# scratch, so 128x256 tiles do not fit there (256x128 do). Tiles whose accumulators need more
# than 255 registers spill (128x256 with three split products).
_SPACES = {
    # (impl, tma): configs, best first
    ("fp16x3", False): [_cfg(128, 128, 64, 8, 3), _cfg(128, 128, 32, 8, 4), _cfg(64, 128, 64, 4, 3),
                        _cfg(128, 256, 32, 8, 3)],
    ("fp16x3", True): [_cfg(128, 128, 32, 8, 4), _cfg(64, 128, 64, 4, 3), _cfg(256, 128, 32, 8, 3)],
    ("bf16x3", False): [_cfg(128, 128, 64, 8, 3), _cfg(128, 128, 32, 8, 4), _cfg(128, 256, 32, 8, 3)],
    ("bf16x3", True): [_cfg(128, 128, 32, 8, 4), _cfg(128, 128, 64, 8, 3)],
    ("3xtf32", True): [_cfg(128, 128, 32, 8, 3), _cfg(128, 128, 16, 8, 4), _cfg(64, 128, 32, 4, 3)],
    ("3xtf32", False): [_cfg(128, 128, 32, 8, 3), _cfg(128, 128, 16, 8, 4), _cfg(128, 256, 16, 8, 3),
                        _cfg(128, 128, 32, 4, 3), _cfg(64, 128, 32, 4, 3)],
    ("tf32", True): [_cfg(256, 128, 32, 8, 3), _cfg(128, 128, 32, 8, 4), _cfg(64, 128, 32, 4, 4)],
    ("tf32", False): [_cfg(128, 256, 32, 8, 3), _cfg(128, 128, 32, 8, 3), _cfg(128, 128, 32, 8, 4),
                      _cfg(64, 128, 32, 4, 4), _cfg(128, 64, 32, 4, 4)],
    # bf16 persistent: tma2 first (H200 runs 5-6, 2026-12-03/04: 128x256 tiles with the epilogue
    # stored in 4 TMA slices fit 4 stages and beat the first kernel's 256x128 by 5-20% at
    # M >= 8192); WS is off everywhere: Triton 3.6's Hopper warp specialization failed to compile
    # this kernel or (128x128, one slice) returned wrong results
    ("bf16", True): [_t2(128, 256, 64, 8, 4, 4), _t2(128, 256, 64, 8, 3, 2), _t2(256, 128, 64, 8, 4, 4),
                     _cfg(256, 128, 64, 8, 3, 16), _t2(128, 128, 64, 8, 6, 2),
                     _t2(64, 128, 64, 4, 6, 1, a_fp32=True, flatten=False),
                     _cfg(128, 128, 64, 8, 3, 16), _cfg(128, 128, 64, 8, 4)],
    ("bf16", False): [_cfg(128, 256, 64, 8, 3), _cfg(128, 128, 64, 4, 4), _cfg(128, 128, 64, 8, 4),
                      _cfg(256, 128, 64, 8, 3), _cfg(64, 128, 64, 4, 4)],
    ("tf32x3", False): [_cfg(128, 64, 32, 4, 4), _cfg(128, 128, 32, 8, 3), _cfg(64, 128, 32, 4, 4)],
    ("tri-bf16x3", False): [_cfg(128, 64, 32, 4, 4), _cfg(128, 128, 32, 8, 3)],
    ("tri-bf16x6", False): [_cfg(128, 128, 32, 8, 3), _cfg(128, 64, 32, 4, 4)],
    ("ieee", False): [_cfg(128, 128, 32, 8, 3), _cfg(64, 128, 32, 4, 4)],
}


def _space_key(impl: str, tma: bool) -> tuple:
    return (impl, tma) if (impl, tma) in _SPACES else (impl, False)


def config_space(precision: str, impl: str | None = None, M: int | None = None,
                 tma: bool | None = None) -> list[dict]:
    """The configurations worth measuring for a scheme, best first (split-K added for M <= 512)."""
    impl = impl or DEFAULT_IMPL[precision]
    tma = IMPL_OPTIONS[impl][1] if tma is None else tma
    base = _SPACES[_space_key(impl, tma)]
    out = [dict(c) for c in base]
    if M is not None and M <= 512:
        if tma:          # the persistent kernel has no split-K: narrower tiles instead
            out += [dict(c, BLOCK_M=64, num_warps=4) for c in base[:2] if c["BLOCK_M"] == 128]
        for c in base[:2]:
            for sk in (2, 4):
                out.append(dict(c, SPLIT_K=sk))      # the pointer kernel, or tma2's work items
    return out


def default_config(precision: str, impl: str | None = None, M: int | None = None,
                   N: int | None = None, K: int | None = None, tma: bool | None = None) -> dict:
    """Measured best config per shape class (H200, 2026-11-30 and 2026-12-03/04 for the bf16
    persistent kernel, benchmarks/gemm/NOTES.md)."""
    impl = impl or DEFAULT_IMPL[precision]
    tma = IMPL_OPTIONS[impl][1] if tma is None else tma
    small = M is not None and M <= 512
    if impl == "tf32" and tma:
        big = M is not None and N is not None and M >= 1024 and N >= 8192
        return _cfg(256, 128, 32, 8, 3) if big else _cfg(128, 128, 32, 8, 4)
    if impl == "bf16" and tma:
        # tma2 (runs 5-6): M > 512: 128x256x64, 4 stages, epilogue in 4 TMA slices (0.88-0.99 of
        # cuBLAS bf16 against 0.67-0.91 for the first kernel's 256x128); M <= 512 (one wave of
        # 128x128 tiles at M=256): 6 stages, cast pass (20% less GPU time than the first kernel at
        # 256x8192x8192); M <= 128: A cast in registers (no pass: one launch instead of two, the
        # fastest end to end at 64x4096x4096 where the launches dominate)
        if M is not None and M <= 128:
            return _t2(64, 128, 64, 4, 6, 1, a_fp32=True, flatten=False)
        return _t2(128, 128, 64, 8, 6, 2) if small else _t2(128, 256, 64, 8, 4, 4)
    if impl == "bf16" and small:
        return _cfg(128, 128, 64, 4, 4)
    if impl == "tf32" and small:
        return _cfg(128, 256, 32, 8, 3, split_k=2)
    return dict(_SPACES[_space_key(impl, tma)][0])


# ----------------------------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------------------------

def _norm_epi_args(epilogue_args: Iterable) -> list[tuple[str, str]]:
    out = []
    for item in epilogue_args:
        if isinstance(item, dict):
            nm, kind = item["name"], item["kind"]
        else:
            nm, kind = item
        if kind not in EPILOGUE_KINDS:
            raise ValueError(f"epilogue arg {nm!r}: kind {kind!r} not in {EPILOGUE_KINDS}")
        if (not nm.isidentifier() or nm.startswith("_")
                or nm in ("a", "b", "bias", "acc", "M", "N", "K", "tl", "offs_m", "offs_n",
                          "mask_m", "mask_n", "split", "args", "cfg")):
            raise ValueError(f"bad epilogue arg name {nm!r}")
        out.append((nm, kind))
    return out


def _indent(code: str, n: int) -> str:
    code = textwrap.dedent(code).strip("\n")
    return textwrap.indent(code, " " * n) if code else ""


# Main-loop bodies. `a` is the loaded A tile (or planes), `b_ptrs` point at B's first plane.
def _flush(math: str) -> str:
    """Rewrite a dot chain `acc = tl.dot(x, y, acc, ...)` so that the tensor cores accumulate one
    K step only (into `part`, from zero) and the running sum is kept by exact fp32 adds.

    Why: wgmma accumulates with truncation inside the tensor core; chained over all of K that
    bias grows with K (measured on the H200: 3xtf32 chained reached 5.9e-5 max relative error at
    K=8192, failing 1e-4). Triton's own tf32x3 does the same per-step split."""
    out = []
    for line in math.splitlines():
        m = re.match(r"^(\s*)acc = tl\.dot\((\w+(?:\.to\(tl\.float32\))?), "
                     r"(\w+(?:\.to\(tl\.float32\))?), acc(.*)\)$", line)
        if not m:
            out.append(line)
            continue
        ind, x, y, rest = m.groups()
        if not (out and out[-1].startswith(ind + "part = tl.dot")):
            out.append(f"{ind}part = tl.dot({x}, {y}{rest})")
        else:
            out.append(f"{ind}part = tl.dot({x}, {y}, part{rest})")
    # acc += part after each branch's last dot
    res, n = [], len(out)
    for i, line in enumerate(out):
        res.append(line)
        if line.lstrip().startswith("part = tl.dot"):
            ind = line[:len(line) - len(line.lstrip())]
            nxt = out[i + 1] if i + 1 < n else ""
            if not nxt.startswith(ind + "part = tl.dot"):
                res.append(f"{ind}acc += part")
    return "\n".join(res)


def _loop_body(impl: str, a_prep: str) -> tuple[str, str]:
    """(loads, math) for one K step. Masks: A_MASK / B_MASK placeholders, filled by caller."""
    b1 = "tl.load(b_ptrs{BMASK})"
    b2 = "tl.load(b_ptrs + stride_bs{BMASK})"
    a1 = "tl.load(a_ptrs{AMASK})"
    a2 = "tl.load(a_ptrs + stride_as{AMASK})"
    if impl in ("tf32", "tf32x3", "ieee", "tri-bf16x3", "tri-bf16x6"):
        prec = {"tf32": "tf32", "tf32x3": "tf32x3", "ieee": "ieee",
                "tri-bf16x3": "bf16x3", "tri-bf16x6": "bf16x6"}[impl]
        if impl.startswith("tri-"):     # the interpreter knows only tf32/tf32x3/ieee
            return (f"a = {a1}\nb = {b1}",
                    'if DOT_F32:\n    acc = tl.dot(a, b, acc, input_precision="ieee")\n'
                    f'else:\n    acc = tl.dot(a, b, acc, input_precision="{prec}")')
        return (f"a = {a1}\nb = {b1}",
                f'acc = tl.dot(a, b, acc, input_precision="{prec}")')
    if impl == "bf16":
        loads = f"a = {a1}\nb = {b1}"
        if a_prep == "kernel":
            loads += "\na = a.to(tl.bfloat16)"
        math = ("if DOT_F32:\n"
                "    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=\"ieee\")\n"
                "else:\n"
                "    acc = tl.dot(a, b, acc)")
        return loads, math
    if impl == "3xtf32":
        if a_prep == "kernel":
            loads = (f"a = {a1}\nb_hi = {b1}\nb_lo = {b2}\n"
                     "# tf32 hi part: round to nearest at 10 mantissa bits (bits + 0x1000, mask 13)\n"
                     "a_hi = ((a.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000)"
                     ".to(tl.float32, bitcast=True)\n"
                     "a_lo = a - a_hi")
        else:
            loads = f"a_hi = {a1}\na_lo = {a2}\nb_hi = {b1}\nb_lo = {b2}"
        math = ('acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")\n'
                'acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")\n'
                'acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")')
        return loads, math
    if impl in ("bf16x3", "fp16x3"):
        if a_prep == "kernel":
            loads = (f"a = {a1}\nb_hi = {b1}\nb_lo = {b2}\n"
                     "a_hi = a.to(tl.bfloat16)\n"
                     "a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)")
        else:
            loads = f"a_hi = {a1}\na_lo = {a2}\nb_hi = {b1}\nb_lo = {b2}"
        math = ("if DOT_F32:\n"
                "    a_hi = a_hi.to(tl.float32)\n    a_lo = a_lo.to(tl.float32)\n"
                "    b_hi = b_hi.to(tl.float32)\n    b_lo = b_lo.to(tl.float32)\n"
                '    acc = tl.dot(a_lo, b_hi, acc, input_precision="ieee")\n'
                '    acc = tl.dot(a_hi, b_lo, acc, input_precision="ieee")\n'
                '    acc = tl.dot(a_hi, b_hi, acc, input_precision="ieee")\n'
                "else:\n"
                "    acc = tl.dot(a_lo, b_hi, acc)\n"
                "    acc = tl.dot(a_hi, b_lo, acc)\n"
                "    acc = tl.dot(a_hi, b_hi, acc)")
        return loads, math
    raise ValueError(f"unknown impl {impl!r}")


_TEMPLATE = '''\
"""KForge builtin GEMM kernel `{name}`: out = epilogue(A @ B{bias_txt}); precision policy {precision} ({impl}).

Generated by kforge.kernels.gemm.render_gemm. launch({launch_sig}) -> (out,)
A: [..., K] fp32 row-major; B: prepared by prepare_weights into {b_form}.
"""
import os

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: the pointer kernel only
    TensorDescriptor = None

PRECISION = "{precision}"
IMPL = "{impl}"
A_PREP = "{a_prep}"
B_LAYOUT = "{b_layout}"          # layout of the weight handed to prepare_weights
B_INDEX = {b_index}              # index of the weight among launch's arguments
CONFIG = {config}


@triton.jit
def {name}_epilogue(acc, offs_m, offs_n, M, N{epi_fparams}):
    mask_m = offs_m < M
    mask_n = offs_n < N
{epi_loads}
{epi_code}
    return acc


@triton.jit
def {name}_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of tile `tile_id` in grouped order: GROUP_M row tiles share each
    column of B while it is in L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n

{prep_kernel}
@triton.jit
def {name}_kernel(
    a_ptr, b_ptr, c_ptr{epi_params},
    M, N, K,
    stride_am, stride_ak, stride_as,
    stride_bn, stride_bk, stride_bs,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_k = tl.program_id(1)
    pid_m, pid_n = {name}_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # loads wrap at the edges (% M, % N) so that only the store is masked
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
{loads_even}
        else:
            k_left = K - k * BLOCK_K * SPLIT_K
{loads_masked}
{math}
        a_ptrs += BLOCK_K * SPLIT_K * stride_ak
        b_ptrs += BLOCK_K * SPLIT_K * stride_bk

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        acc = {name}_epilogue(acc, offs_m, offs_n, M, N{epi_call})
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:
        # partial sums to the fp32 workspace [SPLIT_K, M, N]; the reduce kernel finishes
        c_ptrs = (c_ptr + pid_k.to(tl.int64) * M * N
                  + offs_m[:, None] * N + offs_n[None, :])
        tl.store(c_ptrs, acc, mask=c_mask)

{tma_kernel}
{tma2_kernel}
@triton.jit
def {name}_splitk_reduce(
    w_ptr, c_ptr{epi_params}, M, N, stride_ws, stride_cm, stride_cn,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    w_ptrs = w_ptr + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(w_ptrs + split * stride_ws, mask=c_mask, other=0.0)
    acc = {name}_epilogue(acc, offs_m, offs_n, M, N{epi_call})
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def prepare_weights(weights):
    """Called once at load: re-store the weight K-major ([N, K]) in the form {impl} needs."""
    out = dict(weights)
    w = weights[B_INDEX]
    w = w.t() if B_LAYOUT == "kn" else w          # now [N, K]
    w = w.to(torch.float32).contiguous()
{prep_weight}
    out[B_INDEX] = w
    return out


def _interpreting():
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


USE_TMA = {use_tma}
B_PAD = {b_pad}                  # the prepared weight's rows carry 2 extra columns (scales)


def _b_width(K):
    return ((K + 2 + 15) // 16) * 16 if B_PAD else K
_SMS = {{}}


def _num_sms(device):
    if device.type != "cuda":
        return 4
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def _tma_ok(a_in, b, K):
    """TMA needs 16-byte aligned base and row pitch."""
    return (TensorDescriptor is not None and (K * a_in.element_size()) % 16 == 0
            and (b.stride(-2) * b.element_size()) % 16 == 0 and a_in.data_ptr() % 16 == 0
            and b.data_ptr() % 16 == 0 and a_in.is_contiguous() and b.is_contiguous())
{tma2_helpers}

def _run(args, cfg):
    """Launch with an explicit config; returns (out, [compiled kernels])."""
{unpack}
    K = a.shape[-1]
    lead = a.shape[:-1]
    a2 = a.reshape(-1, K)
    if a2.stride(-1) != 1:
        a2 = a2.contiguous()
    M = a2.shape[0]
    N = b.shape[-2]
    assert b.shape[-1] == _b_width(K), "weight not prepared (expected K-major [N, K])"
    out = torch.empty((M, N), device=a.device, dtype=torch.float32)
    if M == 0 or N == 0:
        return out.reshape(*lead, N), []
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    SK = cfg.get("SPLIT_K", 1)
    kernels = []
{epi_host}
{tma2_host}{a_prep_code}
    stride_bs = b.stride(0) if b.dim() == 3 else 0
    if USE_TMA and SK == 1 and _tma_ok(a_in, b, K):
        nsm = _num_sms(a.device)
        n_tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
        a_desc = TensorDescriptor.from_tensor(a_in.reshape(-1, K), [BM, BK])
        b_desc = TensorDescriptor(b, shape=[b.numel() // b.shape[-1], K], strides=[b.stride(-2), 1],
                                  block_shape=[BN, BK])
        k1 = {name}_tma_kernel[(min(nsm, n_tiles),)](
            a_desc, b_desc, out{epi_launch}, M, N, K, out.stride(0), out.stride(1),
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.get("GROUP_M", 8), NUM_SMS=nsm,
            DOT_F32=_interpreting(), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        kernels.append(k1)
        return out.reshape(*lead, N), kernels
    c = out if SK == 1 else torch.empty((SK, M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN), SK)
    k1 = {name}_kernel[grid](
        a_in, b, c{epi_launch},
        M, N, K,
        a_in.stride(-2), a_in.stride(-1), stride_as,
        b.stride(-2), b.stride(-1), stride_bs,
        c.stride(-2), c.stride(-1),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.get("GROUP_M", 8), SPLIT_K=SK,
        EVEN_K=(K % (BK * SK) == 0), DOT_F32=_interpreting(),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    kernels.append(k1)
    if SK > 1:
        RM, RN = 32, 128
        k2 = {name}_splitk_reduce[(triton.cdiv(M, RM), triton.cdiv(N, RN))](
            c, out{epi_launch}, M, N, M * N, out.stride(0), out.stride(1),
            SPLIT_K=SK, BLOCK_M=RM, BLOCK_N=RN, num_warps=4,
        )
        kernels.append(k2)
    return out.reshape(*lead, N), kernels


def launch_with_config(cfg, {launch_sig}):
    return (_run(({launch_sig}), cfg)[0],)


def launch({launch_sig}):
    return (_run(({launch_sig}), CONFIG)[0],)
'''

_TMA_KERNEL = '''
@triton.jit
def {name}_tma_kernel(
    a_desc, b_desc, c_ptr{epi_params}, M, N, K, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, DOT_F32: tl.constexpr,
):
    """Persistent: one program per SM walks tiles in grouped order; A and B tiles arrive by TMA
    (descriptors over [planes * M, K] and [planes * N, K]; a lo plane starts M (N) rows down)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = {name}_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
{loads}
{math}
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = {name}_epilogue(acc, offs_m, offs_n, M, N{epi_call})
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)

'''


# bf16 policy, second persistent kernel ("tma2"): descriptors made in the kernel
# (tl.make_tensor_descriptor), fp32 A either cast by the pass (A_FP32=False) or loaded fp32 by
# TMA and cast in registers (A_FP32=True: no extra pass over A), split-K over the persistent work
# list for small M, the epilogue in EPI_SPLIT column slices each stored by TMA (the slice's
# staging buffer is 1/EPI_SPLIT of the tile, which lets 128x256 tiles keep 3-4 stages), and
# Triton's warp specialization of the tile loop as an option (WS).
_TMA2_KERNEL = """
@triton.jit
def {name}_tma2_store(c_desc, acc, row0, off_m, off_n, M, N{epi_params},
                      SPLIT_K: tl.constexpr):
    # one column slice: the epilogue (SPLIT_K == 1) or the raw partial sum (split-K workspace)
    if SPLIT_K == 1:
        offs_m = off_m + tl.arange(0, acc.shape[0])
        offs_n = off_n + tl.arange(0, acc.shape[1])
        acc = {name}_epilogue(acc, offs_m, offs_n, M, N{epi_call})
    c_desc.store([row0 + off_m, off_n], acc)


@triton.jit
def {name}_tma2_kernel(
    a_ptr, b_ptr, c_ptr{epi_params}, M, N, K, M_PAD,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EPI_SPLIT: tl.constexpr, A_FP32: tl.constexpr, WS: tl.constexpr,
    FLATTEN: tl.constexpr, NUM_SMS: tl.constexpr, DOT_F32: tl.constexpr,
):
    \"\"\"Persistent: one program per SM walks (tile, K-split) work items, tiles in grouped order.
    A [M, K] (fp32 or bf16) and B [N, K] bf16 arrive by TMA; the output (or, for SPLIT_K > 1, the
    fp32 workspace [SPLIT_K, M_PAD, N], M_PAD = M rounded up to BLOCK_M, that the reduce kernel
    finishes) leaves by TMA (2-d descriptors only: Hopper's warp specialization pass rejected a
    3-d store).\"\"\"
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    SUB_N: tl.constexpr = BLOCK_N // EPI_SPLIT
    c_rows = M if SPLIT_K == 1 else SPLIT_K * M_PAD
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[c_rows, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, SUB_N])
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    num_tiles = num_pid_m * num_pid_n
    # FLATTEN: one software pipeline over (work item, K step), so the next tile's loads are in
    # flight during this tile's epilogue (Hopper's warp specialization wants it off)
    for work_id in tl.range(start_pid, num_tiles * SPLIT_K, NUM_SMS, flatten=FLATTEN,
                            warp_specialize=WS):
        tile_id = work_id // SPLIT_K
        split = work_id % SPLIT_K
        pid_m, pid_n = {name}_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        k_lo = split * k_per_split
        k_hi = min(k_lo + k_per_split, k_tiles)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_lo, k_hi):
            off_k = ki * BLOCK_K
            a = a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T
            if DOT_F32:    # the interpreter has no bf16 dot
                acc = tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.float32), acc,
                             input_precision="ieee")
            elif A_FP32:   # cast in registers, wgmma takes A from registers
                acc = tl.dot(a.to(tl.bfloat16), b, acc)
            else:
                acc = tl.dot(a, b, acc)
        out_split = split * M_PAD       # first workspace row of this split (0 if SPLIT_K == 1)
        if EPI_SPLIT == 1:
            {name}_tma2_store(c_desc, acc, out_split, off_m, off_n, M, N{epi_call}, SPLIT_K)
        else:
            h0, h1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            if EPI_SPLIT == 2:
                {name}_tma2_store(c_desc, h0, out_split, off_m, off_n, M, N{epi_call}, SPLIT_K)
                {name}_tma2_store(c_desc, h1, out_split, off_m, off_n + SUB_N, M, N{epi_call},
                                  SPLIT_K)
            else:          # EPI_SPLIT == 4
                q0, q1 = tl.split(tl.permute(tl.reshape(h0, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
                {name}_tma2_store(c_desc, q0, out_split, off_m, off_n, M, N{epi_call}, SPLIT_K)
                {name}_tma2_store(c_desc, q1, out_split, off_m, off_n + SUB_N, M, N{epi_call},
                                  SPLIT_K)
                q2, q3 = tl.split(tl.permute(tl.reshape(h1, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
                {name}_tma2_store(c_desc, q2, out_split, off_m, off_n + 2 * SUB_N, M, N{epi_call},
                                  SPLIT_K)
                {name}_tma2_store(c_desc, q3, out_split, off_m, off_n + 3 * SUB_N, M, N{epi_call},
                                  SPLIT_K)

"""

# host side of the tma2 kernel, inside _run (rendered for the bf16 scheme only)
_TMA2_HOST = """\
    if "EPI_SPLIT" in cfg and _tma2_ok(a2, b, K, N):
        SK = cfg.get("SPLIT_K", 1)
        if cfg["A_FP32"]:
            a_in = a2
        else:
            a_in = torch.empty((M, K), device=a.device, dtype=torch.bfloat16)
            PB = 2048
            kernels.append({name}_prep_a[(triton.cdiv(M * K, PB),)](a2, a_in, M * K, BLOCK=PB,
                                                                  MODE=2, num_warps=8))
        M_PAD = triton.cdiv(M, BM) * BM
        c = out if SK == 1 else torch.empty((SK, M_PAD, N), device=a.device, dtype=torch.float32)
        n_work = triton.cdiv(M, BM) * triton.cdiv(N, BN) * SK
        nsm = _num_sms(a.device)
        _set_allocator()
        kernels.append({name}_tma2_kernel[(min(nsm, n_work),)](
            a_in, b, c{epi_launch}, M, N, K, M_PAD,
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.get("GROUP_M", 8), SPLIT_K=SK,
            EPI_SPLIT=cfg["EPI_SPLIT"], A_FP32=bool(cfg["A_FP32"]), WS=bool(cfg.get("WS", False)),
            FLATTEN=bool(cfg.get("FLATTEN", not cfg.get("WS", False))), NUM_SMS=nsm, DOT_F32=_interpreting(), num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"]))
        if SK > 1:
            kernels.append({name}_splitk_reduce[(triton.cdiv(M, 32), triton.cdiv(N, 128))](
                c, out{epi_launch}, M, N, M_PAD * N, out.stride(0), out.stride(1),
                SPLIT_K=SK, BLOCK_M=32, BLOCK_N=128, num_warps=4))
        return out.reshape(*lead, N), kernels
    if "EPI_SPLIT" in cfg:   # operands not TMA-able: the first kernels, with tiles they can fit
        cfg = {{k: v for k, v in cfg.items() if k not in ("EPI_SPLIT", "A_FP32", "WS", "FLATTEN")}}
        cfg.update(BLOCK_M=min(BM, 128), BLOCK_N=min(BN, 128), num_stages=min(cfg["num_stages"], 3))
        BM, BN = cfg["BLOCK_M"], cfg["BLOCK_N"]
"""

_TMA2_HELPERS = """

def _tma2_ok(a2, b, K, N):
    \"\"\"In-kernel descriptors: 16-byte aligned bases and row pitches (K % 8 for bf16 B,
    N % 4 for the fp32 output), contiguous rows.\"\"\"
    return (hasattr(tl, "make_tensor_descriptor") and K % 8 == 0 and N % 4 == 0
            and a2.is_contiguous() and b.is_contiguous() and b.dim() == 2
            and a2.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)


def _set_allocator():
    # tl.make_tensor_descriptor writes the descriptors to a global scratch buffer
    if not _interpreting() and hasattr(triton, "set_allocator"):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(
            size, device="cuda", dtype=torch.int8))
"""


def _tma_loads(impl: str, a_prep: str) -> str:
    a1 = "a_desc.load([off_m, off_k])"
    a2 = "a_desc.load([off_m + M, off_k])"
    b1 = "b_desc.load([off_n, off_k]).T"
    b2 = "b_desc.load([off_n + N, off_k]).T"
    if impl in ("tf32", "tf32x3", "ieee", "tri-bf16x3", "tri-bf16x6"):
        return f"a = {a1}\nb = {b1}"
    if impl == "bf16":
        return f"a = {a1}\nb = {b1}" + ("\na = a.to(tl.bfloat16)" if a_prep == "kernel" else "")
    if a_prep == "pass":
        return f"a_hi = {a1}\na_lo = {a2}\nb_hi = {b1}\nb_lo = {b2}"
    if impl == "3xtf32":
        return (f"a = {a1}\nb_hi = {b1}\nb_lo = {b2}\n"
                "a_hi = ((a.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)\n"
                "a_lo = a - a_hi")
    if impl in ("bf16x3", "fp16x3"):
        return (f"a = {a1}\nb_hi = {b1}\nb_lo = {b2}\n"
                "a_hi = a.to(tl.bfloat16)\na_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)")
    raise ValueError(impl)


_PREP_KERNEL = '''
@triton.jit
def {name}_prep_a(x_ptr, y_ptr, numel, BLOCK: tl.constexpr, MODE: tl.constexpr):
    """A's planes before the GEMM: MODE 0 tf32 hi/lo (fp32), 1 bf16 hi/lo, 2 bf16 cast."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if MODE == 0:
        hi = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        tl.store(y_ptr + offs, hi, mask=mask)
        tl.store(y_ptr + numel + offs, x - hi, mask=mask)
    elif MODE == 1:
        hi = x.to(tl.bfloat16)
        tl.store(y_ptr + offs, hi, mask=mask)
        tl.store(y_ptr + numel + offs, (x - hi.to(tl.float32)).to(tl.bfloat16), mask=mask)
    else:
        tl.store(y_ptr + offs, x.to(tl.bfloat16), mask=mask)

'''

_PREP_ROWS_FP16 = POW2_SOURCE + '''
@triton.jit
def {name}_prep_a_fp16(x_ptr, y_ptr, s_ptr, M, K, stride_xm, BLOCK: tl.constexpr):
    """Row m of A -> hi, lo fp16 planes of x * 2**(15 - e_m) (|x| < 2**e_m on the row, so the
    scaled row stays under 2**15: no fp16 overflow, lo stays far above the subnormals);
    s[m] = 2**(e_m - 15), applied exactly to the accumulator in the epilogue."""
    row = tl.program_id(0)
    xrow = x_ptr + row.to(tl.int64) * stride_xm
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(xrow + offs, mask=offs < K, other=0.0)))
    e = _pow2_exp(tl.max(amax, 0))
    scale = _pow2(15 - e)
    tl.store(s_ptr + row, _pow2(e - 15))
    yrow = y_ptr + row.to(tl.int64) * K
    plane = M.to(tl.int64) * K
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        mask = offs < K
        x = tl.load(xrow + offs, mask=mask, other=0.0) * scale
        hi = x.to(tl.float16)
        tl.store(yrow + offs, hi, mask=mask)
        tl.store(yrow + plane + offs, (x - hi.to(tl.float32)).to(tl.float16), mask=mask)

'''

_PREP_WEIGHT = {
    "fp16x3": ("    # per-row (output column) power-of-two scale so max|w_n| * s_n < 2**15; fp16 hi/lo of w * s\n"
               "    N_, K_ = w.shape\n"
               "    amax = w.abs().amax(dim=1)\n"
               "    e = torch.frexp(amax)[1].clamp(-100, 100)               # amax < 2**e\n"
               "    e = torch.where(amax > 0, e, torch.zeros_like(e))\n"
               "    ws = w * torch.ldexp(torch.ones_like(amax), 15 - e)[:, None]\n"
               "    hi = ws.to(torch.float16)\n"
               "    lo = (ws - hi.to(torch.float32)).to(torch.float16)\n"
               "    # [2, N, W], W = K + 2 rounded up to 16 (row stride a multiple of 16 elements, which\n"
               "    # vectorized loads and TMA need): hi, lo; plane 0's last two columns hold 2**(e - 15)\n"
               "    # as fp32 bits (the scale travels with the weight)\n"
               "    W_ = _b_width(K_)\n"
               "    out_w = torch.zeros((2, N_, W_), device=w.device, dtype=torch.float16)\n"
               "    out_w[0, :, :K_] = hi\n"
               "    out_w[1, :, :K_] = lo\n"
               "    inv = torch.ldexp(torch.ones_like(amax), e - 15).to(torch.float32)\n"
               "    out_w[0, :, W_ - 2:] = inv.view(torch.float16).reshape(N_, 2)\n"
               "    w = out_w"),
    "tri-bf16x3": "",
    "tri-bf16x6": "",
    "tf32": "",
    "tf32x3": "",
    "ieee": "",
    "bf16": "    w = w.to(torch.bfloat16).contiguous()",
    "3xtf32": ("    # hi: round to nearest tf32 (10 mantissa bits); lo = w - hi exactly in fp32\n"
               "    bits = w.view(torch.int32)\n"
               "    hi = ((bits + 0x1000) & -8192).view(torch.float32)\n"
               "    w = torch.stack([hi, w - hi]).contiguous()      # [2, N, K]"),
    "bf16x3": ("    hi = w.to(torch.bfloat16)\n"
               "    lo = (w - hi.to(torch.float32)).to(torch.bfloat16)\n"
               "    w = torch.stack([hi, lo]).contiguous()          # [2, N, K] bf16"),
}

_B_FORM = {"fp16x3": "fp16 [2, N, W] (hi, lo of w * 2**s_n; W = K + 2 rounded up to 16; 2**-s_n in plane 0's last 2 cols)","tri-bf16x3": "fp32 [N, K]", "tri-bf16x6": "fp32 [N, K]", "tf32": "fp32 [N, K]", "tf32x3": "fp32 [N, K]", "ieee": "fp32 [N, K]",
           "bf16": "bf16 [N, K]", "3xtf32": "fp32 [2, N, K] (tf32 hi, lo)",
           "bf16x3": "bf16 [2, N, K] (hi, lo)"}


def render_gemm(
    name: str,
    *,
    precision: str = "strict",
    epilogue: str = "",
    epilogue_args: Sequence = (),
    has_bias: bool = False,
    a_layout: str = "mk",
    b_layout: str = "nk",
    arg_order: Sequence[str] | None = None,
    impl: str | None = None,
    a_prep: str | None = None,
    config: dict | None = None,
    acc_flush: bool | None = None,
    tma: bool | None = None,
) -> str:
    """Return the Python source of a GEMM(+bias)+epilogue candidate. See the module docstring."""
    if not name.isidentifier():
        raise ValueError(f"kernel name {name!r} is not an identifier")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} not in {PRECISIONS}")
    impl = impl or DEFAULT_IMPL[precision]
    if impl not in IMPLS[precision]:
        raise ValueError(f"impl {impl!r} not valid for precision {precision!r}: {IMPLS[precision]}")
    if a_layout != "mk":
        raise NotImplementedError("only row-major A ([..., K]) is supported")
    if b_layout not in ("kn", "nk"):
        raise ValueError("b_layout must be 'kn' ([K, N]) or 'nk' ([N, K], nn.Linear)")
    a_prep = a_prep or IMPL_OPTIONS[impl][0]
    if tma is None:
        tma = IMPL_OPTIONS[impl][1]
    if a_prep not in ("kernel", "pass"):
        raise ValueError("a_prep must be 'kernel' or 'pass'")
    if impl in ("tf32", "tf32x3", "ieee", "tri-bf16x3", "tri-bf16x6"):
        a_prep = "kernel"                 # nothing to prepare
    if impl == "fp16x3":
        a_prep = "pass"                   # the per-row scale needs the row maximum first
    if acc_flush is None:
        acc_flush = impl in ("3xtf32", "bf16x3", "fp16x3")
    epi = _norm_epi_args(epilogue_args)
    names = ["a", "b"] + (["bias"] if has_bias else []) + [n for n, _ in epi]
    if arg_order is None:
        arg_order = names
    arg_order = list(arg_order)
    if sorted(arg_order) != sorted(names):
        raise ValueError(f"arg_order {arg_order} must be a permutation of {names}")
    cfg = dict(config or default_config(precision, impl, tma=tma))

    # epilogue operands: (name, kind) incl. bias
    ops = ([("bias", "col")] if has_bias else []) + epi
    params, fparams, loads, calls, host, launch_args = [], [], [], [], [], []
    if impl == "fp16x3":   # undo the power-of-two operand scales first (exact)
        params += ["kf_sa_ptr", "kf_sb_ptr", "stride_kf_sb"]
        fparams += ["kf_sa_ptr", "kf_sb_ptr", "stride_kf_sb"]
        calls += ["kf_sa_ptr", "kf_sb_ptr", "stride_kf_sb"]
        launch_args += ["kf_sa_t", "kf_sb_t", "kf_sb_t.stride(0)"]
        loads.append("kf_sa = tl.load(kf_sa_ptr + offs_m, mask=mask_m, other=0.0)")
        loads.append("kf_sb = tl.load(kf_sb_ptr + offs_n * stride_kf_sb, mask=mask_n, other=0.0)")
        host.append("kf_sb_t = b[0, :, -2:].view(torch.float32)   # [N, 1] strided view, no copy")
    for nm, kind in ops:
        if kind == "scalar":
            fparams.append(nm)
            params.append(f"{nm}_scalar")
            calls.append(f"{nm}_scalar")
            launch_args.append(nm)
            continue
        fparams.append(f"{nm}_ptr")
        params.append(f"{nm}_ptr")
        calls.append(f"{nm}_ptr")
        launch_args.append(f"{nm}_t")
        if kind == "col":
            loads.append(f"{nm} = tl.load({nm}_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)")
            host.append(f"{nm}_t = {nm}.reshape(-1)\nassert {nm}_t.numel() == N and {nm}_t.stride(0) == 1")
        elif kind == "row":
            loads.append(f"{nm} = tl.load({nm}_ptr + offs_m, mask=mask_m, other=0.0).to(tl.float32)")
            host.append(f"{nm}_t = {nm}.reshape(-1)\nassert {nm}_t.numel() == M and {nm}_t.stride(0) == 1")
        else:  # tile
            params += [f"stride_{nm}_m", f"stride_{nm}_n"]
            fparams += [f"stride_{nm}_m", f"stride_{nm}_n"]
            calls += [f"stride_{nm}_m", f"stride_{nm}_n"]
            launch_args += [f"{nm}_t.stride(0)", f"{nm}_t.stride(1)"]
            loads.append(
                f"{nm} = tl.load({nm}_ptr + offs_m[:, None] * stride_{nm}_m + offs_n[None, :] * stride_{nm}_n,"
                f" mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)")
            host.append(f"{nm}_t = {nm}.reshape(-1, {nm}.shape[-1])\nassert tuple({nm}_t.shape) == (M, N)")
    epi_code_lines = []
    if impl == "fp16x3":
        epi_code_lines.append("acc = acc * kf_sa[:, None] * kf_sb[None, :]")
    if has_bias:
        epi_code_lines.append("acc = acc + bias[None, :]")
    if epilogue.strip():
        epi_code_lines.append(textwrap.dedent(epilogue).strip("\n"))

    loads_src, math_src = _loop_body(impl, a_prep)
    if acc_flush:
        math_src = _flush(math_src)
    even = loads_src.replace("{AMASK}", "").replace("{BMASK}", "")
    masked = (loads_src
              .replace("{AMASK}", ", mask=offs_k[None, :] < k_left, other=0.0")
              .replace("{BMASK}", ", mask=offs_k[:, None] < k_left, other=0.0"))

    if impl == "fp16x3":
        a_prep_code = (
            "    a2 = a2.contiguous()\n"
            "    a_in = torch.empty((2, M, K), device=a.device, dtype=torch.float16)\n"
            "    kf_sa_t = torch.empty((M,), device=a.device, dtype=torch.float32)\n"
            "    stride_as = a_in.stride(0)\n"
            f"    kernels.append({name}_prep_a_fp16[(M,)](a2, a_in, kf_sa_t, M, K, a2.stride(0), "
            "BLOCK=1024, num_warps=4))")
        prep_kernel = _PREP_ROWS_FP16.format(name=name)
    elif a_prep == "pass":
        mode = {"3xtf32": 0, "bf16x3": 1, "bf16": 2}[impl]
        if mode == 2:
            a_prep_code = (
                "    a_in = torch.empty((M, K), device=a.device, dtype=torch.bfloat16)\n"
                "    stride_as = 0\n")
        else:
            dt = "torch.float32" if mode == 0 else "torch.bfloat16"
            a_prep_code = (
                f"    a_in = torch.empty((2, M, K), device=a.device, dtype={dt})\n"
                "    stride_as = a_in.stride(0)\n")
        a_prep_code += (
            "    a2 = a2.contiguous()\n"
            "    PB = 2048\n"
            f"    kernels.append({name}_prep_a[(triton.cdiv(M * K, PB),)](a2, a_in, M * K, "
            f"BLOCK=PB, MODE={mode}, num_warps=8))")
        prep_kernel = _PREP_KERNEL.format(name=name)
    else:
        a_prep_code = "    a_in = a2\n    stride_as = 0"
        prep_kernel = ""
    tma2 = impl == "bf16"      # the bf16 scheme's second persistent kernel (configs with EPI_SPLIT)
    if tma2 and not prep_kernel:
        prep_kernel = _PREP_KERNEL.format(name=name)

    unpack = "    " + ", ".join(arg_order) + (" = args" if len(arg_order) > 1 else ", = args")
    src = _TEMPLATE.format(
        name=name, precision=precision, impl=impl, a_prep=a_prep, b_layout=b_layout,
        b_index=arg_order.index("b"), config=repr(cfg),
        bias_txt=" + bias" if has_bias else "",
        b_form=_B_FORM[impl],
        launch_sig=", ".join(arg_order),
        epi_params="".join(", " + p for p in params),
        epi_fparams="".join(", " + p for p in fparams),
        epi_call="".join(", " + c for c in calls),
        epi_launch="".join(", " + x for x in launch_args),
        epi_loads=_indent("\n".join(loads), 4) or "    pass",
        epi_code=_indent("\n".join(epi_code_lines), 4) or "    pass",
        prep_kernel=prep_kernel,
        loads_even=_indent(even, 12),
        loads_masked=_indent(masked, 12),
        math=_indent(math_src, 8),
        prep_weight=_PREP_WEIGHT[impl],
        use_tma=repr(bool(tma)),
        b_pad=repr(impl == "fp16x3"),
        tma_kernel=(_TMA_KERNEL.format(
            name=name, epi_params="".join(", " + p for p in params),
            epi_call="".join(", " + c for c in calls),
            loads=_indent(_tma_loads(impl, a_prep), 12), math=_indent(math_src, 12)) if tma else ""),
        unpack=unpack,
        tma2_kernel=(_TMA2_KERNEL.format(
            name=name, epi_params="".join(", " + p for p in params),
            epi_call="".join(", " + c for c in calls)) if tma2 else ""),
        tma2_host=(_TMA2_HOST.format(name=name, epi_launch="".join(", " + x for x in launch_args))
                   if tma2 else ""),
        tma2_helpers=_TMA2_HELPERS if tma2 else "",
        a_prep_code=a_prep_code,
        epi_host=_indent("\n".join(host), 4),
    )
    return src


def load_source(src: str, module_name: str = "kforge_gemm_candidate"):
    """Import rendered source as a module (Triton's JIT needs a real file for inspect)."""
    import hashlib
    import importlib.util
    import os
    import tempfile

    d = os.path.join(tempfile.gettempdir(), "kforge_gemm_src")
    os.makedirs(d, exist_ok=True)
    h = hashlib.sha1(src.encode()).hexdigest()[:16]
    path = os.path.join(d, f"{module_name}_{h}.py")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            f.write(src)
        os.replace(path + ".tmp", path)
    spec = importlib.util.spec_from_file_location(f"{module_name}_{h}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
