"""Build the package folder that `kforge bench --packages DIR` reads, on a machine with the
compile half (MLIR, torch-mlir), for a target that may be absent here (cross-compiling for cuda).

Layout: DIR/<policy>/<workload>/ (one `kforge compile` package each) and, beside each,
DIR/<policy>/<workload>.build.json (status, compile seconds, command, stripped files).
The policy `bf16-model` is `bf16` on the model cast to bf16 (`model.bfloat16()`, bf16 inputs
and outputs): the route of a user who accepts bf16, compiled by KForge. The bench runs it beside
the bf16 package of the fp32 model.
Weight files are left out (`--keep-weights` keeps them): on the GPU machine the bench binds each
package to the live module with `kforge.load(PKG, module)`, so weights need not travel, and the
folder stays small enough to carry.

    python -m kforge.bench.packages --out .carry/bench --target cuda --precision strict,tf32,bf16

On the GPU machine, `--tune` verifies (and tunes) every package of the folder on the device, as
`kforge tune PKG` does, several packages at a time (`--jobs`), before the timed run; it writes
DIR/<policy>/<workload>.tune.json (seconds, exit status, per-region results), which the bench
adds to the package's compile time:

    python -m kforge.bench.packages --tune --out .carry/bench --jobs 8 --gpus 1

`--workers` (as `kforge compile --workers` takes it) spreads each package's regions over
worker processes or a Ray cluster, when building and when tuning; with several jobs at once,
give a running cluster's address (`ray:auto`, `ray://HEAD:10001`) so that the jobs share it
rather than each starting its own (docs/scale-out.md):

    python -m kforge.bench.packages --tune --out .carry/bench --workers ray:auto --gpu-share 2
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kforge.bench import workloads as wl_mod
from kforge.bench.backends import kforge_env

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".npz")

_SCALE_WRAPPER = '''"""{scale}-scale view of {path} (written by kforge.bench.packages)."""
import importlib.util as _u
import os as _os
_os.environ.update({env!r})      # the workload variant's environment
_spec = _u.spec_from_file_location("_kforge_{scale}_{ident}", {path!r})
_m = _u.module_from_spec(_spec)
_spec.loader.exec_module(_m)
Model = _m.Model


def get_inputs():
    return _m.get_inputs(scale={scale!r})


def get_init_inputs():
    return _m.get_init_inputs(scale={scale!r})
'''


# The workload's own source, then this: the model cast to bf16, float inputs cast. Written
# into the file (not an import of the workload by path) so that the package's model.py is
# whole on the machine that verifies it.
_CAST_TAIL = '''

# ---- kforge.bench.packages: the model above cast to bf16 (`model.bfloat16()`), float inputs in
# ---- bf16: the route of a user who accepts bf16, compiled by KForge
import torch as _kforge_torch

_KForgeFp32Model = Model


class Model(_KForgeFp32Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.to(_kforge_torch.bfloat16)


_kforge_fp32_inputs, _kforge_init_inputs = get_inputs, get_init_inputs


def get_inputs():
    return [x.to(_kforge_torch.bfloat16) if isinstance(x, _kforge_torch.Tensor)
            and x.is_floating_point() else x for x in _kforge_fp32_inputs({scale})]


def get_init_inputs():
    return _kforge_init_inputs({scale})
'''

CAST_POLICIES = {"bf16-model": "bf16"}     # package folder -> the policy it compiles under


def cast_model_file(workload: wl_mod.Workload, smoke: bool, tmp: Path) -> Path:
    """The file handed to `kforge compile` for `bf16-model`: the workload's source with the
    cast appended (CAST_TAIL)."""
    path = tmp / f"{workload.name}.bf16-model.py"
    if workload.env:
        # a variant (an LLM's prefill or decode): the scale wrapper that sets its environment,
        # whose get_inputs() already gives the scale's sizes, then the cast
        path.write_text(_scale_wrapper(workload, smoke) + _CAST_TAIL.format(scale=""))
    else:
        path.write_text(workload.path.read_text() + _CAST_TAIL.format(
            scale="scale='smoke'" if smoke else ""))
    return path


def _scale_wrapper(workload: wl_mod.Workload, smoke: bool) -> str:
    scale = "smoke" if smoke else "full"
    return _SCALE_WRAPPER.format(path=str(workload.path.resolve()), scale=scale,
                                 ident=workload.name.replace(".", "_"), env=dict(workload.env))


def model_file(workload: wl_mod.Workload, smoke: bool, tmp: Path) -> Path:
    """The file handed to `kforge compile`: the workload itself, or a wrapper whose
    get_inputs()/get_init_inputs() give the bench's sizes (smoke; or full, for a variant
    workload: an LLM file's sizes depend on the scale) under the variant's environment."""
    if not smoke and not workload.env:
        return workload.path
    path = tmp / f"{workload.name}.{'smoke' if smoke else 'full'}.py"
    path.write_text(_scale_wrapper(workload, smoke))
    return path


def strip_weights(package: Path, min_bytes: int = 1 << 20) -> list[str]:
    stripped = []
    for f in sorted(package.rglob("*")):
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES and f.stat().st_size >= min_bytes:
            stripped.append(f"{f.relative_to(package)} ({f.stat().st_size >> 20} MiB)")
            f.unlink()
    return stripped


def _run_recorded(cmd: list[str], timeout_s: float, env: tuple = ()) -> tuple[int, str, float]:
    """`env`: a workload variant's (variable, value) pairs, set in the command's environment."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env={**kforge_env(), **dict(env)})
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, log = 124, f"timed out after {timeout_s:.0f}s\n{exc.stdout or ''}{exc.stderr or ''}"
    return rc, log, time.perf_counter() - t0


