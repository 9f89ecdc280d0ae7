"""The builtin's warp-specialized Gluon GEMM (kforge.providers.builtin.gluon_ws) alone, with a
plain store as its epilogue: C = A @ B.T for a bf16 activation A [M, K] and a weight B [N, K]
as nn.Linear holds it, fp32 accumulation, C in bf16 or fp32. ws_ab.py checks it and times it
against cuBLAS; not yet run on a GPU.

The kernel (gluon_ws.py's docstring has the design): a one-warp loader partition fills a ring
of STAGES shared-memory stages by TMA; two consumer warpgroups share each 128 x 256 tile, 64
rows each (or, PINGPONG, take 128 x 128 tiles in turn), keep one wgmma group in flight and
release the stage before; after a tile's last K step a consumer stores its rows in EPI_SPLIT
column slices while the loader already fills the ring for the next tile. The template bakes M, N and K into the source, so each shape is a
module of its own (written to a temporary file: Gluon, like Triton, reads a kernel's source).
"""
from __future__ import annotations

import functools
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from kforge.providers.builtin import gluon_ws  # noqa: E402
from kforge.providers.builtin.gemm import split_slices  # noqa: E402
from kforge.providers.builtin.gluon import HEADER  # noqa: E402

CONFIG = {k: v for k, v in gluon_ws.CONFIG.items() if k != "num_warps"}
REGS, MAXNREG, NUM_WARPS = gluon_ws.REGS, gluon_ws.MAXNREG, gluon_ws.CONFIG["num_warps"]


def source(M: int, N: int, K: int, slices: int = CONFIG["EPI_SPLIT"],
           out: str = "bfloat16", pingpong: bool = False) -> str:
    """The module source: the kernel `gemm_ws(A, B, C, LOAD, ...)` for this shape."""
    lines, accs = split_slices(["acc"], slices, "BLOCK_M" if pingpong else "HALF", "gl")
    body = ["        " + line for line in lines]
    mask = "(rm < M_) & (rn < N_)"
    for i, a in enumerate(accs):
        body += [f"        {a} = gl.convert_layout({a}, blk)",
                 f"        rn = pid_n * BLOCK_N + {i} * EPI_N + gl.arange(0, EPI_N)[None, :]",
                 f"        gl.store(C + rm.to(gl.int64) * N_ + rn, {a}.to(gl.{out}), "
                 f"mask={mask})"]
    body = [line.replace("M_", str(M)).replace("N_", str(N)) for line in body]
    kernel = gluon_ws.kernel_source("gemm_ws", ["A", "B", "C"], "A", "B", M, N, K, body,
                                    f"C = A @ B.T, {M} x {N} x {K}, bf16 operands",
                                    pingpong=pingpong)
    return "import triton\n" + HEADER + "\n\n" + kernel


@functools.lru_cache(maxsize=None)
def module(M: int, N: int, K: int, slices: int = CONFIG["EPI_SPLIT"], out: str = "bfloat16",
           pingpong: bool = False):
    path = Path(tempfile.mkdtemp(prefix="kforge-ws-")) / f"gemm_ws_{M}_{N}_{K}.py"
    path.write_text(source(M, N, K, slices, out, pingpong))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_helper(mod):
    """The kernel's LOAD argument for this Triton (gluon_ws.LOAD)."""
    from triton.experimental.gluon.language.nvidia.hopper import tma
    return mod.gemm_ws_load_new if hasattr(tma, "async_load") else mod.gemm_ws_load_old


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch(a, b, c=None, **cfg):
    """c = a @ b.T on the GPU: a [M, K] and b [N, K] bf16, contiguous; c bf16 (default) or
    fp32, [M, N]."""
    import torch
    import triton
    cfg = dict(CONFIG, **cfg)
    M, K = a.shape
    N = b.shape[0]
    if c is None:
        c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16)
    slices = cfg.pop("EPI_SPLIT")
    pingpong = bool(cfg.pop("PINGPONG", False))
    mod = module(M, N, K, slices, "bfloat16" if c.dtype == torch.bfloat16 else "float32",
                 pingpong)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=a.device))
    tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    mod.gemm_ws[(min(tiles, _sm_count(a.device.index or 0)),)](
        a, b, c, load_helper(mod), EPI_N=cfg["BLOCK_N"] // slices, num_warps=NUM_WARPS,
        maxnreg=MAXNREG, **cfg)
    return c


def cross_compile(arch: int = 90, out_dtype: str = "bf16", M: int = 4096, N: int = 4096,
                  K: int = 4096, **cfg) -> dict:
    """Compile for sm_`arch` without a GPU: {'ptx', 'ttgir', 'shared' (bytes)}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource
    consts = dict(CONFIG, **cfg)
    slices = consts.pop("EPI_SPLIT")
    pingpong = bool(consts.pop("PINGPONG", False))
    consts["EPI_N"] = consts["BLOCK_N"] // slices
    mod = module(M, N, K, slices, "bfloat16" if out_dtype == "bf16" else "float32", pingpong)
    consts["LOAD"] = load_helper(mod)
    order = ["A", "B", "C", "LOAD"] + list(gluon_ws.CONSTS)
    sig = {"A": "*bf16", "B": "*bf16", "C": f"*{out_dtype}",
           **{k: "constexpr" for k in order[3:]}}
    src = GluonASTSource(mod.gemm_ws, {k: sig[k] for k in order}, constexprs=consts)
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": NUM_WARPS, "maxnreg": MAXNREG})
    return {"ptx": kernel.asm.get("ptx", ""), "ttgir": kernel.asm.get("ttgir", ""),
            "shared": int(getattr(kernel.metadata, "shared", 0) or 0)}


if __name__ == "__main__":
    import re
    o = cross_compile(90)
    p = o["ptx"]
    print("shared", o["shared"], "| wgmma", p.count("wgmma.mma_async"), "| waits",
          re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", p), "| setmaxnreg",
          re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", p), "| tma loads",
          p.count("cp.async.bulk.tensor"))
