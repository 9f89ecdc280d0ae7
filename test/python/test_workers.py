"""Scale-out (kforge.workers): regions on a local Ray cluster of two worker processes and on a
local process pool, on the CPU interpreter with a real model (examples/gemm_layernorm_residual:
two regions), real kforge-opt, real Ray. A region's worker killed mid-task is redone by another
worker and nothing else is; the second compile is served from the shared kernel cache; the
cache's claim keeps two workers from writing one entry; device memory admission and the
sandbox's device lock."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kforge.cache import CacheEntry, CacheKey, KernelCache
from kforge.errors import UserError
from kforge.workers import parse_workers

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "examples" / "gemm_layernorm_residual.py"


@pytest.fixture(scope="module")
def first_compile(tmp_path_factory, run_kforge, kforge_opt):
    """`kforge compile --workers ray:2`: a local Ray cluster of two worker CPUs."""
    tmp = tmp_path_factory.mktemp("ray")
    cache = tmp / "cache"
    proc = run_kforge("compile", MODEL, "-o", tmp / "pkg1", "--target", "cpu", "--rounds", "0",
                      "--workers", "ray:2", "--cache-dir", cache, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, json.loads((tmp / "pkg1" / "report.json").read_text())


def test_regions_are_spread_over_both_ray_workers(first_compile, run_kforge):
    tmp, report = first_compile
    assert report["workers"]["executor"] == "ray"
    assert report["workers"]["cluster"]["CPU"] == 2
    attempts = report["workers"]["attempts"]
    hashes = [r["hash"] for r in report["regions"]]
    assert len(hashes) == 2 and sorted(a["hash"] for a in attempts) == sorted(hashes)
    assert len({a["pid"] for a in attempts}) == 2, attempts      # one region on each worker
    assert all(a["elapsed_s"] is not None and a["worker"] for a in attempts)
    assert all(r["status"] == "verified" for r in report["regions"])
    assert {r["worker"]["pid"] for r in report["regions"]} == {a["pid"] for a in attempts}
    # the results came back into the package: its kernels, logs and a run that matches eager
    manifest = json.loads((tmp / "pkg1" / "manifest.json").read_text())
    assert sorted(manifest["kernels"]) == sorted(hashes)
    for h in hashes:
        assert (tmp / "pkg1" / manifest["kernels"][h]["source"]).is_file()
        assert '"event": "done"' in (tmp / "pkg1" / "regions" / h / "log.jsonl").read_text()
    proc = run_kforge("run", tmp / "pkg1", "--check")
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_second_compile_on_the_cluster_is_served_from_the_cache(first_compile, run_kforge):
    tmp, first = first_compile
    proc = run_kforge("compile", MODEL, "-o", tmp / "pkg2", "--target", "cpu", "--rounds", "0",
                      "--workers", "ray:2", "--cache-dir", tmp / "cache", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp / "pkg2" / "report.json").read_text())
    assert report["summary"]["from_cache"] == report["summary"]["regions"] == 2
    assert all(r["rounds"] == first_r["rounds"] and r["status"] == "verified"
               for r, first_r in zip(report["regions"], first["regions"]))
    assert all(r["candidates_tried"] == 0 for r in report["regions"])   # nothing verified again
    assert len(report["workers"]["attempts"]) == 2          # still tasks on the cluster


def test_kforge_tune_on_the_cluster(first_compile, run_kforge, tmp_path):
    import shutil
    src, report = first_compile
    pkg = tmp_path / "pkg"
    shutil.copytree(src / "pkg1", pkg)
    proc = run_kforge("tune", pkg, "--rounds", "1", "--workers", "ray:2", "--cache-dir",
                      tmp_path / "cache", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in report["regions"]:
        assert f"region {r['hash']}: verified" in proc.stdout
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert all(e["verification"]["status"] == "verified" for e in manifest["kernels"].values())
    for h in manifest["kernels"]:            # the tuning rounds' logs came back to the package
        log = (pkg / "regions" / h / "log.jsonl").read_text()
        assert log.count('"event": "start"') == 2, log[-500:]


class _KillFirstRegion:
    """A progress sink that kills the worker of the region `_stall_first_region` stalled, at
    its note, once."""

    def __init__(self, stalled: Path):
        self.stalled = stalled
        self.victim = None
        self.killed_pid = None
        self.pids = {}

    def stalls(self, h) -> bool:
        return (self.victim is None and self.stalled.exists()
                and self.stalled.read_text() == h)

    def start(self, total): ...

    def region(self, h, spec): ...

    def started(self, h, record):
        self.pids.setdefault(h, []).append(record.pid)

    def note(self, h, message):
        if self.stalls(h):
            self.victim, self.killed_pid = h, self.pids[h][-1]
            os.kill(self.killed_pid, signal.SIGKILL)

    def done(self, h, row): ...

    def stop(self): ...


def test_a_killed_worker_loses_only_its_region(first_compile, tmp_path, monkeypatch):
    from kforge.package import compile_regions, read_manifest
    from kforge.synth import SynthOptions
    from kforge.workers.ray_cluster import RayExecutor
    src, _ = first_compile
    stalled = _stall_first_region(monkeypatch, tmp_path, "functional round")
    sink = _KillFirstRegion(stalled)
    executor = RayExecutor(None, num_cpus=2)
    try:
        doc = compile_regions(src / "pkg1" / "regions", tmp_path / "pkg",
                              SynthOptions(target="cpu", rounds=0),
                              cache=KernelCache(tmp_path / "cache"), progress=sink,
                              model_path=MODEL, executor=executor)
    finally:
        executor.close()
    assert stalled.exists() and sink.victim is not None
    attempts = doc["workers"]["attempts"]
    victim = [a for a in attempts if a["hash"] == sink.victim]
    others = [a for a in attempts if a["hash"] != sink.victim]
    # the victim's first attempt never finished; it was redone by another worker process
    assert [a["pid"] for a in victim][0] == sink.killed_pid and victim[0]["elapsed_s"] is None
    assert len(victim) == 2 and victim[1]["pid"] != sink.killed_pid
    assert victim[1]["elapsed_s"] is not None
    # the rest was kept: the other region ran once
    assert len(others) == 1 and others[0]["elapsed_s"] is not None
    assert doc["summary"]["verified"] == 2 and not doc["workers"]["lost"]
    row = next(r for r in doc["regions"] if r["hash"] == sink.victim)
    assert row["worker"]["pid"] == victim[1]["pid"]
    assert sorted(read_manifest(tmp_path / "pkg")["kernels"]) == sorted(
        r["hash"] for r in doc["regions"])


class _KillWhileTuning(_KillFirstRegion):
    """Kills the worker of the region stalled at its first optimization round (it verified)."""

    def note(self, h, message):
        if self.stalls(h) and message.startswith("optimization round"):
            self.victim, self.killed_pid = h, self.pids[h][-1]
            os.kill(self.killed_pid, signal.SIGKILL)


# Imported at start-up by every Python process Ray starts with the hook's folder on its path
# (`_stall_first_region`): the first region loop to send a note that starts with the given
# words waits after sending it, so the kill that note triggers lands while the task still runs
# (a round on the interpreter can finish before the driver has drained its note). Only the
# first: the file named in the variable is the token, so a retry and other regions go on.
_STALL_HOOK = """
import os, sys
if os.environ.get("KFORGE_TEST_STALL"):
    import importlib.abc, importlib.util

    class _Patch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "kforge.synth":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            real = spec.loader.exec_module

            def exec_module(module):
                real(module)
                init = module._RegionLoop.__init__
                words, token = os.environ["KFORGE_TEST_STALL"].split("|", 1)

                def patched(loop, *args, **kwargs):
                    init(loop, *args, **kwargs)
                    say = loop.progress

                    def progress(msg):
                        if not msg.startswith(words):
                            return say(msg)
                        try:        # the first one claims; the token, written before
                            os.close(os.open(token + ".claim", os.O_CREAT | os.O_EXCL))
                        except FileExistsError:     # its note, names the region
                            return say(msg)
                        with open(token + ".tmp", "w") as f:
                            f.write(loop.spec.hash)
                        os.rename(token + ".tmp", token)
                        say(msg)
                        import time
                        time.sleep(600)
                    loop.progress = progress
                module._RegionLoop.__init__ = patched
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Patch())
"""


def _stall_first_region(monkeypatch, tmp_path, words):
    """Ray workers started after this stall the first region at its note `words...`; the
    returned path holds that region's hash once one has."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_STALL_HOOK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    token = tmp_path / "stalled"
    monkeypatch.setenv("KFORGE_TEST_STALL", f"{words}|{token}")
    return token


