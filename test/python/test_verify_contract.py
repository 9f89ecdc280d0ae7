"""The fp32-grade strict contract (kforge.verify.contract; issue 13, item 3) on the Triton
interpreter: a GEMM + row-sum kernel whose hi/lo split is too coarse (bf16 parts) passes the
RMS-scaled 1e-4 rule and is rejected by the contract; the same kernel with fp16 parts (the
builtin's fp16x3) or tf32 parts (3xTF32) is verified. Plus the contract's arithmetic itself,
and the verifier's memory-bounded comparison."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from kforge.spec import load_spec
from kforge.verify import compare_outputs, contract, verify_candidate
from kforge.verify.inputs import make_inputs, signature_of

KERNEL = Path(__file__).parent / "fixtures" / "contract" / "gemm_rowsum_split.py"
M, K, N = 16, 256, 128


def gemm_rowsum_spec(m=M, k=K, n=N):
    """sum_n (x @ w)[m, n] as the exporter writes it: a matmul into a zero fill, then a
    reduction over n of its output."""
    ident2 = {"num_dims": 2, "results": [{"d": 0}, {"d": 1}], "text": "(d0, d1) -> (d0, d1)"}
    return load_spec({
        "schema": "kforge.kernel-spec", "version": 1, "hash": "c0c0c0c0c0c0c0c0",
        "name": "kforge_region_gemm_rowsum", "root_kind": "contraction",
        "fused": ["matmul", "sum"], "flops": 2 * m * k * n, "min_bytes": 4 * (m * k + k * n + m),
        "args": [{"name": "arg0", "shape": [m, k], "dtype": "f32", "weight": None},
                 {"name": "arg1", "shape": [k, n], "dtype": "f32", "weight": "fc.weight"}],
        "values": [{"name": "v0", "shape": [m, n], "dtype": "f32"},
                   {"name": "v1", "shape": [m, n], "dtype": "f32"},
                   {"name": "v2", "shape": [m], "dtype": "f32"},
                   {"name": "v3", "shape": [m], "dtype": "f32"}],
        "ops": [
            {"op": "constant", "name": "arith.constant", "operands": [], "results": ["v0"],
             "splat": 0.0},
            {"op": "generic", "name": "linalg.matmul", "operands": ["arg0", "arg1", "v0"],
             "num_inputs": 2, "results": ["v1"],
             "iterator_types": ["parallel", "parallel", "reduction"],
             "indexing_maps": [
                 {"num_dims": 3, "results": [{"d": 0}, {"d": 2}], "text": "(d0, d1, d2) -> (d0, d2)"},
                 {"num_dims": 3, "results": [{"d": 2}, {"d": 1}], "text": "(d0, d1, d2) -> (d2, d1)"},
                 {"num_dims": 3, "results": [{"d": 0}, {"d": 1}], "text": "(d0, d1, d2) -> (d0, d1)"}],
             "body": {"args": ["a0", "a1", "a2"],
                      "stmts": [{"id": "t0", "op": "arith.mulf", "operands": ["a0", "a1"], "type": "f32"},
                                {"id": "t1", "op": "arith.addf", "operands": ["a2", "t0"], "type": "f32"}],
                      "yields": ["t1"]}},
            {"op": "constant", "name": "arith.constant", "operands": [], "results": ["v2"],
             "splat": 0.0},
            {"op": "generic", "name": "linalg.generic", "operands": ["v1", "v2"],
             "num_inputs": 1, "results": ["v3"], "iterator_types": ["parallel", "reduction"],
             "indexing_maps": [ident2, {"num_dims": 2, "results": [{"d": 0}],
                                        "text": "(d0, d1) -> (d0)"}],
             "body": {"args": ["a0", "a1"],
                      "stmts": [{"id": "t", "op": "arith.addf", "operands": ["a1", "a0"], "type": "f32"}],
                      "yields": ["t"]}}],
        "results": ["v3"]})


def kernel_source(split: str) -> str:
    src = KERNEL.read_text()
    assert 'SPLIT = "f16"' in src
    return src.replace('SPLIT = "f16"', f'SPLIT = "{split}"')


def _run_in_process(split: str, inputs):
    """The fixture kernel run here (the interpreter), to look at its errors directly."""
    spec = importlib.util.spec_from_file_location(f"_rowsum_{split}", KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.SPLIT = split
    return mod.launch(*inputs)


@pytest.fixture(scope="module")
def spec():
    return gemm_rowsum_spec()


def test_coarse_split_passes_the_rms_rule_but_not_the_contract(spec):
    """The case of issue 13: a row sum over a GEMM output that the RMS-scaled tolerance
    accepted. bf16 hi/lo parts: inside 1e-4 x RMS(ref) of the row sums, tens of times the
    error of PyTorch's own fp32 computation."""
    from kforge.reference import reference_fn

    sig = signature_of(spec)
    inputs = make_inputs(sig, 1, 8)
    (out,) = _run_in_process("bf16", inputs)
    (ref,) = reference_fn(spec, torch.float64)(*inputs)
    (f32,) = reference_fn(spec)(*inputs)
    e32 = contract.fp32_error(f32, ref)
    err = float((out.double() - ref).abs().max())
    assert 0 < e32 < err / 10                         # far less accurate than fp32 ...
    assert compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4).ok     # ... yet the old rule passes
    cmp = compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4, fp32_errors=[e32])
    assert not cmp.ok and "strict contract" in cmp.message

    record = verify_candidate(spec, kernel_source("bf16"), "cpu", "strict")
    assert record.status == "rejected" and record.reason == "mismatch", record.message
    assert "strict contract" in record.message and "PyTorch's own fp32 error" in record.message
    assert record.fp32_error_ratio > 2.0
    # under tf32 (no contract) the same kernel is well inside the policy's tolerance
    assert verify_candidate(spec, kernel_source("bf16"), "cpu", "tf32").verified


