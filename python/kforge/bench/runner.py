"""The benchmark loop: for each workload, eager, torch.compile and KForge (one package per
precision policy), in one process on one machine.

Per workload:
  1. instantiate the model (weights under seed 0) and its timing inputs (seed 1);
  2. count FLOPs and bytes; time eager; build and time torch.compile;
  3. per policy: get the KForge version (compile, or load + tune a package), check it on fresh
     inputs (seeds 1000, 1001) against eager within the policy's tolerance, time it;
  4. speedup over the faster baseline, fraction of the roofline floor.
Anything that fails is recorded with its reason; the run goes on.
"""
from __future__ import annotations

import gc
import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kforge.bench import backends, roofline
from kforge.bench.timing import Timing
from kforge.bench.workloads import Workload

CHECK_SEEDS = (1000, 1001)


@dataclass(frozen=True)
class BenchConfig:
    target: str                        # cuda | cpu
    precisions: tuple[str, ...]        # policies to run KForge under
    scale: str                         # full | smoke
    baselines: tuple[str, ...]         # subset of ("eager", "compile")
    provider: str = "builtin"
    packages: Path | None = None       # compiled elsewhere: PACKAGES/<policy>/<workload>
    tune: bool = True                  # kforge tune loaded packages before use
    compile_mode: str | None = None    # torch.compile mode
    baseline_precision: str = "as-written"   # or "matched": also time PyTorch's TF32 / bf16 modes
    compile_times: Path | None = None  # cold torch.compile times from kforge.bench.precompile
    workdir: Path = Path("kforge-bench-work")
    deadline: float | None = None      # time.time() after which remaining workloads are skipped


@dataclass
class ContenderResult:
    name: str                          # eager | torch.compile | kforge[<policy>]
    status: str                        # ok | mismatch | failed | skipped
    reason: str = ""
    timing: Timing | None = None
    compile_s: float | None = None
    max_abs_err: float | None = None   # vs eager on fresh inputs
    max_rel_err: float | None = None   # ||out - ref|| / ||ref||
    info: dict = field(default_factory=dict)


@dataclass
class PolicyResult:
    precision: str
    kforge: ContenderResult
    atol: float
    rtol: float
    floor_ms: float | None = None
    roofline_fraction: float | None = None   # floor / measured (1.0 = at the floor)
    speedup: float | None = None             # faster baseline / kforge, when correct
    min_bytes: int | None = None
    # --baseline-precision matched: eager and torch.compile under PyTorch's own mode for the
    # policy (TF32 matmuls; bf16 autocast), and the speedup over the faster of those.
    matched_baselines: list = field(default_factory=list)
    matched_best_ms: float | None = None
    speedup_matched: float | None = None


@dataclass
class WorkloadResult:
    name: str
    path: str
    tags: list
    scale: str
    input_shapes: list
    flops: int | None = None
    bytes_fp32: int | None = None
    baselines: list = field(default_factory=list)       # ContenderResult
    best_baseline: str | None = None
    best_baseline_ms: float | None = None
    baseline_fp32_floor_ms: float | None = None
    baseline_roofline_fraction: float | None = None     # fp32 floor / faster baseline
    policies: list = field(default_factory=list)        # PolicyResult
    status: str = "ok"                                   # ok | failed | skipped
    reason: str = ""
    wall_s: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _errors(out, ref) -> tuple[float, float]:
    import torch

    outs = out if isinstance(out, (tuple, list)) else [out]
    refs = ref if isinstance(ref, (tuple, list)) else [ref]
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, expected {len(refs)}")
    max_abs, num, den = 0.0, 0.0, 0.0
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            raise ValueError(f"output shape {tuple(o.shape)}, expected {tuple(r.shape)}")
        d = (o.double() - r.double())
        if not torch.isfinite(o).all():
            return float("inf"), float("inf")
        max_abs = max(max_abs, d.abs().max().item())
        num += d.pow(2).sum().item()
        den += r.double().pow(2).sum().item()
    return max_abs, (num ** 0.5) / max(den ** 0.5, 1e-30)


