"""The Triton interpreter as KForge runs it (the cpu target).

Standalone (no kforge imports): the sandbox worker loads it by path.

The interpreter sanitizes every 32-bit integer add, sub and mul: it widens both sides to
int64, computes, compares with the type's range and builds an assertion, on every program of
every launch, and then, outside Triton's debug mode, drops the assertion unchecked. About half of
a kernel's interpreter time went there (measured: a ConvNeXt package's run took 7.8 s with it,
4.4 s without, bit-identical outputs). A GPU build outside debug mode has no such check either.
So KForge turns it off where it cannot assert (debug off); results do not change.
"""
from __future__ import annotations

import dataclasses
import os
import sys


def drop_overflow_checks() -> bool:
    """Turn off the interpreter's unchecked overflow sanitizing for this process. Does nothing
    unless TRITON_INTERPRET=1 and triton is imported, or in debug mode (where it asserts).
    Returns whether it is off."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None:
        if "triton" not in sys.modules:
            return False
        try:
            import triton.runtime.interpreter as interp
        except ImportError:
            return False
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not hasattr(options, "sanitize_overflow") or \
            getattr(options, "debug", True):
        return False      # debug mode, or another Triton: its interpreter is left as it is
    if options.sanitize_overflow:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
