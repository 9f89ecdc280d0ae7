"""The whole-model check: a package's outputs against the eager PyTorch model, under the
package's policy, and what to do when they are outside it (`kforge tune --check`; `kforge run
--check` and the bench's row count use its rule, margin).

Each region's kernel is verified on its own against the policy's tolerance. A deep model
chains many of them, and their errors add up: on Llama-3-8B's bf16 prefill every region passed
and the logits still ended outside 1e-2 on a few rows
(benchmarks/results/2026-12-05g-h100-llama-prefill-attention/). This module measures that
whole-model error on the model file's inputs, finds which regions carry it, and raises them to
strict one at a time until the model is within the policy:

* check_model: the package against its eager model on the same device, with the policy's rule
  (atol x max(1, RMS(ref)) + rtol x |ref|), the worst element's error over its allowance and the
  rows (an output's last dimension: a token's logits) outside it;
* attribution: the same with one region at a time on its fp32 reference instead of its kernel,
  which says how much of the error that region carries;
* per call: a region called more than once (once per layer) is also measured with one call
  at a time on its reference; where one call carries the error, fit_model splits it off as a
  region of its own (kforge.package.split_site, the manifest's "site_regions") and moves only
  that call (choose_step says which move);
* fit_model: greedy: the move (a region, or one call) that choose_step picks goes one rung up:
  to the next finer precision scheme of its own policy where one short of fp32-grade exists
  (a bf16 attention's fp16x1 -> fp16x3; the manifest's "finer_schemes", kforge.selection),
  else to strict (the manifest's "strict_regions", read by
  kforge.selection.region_precision); its new kernel is verified by `kforge tune`, and the
  model checked again.

Where the model is outside against eager fp32, a float64 copy of the model arbitrates
(`arbitrated`: a row is outside only where it is outside against both); where it is outside
against both, the package's topk choices are compared with the float64 model's, which follows
them at near-ties (kforge.ties). A model within by either rule is within the policy, and
nothing moves. `arbitrate` is that rule for every caller (tune --check, run --check, the bench).
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from kforge.errors import UserError


@dataclass
class Margin:
    """How far outputs are from a reference under a policy's rule."""
    worst: float                    # the worst element's error over its allowance (<= 1 passes)
    rows_outside: int               # rows (last dimension) with an element outside
    rows: int
    max_abs: float

    @property
    def ok(self) -> bool:
        return self.worst <= 1.0

    def text(self) -> str:
        return (f"worst element at {self.worst:.3g} of its allowance, max abs err "
                f"{self.max_abs:.3g}, {self.rows_outside} of {self.rows} rows outside")


def margin(out, ref, atol: float, rtol: float, elements: int = 1 << 25) -> Margin:
    """`out` against `ref` (tensors or sequences of them) under |out - ref| <= atol x max(1,
    RMS(ref)) + rtol x |ref| (the verifier's rule: the RMS of the reference's finite
    elements); a block of rows at a time in float64 on `out`'s device (a real LLM's logits are
    GBs). A non-finite element counts as outside."""
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    refs = list(ref) if isinstance(ref, (list, tuple)) else [ref]
    if len(outs) != len(refs):
        raise UserError(f"the package returns {len(outs)} outputs, eager PyTorch {len(refs)}")
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            raise UserError(f"output shape {list(o.shape)} differs from eager's {list(r.shape)}")
    ratios, errs = row_ratios(outs, refs, atol, rtol, elements)
    if not ratios.numel():
        return Margin(0.0, 0, 0, 0.0)
    return Margin(float(ratios.max()), int((ratios > 1).sum()), int(ratios.numel()),
                  float(errs.max()))


