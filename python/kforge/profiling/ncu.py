"""Nsight Compute: the fixed metric set, the command line, and the parser of its CSV.

ncu runs with `--clock-control none` (the card's clocks are left as they are, as the device
rules ask), `--profile-from-start off` (only the launches the worker puts between
cudaProfilerStart and cudaProfilerStop) and `--csv --page raw --print-units base`: one row a
kernel, one column a metric, a second row of units. The parser also reads the `details` page
(one row a metric), which is what `ncu --csv` prints without `--page raw`.
"""
from __future__ import annotations

import csv
import io
import re
import shutil

from kforge.profiling.schema import KernelCounters

# field of KernelCounters -> ncu metric (sm_70 and later; sm_90 names the tensor pipe so)
METRICS = {
    "time": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes": "dram__bytes.sum",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
}
# older chips and tools name the tensor pipe differently
ALTERNATIVES = {"tensor_pct": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",)}
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle",
                 "math_pipe_throttle", "wait", "not_selected", "no_instruction", "dispatch_stall",
                 "membar", "branch_resolving", "sleeping", "drain", "imc_miss", "misc")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TOP_STALLS = 3


def metric_names() -> list[str]:
    return list(METRICS.values()) + [STALL_METRIC.format(r) for r in STALL_REASONS]


def ncu_path() -> str | None:
    return shutil.which("ncu")


def command(ncu: str, metrics: list[str], log_file: str, program: list[str]) -> list[str]:
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv",
            "--page", "raw", "--print-units", "base", "--metrics", ",".join(metrics),
            "--log-file", log_file, *program]


_UNKNOWN = re.compile(r"[Ff]ailed to find metric[s]?\s*:?\s*(\S+)")


def unknown_metrics(log_text: str) -> list[str]:
    """Metric names ncu says it does not know (`==ERROR== Failed to find metric X`), so the
    collector can run again without them."""
    out = []
    for m in _UNKNOWN.finditer(log_text):
        out.extend(n.strip("\"',") for n in m.group(1).split(",") if n.strip("\"',"))
    return out


_SCALE = {"": 1.0, "%": 1.0, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9,
          "tbyte": 1e12, "nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3,
          "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
_TIME_UNITS = {"nsecond", "ns", "usecond", "us", "msecond", "ms", "second", "s"}


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _value(raw: str, unit: str) -> float | None:
    """A metric value in the schema's units: times in ms, bytes in bytes, percentages as is."""
    v = _number(raw)
    if v is None:
        return None
    u = (unit or "").strip().lower()
    return v * _SCALE.get(u, 1.0)


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV lines of an ncu log (the lines that start with a quote), as rows."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_csv(text: str) -> list[KernelCounters]:
    """KernelCounters per profiled kernel launch, from ncu's CSV (raw or details page)."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_details(header, rows[1:])
    return _parse_raw(header, rows[1:])


def _parse_raw(header: list[str], rows: list[list[str]]) -> list[KernelCounters]:
    units: list[str] = [""] * len(header)
    if rows and not rows[0][0].strip().isdigit():    # the units row: "", "", ..., "nsecond"
        units, rows = rows[0], rows[1:]
    out = []
    for row in rows:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        metrics = {}
        wanted = set(metric_names()) | {m for alts in ALTERNATIVES.values() for m in alts}
        for name, raw, unit in zip(header, row, units):
            if name in wanted:
                metrics[name] = (raw, unit)
        out.append(_counters(cells.get("Kernel Name", "?"), metrics))
    return out


def _parse_details(header: list[str], rows: list[list[str]]) -> list[KernelCounters]:
    launches: dict[str, dict] = {}
    names: dict[str, str] = {}
    for row in rows:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        key = cells.get("ID", "0")
        names[key] = cells.get("Kernel Name", "?")
        launches.setdefault(key, {})[cells["Metric Name"]] = (cells["Metric Value"],
                                                              cells.get("Metric Unit", ""))
    return [_counters(names[k], m) for k, m in launches.items()]


def _counters(name: str, metrics: dict[str, tuple[str, str]]) -> KernelCounters:
    raw = {}
    for metric, (value, unit) in metrics.items():
        v = _value(value, unit)
        if v is not None:
            raw[metric] = v
    fields = {}
    for field, metric in METRICS.items():
        candidates = (metric,) + ALTERNATIVES.get(field, ())
        fields[field] = next((raw[m] for m in candidates if m in raw), None)
    time_unit = (metrics.get(METRICS["time"], ("", ""))[1] or "").strip().lower()
    time_ms = fields.pop("time")
    if time_ms is not None and time_unit not in _TIME_UNITS:
        time_ms *= 1e-6         # ncu's base unit for durations is the nanosecond
    stalls = []
    for reason in STALL_REASONS:
        v = raw.get(STALL_METRIC.format(reason))
        if v is not None and v > 0:
            stalls.append((reason, round(v, 3)))
    stalls.sort(key=lambda s: -s[1])
    return KernelCounters(name=_short_name(name), time_ms=time_ms,
                          top_stalls=tuple(stalls[:TOP_STALLS]), raw=raw, **fields)


def _short_name(name: str) -> str:
    """`void foo<...>(args)` -> `foo`: Triton kernels are plain C symbols anyway."""
    name = name.strip()
    name = re.sub(r"^void\s+", "", name)
    return re.split(r"[(<]", name, maxsplit=1)[0].strip() or name