def test_a_kernel_verified_before_its_worker_died_is_kept(first_compile, tmp_path,
                                                          monkeypatch):
    from kforge.package import compile_regions, read_manifest
    from kforge.synth import SynthOptions
    from kforge.workers.ray_cluster import RayExecutor
    src, _ = first_compile
    stalled = _stall_first_region(monkeypatch, tmp_path, "optimization round")
    sink = _KillWhileTuning(stalled)
    executor = RayExecutor(None, num_cpus=2, max_retries=0)     # no second attempt
    try:
        doc = compile_regions(src / "pkg1" / "regions", tmp_path / "pkg",
                              SynthOptions(target="cpu", rounds=1), cache=None,
                              progress=sink, model_path=MODEL, executor=executor)
    finally:
        executor.close()
    assert stalled.exists()                         # the hook ran in the workers
    assert sink.victim is not None and doc["workers"]["lost"] == [sink.victim]
    row = next(r for r in doc["regions"] if r["hash"] == sink.victim)
    assert row["status"] == "verified" and "kept, untuned" in row["message"], row
    entry = read_manifest(tmp_path / "pkg")["kernels"][sink.victim]
    assert entry["verification"]["status"] == "verified"
    assert (tmp_path / "pkg" / entry["source"]).is_file()


def test_gpu_tasks_hold_their_gpu_alone(first_compile, tmp_path, monkeypatch):
    """A cluster that declares one GPU (Ray schedules by what a node declares; this machine has
    none, so the kernels stay candidates): the two regions' tasks take the GPU in turn."""
    import datetime as dt

    from kforge.package import compile_regions
    from kforge.synth import SynthOptions
    from kforge.workers.ray_cluster import RayExecutor
    monkeypatch.setenv("KFORGE_XCOMPILE", "0")          # no sm_90 screening: keep it short
    src, _ = first_compile
    executor = RayExecutor(None, num_cpus=2, num_gpus=1)
    try:
        doc = compile_regions(src / "pkg1" / "regions", tmp_path / "pkg",
                              SynthOptions(target="cuda", rounds=0), cache=None,
                              model_path=MODEL, executor=executor)
    finally:
        executor.close()
    attempts = doc["workers"]["attempts"]
    assert len(attempts) == 2 and all(a["gpus"] == "0" for a in attempts), attempts
    spans = sorted((dt.datetime.fromisoformat(a["started_at"].rstrip("Z")).timestamp(),
                    a["elapsed_s"]) for a in attempts)
    assert spans[0][0] + spans[0][1] <= spans[1][0], spans      # one after the other
    assert doc["summary"]["candidate"] == 2