@pytest.mark.parametrize("split", ["f16", "tf32"])
def test_fp32_grade_splits_still_verify(spec, split):
    record = verify_candidate(spec, kernel_source(split), "cpu", "strict")
    assert record.status == "verified", record.message
    assert 0 < record.fp32_error_ratio <= 2.0          # recorded: the contract's margin


def test_contract_bound_is_relative_to_fp32s_error():
    ref = torch.tensor([1.0, -2.0, 3.0, 1e-3], dtype=torch.float64)
    e32 = 1e-6
    two = contract.FACTOR
    assert contract.check(ref + 1.9e-6, ref, e32, fac=two).ok             # < 2 x E32
    bad = ref.clone()
    bad[2] += 2.1e-6
    c = contract.check(bad, ref, e32, fac=two)
    assert not c.ok and c.bad == 1 and c.first_bad == 2
    assert c.expected == 3.0 and math.isclose(c.max_err, 2.1e-6, rel_tol=1e-6)
    # by default the factor follows the result's size: 3 x E32 under 4,096 elements (there
    # E32 is the largest of few errors, a noisy estimate), 2 x from 4,096 on
    assert contract.check(bad, ref, e32).ok and not contract.check(ref + 3.1e-6, ref, e32).ok
    big = torch.ones(contract.SMALL_RESULT, dtype=torch.float64)
    over = big.clone()
    over[7] += 2.1e-6
    c = contract.check(over, big, e32)
    assert not c.ok and c.bad == 1 and c.first_bad == 7
    assert contract.check(over[:contract.SMALL_RESULT - 1], big[:contract.SMALL_RESULT - 1],
                          e32).ok
    # where fp32 is exact (E32 = 0), a few ulp of each element are allowed, not more
    exact = torch.tensor([1.0, 100.0], dtype=torch.float64)
    eps = torch.finfo(torch.float32).eps
    assert contract.check((exact * (1 + 3 * eps)).float(), exact, 0.0).ok
    assert not contract.check(exact * (1 + 8 * eps), exact, 0.0, dtype=torch.float32).ok
    # NaN where the reference is finite is over any bound; non-finite references are left
    # to the policy's rule
    assert not contract.check(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0],
                              dtype=torch.float64), 1.0).ok
    assert contract.check(torch.tensor([5.0]), torch.tensor([float("inf")],
                          dtype=torch.float64), 0.0).ok


def test_chunked_comparison_equals_one_pass(monkeypatch, spec):
    """The policy's rule computed a chunk at a time gives the one-pass answer: same verdict,
    same errors, same first wrong element, whatever the chunk size."""
    sig = signature_of(gemm_rowsum_spec(m=64))
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, generator=g, dtype=torch.float64) * 10
    out = ref.float().clone()
    out[37] += 0.5
    out[50] = float("nan")
    whole = compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4)
    monkeypatch.setattr(contract, "CHUNK", 7)
    chunked = compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4)
    assert not whole.ok and not chunked.ok
    assert whole.message == chunked.message and "(37)" in whole.message
    assert "1 of them NaN" in whole.message
    assert (whole.max_abs, whole.max_rel) == (chunked.max_abs, chunked.max_rel)


def test_strict_rule_never_demands_more_than_twice_fp32s_own_error():
    """Where PyTorch's own fp32 computation of a region is farther from float64 than strict's
    1e-4 (gpt-oss's RoPE projections: 1.2x outside on the verifier's inputs), the rule's
    tolerance is at least the contract's bound, 2 x fp32's error (3 x for a result under 4,096
    elements); an element beyond that bound still fails, and where fp32 is well inside 1e-4 the
    rule is unchanged."""
    n = contract.SMALL_RESULT
    sig = signature_of(gemm_rowsum_spec(m=n))
    ref = torch.linspace(-0.5, 0.5, n, dtype=torch.float64)
    out = ref.float().clone()
    out[9] += 1.6e-4                              # outside 1e-4 + 1e-4 * |ref|
    assert not compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4).ok
    # fp32 itself 1.2e-4 off somewhere: 1.6e-4 is within 2 x 1.2e-4, rule and contract pass
    assert compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4, fp32_errors=[1.2e-4]).ok
    # fp32 inside the rule (2 x E32 below the tolerance): the rule decides, as before
    fails = compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4, fp32_errors=[4e-5])
    assert not fails.ok and "outside atol" in fails.message and "fp32 error" not in fails.message
    # beyond twice fp32's error: outside the widened rule, which says so
    out[9] += 1e-4
    worse = compare_outputs([out], [ref], sig, 8, 1e-4, 1e-4, fp32_errors=[1.2e-4])
    assert not worse.ok and "2 x PyTorch's own fp32 error" in worse.message
    # a result of 64 elements: within 3 x fp32's error
    small = signature_of(gemm_rowsum_spec(m=64))
    assert compare_outputs([out[:64]], [ref[:64]], small, 8, 1e-4, 1e-4,
                           fp32_errors=[1.2e-4]).ok
