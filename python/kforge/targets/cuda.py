"""NVIDIA GPUs through Triton's CUDA backend (measured on an H200, sm_90)."""
from __future__ import annotations

from typing import Callable

from kforge.targets.base import Arch, Peaks, Target, pow2_at_least

ARCHS = {
    "sm_90": Arch("sm_90", "NVIDIA H200", 132,
                  Peaks(fp32=51e12, tf32=408e12, bf16=786e12, bytes_per_s=4.28e12),
                  shared_bytes=227 * 1024, source="measured on the H200 (2026-11)"),
    "sm_80": Arch("sm_80", "NVIDIA A100-SXM4", 108,
                  Peaks(fp32=19.5e12, tf32=156e12, bf16=312e12, bytes_per_s=2.04e12),
                  shared_bytes=163 * 1024, source="A100 datasheet (not measured)"),
}

_LIBDEVICE = {
    "math.tanh": "libdevice.tanh({0})", "math.expm1": "libdevice.expm1({0})",
    "math.log1p": "libdevice.log1p({0})", "math.erfc": "libdevice.erfc({0})",
    "math.tan": "libdevice.tan({0})", "math.atan": "libdevice.atan({0})",
    "math.atan2": "libdevice.atan2({0}, {1})", "math.powf": "libdevice.pow({0}, {1})",
    "math.fpowi": "libdevice.pow({0}, {1}.to(tl.float32))",
    "math.round": "libdevice.round({0})", "math.roundeven": "libdevice.rint({0})",
    "math.trunc": "libdevice.trunc({0})",
}

# the bf16 policy's fast math (Target.fast_math): PTX's tanh.approx.f32 (relative error at
# most about 2^-11) and lg2.approx.f32. In a GEMM's epilogue, libdevice's tanh and log1p run
# on the product's 8 warps per SM while the tensor cores wait: on the H100 (2026-12-06)
# chain_mish_tanh (exp, log1p and two tanh on 16.8 M outputs) took 0.385 ms for a product
# gemm_bias_relu does twice of in 0.218 ms
_FAST_BF16 = {
    "math.tanh": "_fast_tanh({0})",
    "math.log1p": "(_fast_log2(1.0 + {0}) * 0.6931471805599453)",
}


