"""The Triton interpreter (TRITON_INTERPRET=1) on CPU tensors: for tests and machines without
a GPU. Slow (numpy per program), so configurations favour few, large programs. bf16 tl.dot
gives wrong results in the interpreter: bf16 operands are rounded to bf16 and then multiplied
in fp32. The interpreter implements only core tl math: other functions are spelled with it."""
from __future__ import annotations

from kforge.targets.base import Arch, Peaks, Target, pow2_at_least

# tanh: Cephes' single-precision polynomial below |x| = 0.625, where 1 - 2 / (e^2x + 1)
# cancels (that form alone is ~1e-6 relative near 0.1, outside the strict contract's 2x of
# PyTorch's own error); expm1 and log1p: Kahan's corrections of exp(x) - 1 and log(1 + x).
_TANH_SMALL = ("((((-5.70498872745e-3 * ({0} * {0}) + 2.06390887954e-2) * ({0} * {0})"
               " - 5.37397155531e-2) * ({0} * {0}) + 1.33314422036e-1) * ({0} * {0})"
               " - 3.33332819422e-1) * ({0} * {0}) * {0} + {0}")
_TANH_LARGE = "tl.where({0} >= 0, 1.0, -1.0) * (1.0 - 2.0 / (tl.exp(2.0 * tl.abs({0})) + 1.0))"
_FORMULAS = {
    "math.tanh": f"tl.where(tl.abs({{0}}) < 0.625, {_TANH_SMALL}, {_TANH_LARGE})",
    "math.expm1": "tl.where(tl.exp({0}) == 1.0, {0}, (tl.exp({0}) - 1.0) * {0} / "
                  "tl.log(tl.exp({0})))",
    "math.log1p": "tl.where(1.0 + {0} == 1.0, {0}, tl.log(1.0 + {0}) * {0} / ((1.0 + {0}) - 1.0))",
    "math.erfc": "(1.0 - tl.erf({0}))",
    "math.tan": "(tl.sin({0}) / tl.cos({0}))",
    "math.powf": "tl.exp2({1} * tl.log2({0}))",
    "math.round": "tl.where({0} >= 0, tl.floor({0} + 0.5), tl.ceil({0} - 0.5))",
    "math.trunc": "tl.where({0} >= 0, tl.floor({0}), tl.ceil({0}))",
}


class CpuTarget(Target):
    name = "cpu"
    device = "cpu"
    interpreter = True
    archs = {"interpreter": Arch("interpreter", "Triton interpreter (cpu)", 1,
                                 Peaks(fp32=1e11, tf32=1e11, bf16=1e11, bytes_per_s=2e10),
                                 shared_bytes=1 << 30, source="nominal")}
    bf16_dot_ok = False
    bf16_math_ok = False
    extra_math = _FORMULAS

    def dot_input_precisions(self, policy: str):
        # the interpreter multiplies fp32 exactly; 3xtf32 is offered so that its code is tested
        return {"strict": ("ieee", "3xtf32"), "tf32": ("ieee",), "bf16": (None,)}[policy]

    def configs(self, kind: str, problem: dict) -> list[dict]:
        if kind == "gemm":
            bn = 32
            if problem.get("full_rows"):
                bn = max(16, pow2_at_least(problem["N"]))
            return [{"BLOCK_M": 32, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_K": 1,
                     "num_warps": 4, "num_stages": 1},
                    {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": 16, "GROUP_M": 2, "SPLIT_K": 2,
                     "num_warps": 4, "num_stages": 1}]
        if kind == "rows":
            whole = pow2_at_least(problem["cols"])
            # the interpreter runs programs one after another, each as a few numpy calls:
            # blocks of up to 4096 elements (ResNet's 3x3 max pool, 2,048 rows of 9: 512
            # programs of 4 rows took 5.7 s a call; 8 of 256 rows take a fraction of it)
            rows = max(4, min(pow2_at_least(problem.get("rows", 4)), 4096 // whole))
            out = [{"BLOCK_R": rows, "BLOCK_C": whole, "num_warps": 4}]
            if problem["cols"] > 8:
                out.append({"BLOCK_R": 2, "BLOCK_C": max(8, whole // 4), "num_warps": 4})
            return out
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 64, "num_warps": 4}]

    def describe(self) -> str:
        return ("Target cpu: the Triton interpreter (TRITON_INTERPRET=1) on CPU tensors. Only "
                "core tl math is available (no libdevice); bf16 tl.dot is wrong here, so bf16 "
                "operands are rounded to bf16 and multiplied as fp32. Speed is not meaningful.")
