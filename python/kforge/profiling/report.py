"""A profile in words and tables: for the agents' prompts and for `kforge profile`."""
from __future__ import annotations

from kforge.profiling.schema import Profile


def _pct(x):
    return "?" if x is None else f"{x:.0f}%"


def kernel_line(k) -> str:
    code = [n for n, on in (("wgmma", k.wgmma), ("mma.sync", k.mma_sync), ("TMA", k.tma),
                            ("DPAS", k.dpas)) if on]
    loads = f", widest global load {k.max_load_bytes} B {dict(k.load_widths)}" \
        if k.max_load_bytes else ""
    return (f"{k.name}: {k.n_regs if k.n_regs is not None else '?'} registers a thread, "
            f"{k.n_spills if k.n_spills is not None else '?'} spilled, shared "
            f"{k.shared_bytes if k.shared_bytes is not None else '?'} B, "
            f"{k.num_warps} warps, {k.num_stages} stages; "
            f"{', '.join(code) if code else 'no matrix instructions'}{loads}")


def counters_line(c) -> str:
    stalls = ", ".join(f"{r} {v:.2g}" for r, v in c.top_stalls)
    t = f"{c.time_ms:.4g} ms" if c.time_ms is not None else "? ms"
    if c.dram_pct is None and c.tensor_pct is None:
        return f"{c.name}: {t} a launch"
    return (f"{c.name}: {t}; DRAM {_pct(c.dram_pct)} of peak, L2 {_pct(c.l2_pct)}, tensor pipe "
            f"{_pct(c.tensor_pct)}, SM {_pct(c.sm_pct)}, achieved occupancy "
            f"{_pct(c.occupancy_pct)}, L2 hit rate {_pct(c.l2_hit_pct)}"
            + (f"; top warp stalls (cycles per issued instruction): {stalls}" if stalls else ""))


def summarize(profile: Profile) -> str:
    """The profile's numbers as short lines (what an analyst cites)."""
    lines = []
    t = profile.timing
    if t is not None:
        spread = f", p20-p80 {t.p20_ms:.4g}-{t.p80_ms:.4g} ms" if t.p20_ms and t.p80_ms else ""
        lines.append(f"time: median {t.median_ms:.4g} ms{spread}"
                     + (f" (noise {t.noise:.1%})" if t.noise is not None else ""))
    r = profile.roofline
    if r is not None:
        lines.append(f"roofline: {r.achieved_flops_per_s / 1e12:.3g} TFLOP/s "
                     f"({r.flops_fraction:.0%} of the {profile.precision} peak "
                     f"{r.peak_flops_per_s / 1e12:.3g}), {r.achieved_bytes_per_s / 1e9:.4g} GB/s "
                     f"({r.bytes_fraction:.0%} of {r.peak_bytes_per_s / 1e9:.4g}); "
                     f"{r.intensity or 0:.1f} FLOP/B against a ridge of {r.ridge:.0f}: "
                     f"{r.bound}-bound; floor {r.floor_ms:.4g} ms ({r.floor_fraction:.0%} of "
                     "the measured time)" + (f"; {r.note}" if r.note else ""))
    for k in profile.kernels:
        lines.append("kernel " + kernel_line(k))
    for c in profile.counters:
        lines.append("counters " + counters_line(c))
    for name, s in sorted(profile.sources.items()):
        if not s.present:
            lines.append(f"absent: {name}: {s.detail}")
    return "\n".join(lines)


def for_prompt(profile_json: dict) -> dict:
    """The profile JSON without what only bulks a prompt (every raw ncu metric)."""
    out = dict(profile_json)
    out["counters"] = [{k: v for k, v in c.items() if k != "raw"}
                       for c in profile_json.get("counters") or ()]
    return out


# --- `kforge profile PKG`: the package's table, its roofline plot, report.md's section -------

