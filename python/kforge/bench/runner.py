"""The benchmark loop: for each workload, eager, torch.compile and KForge (one package per
precision policy), in one process on one machine.

Per workload, with TF32 off for matmuls and cuDNN throughout (kforge.bench.routes.numerics):
  1. instantiate the model (weights under seed 0) and its timing inputs (seed 1);
  2. count FLOPs and bytes; time eager; build and time torch.compile (the fp32 baselines);
  3. per policy: get the KForge version (compile, or load + tune a package), check it on fresh
     inputs (seeds 1000, 1001) against eager fp32 within the policy's tolerance, time it;
     under strict also the fp32-grade contract against a float64 copy of the model;
  4. per policy, the matched routes (kforge.bench.routes: what a user would run in PyTorch at
     that precision), each checked and timed the same way;
  5. speedups over the faster correct fp32 baseline and the faster correct matched route,
     fraction of the roofline floor.
Anything that fails is recorded with its reason; the run goes on.
"""
from __future__ import annotations

import gc
import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kforge.bench import backends, roofline, routes
from kforge.bench.timing import Timing
from kforge.bench.workloads import Workload

CHECK_SEEDS = (1000, 1001)


@dataclass(frozen=True)
class BenchConfig:
    target: str                        # a backend: cuda | xpu | cpu
    precisions: tuple[str, ...]        # policies to run KForge under
    scale: str                         # full | smoke
    baselines: tuple[str, ...]         # subset of ("eager", "compile")
    provider: str = "builtin"
    packages: Path | None = None       # compiled elsewhere: PACKAGES/<policy>/<workload>
    tune: bool = True                  # kforge tune loaded packages before use
    compile_mode: str | None = None    # torch.compile mode
    baseline_precision: str = "matched"   # or "as-written": only the fp32 routes
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
    # torch.allclose(out, eager_fp32, atol, rtol) at the policy's tolerance, unscaled:
    # KernelBench's own criterion (at 1e-4 under strict)
    allclose: bool | None = None
    tokens_per_s: float | None = None  # workloads that declare tokens_per_call (LLM phases)


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
    # The routes a user would take in PyTorch at this precision (kforge.bench.routes), each
    # checked against eager fp32 at the policy's tolerance; the headline is the speedup over
    # the faster one that passed (`matched_best`).
    routes: list = field(default_factory=list)         # ContenderResult
    matched_best: str | None = None
    matched_best_ms: float | None = None
    matched_fallback: str | None = None    # why matched_best is not one of `routes`
    speedup_matched: float | None = None
    # strict: KForge against a float64 copy of the model, bounded by eager fp32's own error
    # (kforge.verify.contract); None under other policies
    strict_contract: dict | None = None
    # bf16: KForge's other package for this policy (ContenderResult), the one `kforge` is not.
    # KForge's bf16 result is the faster correct one of the package of the fp32 model and the
    # package of the model cast to bf16 (`kforge_model`: "fp32" or "bf16", what `kforge` ran)
    kforge_variants: list = field(default_factory=list)
    kforge_model: str | None = None


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
    tokens_per_call: int | None = None                   # the module's tokens_per_call()
    status: str = "ok"                                   # ok | failed | skipped | partial
    reason: str = ""
    wall_s: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _pairs(out, ref):
    outs = out if isinstance(out, (tuple, list)) else [out]
    refs = ref if isinstance(ref, (tuple, list)) else [ref]
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, expected {len(refs)}")
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            raise ValueError(f"output shape {tuple(o.shape)}, expected {tuple(r.shape)}")
    return list(zip(outs, refs))