def _stage_seconds(package: Path, stages=("import", "regions")) -> float:
    try:
        report = json.loads((package / "report.json").read_text())
        return float(sum(report.get("stages", {}).get(s, 0.0) for s in stages))
    except (OSError, ValueError, TypeError):
        return 0.0


def workers_args(workers: str | None, gpu_share: int = 1) -> list[str]:
    """The `--workers` arguments handed to `kforge compile` / `kforge tune`."""
    if not workers:
        return []
    return ["--workers", workers] + (["--gpu-share", str(gpu_share)] if gpu_share != 1 else [])


def build_workload(workload, policies: list[str], out: Path, target: str, provider: str,
                   smoke: bool, keep_weights: bool, timeout_s: float, extra: list[str],
                   tmp: Path, skip_existing: bool, workers: list[str] = ()) -> list[dict]:
    """`kforge compile` under the first policy; the other policies reuse its regions (import and
    region formation do not depend on the policy) and only synthesize (`--resynth`)."""
    records, first_ok = [], None
    for k, policy in enumerate(policies):
        package = out / policy / workload.name
        record_path = out / policy / f"{workload.name}.build.json"
        if skip_existing and record_path.is_file():
            old = json.loads(record_path.read_text())
            if old.get("status") == "ok" and package.is_dir():
                records.append({**old, "kept": True})
                if policy not in CAST_POLICIES:
                    first_ok = first_ok or package
                continue
        if package.exists():
            shutil.rmtree(package)
        package.parent.mkdir(parents=True, exist_ok=True)
        cast = policy in CAST_POLICIES
        if cast:     # its own model: its own import and regions, shared with no other policy
            cmd = [sys.executable, "-m", "kforge.cli", "compile",
                   str(cast_model_file(workload, smoke, tmp)),
                   "-o", str(package), "--target", target, "--precision",
                   CAST_POLICIES[policy], "--provider", provider, *workers, *extra]
            shared_s = 0.0
        elif first_ok is None:
            cmd = [sys.executable, "-m", "kforge.cli", "compile", str(model_file(workload, smoke, tmp)),
                   "-o", str(package), "--target", target, "--precision", policy,
                   "--provider", provider, *workers, *extra]
            shared_s = 0.0
        else:
            cmd = [sys.executable, "-m", "kforge.bench.packages", "--resynth", str(first_ok),
                   "--out", str(package), "--target", target, "--precision", policy,
                   "--provider", provider, *workers]
            shared_s = _stage_seconds(first_ok)
        rc, log, wall = _run_recorded(cmd, timeout_s, workload.env)
        record = {"workload": workload.name, "policy": policy, "target": target,
                  "env": dict(workload.env),
                  "provider": provider, "scale": "smoke" if smoke else "full",
                  "status": "ok" if rc == 0 else "failed", "returncode": rc,
                  # a reused import + regions stage counts in every policy's compile time
                  "compile_s": round(wall + shared_s, 2),
                  "regions_from": str(first_ok) if first_ok and not cast else None,
                  "command": " ".join(cmd), "log_tail": log.strip().splitlines()[-15:],
                  "stripped": [] if keep_weights or not package.is_dir() else strip_weights(package)}
        record_path.write_text(json.dumps(record, indent=1) + "\n")
        records.append(record)
        if rc == 0 and first_ok is None and not cast:
            first_ok = package
    return records


