"""`kforge compile`, `kforge synth`, `kforge run`, `kforge tune`.

Imports stay inside the commands: `kforge run` must work where MLIR and torch-mlir are absent,
and TRITON_INTERPRET must be set (for the cpu target) before triton is first imported.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from kforge.errors import UserError
from kforge.targets import target_names

TARGETS = target_names()            # the registered backends: cuda, xpu, cpu
PROVIDERS = ("builtin", "anthropic", "openai")
PRECISIONS = ("strict", "tf32", "bf16")


def target_arg(value: str) -> str:
    """`--target BACKEND[:ARCH]` -> BACKEND; an explicit ARCH is set for this process and its
    workers (KFORGE_<BACKEND>_ARCH, read by kforge.targets) and recorded in the package."""
    from kforge.targets import split_target
    try:
        backend, arch = split_target(value)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if arch:
        os.environ[f"KFORGE_{backend.upper()}_ARCH"] = arch
    return backend


def _synth_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", type=target_arg, default="cpu", metavar="|".join(TARGETS),
                   help="device the kernels are for, optionally with its architecture: "
                        "cuda[:sm_90|sm_80], xpu[:pvc|bmg], cpu (the Triton interpreter)")
    p.add_argument("--provider", choices=PROVIDERS, default="builtin",
                   help="kernel writer (falls back to builtin if an LLM provider cannot work)")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="provider option, e.g. model=claude-sonnet-4-6 or base_url=...")
    p.add_argument("--precision", choices=PRECISIONS, default="strict",
                   help="precision policy (strict: fp32 results, atol=rtol=1e-4; tf32/bf16: "
                        "1e-2)")
    p.add_argument("--rounds", type=int, default=2,
                   help="optimization rounds per region after a kernel verifies (default 2)")
    p.add_argument("--functional-rounds", type=int, default=4,
                   help="generate/verify rounds to reach a correct kernel (default 4)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="wall-time budget per region in seconds")
    p.add_argument("--max-tokens", type=int, default=None, help="LLM token budget per region")
    p.add_argument("--max-dollars", type=float, default=None,
                   help="LLM spending budget per region")
    p.add_argument("--candidates", type=int, default=1,
                   help="candidates per round (where the provider offers several)")
    p.add_argument("--cache-only", action="store_true",
                   help="use only cached kernels; a region missing from the cache is an error "
                        "(reproducible builds)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--refresh-cache", action="store_true",
                   help="synthesize again and overwrite cached kernels")
    p.add_argument("--cache-dir", default=None,
                   help="kernel cache directory (default $KFORGE_CACHE or ~/.cache/kforge)")


def _workers_flags(p: argparse.ArgumentParser) -> None:
    from kforge.workers import WORKERS_HELP
    p.add_argument("--workers", default=None, metavar="local[:N]|ray[://ADDRESS]",
                   help=WORKERS_HELP + "; docs/scale-out.md")
    p.add_argument("--gpu-share", type=int, default=1, metavar="K",
                   help="with --workers ray on GPUs: up to K region tasks per GPU, each admitted "
                        "by the GPU's free memory; timed runs still have the GPU alone "
                        "(default 1: a GPU per task)")


def _options(args):
    from kforge.providers.registry import parse_option
    from kforge.synth import SynthOptions
    popts = dict(parse_option(o) for o in args.provider_option)
    return SynthOptions(target=args.target, precision=args.precision, provider=args.provider,
                        provider_options=popts, functional_rounds=args.functional_rounds,
                        rounds=args.rounds, time_budget_s=args.time_budget,
                        max_tokens=args.max_tokens, max_dollars=args.max_dollars,
                        num_candidates=args.candidates)


def _cache(args):
    from kforge.cache import KernelCache
    if sum([args.cache_only, args.no_cache, args.refresh_cache]) > 1:
        raise UserError("--cache-only, --no-cache and --refresh-cache exclude each other")
    mode = "only" if args.cache_only else "off" if args.no_cache else \
        "refresh" if args.refresh_cache else "use"
    return KernelCache(args.cache_dir, mode)


def _prepare_triton(target: str) -> None:
    if target == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


# ---------------------------------------------------------------------------------------------
def cmd_compile(args) -> int:
    _prepare_triton(args.target)
    from rich.console import Console

    from kforge.build import compile_model
    from kforge.package import RichProgress, print_report
    console = Console(stderr=True)
    model = args.model
    if not (Path(model).is_file() or ":" in model):
        raise UserError(f"{model}: no such model file")
    from kforge.workers import use_workers
    started = time.monotonic()
    with use_workers(args.workers, gpu_share=args.gpu_share):
        doc = compile_model(model, args.output, _options(args), cache=_cache(args),
                            dynamic_batch=args.dynamic_batch, progress=RichProgress(console),
                            on_stage=lambda s: console.print(f"[bold]{s}[/] …"))
    print_report(doc)
    print(f"package: {args.output} ({time.monotonic() - started:.1f} s); run it with "
          f"`kforge run {args.output}`")
    return 0


def cmd_synth(args) -> int:
    _prepare_triton(args.target)
    from kforge.package import manifest_entry, read_manifest, write_manifest
    from kforge.spec import load_spec
    from kforge.synth import synthesize_region
    spec_path = Path(args.region)
    spec = load_spec(spec_path)
    mlir = spec_path.with_suffix(".mlir")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    options = _options(args)
    result = synthesize_region(spec, options, cache=_cache(args), log_dir=out / "regions",
                               region_mlir=mlir.read_text() if mlir.is_file() else "",
                               progress=lambda m: print(f"  {spec.hash}: {m}", file=sys.stderr))
    manifest = read_manifest(out)
    if result.candidate is not None and result.status in ("verified", "candidate"):
        manifest["kernels"][spec.hash] = manifest_entry(out, result, options)
        write_manifest(out, manifest)
    print(json.dumps(result.to_json(), indent=2))
    return 0 if result.status in ("verified", "candidate") else 1


def cmd_run(args) -> int:
    from kforge.package import open_package
    package = open_package(args.package)
    target = args.target or package.target
    _prepare_triton(target)
    import torch

    from kforge.runtime import eager_model, load_model_file, load_package, read_inputs
    from kforge.verify import get_policy
    if args.inputs:
        inputs = read_inputs(args.inputs)
    else:
        path = package.model_path()
        if path is None:
            raise UserError(f"{args.package}: no --inputs given and the package has no model "
                            "source to take get_inputs() from")
        _, inputs = load_model_file(path, with_model=False)
    if args.report and (package.root / "report.json").is_file():
        from kforge.package import print_report
        print_report(json.loads((package.root / "report.json").read_text()))
    t = time.monotonic()
    module = None
    weights_file = package.weights_path()
    if (weights_file is None or not weights_file.is_file()) and package.model_path():
        # a package built without its weights (benchmarks carry them so): the model file's
        # module as its constructor builds it is bound, and --check compares against it
        module, _ = load_model_file(package.model_path(), with_model=True)
        print(f"note: {args.package} carries no weights file; the weights of the module its "
              "model file builds are bound")
    model = load_package(args.package, module, target=target, tune=args.tune,
                         use_kernels=not args.reference_only)
    from kforge.tune import pending_candidates
    pending = pending_candidates(model.package, target)
    if pending and not args.reference_only:
        print(f"note: {len(pending)} kernel(s) of {args.package} are unverified candidates on "
              f"{target}; their regions run on the reference. Verify them with `kforge tune "
              f"{args.package}` (or `kforge run --tune`).")
    load_s = time.monotonic() - t
    t = time.monotonic()
    from kforge.ties import Recorder
    selections = Recorder()           # its topk choices, for --check's near-tie rule
    if args.check:                    # (recorded where no CUDA graph replays the run)
        with torch.no_grad(), selections:
            out = model.run(list(inputs), graphs=False)
    else:
        out = model(*inputs)
    run_s = time.monotonic() - t
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    print(model.describe())
    for i, o in enumerate(outs):
        dtype = str(o.dtype)[6:]            # as returned, before the float copy for the stats
        o = o.detach().float().cpu()
        print(f"output {i}: shape {list(o.shape)} dtype {dtype} "
              f"mean {o.mean().item():.6g} std {o.std().item() if o.numel() > 1 else 0:.6g}")
    print(f"load {load_s:.2f} s, run {run_s:.2f} s")
    if args.output:
        torch.save([o.detach().cpu() for o in outs], args.output)
    if args.check:
        from kforge.modelcheck import arbitrate, float64_outputs, margin
        module = module if module is not None else eager_model(model.package)
        with torch.no_grad():
            ref = module(*inputs)
        policy = get_policy(model.package.precision)
        refs = [r.detach().cpu() for r in ([ref] if isinstance(ref, torch.Tensor) else ref)]
        outs = [o.detach().cpu() for o in outs]
        m = margin(outs, refs, policy.atol, policy.rtol)
        print(f"check against eager PyTorch: max abs err {m.max_abs:.3g} ({policy.name}: "
              f"{policy.tolerance_text()}; worst element at {m.worst:.3g} of its allowance, "
              f"{m.rows_outside} of {m.rows} rows outside): {'OK' if m.ok else 'MISMATCH'}")
        if not m.ok:
            # a float64 copy of the model arbitrates: eager fp32 can itself be off (an MoE
            # router's near-tie that fp32 rounding decides the wrong way), and where the
            # package is outside against both, its topk choices at near-ties are followed
            ref64, why = float64_outputs(module, inputs)
            a = arbitrate(outs, refs, why if ref64 is None else ref64, module, inputs, policy,
                          selections.calls)
            del ref64
            for line in a.lines():
                print(line)
            if a.ok:
                return 0
        if not m.ok and model.package.precision != "strict":
            print("each kernel passed its own region's check; `kforge tune "
                  f"{args.package} --check` takes the regions that carry the error to finer "
                  "precision schemes, or to strict")
        return 0 if m.ok else 1
    return 0


def cmd_link(args) -> int:
    from kforge.package import link_package, open_package
    package = open_package(args.package)
    ok, note = link_package(package.root)
    if not ok:
        raise UserError(f"{args.package}: not linked: {note}")
    linked = open_package(args.package)
    print(f"{args.package}: linked {len(linked.kernel_hashes())} kernel region(s) of "
          f"{len(linked.region_hashes())} into model.linked.mlir and linked_plan.json")
    return 0


def cmd_tune(args) -> int:
    from kforge.package import open_package
    package = open_package(args.package)
    _prepare_triton(package.target)
    from kforge.runtime import tune_package
    from kforge.workers import use_workers
    cache = None if args.no_cache else _cache_for_tune(args)
    t0 = time.monotonic()

    def progress(m: str) -> None:        # seconds since the start: where a long tune goes
        print(f"  [{time.monotonic() - t0:7.1f}s] {m}", file=sys.stderr, flush=True)

    def tune(first: bool = True) -> dict:
        # (the check's later calls verify the kernels of the regions it moved; the tuning
        # rounds and regenerations asked for ran on the first)
        return tune_package(args.package, rounds=args.rounds if first else 0,
                            provider=args.provider, repair=args.repair, cache=cache,
                            progress=progress,
                            retry_rejected=args.retry_rejected and first,
                            regenerate=tuple(args.regenerate) if first else ())

    with use_workers(args.workers, gpu_share=args.gpu_share):
        results = tune()
        if not results:
            print(f"{args.package}: nothing to verify or tune for {package.target}")
        fit = None
        if args.check:
            from kforge.modelcheck import fit_model
            progress("the whole model against eager PyTorch")
            fit = fit_model(args.package, tune=lambda: results.update(tune(first=False)),
                            say=progress, limit=args.check_limit)
        for h, status in results.items():       # (with --check, the last verdict of each)
            print(f"region {h}: {status}")
    if fit is not None:
        last = fit.checks[-1]
        print("\n".join(last.lines()[:1]))
        for h2, h, k in fit.split:
            print(f"split off by the whole-model check: call {k + 1} of region {h} as region "
                  f"{h2} (manifest site_regions)")
        for h, bits, finer in fit.tightened:
            print(f"taken to a finer scheme by the whole-model check: {h} (more than {bits} "
                  f"significant bits, the next is {finer}; manifest finer_schemes)")
        if fit.raised:
            print(f"raised to strict by the whole-model check: {', '.join(fit.raised)} "
                  "(manifest strict_regions)")
        if not fit.ok:
            print(f"the whole model stays outside the {last.policy} policy"
                  + (f": {fit.note}" if fit.note else "")
                  + ("; a higher --check-limit moves more regions" if fit.limited else
                     "; compile it under a stricter policy (--precision strict) for outputs "
                     "within it"))
    ok = all(s == "verified" for s in results.values())
    return 0 if ok and (fit is None or fit.ok) else 1


def cmd_xcompile(args) -> int:
    import json
    import warnings

    from kforge.crosscompile import compile_package
    from kforge.targets import get_target
    warnings.filterwarnings("ignore", module="triton")
    target = args.target
    if args.arch is not None:                       # the older spelling: --arch 90
        target = f"cuda:sm_{args.arch}"
    if not target:
        from kforge.package import open_package
        meta = open_package(args.package).meta
        target = f"{meta.get('target', 'cpu')}:{meta['arch']}" if meta.get("arch") \
            else meta.get("target", "cpu")
    label = get_target(target).label
    if label.startswith("xpu:"):
        from kforge.targets import xpu_env
        xpu_env.ensure(progress=lambda m: print(m, file=sys.stderr))
    report = compile_package(args.package, target=target)
    bad = 0
    print(f"{'region':16s} {'kernel':44s} {'ok':3s} {'mma':8s} {'tma':3s} {'regs':>4s} "
          f"{'spill':>6s} {'smem KB':>7s} {'shfl':>5s} {'bar':>4s} {'SPIR-V KB':>9s} "
          f"{'warps':>5s} {'s':>5s}")
    for h, kernels in report.items():
        for k in kernels:
            bad += not k.ok
            spill = "" if k.spill_stores is None else str(k.spill_stores + (k.spill_loads or 0))
            spirv = "" if k.spirv_bytes is None else f"{k.spirv_bytes / 1024:.0f}"
            ops = k.ptx_ops or {}
            print(f"{h:16s} {k.name[-44:]:44s} {'yes' if k.ok else 'NO':3s} {k.mma or '-':8s} "
                  f"{('yes' if k.tma else '-') if ops else '':3s} {k.registers or '':>4} "
                  f"{spill:>6s} "
                  f"{'' if k.shared_bytes is None else round(k.shared_bytes / 1024):>7} "
                  f"{ops.get('shfl', ''):>5} {ops.get('bar', ''):>4} "
                  f"{spirv:>9s} {k.num_warps or '':>5} {k.compile_s:5.1f}")
            if k.error:
                print(f"    {k.error.splitlines()[0][:300]}")
            if ops.get("cp.async.narrow"):
                print(f"    {ops['cp.async.narrow']} of its {ops.get('cp.async', 0)} async copies "
                      "move 4 or 8 bytes: a tile load that did not vectorize (a mask that "
                      "changes inside a 16-byte run, or rows that do not start 16-byte "
                      "aligned)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {h: [k.to_json() for k in ks] for h, ks in report.items()}, indent=1) + "\n")
    print(f"{sum(len(k) for k in report.values())} kernels, {bad} failed to compile for "
          f"{label}")
    if any(k.registers is None and k.ok for ks in report.values() for k in ks):
        print("registers and spills: not reported by this compiler (xpu: IGC reports them when "
              "the SPIR-V is finalized on the device)")
    return 1 if bad else 0


def _cache_for_tune(args):
    from kforge.cache import KernelCache
    return KernelCache(args.cache_dir, "refresh")


# ---------------------------------------------------------------------------------------------
def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compile", help="model -> package of verified Triton kernels",
        description="Import a model, form fusion regions, synthesize and verify a kernel per "
                    "region, link them, and write a self-contained package.")
    p.add_argument("model", help="KernelBench-format model file (Model, get_inputs, "
                                 "get_init_inputs) or pkg.module:Class")
    p.add_argument("-o", "--output", required=True, metavar="PKG", help="package directory")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="compile dimension 0 of the inputs as a dynamic size")
    _synth_flags(p)
    _workers_flags(p)
    p.set_defaults(func=cmd_compile)

    p = subparsers.add_parser(
        "synth", help="synthesize a kernel for one region spec",
        description="Run the synthesis loop on one exported region (<hash>.json; <hash>.mlir "
                    "beside it is used for prompts).")
    p.add_argument("region", help="kernel spec JSON (from kforge-opt --kforge-export-regions)")
    p.add_argument("-o", "--output", default=".", metavar="DIR",
                   help="where kernels/<hash>/kernel.py, manifest.json and logs go")
    _synth_flags(p)
    p.set_defaults(func=cmd_synth)

    p = subparsers.add_parser(
        "run", help="run a compiled package",
        description="Execute a package's host plan: verified kernels through Triton, everything "
                    "else through the reference. Needs only torch and triton.")
    p.add_argument("package", metavar="PKG")
    p.add_argument("--inputs", help="inputs file (torch.save'd list/dict, or .safetensors); "
                                    "default: the model's get_inputs() with seed 0")
    p.add_argument("--check", action="store_true",
                   help="compare with eager PyTorch (the package's model.py) and print the max "
                        "error; exit status 1 if outside the precision policy")
    p.add_argument("--target", type=target_arg, default=None, metavar="BACKEND[:ARCH]",
                   help="run on another device than the package's target, optionally at an "
                        "architecture (cuda:sm_80): only kernels verified for it are used")
    p.add_argument("--tune", action="store_true",
                   help="first verify candidate kernels here, as `kforge tune PKG` does (this "
                        "writes to the package); without it the package is only read")
    p.add_argument("--no-tune", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--reference-only", action="store_true",
                   help="run every region by its reference (for comparisons)")
    p.add_argument("--output", default=None, help="save the outputs (torch.save) here")
    p.add_argument("--report", action="store_true",
                   help="print the package's region report (kernels, verification, times)")
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser(
        "tune", help="verify and tune a package's kernels on this machine's device",
        description="Verify the candidate kernels of a package compiled where its target was "
                    "absent, and with --rounds run optimization passes; results go into the "
                    "package's manifest.")
    p.add_argument("package", metavar="PKG")
    p.add_argument("--rounds", type=int, default=0, help="optimization rounds per region")
    p.add_argument("--repair", type=int, default=2, metavar="N",
                   help="a builtin kernel that fails verification here is replaced by the next "
                        "one the builtin generates that verifies, within N rounds (0: no)")
    p.add_argument("--provider", choices=PROVIDERS, default=None,
                   help="provider for optimization rounds (default: the kernel's own)")
    p.add_argument("--retry-rejected", action="store_true",
                   help="also the regions whose builtin kernel was rejected: generate it again "
                        "with this KForge (same configuration) and verify it where the source "
                        "changed (after an upgrade that fixed the generator)")
    p.add_argument("--regenerate", action="append", default=[], metavar="REGION|KIND[=SCHEME]",
                   help="verified builtin kernels of this region (hash) or kind (e.g. moe, gemm) "
                        "whose first choice this KForge generates differently: verify the new "
                        "one, and keep it only where it verifies and is faster (repeatable); "
                        "KIND=SCHEME takes that precision scheme's first kernel instead, e.g. "
                        "attention=fp16x3")
    p.add_argument("--check", action="store_true",
                   help="then run the whole model against eager PyTorch (the package's model "
                        "file and its inputs) under the package's policy: each region passes "
                        "its own check, but a deep model adds their errors up; while it is "
                        "outside, the region whose exact result leaves the least error goes "
                        "one rung up (a finer precision scheme of the policy, e.g. a bf16 "
                        "attention's fp16x1 -> fp16x3, else strict) and its new kernel is "
                        "verified (kforge.modelcheck); exit status 1 if it stays outside")
    p.add_argument("--check-limit", type=int, default=None, metavar="N",
                   help="with --check, take at most N such steps")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--cache-dir", default=None)
    _workers_flags(p)
    p.set_defaults(func=cmd_tune)

    p = subparsers.add_parser(
        "link", help="link a package's verified kernels into its IR again (needs kforge-opt)",
        description="Run kforge-opt --kforge-link-kernels on the package: model.linked.mlir and "
                    "its host plan linked_plan.json (what `kforge run` executes) carry every "
                    "kernel the manifest records as verified for the package's target. `kforge "
                    "tune` does this itself where kforge-opt is installed.")
    p.add_argument("package", metavar="PKG")
    p.set_defaults(func=cmd_link)

    p = subparsers.add_parser(
        "xcompile", help="compile a package's kernels for a GPU that is not here",
        description="Compile every kernel of a package for its target's architecture (no GPU "
                    "needed) and report per kernel: compiled or the compiler's error, the matrix "
                    "unit used (wgmma / dpas), registers and spills (cuda: ptxas), shared "
                    "memory, SPIR-V size (xpu); cuda also whether TMA moves tiles and the PTX's "
                    "shuffles and barriers (all PTX counts in --json). cuda uses the local "
                    "Triton; xpu uses triton-xpu in an environment of its own, made on first use "
                    "(KFORGE_XPU_VENV, default ~/.cache/kforge/xpu-venv). The GPU host's "
                    "verification still decides.")
    p.add_argument("package", metavar="PKG")
    p.add_argument("--target", default=None, metavar="BACKEND[:ARCH]",
                   help="cuda[:sm_90|sm_80] or xpu[:pvc|bmg] (default: the package's target "
                        "and recorded architecture)")
    p.add_argument("--arch", type=int, default=None, help="cuda compute capability x10 "
                                                          "(same as --target cuda:sm_ARCH)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    p.set_defaults(func=cmd_xcompile)
