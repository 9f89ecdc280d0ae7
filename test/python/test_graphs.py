"""kforge.graphs: a plan replayed as a CUDA graph, large inputs read in place (GPU only)."""
import pytest
import torch

from kforge.graphs import ADDRESS_MISSES, BORROW_BYTES, PlanGraphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def always(monkeypatch):
    """Captures kept without timing them: these tests are about what a capture reads."""
    monkeypatch.setenv("KFORGE_CUDA_GRAPHS", "always")


def _plan(args, track=None):
    small, big = args
    return (small * 2 + big.sum(dim=0, keepdim=True),)


def _big(fill: float) -> torch.Tensor:
    rows = BORROW_BYTES // (4 * 256) + 1
    return torch.full((rows, 256), fill, device="cuda")


def test_a_large_input_is_read_in_place_and_keyed_by_its_address(always):
    graphs = PlanGraphs(_plan, torch.device("cuda"))
    small, big = torch.ones(1, 256, device="cuda"), _big(1.0)
    (out,) = graphs([small, big])
    entry = next(iter(graphs.captured.values()))
    assert entry.inputs[1] is big and entry.inputs[0] is not small    # borrowed / copied
    torch.testing.assert_close(out, _plan([small, big])[0])
    big.fill_(3.0)                       # the graph reads the caller's memory: no copy to miss
    small.fill_(5.0)                     # a small input is copied in on every call
    (out,) = graphs([small, big])
    torch.testing.assert_close(out, _plan([small, big])[0])
    assert len(graphs.captured) == 1
    other = _big(2.0)                    # another tensor of the same shape: its own capture
    (out,) = graphs([small, other])
    torch.testing.assert_close(out, _plan([small, other])[0])
    assert len(graphs.captured) == 2


def test_a_plan_that_writes_to_an_input_is_captured_on_copies(always):
    def writes(args, track=None):
        small, big = args
        big.add_(0)                      # bumps the version counter without changing values
        return (small + big[:1],)

    graphs = PlanGraphs(writes, torch.device("cuda"))
    small, big = torch.ones(1, 256, device="cuda"), _big(1.0)
    (out,) = graphs([small, big])
    assert graphs.borrow is False
    entry = next(e for e in graphs.captured.values())
    assert entry.inputs[1] is not big
    big.fill_(4.0)
    (out,) = graphs([small, big])
    torch.testing.assert_close(out, small + 4.0)


def test_new_large_tensors_every_call_are_copied_after_a_few_captures(always):
    """A caller that allocates its cache anew each step would otherwise get a capture (and a
    reference to its 4 GB tensor) per call: after ADDRESS_MISSES new addresses for one
    signature the graphs copy large inputs too, and keep no borrowed tensor."""
    graphs = PlanGraphs(_plan, torch.device("cuda"))
    small = torch.ones(1, 256, device="cuda")
    for i in range(ADDRESS_MISSES + 3):
        big = _big(float(i))
        (out,) = graphs([small, big])
        torch.testing.assert_close(out, _plan([small, big])[0])
    assert graphs.borrow is False and len(graphs.captured) == 1
    entry = next(iter(graphs.captured.values()))
    assert all(t is not big for t in entry.inputs)


def test_a_capture_after_the_last_graph_is_gone_takes_a_fresh_pool(always):
    """Captures that share a pool keep it alive; once none is left (a capture that failed, or
    every capture dropped after address misses) the next capture must not reopen that pool."""
    def syncs(args, track=None):
        if args[0].shape[0] == 1:
            args[0].sum().item()           # a host synchronization: cannot be captured
        return (args[0] * 2.0,)

    graphs = PlanGraphs(syncs, torch.device("cuda"))
    one, two = torch.ones(1, 256, device="cuda"), torch.ones(2, 256, device="cuda")
    assert torch.equal(graphs([one])[0], one * 2.0)
    assert len(graphs.skipped) == 1 and not graphs.captured
    assert torch.equal(graphs([two])[0], two * 2.0)
    assert len(graphs.captured) == 1


