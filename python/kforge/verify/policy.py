"""Precision policies: the contract the user picks, and the tolerances verification applies."""
from __future__ import annotations

from dataclasses import dataclass

from kforge.errors import UserError


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    atol: float
    rtol: float
    compute: str
    # The format this policy lets contraction operands be rounded to ("tf32", "bf16"; None for
    # strict). Verification (kforge.verify.verifier, REDUCED_PRECISION_MARGIN) holds such a
    # policy's candidates to half its tolerance on unit-scale inputs, and on wide-magnitude
    # inputs accepts the exact result OR that of the policy's own arithmetic (the same products
    # with operands rounded to this format, kforge.reference `operand_format`).
    operand_format: str | None = None
    # strict: results must also be as accurate as PyTorch's own fp32 computation of the
    # region, within a factor (kforge.verify.contract)
    fp32_grade: bool = False

    def tolerance_text(self) -> str:
        return f"atol = rtol = {self.atol:g}" if self.atol == self.rtol else \
            f"atol = {self.atol:g}, rtol = {self.rtol:g}"


POLICIES = {
    "strict": PrecisionPolicy("strict", 1e-4, 1e-4, "fp32 results (fp32-accurate emulation "
                              "allowed: tf32x3, hi/lo splits)", fp32_grade=True),
    "tf32": PrecisionPolicy("tf32", 1e-2, 1e-2, "TF32-grade products (TF32 tensor cores, or "
                            "fp16 operands scaled by powers of two: the same 11-bit "
                            "significands)", "tf32"),
    "bf16": PrecisionPolicy("bf16", 1e-2, 1e-2, "bf16 operands, fp32 accumulate", "bf16"),
}


def get_policy(name: str) -> PrecisionPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise UserError(f"unknown precision policy {name!r}; choose one of "
                        f"{', '.join(POLICIES)}") from None