def gemm_configs(problem: dict, bf16: bool, compute_units: int) -> list[dict]:
    """Tile shapes for Hopper: BLOCK_M a multiple of 64 and 4/8 warps so that tl.dot lowers to
    wgmma; larger K tiles for 2-byte operands. Split-K for skinny problems."""
    M, N, K = problem["M"], problem["N"], problem["K"]
    if bf16:
        tiles = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 3),
                 (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                 (128, 256, 32, 8, 4), (64, 64, 64, 4, 5)]
    else:
        # measured on the H200 (test_builtin_gpu.py): 128x128 with 4 warps spills 100+
        # registers under 3xtf32, so it comes late
        tiles = [(128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (64, 128, 32, 4, 4),
                 (128, 64, 32, 4, 4), (64, 256, 32, 8, 3), (128, 128, 64, 8, 2),
                 (128, 128, 32, 4, 3), (64, 64, 32, 4, 5)]
    out = []
    # a row reduction over N is fused when one tile spans the row; else the GEMM writes its
    # product and a rows kernel finishes (kforge.providers.builtin.gemm)
    fuse = problem.get("full_rows") and pow2_at_least(N) <= 256
    for bm, bn, bk, w, s in tiles:
        if fuse:
            bn = max(16, pow2_at_least(N))
            bm = 64 if bn > 128 else bm
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                    "SPLIT_K": 1, "num_warps": w, "num_stages": s})
    batch = problem.get("batch", 1)
    if M <= 128 and not fuse:
        out = decode_tiles(M, N, batch, bf16, compute_units) + out
    tiles_mn = -(-M // 128) * -(-N // 128) * batch
    if tiles_mn < compute_units and K >= 4096 and not problem.get("reductions"):   # < SMs
        split = [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64 if bf16 else 32, "GROUP_M": 8,
                  "SPLIT_K": sk, "num_warps": 4, "num_stages": 4} for sk in (4, 8, 2)]
        # far fewer tiles than SMs: split-K first
        out = split + out if tiles_mn <= compute_units // 2 else out + split
    seen, uniq = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def decode_tiles(M: int, N: int, batch: int, bf16: bool, compute_units: int) -> list[dict]:
    """Few rows (a decode step's M = batch of sequences <= 128): the time is the weights'
    bytes, and one SM cannot pull more than a small share of HBM's bandwidth, so every SM needs
    a tile. 64-row tiles (wgmma's least) and the widest BLOCK_N that still gives a tile per SM
    (a 128x256 tile over N = 4096 makes 16 of the H200's 132 SMs busy: an o_proj at 1/8 of
    the bandwidth), then the next narrower one."""
    bk = 64 if bf16 else 32
    rows = -(-M // 64) * batch
    widths = (256, 128, 64, 32)
    pick = next((i for i, bn in enumerate(widths) if rows * -(-N // bn) >= compute_units),
                len(widths) - 1)
    return [{"BLOCK_M": 64, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": 1,
             "num_warps": 4, "num_stages": 4} for bn in widths[pick:pick + 2]]


def row_configs(problem: dict, max_block: int = 32768) -> list[dict]:
    """Whole rows in one block while they fit in registers (up to 32768 fp32 with 16-32
    warps: 64 values a thread), each element loaded once; else loops over column blocks
    (three passes for a softmax)."""
    cols = problem["cols"]
    whole = pow2_at_least(cols)
    out = []
    if whole > 16384 and whole <= max_block:
        out += [{"BLOCK_R": 1, "BLOCK_C": whole, "num_warps": w} for w in (16, 32)]
    elif whole <= max_block:
        # short rows (pooling windows, small groups): enough rows a block for 2-8K elements;
        # 4-16 rows of 2 columns made 2M blocks of 8 elements (gemm_max_pool on the H200:
        # its rows pass took longer than the GEMM)
        short = tuple(dict.fromkeys(max(4, n // whole) for n in (4096, 8192, 2048)))
        for rows in ((1, 2, 4) if whole >= 1024 else short):
            if whole * rows > 32768:
                continue
            warps = 16 if whole * rows >= 32768 else 8 if whole * rows >= 8192 else 4
            out.append({"BLOCK_R": rows, "BLOCK_C": whole, "num_warps": warps})
    for bc in (4096, 2048):
        if bc < cols:
            out.append({"BLOCK_R": 1, "BLOCK_C": bc, "num_warps": 8})
    return out


def elementwise_configs(problem: dict) -> list[dict]:
    return [{"BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (2048, 8), (4096, 8), (512, 4))]


class CudaTarget(Target):
    name = "cuda"
    device = "cuda"
    warp_size = 32
    archs = ARCHS
    bf16_dot_ok = True
    math_imports = "from triton.language.extra import libdevice"
    extra_math = _LIBDEVICE
    fast_math = _FAST_BF16

    def dot_input_precisions(self, policy: str):
        # 3xtf32: our own split (weights split once at load), measured fastest fp32-accurate
        # scheme on the H200 (benchmarks/gemm); tf32x3 and bf16x6 are Triton's built-ins
        return {"strict": ("3xtf32", "tf32x3", "bf16x6"), "tf32": ("tf32",),
                "bf16": (None,)}[policy]

    @property
    def sm(self) -> int:
        """The compute capability x10 (90 for sm_90), as Triton's GPUTarget takes it."""
        return int(self.arch.removeprefix("sm_"))

    def available(self) -> bool:
        import torch
        # a ROCm build of PyTorch reports its AMD GPUs as "cuda" too
        return torch.cuda.is_available() and getattr(torch.version, "hip", None) is None

    def device_name(self) -> str:
        import torch
        return torch.cuda.get_device_name() if self.available() else self.arch_info.device

    def device_info(self) -> dict:
        if not self.available():
            return {}
        import subprocess

        import torch
        props = torch.cuda.get_device_properties(0)
        info = {"name": props.name, "sms": props.multi_processor_count,
                "memory_gib": round(props.total_memory / 2 ** 30, 1),
                "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:   # noqa: BLE001 - informational
            pass
        return info

    def empty_cache(self) -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def can_cross_compile(self) -> bool:
        try:
            import triton.backends.nvidia.compiler  # noqa: F401
            return True
        except Exception:   # noqa: BLE001 - a Triton without the NVIDIA backend
            return False

    def cross_compile(self, jobs: list[dict]) -> list[list]:
        from kforge.crosscompile import compile_source
        return [compile_source(j["source"], j["args"], self.sm, name=j["name"],
                               weights=tuple(j.get("weights", ()))) for j in jobs]

    def time_ms(self, fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    def synchronize(self) -> None:
        import torch
        torch.cuda.synchronize()

    def configs(self, kind: str, problem: dict) -> list[dict]:
        if kind == "gemm":
            return gemm_configs(problem, problem.get("precision") == "bf16", self.compute_units)
        if kind == "rows":
            return row_configs(problem)
        return elementwise_configs(problem)

    def describe(self) -> str:
        a, p = self.arch_info, self.peaks
        mma = ("tl.dot lowers to wgmma when BLOCK_M is a multiple of 64 and num_warps is 4 or 8"
               if self.sm >= 90 else "tl.dot lowers to mma.sync")
        return (f"Target cuda: {a.device} ({a.name}, {a.compute_units} SMs). Peaks ({a.source}): "
                f"fp32 {p.fp32 / 1e12:.0f} TFLOP/s, TF32 {p.tf32 / 1e12:.0f}, bf16 "
                f"{p.bf16 / 1e12:.0f}, {p.bytes_per_s / 1e12:.2f} TB/s. {mma}; fp32-accurate products "
                "use input_precision='tf32x3' (or 'bf16x6'); bf16 operands with fp32 "
                "accumulation are the fastest path. Kernels are timed with "
                "triton.testing.do_bench. Math beyond core tl is in "
                "triton.language.extra.libdevice.")
