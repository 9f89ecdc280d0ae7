"""GEMM + fused epilogue templates for the builtin Triton generator, one per precision policy.

    out[M, N] = epilogue(A[M, K] @ B[K, N] (+ bias[N]))         (fp32 accumulate, fp32 out)

`render_gemm(name, precision=..., epilogue=..., ...)` returns the Python source of a KForge
candidate (see kforge.providers.base.Candidate): Triton kernels, `prepare_weights(weights)` and
`launch(*args)`. The source needs only torch and triton; it runs on CUDA (Hopper: tl.dot lowers to
wgmma) and under TRITON_INTERPRET=1 on the CPU.

Interface
---------
render_gemm(name, *, precision="strict", epilogue="", epilogue_args=(), has_bias=False,
            a_layout="mk", b_layout="nk", arg_order=None, impl=None, a_prep=None,
            config=None) -> str

* A (the activation) is row-major [..., K] (a_layout "mk"; leading dims are flattened into M).
* B (the weight) is either [K, N] (b_layout "kn") or nn.Linear's [N, K] (b_layout "nk").
  `prepare_weights` always re-stores it K-major ([N, K] contiguous), in the form the precision
  needs (fp32; stacked hi/lo planes [2, N, K]; bf16). `launch` expects that prepared form.
* has_bias: a per-column fp32 vector `bias[N]` is added to acc before the epilogue snippet.
* epilogue: Triton statements (one per line, no indentation needed) that update `acc`, the fp32
  [BLOCK_M, BLOCK_N] accumulator tile. In scope: `acc`, `offs_m` [BLOCK_M] and `offs_n`
  [BLOCK_N] (global row/column indices), `mask_m`, `mask_n`, `M`, `N`, and each epilogue
  argument, already loaded:
      ("name", "col")    -> `name`: fp32 [BLOCK_N] vector, element n of a length-N tensor
      ("name", "row")    -> `name`: fp32 [BLOCK_M] vector, element m of a length-M tensor
      ("name", "tile")   -> `name`: fp32 [BLOCK_M, BLOCK_N] tile of an [M, N] tensor (any strides;
                            leading dims flattened like A's)
      ("name", "scalar") -> `name`: a Python float passed to the kernel
  e.g. epilogue="acc = tl.maximum(acc, 0.0)" for bias+ReLU with has_bias=True.
* arg_order: the order of launch's parameters by name ("a", "b", "bias", epilogue arg names);
  default: a, b, [bias], epilogue args in the order given. prepare_weights receives
  {index of "b": weight} and returns the prepared weight under the same index.
* precision: "strict" (fp32-accurate, atol=rtol=1e-4), "tf32", "bf16" (see DESIGN.md).
  impl picks the scheme inside a policy:
      strict: "3xtf32" (default; A split in-kernel into tf32 hi + lo, B split once in
              prepare_weights, acc += a_lo@b_hi + a_hi@b_lo + a_hi@b_hi on tf32 tensor cores),
              "tf32x3" (Triton's built-in input_precision="tf32x3", B kept fp32),
              "bf16x3" (hi/lo in bf16, three bf16 products: accurate only to ~1e-5 relative per
              product; see benchmarks/gemm/NOTES.md for when it passes 1e-4), "ieee" (plain fp32 FMA)
      tf32:   "tf32"      bf16: "bf16"
  a_prep: "kernel" (split/cast A inside the GEMM, default) or "pass" (a small Triton pass writes
  A's split/cast planes first; costs one read + write of A, frees the GEMM's main loop).
* config: the default launch configuration baked into the source as CONFIG (a dict with BLOCK_M,
  BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages). `launch_with_config(cfg, *args)`
  runs with an explicit one (the tuner's entry point; no triton.autotune anywhere).

Configuration spaces: `config_space(precision, impl=None, M=None)` (list of dicts; SPLIT_K > 1
configs only when M is small), `default_config(precision, impl, M, N, K)` (measured picks).
"""
from __future__ import annotations