def profile_row(h: str, profile: Profile, recs: tuple[str, ...]) -> dict:
    """One kernel's line of the package's profile table (JSON-able)."""
    r, k, c = profile.roofline, profile.main_kernel(), profile.main_counters()
    ranked = [x for x in recs if x[:1].isdigit()]
    return {
        "region": h, "candidate": profile.candidate_id,
        "time_ms": profile.time_ms,
        "tflops": r.achieved_flops_per_s / 1e12 if r else None,
        "flops_pct": 100 * r.flops_fraction if r else None,
        "gbs": r.achieved_bytes_per_s / 1e9 if r else None,
        "bytes_pct": 100 * r.bytes_fraction if r else None,
        "intensity": r.intensity if r else None, "bound": r.bound if r else None,
        "floor_pct": 100 * r.floor_fraction if r else None,
        "regs": k.n_regs if k else None, "spills": k.n_spills if k else None,
        "shared": k.shared_bytes if k else None,
        "code": ",".join(n for n, on in (("wgmma", k.wgmma), ("tma", k.tma), ("dpas", k.dpas))
                         if on) if k else "",
        "dram_pct": c.dram_pct if c else None, "tensor_pct": c.tensor_pct if c else None,
        "occupancy_pct": c.occupancy_pct if c else None,
        "absent": {n: s.detail for n, s in profile.sources.items() if not s.present},
        "recommendations": list(recs), "top": ranked[0] if ranked else (recs[0] if recs else ""),
        "peak_flops": r.peak_flops_per_s if r else None,
        "peak_bytes": r.peak_bytes_per_s if r else None,
    }


def _f(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


TABLE_COLUMNS = ("region", "ms", "TFLOP/s (% peak)", "GB/s (% peak)", "bound", "floor %",
                 "regs/spills", "smem KB", "code", "DRAM/tensor %", "top recommendation")


def table_cells(row: dict) -> list[str]:
    counters = "—" if row["dram_pct"] is None else \
        f"{row['dram_pct']:.0f}/{_f(row['tensor_pct'], '.0f')}"
    return [row["region"], _f(row["time_ms"], ".4g"),
            f"{_f(row['tflops'], '.3g')} ({_f(row['flops_pct'], '.0f')}%)",
            f"{_f(row['gbs'], '.4g')} ({_f(row['bytes_pct'], '.0f')}%)",
            row["bound"] or "—", _f(row["floor_pct"], ".0f"),
            f"{_f(row['regs'], 'd')}/{_f(row['spills'], 'd')}",
            _f(row["shared"] / 1024 if row["shared"] is not None else None, ".0f"),
            row["code"] or "—", counters, row["top"][:90]]


def roofline_png(rows: list[dict], path, title: str) -> str:
    """The package's kernels on the roofline (log-log: FLOP/byte against FLOP/s), with the
    policy's peaks. Returns what happened, in words (matplotlib may be missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("matplotlib is not installed: no roofline plot written "
                "(pip install matplotlib, then run `kforge profile` again)")
    pts = [r for r in rows if r.get("intensity") and r.get("tflops")]
    if not pts:
        return "no kernel has a timing and a FLOP count: no roofline plot written"
    peak_f, peak_b = pts[0]["peak_flops"], pts[0]["peak_bytes"]
    lo = min(min(r["intensity"] for r in pts) / 4, peak_f / peak_b / 16)
    hi = max(max(r["intensity"] for r in pts) * 4, peak_f / peak_b * 16)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak_f, x * peak_b) / 1e12 for x in xs], color="black", lw=1.5,
            label=f"roofline: {peak_f / 1e12:.3g} TFLOP/s, {peak_b / 1e12:.3g} TB/s")
    for r in pts:
        ax.scatter([r["intensity"]], [r["tflops"]], s=30)
        ax.annotate(r["region"][:8], (r["intensity"], r["tflops"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, least traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"roofline plot: {path}"


def profile_markdown(section: dict | None) -> list[str]:
    """report.md's section for `kforge profile`'s results (empty when it has not run)."""
    if not section:
        return []
    lines = ["", "## Kernel profiles (`kforge profile`)", "",
             f"{section.get('when', '')}; {section.get('plot_note', '')}", ""]
    if section.get("plot"):
        lines += [f"![roofline]({section['plot']})", ""]
    lines += ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in section.get("rows", []):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in table_cells(row)) + " |")
    absent = sorted({f"{n}: {d}" for row in section.get("rows", [])
                     for n, d in row.get("absent", {}).items()})
    if absent:
        lines += ["", "Absent sources: " + "; ".join(absent)]
    return lines
