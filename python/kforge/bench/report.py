"""Suite reports: one JSON document (schema "kforge.bench", version 2), a Markdown table and a
PNG plot. Shards of one suite (several GPUs, several calls) merge into one report.

Version 2 (issue 13): each policy has `routes` (the matched PyTorch routes, each with its own
status and errors), `matched_best`, `strict_contract`; each contender `allclose`. Version 1
documents (`matched_baselines`, only with --baseline-precision matched) are upgraded when
read (`upgrade`), so old shards still merge."""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
from pathlib import Path

from kforge.bench import stats

SCHEMA, VERSION = "kforge.bench", 2
READABLE_VERSIONS = (1, 2)


def environment(target: str) -> dict:
    import torch

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "target": target,
        "fp32_matmul": {"allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                        "float32_matmul_precision": torch.get_float32_matmul_precision()},
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    from kforge.targets import get_target
    tgt = get_target(target)
    if not tgt.interpreter and tgt.available():
        env["hardware"] = tgt.device_name()
        env["gpu"] = tgt.device_info()      # name, compute units, memory, driver (nvidia-smi)
    else:
        env["hardware"] = f"{platform.processor() or platform.machine()} CPU (Triton interpreter)"
    env["git_commit"] = git_output("rev-parse", "HEAD") or None
    # A copy of the tree (a device machine's) may carry stale git metadata: say whether the code
    # differs from that commit, and take the commit from KFORGE_SOURCE_COMMIT where the caller
    # knows it. The digest of the code that ran identifies it either way.
    if env["git_commit"]:
        env["git_code_matches_commit"] = git_output("status", "--porcelain", "--", "python") == ""
    if os.environ.get("KFORGE_SOURCE_COMMIT"):
        env["git_commit"] = os.environ["KFORGE_SOURCE_COMMIT"]
        env["git_commit_from"] = "KFORGE_SOURCE_COMMIT"
    env["kforge_source_sha256"] = source_digest()
    return env


def git_output(*args: str) -> str:
    """`git ARGS` in the repository holding this code, stripped ('' where git cannot answer)."""
    try:
        root = Path(__file__).resolve().parents[3]
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:   # noqa: BLE001 - informational
        return ""


def source_digest() -> str:
    """sha256 (16 hex digits) over python/kforge/**/*.py, paths and contents."""
    import hashlib
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def summarize_suite(workloads: list[dict], precisions: list[str]) -> dict:
    """Per policy and group (all / gemm / fusion / transformer): geomean speedup over the correct
    workloads, fast_p over all of them, geomean roofline fraction; with matched baselines, the
    same against them under "vs_matched"."""
    out = {}
    for policy in precisions:
        groups: dict[str, tuple[list, list, list]] = {}
        for w in workloads:
            pr = next((p for p in w.get("policies", []) if p["precision"] == policy), None)
            if w.get("status") == "skipped" and pr is None:
                continue       # not run at all (time budget): not part of this suite's numbers
            speedup = pr["speedup"] if pr else None
            matched = pr.get("speedup_matched") if pr else None
            fraction = pr["roofline_fraction"] if pr and pr["kforge"]["status"] == "ok" else None
            info = (pr or {}).get("kforge", {}).get("info") or {}
            all_kernels = bool(info.get("regions_total")) and \
                info.get("regions_on_kernels") == info.get("regions_total")
            contract = ((pr or {}).get("strict_contract") or {}).get("passes")
            allclose = (pr or {}).get("kforge", {}).get("allclose")
            for g in ("all", _group(w)):
                groups.setdefault(g, ([], [], [], [], [], []))
                groups[g][0].append(speedup)
                groups[g][1].append(fraction)
                groups[g][2].append(matched)
                groups[g][3].append(all_kernels)
                groups[g][4].append(contract)
                groups[g][5].append(allclose)
        out[policy] = {}
        for g, (s, f, m, k, c, a) in groups.items():
            out[policy][g] = stats.summarize(s, f)
            out[policy][g]["all_regions_on_kernels"] = sum(k)
            # torch.allclose(kforge, eager fp32) at the policy's tolerance: KernelBench's rule
            out[policy][g]["allclose"] = sum(1 for x in a if x)
            if any(x is not None for x in c):
                out[policy][g]["strict_contract_passed"] = sum(1 for x in c if x)
            if any(x is not None for x in m):
                out[policy][g]["vs_matched"] = stats.summarize(m, f)
    return out


def _group(w: dict) -> str:
    tags = w.get("tags") or []
    if "transformer" in tags:
        return "transformer"
    if "gemm" in tags:
        return "gemm"
    if "fusion" in tags:
        return "fusion"
    return "other"


def build_document(env: dict, config: dict, peaks: dict, workloads: list[dict], notes: list[str]) -> dict:
    return {"schema": SCHEMA, "version": VERSION, "environment": env, "config": config,
            "peaks": peaks, "notes": notes, "workloads": workloads,
            "summary": summarize_suite(workloads, config["precisions"])}


def _combine_policies(old: dict, new: dict) -> dict:
    """`new` (the later measurement of a workload) with the policies only `old` has appended."""
    have = {p["precision"] for p in new.get("policies", [])}
    kept = [p for p in old.get("policies", []) if p["precision"] not in have]
    if not kept or old.get("status") == "skipped":
        return new
    own = {"best_baseline": old.get("best_baseline"), "best_baseline_ms": old.get("best_baseline_ms"),
           "baselines": {b["name"]: _ms(b) for b in old.get("baselines", [])}}
    out = dict(new, policies=list(new.get("policies", [])))
    for p in kept:
        out["policies"].append(dict(p, own_run=p.get("own_run") or own))
    return out


def upgrade(doc: dict) -> dict:
    """A readable bench document in this version's shape (a copy); ValueError for any other.
    v1 -> v2: a policy's `matched_baselines` become its `routes` (strict: the baselines), and
    their headline is the faster correct one, as v2 chooses it."""
    import copy

    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r})")
    version = doc.get("version")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"{SCHEMA} version {version} cannot be read by this kforge (it reads "
                         f"versions {', '.join(map(str, READABLE_VERSIONS))}); use the kforge "
                         "that wrote it")
    if version == VERSION:
        return doc
    from kforge.bench import routes

    doc = copy.deepcopy(doc)
    for w in doc.get("workloads", []):
        for p in w.get("policies", []):
            old = p.pop("matched_baselines", None) or []
            if p["precision"] == "strict":
                old = old or copy.deepcopy(w.get("baselines", []))
            p.setdefault("routes", old)
            best = routes.headline(p["routes"])
            p.setdefault("matched_best", best["name"] if best else None)
            p.setdefault("strict_contract", None)
    doc["version"] = VERSION
    doc.setdefault("notes", []).append(f"upgraded from {SCHEMA} v{version}: no strict contract; "
                                       "matched routes only where that run measured them, and "
                                       "v1 did not check them for correctness")
    return doc


