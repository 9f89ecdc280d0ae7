"""The runtime runs what the linked IR says: `kforge-opt --kforge-link-kernels host-plan=...`
writes linked_plan.json beside model.linked.mlir; kernel steps there are custom calls in the IR;
`kforge tune` links again (kforge-opt where it is installed, the plan in Python where not)."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from kforge.package import LINKED_PLAN, link_package, read_manifest, relink, write_manifest
from kforge.spec import CallStep, KernelStep, load_host_plan

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 16)
            self.fc2 = nn.Linear(16, 8)

        def forward(self, x):
            h = torch.cumsum(torch.relu(self.fc1(x)), dim=-1)     # a fallback between regions
            return torch.tanh(self.fc2(h))

    def get_inputs():
        return [torch.randn(4, 16)]

    def get_init_inputs():
        return []
    """)


@pytest.fixture(scope="module")
def package(tmp_path_factory, kforge_opt):
    from kforge.build import compile_model
    from kforge.synth import SynthOptions
    root = tmp_path_factory.mktemp("linked")
    (root / "model.py").write_text(MODEL)
    pkg = root / "pkg"
    compile_model(root / "model.py", pkg, SynthOptions(target="cpu", rounds=0))
    return pkg


def kernel_steps(pkg):
    plan = load_host_plan(pkg / LINKED_PLAN)
    return ({s.kernel for s in plan.steps if isinstance(s, KernelStep)},
            {s.call for s in plan.steps if isinstance(s, CallStep)})


def test_linked_plan_is_the_linked_ir(package):
    kernels, calls = kernel_steps(package)
    ir = (package / "model.linked.mlir").read_text()
    manifest = read_manifest(package)["kernels"]
    assert kernels == set(manifest) and not calls          # every region verified and linked
    for h in kernels:
        assert f"kforge.custom_call @{manifest[h]['symbol']}(" in ir
    assert "call @kforge.fallback.aten.cumsum." in ir
    plan = load_host_plan(package / LINKED_PLAN)
    assert [s.name for s in plan.steps if getattr(s, "op", "") == "fallback"] == ["aten.cumsum"]


def test_runtime_follows_the_linked_plan(package, tmp_path):
    import shutil
    from kforge.runtime import load_model_file, load_package
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    model, inputs = load_model_file(pkg / "model.py")
    want = model(*inputs)
    # a region the linked IR leaves on its reference is not run by its kernel, even if the
    # manifest has one: the IR decides
    plan_path = pkg / LINKED_PLAN
    doc = json.loads(plan_path.read_text())
    first = next(s for s in doc["steps"] if "kernel" in s)
    first["call"] = first.pop("kernel")
    del first["symbol"], first["target"]
    plan_path.write_text(json.dumps(doc))
    compiled = load_package(pkg)
    assert first["call"] not in compiled.kernels and len(compiled.kernels) >= 1
    torch.testing.assert_close(compiled(*inputs), want, atol=1e-4, rtol=1e-4)


def test_tune_relinks_with_and_without_kforge_opt(package, tmp_path, monkeypatch):
    import shutil
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    manifest = read_manifest(pkg)
    h = sorted(manifest["kernels"])[0]
    saved = dict(manifest["kernels"][h]["verification"])
    manifest["kernels"][h]["verification"] = {"status": "candidate"}
    write_manifest(pkg, manifest)
    assert link_package(pkg)[0]
    kernels, calls = kernel_steps(pkg)
    assert h in calls and h not in kernels                  # a candidate is never linked
    manifest["kernels"][h]["verification"] = saved           # as `kforge tune` records it
    write_manifest(pkg, manifest)
    # a GPU host without kforge-opt: the linked plan is updated in Python, the IR marked stale
    monkeypatch.setenv("KFORGE_OPT", str(tmp_path / "no-kforge-opt"))
    note = relink(pkg)
    assert "Python" in note
    kernels, calls = kernel_steps(pkg)
    assert h in kernels and h not in calls
    meta = json.loads((pkg / "package.json").read_text())
    assert meta["linked_ir"]["stale"] is True
    # where kforge-opt is: the IR itself is linked again and no longer stale
    monkeypatch.delenv("KFORGE_OPT")
    assert "kforge-opt" in relink(pkg)
    symbol = manifest["kernels"][h]["symbol"]
    assert f"kforge.custom_call @{symbol}(" in (pkg / "model.linked.mlir").read_text()
    assert json.loads((pkg / "package.json").read_text())["linked_ir"]["stale"] is False


