"""`kforge` command line. Each stage registers its own subcommands; this file only assembles them.

Modules listed in COMMAND_MODULES define `register(subparsers)`, which adds parsers whose
`func(args) -> int` runs the command. Heavy imports (torch-mlir, triton) happen inside the
commands, so `kforge run` works where MLIR and torch-mlir are not installed.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from kforge.errors import UserError

COMMAND_MODULES = (
    "kforge.frontend.commands",   # import, regions
    "kforge.commands",            # compile, synth, run, tune
    "kforge.bench.commands",      # bench
    "kforge.profiling.commands",  # profile
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge",
        description="Compile PyTorch models into verified Triton kernels through MLIR fusion regions.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):  # stage absent
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"kforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__name__ != "OutOfMemoryError":     # torch's, without importing torch
            raise
        text = str(exc).strip().splitlines()
        print(f"kforge {args.command}: error: the device ran out of memory "
              f"({text[0] if text else type(exc).__name__}). Work finished before it is kept; "
              "free the device of other work, run fewer jobs at once, or use a smaller shape",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kforge {args.command}: interrupted; finished work is kept and reused next time",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