def merge(documents: list[dict]) -> dict:
    """Combine shards of one suite. Environments and peaks are kept per shard; a workload that
    appears in several shards keeps its last non-skipped result. Where that result covers only
    some of the policies an earlier one has (a re-measurement of one policy), the earlier
    policies are kept beside it, each with the baselines of its own run (`own_run`: each
    speedup is a ratio measured within one run)."""
    if not documents:
        raise ValueError("nothing to merge")
    documents = [upgrade(d) for d in documents]
    by_name: dict[str, dict] = {}
    source: dict[str, int] = {}         # workload -> the document its result now comes from
    for i, d in enumerate(documents):
        for w in d["workloads"]:
            old = by_name.get(w["name"])
            if old is None:
                by_name[w["name"]] = w
                source[w["name"]] = i
            elif w.get("status") != "skipped":
                by_name[w["name"]] = _combine_policies(old, w)
                source[w["name"]] = i
    precisions = []
    for d in documents:
        precisions += [p for p in d["config"]["precisions"] if p not in precisions]
    config = dict(documents[0]["config"], precisions=precisions)
    config["shards"] = [d["config"].get("shard") for d in documents]
    notes = []
    for d in documents:
        notes += [n for n in d.get("notes", []) if n not in notes]
    doc = build_document(documents[0]["environment"], config, documents[0]["peaks"],
                         sorted(by_name.values(), key=lambda w: w["name"]), notes)
    doc["shards"] = [{"environment": d["environment"], "peaks": d["peaks"],
                      "workloads": [w["name"] for w in d["workloads"]],
                      "kept": sorted(n for n, j in source.items()
                                     if j == i and by_name[n].get("status") != "skipped")}
                     for i, d in enumerate(documents)]
    return doc


