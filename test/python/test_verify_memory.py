"""Verification that runs out of device memory (issue 13, item 4), on the CPU: the allocator's
failure is simulated at the device edge only — torch.einsum (where the reference's GEMM
allocates its result) raising torch.OutOfMemoryError, and torch.cuda.mem_get_info reporting
the device's free memory — everything else is the real verifier, sandbox and tuner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kforge.spec import load_spec
from kforge.verify import VerificationOutOfMemory, verifier, verify_candidate

FIXTURES = Path(__file__).parent / "fixtures" / "engine"


@pytest.fixture
def matmul_bias():
    return load_spec(FIXTURES / "matmul_bias.json"), (FIXTURES / "good_matmul_bias.py").read_text()


@pytest.fixture
def no_waits(monkeypatch):
    monkeypatch.setattr(verifier, "OOM_RETRY_WAITS_S", (0.0, 0.0))


def _einsum_oom(monkeypatch, failures: int):
    """torch.einsum fails to allocate its float64 result `failures` times, then works."""
    real = torch.einsum
    left = {"n": failures}

    def einsum(eq, *operands):
        if left["n"] > 0 and any(getattr(t, "dtype", None) == torch.float64 for t in operands):
            left["n"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB. "
                                         "GPU 0 has a total capacity of 139.8 GiB")
        return real(eq, *operands)

    monkeypatch.setattr(torch, "einsum", einsum)
    return left


def test_transient_out_of_memory_is_retried(monkeypatch, no_waits, matmul_bias):
    spec, source = matmul_bias
    left = _einsum_oom(monkeypatch, failures=2)
    record = verify_candidate(spec, source, "cpu", "strict")
    assert left["n"] == 0
    assert record.status == "verified", record.message


def test_persistent_out_of_memory_names_the_region(monkeypatch, no_waits, matmul_bias):
    spec, source = matmul_bias
    _einsum_oom(monkeypatch, failures=10 ** 6)
    with pytest.raises(VerificationOutOfMemory) as info:
        verify_candidate(spec, source, "cpu", "strict")
    text = str(info.value)
    assert spec.name in text and "out of cpu memory while computing the float64 reference" in text
    assert "3 attempts" in text and "fewer jobs" in text


def test_tune_records_out_of_memory_per_region_without_a_traceback(monkeypatch, no_waits,
                                                                    matmul_bias):
    """`kforge tune`'s per-region step: the kernel stays a candidate, its record says why."""
    from kforge.tune import tune_entry

    spec, source = matmul_bias
    _einsum_oom(monkeypatch, failures=10 ** 6)
    said = []
    entry = {"target": "cpu", "provider": "test", "source": "kernel.py",
             "verification": {"status": "candidate"}}
    new, new_source = tune_entry(spec, entry, source, target="cpu", precision="strict",
                                 repair=0, say=said.append)
    assert new_source is None
    v = new["verification"]
    assert v["status"] == "candidate" and v["reason"] == "out_of_memory"
    assert spec.name in v["message"]
    assert any("not verified" in m and "memory" in m for m in said)