import textwrap
from typing import Iterable, Sequence

PRECISIONS = ("strict", "tf32", "bf16")
IMPLS = {
    "strict": ("3xtf32", "tf32x3", "bf16x3", "ieee"),
    "tf32": ("tf32",),
    "bf16": ("bf16",),
}
DEFAULT_IMPL = {"strict": "3xtf32", "tf32": "tf32", "bf16": "bf16"}
EPILOGUE_KINDS = ("col", "row", "tile", "scalar")


def _cfg(bm, bn, bk, warps, stages, group_m=8, split_k=1):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "SPLIT_K": split_k, "num_warps": warps, "num_stages": stages}


# Operand bytes per element in the main loop decide BLOCK_K: 32 for fp32 operands, 64 for bf16.
# Shared memory per stage = (BM + planes_b * BN) * BK * bytes (+ A planes): the H200 gives a
# block up to 227 KB, so fp32 3xtf32 tiles (B hi+lo) stay at 2-3 stages.
_FP32_SPACE = [
    _cfg(128, 128, 32, 8, 3),
    _cfg(128, 128, 32, 4, 3),
    _cfg(128, 256, 32, 8, 3),
    _cfg(128, 128, 32, 8, 4),
    _cfg(64, 128, 32, 4, 4),
    _cfg(128, 64, 32, 4, 4),
]
_SPLIT_B_SPACE = [          # fp32 A, B as stacked fp32 hi/lo planes (3xtf32)
    _cfg(128, 128, 32, 8, 3),
    _cfg(128, 128, 32, 4, 3),
    _cfg(128, 128, 16, 8, 4),
    _cfg(128, 256, 16, 8, 3),
    _cfg(64, 128, 32, 4, 3),
]
_BF16_SPACE = [
    _cfg(128, 256, 64, 8, 3),
    _cfg(128, 128, 64, 8, 4),
    _cfg(128, 128, 64, 4, 4),
    _cfg(256, 128, 64, 8, 3),
    _cfg(64, 128, 64, 4, 4),
    _cfg(128, 64, 64, 4, 4),
]
_BF16X3_SPACE = [
    _cfg(128, 128, 64, 8, 3),
    _cfg(128, 256, 32, 8, 3),
    _cfg(128, 128, 32, 8, 4),
    _cfg(64, 128, 64, 4, 3),
]


def config_space(precision: str, impl: str | None = None, M: int | None = None) -> list[dict]:
    """The configurations worth measuring for a policy (and impl); adds split-K for small M."""
    impl = impl or DEFAULT_IMPL[precision]
    base = {"tf32": _FP32_SPACE, "tf32x3": _FP32_SPACE, "ieee": _FP32_SPACE,
            "3xtf32": _SPLIT_B_SPACE, "bf16x3": _BF16X3_SPACE, "bf16": _BF16_SPACE}[impl]
    out = [dict(c) for c in base]
    if M is not None and M <= 512:
        for c in base[:2]:
            for sk in (2, 4):
                out.append(dict(c, SPLIT_K=sk))
        out = [c for c in out if c["BLOCK_M"] <= max(64, M) or c["SPLIT_K"] == 1]
    return out


# Measured picks (H200, 2026-11-30; benchmarks/gemm/NOTES.md). Updated from bench results.
_BEST = {
    # impl: (large-M config, small-M (M <= 512) config)
    "3xtf32": (_cfg(128, 128, 32, 8, 3), _cfg(64, 128, 32, 4, 3)),
    "tf32x3": (_cfg(128, 128, 32, 8, 3), _cfg(64, 128, 32, 4, 4)),
    "ieee": (_cfg(128, 128, 32, 8, 3), _cfg(64, 128, 32, 4, 4)),
    "bf16x3": (_cfg(128, 128, 64, 8, 3), _cfg(64, 128, 64, 4, 3)),
    "tf32": (_cfg(128, 256, 32, 8, 3), _cfg(64, 128, 32, 4, 4)),
    "bf16": (_cfg(128, 256, 64, 8, 3), _cfg(64, 128, 64, 4, 4)),
}