# ---------------------------------------------------------------- Markdown

def _fmt(x, spec=".3f", none="–"):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return none
    return format(x, spec)


def _baseline(w, name):
    return next((b for b in w.get("baselines", []) if b["name"] == name), None)


def _kernels(k: dict) -> str:
    """Regions run by verified kernels / all regions (the rest run their PyTorch reference),
    and those the whole-model check moved (`kforge tune --check`)."""
    info = k.get("info") or {}
    if "regions_total" not in info:
        return "–"
    text = f"{info['regions_on_kernels']}/{info['regions_total']}"
    moved = info.get("moved_by_check") or {}
    parts = [f"{moved[key]} {key}" for key in ("finer", "strict") if moved.get(key)]
    if moved.get("split"):          # calls of a shared region split off to move alone
        parts.append(f"{moved['split']} call{'s' if moved['split'] > 1 else ''} split off")
    return text + (f" (check: {', '.join(parts)})" if parts else "")


def _ms(c):
    return c["timing"]["median_ms"] if c and c.get("timing") else None


def _runs_of_a_merge(doc: dict) -> list[str]:
    """Where a merge's results come from, when its runs differ in machine, code or day (the
    header above names the first run's alone): each run's hardware, date, commit, and how many
    of the merged workloads keep its result."""
    shards = doc.get("shards") or []
    key = lambda e: (e.get("hardware"), e.get("git_commit"), str(e.get("date"))[:10])  # noqa: E731
    if len({key(s["environment"]) for s in shards}) < 2:
        return []
    lines = [f"- merged from {len(shards)} runs that differ in machine, code or day; each "
             "workload's ratios come from the one run it was kept from:"]
    for i, s in enumerate(shards, 1):
        e = s["environment"]
        kept = s.get("kept")
        lines.append(f"  - run {i}: {e.get('hardware')}, {e.get('date')}, commit "
                     f"`{e.get('git_commit')}`: "
                     + (f"kept for {len(kept)} workload{'s' * (len(kept) != 1)}"
                        if kept is not None else f"{len(s.get('workloads', []))} workloads"))
    return lines


