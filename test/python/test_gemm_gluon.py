"""benchmarks/gemm/fp16x3_gluon.py: the strict scheme's fp16x3 GEMM written in Gluon so that a K
step's three products stay in flight while the step before is added. No GPU here: the kernel is
cross-compiled for sm_90 with the local Triton and its PTX read. What the GPU must still show
(correct, faster than the builtin's Triton loop) is fp16x3_ab.py's job (variant gluon_pp)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

GEMM = Path(__file__).resolve().parents[2] / "benchmarks" / "gemm"

pytest.importorskip("triton.experimental.gluon")


def test_the_gluon_fp16x3_loop_keeps_a_steps_products_in_flight(monkeypatch, tmp_path):
    """The builtin's Triton loop waits for the tensor cores after each of a step's three
    products (`wgmma.wait_group 0` three times a step). Here each step's three products go
    out as 12 wgmma instructions with no wait between them, and the loop waits only until
    3 groups are outstanding (the step before retired); the two parts alternate in fixed
    registers (the loop unrolled by two, an odd last step peeled), so ptxas keeps the
    wgmma pipeline: no spills, within the register file and sm_90's shared memory."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    sys.path.insert(0, str(GEMM))
    import fp16x3_gluon

    from kforge.crosscompile import _ptxas_info
    out = fp16x3_gluon.cross_compile(90)
    ptx = out["ptx"]
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)
    # two unrolled steps and the odd tail's, 12 wgmma each; waits of 3 in the loop and the
    # tail, 0 only where nothing follows
    assert ptx.count("wgmma.mma_async") == 36, ptx.count("wgmma.mma_async")
    assert waits.count("3") == 3 and waits.count("0") == 2 and len(waits) == 5, waits
    assert ptx.count("cp.async.bulk.tensor") >= 4             # the operand tiles by TMA
    assert out["shared"] <= 232448, out["shared"]
    regs, spill_st, spill_ld = _ptxas_info(ptx, 90)
    if regs is None:
        pytest.skip("no ptxas in this Triton")
    assert spill_st == 0 and spill_ld == 0 and regs <= 255, (regs, spill_st, spill_ld)
    # ptxas keeps the wgmma pipeline: no "wgmma.mma_async instructions are serialized" (C7514),
    # which it reports when registers of an in-flight wgmma are read or moved
    from triton.backends.nvidia.compiler import get_ptxas
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    proc = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o",
                           str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "C7514" not in proc.stdout + proc.stderr, proc.stderr[-2000:]


LINEAR_RELU = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2880, 1024)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


def get_inputs():
    return [torch.randn(2048, 2880)]


def get_init_inputs():
    return []