def test_a_tune_stopped_part_way_leaves_what_it_verified_linked(package, tmp_path, monkeypatch):
    """`kforge tune` killed after its first region (a time limit): that region's kernel is in the
    linked plan already; the rest stay region calls. The tune runs on the CPU interpreter, for
    real; only the stop is simulated, by an executor that dies after the first outcome."""
    import shutil
    from kforge.tune import tune_package
    from kforge.workers.local import InlineExecutor
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    manifest = read_manifest(pkg)
    hashes = sorted(manifest["kernels"])
    assert len(hashes) >= 2
    for h in hashes:
        manifest["kernels"][h]["verification"] = {"status": "candidate"}
    write_manifest(pkg, manifest)
    assert link_package(pkg)[0]
    assert not kernel_steps(pkg)[0]
    monkeypatch.setenv("KFORGE_OPT", str(tmp_path / "no-kforge-opt"))   # a GPU host's setting

    class Stopped(Exception):
        pass

    class DiesAfterOne(InlineExecutor):
        def run(self, tasks, on_event):
            for n, outcome in enumerate(super().run(tasks, on_event)):
                if n == 1:
                    raise Stopped()
                yield outcome

    with pytest.raises(Stopped):
        tune_package(pkg, executor=DiesAfterOne())
    kernels, calls = kernel_steps(pkg)
    verified = {h for h, e in read_manifest(pkg)["kernels"].items()
                if e["verification"]["status"] == "verified"}
    assert len(verified) == 1 and kernels == verified
    assert set(hashes) - verified <= calls


def test_a_tune_where_every_region_failed_reports_and_links(package, tmp_path, monkeypatch):
    """Every task lost (its worker died on every attempt): the tune reports each region as
    failed and still links once, instead of stopping on a note no region wrote."""
    import shutil
    from kforge.tune import tune_package
    from kforge.workers import TaskOutcome
    from kforge.workers.local import InlineExecutor
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    manifest = read_manifest(pkg)
    for h in manifest["kernels"]:
        manifest["kernels"][h]["verification"] = {"status": "candidate"}
    write_manifest(pkg, manifest)
    monkeypatch.setenv("KFORGE_OPT", str(tmp_path / "no-kforge-opt"))

    class AllLost(InlineExecutor):
        def run(self, tasks, on_event):
            for task in tasks:
                yield TaskOutcome(task.hash, error="worker died 3 times")

    notes = []
    results = tune_package(pkg, executor=AllLost(), progress=notes.append)
    assert results and set(results.values()) == {"failed"}
    assert any("linked plan" in n for n in notes)
    assert not kernel_steps(pkg)[0]


def test_retry_rejected_regenerates_a_fixed_kernel_and_verifies_it(package, tmp_path,
                                                                    monkeypatch):
    """`kforge tune --retry-rejected`: a region rejected with a kernel that this KForge would
    generate differently (the generator was fixed since) gets the new kernel and is verified
    again, for real on the interpreter; one whose kernel is unchanged is repaired once from its
    recorded verdict (the repair may have changed since), without verifying the same kernel
    again; one already repaired that way is left rejected."""
    import hashlib
    import shutil

    from kforge.tune import tune_package
    pkg = tmp_path / "pkg"
    shutil.copytree(package, pkg)
    manifest = read_manifest(pkg)
    fixed, same = sorted(manifest["kernels"])[:2]
    for h in (fixed, same):
        manifest["kernels"][h]["verification"] = {"status": "rejected", "reason": "runtime_error",
                                                  "message": "it failed here"}
        manifest["kernels"][h]["status"] = "rejected"
    same_config = manifest["kernels"][same]["launch"]["config"]
    path = pkg / manifest["kernels"][fixed]["source"]
    good = path.read_text()
    broken = good.replace("def launch(", "def _never():\n    raise RuntimeError('old bug')\n\n\n"
                                         "def launch(", 1)
    path.write_text(broken)                       # what an older generator wrote
    manifest["kernels"][fixed]["sha256"] = hashlib.sha256(broken.encode()).hexdigest()
    write_manifest(pkg, manifest)
    monkeypatch.setenv("KFORGE_OPT", str(tmp_path / "no-kforge-opt"))
    notes = []
    results = tune_package(pkg, retry_rejected=True, progress=notes.append)
    after = read_manifest(pkg)["kernels"]
    assert results[fixed] == "verified"
    assert after[fixed]["verification"]["status"] == "verified"
    assert path.read_text() == good
    assert after[fixed]["sha256"] == hashlib.sha256(good.encode()).hexdigest()
    assert any(f"region {same}: repairing again from its recorded verdict" in n for n in notes)
    assert results[same] == "verified"
    assert after[same]["repaired_from"] == {"config": same_config, "reason": "runtime_error",
                                            "message": "it failed here"}
    assert after[same]["launch"]["config"] != same_config
    assert fixed in kernel_steps(pkg)[0] and same in kernel_steps(pkg)[0]
    # a retried repair that failed too: the next retry leaves it alone
    manifest = read_manifest(pkg)
    manifest["kernels"][same]["verification"] = {"status": "rejected", "reason": "mismatch"}
    manifest["kernels"][same]["repair_retried"] = True
    write_manifest(pkg, manifest)
    notes.clear()
    assert same not in tune_package(pkg, retry_rejected=True, progress=notes.append)
    assert read_manifest(pkg)["kernels"][same]["verification"]["status"] == "rejected"
    assert any(f"region {same}: rejected, and this KForge generates the same" in n
               for n in notes)
    # without the flag the rejected region is not retried
    assert same not in tune_package(pkg)
