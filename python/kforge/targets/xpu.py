"""Intel GPUs through Triton's Intel XPU backend. No Intel GPU is available to the project:
generation, configurations and compile-only checks are what can be verified here."""
from __future__ import annotations

from typing import Callable

from kforge.targets.base import Peaks, Target, pow2_at_least
from kforge.targets.cuda import _LIBDEVICE


class XpuTarget(Target):
    name = "xpu"
    device = "xpu"
    # Intel Data Center GPU Max 1550 datasheet figures (not measured by this project)
    peaks = Peaks(fp32=52e12, tf32=419e12, bf16=838e12, bytes_per_s=3.28e12)
    bf16_dot_ok = True
    math_imports = "from triton.language.extra import libdevice"
    extra_math = _LIBDEVICE

    def dot_input_precisions(self, policy: str):
        return {"strict": ("3xtf32", "tf32x3"), "tf32": ("tf32",), "bf16": (None,)}[policy]

    def time_ms(self, fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    def synchronize(self) -> None:
        import torch
        torch.xpu.synchronize()

    def configs(self, kind: str, problem: dict) -> list[dict]:
        # Intel's backend prefers large tiles with 32 warps (DPAS, 2D block loads; its
        # tutorials use 256x256x32, grf_mode large)
        if kind == "gemm":
            if problem.get("full_rows") and pow2_at_least(problem["N"]) <= 256:
                bn = max(16, pow2_at_least(problem["N"]))
                return [{"BLOCK_M": 64, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 4,
                         "SPLIT_K": 1, "num_warps": 8, "num_stages": 2}]
            return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4, "SPLIT_K": 1,
                     "num_warps": w, "num_stages": s}
                    for bm, bn, bk, w, s in ((256, 256, 32, 32, 2), (128, 256, 32, 32, 2),
                                             (128, 128, 32, 16, 2), (64, 128, 32, 8, 3))]
        if kind == "rows":
            whole = pow2_at_least(problem["cols"])
            out = [{"BLOCK_R": 1, "BLOCK_C": whole, "num_warps": 16}] if whole <= 16384 else []
            if problem["cols"] > 2048:
                out.append({"BLOCK_R": 1, "BLOCK_C": 2048, "num_warps": 16})
            return out
        return [{"BLOCK": b, "num_warps": w} for b, w in ((2048, 16), (1024, 8), (4096, 32))]

    def describe(self) -> str:
        return ("Target xpu: Intel GPUs through Triton's Intel backend (peaks here are the "
                "Max 1550 datasheet: fp32 52 TFLOP/s, TF32 419, bf16 838, 3.28 TB/s; not "
                "measured). Large tiles (256x256x32) with 32 warps suit its DPAS units; math "
                "beyond core tl is in triton.language.extra.libdevice.")