def _host(x):
    """References live in host memory (a real LLM's logits are GBs; the device keeps only the
    chunk being compared: kforge.verify.contract.chunks)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu")
    if isinstance(x, (tuple, list)):
        return type(x)(_host(t) for t in x)
    return x


def _rows_on_device(fn, inputs, separable: bool, empty_cache=lambda: None,
                    restart=lambda: None):
    """fn(*inputs) in host memory. A model that declares BATCH_SEPARABLE (the rows of its
    outputs depend only on the same rows of every input: an LLM's sequences) runs again on
    halves, quarters, ... of the batch where the whole batch runs out of device memory, and
    its outputs are concatenated (the float64 copy of a real LLM: attention scores of 8 x 64
    heads x 2048^2 in float64 are 17 GB a layer). `restart()` runs before each attempt at the
    whole batch (kforge.ties.Follower pairs selections by their order in one attempt)."""
    import torch

    from kforge.verify import is_out_of_memory

    batch = _common_batch(inputs) if separable else None
    step = batch
    while True:
        restart()
        try:
            if step == batch:
                return _host(fn(*inputs))
            return _cat_rows([_host(fn(*[x[i:i + step] if isinstance(x, torch.Tensor) else x
                                         for x in inputs])) for i in range(0, batch, step)])
        except Exception as exc:
            if not is_out_of_memory(exc) or not step or step == 1:
                raise
        empty_cache()                 # after the exception (and the tensors it holds) is gone
        step = (step + 1) // 2


def float64_copy(model, device=None):
    """A float64 copy of `model` (on `device`, default where each tensor is), its parameters
    and floating buffers widened one at a time into the copy: no fp32 copy of the whole model
    first, as deepcopy-then-convert makes (a real LLM's fp32 weights are tens of GB)."""
    import copy

    import torch

    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        wide = t.detach().to(device=device, dtype=torch.float64 if t.is_floating_point()
                             else t.dtype, copy=True)
        memo[id(t)] = torch.nn.Parameter(wide, requires_grad=t.requires_grad) \
            if isinstance(t, torch.nn.Parameter) else wide
    # (.to: what is neither a parameter nor a buffer, a tensor attribute such as a RoPE table)
    return copy.deepcopy(model, memo).to(device=device, dtype=torch.float64)


def float64_runs(model, input_sets, empty_cache=lambda: None, restart=lambda: None):
    """(the outputs of a float64 copy of `model` on each of `input_sets`, float inputs widened,
    in host memory; "") or (None, why not). The copy is made on the model's device; where it
    does not fit there (gpt-oss's 4 layers beside its fp32 model and a package on an 80 GB
    card), on the CPU, as is every run then. A model that declares BATCH_SEPARABLE runs in
    smaller batches where a whole one does not fit (`_rows_on_device`). The strict contract's
    reference and the float64 arbiter of `kforge tune --check` / `run --check` / `bench`;
    `restart()` before each attempt at a run (`_rows_on_device`)."""
    import torch

    from kforge.verify import is_out_of_memory
    separable = bool(getattr(model, "BATCH_SEPARABLE", False))
    for where in (None, "cpu"):
        model64 = None
        try:
            model64 = float64_copy(model, where)
            out = []
            with torch.no_grad():
                for inputs in input_sets:
                    wide = [x.to(device=where, dtype=torch.float64 if x.is_floating_point()
                                 else x.dtype) if isinstance(x, torch.Tensor) else x
                            for x in inputs]
                    out.append(_rows_on_device(model64, wide, separable, empty_cache,
                                               restart))
            return out, ""
        except Exception as exc:  # noqa: BLE001 - a model that only runs in fp32 (a dtype check, an op)
            if where is None and is_out_of_memory(exc):
                continue                          # the float64 copy on the CPU instead
            return None, f"the model did not run in float64: {type(exc).__name__}: {exc}"[:300]
        finally:
            model64 = None
            empty_cache()
    return None, "the float64 copy did not fit the device or the host"


def _common_batch(inputs) -> int | None:
    """The leading size every tensor input shares (None where they do not)."""
    import torch

    sizes = {x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


def _cat_rows(parts):
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat_rows([p[i] for p in parts]) for i in range(len(first)))
    raise TypeError(f"cannot join a batch-separable model's outputs of type {type(first).__name__}")


def _errors(out, ref) -> tuple[float, float]:
    """Largest absolute error and ||out - ref|| / ||ref||, in float64, a chunk at a time on
    the output's device."""
    import torch

    from kforge.verify.contract import chunks
    max_abs, num, den = 0.0, 0.0, 0.0
    for o, r in _pairs(out, ref):
        if not torch.isfinite(o).all():
            return float("inf"), float("inf")
        for _, oc, rc in chunks(o, r, device=o.device):
            d = oc - rc
            max_abs = max(max_abs, d.abs().max().item()) if d.numel() else max_abs
            num += d.pow(2).sum().item()
            den += rc.pow(2).sum().item()
    return max_abs, (num ** 0.5) / max(den ** 0.5, 1e-30)


def _within(out, ref, atol, rtol, scaled: bool) -> bool:
    """Every element within atol + rtol * |ref|; with `scaled`, atol is multiplied by
    max(1, RMS(ref)) as kforge.verify does, so outputs of large magnitude (row sums,
    logsumexp) get an absolute tolerance relative to their size. NaN / Inf never pass.
    A chunk at a time on the output's device."""
    import torch

    from kforge.verify.contract import chunks
    from kforge.verify.verifier import rms_scale
    for o, r in _pairs(out, ref):
        if not torch.isfinite(o).all():
            return False
        scale = rms_scale(r, o.device) if scaled else 1.0
        for _, oc, rc in chunks(o, r, device=o.device):
            if not ((oc - rc).abs() <= atol * scale + rtol * rc.abs()).all():
                return False
    return True


def _rows_outside(out, ref, atol, rtol) -> tuple[int, int]:
    """(rows with an element outside the scaled rule, rows), a row being an output's last
    dimension (a token's logits): a mismatch confined to a few rows (an MoE router that picked
    other experts for a token at a near-tie) reads apart from one spread over all of them
    (rounding). kforge.modelcheck.margin, a block of rows at a time on the output's device."""
    from kforge.modelcheck import margin
    m = margin(out, ref, atol, rtol)
    return m.rows_outside, m.rows


def _outside_text(chk) -> str:
    if not chk.rows:
        return ""
    return f"; {chk.rows_outside} of {chk.rows} rows outside"


def _mark_outside(res, chk, atol: float, rtol: float, against: str = "eager fp32",
                  more: str = "") -> None:
    """A result outside the tolerance: why (its reason) and how many rows (its info)."""
    res.reason = (f"outside atol={atol:g} x max(1, RMS(ref)), rtol={rtol:g} vs {against} "
                  f"(max abs err {chk.max_abs:.3g}, rel L2 err {chk.max_rel:.3g}"
                  f"{_outside_text(chk)}){more}")
    if chk.rows:
        res.info["rows_outside"] = [chk.rows_outside, chk.rows]


def _package_info(c) -> None:
    """A loaded package's regions on kernels (the report's `kernels` column) and the regions
    `kforge tune --check` moved, into its contender's info."""
    kernels, regions = getattr(c.fn, "kernels", None), getattr(c.fn, "regions", None)
    if kernels is not None and regions is not None:   # kforge.runtime.CompiledModel
        c.info["regions_total"], c.info["regions_on_kernels"] = len(regions), len(kernels)
        manifest = getattr(getattr(c.fn, "package", None), "manifest", None) or {}
        moved = {"finer": len(manifest.get("finer_schemes") or {}),
                 "strict": len(manifest.get("strict_regions") or {}),
                 "split": len(manifest.get("site_regions") or {})}
        if any(moved.values()):      # by `kforge tune --check` (kforge.modelcheck)
            c.info["moved_by_check"] = moved


class Runner:
    def __init__(self, config: BenchConfig, timer, peaks: roofline.Peaks, log=print):
        self.config, self.timer, self.peaks, self.log = config, timer, peaks, log
        from kforge.targets import get_target
        self.target = get_target(config.target)
        self.device = self.target.device          # the torch device the workloads run on
        self._current: str | None = None
        self._partial: "WorkloadResult | None" = None   # the workload being measured
        self._on_partial = None                          # its checkpoint (run's on_result)
        self._t0 = time.perf_counter()                   # when its routes started

    def run(self, workloads: list[Workload], on_result=None) -> list[WorkloadResult]:
        """Run each workload; `on_result(results so far)` is called after every one, and after
        every route of the one running (its result then "partial": what was measured so far,
        so that a run stopped by a time limit keeps it)."""
        results = []
        self._on_partial = (None if on_result is None else
                            lambda partial: on_result(results + [partial]))
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
            self._partial = None
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
        self.target.empty_cache()

    def _float64_references(self, model, checks):
        """The outputs of a float64 copy of the model on every check's inputs (float inputs
        widened), for the strict contract; a reason (str) where the model cannot run so
        (`float64_runs`)."""
        out, why = float64_runs(model, [fresh for fresh, _ in checks], self.target.empty_cache)
        return why if out is None else out

    def _fresh_references(self, wl: Workload, model):
        import torch

        checks = []
        for seed in CHECK_SEEDS:
            fresh = wl.inputs(self.config.scale, self.device, seed)
            with torch.no_grad():
                checks.append((fresh, _host(model(*fresh))))
        return checks

    def _check(self, fn, checks, atol=None, rtol=None, f64=None) -> "_CheckResult":
        """fn on every check's inputs against eager fp32: the policy's rule (atol scaled by
        max(1, RMS(ref)), as the verifier does), torch.allclose unscaled, the errors; with
        `f64` (the float64 model's outputs per check), the strict contract as well."""
        import torch

        res = _CheckResult()
        for i, (fresh, ref) in enumerate(checks):
            with torch.no_grad():
                out = fn(*fresh)
            a, r = _errors(out, ref)
            res.max_abs, res.max_rel = max(res.max_abs, a), max(res.max_rel, r)
            if atol is not None:
                within = _within(out, ref, atol, rtol, scaled=True)
                res.ok = res.ok and within
                res.allclose = res.allclose and _within(out, ref, atol, rtol, scaled=False)
                if not within and res.max_abs != float("inf"):
                    bad, rows = _rows_outside(out, ref, atol, rtol)
                    res.rows_outside, res.rows = res.rows_outside + bad, res.rows + rows
            if f64 is not None:
                res.add_contract(out, ref, f64[i])
            del out
        return res

    def _arbitrate(self, fn, model, checks, f64, atol, rtol) -> tuple[int, int, list]:
        """(rows outside against both eager fp32 and the float64 model, rows, notes) of fn over
        every check (kforge.modelcheck.arbitrate): where eager fp32 is itself off (an MoE
        router's near-tie that fp32 rounding decides the wrong way), the float64 answer
        arbitrates. Where a check is outside against both and fn is a package (`run`), its
        topk choices are compared with the float64 model's (kforge.ties): where every differing
        choice is a near-tie and the package is within against the float64 model that
        followed them, that check's rows count as within (notes: what was followed)."""
        import types

        import torch

        from kforge.modelcheck import arbitrate
        from kforge.ties import Recorder
        bad = rows = 0
        notes = []
        rule = types.SimpleNamespace(atol=atol, rtol=rtol)
        package = callable(getattr(fn, "run", None))
        for (fresh, ref), ref64 in zip(checks, f64):
            # a package runs without its CUDA graph, so that its selections are recorded
            selections = Recorder()
            with torch.no_grad(), selections:
                out = fn.run(list(fresh), graphs=False) if package else fn(*fresh)
            a = arbitrate(out, ref, ref64, model, fresh, rule,
                          selections.calls if package else None)
            if a.ties is not None or a.ties_note:
                notes.append((a.ties.text() if a.ties is not None else "")
                             + (a.ties_note and f" ({a.ties_note})"))
            del out
            bad += 0 if a.ok else a.arbitrated.rows_outside
            rows += a.arbitrated.rows
        return bad, rows, notes

    def _contract_by_ties(self, fn, model, checks, f64) -> tuple["_CheckResult", list]:
        """strict, where a package fails the contract: the contract again with the float64
        model following the package's topk choices where they are near-ties (kforge.ties),
        eager fp32's own error still measured against the float64 model's own choices. A check
        where some choice is farther off keeps the float64 model's choices. (the contract,
        notes: the selections per check that had differing ones)"""
        import torch

        from kforge.ties import Recorder, follow_ties
        res, notes = _CheckResult(), []
        for (fresh, ref), ref64 in zip(checks, f64):
            rec = Recorder()             # no CUDA graph, so that the selections are recorded
            with torch.no_grad(), rec:
                out = fn.run(list(fresh), graphs=False)
            against = None
            if rec.calls:
                f = follow_ties(out, rec.calls, model, fresh, self.target.empty_cache)
                if f.counts.rows_differ:
                    notes.append(f.counts.text() + (f" ({f.note})" if f.note else ""))
                if f.outputs is not None and f.counts.ties and not f.counts.errors:
                    against = f.outputs
                del f
            res.add_contract(out, ref, ref64, against=against)
            del out
        return res, notes

    def _time(self, fn, inputs) -> Timing:
        import torch

        def call():
            with torch.no_grad():
                return fn(*inputs)
        return self.timer.measure(call)

    def run_one(self, wl: Workload) -> WorkloadResult:
        # fp32 means fp32: TF32 off for matmuls and for cuDNN (PyTorch's default turns it on
        # for convolutions) around the references, the fp32 baselines and KForge itself; the
        # tf32 routes switch it on for their own calls only.
        with routes.numerics("fp32", self.device):
            return self._run_one(wl)

    def _run_one(self, wl: Workload) -> WorkloadResult:
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
        res.status, self._partial = "partial", res
        self._t0 = time.perf_counter()

        # Baselines: the model as written, fp32 with TF32 off: strict's matched routes.
        atol, rtol = backends.TOLERANCE["strict"]
        for r in routes.matched_routes("strict"):
            self._route(r, model, inputs, checks, atol, rtol, res.baselines, cold=True)
        best = _fastest(res.baselines)
        if best:
            res.best_baseline, res.best_baseline_ms = best.name, best.timing.median_ms
            res.baseline_fp32_floor_ms = roofline.floor_ms(res.flops, res.bytes_fp32, self.peaks, "fp32")
            res.baseline_roofline_fraction = res.baseline_fp32_floor_ms / best.timing.median_ms

        res.tokens_per_call = wl.tokens_per_call(cfg.scale, mod)
        for policy in cfg.precisions:
            pr = self._kforge(wl, model, inputs, checks, policy, res)
            # the package's CUDA graphs, prepared weights and float64 copy go before the next
            # route runs (a CompiledModel and its graphs reference each other: gc, not refcount;
            # on the H200 gpt-oss prefill's strict package held 23 GiB of graph pool and the
            # bf16 package then ran out of memory)
            self._cleanup()
            res.policies.append(pr)
            self._progress(pr.kforge)
            if policy == "bf16" and cfg.packages is not None \
                    and (cfg.packages / "bf16-model" / wl.name).is_dir():
                self._bf16_model(wl, model, inputs, checks, pr, res)   # logs its own line
                self._cleanup()
            self._matched(pr, model, inputs, checks, res)
            _set_tokens_per_s(res)
            self.log("    " + _one_line(pr, res))
            self._progress()            # the headline
        res.status = "ok"
        return res

    def _progress(self, done: "ContenderResult | None" = None) -> None:
        """After each route: a line saying what it measured and when, and the checkpoint of
        the workload measured so far."""
        if done is not None:
            at = time.perf_counter() - self._t0
            ms = f"{done.timing.median_ms:.3f} ms" if done.timing else "not timed"
            extra = f", compile {done.compile_s:.0f} s" if done.compile_s else ""
            why = f" ({done.reason[:120]})" if done.status != "ok" and done.reason else ""
            self.log(f"    [{at:5.0f} s] {done.name}: {ms}, {done.status}{extra}{why}")
        if self._partial is not None and self._on_partial is not None:
            self._on_partial(self._partial)

    def _route_once(self, route: routes.Route, model, inputs, checks, atol, rtol,
                    cold: bool = False) -> ContenderResult:
        """Build, check and time one route (kforge.bench.routes). A route outside the policy's
        tolerance is timed but is "mismatch": it is not a route that gives the user's result."""
        import torch

        cfg = self.config
        info = {"route": route.describe(), "policy": route.policy}
        if route.kind not in cfg.baselines:
            return ContenderResult(route.name, "skipped", reason="not requested (--baselines)",
                                   info=info)
        try:
            prepared = routes.prepare_model(route, model)
            timed_inputs = routes.cast_inputs(route, inputs)
            compile_s = 0.0
            if route.compiled:
                torch._dynamo.reset()        # compile afresh under this route's numerics
                with routes.numerics(route.numerics, self.device):
                    c = backends.torch_compile(prepared, timed_inputs, cfg.target,
                                               route.compile_mode or cfg.compile_mode)
                fn, compile_s = c.fn, c.compile_s
                info.update(c.info)
                record = self._cold_compile_record() if cold else {}
                if record.get("status") == "ok":      # caches were warmed by the parallel pre-pass
                    info.update(compile_s_warm=compile_s, compile_s_source="cold, parallel pre-pass")
                    compile_s = float(record["compile_s"])
            else:
                fn = prepared
            call = routes.RouteFn(route, fn, self.device)
            chk = self._check(call, checks, atol, rtol)
            timing = self.timer.measure(_no_grad(call.timed(timed_inputs)))
        except backends.ContenderUnavailable as exc:
            return ContenderResult(route.name, exc.status, reason=str(exc), info=info)
        except Exception as exc:
            return ContenderResult(route.name, "failed", reason=f"{type(exc).__name__}: {exc}"[:500],
                                   info=info)
        out = ContenderResult(route.name, "ok" if chk.ok else "mismatch", timing=timing,
                              compile_s=compile_s, max_abs_err=chk.max_abs,
                              max_rel_err=chk.max_rel, info=info, allclose=chk.allclose)
        if not chk.ok:
            _mark_outside(out, chk, atol, rtol)
        return out

    def _route(self, route, model, inputs, checks, atol, rtol, into: list,
               cold: bool = False) -> None:
        """One route's result, appended to `into` (the workload's result being built), then
        logged and checkpointed."""
        out = self._route_once(route, model, inputs, checks, atol, rtol, cold)
        into.append(out)
        if out.status != "skipped":
            self._progress(out)

    def _matched(self, pr: PolicyResult, model, inputs, checks, res: WorkloadResult) -> None:
        """The policy's matched routes and the headline: the speedup over the faster correct
        one. strict's routes are the fp32 baselines (measured once, listed again here)."""
        import copy

        if pr.precision == "strict":
            pr.routes = [copy.deepcopy(b) for b in res.baselines]
        elif self.config.baseline_precision == "matched":
            pr.routes = []
            for r in routes.matched_routes(pr.precision):
                self._route(r, model, inputs, checks, pr.atol, pr.rtol, pr.routes)
            self._cleanup()
        best = routes.headline(pr.routes)
        if best is None and pr.routes and any(r.status == "mismatch" for r in pr.routes):
            # every matched route that ran was outside the tolerance: the user's correct
            # choice at this tolerance is then fp32 (eager fp32 is the reference)
            best = routes.headline(res.baselines)
            pr.matched_fallback = "no matched route within the tolerance: the fp32 baselines"
        if best:
            pr.matched_best, pr.matched_best_ms = best.name, best.timing.median_ms
            if pr.speedup is not None:
                pr.speedup_matched = best.timing.median_ms / pr.kforge.timing.median_ms

    def _bf16_model(self, wl, model, inputs, checks, pr: PolicyResult, res) -> None:
        """KForge on the model cast to bf16 (PACKAGES/bf16-model/<workload>, built by
        kforge.bench.packages): the route of a user who accepts bf16, compiled by KForge. bf16
        in and out, as PyTorch's bf16 routes are, and checked and timed as they are (inputs
        cast beforehand). Where it is correct and faster than the bf16 package of the fp32
        model, it is KForge's bf16 result (`pr.kforge`); the other goes to `kforge_variants`."""
        cfg = self.config
        # named as the other bf16 package is (the report's columns); `info["model"]` tells them apart
        route = routes.Route("kforge[bf16]", "bf16", False, "fp32", cast="bf16")
        pr.kforge_model = pr.kforge_model or "fp32"
        try:
            prepared = routes.prepare_model(route, model)
            timed_inputs = routes.cast_inputs(route, inputs)
            c = backends.kforge_loaded(cfg.packages / "bf16-model" / wl.name, prepared,
                                       cfg.target, "bf16", cfg.tune)
            _package_info(c)
        except backends.ContenderUnavailable as exc:
            kr = ContenderResult(route.name, exc.status, reason=str(exc))
            pr.kforge_variants.append(kr)
            self._progress(kr)
            return
        kr = ContenderResult(route.name, "ok", compile_s=c.compile_s,
                             info={**c.info, "model": "bf16",
                                   "route": "KForge's package of the model cast to bf16 "
                                   "(model.bfloat16()), inputs cast to bf16"})
        try:
            out = self._first_call(c.fn, timed_inputs, kr)
            min_bytes = roofline.min_bytes(prepared, timed_inputs, out, "bf16")
            del out
            chk = self._check(routes.RouteFn(route, c.fn, self.device), checks, pr.atol, pr.rtol)
            kr.max_abs_err, kr.max_rel_err, kr.allclose = chk.max_abs, chk.max_rel, chk.allclose
            if not chk.ok:
                kr.status = "mismatch"
                _mark_outside(kr, chk, pr.atol, pr.rtol)
            kr.timing = self._time(c.fn, timed_inputs)
            kr.info["run_as"] = _run_as(c.fn)
            kr.info["where"] = _where(c.fn, timed_inputs)
            floor = roofline.floor_ms(res.flops, min_bytes, self.peaks, "bf16")
            kr.info.update(min_bytes=min_bytes, floor_ms=floor,
                           roofline_fraction=floor / kr.timing.median_ms)
        except Exception as exc:
            kr.status, kr.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
        self._progress(kr)
        cur = pr.kforge
        cur.info.setdefault("model", "fp32")
        cur.info.setdefault("min_bytes", pr.min_bytes)
        if kr.status == "ok" and (cur.status != "ok" or cur.timing is None
                                  or kr.timing.median_ms < cur.timing.median_ms):
            pr.kforge_variants.append(cur)
            pr.kforge, pr.kforge_model = kr, "bf16"
            pr.min_bytes, pr.floor_ms = kr.info["min_bytes"], kr.info["floor_ms"]
            pr.roofline_fraction = kr.info["roofline_fraction"]
            pr.speedup = (res.best_baseline_ms / kr.timing.median_ms
                          if res.best_baseline_ms else None)
        else:
            pr.kforge_variants.append(kr)

    def _first_call(self, fn, inputs, kr: ContenderResult):
        """A package's first call JIT-compiles its Triton kernels on this device: compile time,
        as torch.compile's first call is (kr.info["first_call_s"], added to kr.compile_s).
        Returns its outputs."""
        import torch
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(*inputs)
        self.target.synchronize()
        kr.info["first_call_s"] = time.perf_counter() - t0
        kr.compile_s = (kr.compile_s or 0.0) + kr.info["first_call_s"]
        return out

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
        _package_info(c)
        kr = ContenderResult(c.name, "ok", compile_s=c.compile_s, info=c.info)
        pr.kforge = kr
        try:
            self._first_call(c.fn, inputs, kr)
            f64 = self._float64_references(model, checks) if policy == "strict" else None
            chk = self._check(c.fn, checks, atol, rtol,
                              f64=f64 if isinstance(f64, list) else None)
            ok, kr.max_abs_err, kr.max_rel_err = chk.ok, chk.max_abs, chk.max_rel
            kr.allclose = kr.info["within_unscaled_atol"] = chk.allclose
            if policy == "strict":
                pr.strict_contract = chk.contract_json() if isinstance(f64, list) else \
                    {"status": "unavailable", "reason": f64}
                if chk.contract_ok is False and callable(getattr(c.fn, "run", None)):
                    # a router's topk the package decided the other way at a near-tie?
                    by_ties, notes = self._contract_by_ties(c.fn, model, checks, f64)
                    if notes:
                        pr.strict_contract = dict(by_ties.contract_json(),
                                                  near_tie_rule=notes,
                                                  without_it=pr.strict_contract)
                        self.log(f"    strict kforge: the strict contract with the float64 "
                                 f"model following the package's near-tie choices: "
                                 f"{pr.strict_contract['status']} ({'; '.join(notes)})")
            if not ok and chk.rows and chk.max_abs != float("inf"):
                # rows outside against eager fp32: a float64 copy of the model arbitrates
                if f64 is None:
                    f64 = self._float64_references(model, checks)
                if isinstance(f64, list):
                    both, rows, ties = self._arbitrate(c.fn, model, checks, f64, atol, rtol)
                    kr.info["float64_arbiter"] = {"rows_outside_eager": chk.rows_outside,
                                                  "rows_outside_both": both, "rows": rows}
                    if ties:
                        kr.info["float64_arbiter"]["selections"] = ties
                    if both == 0:
                        ok = True
                        self.log(f"    {policy} kforge: {chk.rows_outside} of {chk.rows} rows "
                                 "outside against eager fp32 are within against the float64 "
                                 "model (eager fp32 itself is off there, or the package chose "
                                 "differently at a near-tie and is within against the float64 "
                                 "model that followed it): ok by float64's arbitration"
                                 + (f"; selections: {'; '.join(ties)}" if ties else ""))
            del f64
            if not ok:
                kr.status = "mismatch"
                _mark_outside(kr, chk, atol, rtol, "eager on fresh inputs",
                              "; each kernel passed its own region's check: `kforge tune PKG "
                              "--check` takes the regions that carry the error to finer "
                              "schemes or strict (CHECK=1 in the device scripts)")
            kr.timing = self._time(c.fn, inputs)
            kr.info["run_as"] = _run_as(c.fn)
        except Exception as exc:
            kr.status, kr.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
            return pr
        pr.roofline_fraction = pr.floor_ms / kr.timing.median_ms
        if kr.status == "ok" and res.best_baseline_ms:
            pr.speedup = res.best_baseline_ms / kr.timing.median_ms
        if "regions_total" in c.info:        # a package's CompiledModel (_package_info)
            kr.info["where"] = _where(c.fn, inputs)
        return pr


def _run_as(compiled) -> dict:
    """How the timed package ran: CUDA-graph replays, or step by step and why (kforge.graphs
    decides per input signature); {"graphs": None} where the runtime has no graphs (not CUDA,
    or KFORGE_CUDA_GRAPHS=0)."""
    graphs = getattr(compiled, "graphs", None)
    if graphs is None or not hasattr(graphs, "run_as"):
        return {"graphs": None}
    return graphs.run_as()


def _where(compiled, inputs) -> dict:
    """Where a package's time goes: the host plan's ops and FLOPs by home (verified kernel,
    PyTorch: aten program or reference, fallback op, host step) and the share of one run's
    time in each, timed step by step with a synchronization around every step (no CUDA
    graph: shares of a slower run than the timed one). Failure is recorded, not raised."""
    from kforge.coverage import merge_profile, plan_coverage, profile_plan
    try:
        cov = plan_coverage(compiled.package.plan, compiled.package.specs, set(compiled.kernels))
        prof = profile_plan(compiled, inputs, repeats=2)
        out = merge_profile(cov, prof)
        out["stepwise_ms"] = round(1e3 * prof["total_s"], 3)
        out["method"] = ("one run, a synchronization around every host-plan step, no CUDA "
                         "graph (kforge.coverage.profile_plan)")
        return out
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _set_tokens_per_s(res: WorkloadResult) -> None:
    """tokens/s of every timed contender, for workloads that count tokens."""
    if not res.tokens_per_call:
        return
    contenders = list(res.baselines)
    for p in res.policies:
        contenders += [p.kforge, *p.routes]
    for c in contenders:
        if c.timing is not None and c.timing.median_ms:
            c.tokens_per_s = res.tokens_per_call / (c.timing.median_ms / 1e3)


def _fastest(results: list[ContenderResult]) -> ContenderResult | None:
    """The faster correct one (status ok and timed)."""
    return routes.headline(results)


def _no_grad(call):
    def run():
        import torch
        with torch.no_grad():
            return call()
    return run


@dataclass
class _CheckResult:
    ok: bool = True
    allclose: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    # strict contract, over all checks and outputs: eager fp32's and the contender's largest
    # error against float64, and elements over the bound
    fp32_err: float = 0.0
    err_vs_f64: float = 0.0
    # over the checks that failed the rule: rows (last dimension) with an element outside it
    rows_outside: int = 0
    rows: int = 0
    over_bound: int = 0
    contract_ok: bool | None = None

    def add_contract(self, out, ref32, ref64, against=None) -> None:
        """The strict contract on one check: eager fp32's error against the float64 model
        (`ref64`) bounds `out`'s against `against` (default `ref64`; the near-tie rule passes
        the float64 model that followed the package's choices)."""
        from kforge.verify import contract

        def seq(x):
            return x if isinstance(x, (tuple, list)) else [x]
        outs, r32s, r64s = seq(out), seq(ref32), seq(ref64)
        tos = seq(against) if against is not None else r64s
        for o, r32, r64, to in zip(outs, r32s, r64s, tos):
            if not r64.is_floating_point():
                continue
            e32 = contract.fp32_error(r32, r64, device=o.device)
            c = contract.check(o, to, e32, dtype=r32.dtype, device=o.device)
            self.fp32_err = max(self.fp32_err, e32)
            self.err_vs_f64 = max(self.err_vs_f64, c.max_err)
            self.over_bound += c.bad
            self.contract_ok = bool((self.contract_ok is not False) and c.ok)

    def contract_json(self) -> dict:
        from kforge.verify import contract

        return {"status": "pass" if self.contract_ok else "fail",
                "passes": bool(self.contract_ok),
                "eager_fp32_max_err_vs_f64": self.fp32_err,
                "kforge_max_err_vs_f64": self.err_vs_f64,
                "ratio": (self.err_vs_f64 / self.fp32_err) if self.fp32_err > 0 else None,
                "elements_over_bound": self.over_bound,
                "rule": f"|kforge - f64| <= max({contract.FACTOR:g} x max|eager fp32 - f64|, "
                        f"{contract.ULP_FLOOR:g} eps |f64|) per element ({contract.SMALL_FACTOR:g}"
                        f" x for a result under {contract.SMALL_RESULT} elements)"}


def _one_line(pr: PolicyResult, res: WorkloadResult) -> str:
    k = pr.kforge
    base = f"{res.best_baseline} {res.best_baseline_ms:.3f} ms" if res.best_baseline_ms else "no baseline"
    if k.timing is None:
        return f"{pr.precision:6s} kforge {k.status}: {k.reason}  ({base})"
    sp = f"{pr.speedup:.2f}x" if pr.speedup else "n/a"
    matched = (f"; {pr.speedup_matched:.2f}x vs {pr.matched_best} {pr.matched_best_ms:.3f} ms"
               if pr.speedup_matched and pr.precision != "strict" else
               "; no correct matched route" if pr.routes and not pr.matched_best else "")
    contract = ""
    if pr.strict_contract and "passes" in pr.strict_contract:
        contract = f"; strict contract {pr.strict_contract['status']}"
    return (f"{pr.precision:6s} kforge {k.timing.median_ms:.3f} ms [{k.status}] vs {base}: {sp}, "
            f"{100 * pr.roofline_fraction:.0f}% of floor{matched}{contract}")
