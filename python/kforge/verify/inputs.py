"""Region signatures and the random inputs verification feeds a candidate.

This module imports only torch: the sandboxed worker uses it too, before the candidate is loaded,
so that the parent and the worker derive identical inputs from a seed without shipping tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TORCH_DTYPES = {
    "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
    "i1": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
    "i64": torch.int64, "index": torch.int64,
}


@dataclass(frozen=True)
class TensorSig:
    """One argument or result of a region: its shape (None = dynamic), dtype and weight name."""
    name: str
    shape: tuple
    dtype: str
    weight: str | None = None

    def concrete(self, dynamic_size: int) -> tuple[int, ...]:
        return tuple(dynamic_size if d is None else int(d) for d in self.shape)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "weight": self.weight}

    @staticmethod
    def from_json(d: dict) -> "TensorSig":
        return TensorSig(d["name"], tuple(d["shape"]), d["dtype"], d.get("weight"))


@dataclass(frozen=True)
class Signature:
    args: tuple[TensorSig, ...]
    results: tuple[TensorSig, ...]

    @property
    def is_dynamic(self) -> bool:
        return any(d is None for t in self.args + self.results for d in t.shape)

    @property
    def weight_indices(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.args) if a.weight)

    def to_json(self) -> dict:
        return {"args": [a.to_json() for a in self.args],
                "results": [r.to_json() for r in self.results]}

    @staticmethod
    def from_json(d: dict) -> "Signature":
        return Signature(tuple(TensorSig.from_json(a) for a in d["args"]),
                         tuple(TensorSig.from_json(r) for r in d["results"]))


def _field(obj, key):
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


def signature_of(spec) -> Signature:
    """The region's arguments and results, from a `kforge.spec.KernelSpec` (or its JSON dict)."""
    args = tuple(TensorSig(_field(a, "name"), tuple(_field(a, "shape")), _field(a, "dtype"),
                           (a.get("weight") if isinstance(a, dict) else getattr(a, "weight", None)))
                 for a in _field(spec, "args"))
    tensors = {t.name: t for t in args}
    for v in _field(spec, "values"):
        tensors[_field(v, "name")] = TensorSig(_field(v, "name"), tuple(_field(v, "shape")),
                                               _field(v, "dtype"))
    results = []
    for name in _field(spec, "results"):
        if name not in tensors:
            raise ValueError(f"region result {name!r} is neither an argument nor a value")
        t = tensors[name]
        results.append(TensorSig(t.name, t.shape, t.dtype))
    return Signature(args, tuple(results))


def make_inputs(sig: Signature, seed: int, dynamic_size: int,
                domain: str = "mixed") -> list[torch.Tensor]:
    """Random arguments for one check, on the CPU, from a seed.

    Floats: mixed signs (domain "mixed") or positive only ("positive", for regions whose body
    is undefined on negative inputs, e.g. log or sqrt), magnitudes spread log-uniformly over
    [0.05, 2] times a per-seed scale, never zero. Integers: 1..4 (never zero, valid as small
    indices); booleans: random.
    """
    gen = torch.Generator().manual_seed(int(seed))
    scale = (1.0, 0.5, 2.0)[seed % 3]
    out = []
    for a in sig.args:
        shape = a.concrete(dynamic_size)
        dtype = TORCH_DTYPES[a.dtype]
        if dtype == torch.bool:
            t = torch.rand(shape, generator=gen) < 0.5
        elif not dtype.is_floating_point:
            t = torch.randint(1, 5, shape, generator=gen, dtype=torch.int64).to(dtype)
        else:
            mag = torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(
                math.log(0.05), math.log(2.0), generator=gen)) * scale
            if domain == "mixed":
                sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
                mag = mag * sign.double()
            t = mag.to(dtype)
        out.append(t.contiguous())
    return out
