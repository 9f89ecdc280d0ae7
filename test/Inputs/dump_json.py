"""Prints JSON files one fact per line, for FileCheck: `key: value` for top-level fields and
`key[i]: value` for each element of the list fields, all compact with sorted keys.

Usage: python dump_json.py FILE...   (files in the order given; each starts with `== NAME`)
"""
import json
import os
import sys

LISTS = ("args", "values", "ops", "inputs", "steps")


def compact(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


for path in sys.argv[1:]:
    with open(path) as f:
        doc = json.load(f)
    print(f"== {os.path.basename(path)}")
    for key in sorted(doc):
        if key in LISTS and isinstance(doc[key], list):
            for i, item in enumerate(doc[key]):
                print(f"{key}[{i}]: {compact(item)}")
        else:
            print(f"{key}: {compact(doc[key])}")