def resynth(src: Path, dst: Path, target: str, precision: str, provider: str,
            workers: str | None = None, gpu_share: int = 1) -> int:
    """Synthesize kernels for another policy from a package's exported regions (no MLIR)."""
    from kforge.package import compile_regions
    from kforge.synth import SynthOptions
    from kforge.workers import use_workers

    meta = json.loads((src / "package.json").read_text())
    extra = {k: meta[k] for k in ("inputs", "outputs", "dynamic_batch", "ir") if k in meta}
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("model.mlir",):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    model = src / "model.py"
    if target == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    with use_workers(workers, gpu_share=gpu_share):
        compile_regions(src / "regions", dst, SynthOptions(target=target, precision=precision,
                                                           provider=provider),
                        model_path=model if model.is_file() else None, extra_meta=extra)
    return 0


def tune_one(package: Path, timeout_s: float, rounds: int, gpu: int | None = None,
             workers: list[str] = ()) -> dict:
    cmd = [sys.executable, "-m", "kforge.cli", "tune", str(package), "--rounds", str(rounds),
           *workers]
    env = kforge_env()
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    t0 = time.perf_counter()
    # the whole log, written as it comes (a run stopped by its limit keeps what it said)
    log_path = package.parent / f"{package.name}.tune.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True,
                                env=env)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # the tune's worker processes and their sandboxes (each in a session of its own)
            # go with it: left running they hold the GPU memory the next step needs
            kill_tree(proc.pid)
            proc.wait()
            rc = 124
    log = log_path.read_text(errors="replace")
    if rc == 124:
        log += f"\ntimed out after {timeout_s:.0f}s\n"
    regions = {}
    for line in log.splitlines():            # `kforge tune` prints "region <hash>: <status>"
        if line.startswith("region ") and ": " in line:
            h, status = line[len("region "):].split(": ", 1)
            regions[h] = status.strip()
    if not regions:      # stopped before its summary: what the manifest holds (written per region)
        try:
            kernels = json.loads((package / "manifest.json").read_text()).get("kernels", {})
            regions = {h: (e.get("verification") or {}).get("status", "?") + " (manifest)"
                       for h, e in kernels.items()}
        except (OSError, ValueError):
            pass
    record = {"package": str(package), "returncode": rc, "tune_s": round(time.perf_counter() - t0, 2),
              "rounds": rounds, "gpu": gpu, "regions": regions, "log_tail": log.strip().splitlines()[-15:]}
    (package.parent / f"{package.name}.tune.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def tune_all(out: Path, selected, policies, jobs: int, timeout_s: float, rounds: int,
             gpus: int = 0, deadline: float | None = None, workers: list[str] = ()) -> int:
    """Tune packages `jobs` at a time; with gpus > 0, job i runs on GPU i % gpus. With
    rounds > 0 the tuner times configurations, so give each GPU one job (jobs = gpus)."""
    packages = [out / p / w.name for p in policies for w in selected if (out / p / w.name).is_dir()]
    print(f"tuning {len(packages)} packages, {jobs} at a time"
          + (f" over {gpus} GPUs" if gpus else ""), flush=True)
    failed = 0

    def job(i, pkg):
        if deadline is not None and time.time() > deadline:
            return {"returncode": None, "tune_s": 0.0, "regions": {}, "skipped": "deadline"}
        return tune_one(pkg, timeout_s, rounds, i % gpus if gpus else None, workers)

    def show(pkg, rec, note=""):
        states = ", ".join(f"{v}" for v in rec["regions"].values()) or "nothing to verify"
        print(f"{pkg.parent.name:6s} {pkg.name:42s} rc={rec['returncode']} {rec['tune_s']:6.1f}s  "
              f"{states}{note}", flush=True)

    out_of_memory = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(job, i, pkg): (i, pkg) for i, pkg in enumerate(packages)}
        for fut in concurrent.futures.as_completed(futures):
            rec = fut.result()
            i, pkg = futures[fut]
            if rec.get("skipped"):
                print(f"{pkg.parent.name:6s} {pkg.name:42s} not started (deadline): the bench "
                      "verifies it in its own process", flush=True)
                continue
            if jobs > 1 and ran_out_of_memory(rec):
                out_of_memory.append((i, pkg))
                show(pkg, rec, "  (out of device memory: again later, alone)")
                continue
            failed += rec["returncode"] != 0
            show(pkg, rec)
    # fewer at a time: what ran out of memory beside other jobs runs again one at a time
    for i, pkg in sorted(out_of_memory):
        rec = job(i, pkg)
        if rec.get("skipped"):
            continue
        failed += rec["returncode"] != 0
        show(pkg, rec, "  (retried alone)")
    return failed


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and everything below it."""
    import signal

    from kforge.workers.admission import descendants
    for p in [pid] + descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def ran_out_of_memory(record: dict) -> bool:
    """A `kforge tune` run (its tune.json record) that left regions unverified for lack of
    device memory, or died of it."""
    text = "\n".join(record.get("log_tail", [])).lower()
    return record.get("returncode") != 0 and \
        re.search(r"out of (\w+ )?memory|outofmemoryerror", text) is not None


def _write_build_record(out: Path, policies: list[str], target: str) -> None:
    """OUT/BUILD.json: which code built the folder (commit, uncommitted changes, code digest)."""
    import torch

    from kforge.bench.report import git_output, source_digest
    record = {"built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "git_commit": git_output("rev-parse", "HEAD") or None,
              "uncommitted_changes": bool(git_output("status", "--porcelain",
                                                     "--untracked-files=no")),
              "kforge_source_sha256": source_digest(), "target": target, "policies": policies,
              "torch": torch.__version__}
    (out / "BUILD.json").write_text(json.dumps(record, indent=1) + "\n")


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
    p.add_argument("--tune", action="store_true",
                   help="on the target machine: verify/tune the packages in --out instead of building")
    p.add_argument("--jobs", type=int, default=1,
                   help="workloads compiled (or, with --tune, packages tuned) at a time")
    p.add_argument("--resynth", type=Path, default=None, metavar="SRC_PKG",
                   help=argparse.SUPPRESS)   # internal: --out PKG from SRC_PKG's regions
    p.add_argument("--rounds", type=int, default=0,
                   help="with --tune: optimization rounds per region (`kforge tune --rounds`)")
    p.add_argument("--retry-rejected", action="store_true",
                   help="with --tune: also regions whose builtin kernel was rejected, where this "
                        "KForge generates it differently (`kforge tune --retry-rejected`)")
    p.add_argument("--regenerate", action="append", default=[], metavar="REGION|KIND[=SCHEME]",
                   help="with --tune: `kforge tune --regenerate` (repeatable)")
    p.add_argument("--check", action="store_true",
                   help="with --tune: `kforge tune --check`, each package's whole model against "
                        "its eager model, regions raised to strict until it is within the policy")
    p.add_argument("--gpus", type=int, default=0,
                   help="with --tune: spread the jobs over this many GPUs (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--deadline", type=float, default=None, metavar="EPOCH",
                   help="with --tune: start no package after this time (seconds since the epoch)")
    p.add_argument("--workers", default=None, metavar="local[:N]|ray[://ADDRESS]",
                   help="where each package's regions are synthesized and tuned (`kforge "
                        "compile --workers`; docs/scale-out.md)")
    p.add_argument("--gpu-share", type=int, default=1, metavar="K",
                   help="with --workers ray: region tasks per GPU (`kforge compile --gpu-share`)")
    p.add_argument("--shard", action="append", default=[], metavar="I/N",
                   help="only the workloads of shard I of N, as `kforge bench --shard` cuts them "
                        "(repeatable)")
    args = p.parse_args(argv)
    if args.resynth:
        return resynth(args.resynth, args.out, args.target, args.precision, args.provider,
                       args.workers, args.gpu_share)
    workers = workers_args(args.workers, args.gpu_share)

    selected = wl_mod.discover(args.workloads)
    if args.shard:
        selected = wl_mod.shards(selected, args.shard)
    policies = [x for x in args.precision.split(",") if x]
    if args.tune and "bf16" in policies and "bf16-model" not in policies \
            and (args.out / "bf16-model").is_dir():
        policies.append("bf16-model")      # the bench runs it beside bf16 (kforge.bench.runner)
    if args.tune:
        tune_args = workers + (["--retry-rejected"] if args.retry_rejected else []) + \
            [a for r in args.regenerate for a in ("--regenerate", r)] + \
            (["--check"] if args.check else [])
        return 1 if tune_all(args.out, selected, policies, args.jobs, args.timeout, args.rounds,
                             args.gpus, args.deadline, tune_args) else 0
    args.out.mkdir(parents=True, exist_ok=True)
    _write_build_record(args.out, policies, args.target)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="kforge-bench-pkg-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(build_workload, w, policies, args.out, args.target, args.provider,
                               args.smoke, args.keep_weights, args.timeout, args.compile_arg,
                               Path(tmp), args.skip_existing, workers) for w in selected]
        for fut in concurrent.futures.as_completed(futures):
            for rec in fut.result():
                failed += rec["status"] not in ("ok", "skipped")
                why = "" if rec["status"] == "ok" else "  " + " | ".join(rec["log_tail"][-2:])[:300]
                state = "kept" if rec.get("kept") else rec["status"]
                print(f"{rec['policy']:6s} {rec['workload']:42s} {state:6s} {rec['compile_s']:7.1f}s{why}",
                      flush=True)
    size = folder_size(args.out)
    print(f"{args.out}: {size / 2 ** 20:.1f} MiB" + ("  (over the 64 MiB a device call carries!)"
                                                      if size > 64 * 2 ** 20 else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
