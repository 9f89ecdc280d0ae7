"""`kforge import` and `kforge regions`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kforge.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import", help="lower a PyTorch model to linalg-on-tensors MLIR (weights as arguments)",
        description="Lower a PyTorch model through torch-mlir to linalg-on-tensors MLIR 22. "
                    "Parameters and buffers become arguments of @main tagged "
                    "{kforge.weight = NAME}; their values go to a safetensors file beside the IR.")
    p.add_argument("model", help="a KernelBench-format file (Model, get_inputs, "
                                 "get_init_inputs) or an import path 'pkg.module:Class'")
    p.add_argument("-o", "--output", type=Path, default=Path("model.mlir"),
                   help="the .mlir file to write (weights go to <stem>.safetensors beside it; "
                        "default: model.mlir)")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="make dimension 0 of every input dynamic")
    p.add_argument("--print", action="store_true", dest="print_ir",
                   help="print the IR to stdout (the summary then goes to stderr)")
    p.set_defaults(func=run_import)

    p = subparsers.add_parser(
        "regions", help="cut an imported model into fusion regions with kforge-opt",
        description="Run kforge-opt's region pipeline on a module: print linalg statistics and, "
                    "where kforge-opt can export them, write each fusion region's IR and kernel "
                    "spec into the output directory.")
    p.add_argument("mlir", type=Path, help="a linalg-on-tensors module, e.g. from `kforge import`")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="directory for the regions (default: regions/ beside the module)")
    p.set_defaults(func=run_regions)


def run_import(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kforge.frontend.importer import import_model

    console = Console(stderr=args.print_ir)    # with --print, stdout holds only the IR
    start = time.perf_counter()
    with console.status(f"importing {args.model} through torch-mlir ..."):
        result = import_model(args.model, args.output, dynamic_batch=args.dynamic_batch)
    seconds = time.perf_counter() - start
    if args.print_ir:      # plain text: IR lines must not be cropped or wrapped
        sys.stdout.write(result.mlir_path.read_text())
        sys.stdout.flush()
    console.print(f"[bold]{args.model}[/bold] → {result.mlir_path}")
    table = Table()
    table.add_column("argument")
    table.add_column("kind")
    table.add_column("shape")
    table.add_column("dtype")
    for name, shape, dtype in zip(result.input_names, result.input_shapes, result.input_dtypes):
        table.add_row(name, "input", _shape(shape), dtype)
    weights_shown = 12
    for name, shape, dtype in list(zip(result.weight_names, result.weight_shapes,
                                       result.weight_dtypes))[:weights_shown]:
        table.add_row(name, "weight", _shape(shape), dtype)
    if len(result.weight_names) > weights_shown:
        table.add_row(f"... {len(result.weight_names) - weights_shown} more", "weight", "", "")
    for i, (shape, dtype) in enumerate(zip(result.output_shapes, result.output_dtypes)):
        table.add_row(f"result {i}", "output", _shape(shape), dtype)
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"wrote {result.mlir_path} ({_size(result.mlir_path.stat().st_size)}) and "
                  f"{result.weights_path} ({len(result.weight_names)} tensors, "
                  f"{_size(result.weight_bytes)}) in {seconds:.1f} s")
    return 0


def run_regions(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kforge.frontend.regions import (form_regions, read_region_specs, region_stats,
                                         supports_region_export)

    console = Console()
    if not args.mlir.is_file():
        raise UserError(f"{args.mlir}: no such file (create one with `kforge import`)")
    with console.status(f"kforge-opt: linalg statistics of {args.mlir} ..."):
        stats = region_stats(args.mlir)
    for s in stats:
        console.print(f"[bold]@{s.function}[/bold] in {args.mlir}: {s.linalg_ops} linalg ops "
                      f"({_n(s.contractions, 'contraction')}, {_n(s.convolutions, 'convolution')}, "
                      f"{_n(s.reductions, 'reduction')}, {s.elementwise} elementwise), "
                      f"~{_flops(s.flops)}")
        table = Table()
        table.add_column("linalg op")
        table.add_column("count", justify="right")
        for name, count in s.ops:
            table.add_row(name, str(count))
        console.print(table)
    if not stats:
        console.print(f"{args.mlir} has no linalg ops")

    if not supports_region_export():
        console.print("[yellow]this kforge-opt cannot form and export regions yet; "
                      "showing the linalg statistics only[/yellow]")
        return 0
    out_dir = args.output or args.mlir.parent / "regions"
    with console.status(f"kforge-opt: forming and exporting regions into {out_dir} ..."):
        form_regions(args.mlir, out_dir)
    specs = read_region_specs(out_dir)
    console.print(f"[bold]{_n(len(specs), 'fusion region')}[/bold] in {out_dir} "
                  "(<hash>.mlir, <hash>.json, host_plan.json)")
    table = Table()
    table.add_column("region", no_wrap=True, min_width=16)
    table.add_column("root", no_wrap=True)
    for column in ("args (weights)", "FLOP", "min bytes"):
        table.add_column(column, justify="right", no_wrap=True)
    for spec in specs:
        args_ = spec.get("args", [])
        weights = sum(1 for a in args_ if a.get("weight"))
        table.add_row(spec.get("hash", "?"), spec.get("root_kind", "?"),
                      f"{len(args_)} ({weights})", _flops(spec.get("flops", 0)),
                      _size(spec.get("min_bytes", 0)))
    console.print(table)
    for spec in specs:      # below the table: these lists are long
        console.print(f"{spec.get('hash', '?')}: {' + '.join(spec.get('fused', []))}")
    _print_fallbacks(console, out_dir)
    return 0


def _print_fallbacks(console, out_dir: Path) -> None:
    """The ops outside every region that PyTorch runs (docs/fallback-ops.md), by aten name."""
    from collections import Counter

    from kforge.spec import FallbackOp, load_host_plan
    plan_path = Path(out_dir) / "host_plan.json"
    if not plan_path.is_file():
        return
    names = Counter(s.name for s in load_host_plan(plan_path).steps
                    if isinstance(s, FallbackOp))
    if names:
        listed = ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in names.most_common())
        console.print(f"[bold]{_n(sum(names.values()), 'fallback op')}[/bold] (run by PyTorch; "
                      f"attention gets a kernel at compile time): {listed}")


def _shape(shape) -> str:
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _flops(n: int) -> str:
    for unit in ("FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP"):
        if n < 1000 or unit == "TFLOP":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} FLOP"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
