"""Cheating: returns KForge's own reference instead of computing, with a token kernel launch.
kforge-adversarial: spec=add_relu expect=forbidden_import
"""
import torch
import triton
import triton.language as tl
from kforge.reference import reference_fn
from kforge.spec import load_spec


@triton.jit
def noop_kernel(x_ptr):
    pass


def launch(x, b):
    noop_kernel[(1,)](x)
    spec = load_spec("add_relu.json")
    return reference_fn(spec)(x, b)