def test_api_compile_takes_workers(tmp_path):
    import torch

    import kforge
    from kforge.modelfile import load_model_file
    model, inputs = load_model_file(MODEL)
    fast = kforge.compile(model, inputs, target="cpu", rounds=0, workers="local:2",
                          out=tmp_path / "pkg", cache_dir=tmp_path / "cache")
    assert fast.report["workers"]["executor"] == "local-pool"
    assert len({a["pid"] for a in fast.report["workers"]["attempts"]}) == 2
    with torch.no_grad():
        assert torch.allclose(fast(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)


def test_local_process_pool_spreads_regions(first_compile, tmp_path):
    from kforge.package import compile_regions
    from kforge.synth import SynthOptions
    src, _ = first_compile
    executor = parse_workers("local:2")
    doc = compile_regions(src / "pkg1" / "regions", tmp_path / "pkg",
                          SynthOptions(target="cpu", rounds=0), cache=None, model_path=MODEL,
                          executor=executor)
    assert doc["workers"]["executor"] == "local-pool"
    assert len({a["pid"] for a in doc["workers"]["attempts"]}) == 2
    assert os.getpid() not in {a["pid"] for a in doc["workers"]["attempts"]}
    assert doc["summary"]["verified"] == 2
    for r in doc["regions"]:                 # logs shipped back into the package
        assert (tmp_path / "pkg" / "regions" / r["hash"] / "log.jsonl").is_file()


def test_workers_option_errors_are_user_errors(run_kforge, tmp_path):
    proc = run_kforge("compile", MODEL, "-o", tmp_path / "pkg", "--workers", "rai")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--workers 'rai': expected" in proc.stderr, proc.stderr
    for bad in ("rai", "local:0", "ray:0", "ray://", "local:x"):
        with pytest.raises(UserError):
            parse_workers(bad)
    with pytest.raises(UserError):
        parse_workers("ray", gpu_share=0)
    assert parse_workers(None).name == "local" and parse_workers("1").name == "local"
    assert parse_workers("local:3").processes == 3


# -- the cache's claim ------------------------------------------------------------------------
def _claim_and_hold(root: str, started, release) -> None:
    cache = KernelCache(root)
    with cache.claim(_key()):
        started.set()
        release.wait(30)


def _key() -> CacheKey:
    return CacheKey(region="r" * 16, target="cpu", precision="strict", provider="builtin")


def test_claim_excludes_a_second_writer_and_dies_with_its_holder(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_claim_and_hold, args=(str(tmp_path), started, release))
    holder.start()
    assert started.wait(60)
    cache = KernelCache(tmp_path)
    got = threading.Event()

    def second():
        with cache.claim(_key()):
            got.set()

    t = threading.Thread(target=second, daemon=True)
    t.start()
    assert not got.wait(1.5)                 # held by the other process
    os.kill(holder.pid, signal.SIGKILL)      # the holder dies: its claim goes with it
    holder.join()
    assert got.wait(10)
    t.join()


def test_put_missing_writes_only_what_is_not_there(tmp_path):
    cache = KernelCache(tmp_path)
    entry = CacheEntry(status="verified", source="x = 1\n", provider="builtin",
                       verification={"seeds": (1, 2)})
    assert cache.put_missing(_key(), entry)
    assert not cache.put_missing(_key(), entry)          # the same entry: left alone
    assert cache.put_missing(_key(), CacheEntry("verified", "x = 2\n", "builtin"))


# -- several tasks on one device --------------------------------------------------------------
def test_memory_admission_waits_for_a_reservation_to_end(tmp_path, monkeypatch):
    from kforge.workers.admission import admitted, free_bytes, reserved_bytes
    monkeypatch.setenv("KFORGE_DEVICE_LOCKS", str(tmp_path))
    need = int(free_bytes("host-memory") * 0.6)          # two of these do not fit
    folder = tmp_path / "host-memory"
    folder.mkdir()
    (folder / "dead.reservation").write_text(json.dumps({"pid": 2 ** 22 + 7, "bytes": need}))
    inside, waited = threading.Event(), {}

    def first():
        with admitted(need, "host-memory", poll_s=0.1):
            inside.set()
            time.sleep(1.5)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)                   # the dead task's reservation did not count
    assert reserved_bytes(folder) == need
    with admitted(need, "host-memory", poll_s=0.1) as w:
        waited["s"] = w
        assert os.environ["KFORGE_GPU_LOCK"] == str(folder / "timing.lock")
    t.join()
    assert waited["s"] >= 1.0                # admitted only when the first one was done
    assert reserved_bytes(folder) == 0 and "KFORGE_GPU_LOCK" not in os.environ


