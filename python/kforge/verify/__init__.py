"""Verification of candidate kernels: static checks, sandboxed runs, element-wise comparison.

`verify_candidate(spec, candidate, target, precision)` -> `VerificationRecord`.
"""
from kforge.verify.policy import POLICIES, PrecisionPolicy, get_policy
from kforge.verify.static import Violation, static_check
from kforge.verify.verifier import (OracleError, VerificationOutOfMemory, VerificationRecord,
                                    compare_outputs, device_name, is_out_of_memory,
                                    target_available, target_name, verify_candidate)

__all__ = ["POLICIES", "PrecisionPolicy", "get_policy", "Violation", "static_check",
           "OracleError", "VerificationOutOfMemory", "VerificationRecord", "is_out_of_memory", "compare_outputs", "device_name", "target_available",
           "target_name", "verify_candidate"]
