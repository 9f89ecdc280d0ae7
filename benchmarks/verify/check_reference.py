"""The float64 reference of each benchmarks/verify region computed in slices (the default: a
large contraction's operands widened a block of the output at a time, large elementwise ops a
slice at a time) and whole, on the GPU: the largest difference between the two, against the
reference's largest magnitude (float64 rounding, ~1e-16, is the expectation), and each one's
peak device memory over the region's bytes (inputs + weights + outputs).

    PYTHONPATH=python python3 benchmarks/verify/check_reference.py [--out DIR] [SPEC.json ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "python"))


def _measure(spec, inputs, sliced: bool):
    import torch

    import kforge.reference as reference
    saved = reference._MAX_WIDENED_BYTES, reference._MAX_DOMAIN_POINTS
    if not sliced:
        reference._MAX_WIDENED_BYTES = reference._MAX_DOMAIN_POINTS = 1 << 62
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        outs = reference.reference_fn(spec, torch.float64)(*inputs)
        torch.cuda.synchronize()
        return outs, int(torch.cuda.max_memory_allocated())
    finally:
        reference._MAX_WIDENED_BYTES, reference._MAX_DOMAIN_POINTS = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args(argv)
    import torch

    from kforge.spec import load_spec
    from kforge.verify.inputs import make_inputs, signature_of
    if not torch.cuda.is_available():
        print("check_reference: no CUDA device here", file=sys.stderr)
        return 2
    rows = []
    for path in args.specs or sorted((HERE / "specs").glob("*.json")):
        spec = load_spec(path)
        inputs = make_inputs(signature_of(spec), 1, 8, device="cuda")
        region = int(spec.min_bytes)
        sliced, peak_sliced = _measure(spec, inputs, True)
        sliced = [o.cpu() for o in sliced]
        whole, peak_whole = _measure(spec, inputs, False)
        diff = max(float((a.cuda() - b).abs().max()) for a, b in zip(sliced, whole))
        scale = max(float(b.abs().max()) for b in whole)
        row = {"region": spec.hash, "max_abs_diff": diff, "max_abs_ref": scale,
               "relative": diff / scale if scale else 0.0,
               "peak_over_region_sliced": round(peak_sliced / region, 2),
               "peak_over_region_whole": round(peak_whole / region, 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sliced, whole, inputs
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reference.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