def row_ratios(out, ref, atol: float, rtol: float,
                elements: int = 1 << 25) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's worst element error over its allowance (margin's rule) and its largest
    absolute error, float64 on the CPU, over the outputs' rows in order."""
    from kforge.verify.verifier import rms_scale
    ratios, errs = [], []
    for o, r in zip(_outputs(out), _outputs(ref)):
        if not o.is_floating_point() or o.dim() == 0 or not o.numel():
            continue
        dev = o.device
        width = max(1, o.shape[-1])
        o2, r2 = o.reshape(-1, width), r.reshape(-1, width)
        step = max(1, elements // width)
        scale = rms_scale(r, dev)
        for i in range(0, o2.shape[0], step):
            oc = o2[i:i + step].to(dev, torch.float64)
            rc = r2[i:i + step].to(dev, torch.float64)
            d = torch.nan_to_num((oc - rc).abs(), nan=float("inf"))
            ratios.append(torch.nan_to_num(d / (atol * scale + rtol * rc.abs()),
                                           nan=float("inf")).max(dim=1).values.cpu())
            errs.append(d.max(dim=1).values.cpu())
    empty = torch.zeros(0, dtype=torch.float64)
    return (torch.cat(ratios) if ratios else empty), (torch.cat(errs) if errs else empty)


def arbitrated(out, ref, ref64, atol: float, rtol: float) -> Margin:
    """`out` against eager fp32 (`ref`) with a float64 copy of the model (`ref64`) as arbiter:
    a row counts as outside only where it is outside the rule against both. Where eager fp32
    itself is off (an MoE router's near-tie that fp32 rounding decides the wrong way), the
    float64 answer, not eager's, is the one to be near."""
    e, e_abs = row_ratios(out, ref, atol, rtol)
    f, f_abs = row_ratios(out, ref64, atol, rtol)
    both = torch.minimum(e, f)
    if not both.numel():
        return Margin(0.0, 0, 0, 0.0)
    return Margin(float(both.max()), int((both > 1).sum()), int(both.numel()),
                  float(torch.minimum(e_abs, f_abs).max()))


@dataclass
class Arbitration:
    """Where a package is outside its policy against eager fp32: the float64 model's verdict
    (arbitrate)."""
    arbitrated: Margin | None = None    # rows outside against both (None: no float64 copy)
    note: str = ""                      # why there is no float64 copy
    # where it is outside against both: its topk choices against the float64 model's
    # (kforge.ties.TieCounts), and the package against the float64 model that followed its
    # choices at near-ties (None where any choice was farther apart, or none differed)
    ties: object = None
    followed: Margin | None = None
    ties_note: str = ""

    @property
    def ok(self) -> bool:
        return (self.arbitrated is not None and self.arbitrated.ok) or \
            (self.followed is not None and self.followed.ok)

    @property
    def by_ties(self) -> bool:
        """Within only by following the package's choices at near-ties."""
        return self.ok and not self.arbitrated.ok

    def lines(self) -> list[str]:
        if self.arbitrated is None:
            return [f"no float64 arbiter: {self.note}"]
        a = self.arbitrated
        out = [f"with a float64 copy of the model as arbiter: {a.rows_outside} of {a.rows} "
               f"rows outside against both it and eager fp32 (worst {a.worst:.3g}): "
               + ("within the policy by float64's arbitration: the rows outside against eager "
                  "fp32 are within against float64, where eager fp32 itself is off (an MoE "
                  "router's near-tie that fp32 rounding decides the wrong way)" if a.ok else
                  "outside against both")]
        if self.ties is not None:
            out.append(f"selections: {self.ties.text()}")
        if self.ties_note:
            out.append(f"selections not followed: {self.ties_note}")
        if self.followed is not None:
            out.append("against the float64 model following the package's choices at "
                       f"near-ties: {self.followed.text()}: "
                       + ("within the policy by the near-tie rule: the rows outside are the "
                          "consequence of choices exact arithmetic cannot tell apart"
                          if self.followed.ok else "OUTSIDE the policy"))
        return out


@dataclass
class ModelCheck:
    """A package's whole-model check (check_model)."""
    policy: str
    margin: Margin
    # region hash -> the margin with that region on its fp32 reference (attribution)
    without: dict[str, Margin] = field(default_factory=dict)
    # (region hash, k) -> the margin with only the region's k-th call on its fp32 reference
    # (regions called more than once: one per layer)
    at_call: dict[tuple[str, int], Margin] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)       # region hash -> its calls
    kinds: dict[str, str] = field(default_factory=dict)
    # where no single region's exact result brings the model within the policy: the margin with
    # every region not strict on its fp32 reference and the strict kernels kept (the best
    # raising them all could give), and, where that is still outside, with every region on its
    # reference (the frontend's graph alone)
    all_raised: Margin | None = None
    all_exact: Margin | None = None
    # where the model is outside against eager fp32: against a float64 copy of the model and
    # eager fp32's own distance from it, and the float64 model's verdict (arbitrate)
    float64: Margin | None = None
    eager_float64: Margin | None = None
    arbiter: Arbitration | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.margin.ok or (self.arbiter is not None and self.arbiter.ok)

    @property
    def by_ties(self) -> bool:
        """Within the policy only by following the package's choices at near-ties."""
        return not self.margin.ok and self.arbiter is not None and self.arbiter.by_ties

    def lines(self) -> list[str]:
        verdict = "within the policy" if self.margin.ok else \
            "within the policy by the near-tie rule" if self.by_ties else \
            "within the policy by float64's arbitration" if self.ok else "OUTSIDE the policy"
        out = [f"whole model against eager PyTorch ({self.policy}): {verdict}: "
               f"{self.margin.text()} ({self.seconds:.1f} s)"]
        if self.float64 is not None:
            out.append(f"  against a float64 copy of the model: {self.float64.text()}; eager "
                       f"fp32 itself against it: {self.eager_float64.text()}")
        if self.arbiter is not None:
            out += ["  " + line for line in self.arbiter.lines()]
        if self.all_raised is not None:
            out.append("  with every region not strict on its fp32 reference: "
                       f"{self.all_raised.text()}")
        if self.all_exact is not None:
            out.append(f"  with every region on its fp32 reference: {self.all_exact.text()}")
        if self.without:
            out.append("  with one region on its fp32 reference instead of its kernel:")
            for h, m in sorted(self.without.items(), key=lambda kv: kv[1].worst):
                n = self.calls.get(h, 1)
                out.append(f"    {h} {self.kinds.get(h, ''):12s} worst {m.worst:.3g}, "
                           f"{m.rows_outside} rows outside"
                           + (f" (all {n} calls)" if n > 1 else ""))
                for (g, k), mk in sorted(self.at_call.items()):
                    if g == h:
                        out.append(f"      call {k + 1} of {n} alone: worst {mk.worst:.3g}, "
                                   f"{mk.rows_outside} rows outside")
        return out


