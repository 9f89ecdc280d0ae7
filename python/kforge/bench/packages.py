"""Build the package folder that `kforge bench --packages DIR` reads, on a machine with the
compile half (MLIR, torch-mlir), for a target that may be absent here (cross-compiling for cuda).

Layout: DIR/<policy>/<workload>/ (one `kforge compile` package each) and, beside each,
DIR/<policy>/<workload>.build.json (status, compile seconds, command, stripped files).
Weight files are left out (`--keep-weights` keeps them): on the GPU machine the bench binds each
package to the live module with `kforge.load(PKG, module)`, so weights need not travel, and the
folder stays small enough to carry.

    python -m kforge.bench.packages --out .carry/bench --target cuda --precision strict,tf32,bf16
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kforge.bench import workloads as wl_mod
from kforge.bench.backends import kforge_env

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".npz")

_SMOKE_WRAPPER = '''"""Smoke-size view of {path} (written by kforge.bench.packages)."""
import importlib.util as _u
_spec = _u.spec_from_file_location("_kforge_smoke_{name}", {path!r})
_m = _u.module_from_spec(_spec)
_spec.loader.exec_module(_m)
Model = _m.Model


def get_inputs():
    return _m.get_inputs(scale="smoke")


def get_init_inputs():
    return _m.get_init_inputs(scale="smoke")
'''


def model_file(workload: wl_mod.Workload, smoke: bool, tmp: Path) -> Path:
    """The file handed to `kforge compile`: the workload itself, or a wrapper whose
    get_inputs()/get_init_inputs() give the smoke sizes."""
    if not smoke:
        return workload.path
    path = tmp / f"{workload.name}.py"
    path.write_text(_SMOKE_WRAPPER.format(path=str(workload.path.resolve()), name=workload.name))
    return path


def strip_weights(package: Path, min_bytes: int = 1 << 20) -> list[str]:
    stripped = []
    for f in sorted(package.rglob("*")):
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES and f.stat().st_size >= min_bytes:
            stripped.append(f"{f.relative_to(package)} ({f.stat().st_size >> 20} MiB)")
            f.unlink()
    return stripped


def build_one(workload, policy: str, out: Path, target: str, provider: str, smoke: bool,
              keep_weights: bool, timeout_s: float, extra: list[str], tmp: Path) -> dict:
    package = out / policy / workload.name
    record_path = out / policy / f"{workload.name}.build.json"
    if package.exists():
        shutil.rmtree(package)
    package.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "kforge.cli", "compile", str(model_file(workload, smoke, tmp)),
           "-o", str(package), "--target", target, "--precision", policy, "--provider", provider, *extra]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=kforge_env())
        rc, log = proc.returncode, (proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as exc:
        rc, log = 124, f"timed out after {timeout_s:.0f}s\n{exc.stdout or ''}{exc.stderr or ''}"
    record = {"workload": workload.name, "policy": policy, "target": target, "provider": provider,
              "scale": "smoke" if smoke else "full", "status": "ok" if rc == 0 else "failed",
              "returncode": rc, "compile_s": round(time.perf_counter() - t0, 2),
              "command": " ".join(cmd), "log_tail": log.strip().splitlines()[-15:],
              "stripped": [] if keep_weights or rc != 0 else strip_weights(package)}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kforge.bench.packages", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="*", help="names, globs, files or folders (default: the suite)")
    p.add_argument("--out", type=Path, required=True, help="package folder to (re)build")
    p.add_argument("--target", default="cuda", choices=("cuda", "xpu", "cpu"))
    p.add_argument("--precision", default="strict,tf32,bf16")
    p.add_argument("--provider", default="builtin")
    p.add_argument("--smoke", action="store_true", help="compile the tiny SMOKE sizes")
    p.add_argument("--keep-weights", action="store_true")
    p.add_argument("--timeout", type=float, default=1800.0, help="limit per compile, seconds")
    p.add_argument("--skip-existing", action="store_true",
                   help="keep packages whose .build.json says ok (resume an interrupted build)")
    p.add_argument("--compile-arg", action="append", default=[],
                   help="extra argument passed to `kforge compile` (repeatable)")
    args = p.parse_args(argv)

    selected = wl_mod.discover(args.workloads)
    policies = [x for x in args.precision.split(",") if x]
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="kforge-bench-pkg-") as tmp:
        for policy in policies:
            for w in selected:
                rec_path = args.out / policy / f"{w.name}.build.json"
                if args.skip_existing and rec_path.exists() and \
                        json.loads(rec_path.read_text()).get("status") == "ok":
                    print(f"{policy:6s} {w.name:42s} kept", flush=True)
                    continue
                rec = build_one(w, policy, args.out, args.target, args.provider, args.smoke,
                                args.keep_weights, args.timeout, args.compile_arg, Path(tmp))
                failed += rec["status"] != "ok"
                why = "" if rec["status"] == "ok" else "  " + " | ".join(rec["log_tail"][-2:])[:300]
                print(f"{policy:6s} {w.name:42s} {rec['status']:6s} {rec['compile_s']:7.1f}s{why}", flush=True)
    size = folder_size(args.out)
    print(f"{args.out}: {size / 2 ** 20:.1f} MiB" + ("  (over the 64 MiB a device call carries!)"
                                                      if size > 64 * 2 ** 20 else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