def _within(out, ref, atol, rtol, scaled: bool) -> bool:
    """Every element within atol + rtol * |ref|; with `scaled`, atol is multiplied by
    max(1, RMS(ref)) as kforge.verify does, so outputs of large magnitude (row sums,
    logsumexp) get an absolute tolerance relative to their size. NaN / Inf never pass."""
    import torch

    outs = out if isinstance(out, (tuple, list)) else [out]
    refs = ref if isinstance(ref, (tuple, list)) else [ref]
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape) or not torch.isfinite(o).all():
            return False
        o, r = o.double(), r.double()
        scale = max(1.0, r.pow(2).mean().sqrt().item()) if scaled else 1.0
        if not ((o - r).abs() <= atol * scale + rtol * r.abs()).all():
            return False
    return True


class Runner:
    def __init__(self, config: BenchConfig, timer, peaks: roofline.Peaks, log=print):
        self.config, self.timer, self.peaks, self.log = config, timer, peaks, log
        self.device = "cuda" if config.target == "cuda" else "cpu"
        self._current: str | None = None

    def run(self, workloads: list[Workload], on_result=None) -> list[WorkloadResult]:
        """Run each workload; `on_result(results so far)` is called after every one."""
        results = []
        for i, wl in enumerate(workloads):
            if self.config.deadline is not None and time.time() > self.config.deadline:
                results.append(WorkloadResult(wl.name, str(wl.path), [], self.config.scale, [],
                                              status="skipped", reason="time budget exhausted"))
                self.log(f"[{i + 1}/{len(workloads)}] {wl.name}: skipped (time budget)")
                continue
            self.log(f"[{i + 1}/{len(workloads)}] {wl.name}")
            t0 = time.perf_counter()
            try:
                res = self.run_one(wl)
            except Exception as exc:   # a broken workload must not end the suite
                res = WorkloadResult(wl.name, str(wl.path), [], self.config.scale, [], status="failed",
                                     reason=f"{type(exc).__name__}: {exc}"[:500])
                self.log(traceback.format_exc())
            res.wall_s = time.perf_counter() - t0
            results.append(res)
            self._cleanup()
            if on_result is not None:
                on_result(results)
        return results

    def _cleanup(self):
        import torch

        gc.collect()
        try:
            torch._dynamo.reset()
        except Exception:
            pass
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def _fresh_references(self, wl: Workload, model):
        import torch

        checks = []
        for seed in CHECK_SEEDS:
            fresh = wl.inputs(self.config.scale, self.device, seed)
            with torch.no_grad():
                checks.append((fresh, model(*fresh)))
        return checks

    def _check(self, fn, checks, atol=None, rtol=None) -> tuple[bool, float, float, bool]:
        """(passes, max abs err, relative L2 err, passes with an unscaled atol)."""
        import torch

        ok, plain, max_abs, max_rel = True, True, 0.0, 0.0
        for fresh, ref in checks:
            with torch.no_grad():
                out = fn(*fresh)
            a, r = _errors(out, ref)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if atol is not None:
                ok = ok and _within(out, ref, atol, rtol, scaled=True)
                plain = plain and _within(out, ref, atol, rtol, scaled=False)
        return ok, max_abs, max_rel, plain

    def _time(self, fn, inputs) -> Timing:
        import torch

        def call():
            with torch.no_grad():
                return fn(*inputs)
        return self.timer.measure(call)

    def run_one(self, wl: Workload) -> WorkloadResult:
        import torch

        cfg = self.config
        self._current = wl.name
        mod = wl.module()
        model, inputs = wl.instantiate(cfg.scale, self.device, seed=0)
        res = WorkloadResult(wl.name, str(wl.path), list(getattr(mod, "TAGS", ())), cfg.scale,
                             [list(t.shape) for t in inputs if isinstance(t, torch.Tensor)])
        with torch.no_grad():
            out = model(*inputs)
        res.flops = roofline.count_flops(model, inputs)
        res.bytes_fp32 = roofline.min_bytes(model, inputs, out, None)
        del out
        checks = self._fresh_references(wl, model)

        # Baselines: the model as written, fp32 (TF32 stays off, PyTorch's default).
        res.baselines = self._baselines(model, inputs, checks, None)
        best = _fastest(res.baselines)
        if best:
            res.best_baseline, res.best_baseline_ms = best.name, best.timing.median_ms
            res.baseline_fp32_floor_ms = roofline.floor_ms(res.flops, res.bytes_fp32, self.peaks, "fp32")
            res.baseline_roofline_fraction = res.baseline_fp32_floor_ms / best.timing.median_ms

        for policy in cfg.precisions:
            pr = self._kforge(wl, model, inputs, checks, policy, res)
            if cfg.baseline_precision == "matched":
                self._matched(pr, model, inputs, checks, res)
            res.policies.append(pr)
            self.log("    " + _one_line(pr, res))
        return res

    def _baselines(self, model, inputs, checks, policy: str | None) -> list[ContenderResult]:
        """Eager and torch.compile, as written (policy None) or under PyTorch's mode for policy."""
        import torch

        cfg = self.config
        out = []
        with backends.baseline_precision(policy, self.device):
            if "eager" in cfg.baselines:
                if policy is None:
                    out.append(ContenderResult("eager", "ok", timing=self._time(model, inputs),
                                               compile_s=0.0, max_abs_err=0.0, max_rel_err=0.0))
                else:
                    _, max_abs, max_rel, _ = self._check(model, checks)
                    out.append(ContenderResult("eager", "ok", timing=self._time(model, inputs),
                                               compile_s=0.0, max_abs_err=max_abs, max_rel_err=max_rel))
            else:
                out.append(ContenderResult("eager", "skipped", reason="not requested (--baselines)"))
            if "compile" in cfg.baselines:
                if policy is not None:
                    torch._dynamo.reset()      # compile afresh under this mode
                out.append(self._baseline_compile(model, inputs, checks, cold=policy is None))
            else:
                out.append(ContenderResult("torch.compile", "skipped",
                                           reason="not requested (--baselines)"))
        return out

    def _matched(self, pr: PolicyResult, model, inputs, checks, res: WorkloadResult) -> None:
        if pr.precision == "strict":          # PyTorch has no faster fp32-accurate mode
            pr.matched_best_ms, pr.speedup_matched = res.best_baseline_ms, pr.speedup
            return
        pr.matched_baselines = self._baselines(model, inputs, checks, pr.precision)
        best = _fastest(pr.matched_baselines)
        if best:
            pr.matched_best_ms = best.timing.median_ms
            if pr.speedup is not None:
                pr.speedup_matched = best.timing.median_ms / pr.kforge.timing.median_ms

    def _baseline_compile(self, model, inputs, checks, cold: bool = False) -> ContenderResult:
        try:
            c = backends.torch_compile(model, inputs, self.config.target, self.config.compile_mode)
            record = self._cold_compile_record() if cold else {}
            if record.get("status") == "ok":      # caches were warmed by the parallel pre-pass
                c.info.update(compile_s_warm=c.compile_s, compile_s_source="cold, parallel pre-pass")
                c.compile_s = float(record["compile_s"])
            _, max_abs, max_rel, _ = self._check(c.fn, checks)
            return ContenderResult("torch.compile", "ok", timing=self._time(c.fn, inputs),
                                   compile_s=c.compile_s, max_abs_err=max_abs, max_rel_err=max_rel,
                                   info=c.info)
        except backends.ContenderUnavailable as exc:
            return ContenderResult("torch.compile", exc.status, reason=str(exc))
        except Exception as exc:
            return ContenderResult("torch.compile", "failed", reason=f"{type(exc).__name__}: {exc}"[:500])

    def _cold_compile_record(self) -> dict:
        if self.config.compile_times is None or self._current is None:
            return {}
        path = self.config.compile_times / f"{self._current}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def _kforge(self, wl, model, inputs, checks, policy, res) -> PolicyResult:
        import torch

        cfg = self.config
        atol, rtol = backends.TOLERANCE[policy]
        with torch.no_grad():
            out = model(*inputs)
        pr = PolicyResult(policy, ContenderResult(f"kforge[{policy}]", "failed"), atol=atol, rtol=rtol,
                          min_bytes=roofline.min_bytes(model, inputs, out, policy))
        del out
        pr.floor_ms = roofline.floor_ms(res.flops, pr.min_bytes, self.peaks, policy)
        try:
            if cfg.packages is not None:
                c = backends.kforge_loaded(cfg.packages / policy / wl.name, model, cfg.target, policy,
                                           cfg.tune)
            else:
                c = backends.kforge_compiled(model, inputs, cfg.target, policy, cfg.provider,
                                             cfg.workdir / policy / wl.name)
        except backends.ContenderUnavailable as exc:
            pr.kforge = ContenderResult(f"kforge[{policy}]", exc.status, reason=str(exc))
            return pr
        kernels, regions = getattr(c.fn, "kernels", None), getattr(c.fn, "regions", None)
        if kernels is not None and regions is not None:   # kforge.runtime.CompiledModel
            c.info["regions_total"], c.info["regions_on_kernels"] = len(regions), len(kernels)
        kr = ContenderResult(c.name, "ok", compile_s=c.compile_s, info=c.info)
        pr.kforge = kr
        try:
            # The first call JIT-compiles the Triton kernels on this device: compile time, as
            # torch.compile's first call is.
            t0 = time.perf_counter()
            with torch.no_grad():
                c.fn(*inputs)
            if self.device == "cuda":
                torch.cuda.synchronize()
            kr.info["first_call_s"] = time.perf_counter() - t0
            kr.compile_s = (kr.compile_s or 0.0) + kr.info["first_call_s"]
            ok, kr.max_abs_err, kr.max_rel_err, plain = self._check(c.fn, checks, atol, rtol)
            kr.info["within_unscaled_atol"] = plain
            if not ok:
                kr.status = "mismatch"
                kr.reason = (f"outside atol={atol:g} x max(1, RMS(ref)), rtol={rtol:g} vs eager on fresh inputs "
                             f"(max abs err {kr.max_abs_err:.3g}, rel L2 err {kr.max_rel_err:.3g})")
            kr.timing = self._time(c.fn, inputs)
        except Exception as exc:
            kr.status, kr.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
            return pr
        pr.roofline_fraction = pr.floor_ms / kr.timing.median_ms
        if kr.status == "ok" and res.best_baseline_ms:
            pr.speedup = res.best_baseline_ms / kr.timing.median_ms
        return pr


def _fastest(results: list[ContenderResult]) -> ContenderResult | None:
    timed = [b for b in results if b.status == "ok" and b.timing]
    return min(timed, key=lambda b: b.timing.median_ms) if timed else None


def _one_line(pr: PolicyResult, res: WorkloadResult) -> str:
    k = pr.kforge
    base = f"{res.best_baseline} {res.best_baseline_ms:.3f} ms" if res.best_baseline_ms else "no baseline"
    if k.timing is None:
        return f"{pr.precision:6s} kforge {k.status}: {k.reason}  ({base})"
    sp = f"{pr.speedup:.2f}x" if pr.speedup else "n/a"
    matched = f"; {pr.speedup_matched:.2f}x vs PyTorch {pr.precision}" if pr.speedup_matched and \
        pr.precision != "strict" else ""
    return (f"{pr.precision:6s} kforge {k.timing.median_ms:.3f} ms [{k.status}] vs {base}: {sp}, "
            f"{100 * pr.roofline_fraction:.0f}% of floor{matched}")
