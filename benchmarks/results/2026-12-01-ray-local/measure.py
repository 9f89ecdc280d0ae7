"""Compile wall time of a small zoo model with 1 vs 2 local workers (issue 16).

Runs `kforge compile benchmarks/models/gpt2.py --target cpu --workers W` (KFORGE_ZOO_SIZE=small,
a fresh kernel cache per run, so every region is synthesized) for each W, REPEATS times,
interleaved, and writes results.json: the command's wall time, the report's synth stage and
the worker processes its task records name, with the load average before each run (the machine
is shared).

    python benchmarks/results/2026-12-01-ray-local/measure.py [W ...]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
MODEL = REPO / "benchmarks" / "models" / "gpt2.py"
WORKERS = sys.argv[1:] or ["local", "local:2", "ray:1", "ray:2"]
REPEATS = int(os.environ.get("REPEATS", "2"))


def one(workers: str, tmp: Path) -> dict:
    tag = workers.replace(":", "_")
    pkg, cache = tmp / f"pkg-{tag}", tmp / f"cache-{tag}"
    env = dict(os.environ, KFORGE_ZOO_SIZE="small",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "python"),
                                                        os.environ.get("PYTHONPATH")])))
    load = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "compile", str(MODEL), "-o",
                           str(pkg), "--target", "cpu", "--workers", workers, "--cache-dir",
                           str(cache)], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"workers": workers, "returncode": proc.returncode,
                "log_tail": (proc.stdout + proc.stderr)[-2000:]}
    report = json.loads((pkg / "report.json").read_text())
    attempts = report["workers"].get("attempts", [])
    out = {"workers": workers, "returncode": 0, "wall_s": round(wall, 1),
           "stages_s": report["stages"], "summary": report["summary"],
           "worker_processes": len({(a["host"], a["pid"]) for a in attempts}),
           "loadavg_before": [round(x, 2) for x in load]}
    subprocess.run(["rm", "-rf", str(pkg), str(cache)])
    return out


def main() -> None:
    runs = []
    with tempfile.TemporaryDirectory(prefix="kforge-ray-local-") as tmp:
        for r in range(REPEATS):
            for w in WORKERS:
                rec = one(w, Path(tmp))
                rec["repeat"] = r
                print(json.dumps(rec), flush=True)
                runs.append(rec)
    doc = {"model": "benchmarks/models/gpt2.py (KFORGE_ZOO_SIZE=small)", "target": "cpu",
           "cpus": os.cpu_count(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime()),
           "runs": runs}
    (HERE / "results.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
