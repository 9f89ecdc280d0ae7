"""Record the profiler's test fixtures on the H200 (issue 14): Nsight Compute CSV (raw and
details pages) and Triton compile metadata + code of builtin kernels, a Proton trace, and a
whole profile made by kforge.profiling.collect_profile.

    python3 benchmarks/profile/record_fixtures.py DIR          (on the device machine)

Kernels: the builtin's first bf16 candidate for gemm_bias_relu (cast pass + GEMM), and its first
candidate for the elementwise fixture spec gelu_tanh (test/python/fixtures/specs).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from kforge.profiling import collect, ncu  # noqa: E402
from kforge.profiling.collect import WORKER, _job  # noqa: E402
from kforge.providers.builtin import candidates  # noqa: E402
from kforge.spec import load_spec  # noqa: E402
from kforge.verify import verify_candidate  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
OUT.mkdir(parents=True, exist_ok=True)
CASES = [("gemm_bf16", ROOT / "benchmarks/profile/specs/gemm_bias_relu.json", "bf16"),
         ("gelu_tanh", ROOT / "test/python/fixtures/specs/gelu_tanh.json", "strict")]
if os.environ.get("KF_CASES"):
    CASES = [c for c in CASES if c[0] in os.environ["KF_CASES"].split(",")]


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    print(" ".join(map(str, cmd[:3])), "->", p.returncode, (p.stdout + p.stderr)[-600:], flush=True)
    return p


for name, spec_path, policy in CASES:
    spec = load_spec(spec_path)
    cand = candidates(spec, "cuda", policy)[0]
    size = 1024
    with tempfile.TemporaryDirectory() as d:
        tmp = _job(Path(d), cand, spec, "cuda", size, "meta", 1)
        run([sys.executable, str(WORKER), str(tmp)], tmp)
        kernels = json.loads((tmp / "worker.json").read_text())["kernels"]
        (OUT / f"{name}.kernels.json").write_text(json.dumps(kernels, indent=1))
        for k in kernels:
            for kind, f in k["asm_files"].items():
                if kind in ("ptx", "ttgir"):
                    shutil.copy(tmp / f, OUT / f"{name}.{f}")
        (Path(d) / "n").mkdir()
        tmp2 = _job(Path(d) / "n", cand, spec, "cuda", size, "ncu", 1)
        path = ncu.ncu_path()
        if path:
            prog = [sys.executable, str(WORKER), str(tmp2)]
            run(ncu.command(path, ncu.metric_names(), str(OUT / f"{name}.ncu_raw.csv"), prog), tmp2)
            cmd = ncu.command(path, ncu.metric_names(), str(OUT / f"{name}.ncu_details.csv"), prog)
            i = cmd.index("--page")
            del cmd[i:i + 2]
            run(cmd, tmp2)
        (Path(d) / "p").mkdir()
        tmp3 = _job(Path(d) / "p", cand, spec, "cuda", size, "proton", 3)
        run([sys.executable, str(WORKER), str(tmp3)], tmp3)
        if (tmp3 / "proton.hatchet").exists():
            shutil.copy(tmp3 / "proton.hatchet", OUT / f"{name}.proton.hatchet")
    rec = verify_candidate(spec, cand, "cuda", policy, measure=True, dynamic_sizes=(size, size + 3))
    prof = collect.collect_profile(spec, cand, rec, "cuda", policy)
    (OUT / f"{name}.profile.json").write_text(json.dumps(prof.to_json(), indent=1))
    print(name, rec.status, rec.time_ms, {k: v.detail for k, v in prof.sources.items()}, flush=True)
subprocess.run(["ncu", "--version"], stdout=open(OUT / "ncu_version.txt", "w"), stderr=subprocess.STDOUT)
