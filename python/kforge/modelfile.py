"""Reading a KernelBench-format model file (`Model`, `get_inputs()`, `get_init_inputs()`) the
way the frontend does: the model and its inputs under a fixed seed. Needs only torch."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

from kforge.errors import UserError


def load_model_file(path: str | os.PathLike, *, with_model: bool = True, seed: int = 0):
    """A KernelBench-format file: (Model(*get_init_inputs()) or None, get_inputs()), both under
    torch.manual_seed(seed), as the frontend does when it imports the file."""
    path = Path(path)
    name = f"kforge_user_model_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # registered, so that tools that look a class's module up again (torch.compile) find it
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserError(f"{path}: could not be loaded: {exc}") from exc
    model = None
    if with_model:
        init = getattr(module, "get_init_inputs", lambda: [])()
        torch.manual_seed(seed)
        model = module.Model(*init).eval()
    torch.manual_seed(seed)
    inputs = list(module.get_inputs())
    return model, inputs


__all__ = ["load_model_file"]
