"""Operand passes shared between regions within one run (kforge.passcache): the generated
launch hands its split pass to `_shared_pass`, which runs it alone and, inside a package run,
serves the planes an earlier launch computed from the same unchanged input. Kernels run under
the Triton interpreter against the float64 reference."""
from __future__ import annotations

import pytest
import torch

from kforge import passcache
from kforge.providers.builtin import candidates, config_space
from kforge.reference import reference_fn
from test_builtin import TOL, load_candidate, make_args, run_candidate, spec


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")
    monkeypatch.delenv("KFORGE_SHARED_PASSES", raising=False)


def _fp16x1(name: str, precision: str = "bf16"):
    s = spec(name)
    config = next(c for c in config_space(s, "cpu", precision)
                  if c.get("input_precision") == "fp16x1" and c.get("SPLIT_K", 1) == 1)
    return s, candidates(s, "cpu", precision, [config])[0]


def test_cache_serves_the_same_key_on_the_same_unchanged_inputs():
    cache = passcache.PassCache(size=2)
    x, y = torch.ones(4, 8), torch.zeros(4, 8)
    calls = []

    def run(tag):
        def go():
            calls.append(tag)
            return (torch.full((2,), float(len(calls))),)
        return go

    first = cache.serve("k", (x,), run("a"))
    assert cache.serve("k", (x,), run("b")) is first and calls == ["a"]
    assert cache.serve("k", (x.view(4, 8),), run("c")) is first      # a view of the same memory
    assert cache.serve("other", (x,), run("d")) is not first          # another pass
    assert cache.serve("k", (x[:, :4],), run("e")) is not first       # another shape
    x.add_(1)                                                        # written since: a new run
    assert cache.serve("k", (x,), run("f")) is not first
    cache.serve("k", (y,), run("g"))
    assert len(cache.entries) == 2 and cache.hits == 2 and calls == ["a", "d", "e", "f", "g"]


def test_outside_a_run_every_launch_runs_its_own_pass():
    calls = []
    for _ in range(3):
        passcache.shared_pass("k", (torch.ones(2),), lambda: calls.append(1) or (None,))
    assert len(calls) == 3
    with passcache.active_run() as cache:
        x = torch.ones(2)
        for _ in range(3):
            passcache.shared_pass("k", (x,), lambda: calls.append(1) or (None,))
        assert len(calls) == 4 and cache.hits == 2
    assert not cache.entries                                   # dropped when the run ends


def test_two_regions_on_one_activation_split_it_once_in_a_run(tmp_path, monkeypatch):
    """Two fp16x1 GEMM regions (other weights, the same activation), each verified alone: in a
    run the second launch's split pass is served from the first's, and both still match the
    float64 reference exactly as when each splits for itself; with KFORGE_SHARED_PASSES=0, or
    after the activation is written in place, the pass runs again."""
    s, cand = _fp16x1("matmul_bias_relu")
    assert cand.source.count(" = _shared_pass(") == 1 and "def _shared_pass(" in cand.source
    one = load_candidate(cand.source, tmp_path / "one.py")
    two = load_candidate(cand.source, tmp_path / "two.py")
    for m in (one, two):
        passcache.bind(m)
    a = make_args(s, 0)
    b = make_args(s, 1)
    act = [i for i, x in enumerate(s.args) if not x.weight]
    assert len(act) == 1
    b[act[0]] = a[act[0]]                                    # the same activation tensor
    ref = reference_fn(s)
    alone = [run_candidate(one, s, a)[0], run_candidate(two, s, b)[0]]
    with passcache.active_run() as cache:
        shared = [run_candidate(one, s, a)[0], run_candidate(two, s, b)[0]]
        assert (cache.runs, cache.hits) == (1, 1)
        a[act[0]].mul_(2.0)                                  # written: the planes are stale
        again = run_candidate(two, s, b)[0]
        assert (cache.runs, cache.hits) == (2, 1)
    for got, want in zip(shared, alone):
        assert torch.equal(got, want)
    torch.testing.assert_close(again, ref(*b)[0], atol=TOL["bf16"], rtol=TOL["bf16"])
    monkeypatch.setenv("KFORGE_SHARED_PASSES", "0")
    with passcache.active_run() as cache:
        assert cache is None
        run_candidate(one, s, a), run_candidate(two, s, b)


def test_a_region_splits_only_its_own_activation(tmp_path):
    """A pass key names what the pass computes: two regions with different activations never
    share, even when their passes are the same kernel."""
    s, cand = _fp16x1("matmul_bias_relu")
    one = load_candidate(cand.source, tmp_path / "one.py")
    passcache.bind(one)
    a, b = make_args(s, 0), make_args(s, 1)
    ref = reference_fn(s)
    with passcache.active_run() as cache:
        got = [run_candidate(one, s, a)[0], run_candidate(one, s, b)[0]]
        assert (cache.runs, cache.hits) == (2, 0)
    for g, args in zip(got, (a, b)):
        torch.testing.assert_close(g, ref(*args)[0], atol=TOL["bf16"], rtol=TOL["bf16"])