def markdown(doc: dict) -> str:
    env, cfg, peaks = doc["environment"], doc["config"], doc["peaks"]
    lines = [
        "# KForge benchmark",
        "",
        f"- hardware: **{env.get('hardware')}**; date {env.get('date')}; torch {env.get('torch')}, "
        f"triton {env.get('triton')}, Python {env.get('python')}; commit `{env.get('git_commit')}`"
        + (" (the code that ran differs from it)" if env.get("git_code_matches_commit") is False
           and not env.get("git_commit_from") else "")
        + (f" (code digest `{env['kforge_source_sha256']}`)" if env.get("kforge_source_sha256")
           else ""),
        f"- target `{cfg['target']}`, sizes `{cfg['scale']}`, precision policies: "
        f"{', '.join('`%s`' % p for p in cfg['precisions'])}; provider `{cfg.get('provider')}`; "
        f"KForge packages: {cfg.get('kforge_source')}",
        f"- baselines: {cfg.get('baseline_note')}",
        f"- timing: {cfg.get('timing_method')}",
        f"- roofline peaks ({peaks['source']}: {peaks['details']}): fp32 {peaks['fp32_tflops']:.1f}, "
        f"TF32 {peaks['tf32_tflops']:.1f}, bf16 {peaks['bf16_tflops']:.1f} TFLOP/s, "
        f"bandwidth {peaks['bandwidth_tbs']:.2f} TB/s; policy FLOP peaks: "
        + ", ".join(f"{k} {v:.1f}" for k, v in peaks.get("policy_tflops", {}).items()) + " TFLOP/s",
    ]
    lines += _runs_of_a_merge(doc)
    for n in doc.get("notes", []):
        lines.append(f"- note: {n}")
    lines += ["", "## Summary", "",
              "| policy | group | workloads | correct | all regions on kernels | geomean speedup | fast_1 | fast_1.5 | fast_2 | fast_4 | geomean % of floor | geomean vs matched | fast_1 vs matched | allclose | strict contract |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for policy, groups in doc["summary"].items():
        for g, s in groups.items():
            fp = s["fast_p"]
            lines.append(f"| {policy} | {g} | {s['workloads']} | {s['correct']} | {s.get('all_regions_on_kernels', '–')} | "
                         f"{_fmt(s['geomean_speedup'], '.2f')}{'x' if s['geomean_speedup'] else ''} | "
                         + " | ".join(_fmt(fp[k], '.2f') for k in ("1", "1.5", "2", "4"))
                         + f" | {_fmt(None if s['geomean_roofline_fraction'] is None else 100 * s['geomean_roofline_fraction'], '.0f')} | "
                         + (f"{_fmt(s['vs_matched']['geomean_speedup'], '.2f')} | {_fmt(s['vs_matched']['fast_p']['1'], '.2f')} |"
                            if "vs_matched" in s else "– | – |")
                         + f" {s.get('allclose', '–')} | {s.get('strict_contract_passed', '–')} |")
    lines += ["", "fast_p: fraction of all workloads whose KForge result is correct and more than p times "
              "faster than the faster baseline; geomean speedup over the correct ones. "
              "vs matched: the same over the faster correct route a user would take in PyTorch at "
              "the policy's precision (section Matched routes). allclose: workloads where "
              "torch.allclose(kforge, eager fp32) holds at the policy's tolerance (KernelBench's "
              "rule; at 1e-4 under strict). strict contract: workloads where every element of "
              "KForge's result is within 2x eager fp32's own error against a float64 copy of the "
              "model (kforge.verify.contract). "
              "`kernels`: regions run by verified kernels / all regions (the rest run their "
              "PyTorch reference, as a package does when no kernel was verified).", ""]
    lines += goals(doc)
    lines += ["## Per workload", "",
              "| workload | GFLOP | MB | eager ms | compile ms | compile s | policy | kforge ms | status | "
              "kernels | speedup | % floor | baseline % fp32 floor | kforge compile s | max rel err | matched route ms | speedup vs matched |",
              "|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in doc["workloads"]:
        e, c = _baseline(w, "eager"), _baseline(w, "torch.compile")
        head = (f"| {w['name']} | {_fmt((w.get('flops') or 0) / 1e9, '.4g')} | "
                f"{_fmt((w.get('bytes_fp32') or 0) / 1e6, '.4g')} | {_fmt(_ms(e))} | "
                f"{_fmt(_ms(c)) if c and c['status'] == 'ok' else (c['status'] if c else '–')} | "
                f"{_fmt(c.get('compile_s') if c else None, '.1f')} |")
        if w.get("status") != "ok" and not w.get("policies"):
            lines.append(head + f" – | – | {w['status']}: {w.get('reason', '')} | – | – | – | – | – | – | – | – |")
            continue
        for i, p in enumerate(w["policies"]):
            k = p["kforge"]
            status = k["status"] if k["status"] == "ok" else f"{k['status']}: {k.get('reason', '')[:80]}"
            if k["status"] == "ok" and (k.get("info") or {}).get("within_unscaled_atol") is False:
                status = "ok (only with atol x RMS)"
            if p.get("kforge_model") == "bf16":
                status += " (bf16 model)"
            if p.get("own_run"):
                status += (f" (earlier run; its faster baseline "
                           f"{_fmt(p['own_run'].get('best_baseline_ms'))} ms)")
            row = head if i == 0 else "| | | | | | |"
            lines.append(
                row + f" {p['precision']} | {_fmt(_ms(k))} | {status} | {_kernels(k)} | "
                f"{_fmt(p.get('speedup'), '.2f')} | "
                f"{_fmt(None if p.get('roofline_fraction') is None else 100 * p['roofline_fraction'], '.0f')} | "
                f"{_fmt(None if w.get('baseline_roofline_fraction') is None else 100 * w['baseline_roofline_fraction'], '.0f')} | "
                f"{_fmt(k.get('compile_s'), '.1f')} | {_fmt(k.get('max_rel_err'), '.1e')} | "
                f"{_fmt(p.get('matched_best_ms'))}{' (' + p['matched_best'] + ')' if p.get('matched_best') else ''} | "
                f"{_fmt(p.get('speedup_matched'), '.2f')} |")
    lines += llm_section(doc) + bf16_models_section(doc) + matched_section(doc) + \
        contract_section(doc)
    skipped = [(w["name"], b["name"], b["reason"]) for w in doc["workloads"] for b in w.get("baselines", [])
               if b["status"] not in ("ok", "mismatch")]
    if skipped:
        lines += ["", "## Baselines not measured", ""]
        reasons: dict[tuple, list] = {}
        for name, b, r in skipped:
            reasons.setdefault((b, r), []).append(name)
        for (b, r), names in reasons.items():
            lines.append(f"- {b}: {r} ({len(names)} workloads: {', '.join(names[:6])}{'...' if len(names) > 6 else ''})")
    return "\n".join(lines) + "\n"


def _tokens(c) -> str:
    if not c or not c.get("tokens_per_s"):
        return "–"
    mark = "" if c["status"] == "ok" else f" ({c['status']})"
    return f"{c['tokens_per_s']:,.0f}{mark}"


LLM_ROUTES = ("eager", "torch.compile", "eager[bf16 model]", "torch.compile[bf16 model]",
              "torch.compile[bf16 model, max-autotune-no-cudagraphs]")


def _llm_contenders(w: dict) -> dict:
    """name -> contender for an LLM workload: the fp32 baselines, the bf16 routes and
    kforge[policy]."""
    out = {b["name"]: b for b in w.get("baselines", [])}
    for p in w.get("policies", []):
        out[p["kforge"]["name"]] = p["kforge"]
        out.update({r["name"]: r for r in p.get("routes") or [] if r["name"] not in out})
    return out


def _shares_text(shares: dict) -> str:
    """"kernel 73%, host 19%, ...": the nonzero shares, largest first."""
    return ", ".join(f"{name} {100 * v:.0f}%" for name, v in
                     sorted(shares.items(), key=lambda kv: -(kv[1] or 0)) if v)


def _time_shares(k: dict) -> str:
    where = (k.get("info") or {}).get("where") or {}
    share = where.get("time_share")
    if not share:
        return "–"
    return _shares_text(share)


def _kernel_kinds(k: dict) -> str:
    """The kernels' time by region kind, and what a CUDA-graph replay saved against the
    synchronizing step-by-step run (launch and synchronization gaps)."""
    where = (k.get("info") or {}).get("where") or {}
    text = _shares_text(where.get("kernel_share_by_kind") or {}) or "–"
    step, timed = where.get("stepwise_ms"), (k.get("timing") or {}).get("median_ms")
    if step and timed:
        text += f"; step by step {step:.3g} ms, timed {timed:.3g} ms"
    return text


def llm_section(doc: dict) -> list[str]:
    """Workloads that count tokens (LLM prefill / decode): tokens/s of every route."""
    llm = [w for w in doc["workloads"] if w.get("tokens_per_call")]
    if not llm:
        return []
    policies = [p for p in doc["config"]["precisions"]]
    head = ["workload", "tokens/call", *LLM_ROUTES, *(f"kforge[{p}]" for p in policies)]
    rows = []
    for w in llm:
        c = _llm_contenders(w)
        rows.append(f"| {w['name']} | {w['tokens_per_call']} | "
                    + " | ".join(_tokens(c.get(n)) for n in head[2:]) + " |")
    shares = []
    for w in llm:
        for p in w.get("policies", []):
            k = p["kforge"]
            where = (k.get("info") or {}).get("where") or {}
            if not where:
                continue
            fb = ", ".join(f"{r['name']} x{r['count']}" for r in where.get("fallback_ops", [])[:6])
            shares.append(f"| {w['name']} | {p['precision']} | {_kernels(k)} | "
                          f"{_fmt(where.get('kernel_flop_fraction') and 100 * where['kernel_flop_fraction'], '.1f')} | "
                          f"{_time_shares(k)} | {_kernel_kinds(k)} | {fb or '–'} |")
    out = ["", "## LLM inference: tokens/s", "",
           "tokens/s = tokens per call (prefill: batch x sequence; decode: batch, one new token "
           "per sequence against its KV cache) / median time of one call. A route outside the "
           "policy's tolerance against eager fp32 is marked (mismatch).", "",
           "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1), *rows]
    if shares:
        out += ["", "Where KForge's time goes (one run timed step by step, no CUDA graph: "
                "kernel = verified KForge kernels, reference = PyTorch (the region's aten "
                "program or its linalg reference), fallback = ops outside the linalg path run "
                "by torch.ops, host = views and glue):", "",
                "| workload | policy | regions on kernels | % region FLOPs in kernels | time share | kernels by kind | fallback ops |",
                "|---|---|---:|---:|---|---|---|", *shares]
    return out


def llm_goals(doc: dict) -> list[tuple[str, str, bool]]:
    """Issue 12: kforge[bf16] >= 1.10x the tokens/s of the faster torch.compile mode on the bf16
    model; kforge[strict] faster than torch.compile on the fp32 model; per LLM workload."""
    rows = []
    for w in doc["workloads"]:
        if not w.get("tokens_per_call"):
            continue
        c = _llm_contenders(w)
        kb, ks = c.get("kforge[bf16]"), c.get("kforge[strict]")
        tc = [c.get(n) for n in ("torch.compile[bf16 model]",
                                 "torch.compile[bf16 model, max-autotune-no-cudagraphs]")]
        tc = [r for r in tc if r and r.get("tokens_per_s")]
        if kb is not None and tc:
            best = max(tc, key=lambda r: r["tokens_per_s"])
            ratio = (kb["tokens_per_s"] / best["tokens_per_s"]
                     if kb.get("tokens_per_s") and kb["status"] == "ok" else None)
            rows.append((f"{w['name']}: kforge[bf16] >= 1.10x the faster torch.compile mode on "
                         f"the bf16 model", f"{_fmt(ratio, '.2f')}x ({_tokens(kb)} vs "
                         f"{_tokens(best)} tokens/s, {best['name']})",
                         ratio is not None and ratio >= 1.10))
        tc32 = c.get("torch.compile")
        if ks is not None and tc32 and tc32.get("tokens_per_s"):
            ratio = (ks["tokens_per_s"] / tc32["tokens_per_s"]
                     if ks.get("tokens_per_s") and ks["status"] == "ok" else None)
            rows.append((f"{w['name']}: kforge[strict] faster than torch.compile on the fp32 model",
                         f"{_fmt(ratio, '.2f')}x ({_tokens(ks)} vs {_tokens(tc32)} tokens/s)",
                         ratio is not None and ratio > 1.0))
    return rows


def bf16_models_section(doc: dict) -> list[str]:
    """bf16: KForge's two packages, of the fp32 model and of the model cast to bf16, each
    against the faster correct matched route where it is correct, and which one was taken."""
    sides: dict[str, list] = {"fp32": [], "bf16": []}
    taken = {"fp32": 0, "bf16": 0}
    rows = []
    for w in doc["workloads"]:
        for p in w.get("policies", []):
            if p["precision"] != "bf16" or not p.get("kforge_model"):
                continue
            taken[p["kforge_model"]] += 1
            best = p.get("matched_best_ms")
            cells = {}
            for k in [p["kforge"], *p.get("kforge_variants", [])]:
                side = (k.get("info") or {}).get("model", "fp32")
                ms = _ms(k) if k["status"] == "ok" else None
                if ms and best:
                    sides[side].append(best / ms)
                cells[side] = (f"{_fmt(ms)}" if ms else k["status"]) + \
                    (f" ({best / ms:.2f}x)" if ms and best else "")
            rows.append(f"| {w['name']} | {cells.get('fp32', '–')} | {cells.get('bf16', '–')} | "
                        f"{_fmt(best)} | {p['kforge_model']} |")
    if not rows:
        return []

    def gm(xs):
        return f"{math.exp(sum(math.log(x) for x in xs) / len(xs)):.2f}x over {len(xs)}" \
            if xs else "–"
    return ["", "## bf16: KForge's package of the fp32 model and of the bf16 model", "",
            "Under bf16 KForge has two packages: the fp32 model compiled under the bf16 policy "
            "(fp32 in and out), and the model cast to bf16 (`model.bfloat16()`, bf16 in and out, "
            "as PyTorch's bf16 routes are timed). Each is checked against eager fp32 at 1e-2; "
            "KForge's bf16 result is the faster correct one. Ratios are over the faster correct "
            f"matched route. Geomean where correct: fp32 model {gm(sides['fp32'])}, bf16 model "
            f"{gm(sides['bf16'])}; taken: fp32 model {taken['fp32']}, bf16 model "
            f"{taken['bf16']}.", "",
            "| workload | fp32 model ms | bf16 model ms | matched route ms | taken |",
            "|---|---:|---:|---:|---|", *rows]


def matched_section(doc: dict) -> list[str]:
    """Every matched route of every policy: time, status, error against eager fp32."""
    rows = []
    for w in doc["workloads"]:
        for p in w.get("policies", []):
            for r in p.get("routes") or []:
                head = "**" if r["name"] == p.get("matched_best") else ""
                status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:70]}"
                rows.append(f"| {w['name']} | {p['precision']} | {head}{r['name']}{head} | {_fmt(_ms(r))} | "
                            f"{status} | {_fmt(r.get('max_abs_err'), '.2e')} | "
                            f"{'–' if r.get('allclose') is None else ('yes' if r['allclose'] else 'no')} | "
                            f"{_fmt(r.get('compile_s'), '.1f')} |")
    if not rows:
        return []
    return ["", "## Matched routes", "",
            "What a user would run in PyTorch at each policy's precision (kforge.bench.routes), "
            "each checked against eager fp32 at the policy's tolerance; in bold the faster correct "
            "one, the headline's yardstick. fp32 routes run with TF32 off for matmuls and cuDNN "
            "(`torch.backends.cudnn.allow_tf32 = False`; PyTorch's default is on for "
            "convolutions). bf16 model routes are timed on inputs cast beforehand.", "",
            "| workload | policy | route | ms | status | max abs err vs eager fp32 | allclose | compile s |",
            "|---|---|---|---:|---|---:|---|---:|", *rows]


def contract_section(doc: dict) -> list[str]:
    """strict: KForge's error against a float64 copy of the model, beside eager fp32's own."""
    rows = []
    for w in doc["workloads"]:
        for p in w.get("policies", []):
            c = p.get("strict_contract")
            if not c:
                continue
            if "passes" not in c:
                rows.append(f"| {w['name']} | – | – | – | {c.get('status')}: {c.get('reason', '')[:80]} | – |")
                continue
            allclose = p["kforge"].get("allclose")
            rows.append(f"| {w['name']} | {_fmt(c['eager_fp32_max_err_vs_f64'], '.2e')} | "
                        f"{_fmt(c['kforge_max_err_vs_f64'], '.2e')} | {_fmt(c.get('ratio'), '.2f')} | "
                        f"{'pass' if c['passes'] else 'FAIL (%d elements over)' % c['elements_over_bound']} | "
                        f"{'–' if allclose is None else ('yes' if allclose else 'no')} |")
    if not rows:
        return []
    return ["", "## Strict contract", "",
            "Under strict every element of KForge's result must be within max(2 x eager fp32's "
            "largest error, 4 ulp x |f64|) of a float64 copy of the model on the same inputs "
            "(kforge.verify.contract); KernelBench's rule is torch.allclose(kforge, eager fp32, "
            "atol=rtol=1e-4).", "",
            "| workload | eager fp32 max err vs f64 | kforge max err vs f64 | ratio | contract | KernelBench allclose 1e-4 |",
            "|---|---:|---:|---:|---|---|", *rows]


def goals(doc: dict) -> list[str]:
    """Issue 6's goals, checked against this run (only for full-size runs with both baselines)."""
    summary, cfg = doc["summary"], doc["config"]
    if cfg.get("scale") != "full":
        return []
    rows = []

    def row(goal, value, ok):
        rows.append(f"| {goal} | {value} | {'reached' if ok else 'not reached'} |")

    for policy in cfg["precisions"]:
        s = summary.get(policy, {}).get("all")
        if s:
            row(f"every workload verified ({policy})", f"{s['correct']}/{s['workloads']} correct, "
                f"{s.get('all_regions_on_kernels', 0)} with every region on a kernel",
                s["correct"] == s["workloads"] and s.get("all_regions_on_kernels") == s["workloads"])
    for policy, target in (("strict", 2.0), ("bf16", 8.0)):
        g = summary.get(policy, {}).get("gemm")
        if g:
            gm = g["geomean_speedup"]
            row(f"GEMM suite geomean >= {target:g}x ({policy})", f"{_fmt(gm, '.2f')}x",
                gm is not None and gm >= target)
    for policy in cfg["precisions"]:
        s = summary.get(policy, {}).get("all")
        if s:
            fr = s["geomean_roofline_fraction"]
            row(f"geomean >= 60% of the roofline floor ({policy})",
                f"{_fmt(None if fr is None else 100 * fr, '.0f')}%", fr is not None and fr >= 0.6)
    block = next((w for w in doc["workloads"] if "transformer" in (w.get("tags") or [])), None)
    if block:
        tc = _ms(_baseline(block, "torch.compile"))
        for p in block.get("policies", []):
            k = _ms(p["kforge"]) if p["kforge"]["status"] == "ok" else None
            row(f"transformer block faster than torch.compile ({p['precision']})",
                f"kforge {_fmt(k)} ms vs torch.compile {_fmt(tc)} ms",
                k is not None and tc is not None and k < tc)
    # issue 13: against the faster correct matched route
    for policy, target in (("bf16", 1.15), ("tf32", 1.10)):
        s = summary.get(policy, {}).get("all")
        if s and "vs_matched" in s:
            gm = s["vs_matched"]["geomean_speedup"]
            row(f"geomean >= {target:g}x vs the faster correct matched route ({policy})",
                f"{_fmt(gm, '.2f')}x over {s['vs_matched']['correct']} of {s['workloads']}",
                gm is not None and gm >= target)
    s = summary.get("bf16", {}).get("all")
    if s:
        row("100% within 1e-2 (bf16)", f"{s['correct']}/{s['workloads']}", s["correct"] == s["workloads"])
    s = summary.get("strict", {}).get("all")
    if s:
        gm = s["geomean_speedup"]
        row("geomean >= 4.5x over fp32 eager/compile (strict)", f"{_fmt(gm, '.2f')}x",
            gm is not None and gm >= 4.5)
        if "strict_contract_passed" in s:
            row("every workload passes the strict contract", f"{s['strict_contract_passed']}/{s['workloads']}",
                s["strict_contract_passed"] == s["workloads"])
    for goal, value, ok in llm_goals(doc):
        row(goal, value, ok)
    if not rows:
        return []
    return ["## Goals (issues 6, 12 and 13)", "", "| goal | measured | |", "|---|---|---|", *rows, ""]


# ---------------------------------------------------------------- plot

def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [w["name"] for w in doc["workloads"]]
    policies = doc["config"]["precisions"]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.3 * len(names) + 4), 10),
                             sharex=True)
    width = 0.8 / max(1, len(policies))
    for j, policy in enumerate(policies):
        sp, fr = [], []
        for w in doc["workloads"]:
            p = next((p for p in w.get("policies", []) if p["precision"] == policy), None)
            sp.append(p["speedup"] if p and p.get("speedup") else 0.0)
            fr.append(100 * p["roofline_fraction"] if p and p.get("roofline_fraction")
                      and p["kforge"]["status"] == "ok" else 0.0)
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(names))]
        s = doc["summary"][policy]["all"]
        label = f"{policy} (geomean {_fmt(s['geomean_speedup'], '.2f')}x, fast_1 {_fmt(s['fast_p']['1'], '.2f')})"
        axes[0].bar(xs, sp, width, label=label)
        axes[1].bar(xs, fr, width, label=policy)
    base = [100 * w["baseline_roofline_fraction"] if w.get("baseline_roofline_fraction") else 0.0
            for w in doc["workloads"]]
    axes[1].plot(range(len(names)), base, "k.", label="faster baseline, % of fp32 floor")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("speedup over faster of eager / torch.compile\n(0 = incorrect or missing)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.002, 1.0))
    axes[1].axhline(100, color="k", lw=0.8, ls="--")
    axes[1].set_ylabel("% of roofline floor (policy peaks)")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.002, 1.0))
    axes[1].set_xticks(range(len(names)))
    axes[1].set_xticklabels(names, rotation=75, ha="right", fontsize=7)
    env = doc["environment"]
    fig.suptitle(f"KForge bench — {env.get('hardware')} — {env.get('date')} — torch {env.get('torch')}, "
                 f"triton {env.get('triton')} — sizes {doc['config']['scale']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_all(doc: dict, out_dir: Path, stem: str = "bench") -> dict[str, Path]:
    """Write STEM.json, STEM.md and STEM.png into out_dir; the plot is skipped (with a note in
    the Markdown) only when matplotlib is missing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    md = markdown(doc)
    try:
        plot(doc, paths["png"])
        md += f"\n![speedup and roofline fraction]({paths['png'].name})\n"
    except ImportError as exc:
        md += f"\n(no plot: {exc}; `pip install matplotlib`)\n"
        del paths["png"]
    paths["md"].write_text(md)
    return paths


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


if __name__ == "__main__":   # python -m kforge.bench.report --digest
    print(source_digest())