def default_config(precision: str, impl: str | None = None, M: int | None = None,
                   N: int | None = None, K: int | None = None) -> dict:
    impl = impl or DEFAULT_IMPL[precision]
    large, small = _BEST[impl]
    return dict(small if (M is not None and M <= 512) else large)


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
def _loop_body(impl: str, a_prep: str) -> tuple[str, str]:
    """(loads, math) for one K step. Masks: A_MASK / B_MASK placeholders, filled by caller."""
    b1 = "tl.load(b_ptrs{BMASK})"
    b2 = "tl.load(b_ptrs + stride_bs{BMASK})"
    a1 = "tl.load(a_ptrs{AMASK})"
    a2 = "tl.load(a_ptrs + stride_as{AMASK})"
    if impl in ("tf32", "tf32x3", "ieee"):
        prec = {"tf32": "tf32", "tf32x3": "tf32x3", "ieee": "ieee"}[impl]
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
    if impl == "bf16x3":
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
    # grouped tile order: GROUP_M row-tiles share each column of B while it is in L2
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

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


@triton.jit
def {name}_splitk_reduce(
    w_ptr, c_ptr{epi_params}, M, N, stride_cm, stride_cn,
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
        acc += tl.load(w_ptrs + split * M * N, mask=c_mask, other=0.0)
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
    assert b.shape[-1] == K, "weight not prepared (expected K-major [N, K])"
    out = torch.empty((M, N), device=a.device, dtype=torch.float32)
    if M == 0 or N == 0:
        return out.reshape(*lead, N), []
    BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    SK = cfg.get("SPLIT_K", 1)
    kernels = []
{a_prep_code}
    stride_bs = b.stride(0) if b.dim() == 3 else 0
{epi_host}
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
            c, out{epi_launch}, M, N, out.stride(0), out.stride(1),
            SPLIT_K=SK, BLOCK_M=RM, BLOCK_N=RN, num_warps=4,
        )
        kernels.append(k2)
    return out.reshape(*lead, N), kernels


def launch_with_config(cfg, {launch_sig}):
    return (_run(({launch_sig}), cfg)[0],)


def launch({launch_sig}):
    return (_run(({launch_sig}), CONFIG)[0],)
'''

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

_PREP_WEIGHT = {
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

_B_FORM = {"tf32": "fp32 [N, K]", "tf32x3": "fp32 [N, K]", "ieee": "fp32 [N, K]",
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
    a_prep = a_prep or "kernel"
    if a_prep not in ("kernel", "pass"):
        raise ValueError("a_prep must be 'kernel' or 'pass'")
    if impl in ("tf32", "tf32x3", "ieee"):
        a_prep = "kernel"                 # nothing to prepare
    epi = _norm_epi_args(epilogue_args)
    names = ["a", "b"] + (["bias"] if has_bias else []) + [n for n, _ in epi]
    if arg_order is None:
        arg_order = names
    arg_order = list(arg_order)
    if sorted(arg_order) != sorted(names):
        raise ValueError(f"arg_order {arg_order} must be a permutation of {names}")
    cfg = dict(config or default_config(precision, impl))

    # epilogue operands: (name, kind) incl. bias
    ops = ([("bias", "col")] if has_bias else []) + epi
    params, fparams, loads, calls, host, launch_args = [], [], [], [], [], []
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
    if has_bias:
        epi_code_lines.append("acc = acc + bias[None, :]")
    if epilogue.strip():
        epi_code_lines.append(textwrap.dedent(epilogue).strip("\n"))

    loads_src, math_src = _loop_body(impl, a_prep)
    even = loads_src.replace("{AMASK}", "").replace("{BMASK}", "")
    masked = (loads_src
              .replace("{AMASK}", ", mask=offs_k[None, :] < k_left, other=0.0")
              .replace("{BMASK}", ", mask=offs_k[:, None] < k_left, other=0.0"))

    if a_prep == "pass":
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
        unpack=unpack,
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