def bound_model(package, target: str):
    """(eager module on the device, the package's weights bound to it, inputs on the device)
    from the package's model file: the package's own weights where it has them, else the
    module's (a package carried without weights)."""
    from kforge.modelfile import load_model_file
    from kforge.runtime import default_device, load_package_weights, module_weights
    path = package.model_path()
    if path is None:
        raise UserError(f"{package.root}: the whole-model check needs the model source; the "
                        "package has no model.py and its origin is gone")
    module, inputs = load_model_file(path, with_model=True)
    device = torch.device(default_device(target))
    weights_file = package.weights_path()
    if weights_file is not None and weights_file.is_file():
        load_package_weights(module, package, path)
    module = module.to(device)
    return module, module_weights(module, package, device), [t.to(device) for t in inputs]


def _outputs(x) -> list[torch.Tensor]:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _empty() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def float64_outputs(module, inputs) -> tuple[list[torch.Tensor] | None, str]:
    """(the outputs of a float64 copy of `module` on `inputs` widened, in host memory; "") or
    (None, why not): kforge.bench.runner.float64_runs on one input set, as the strict
    contract's float64 copy."""
    from kforge.bench.runner import float64_runs

    out, why = float64_runs(module, [inputs], _empty)
    return (None, why) if out is None else (_outputs(out[0]), "")


def arbitrate(out, ref, ref64, module, inputs, policy, calls=None,
              say: Callable[[str], None] | None = None) -> Arbitration:
    """The package's outputs `out`, outside the policy against eager fp32 (`ref`), judged with a
    float64 copy of the model: `ref64` (its outputs, or a text saying why there are none)
    arbitrates row by row (`arbitrated`). Where rows are outside against both and the
    package's run recorded its topk choices (`calls`: a kforge.ties.Recorder's, from the run
    that gave `out`), the float64 model runs again following them at near-ties (kforge.ties)
    and the package is measured against it. The one rule of `kforge tune --check`, `kforge run
    --check` and the bench (`policy`: atol, rtol)."""
    if isinstance(ref64, str):
        return Arbitration(note=ref64)
    res = Arbitration(arbitrated(out, ref, ref64, policy.atol, policy.rtol))
    if res.arbitrated.ok or not calls:
        return res
    if say:
        say("the float64 model again, following the package's topk choices at near-ties")
    from kforge.ties import follow_ties
    f = follow_ties(out, calls, module, inputs, _empty)
    if f.outputs is not None and f.counts.followed and f.counts.ties:
        res.followed = margin(f.package_outputs, f.outputs, policy.atol, policy.rtol)
    res.ties = None if f.note and not f.counts.selections else f.counts
    res.ties_note = f.note
    del f
    _empty()
    return res


