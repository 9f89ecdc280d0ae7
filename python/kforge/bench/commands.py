"""`kforge bench`: the command line of the benchmark (see docs/bench.md)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kforge.commands import target_arg
from kforge.errors import UserError

POLICIES = ("strict", "tf32", "bf16")
BASELINES = ("eager", "compile")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="time PyTorch eager, torch.compile and KForge packages on a workload suite",
        description="Time PyTorch eager, torch.compile and KForge on KernelBench-format workloads, "
                    "check KForge on fresh inputs, and write JSON, Markdown and a PNG plot.")
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help="workload names, glob patterns (gemm_*), files or folders "
                        "(default: every file in benchmarks/workloads)")
    p.add_argument("--target", type=target_arg, default=None, metavar="BACKEND[:ARCH]",
                   help="device to run on: cuda[:sm_90|sm_80] or cpu (the Triton interpreter); "
                        "default: the GPU here, else cpu. The architecture picks the kernels' "
                        "configurations and the --peaks table")
    p.add_argument("--precision", default="strict",
                   help="precision policy, or several comma-separated: strict,tf32,bf16 "
                        "(baselines are measured once and shared)")
    p.add_argument("--out", required=False, type=Path, default=None,
                   help="output folder for bench.json, bench.md, bench.png")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes (each workload's SMOKE variant), for CPU runs in CI")
    p.add_argument("--packages", type=Path, default=None,
                   help="folder of packages compiled elsewhere: PACKAGES/<policy>/<workload>/ "
                        "(benchmarks/build_packages.sh makes one); default: compile here")
    p.add_argument("--no-tune", action="store_true",
                   help="with --packages: do not verify/tune pending candidate kernels first "
                        "(they then stay unused: regions run by their reference)")
    p.add_argument("--baselines", default="eager,compile",
                   help="comma-separated subset of eager,compile (default both; "
                        "a skipped baseline is recorded with its reason)")
    p.add_argument("--baseline-precision", choices=("as-written", "matched"), default="matched",
                   help="matched (default): beside the fp32 baselines, time the routes a user "
                        "would take in PyTorch at each policy's precision (tf32: allow_tf32 "
                        "eager/torch.compile; bf16: the model cast to bf16 under eager, "
                        "torch.compile and max-autotune-no-cudagraphs, and autocast), each "
                        "checked at the policy's tolerance (docs/bench.md); as-written: the fp32 "
                        "baselines only")
    p.add_argument("--compile-times", type=Path, default=None, metavar="DIR",
                   help="cold torch.compile times from `python -m kforge.bench.precompile` (which "
                        "warmed the caches in parallel): reported instead of the warm ones")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: Inductor's default)")
    p.add_argument("--provider", default="builtin", help="KForge provider when compiling here")
    p.add_argument("--peaks", choices=("measure", "table"), default=None,
                   help="roofline peaks: measure on this machine (default on cuda) or DESIGN.md's "
                        "H200 table (default on cpu)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run every N-th workload starting at I (one shard per GPU)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="stop starting new workloads after S seconds; the rest are recorded as skipped")
    p.add_argument("--deadline", type=float, default=None, metavar="EPOCH",
                   help="like --time-budget, as an absolute time (seconds since the epoch), "
                        "shared by the shards of one run")
    p.add_argument("--rep-ms", type=float, default=200.0,
                   help="CUDA: target timed milliseconds per measurement (at least --min-reps runs)")
    p.add_argument("--min-reps", type=int, default=20, help="CUDA: fewest timed runs per measurement")
    p.add_argument("--checkpoint", type=Path, default=None, metavar="FILE",
                   help="rewrite this JSON after every workload with the results so far (a run "
                        "cut off by a time limit still leaves them; `--merge` reads it)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="do not run: merge bench JSON files (shards) into one report in --out")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.set_defaults(func=run_bench)


def _split(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UserError(f"--{what} {text!r}: expected a comma-separated subset of {', '.join(allowed)}")
    return items


def run_bench(args) -> int:
    from kforge.bench import report, workloads as wl_mod

    if args.merge:
        if not args.out:
            raise UserError("--merge needs --out DIR")
        docs = []
        for path in args.merge:
            try:
                docs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                raise UserError(f"--merge {path}: cannot read a bench JSON: {exc}") from exc
        try:
            merged = report.merge(docs)
        except ValueError as exc:
            raise UserError(f"--merge: {exc}") from exc
        paths = report.write_all(merged, args.out)
        print(f"merged {len(docs)} reports: " + ", ".join(str(p) for p in paths.values()))
        return 0

    if args.list:
        for w in wl_mod.discover(args.workloads):
            mod = w.module()
            print(f"{w.name:42s} {' '.join(getattr(mod, 'TAGS', ()))}")
        return 0
    if not args.out:
        raise UserError("--out DIR is required (where bench.json, bench.md and bench.png go)")
    precisions = _split(args.precision, POLICIES, "precision")
    baselines = _split(args.baselines, BASELINES, "baselines")

    if args.target == "cpu":
        # KForge kernels run in the Triton interpreter, which must be chosen before triton is
        # first imported (torch imports it lazily, e.g. for FlopCounterMode).
        os.environ["TRITON_INTERPRET"] = "1"
    from kforge.targets import get_target, local_target
    tgt = get_target(args.target) if args.target else local_target()
    target = tgt.name
    if not tgt.available():
        raise UserError(f"--target {tgt.name}: no {tgt.name} device visible to PyTorch here "
                        f"(a ROCm build's GPUs are not cuda devices); use --target cpu")
    if tgt.interpreter:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UserError("--target cpu: triton was imported in this process before "
                            "TRITON_INTERPRET=1 was set, so its kernels cannot run in the "
                            "interpreter; run `kforge bench` in a fresh process")
        os.environ["TRITON_INTERPRET"] = "1"
    # after the interpreter's switch: a workload file may import triton (VARIANTS are read by
    # importing the file)
    selected = wl_mod.discover(args.workloads)
    shard = None
    if args.shard:
        i, n = wl_mod.parse_shard(args.shard)
        selected, shard = wl_mod.shard(selected, i, n), f"{i}/{n}"
    return _run(args, selected, target, precisions, baselines, shard)


def _deadline(args, start: float) -> float | None:
    limits = [x for x in (args.deadline, start + args.time_budget if args.time_budget else None)
              if x is not None]
    return min(limits) if limits else None


def _run(args, selected, target, precisions, baselines, shard) -> int:
    from kforge.bench import report, roofline, timing
    from kforge.bench.runner import BenchConfig, Runner

    from kforge.targets import get_target
    start = time.time()
    tgt = get_target(target)
    timer = timing.timer_for(tgt, rep_ms=args.rep_ms, min_reps=args.min_reps)
    notes = []
    peaks_mode = args.peaks or ("table" if tgt.interpreter else "measure")
    if peaks_mode == "measure":
        try:
            peaks = roofline.measure_peaks(tgt, timer)
        except Exception as exc:
            peaks = roofline.table_peaks(tgt)
            notes.append(f"peak measurement failed ({type(exc).__name__}: {exc}); the "
                         f"{tgt.label} table used")
    else:
        peaks = roofline.table_peaks(tgt)
        if tgt.interpreter:
            notes.append("CPU run: roofline fractions use the H200 table and only exercise the "
                         "pipeline; times are the Triton interpreter's")
    print(f"peaks ({peaks.source}): fp32 {peaks.fp32_tflops:.1f}, tf32 {peaks.tf32_tflops:.1f}, "
          f"bf16 {peaks.bf16_tflops:.1f} TFLOP/s, {peaks.bandwidth_tbs:.2f} TB/s", flush=True)

    out = args.out
    config = BenchConfig(
        target=target, precisions=precisions, scale="smoke" if args.smoke else "full",
        baselines=baselines, provider=args.provider, packages=args.packages, tune=not args.no_tune,
        compile_mode=args.compile_mode,
        baseline_precision=args.baseline_precision, compile_times=args.compile_times,
        workdir=out / "work", deadline=_deadline(args, start))
    env = report.environment(target)        # nvidia-smi, git, the code digest: once a run

    def document(results, partial=False):
        return report.build_document(env, _config_json(
            args, config, target, precisions, baselines, shard, start),
            peaks.to_json(), [r.to_json() for r in results],
            notes + ([f"partial: {sum(r.status != 'partial' for r in results)} of "
                      f"{len(selected)} workloads done when written" +
                      ("; the last in progress, with the routes it had measured"
                       if results and results[-1].status == "partial" else "")]
                     if partial else []))

    def checkpoint(results):
        if args.checkpoint:
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps(document(results, partial=True), indent=1,
                                      default=report._json_default) + "\n")
            tmp.replace(args.checkpoint)

    results = Runner(config, timer, peaks, log=lambda m: print(m, flush=True)).run(
        selected, on_result=checkpoint)
    doc = document(results)
    paths = report.write_all(doc, out)
    print(report.markdown(doc).split("## Per workload")[0])
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _config_json(args, config, target, precisions, baselines, shard, start) -> dict:
    from kforge.bench import routes
    from kforge.targets import get_target

    cfg_json = {
        "target": target, "target_arch": get_target(target).label,
        "precisions": list(precisions), "scale": config.scale,
        "baselines": list(baselines), "provider": args.provider, "shard": shard,
        "compile_mode": args.compile_mode or "default",
        "compile_times": ("torch.compile compile times: cold, measured by a parallel pre-pass "
                          "(kforge.bench.precompile) that warmed Inductor's caches"
                          if args.compile_times else "torch.compile compile times: its first call here"),
        "kforge_source": (f"loaded from {args.packages} (compiled elsewhere; "
                          f"{'candidate kernels verified here first' if config.tune else 'not verified again here'})"
                          if args.packages else "compiled here with kforge.compile"),
        "baseline_precision": args.baseline_precision,
        "baseline_note": "PyTorch eager and torch.compile run the model as written in fp32 with "
                         "TF32 off for matmuls AND cuDNN (torch.backends.cudnn.allow_tf32=False: "
                         "PyTorch's default leaves TF32 convolutions on), as do the references "
                         "and KForge; speedups are over the faster correct of the two, per workload"
                         + ("; 'vs matched': the faster correct route a user would take in PyTorch "
                            "at the policy's precision (strict: the fp32 baselines; tf32: "
                            "allow_tf32 eager / torch.compile; bf16: model.bfloat16() under eager, "
                            "torch.compile, max-autotune-no-cudagraphs, and autocast(bf16) eager), "
                            "each checked against eager fp32 at the policy's tolerance"
                            if args.baseline_precision == "matched" else
                            "; matched routes not run (--baseline-precision as-written)"),
        "matched_routes": {p: {r.name: r.describe() for r in routes.matched_routes(p)}
                           for p in precisions},
        "argv": sys.argv[1:],
        "wall_s": round(time.time() - start, 1),
    }
    from kforge.bench import timing
    cfg_json["timing_method"] = timing.timer_for(
        target, rep_ms=args.rep_ms, min_reps=args.min_reps).describe()
    return cfg_json
