"""Packages and the runtime on hand-written regions (no MLIR needed): build, run, check against
eager, resume after an interruption, candidates verified on first run, binding live weights,
and `kforge run` in an environment where MLIR and torch-mlir cannot be imported."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge.package import open_package, read_manifest, write_manifest
from kforge.runtime import load_model_file, load_package
from kforge.synth import SynthOptions

FIXTURES = Path(__file__).parent / "fixtures" / "engine"
TINY = FIXTURES / "tiny"
REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("engine_fixture_provider_pkg",
                                               FIXTURES / "fixture_provider.py")
fixture_provider = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture_provider)

BLOCK_MLIR = '''
import importlib.abc, sys
class _NoMLIR(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlir", "torch_mlir"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked for this test)",
                                      name=name)
        return None
sys.meta_path.insert(0, _NoMLIR())
'''


def tiny_weights(tmp_path: Path) -> Path:
    from safetensors.torch import save_file
    model, _ = load_model_file(TINY / "model.py")
    path = tmp_path / "model.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def build(tmp_path: Path, provider=None, cache=None, target="cpu", name="pkg") -> Path:
    from kforge.package import compile_regions
    pkg = tmp_path / name
    options = SynthOptions(target=target, rounds=0, provider="scripted")
    compile_regions(TINY, pkg, options, cache=cache, weights_path=tiny_weights(tmp_path),
                    model_path=TINY / "model.py",
                    provider=provider or fixture_provider.ScriptedProvider([("good",)] * 2))
    return pkg


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny"))


def test_package_layout_and_manifest(package):
    for rel in ("package.json", "manifest.json", "report.json", "report.md", "model.py",
                "model.safetensors", "regions/host_plan.json",
                "regions/e1e1e1e1e1e1e1e1/log.jsonl",
                "kernels/a2a2a2a2a2a2a2a2/kernel.py", "kernels/e1e1e1e1e1e1e1e1/kernel.py"):
        assert (package / rel).is_file(), rel
    manifest = read_manifest(package)
    assert manifest["schema"] == "kforge.manifest"
    for h, entry in manifest["kernels"].items():
        assert entry["verification"]["status"] == "verified"
        assert entry["symbol"] == f"kforge_kernel_{h}_cpu"
        assert (package / entry["source"]).is_file()
    report = json.loads((package / "report.json").read_text())
    assert report["summary"] == {"regions": 2, "verified": 2, "candidate": 0, "reference": 0,
                                 "from_cache": 0, "resumed": 0}
    assert "| region |" in (package / "report.md").read_text()


def test_run_matches_eager(package):
    compiled = load_package(package)
    assert set(compiled.kernels) == {"a2a2a2a2a2a2a2a2", "e1e1e1e1e1e1e1e1"}
    model, inputs = load_model_file(TINY / "model.py")
    out = compiled(*inputs)
    assert all(k.calls == 1 for k in compiled.kernels.values())   # kernels really ran
    torch.testing.assert_close(out, model(*inputs), atol=1e-4, rtol=1e-4)


def test_load_binds_live_module_weights(package):
    torch.manual_seed(123)
    model, inputs = load_model_file(TINY / "model.py", seed=7)   # other weights
    compiled = load_package(package, module=model)
    torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)


def test_kforge_run_without_mlir(package, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_MLIR)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO / "python")]))
    probe = subprocess.run([sys.executable, "-c", "import torch_mlir"], env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked" in probe.stderr
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "run", str(package), "--check"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "2/2 regions by verified kernels" in proc.stdout
    assert "max abs err" in proc.stdout and "OK" in proc.stdout


class _Interrupt(fixture_provider.ScriptedProvider):
    """Verifies the first region, then the compile is interrupted (as by Ctrl-C)."""

    def generate(self, request):
        if self.calls >= 1:
            raise KeyboardInterrupt
        return super().generate(request)


def test_interrupted_compile_resumes_without_redoing_verified_regions(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path, provider=_Interrupt([("good",)] * 2))
    manifest = read_manifest(tmp_path / "pkg")
    assert len(manifest["kernels"]) == 1           # the verified region was kept
    done = next(iter(manifest["kernels"]))
    provider = fixture_provider.ScriptedProvider([("good",)] * 2)
    build(tmp_path, provider=provider)
    assert provider.calls == 1                     # only the unfinished region was synthesized
    assert [r.spec.hash for r in provider.requests] != [done]
    report = json.loads((tmp_path / "pkg" / "report.json").read_text())
    assert report["summary"]["resumed"] == 1 and report["summary"]["verified"] == 2


def test_candidates_are_verified_by_tune_and_never_used_before(tmp_path):
    pkg = build(tmp_path)
    manifest = read_manifest(pkg)
    for entry in manifest["kernels"].values():      # as if compiled where the device was absent
        entry["verification"] = {"status": "candidate"}
        entry["status"] = "candidate"
    write_manifest(pkg, manifest)
    before = {p.name: p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    unused = load_package(pkg)
    assert unused.kernels == {}                    # unverified kernels are never used
    after = {p.name: p.read_bytes() for p in pkg.rglob("*") if p.is_file()}
    assert after == before                         # loading never rewrites the package
    from kforge.tune import tune_package
    tune_package(pkg)                              # tuning is its own step
    compiled = load_package(pkg)
    assert len(compiled.kernels) == 2
    statuses = {e["verification"]["status"] for e in read_manifest(pkg)["kernels"].values()}
    assert statuses == {"verified"}


def test_cross_compile_for_absent_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("cuda present")
    pkg = build(tmp_path, target="cuda")
    entries = read_manifest(pkg)["kernels"].values()
    assert entries and {e["verification"]["status"] for e in entries} == {"candidate"}
    assert open_package(pkg).target == "cuda"
    from kforge.errors import UserError
    from kforge.runtime import tune_package
    with pytest.raises(UserError, match="no cuda device"):
        tune_package(pkg)
    # run on the cpu instead: no kernel is verified for it, everything runs by the reference
    compiled = load_package(pkg, target="cpu")
    model, inputs = load_model_file(TINY / "model.py")
    assert compiled.kernels == {}
    torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)


def test_running_for_an_absent_device_says_what_to_do(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("cuda present")
    pkg = build(tmp_path, target="cuda")
    from kforge.errors import UserError
    with pytest.raises(UserError, match="--target cpu"):
        load_package(pkg)


def test_kforge_synth_command(tmp_path):
    from kforge.cli import main
    out = tmp_path / "synth"
    rc = main(["synth", str(FIXTURES / "matmul_bias.json"), "-o", str(out), "--target", "cpu",
               "--rounds", "0", "--no-cache"])
    assert rc == 0
    entry = read_manifest(out)["kernels"]["a2a2a2a2a2a2a2a2"]
    assert entry["verification"]["status"] == "verified" and entry["provider"] == "builtin"
    assert (out / entry["source"]).is_file()
    assert (out / "regions" / "a2a2a2a2a2a2a2a2" / "log.jsonl").is_file()


class _InterruptWhileOptimizing(fixture_provider.ScriptedProvider):
    def generate(self, request):
        if request.phase == "optimize":
            raise KeyboardInterrupt
        return super().generate(request)


def test_region_is_recorded_before_its_optimization(tmp_path):
    from kforge.package import compile_regions
    options = SynthOptions(target="cpu", rounds=1, provider="scripted")
    with pytest.raises(KeyboardInterrupt):
        compile_regions(TINY, tmp_path / "pkg", options, weights_path=tiny_weights(tmp_path),
                        model_path=TINY / "model.py",
                        provider=_InterruptWhileOptimizing([("good",)] * 2))
    entries = read_manifest(tmp_path / "pkg")["kernels"]
    assert len(entries) == 1
    assert next(iter(entries.values()))["verification"]["status"] == "verified"


def test_kforge_run_with_inputs_file(package, tmp_path, capsys):
    from kforge.cli import main
    inputs = [torch.randn(8, 32)]
    torch.save(inputs, tmp_path / "inputs.pt")
    rc = main(["run", str(package), "--inputs", str(tmp_path / "inputs.pt"), "--check",
               "--output", str(tmp_path / "out.pt")])
    assert rc == 0 and "OK" in capsys.readouterr().out
    model, _ = load_model_file(TINY / "model.py")
    got = torch.load(tmp_path / "out.pt")[0]
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=1e-4)


def test_tune_repairs_a_builtin_kernel_that_fails_on_this_machine(tmp_path):
    """A builtin kernel compiled elsewhere that fails verification here is replaced by the next
    one the builtin generates (verify-only rounds); with repair=0 it stays rejected."""
    import hashlib

    from kforge.package import compile_regions
    from kforge.runtime import tune_package

    def sabotaged(name):
        pkg = tmp_path / name
        compile_regions(TINY, pkg, SynthOptions(target="cpu", rounds=0),
                        weights_path=tiny_weights(tmp_path), model_path=TINY / "model.py")
        manifest = read_manifest(pkg)
        h, entry = next(iter(manifest["kernels"].items()))
        assert entry["provider"] == "builtin"
        broken = (pkg / entry["source"]).read_text().replace("def launch(", "def launch(:", 1)
        (pkg / entry["source"]).write_text(broken)
        entry.update(sha256=hashlib.sha256(broken.encode()).hexdigest(), status="candidate",
                     verification={"status": "candidate"})
        write_manifest(pkg, manifest)
        return pkg, h

    pkg, h = sabotaged("repaired")
    assert tune_package(pkg)[h] == "verified"
    entry = read_manifest(pkg)["kernels"][h]
    assert entry["repaired_from"]["reason"] == "syntax_error"
    assert "def launch(:" not in (pkg / entry["source"]).read_text()
    assert h in load_package(pkg, tune=False).kernels          # used without another check

    pkg, h = sabotaged("left")
    assert tune_package(pkg, repair=0)[h] == "rejected"


def test_tune_regenerate_keeps_the_old_kernel_unless_the_new_one_is_faster(tmp_path):
    """`kforge tune --regenerate`: a verified builtin kernel that this KForge generates
    differently is verified again with the new source; it is taken only where it verifies and
    is faster than the recorded time, else the old source and entry come back."""
    import hashlib

    from kforge.package import compile_regions
    from kforge.runtime import tune_package

    def older(name, time_ms, precision="strict", was=None):
        pkg = tmp_path / name
        compile_regions(TINY, pkg, SynthOptions(target="cpu", rounds=0, precision=precision),
                        weights_path=tiny_weights(tmp_path), model_path=TINY / "model.py")
        manifest = read_manifest(pkg)
        h, entry = next(iter(manifest["kernels"].items()))
        assert entry["status"] == "verified" and entry["provider"] == "builtin"
        src = (pkg / entry["source"]).read_text() + "\n# an older KForge's kernel\n"
        (pkg / entry["source"]).write_text(src)
        entry.update(sha256=hashlib.sha256(src.encode()).hexdigest(), time_ms=time_ms)
        if was:
            entry["precision"] = was
        write_manifest(pkg, manifest)
        return pkg, h, src

    pkg, h, old = older("faster", 1e9)            # anything beats a recorded 1e9 ms
    assert tune_package(pkg, regenerate=(h,))[h] == "verified"
    entry = read_manifest(pkg)["kernels"][h]
    src = (pkg / entry["source"]).read_text()
    assert src != old and entry["time_ms"] < 1e9 and "regenerated" not in entry
    assert entry["sha256"] == hashlib.sha256(src.encode()).hexdigest()
    assert not (pkg / entry["source"]).with_name("kernel.previous.py").exists()

    pkg, h, old = older("slower", 1e-9)           # nothing beats 1e-9 ms: the old one stays
    assert tune_package(pkg, regenerate=(h,))[h] == "verified"
    entry = read_manifest(pkg)["kernels"][h]
    assert (pkg / entry["source"]).read_text() == old and entry["time_ms"] == 1e-9
    assert entry["regenerated"]["status"] == "verified"
    assert entry["regenerated"]["time_ms"] > 1e-9
    assert h in load_package(pkg, tune=False).kernels

    # nothing to regenerate where the source is the one this KForge generates
    assert tune_package(pkg, regenerate=("no-such-kind",)) == {}

    # KIND=SCHEME: that precision scheme's first kernel, verified beside the old one; a scheme
    # the builtin has not for the region leaves it as it is
    from kforge.providers.builtin import config_space
    from kforge.tune import scheme_of
    space = config_space(open_package(pkg).specs[h], "cpu", "strict")
    other = next(sc for c in space for sc in scheme_of(c) if sc not in scheme_of(space[0]))
    pkg, h, old = older("scheme", 1e9)
    assert tune_package(pkg, regenerate=(f"{h}={other}",))[h] == "verified"
    entry = read_manifest(pkg)["kernels"][h]
    assert other in scheme_of(entry["launch"]["config"]) and entry["time_ms"] < 1e9
    pkg, h, old = older("no-scheme", 1e9)
    assert tune_package(pkg, regenerate=(f"{h}=no-such-scheme",)) == {}
    assert (pkg / read_manifest(pkg)["kernels"][h]["source"]).read_text() == old

    # a strict kernel in a bf16 package (copied from a strict package: it meets bf16) is kept
    # while the region's own bf16 kernel is tried beside it, by any tune: taken where faster,
    # else the strict one stays
    pkg, h, old = older("copied", 1e9, precision="bf16", was="strict")
    assert tune_package(pkg)[h] == "verified"
    assert read_manifest(pkg)["kernels"][h]["precision"] == "bf16"
    pkg, h, old = older("copied-kept", 1e-9, precision="bf16", was="strict")
    assert tune_package(pkg)[h] == "verified"
    entry = read_manifest(pkg)["kernels"][h]
    assert entry["precision"] == "strict" and (pkg / entry["source"]).read_text() == old
    assert entry["regenerated"]["status"] == "verified"
