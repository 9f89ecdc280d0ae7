"""Turning what the user names into a model and example inputs.

A source is an `nn.Module` instance, an import path `"pkg.module:Class"`, or a KernelBench-format
file (`Model`, `get_inputs()`, `get_init_inputs()`). Every failure here is the user's to fix, so
each becomes a `UserError` that names the file, the line when there is one, and what to do.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import torch
from torch import nn

from kforge.errors import UserError

FORMAT_HINT = ("a KernelBench-format file defines `class Model(nn.Module)`, "
               "`get_inputs()` (example inputs) and `get_init_inputs()` (constructor arguments)")


@dataclass(frozen=True)
class LoadedModel:
    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    origin: str          # for messages: the file or import path, or the module's class name


def load_model(source: Any, example_inputs: Sequence[torch.Tensor] | None = None,
               *, seed: int = 0) -> LoadedModel:
    """Resolves `source` to a model and its example inputs.

    Models built here (from a class) are put in eval mode; parameters and `get_inputs()` are
    drawn under `torch.manual_seed(seed)` in a private RNG, so importing the same file twice gives
    the same weights. An `nn.Module` the caller passes is left as it is.
    """
    if isinstance(source, nn.Module):
        if example_inputs is None:
            raise UserError(f"{type(source).__name__}: an nn.Module instance needs example_inputs "
                            "(a tuple of tensors with the shapes and dtypes to compile for)")
        model, origin, py_module = source, type(source).__name__, None
    else:
        text = str(source)
        file_part, sep, variant = text.partition("::")
        if sep and file_part.endswith(".py") and Path(file_part).is_file():
            raise UserError(_variant_hint(Path(file_part), variant))
        if text.endswith(".py") or Path(text).is_file():
            py_module, origin = _load_file(Path(text)), text
            model_cls = getattr(py_module, "Model", None)
            if model_cls is None:
                raise UserError(f"{text}: no `Model` class found; {FORMAT_HINT}")
        elif ":" in text:
            module_name, _, attr = text.partition(":")
            py_module, origin = _import_module(module_name, text), text
            model_cls = getattr(py_module, attr, None)
            if model_cls is None:
                raise UserError(f"{text}: module {module_name!r} has no attribute {attr!r}")
        else:
            raise UserError(f"{text!r} is neither a .py file nor an import path 'pkg.module:Class'")
        # A private RNG: the same weights and inputs every time, the caller's RNG untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if isinstance(model_cls, nn.Module):
                model = model_cls
            elif inspect.isclass(model_cls) and issubclass(model_cls, nn.Module):
                init_inputs = _call_hook(py_module, "get_init_inputs", origin,
                                         required=False) or []
                model = _guarded(origin, f"{model_cls.__name__}(*get_init_inputs())",
                                 lambda: model_cls(*init_inputs))
                model.eval()
            else:
                raise UserError(f"{origin}: `{getattr(model_cls, '__name__', model_cls)}` is "
                                f"not an nn.Module subclass; {FORMAT_HINT}")
            if example_inputs is None:
                torch.manual_seed(seed)
                example_inputs = _call_hook(py_module, "get_inputs", origin, required=True)
    inputs = tuple(example_inputs)
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise UserError(f"{origin}: example input {i} is a {type(value).__name__}; "
                            "only tensor inputs are supported (make scalars constructor arguments)")
    return LoadedModel(model, inputs, _input_names(model, len(inputs)), origin)


def _variant_hint(path: Path, variant: str) -> str:
    """The message for `FILE.py::VARIANT` outside `kforge bench`: what to set instead."""
    try:
        variants = getattr(_load_file(path), "VARIANTS", None) or {}
    except UserError:
        variants = {}
    env = variants.get(variant) if isinstance(variants, dict) else None
    if isinstance(env, dict) and env:
        how = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        return (f"{path}::{variant}: `FILE.py::VARIANT` selects a variant in `kforge bench` "
                f"only; here set the variant's environment instead: `{how} kforge ... {path}`")
    known = ", ".join(sorted(variants)) if isinstance(variants, dict) else ""
    return (f"{path}::{variant}: `FILE.py::VARIANT` selects a variant in `kforge bench` only, "
            + (f"and {path} has no variant {variant!r} (it has {known})" if known else
               f"and {path} defines no VARIANTS") + f"; name the file alone: {path}")


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"kforge_user_model_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UserError(f"{exc.filename or path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserError(f"{path}: failed to import: {_describe(exc, path)}") from None
    return module


def _import_module(module_name: str, text: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(f"{text}: cannot import {exc.name!r} "
                        "(is it installed, or on PYTHONPATH?)") from None
    except SyntaxError as exc:
        raise UserError(f"{exc.filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        raise UserError(f"{text}: importing {module_name!r} failed: {_describe(exc)}") from None


def _call_hook(module: ModuleType | None, hook: str, origin: str, *, required: bool):
    fn = getattr(module, hook, None) if module is not None else None
    if fn is None:
        if required:
            raise UserError(f"{origin}: no `{hook}()` function; {FORMAT_HINT} "
                            "(or pass example_inputs)")
        return None
    result = _guarded(origin, f"{hook}()", fn)
    if isinstance(result, torch.Tensor):
        return [result]
    if not isinstance(result, (list, tuple)):
        raise UserError(f"{origin}: `{hook}()` returned {type(result).__name__}; expected a list")
    return list(result)


def _guarded(origin: str, what: str, fn):
    try:
        return fn()
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{origin}: {what} raised {_describe(exc)}") from None


def _describe(exc: BaseException, path: Path | None = None) -> str:
    """`Type: message` plus the innermost frame in the user's file, when there is one."""
    where = ""
    own = str(Path(__file__).parent)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(own)]       # the user's frames, not the frontend's
    if path is not None:
        frames = [f for f in frames if Path(f.filename) == path] or frames
    if frames:
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


def _input_names(model: nn.Module, count: int) -> tuple[str, ...]:
    """Names of forward's parameters, for messages and the import summary."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
    names += [f"input{i}" for i in range(len(names), count)]
    return tuple(names)