def test_memory_a_reservation_has_taken_is_not_counted_twice(tmp_path, monkeypatch):
    """The driver's free figure already lacks what an admitted task (or a sandbox below it)
    holds: only the rest of its reservation is subtracted. Where the driver names no process,
    the whole reservation counts, and a task that does not fit waits."""
    import subprocess
    import sys

    from kforge.workers.admission import admitted, reserved_bytes
    monkeypatch.setenv("KFORGE_DEVICE_LOCKS", str(tmp_path))
    folder = tmp_path / "cuda-0"
    folder.mkdir()
    gib = 1 << 30
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (folder / "other.reservation").write_text(json.dumps({"pid": holder.pid,
                                                              "bytes": 40 * gib}))
        taken = {holder.pid: 36 * gib}                 # it has taken 36 of its 40 GiB
        assert reserved_bytes(folder, taken) == 4 * gib
        assert reserved_bytes(folder, None) == 40 * gib
        free = lambda tag: 10 * gib                    # noqa: E731
        with admitted(5 * gib, "cuda-0", probe=free, usage=lambda tag: taken) as waited:
            assert waited < 1.0                        # 10 free - 4 outstanding >= 5
        notes = []

        def second():
            with admitted(5 * gib, "cuda-0", probe=free, usage=lambda tag: {}, poll_s=0.1,
                          on_wait=notes.append):
                pass

        t = threading.Thread(target=second)
        t.start()
        time.sleep(1.0)
        assert t.is_alive() and notes and "40.0 GiB reserved" in notes[0]
    finally:
        holder.kill()
        holder.wait()
    t.join(10)                                         # its reservation's process is gone
    assert not t.is_alive()


