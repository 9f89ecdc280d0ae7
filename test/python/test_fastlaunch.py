"""kforge.fastlaunch: a package kernel module's repeated launches skip Triton's per-call host
path and compute what Triton's own path computes (GPU only: the interpreter has no compiled
kernels to reuse)."""
import importlib.util
import sys

import pytest
import torch

from kforge import fastlaunch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SOURCE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 1.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _twice(x) * alpha + y + SHIFT, mask=mask)


def launch(x, y, alpha=0.5):
    out = torch.empty_like(x)
    n = x.numel()
    scale_add[(triton.cdiv(n, 256),)](x, y, out, n, alpha, BLOCK=256, num_warps=4)
    return (out,)


def launch_shift(x, y, shift):
    # every argument positional, the constexprs too
    out = torch.empty_like(x)
    n = x.numel()
    scale_add[(triton.cdiv(n, 256),)](x, y, out, n, 0.5, 256, shift)
    return (out,)
'''


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "fl_kernel.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("fl_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fl_kernel"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("fl_kernel", None)


def _want(x, y, alpha=0.5, shift=1.0):
    return x * 2.0 * alpha + y + shift


def test_repeated_launches_reuse_the_compiled_kernel_and_match(module):
    fast = fastlaunch.fast_module(module)
    kernel = fast.scale_add
    assert isinstance(kernel, fastlaunch.FastKernel)
    assert not isinstance(module.scale_add, fastlaunch.FastKernel)    # the module is unchanged
    for i in range(5):
        x = torch.randn(1000, device="cuda")
        y = torch.randn(1000, device="cuda")
        (out,) = fast.launch(x, y)
        torch.testing.assert_close(out, _want(x, y))
    assert kernel.slow_keys == 1 and len(kernel.compiled) == 1


def test_what_triton_specializes_on_gets_its_own_key(module):
    fast = fastlaunch.fast_module(module)
    kernel = fast.scale_add
    x = torch.randn(1025, device="cuda")
    y = torch.randn(1025, device="cuda")
    fast.launch(x[:1000], y[:1000])
    # a 4-byte offset: not 16-byte aligned, which Triton compiles a kernel of its own for
    (out,) = fast.launch(x[1:], y[1:])
    torch.testing.assert_close(out, _want(x[1:], y[1:]))
    # another length (an int argument) and another float value: results follow the arguments
    (out,) = fast.launch(x[:17], y[:17], alpha=3.0)
    torch.testing.assert_close(out, _want(x[:17], y[:17], 3.0))
    (out,) = fast.launch(x[:17], y[:17], alpha=-1.0)
    torch.testing.assert_close(out, _want(x[:17], y[:17], -1.0))
    assert kernel.slow_keys == 3          # 1000 aligned, 1024 misaligned, 17 (alpha: same key)


def test_a_constexpr_passed_by_position_keys_by_its_value(module):
    """A float constexpr is compiled into the kernel: another value is another kernel (a
    runtime float argument, alpha above, keys by its type only)."""
    fast = fastlaunch.fast_module(module)
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    for shift in (1.0, 2.0, 1.0, -3.0):
        (out,) = fast.launch_shift(x, y, shift)
        torch.testing.assert_close(out, _want(x, y, 0.5, shift))
    assert fast.scale_add.slow_keys == 3


def test_the_fast_path_can_be_turned_off(module, monkeypatch):
    monkeypatch.setenv("KFORGE_FAST_LAUNCH", "0")
    assert not fastlaunch.enabled()