def _hold_reservation(root: Path, tag: str, nbytes: int) -> subprocess.Popen:
    """Another verification on the device: a live process holding a reservation."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = root / tag
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{holder.pid}-other.reservation").write_text(
        json.dumps({"pid": holder.pid, "bytes": nbytes, "since": time.time()}))
    return holder


def test_tune_admits_by_free_device_memory(monkeypatch, tmp_path, matmul_bias):
    """With another job's reservation on the device and too little free memory (as
    torch.cuda.mem_get_info reports it), verification waits; it starts when that job ends."""
    from kforge.tune import device_admission
    from kforge.workers.admission import estimate_bytes

    spec, _ = matmul_bias
    monkeypatch.setenv("KFORGE_DEVICE_LOCKS", str(tmp_path))
    monkeypatch.delenv("KFORGE_GPU_LOCK", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    need = estimate_bytes(spec)
    free = {"bytes": need + (1 << 20)}          # enough for one, not beside the other's
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free["bytes"], 80 << 30))
    holder = _hold_reservation(tmp_path, "cuda-0", need)
    said, entered = [], threading.Event()

    def verify():
        with device_admission(spec, "cuda", said.append):
            entered.set()
            assert os.environ.get("KFORGE_GPU_LOCK")     # timed runs take the device lock

    t = threading.Thread(target=verify)
    try:
        t.start()
        assert not entered.wait(1.5)                     # waiting for memory
        assert said and "waiting for" in said[0] and "cuda-0" in said[0]
        holder.kill()
        holder.wait()
        assert entered.wait(10)                          # the other job ended: admitted
    finally:
        holder.kill()
        t.join(10)
    assert not list((tmp_path / "cuda-0").glob(f"{os.getpid()}-*.reservation"))


def test_admission_is_skipped_inside_an_admitted_task(monkeypatch, tmp_path, matmul_bias):
    from kforge.tune import device_admission

    spec, _ = matmul_bias
    monkeypatch.setenv("KFORGE_DEVICE_LOCKS", str(tmp_path))
    monkeypatch.setenv("KFORGE_GPU_LOCK", str(tmp_path / "lock"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (0, 80 << 30))
    holder = _hold_reservation(tmp_path, "cuda-0", 1 << 40)
    try:
        with device_admission(spec, "cuda"):     # would wait forever if it were counted twice
            pass
    finally:
        holder.kill()
        holder.wait()


def test_bench_tune_retries_out_of_memory_alone():
    from kforge.bench.packages import ran_out_of_memory

    oom = {"returncode": 1, "log_tail": [
        "  region ab12: not verified: region kforge_region_ab12: out of cuda memory while "
        "computing the float64 reference (3 attempts)", "region ab12: candidate"]}
    assert ran_out_of_memory(oom)
    assert ran_out_of_memory({"returncode": 1, "log_tail": ["torch.OutOfMemoryError: CUDA"]})
    assert not ran_out_of_memory({"returncode": 1, "log_tail": ["region ab12: rejected"]})
    assert not ran_out_of_memory(dict(oom, returncode=0))


def test_bench_tune_keeps_the_whole_log_beside_the_package(tmp_path):
    """`kforge tune`'s output goes to PKG.tune.log as it is written, so a run stopped by its
    limit keeps what it said (its progress lines carry the seconds since its start)."""
    from kforge.bench.packages import tune_one

    pkg = tmp_path / "strict" / "not_a_package"
    pkg.mkdir(parents=True)
    rec = tune_one(pkg, timeout_s=120, rounds=0)
    log = (pkg.parent / "not_a_package.tune.log").read_text()
    assert rec["returncode"] not in (0, 124) and "not_a_package" in log
    assert rec["log_tail"] == log.strip().splitlines()[-15:]


def test_bench_tune_stops_a_process_tree_of_several_sessions():
    """A tune stopped by its limit takes its workers and their sandboxes (sessions of their
    own) with it; left running they held 50 GB of the GPU when the bench started."""
    import subprocess
    import sys
    import time

    from kforge.bench.packages import kill_tree
    from kforge.workers.admission import descendants

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)'], start_new_session=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 20
    while not descendants(parent.pid) and time.time() < deadline:
        time.sleep(0.1)
    below = descendants(parent.pid)
    assert below, "the child did not start"
    kill_tree(parent.pid)
    parent.wait(timeout=10)
    time.sleep(0.5)
    for pid in below:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"process {pid} still runs"


def test_attention_reference_in_slices_is_the_whole_computation(monkeypatch):
    """A prefill's float64 attention reference (scores [8, 64, 2048, 2048]: 17 GB) ran out of
    the H200's memory; it is computed a slice of (batch, heads) at a time, with the same
    result: grouped-query heads, a per-batch mask and sinks."""
    from kforge import attention_op
    torch.manual_seed(0)
    q = torch.randn(3, 8, 5, 4, dtype=torch.float64)
    k, v = torch.randn(3, 2, 7, 4, dtype=torch.float64), torch.randn(3, 2, 7, 4, dtype=torch.float64)
    mask = torch.randn(3, 1, 5, 7, dtype=torch.float64)
    sinks = torch.randn(8, dtype=torch.float64)
    whole = attention_op.attention_reference(q, k, v, mask, sinks, 0.5)
    monkeypatch.setattr(attention_op, "SLICE_BYTES", 3 * 5 * 7 * 8 * 3)     # 3 heads a slice
    sliced = attention_op.attention_reference(q, k, v, mask, sinks, 0.5)
    torch.testing.assert_close(sliced, whole, rtol=0, atol=1e-15)
    per_head_mask = torch.randn(3, 8, 5, 7, dtype=torch.float64)
    torch.testing.assert_close(attention_op.attention_reference(q, k, v, per_head_mask, None, 0.5),
                               attention_op._attention_dense(q, k, v, per_head_mask, None, 0.5),
                               rtol=0, atol=1e-15)


def test_an_op_region_out_of_memory_is_the_devices_not_the_ops(monkeypatch):
    """A fallback op that runs out of device memory raises that error (the verifier waits and
    retries it, then names the region), not "fallback op failed" (which made kforge tune stop
    with a traceback on the H200)."""
    from kforge import fallbacks

    class Op:                      # an op as resolve() returns it: a schema, then the call
        _schema = torch.ops.aten.neg.default._schema

        def __init__(self, exc):
            self.exc = exc

        def __call__(self, *args, **kwargs):
            raise self.exc

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
    monkeypatch.setattr(fallbacks, "resolve", lambda name: Op(oom))
    with pytest.raises(torch.OutOfMemoryError):
        fallbacks.run_fallback("kforge.attention", [{"tensor": 0}], [torch.zeros(2)], "cpu")
    monkeypatch.setattr(fallbacks, "resolve", lambda name: Op(ValueError("bad operands")))
    from kforge.errors import UserError
    with pytest.raises(UserError, match="fallback op kforge.attention failed"):
        fallbacks.run_fallback("kforge.attention", [{"tensor": 0}], [torch.zeros(2)], "cpu")


def test_a_failing_reference_is_one_regions_error_in_tune(monkeypatch, matmul_bias):
    """`kforge tune`: a region whose reference fails becomes that region's error; the task
    returns instead of raising out of the worker pool."""
    from types import SimpleNamespace

    import kforge.verify as kverify
    from kforge.synth import SynthOptions
    from kforge.verify import OracleError
    from kforge.workers.tasks import _tune
    spec, source = matmul_bias

    def broken(*a, **k):
        raise OracleError(f"the reference of region {spec.name} failed: UserError: boom")

    monkeypatch.setattr(kverify, "verify_candidate", broken)
    job = SimpleNamespace(entry={"target": "cpu", "provider": "test", "source": "kernel.py",
                                 "verification": {"status": "candidate"}},
                          source=source, rounds=0, provider=None, repair=0, dynamic_sizes=())
    task = SimpleNamespace(spec=spec, tune=job, hash="h0",
                           options=SynthOptions(target="cpu", precision="strict"))
    outcome = _tune(task, None, Path("/tmp"), lambda ev: None)
    assert outcome.entry is None and "OracleError" in outcome.error and spec.name in outcome.error


def test_sdpa_reference_runs_a_sequence_at_a_time_when_large(monkeypatch):
    """The float64 SDPA of a prefill region's reference runs one batch row at a time where its
    scores would be large (8 GB a matrix for Llama-3-8B's prefill), with the same result."""
    from kforge import attention_op, reference
    from kforge.fallbacks import run_fallback
    torch.manual_seed(1)
    q, k, v = (torch.randn(3, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(3, 1, 6, 6) < 0.8
    template = [{"tensor": 0}, {"tensor": 1}, {"tensor": 2}, {"tensor": 3}, 0.0, False, 0.3]
    name = "aten.scaled_dot_product_attention"
    whole = run_fallback(name, template, [q, k, v, mask], "cpu")
    assert reference._batch_sliced(name, template, [q, k, v, mask], "cpu") is None   # small
    monkeypatch.setattr(attention_op, "SLICE_BYTES", 64)
    sliced = reference._batch_sliced(name, template, [q, k, v, mask], "cpu")
    assert sliced is not None and len(sliced) == len(whole)
    torch.testing.assert_close(sliced[0], whole[0], rtol=0, atol=1e-14)


def _count_references(monkeypatch):
    real = verifier._reference_outputs
    calls = {"n": 0}

    def counted(ref, args, device):
        calls["n"] += 1
        return real(ref, args, device)

    monkeypatch.setattr(verifier, "_reference_outputs", counted)
    return calls


@pytest.mark.parametrize("precision", ["strict", "bf16"])
def test_references_over_the_host_budget_are_recomputed_when_compared(monkeypatch, matmul_bias,
                                                                      precision):
    """References that would not fit the host budget are not kept: each check's is computed
    again from its seed when compared, and the candidate is judged exactly as before."""
    spec, source = matmul_bias
    kept = verify_candidate(spec, source, "cpu", precision)
    calls = _count_references(monkeypatch)
    monkeypatch.setenv("KFORGE_VERIFY_HOST_REF_BYTES", "1")
    lazy = verify_candidate(spec, source, "cpu", precision)
    assert lazy.status == kept.status == "verified", lazy.message
    assert lazy.max_abs_err == kept.max_abs_err and lazy.max_rel_err == kept.max_rel_err
    checks = [c for c in verifier._build_checks(
        verifier.signature_of(spec), lambda *a: (a[0] @ a[1] + a[2],), "cpu", (1, 2), (8, 11))]
    assert all(c.recompute is not None and c.reference == () for c in checks)
    monkeypatch.delenv("KFORGE_VERIFY_HOST_REF_BYTES")
    assert all(c.recompute is None for c in verifier._build_checks(
        verifier.signature_of(spec), lambda *a: (a[0] @ a[1] + a[2],), "cpu", (1, 2), (8, 11)))
    # the references were computed more than once per check: at build and at compare
    assert calls["n"] > 2 * lazy.checks


def test_a_wrong_kernel_is_rejected_with_recomputed_references(monkeypatch, matmul_bias):
    spec, source = matmul_bias
    wrong = source.replace("acc += bias[None, :]", "acc += bias[None, :] * 1.01")
    monkeypatch.setenv("KFORGE_VERIFY_HOST_REF_BYTES", "1")
    record = verify_candidate(spec, wrong, "cpu", "strict")
    assert record.status == "rejected" and record.reason == "mismatch", record.message


def test_streamed_outputs_are_compared_as_the_worker_goes(monkeypatch, matmul_bias):
    """Over STREAM_OUTPUT_BYTES a check, the worker waits after each check until the parent has
    compared its outputs and deleted them: at most one check's outputs lie on the host."""
    spec, source = matmul_bias
    monkeypatch.setattr(verifier, "STREAM_OUTPUT_BYTES", 0)
    real = verifier._compare_check
    seen = []

    def compare(outs, c, sig, policy, device="cpu"):
        seen.append(sorted(p.name for p in Path(tempfile_dirs[-1]).glob("outputs_*")))
        return real(outs, c, sig, policy, device)

    tempfile_dirs = []
    real_mkdtemp = verifier.tempfile.mkdtemp

    def mkdtemp(**kw):
        tempfile_dirs.append(real_mkdtemp(**kw))
        return tempfile_dirs[-1]

    monkeypatch.setattr(verifier.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(verifier, "_compare_check", compare)
    record = verify_candidate(spec, source, "cpu", "strict", measure=True)
    assert record.status == "verified", record.message
    assert record.stage_s.get("worker_wait") is not None
    # every check's comparison saw its own outputs only (the timed run's is compared last)
    assert [len(s) for s in seen[:record.checks]] == [2] * record.checks
    # the list and its one output's raw bytes
    assert seen[:record.checks] == [[f"outputs_{i}.pt", f"outputs_{i}.pt.0"]
                                    for i in range(record.checks)]

    wrong = source.replace("acc += bias[None, :]", "acc += bias[None, :] * 1.01")
    record = verify_candidate(spec, wrong, "cpu", "strict")
    assert record.status == "rejected" and record.reason == "mismatch", record.message


def test_the_parents_comparison_time_does_not_count_against_the_worker(tmp_path, monkeypatch):
    """A streamed verification's limit is the worker's own time: the seconds the parent spends
    comparing (while the worker waits for it) extend it. Measured on the H200: 13 GB logits a
    check, compared in the parent, timed out verified-looking LM heads at the limit."""
    from kforge.verify import sandbox
    worker = tmp_path / "worker.py"
    worker.write_text("import sys, time\ntime.sleep(1.0)\nsys.exit(3)\n")
    monkeypatch.setattr(sandbox, "WORKER", worker)
    calls = {"n": 0}

    def parent_work():          # 1 s of the parent's own work, once
        if calls["n"] == 0:
            time.sleep(1.0)
        calls["n"] += 1

    run = sandbox.run_worker(tmp_path, "cpu", 0.6, None, parent_work)
    assert calls["n"] >= 1
    assert not run.timed_out and run.returncode == 3, run.describe_exit()
    # without the parent's work the same worker is over its limit
    run = sandbox.run_worker(tmp_path, "cpu", 0.6, None, lambda: None)
    assert run.timed_out


def test_worker_outputs_travel_as_raw_bytes_and_a_forged_list_is_refused(tmp_path):
    """The worker writes each output's bytes raw beside a JSON list (a prefill LM head's 13 GB
    of logits took a minute to torch.save and load); the parent maps them back bit for bit,
    every dtype and shape, and refuses a list that points outside the job or lies about sizes.
    torch.save'd lists (older workers) still load."""
    outs = [torch.randn(3, 5), torch.randn(4).to(torch.bfloat16), torch.tensor(2.5),
            torch.zeros(0, 3), torch.rand(6) > 0.5, torch.arange(7)]
    metas = []
    for k, o in enumerate(outs):
        (tmp_path / f"o.pt.{k}").write_bytes(o.reshape(-1).view(torch.uint8).numpy().tobytes()
                                             if o.numel() else b"")
        metas.append({"shape": list(o.shape), "dtype": str(o.dtype)[6:], "file": f"o.pt.{k}"})
    (tmp_path / "o.pt").write_text(json.dumps(metas))
    back = verifier.load_outputs(tmp_path / "o.pt")
    assert [(b.dtype, b.shape) for b in back] == [(o.dtype, o.shape) for o in outs]
    assert all(torch.equal(b, o) for b, o in zip(back, outs))
    verifier.remove_outputs(tmp_path / "o.pt")
    assert list(tmp_path.iterdir()) == []

    (tmp_path / "job").mkdir()
    (tmp_path / "secret.0").write_bytes(b"\0" * 8)
    for forged, err in ((dict(shape=[2], dtype="float32", file="../secret.0"), FileNotFoundError),
                        (dict(shape=[2], dtype="Tensor", file="x.0"), ValueError),
                        (dict(shape=[3], dtype="float32", file="x.0"), ValueError)):
        (tmp_path / "job" / "x.0").write_bytes(b"\0" * 8)
        (tmp_path / "job" / "x.pt").write_text(json.dumps([forged]))
        with pytest.raises(err):
            verifier.load_outputs(tmp_path / "job" / "x.pt")
    torch.save([outs[0]], tmp_path / "old.pt")
    assert torch.equal(verifier.load_outputs(tmp_path / "old.pt")[0], outs[0])