def check_model(pkg, *, target: str | None = None, attribute: bool = False,
                sites: int = 4,
                say: Callable[[str], None] | None = None) -> ModelCheck:
    """The package (its verified kernels, the rest on references) against its eager model on the
    target's device, on the model file's inputs, under the package's policy; with `attribute`,
    also once per kernel region not compiled strict, with that region on its fp32 reference,
    and for the `sites` regions called more than once whose exact result leaves the least
    error, once per call with that call alone on it."""
    from kforge.package import open_package
    from kforge.runtime import use_interpreter
    from kforge.verify import target_available
    say = say or (lambda m: None)
    t0 = time.monotonic()
    package = open_package(pkg)
    target = target or package.target
    if not target_available(target):
        raise UserError(f"{package.root} targets {target}, and this machine has no {target} "
                        "device: check the model where the device is")
    use_interpreter(target == "cpu")
    try:
        return _check_model(package, target, attribute, sites, say, t0)
    except torch.OutOfMemoryError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        raise UserError(
            f"{package.root}: the whole-model check ran out of {target} memory ({first}). It "
            "holds the eager model, the package's prepared weights and both outputs at once: "
            "free the device of other work, or check the model at a smaller shape. The check "
            "changed nothing in the package; moves made by earlier checks are kept in its "
            "manifest") from None
    finally:
        _empty()                          # the models' reference cycles hold device memory


def _check_model(package, target: str, attribute: bool, sites: int,
                 say: Callable[[str], None], t0: float) -> ModelCheck:
    from kforge.package import region_calls, retarget
    from kforge.reference import run_host_plan
    from kforge.runtime import CompiledModel
    from kforge.selection import meets
    from kforge.verify import get_policy
    policy = get_policy(package.precision)
    module, weights, inputs = bound_model(package, target)
    with torch.no_grad():
        ref = _outputs(module(*inputs))
    model = CompiledModel(package, weights, target)
    from kforge.ties import Recorder
    selections = Recorder()             # its topk choices, for the near-tie rule (kforge.ties)
    with torch.no_grad(), selections:
        out = model.run(inputs, graphs=False)
    check = ModelCheck(policy.name, margin(out, ref, policy.atol, policy.rtol))
    if not check.margin.ok:
        say("the model again as a float64 copy: the arbiter of rows outside against eager fp32")
        ref64, why = float64_outputs(module, inputs)
        if ref64 is not None:
            check.float64 = margin(out, ref64, policy.atol, policy.rtol)
            check.eager_float64 = margin(ref, ref64, policy.atol, policy.rtol)
        check.arbiter = arbitrate(out, ref, why if ref64 is None else ref64, module, inputs,
                                  policy, selections.calls, say)
        del ref64
    del out
    if check.ok:
        check.seconds = time.monotonic() - t0
        return check
    if attribute:
        exact = CompiledModel(package, weights, target, use_kernels=False,
                              compile_references=False)
        entries = package.manifest.get("kernels", {})
        calls_of = region_calls(package.plan)
        for h in [h for h in package.region_hashes() if h in model.kernels]:
            held = entries.get(h, {}).get("precision", package.precision)
            if meets(held, "strict"):
                continue                  # already as exact as a kernel gets
            say(f"region {h}: the model again with it on its fp32 reference")
            kernels = {k: v for k, v in model.kernels.items() if k != h}
            refs = dict(model.references)       # (h has a kernel: none of its own there)
            if h in exact.references:
                refs[h] = exact.references[h]
            with torch.no_grad():
                out = run_host_plan(package.plan, package.specs, inputs, weights,
                                    kernels=kernels, references=refs)
            check.without[h] = margin(out, ref, policy.atol, policy.rtol)
            check.kinds[h] = getattr(package.specs[h], "root_kind", "")
            del out
            check.calls[h] = len(calls_of.get(h, []))
        if check.without and not any(m.ok for m in check.without.values()):
            # no region alone brings the model within the policy: would raising all of them?
            # (a strict kernel is at best its fp32 reference) If not, no move is worth its cost
            say("the model again with every region not strict on its fp32 reference")
            kernels = {k: v for k, v in model.kernels.items() if k not in check.without}
            refs = dict(model.references)
            refs.update({h: exact.references[h] for h in check.without if h in exact.references})
            with torch.no_grad():
                out = run_host_plan(package.plan, package.specs, inputs, weights,
                                    kernels=kernels, references=refs)
            check.all_raised = margin(out, ref, policy.atol, policy.rtol)
            del out
            if not check.all_raised.ok:
                say("the model again with every region on its fp32 reference")
                with torch.no_grad():
                    out = run_host_plan(package.plan, package.specs, inputs, weights,
                                        references=exact.references)
                check.all_exact = margin(out, ref, policy.atol, policy.rtol)
                del out
        # call by call, for the `sites` regions called more than once whose exact result
        # leaves the least error (a 32-layer model would otherwise take 32 runs a region)
        shared = sorted((h for h in check.without if check.calls[h] > 1),
                        key=lambda h: check.without[h].worst)[:max(0, sites)]
        if check.all_raised is not None and not check.all_raised.ok:
            shared = []                   # no move can help: no call to single out
        for h in shared:
            for k, i in enumerate(calls_of[h]):
                say(f"region {h}: the model again with its call {k + 1} on its fp32 reference")
                # the plan with only this call on the reference: it names a region of its own
                # (the same spec), which has no kernel
                alone = f"{h}@{k}"
                steps = list(package.plan.steps)
                steps[i] = retarget(steps[i], alone)
                refs_k = dict(model.references)
                if h in exact.references:
                    refs_k[alone] = exact.references[h]
                with torch.no_grad():
                    out = run_host_plan(replace(package.plan, steps=tuple(steps)),
                                        {**package.specs, alone: package.specs[h]}, inputs,
                                        weights, kernels=model.kernels, references=refs_k)
                check.at_call[(h, k)] = margin(out, ref, policy.atol, policy.rtol)
                del out
    check.seconds = time.monotonic() - t0
    return check


