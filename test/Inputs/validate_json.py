"""Validates JSON files against docs/kernel-spec.schema.json (needs the jsonschema package).

Usage: python validate_json.py SCHEMA FILE...   Prints `valid NAME` per file; exits 1 on the
first invalid file with the validator's message.
"""
import json
import os
import sys

import jsonschema

with open(sys.argv[1]) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
for path in sys.argv[2:]:
    with open(path) as f:
        doc = json.load(f)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        print(f"invalid {os.path.basename(path)}: {errors[0].message} at "
              f"{list(errors[0].absolute_path)}")
        sys.exit(1)
    print(f"valid {os.path.basename(path)}")
