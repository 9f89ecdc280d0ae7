"""Loads exported files with the Python half's reader (kforge.spec), as the runtime will.

Usage: python read_with_python.py FILE...   Prints one summary line per file.
"""
import os
import sys

from kforge.spec import load_host_plan, load_spec

for path in sys.argv[1:]:
    name = os.path.basename(path)
    if name.startswith("host_plan"):
        plan = load_host_plan(path)
        print(f"plan {plan.function}: {len(plan.inputs)} inputs, {len(plan.steps)} steps, "
              f"{len(plan.outputs)} outputs")
    else:
        spec = load_spec(path)
        print(f"spec {spec.hash} {spec.root_kind}: {len(spec.args)} args, {len(spec.ops)} ops, "
              f"{len(spec.results)} results")
