"""Shared material for the agent tests: a tiny region, scripted kernels, request builders.

The region is relu(x + bias) over f32[?, 8] (a dynamic batch and a bias weight): small enough for
the Triton interpreter, and with a dynamic dimension and a weight so the contract is exercised.
"""
from __future__ import annotations

from kforge.providers.base import Candidate, Feedback, GenerationRequest
from kforge.spec import load_spec

SPEC_JSON = {
    "schema": "kforge.kernel-spec", "version": 1, "hash": "00aa11bb22cc33dd",
    "name": "kforge_region_00aa11bb22cc33dd", "root_kind": "elementwise",
    "fused": ["add", "relu"], "flops": 64, "min_bytes": 288,
    "args": [{"name": "arg0", "shape": [None, 8], "dtype": "f32", "weight": None},
             {"name": "arg1", "shape": [8], "dtype": "f32", "weight": "fc.bias"}],
    "values": [{"name": "v0", "shape": [None, 8], "dtype": "f32"},
               {"name": "v1", "shape": [None, 8], "dtype": "f32"}],
    "ops": [
        {"op": "empty", "name": "tensor.empty", "operands": [], "results": ["v0"],
         "dynamic_sizes_from": [["arg0", 0]]},
        {"op": "generic", "name": "linalg.generic", "operands": ["arg0", "arg1", "v0"],
         "num_inputs": 2, "results": ["v1"], "iterator_types": ["parallel", "parallel"],
         "indexing_maps": [
             {"num_dims": 2, "results": [{"d": 0}, {"d": 1}], "text": "(d0, d1) -> (d0, d1)"},
             {"num_dims": 2, "results": [{"d": 1}], "text": "(d0, d1) -> (d1)"},
             {"num_dims": 2, "results": [{"d": 0}, {"d": 1}], "text": "(d0, d1) -> (d0, d1)"}],
         "body": {"args": ["a0", "a1", "a2"], "stmts": [
             {"id": "t0", "op": "arith.addf", "operands": ["a0", "a1"], "type": "f32"},
             {"id": "t1", "op": "arith.constant", "operands": [], "value": 0.0, "type": "f32"},
             {"id": "t2", "op": "arith.maximumf", "operands": ["t0", "t1"], "type": "f32"}],
             "yields": ["t2"]}}],
    "results": ["v1"],
}

REGION_MLIR = """\
func.func @kforge_region_00aa11bb22cc33dd(%arg0: tensor<?x8xf32>, %arg1: tensor<8xf32>) -> tensor<?x8xf32> {
  %c0 = arith.constant 0 : index
  %d0 = tensor.dim %arg0, %c0 : tensor<?x8xf32>
  %0 = tensor.empty(%d0) : tensor<?x8xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : tensor<?x8xf32>, tensor<8xf32>) outs(%0 : tensor<?x8xf32>) {
  ^bb0(%in: f32, %in_0: f32, %out: f32):
    %2 = arith.addf %in, %in_0 : f32
    %cst = arith.constant 0.000000e+00 : f32
    %3 = arith.maximumf %2, %cst : f32
    linalg.yield %3 : f32
  } -> tensor<?x8xf32>
  return %1 : tensor<?x8xf32>
}"""


def kernel(block: int = 256, body: str = "tl.maximum(x + b, 0.0)") -> str:
    """relu(x + bias) as a Triton kernel; `body` and `block` vary it (wrong, slow, broken)."""
    return f'''\
import torch
import triton
import triton.language as tl


@triton.jit
def _add_relu(x_ptr, b_ptr, out_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
    # relu(x + bias), bias broadcast along rows
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs % n_cols, mask=mask)
    tl.store(out_ptr + offs, {body}, mask=mask)


def launch(x, b):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _add_relu[(triton.cdiv(n, {block}),)](x, b, out, n, x.shape[-1], BLOCK={block})
    return (out,)
'''


GOOD = kernel()
FAST = kernel(block=1024)
SLOW = kernel(block=2)
BROKEN = kernel(body="tl.maximun(x + b, 0.0)")        # AttributeError when it compiles/runs
WRONG = kernel(body="tl.maximum(x, 0.0)")             # forgets the bias: a mismatch
CHEAT = GOOD.replace("    return (out,)\n",
                     "    return (torch.relu(x + b),)   # computes with torch: rejected\n")


def spec():
    return load_spec(SPEC_JSON)


def request(**overrides) -> GenerationRequest:
    from kforge.reference import reference_source
    s = spec()
    fields = dict(spec=s, region_mlir=REGION_MLIR, reference_source=reference_source(s),
                  precision="strict", target=FakeTarget(), phase="functional", round=1)
    fields.update(overrides)
    return GenerationRequest(**fields)


class FakeTarget:
    """Stands in for kforge.targets' object where only its description matters."""
    name = "cpu"

    def describe(self) -> str:
        return "target cpu: the Triton interpreter (TRITON_INTERPRET=1); test-only description"


def seed_candidate() -> Candidate:
    return Candidate(id="builtin-seed", provider="builtin", source=GOOD)


def feedback(status: str, message: str, **kw) -> Feedback:
    return Feedback(candidate_id=kw.pop("candidate_id", "anthropic-r1-0-x"), status=status,
                    message=message, **kw)
