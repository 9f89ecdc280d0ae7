"""Intel GPUs through Triton's Intel XPU backend.

No Intel GPU is available to the project: kernels are generated, compiled for real to SPIR-V by
`triton-xpu` in an environment of its own (kforge.targets.xpu_env), and their compile reports
read (DPAS used, 2D block loads, SPIR-V size); their speed and their results on a device are
not checked here.

Architectures: `pvc` (Data Center GPU Max 1550, Xe-HPC; the default: the GPU Intel's backend is
developed and tested on first) and `bmg` (Arc B580, Xe2). In
triton-xpu 3.3 the code generated depends on the device properties below (sub-group sizes,
DPAS, 2D block I/O), which the Intel driver reports on a real device; the architecture's name
only selects them (and the `ocloc` query a oneAPI install would add). This version emits TF32
DPAS for tf32 products whether or not the device reports the TF32 extension; bmg is assumed
without it (fp32 products at the vector rate), and whether IGC would accept TF32 DPAS for it is
not checked here.

Configurations follow Intel's own GEMM benchmarks for this backend
(benchmarks/triton_kernels_benchmark/gemm_*_benchmark.py in intel-xpu-backend-for-triton):
256x256x32 tiles with 32 warps, GROUP_M 4, num_stages 2-3 and `grf_mode="large"` (256
registers a thread instead of 128, which the large tiles need; it allows at most 32 warps), and
8x512x64 for skinny M. DPAS needs 16-wide sub-groups: the backend compiles a kernel with a dot
with sub-group size 16 (`threads_per_warp` 16), whatever the GPUTarget's warp size.
"""
from __future__ import annotations

from typing import Callable

from kforge.targets.base import Arch, Peaks, Target, pow2_at_least
from kforge.targets.cuda import _LIBDEVICE

# Device properties as the Intel driver reports them (torch.xpu.get_device_properties), the
# `arch` dict of GPUTarget("xpu", ...)
_XE_COMMON = {"sub_group_sizes": [16, 32], "max_work_group_size": 1024,
              "has_subgroup_matrix_multiply_accumulate": True,
              "has_subgroup_2d_block_io": True, "has_bfloat16_conversions": True}
ARCHS = {
    "pvc": Arch("pvc", "Intel Data Center GPU Max 1550 (Xe-HPC)", 128,
                Peaks(fp32=52e12, tf32=419e12, bf16=838e12, bytes_per_s=3.28e12),
                shared_bytes=128 * 1024,
                properties={**_XE_COMMON, "name": "Intel(R) Data Center GPU Max 1550",
                            "max_num_sub_groups": 64, "has_fp64": True,
                            "has_subgroup_matrix_multiply_accumulate_tensor_float32": True,
                            "gpu_eu_count": 1024},
                source="Max 1550 datasheet (not measured)"),
    "bmg": Arch("bmg", "Intel Arc B580 (Xe2)", 20,
                # datasheet: 233 TOPS int8 -> 117 TFLOP/s fp16/bf16 on XMX; TF32 not in XMX
                # (fp32 products run at the vector rate); 456 GB/s GDDR6
                Peaks(fp32=13.7e12, tf32=13.7e12, bf16=117e12, bytes_per_s=0.456e12),
                shared_bytes=128 * 1024,
                properties={**_XE_COMMON, "name": "Intel(R) Arc(TM) B580 Graphics",
                            "max_num_sub_groups": 64, "has_fp64": True,
                            "has_subgroup_matrix_multiply_accumulate_tensor_float32": False,
                            "gpu_eu_count": 160},
                source="Arc B580 datasheet (not measured)"),
}


def gemm_configs(problem: dict) -> list[dict]:
    """Intel's GEMM tiles (see the module docstring); a row reduction over N is fused when one
    tile spans the row (as on cuda), with 64-row tiles and 16 warps."""
    M = problem["M"]
    if problem.get("full_rows") and pow2_at_least(problem["N"]) <= 256:
        bn = max(16, pow2_at_least(problem["N"]))
        return [{"BLOCK_M": 64, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_K": 1,
                 "num_warps": 16, "num_stages": 2, "grf_mode": "large"},
                {"BLOCK_M": 32, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_K": 1,
                 "num_warps": 8, "num_stages": 2, "grf_mode": "large"}]
    tiles = [(256, 256, 32, 32, 2), (256, 128, 32, 32, 2), (128, 256, 32, 32, 2),
             (256, 256, 32, 32, 3), (64, 128, 32, 32, 2), (128, 128, 32, 16, 2),
             (64, 64, 32, 8, 2)]
    if M <= 16:                                   # decode-like GEMMs: few rows, wide N
        tiles = [(8, 512, 64, 32, 2), (8, 128, 64, 4, 2)] + tiles
    return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 4 if bm > 8 else 1,
             "SPLIT_K": 1, "num_warps": w, "num_stages": s, "grf_mode": "large"}
            for bm, bn, bk, w, s in tiles]