def next_rung(package, h: str) -> tuple[int, int] | None:
    """(the bits of region `h`'s kernel's scheme, the next finer scheme's bits) where the
    builtin's space for the region under its own policy has a finer scheme short of
    fp32-grade (kforge.selection.scheme_bits); None where the next step is strict (another
    provider's kernel, a strict one, no products, or nothing between)."""
    from kforge.package import entry_config
    from kforge.providers.builtin import config_space
    from kforge.providers.builtin.emitter import CannotGenerate
    from kforge.selection import FP32_GRADE, meets, scheme_bits
    entry = package.manifest.get("kernels", {}).get(h) or {}
    precision = entry.get("precision", package.precision)
    if entry.get("provider") != "builtin" or meets(precision, "strict"):
        return None
    bits = scheme_bits(entry_config(entry), precision)
    if bits is None or h not in package.specs:
        return None
    try:
        space = config_space(package.specs[h], package.target, precision)
    except (CannotGenerate, ValueError):
        return None
    finer = sorted({b for b in (scheme_bits(c, precision) for c in space)
                    if b is not None and b > bits})
    if not finer or finer[0] >= FP32_GRADE:
        return None
    return bits, finer[0]


@dataclass
class Fit:
    """fit_model's outcome: the checks in order, the regions it raised to strict and those it
    took to a finer scheme of their policy ((hash, from bits, to bits), in order)."""
    checks: list[ModelCheck]
    raised: list[str]
    tightened: list[tuple[str, int, int]] = field(default_factory=list)
    # (new region, the region it was split from, its call k): calls split off to move alone
    split: list[tuple[str, str, int]] = field(default_factory=list)
    note: str = ""
    limited: bool = False               # stopped by `limit`, not for want of a region to move

    @property
    def steps(self) -> int:
        return len(self.raised) + len(self.tightened)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and self.checks[-1].ok


def choose_step(check: ModelCheck, moved: list[str]) -> tuple[str, int | None, Margin] | None:
    """What fit_model moves next: (region, None, margin) for the whole region, or (region, k,
    margin) for its k-th call alone. Candidates are the regions not yet raised and, for regions
    called more than once, each call. One that brings the model within the policy by itself
    wins, fewest calls first; else the most error removed per call moved (a call alone moves a
    third to a quarter of a layered region's work); where none lowers the error (two errors
    that cancel in part: either one exact exposes the other's), still the whole region whose
    exact result leaves the least, since the model with all of them strict is exact."""
    now = check.margin.worst
    whole = [(h, None, m, check.calls.get(h, 1)) for h, m in check.without.items()
             if h not in moved]
    calls = [(h, k, m, 1) for (h, k), m in check.at_call.items() if h not in moved]
    within = [c for c in whole + calls if c[2].ok]
    if within:
        h, k, m, _ = min(within, key=lambda c: (c[3], c[2].worst))
        return h, k, m
    lower = [c for c in whole + calls if c[2].worst < now]
    if lower:
        h, k, m, _ = max(lower, key=lambda c: ((now - c[2].worst) / c[3], -c[3]))
        return h, k, m
    best = min(whole, key=lambda c: c[2].worst, default=None)
    return None if best is None else best[:3]