'''



def _compiled(tmp_path, model: str, name: str, precision: str):
    """`model` (a source) compiled for cuda:sm_90 under `precision`, no tuning rounds: its one
    region's report entry, that region's kernel source, and the package."""
    import json

    from test_compile import kforge
    src = tmp_path / f"{name}.py"
    src.write_text(model)
    pkg = tmp_path / name
    kforge("compile", src, "-o", pkg, "--target", "cuda:sm_90", "--precision", precision,
           "--rounds", "0", "--no-cache", cache=tmp_path / "cache")
    (region,) = json.loads((pkg / "report.json").read_text())["regions"]
    return region, (pkg / "kernels" / region["hash"] / "kernel.py").read_text(), pkg


def _xcompiled(tmp_path, pkg) -> str:
    """`kforge xcompile PKG`'s report, every kernel compiled for sm_90."""
    from test_compile import kforge
    proc = kforge("xcompile", pkg, cache=tmp_path / "cache")
    assert "0 failed to compile for cuda:sm_90" in proc.stdout, proc.stdout
    return proc.stdout

def test_the_builtin_offers_the_gluon_kernel_under_strict_on_hopper(tmp_path, monkeypatch):
    """By default on sm_90: a strict Linear's fp16x3 product by the Gluon kernel first
    (schemes._gluon_configs), the region's epilogue fused on its tile (gluon._fused). The
    package compiled for cuda:sm_90 here takes it (it passes kforge.verify.static and
    compiles with wgmma, no spills); with KFORGE_BUILTIN_GLUON=0, under bf16, before sm_90 and
    for the interpreter it is not offered. Not run: the interpreter does not run Gluon, and its numbers are the GPU's."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KFORGE_BUILTIN_GLUON", raising=False)
    region, source, pkg = _compiled(tmp_path, LINEAR_RELU, "gluon", "strict")
    assert region["candidate"]["config"].get("GLUON") is True, region["candidate"]
    assert "@gluon.jit" in source and "_gemm_gluon[(128,)](" in source
    # bias, ReLU and scale fused on the kernel's tile, in Gluon's names: no kernel after it
    assert "_epilogue[" not in source
    kernel = source.split("def kforge_region_")[-1]
    assert "gl.convert_layout(acc_0, blk)" in kernel and "gl.store(" in kernel
    report = _xcompiled(tmp_path, pkg)
    gluon_row = [line for line in report.splitlines() if "_gemm_gluon" in line]
    assert gluon_row and "wgmma" in gluon_row[0], report

    from kforge.providers.builtin import config_space
    from kforge.spec import load_spec
    spec = load_spec(pkg / "regions" / f"{region['hash']}.json")
    assert not any(c.get("GLUON") for c in config_space(spec, "cpu", "strict"))
    assert not any(c.get("GLUON") for c in config_space(spec, "cuda:sm_90", "bf16"))
    assert not any(c.get("GLUON") for c in config_space(spec, "cuda:sm_80", "strict"))
    monkeypatch.setenv("KFORGE_BUILTIN_GLUON", "0")
    assert not any(c.get("GLUON") for c in config_space(spec, "cuda:sm_90", "strict"))


def test_the_warp_specialized_gluon_gemm_splits_loader_and_consumers(monkeypatch, tmp_path):
    """benchmarks/gemm/ws_gluon.py (the builtin's gluon_ws template with a plain store as its
    epilogue): a persistent bf16 GEMM whose TMA loads come from a
    one-warp loader partition and whose wgmmas come from two consumer warpgroups (issue 13
    item 2's warp specialization, which Triton's own `warp_specialize=True` does not give on
    Hopper). Cross-compiled for sm_90: the partitions get their registers by setmaxnreg (the
    loader gives up registers, the consumers take them), each consumer keeps one wgmma group
    in flight in its K loop (wait 1) and drains once a tile (wait 0), the operands come by
    TMA, within sm_90's shared memory, without spills and without serialized wgmmas (C7514).
    Whether it is correct and how fast it is against cuBLAS is ws_ab.py's, on the GPU."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    sys.path.insert(0, str(GEMM))
    import ws_gluon

    from triton.backends.nvidia.compiler import get_ptxas
    # the cooperative schedule (two consumers, 64 rows of a tile each: 4 k16 wgmmas a step
    # each) and the ping-pong one (each consumer a whole 128-row tile: 8)
    for cfg, wgmmas in (({}, 8), ({"BLOCK_N": 128, "STAGES": 4}, 8),
                        ({"BLOCK_N": 128, "STAGES": 4, "PINGPONG": True}, 16)):
        out = ws_gluon.cross_compile(90, **cfg)
        ptx = out["ptx"]
        regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
        assert ("dec", str(ws_gluon.REGS[1])) in regs, regs          # the loader's
        assert ("inc", str(ws_gluon.REGS[0])) in regs, regs          # a consumer's
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
        assert sorted(waits) == ["0", "0", "1", "1"], waits           # two consumers
        assert ptx.count("wgmma.mma_async") == wgmmas, ptx.count("wgmma.mma_async")
        assert ptx.count("cp.async.bulk.tensor") >= 2
        assert "mbarrier.try_wait" in ptx and "mbarrier.arrive" in ptx
        assert out["shared"] <= 232448, out["shared"]
        src = tmp_path / "ws.ptx"
        src.write_text(ptx)
        proc = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o",
                               str(tmp_path / "ws.cubin")], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        log = proc.stdout + proc.stderr
        assert "C7514" not in log, log[-2000:]
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log[-2000:]


LINEAR_GELU_BF16 = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2880, 1024)
        self.to(torch.bfloat16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) * 2.0


def get_inputs():
    return [torch.randn(2048, 2880, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''


def test_the_builtin_offers_the_warp_specialized_kernel_under_bf16_only_when_asked(
        tmp_path, monkeypatch):
    """KFORGE_BUILTIN_WS=1: a bf16 model's Linear + GELU + scale by the warp-specialized Gluon
    kernel (gluon_ws.py) with the region's epilogue fused in its consumers (the emitter's
    lines in Gluon's names: erf, the bias load, the bf16 store), and no other kernel; an fp32
    model's Linear under bf16 by the same kernel on fp16x1's planes (the split pass before,
    the scales undone on the tile); =pingpong: the consumers taking whole tiles in turn. The
    package compiled for cuda:sm_90 here passes kforge.verify.static and compiles with wgmma
    and TMA, without spills. Without the variable, under strict, and for the interpreter it is
    not offered. Not run: the interpreter does not run Gluon."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("KFORGE_BUILTIN_WS", "1")
    region, source, pkg = _compiled(tmp_path, LINEAR_GELU_BF16, "ws", "bf16")
    assert region["candidate"]["config"].get("WS") is True, region["candidate"]
    assert "@gluon.jit" in source and "gl.warp_specialize(" in source
    consumer = source.split("_gemm_consumer(")[1].split("@gluon.jit")[0]
    assert "gl.erf(" in consumer and "tl." not in consumer    # the epilogue in Gluon's names
    assert "_epilogue[" not in source                    # fused: no kernel after the GEMM
    report = _xcompiled(tmp_path, pkg)
    row = [line for line in report.splitlines() if "_gemm " in line + " "]
    assert row and "wgmma" in row[0], report

    # =pingpong: the consumers take 128 x 128 tiles in turn (each stage has one consumer)
    monkeypatch.setenv("KFORGE_BUILTIN_WS", "pingpong")
    region_pp, source, pkg_pp = _compiled(tmp_path, LINEAR_GELU_BF16, "ws_pp", "bf16")
    assert region_pp["candidate"]["config"].get("PINGPONG") is True, region_pp["candidate"]
    assert "mbarrier.init(empty.index(i), count=1)" in source \
        and "2 * gl.num_programs(0)" in source
    _xcompiled(tmp_path, pkg_pp)
    monkeypatch.setenv("KFORGE_BUILTIN_WS", "1")

    # an fp32 model under bf16: fp16x1's planes, their power-of-two scales undone on the tile
    region32, source, pkg32 = _compiled(tmp_path, LINEAR_RELU, "ws32", "bf16")
    config = region32["candidate"]["config"]
    assert config.get("WS") is True and config.get("input_precision") == "fp16x1", config
    assert "gl.float16" in source and "s_a = gl.load(" in source and "e_b = gl.load(" in source
    _xcompiled(tmp_path, pkg32)

    from kforge.providers.builtin import config_space
    from kforge.spec import load_spec
    spec = load_spec(pkg / "regions" / f"{region['hash']}.json")
    assert not any(c.get("WS") for c in config_space(spec, "cpu", "bf16"))
    assert not any(c.get("WS") for c in config_space(spec, "cuda:sm_90", "strict"))
    monkeypatch.delenv("KFORGE_BUILTIN_WS")
    assert not any(c.get("WS") for c in config_space(spec, "cuda:sm_90", "bf16"))