def test_sandbox_checks_wait_for_an_exclusive_holder_of_the_device_lock(tmp_path, monkeypatch):
    import fcntl

    from kforge.providers.base import Candidate
    from kforge.spec import load_spec
    from kforge.verify import verify_candidate
    fixtures = Path(__file__).parent / "fixtures" / "engine"
    spec = load_spec(fixtures / "add_relu.json")
    cand = Candidate("good", "test", (fixtures / "good_add_relu.py").read_text())
    lock_path = tmp_path / "timing.lock"
    monkeypatch.setenv("KFORGE_GPU_LOCK", str(lock_path))
    result = {}
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # a timed run holds the device
        t = threading.Thread(target=lambda: result.setdefault(
            "rec", verify_candidate(spec, cand, "cpu", timeout_s=120)))
        t.start()
        t.join(6)
        assert t.is_alive()                  # its checks wait for the device
        fcntl.flock(lock, fcntl.LOCK_UN)
    t.join(120)
    assert result["rec"].verified, result["rec"].message


def test_a_rounds_candidates_are_verified_side_by_side(first_compile, tmp_path):
    from kforge.spec import load_spec
    from kforge.synth import SynthOptions, synthesize_region
    src, report = first_compile
    h = report["regions"][0]["hash"]
    spec = load_spec(src / "pkg1" / "regions" / f"{h}.json")
    t0 = time.monotonic()
    result = synthesize_region(spec, SynthOptions(target="cpu", rounds=0, functional_rounds=1,
                                                  num_candidates=2, parallel_verify=2),
                               log_dir=tmp_path)
    wall = time.monotonic() - t0
    events = [json.loads(line) for line in (tmp_path / h / "log.jsonl").read_text().splitlines()]
    checked = [e["verification"] for e in events if e["event"] == "candidate"]
    assert len(checked) == 2 and result.candidates_tried == 2
    assert result.status == "verified"
    # side by side: the round took less than its two verifications one after the other would
    assert wall < 0.85 * sum(v["elapsed_s"] for v in checked), (wall, checked)
