"""The device-machine scripts (benchmarks/*.sh, benchmarks/*/*.sh): they run only on the GPU
machine, so here they are parsed, and pack_out (device_env.sh), which decides what of a call's
output comes back (at most 8 files), is run for real."""
from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(ROOT.glob("benchmarks/*.sh")) + sorted(ROOT.glob("benchmarks/*/*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_pack_out_keeps_the_named_results_and_packs_the_rest(tmp_path):
    out = tmp_path / "out"
    files = ["bench.json", "bench.md", "tune.log", "partial.json", "big/builtin_gemm.json",
             "big/log.txt", "strict/log.txt", "run.log"]
    for f in files:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_text(f)
    proc = subprocess.run(
        ["bash", "-c", f'OUT="{out}"; source "{ROOT}/benchmarks/device_env.sh"; '
                       "pack_out bench.json bench.md big/builtin_gemm.json run.log absent.txt"],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["bench.json", "bench.md", "big/builtin_gemm.json", "rest.tgz", "run.log"]
    with tarfile.open(out / "rest.tgz") as tar:
        assert sorted(tar.getnames()) == ["big/log.txt", "partial.json", "strict/log.txt",
                                          "tune.log"]
        assert tar.extractfile("tune.log").read() == b"tune.log"
    assert not (out / "strict").exists()            # emptied folders go
    # nothing left to pack: no archive is made
    proc = subprocess.run(
        ["bash", "-c", f'OUT="{tmp_path / "empty"}"; mkdir -p "$OUT"; '
                       f'source "{ROOT}/benchmarks/device_env.sh"; pack_out x'],
        capture_output=True, text=True)
    assert proc.returncode == 0 and not (tmp_path / "empty" / "rest.tgz").exists()
