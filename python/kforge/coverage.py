"""Where a model's work runs: verified kernels, region references, fallback ops, host steps.

`plan_coverage(plan, specs, manifest_kernels)` counts ops and FLOPs per home from the host plan
and the region specs (no execution); `profile_plan(...)` runs a compiled model once with a timer
around every step and gives each home its share of the time. Both go into the compile report.
Needs only torch.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Mapping

from kforge.errors import UserError
from kforge.spec import CallStep, FallbackOp, GenericOp, HostPlan, KernelStep, OpaqueOp


def opaque_steps(plan: HostPlan) -> list[OpaqueOp]:
    return [s for s in plan.steps if isinstance(s, OpaqueOp)]


def check_runnable(plan: HostPlan, where: str) -> None:
    """A package that compiles must run: a step no runtime executes stops the compile here."""
    opaque = opaque_steps(plan)
    if not opaque:
        return
    names = Counter(s.name for s in opaque)
    listed = ", ".join(f"{n} ({c}x)" for n, c in names.most_common())
    first = opaque[0].mlir.strip().splitlines()[0] if opaque[0].mlir.strip() else ""
    raise UserError(f"{where}: {len(opaque)} op(s) outside every region that neither the "
                    f"host plan nor a fallback op can describe: {listed}; first: {first[:200]}. "
                    "Please report this model; as a workaround keep that op out of the model")


def plan_coverage(plan: HostPlan, specs: Mapping, verified: set[str]) -> dict:
    """Ops and FLOPs by home. A region's ops are its fused linalg ops; a fallback op is one op
    (its FLOPs are not known here: gathers, scans and sorts do little arithmetic)."""
    ops = Counter()
    flops = Counter()
    fallbacks = Counter()
    for step in plan.steps:
        if isinstance(step, (CallStep, KernelStep)):
            spec = specs.get(step.call)
            home = "kernel" if step.call in verified else "reference"
            n = len(getattr(spec, "fused", ()) or ()) or 1
            ops[home] += n
            flops[home] += int(getattr(spec, "flops", 0) or 0)
        elif isinstance(step, FallbackOp):
            ops["fallback"] += 1
            fallbacks[step.name] += 1
        elif isinstance(step, GenericOp):
            ops["host"] += 1
    total_ops = sum(ops.values())
    total_flops = sum(flops.values())
    return {
        "ops": dict(ops), "flops": dict(flops),
        "kernel_op_fraction": round(ops["kernel"] / total_ops, 4) if total_ops else None,
        "kernel_flop_fraction": round(flops["kernel"] / total_flops, 4) if total_flops else None,
        "fallback_ops": [{"name": n, "count": c} for n, c in fallbacks.most_common()],
    }


def profile_plan(compiled, inputs, repeats: int = 1) -> dict:
    """Runs `compiled` (a kforge.runtime.CompiledModel) with a timer around each host-plan step;
    returns seconds by home and by fallback op, from the last of `repeats` runs."""
    import torch

    device = compiled.device
    # torch.cuda / torch.xpu: the device module of the tensors' device type
    sync = ((lambda: getattr(torch, device.type).synchronize(device)) if device.type != "cpu"
            else (lambda: None))
    times: dict = {}
    for _ in range(max(1, repeats)):
        by_home = defaultdict(float)
        by_fallback = defaultdict(float)
        by_kind = defaultdict(float)        # kernel time by region kind (gemm, attention, moe...)

        def timer(step, run):
            sync()
            t0 = time.perf_counter()
            out = run()
            sync()
            dt = time.perf_counter() - t0
            if isinstance(step, (CallStep, KernelStep)):
                on_kernel = step.call in compiled.kernels
                by_home["kernel" if on_kernel else "reference"] += dt
                if on_kernel:
                    spec = compiled.package.specs.get(step.call)
                    by_kind[getattr(spec, "root_kind", "") or "other"] += dt
            elif isinstance(step, FallbackOp):
                by_home["fallback"] += dt
                by_fallback[step.name] += dt
            else:
                by_home["host"] += dt
            return out

        compiled.run(inputs, step_timer=timer)
        times = {"by_home_s": dict(by_home), "by_fallback_s": dict(by_fallback),
                 "by_kind_s": dict(by_kind)}
    total = sum(times["by_home_s"].values())
    times["total_s"] = total
    times["device"] = str(device)
    return times


def merge_profile(coverage: dict, profile: dict | None) -> dict:
    """The fallback rows with their share of the measured time."""
    out = dict(coverage)
    if not profile:
        out["time_measured"] = False
        return out
    total = profile.get("total_s") or 0.0
    out["time_measured"] = True
    out["time_device"] = profile.get("device")
    out["time_share"] = {k: round(v / total, 4) if total else None
                         for k, v in profile.get("by_home_s", {}).items()}
    # the kernels' share by what they compute (of the whole run's time)
    out["kernel_share_by_kind"] = {k: round(v / total, 4) if total else None
                                   for k, v in profile.get("by_kind_s", {}).items()}
    rows = []
    for row in coverage.get("fallback_ops", []):
        t = profile.get("by_fallback_s", {}).get(row["name"], 0.0)
        rows.append({**row, "time_s": round(t, 6),
                     "time_share": round(t / total, 4) if total else None})
    out["fallback_ops"] = rows
    return out


def coverage_markdown(cov: dict) -> list[str]:
    if not cov:
        return []
    ops, flops = cov.get("ops", {}), cov.get("flops", {})
    lines = ["", "## Where the model runs", "",
             "| home | ops | GFLOP | time share |", "|---|---|---|---|"]
    share = cov.get("time_share", {})
    for home in ("kernel", "reference", "fallback", "host"):
        if ops.get(home) or share.get(home):
            s = share.get(home)
            lines.append(f"| {home} | {ops.get(home, 0)} | {flops.get(home, 0) / 1e9:.4f} | "
                         f"{'—' if s is None else f'{100 * s:.1f} %'} |")
    frac_f, frac_o = cov.get("kernel_flop_fraction"), cov.get("kernel_op_fraction")
    lines.append("")
    n_fb = ops.get("fallback", 0)
    lines.append(f"In verified kernels: {'—' if frac_f is None else f'{100 * frac_f:.1f} %'} of "
                 f"the regions' FLOPs, {'—' if frac_o is None else f'{100 * frac_o:.1f} %'} of "
                 "the ops" + (f" (the FLOPs of the {n_fb} fallback ops are not counted: a "
                              "fallback op that multiplies matrices, such as a library's "
                              "grouped GEMM, is outside these figures)" if n_fb else "") + "."
                 + ("" if cov.get("time_measured") else
                    " Time shares not measured (the target device is not on this machine)."))
    if cov.get("fallback_ops"):
        lines += ["", "Fallback ops (run by PyTorch):", "",
                  "| op | count | time share |", "|---|---|---|"]
        for row in cov["fallback_ops"]:
            s = row.get("time_share")
            lines.append(f"| `{row['name']}` | {row['count']} | "
                         f"{'—' if s is None else f'{100 * s:.1f} %'} |")
    return lines


__all__ = ["check_runnable", "plan_coverage", "profile_plan", "merge_profile",
           "coverage_markdown", "opaque_steps"]