def test_a_plan_whose_copies_cost_more_than_its_launches_runs_step_by_step():
    """One kernel over a large tensor with a large output: the replay adds a copy of the output
    (the next replay writes the same buffer) and saves one launch, so it is slower; the plan
    runs step by step, and a new tensor of the same shape is not captured again."""
    def doubles(args, track=None):
        return (args[0] * 2.0,)

    graphs = PlanGraphs(doubles, torch.device("cuda"))
    big = torch.randn(64 << 20, device="cuda")          # 256 MiB in, 256 MiB out
    (out,) = graphs([big])
    torch.testing.assert_close(out, big * 2.0)
    assert not graphs.captured and len(graphs.slower) == 1
    assert "step by step is as fast" in next(iter(graphs.slower.values()))
    assert graphs.run_as()["graphs"] == 0 and graphs.run_as()["step_by_step"]
    other = torch.randn(64 << 20, device="cuda")
    (out,) = graphs([other])
    torch.testing.assert_close(out, other * 2.0)
    assert not graphs.captured and len(graphs.slower) == 1


def test_a_plan_whose_python_hides_behind_its_gpu_work_runs_step_by_step():
    """A plan that spends 0.4 ms in Python before its GPU work (about 0.65 ms: five passes over
    256 MiB) with a 256 MiB output: issued back to back, step by step costs the GPU work and the
    replay adds the output's copy, so the plan runs step by step. (Timed from an idle GPU, one
    call at a time, the Python counted in full and the graph looked faster.)"""
    import time

    def slow_host(args, track=None):
        time.sleep(0.0004)
        x = args[0]
        for _ in range(5):
            x = x * 1.0001
        return (x,)

    graphs = PlanGraphs(slow_host, torch.device("cuda"))
    big = torch.randn(64 << 20, device="cuda")
    (out,) = graphs([big])
    torch.testing.assert_close(out, slow_host([big])[0])
    assert not graphs.captured and len(graphs.slower) == 1


def test_a_plan_of_many_small_launches_is_replayed():
    def chain(args, track=None):
        x = args[0]
        for _ in range(300):
            x = x * 1.0001 + 0.5
        return (x,)

    graphs = PlanGraphs(chain, torch.device("cuda"))
    small = torch.ones(256, device="cuda")
    (out,) = graphs([small])
    torch.testing.assert_close(out, chain([small])[0])
    assert len(graphs.captured) == 1 and not graphs.slower
    assert graphs.run_as() == {"graphs": 1, "step_by_step": [], "not_capturable": []}


def test_a_failed_capture_leaves_the_stream_and_random_numbers_as_they_were(always):
    """A plan that synchronizes inside the capture cannot be captured: it runs step by step,
    with a warning. PyTorch's `torch.cuda.graph` raises from `capture_end` then, leaving its
    capture stream current and CUDA's random generator marked as capturing: every later draw
    failed with "Offset increment outside graph capture encountered unexpectedly" (H100,
    2026-12-07: torch.compile's max-autotune, after a bf16 package's failed capture, in the
    same process). kforge.graphs puts both back."""
    def syncs(args, track=None):
        (x,) = args
        if torch.cuda.is_current_stream_capturing():
            x.sum().item()                    # not permitted while capturing
        return (x * 2,)

    caller = torch.cuda.current_stream()
    graphs = PlanGraphs(syncs, torch.device("cuda"))
    x = torch.ones(4, 256, device="cuda")
    with pytest.warns(UserWarning, match="cannot run as a CUDA graph"):
        (out,) = graphs([x])
    torch.testing.assert_close(out, x * 2)
    assert graphs.skipped and not graphs.captured
    assert torch.cuda.current_stream() == caller
    assert torch.rand(1024, device="cuda").shape == (1024,)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)
    assert 0 < int((dropped == 0).sum()) < x.numel()
    # and a capture after it works as before
    g = torch.cuda.CUDAGraph()
    y = torch.zeros(8, device="cuda")
    with torch.cuda.graph(g):
        y.add_(torch.rand(8, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert bool((y > 0).any())
