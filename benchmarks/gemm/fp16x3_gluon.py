"""The strict scheme's fp16x3 GEMM in Gluon, with the tensor cores kept busy across the exact
fp32 adds: a candidate for benchmarks/gemm/fp16x3_ab.py (variant `gluon_pp`).

Why: the builtin's Triton loop takes each K step's three products (a_lo·b_hi, a_hi·b_lo,
a_hi·b_hi) into a fresh fp32 `part`, then `acc += part` in exact fp32 (chaining all of K in the
tensor core's accumulator truncates: NOTES.md run 1). Triton keeps only a loop-carried
accumulator's dot in flight, so its TTGIR waits (`pendings = 0`) after every one of the three
products (2026-12-07e's README; 2026-12-06g measured every Triton form of the loop slower or
no faster). The tensor cores drain three times a step.

Here the step's products are issued as wgmma groups by hand (Gluon's `warpgroup_mma`,
`is_async=True`), into one of two alternating parts: step k's three groups chain into its part
without a wait between them, and only then does the kernel wait until step k-1's groups have
retired (`warpgroup_mma_wait(num_outstanding=3)`), add that part to the accumulator in fp32,
and refill step k-1's shared-memory stage by TMA. The tensor cores always have the current
step's products queued while the previous part is added.

Operands are the fp16 planes fp16x3_ab.planes makes: [2, R, K] (hi, then lo) of power-of-two
scaled rows, scales undone after the product, as the builtin's split pass and prepared weights
hold them. The accumulation is the builtin's (a fresh part a 64-deep step, added in fp32): the
error should match `base`, which fp16x3_ab.py measures beside it.

Tiles: 128 x 128 x 64, 8 warps (two warpgroups, 16 rows a warp), 3 stages of the four operand
tiles (192 KiB of shared memory), one output tile a program in grouped order. M and N multiples
of 128 and K of 64 (the harness's shapes). Device-side tensor descriptors: the caller sets
Triton's allocator (launch() does).

The kernel itself is the builtin's (kforge.providers.builtin.gluon, config key GLUON under
KFORGE_BUILTIN_GLUON=1); this file runs it alone on the harness's planes (EXPONENTS=False: B's
scales as an fp32 vector). Written against Triton 3.6's Gluon (the device image's);
cross-compiled for sm_90 here; not yet run on a GPU.
"""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

# the template module alone, by its path (the kforge package's imports need torch, which a
# cross-compiling environment may lack)
_TEMPLATE = (Path(__file__).resolve().parents[2] / "python" / "kforge" / "providers" / "builtin"
             / "gluon.py")
_spec = importlib.util.spec_from_file_location("kforge_builtin_gluon", _TEMPLATE)
_template = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_template)
CONFIG, HEADER, kernel_source = _template.CONFIG, _template.HEADER, _template.kernel_source

_MODULE = None


def _kernel():
    """The builtin's Gluon kernel (kforge.providers.builtin.gluon), loaded from a file as a
    generated package's kernel.py is (Gluon, like Triton, reads a kernel's source file)."""
    global _MODULE
    if _MODULE is None:
        path = Path(tempfile.mkdtemp(prefix="kforge-gluon-")) / "fp16x3_pingpong.py"
        path.write_text("import triton\n" + HEADER + "\n\n" + kernel_source("fp16x3_pingpong"))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        _MODULE = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_MODULE)
    return _MODULE.fp16x3_pingpong


def _load_helper():
    """The kernel's LOAD argument for this Triton (gluon.LOAD)."""
    from triton.experimental.gluon.language.nvidia.hopper import tma
    _kernel()
    return (_MODULE.fp16x3_pingpong_load_new if hasattr(tma, "async_load")
            else _MODULE.fp16x3_pingpong_load_old)


def launch(a2, b2, sa, sb, c, **cfg):
    """c = (a2 hi / lo planes) @ (b2 planes).T through the three products, a2 / b2 the
    [2, R, K] planes (fp16x3_ab.planes), sa / sb the scales to undo. On the GPU."""
    import torch
    import triton
    cfg = dict(CONFIG, **cfg)
    _, M, K = a2.shape
    N = b2.shape[1]
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=a2.device))
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    num_warps = cfg.pop("num_warps")
    _kernel()[grid](a2, b2, sa, sb, c, M, N, K, _load_helper(), EXPONENTS=False,
                    num_warps=num_warps, **cfg)
    return c


def cross_compile(arch: int = 90) -> dict:
    """Compile the kernel for sm_`arch` without a GPU (Triton's own compiler, as kforge
    xcompile does for generated kernels): {'ptx': ..., 'ttgir': ..., 'shared': bytes}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource
    cfg = dict(CONFIG)
    num_warps = cfg.pop("num_warps")
    consts = dict(cfg, LOAD=_load_helper(), EXPONENTS=False, num_warps=num_warps)
    # in the kernel's parameter order: pointers, sizes, LOAD, then the other constexprs
    sig = {"A2": "*fp16", "B2": "*fp16", "SA": "*fp32", "SB": "*fp32", "C": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "LOAD": "constexpr",
           **{k: "constexpr" for k in consts if k != "LOAD"}}
    src = GluonASTSource(_kernel(), sig, constexprs=consts)
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps})
    return {"ptx": kernel.asm.get("ptx", ""), "ttgir": kernel.asm.get("ttgir", ""),
            "shared": int(getattr(kernel.metadata, "shared", 0) or 0)}


if __name__ == "__main__":
    import re
    out = cross_compile(90)
    ptx = out["ptx"]
    print("shared bytes", out["shared"], "| wgmma", ptx.count("wgmma.mma_async"),
          "| wait_group", re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx),
          "| cp.async.bulk.tensor", ptx.count("cp.async.bulk.tensor"))