def _unmovable(check: ModelCheck) -> str:
    """Why fit_model moved nothing: raising every region to strict would leave the model
    outside the policy (ModelCheck.all_raised)."""
    head = (f"no move can bring the model within the {check.policy} policy: with every region "
            f"not strict on its fp32 reference it is still outside ({check.all_raised.text()})")
    if check.all_exact is not None and check.all_exact.ok:
        return (f"{head}, and within it with every region on its reference "
                f"({check.all_exact.text()}): the strict kernels' own fp32-grade rounding, "
                "which differs from eager PyTorch's, carries it. Rows far outside where the rest "
                "agree point to a discrete choice made differently (an MoE router's near-tie, "
                "spread to later tokens by attention) or to a kernel wrong on particular data; "
                "no region was moved")
    exact = f" ({check.all_exact.text()})" if check.all_exact is not None else ""
    return (f"{head}, and with every region on its reference as well{exact}: the error is not "
            "the kernels' but the frontend's graph's or a fallback op's; no region was moved")


def fit_model(pkg, *, tune: Callable[[], dict], target: str | None = None,
              say: Callable[[str], None] | None = None, limit: int | None = None) -> Fit:
    """Check the whole model; while it is outside the package's policy, take the region (or
    the one call of it, split off first) that choose_step picks one rung up (next_rung: a
    finer scheme of its policy,
    recorded in the manifest's "finer_schemes"; else strict, in "strict_regions"), run `tune`
    (which verifies its new kernel: tune_package's requalification) and check again. Stops
    when the model is within the policy, when every kernel region is strict, or after `limit`
    steps."""
    from kforge.package import open_package, read_manifest, split_site, write_manifest
    say = say or (lambda m: None)
    fit = Fit([], [])
    while True:
        check = check_model(pkg, target=target, attribute=True, say=say)
        fit.checks.append(check)
        for line in check.lines():
            say(line)
        if check.ok:
            return fit
        if limit is not None and fit.steps >= limit:
            fit.note, fit.limited = f"stopped after {limit} steps", True
            return fit
        if check.all_raised is not None and not check.all_raised.ok:
            fit.note = _unmovable(check)
            return fit
        best = choose_step(check, fit.raised)
        if best is None:
            fit.note = ("no kernel region left to raise: every one is strict already, so the "
                        "error is not the kernels' (the references, or fallback ops)")
            return fit
        h, k, m = best
        found = (f"the whole-model check found the model outside the {check.policy} policy "
                 f"(worst element at {check.margin.worst:.3g} of its allowance; {m.worst:.3g} "
                 f"with this {'call' if k is not None else 'region'} exact)")
        if k is not None:
            # one call of a shared region carries the error: it becomes a region of its own
            h2, k = split_site(pkg, h, k, f"{found}: one call of region {h}, split off to "
                                          "move it alone")
            fit.split.append((h2, h, k))      # k now among all the region's calls
            say(f"region {h}: call {k + 1} split off as region {h2} "
                f"(worst {check.margin.worst:.3g} -> {m.worst:.3g} with that call exact; "
                f"{check.without[h].worst:.3g} with every call exact)")
            h = h2
        rung = next_rung(open_package(pkg), h)
        manifest = read_manifest(pkg)
        if rung is not None:
            bits, finer = rung
            manifest.setdefault("finer_schemes", {})[h] = {
                "finer_than": bits,
                "why": f"{found}: a scheme keeping more than {bits} significant bits"}
            fit.tightened.append((h, bits, finer))
            say(f"region {h}: taken from its {bits}-bit scheme to the next finer one of "
                f"{check.policy} ({finer} bits; worst {check.margin.worst:.3g} -> "
                f"{m.worst:.3g} with it exact); verifying its kernel")
        else:
            manifest.setdefault("strict_regions", {})[h] = f"{found}: compiled strict"
            fit.raised.append(h)
            say(f"region {h}: raised to strict (worst {check.margin.worst:.3g} -> "
                f"{m.worst:.3g} with it exact); verifying its strict kernel")
        write_manifest(pkg, manifest)
        tune()


__all__ = ["Margin", "margin", "arbitrated", "row_ratios", "float64_outputs", "Arbitration",
           "arbitrate", "ModelCheck",
           "check_model", "Fit", "fit_model", "bound_model", "next_rung", "choose_step"]
