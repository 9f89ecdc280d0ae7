"""The cpu target's Triton interpreter runs without its overflow sanitizing, which outside
Triton's debug mode computes an assertion and drops it (kforge.verify.interpreter): KForge's
runtime and its verification worker turn it off, and results do not change."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    import triton.runtime.interpreter as ti
    from kforge.verify.interpreter import drop_overflow_checks

    @triton.jit
    def k(x, y):
        v = tl.load(x + tl.arange(0, 4))
        tl.store(y + tl.arange(0, 4), v * 3 + 2147483000)     # int32: overflows, wraps

    x = torch.tensor([1000, -5, 7, 2 ** 30], dtype=torch.int32)
    outs = []
    for _ in range(2):
        y = torch.zeros(4, dtype=torch.int32)
        k[(1,)](x, y)
        outs.append(y.tolist())
        print("sanitize", ti.interpreter_builder.options.sanitize_overflow)
        print("dropped", drop_overflow_checks())
    print("same", outs[0] == outs[1], outs[1])
""")


def test_overflow_sanitizing_is_dropped_without_changing_results():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(PYTHON_DIR)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[:4] == ["sanitize True", "dropped True", "sanitize False", "dropped True"], lines
    want = [(v * 3 + 2147483000 + 2 ** 31) % 2 ** 32 - 2 ** 31 for v in (1000, -5, 7, 2 ** 30)]
    assert lines[4] == f"same True {want}", lines


def test_the_runtime_drops_it_when_it_loads_a_cpu_package(tmp_path):
    import triton.runtime.interpreter as ti
    from kforge.runtime import load_kernel_module
    ti.interpreter_builder.options = ti.InterpreterOptions()       # as Triton starts
    assert ti.interpreter_builder.options.sanitize_overflow
    src = tmp_path / "kernel.py"
    src.write_text("import triton\n")
    load_kernel_module(src, "cpu")
    assert not ti.interpreter_builder.options.sanitize_overflow