class XpuTarget(Target):
    name = "xpu"
    device = "xpu"
    warp_size = 16                 # the sub-group size DPAS needs
    archs = ARCHS
    bf16_dot_ok = True
    math_imports = "from triton.language.extra import libdevice"
    extra_math = _LIBDEVICE

    def dot_input_precisions(self, policy: str):
        # without TF32 DPAS (bmg) the tf32 splits have no matrix unit: strict is fp32 FMA, or
        # the builtin's fp16x3 (fp16 DPAS), which it puts first where the peaks say it pays
        tf32 = self.arch_info.properties["has_subgroup_matrix_multiply_accumulate_tensor_float32"]
        return {"strict": ("3xtf32", "tf32x3") if tf32 else ("ieee",),
                "tf32": ("tf32",), "bf16": (None,)}[policy]

    # -- the device -------------------------------------------------------------------------
    def available(self) -> bool:
        import torch
        return bool(getattr(torch, "xpu", None)) and torch.xpu.is_available()

    def device_name(self) -> str:
        import torch
        return torch.xpu.get_device_name() if self.available() else self.arch_info.device

    def device_info(self) -> dict:
        if not self.available():
            return {}
        import torch
        props = torch.xpu.get_device_properties(0)
        return {"name": props.name, "compute_units": getattr(props, "gpu_subslice_count", None),
                "memory_gib": round(props.total_memory / 2 ** 30, 1),
                "driver": getattr(props, "driver_version", None)}

    def empty_cache(self) -> None:
        if self.available():
            import torch
            torch.xpu.empty_cache()

    def time_ms(self, fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    def synchronize(self) -> None:
        import torch
        torch.xpu.synchronize()

    # -- cross-compiling ----------------------------------------------------------------------
    def can_cross_compile(self) -> bool:
        """The xpu environment exists (it is made by `kforge xcompile --target xpu`, not by
        the builtin's screen, which must not reach for the network in the middle of a
        compile)."""
        from kforge.targets import xpu_env
        return xpu_env.ready()

    def cross_compile(self, jobs: list[dict]) -> list[list]:
        from kforge.crosscompile import KernelReport
        from kforge.targets import xpu_env
        from kforge.verify.inputs import TORCH_DTYPES
        wire = [{"name": j["name"], "source": j["source"], "weights": list(j.get("weights", ())),
                 "args": [[list(shape), str(TORCH_DTYPES[d]).removeprefix("torch.")]
                          for shape, d in j["args"]]} for j in jobs]
        version, results = xpu_env.compile_jobs(wire, self.arch, self.arch_info.properties,
                                                self.warp_size)
        fields = set(KernelReport.__dataclass_fields__)
        return [[KernelReport(**{k: v for k, v in r.items() if k in fields},
                              compiler=f"triton-xpu {version}") for r in reports]
                for reports in results]

    def launch_options(self, config: dict) -> dict:
        return {k: config[k] for k in ("grf_mode",) if k in config}

    # -- configurations -----------------------------------------------------------------------
    def configs(self, kind: str, problem: dict) -> list[dict]:
        if kind == "gemm":
            return gemm_configs(problem)
        if kind == "rows":
            whole = pow2_at_least(problem["cols"])
            out = [{"BLOCK_R": 1, "BLOCK_C": whole, "num_warps": 16}] if whole <= 16384 else []
            if problem["cols"] > 2048:
                out.append({"BLOCK_R": 1, "BLOCK_C": 2048, "num_warps": 16})
            return out
        return [{"BLOCK": b, "num_warps": w} for b, w in ((2048, 16), (1024, 8), (4096, 32))]

    def describe(self) -> str:
        a, p = self.arch_info, self.peaks
        return (f"Target xpu: {a.device} ({a.name}, {a.compute_units} Xe cores) through "
                f"Triton's Intel backend. Peaks ({a.source}): fp32 {p.fp32 / 1e12:.0f} TFLOP/s, "
                f"TF32 {p.tf32 / 1e12:.0f}, bf16 {p.bf16 / 1e12:.0f}, "
                f"{p.bytes_per_s / 1e12:.2f} TB/s. tl.dot lowers to DPAS (sub-group size 16); "
                "large tiles (256x256x32) with 32 warps and grf_mode='large' suit it; math "
                "beyond core tl is in triton.language.extra.libdevice.")
