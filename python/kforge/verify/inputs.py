"""Region signatures and the random inputs verification feeds a candidate.

This module imports only torch: the sandboxed worker uses it too, before the candidate is loaded,
so that the parent and the worker derive identical inputs from a seed without shipping tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    # for a weight read by a contraction: its reduction extent (inputs are drawn / sqrt(it))
    fan_in: int | None = None
    # read by a contraction (matmul, convolution) as an operand, through layout-only ops: keeps
    # mixed signs in the "positive" domain (see make_inputs)
    operand: bool = False
    # integers drawn from [0, int_high) instead of 1..4 (expert ids of a mixture of experts)
    int_high: int | None = None

    def concrete(self, dynamic_size: int) -> tuple[int, ...]:
        return tuple(dynamic_size if d is None else int(d) for d in self.shape)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "weight": self.weight, "fan_in": self.fan_in, "operand": self.operand,
                "int_high": self.int_high}

    @staticmethod
    def from_json(d: dict) -> "TensorSig":
        return TensorSig(d["name"], tuple(d["shape"]), d["dtype"], d.get("weight"),
                         d.get("fan_in"), bool(d.get("operand")), d.get("int_high"))


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
    fan_in, operands = _contraction_reads(spec, {n: t.shape for n, t in tensors.items()})
    if fan_in or operands:
        args = tuple(TensorSig(a.name, a.shape, a.dtype, a.weight, fan_in.get(a.name),
                               a.name in operands) for a in args)
    kind = spec.get("root_kind") if isinstance(spec, dict) else getattr(spec, "root_kind", None)
    if kind == "moe" and len(args) >= 4 and args[3].shape:
        # kforge.moe_op: index [T, K] picks among w1's E experts
        experts = args[3].shape[0]
        args = tuple(replace(a, int_high=experts) if i == 1 else a for i, a in enumerate(args))
    return Signature(args, tuple(results))


def _contraction_reads(spec, shapes: dict) -> tuple[dict[str, int], set[str]]:
    """For a parsed KernelSpec (a JSON dict gives nothing): {weight argument: reduction extent
    of the contraction (matmul, convolution) that reads it, through layout-only ops}, extents
    that are dynamic skipped; and the arguments such contractions read as operands."""
    ops = getattr(spec, "ops", None)
    if not ops:
        return {}, set()
    from kforge.reference import recognize_contraction   # parent process only
    from kforge.spec import AffineDim, GenericOp, ReshapeOp
    weights = {a.name for a in spec.args if a.weight}

    def source(name):           # through transposes, casts and reshapes to what they read
        op = spec.producer(name)
        while isinstance(op, ReshapeOp) or (isinstance(op, GenericOp) and not op.reduction_dims
                                            and op.num_inputs == 1 and len(op.results) == 1):
            name = op.operands[0]
            op = spec.producer(name)
        return name

    out: dict[str, int] = {}
    operands: set[str] = set()
    for op in ops:
        if not isinstance(op, GenericOp) or not op.reduction_dims:
            continue
        con = recognize_contraction(op, projected=False)
        if con is None:
            continue
        extent = 1
        for d in op.reduction_dims:
            size = None
            for name, m in zip(op.operands, op.indexing_maps):
                for k, r in enumerate(m.results):
                    if isinstance(r, AffineDim) and r.d == d and shapes.get(name) is not None:
                        size = size or shapes[name][k]
            if not size:
                extent = 0
                break
            extent *= int(size)
        for arg in con[:2]:
            name = source(op.operands[op.body.args.index(arg)])
            operands.add(name)
            if extent > 1 and name in weights:
                out[name] = max(out.get(name, 0), extent)
    return out, operands


def seed_scale(seed: int) -> float:
    """The per-seed scale of a check's float inputs: 1, 0.5 or 2 (seed % 3). Seeds of scale 2
    are the wide-magnitude checks (values up to 4)."""
    return (1.0, 0.5, 2.0)[int(seed) % 3]


def make_inputs(sig: Signature, seed: int, dynamic_size: int,
                domain: str = "mixed", device: str = "cpu") -> list[torch.Tensor]:
    """The arguments of one check (iter_inputs, all of them)."""
    return list(iter_inputs(sig, seed, dynamic_size, domain, device))


# elements a chunk where inputs are signed or compared in place (a 32768x32768 weight's
# temporaries would be as large as the weight itself)
_CHUNK = 1 << 26


def changed_inputs(sig: Signature, seed: int, dynamic_size: int, domain: str,
                   tensors, device: str = "cpu") -> list[int]:
    """The indices of `tensors` that differ from the arguments drawn again from their seed
    (a candidate modified them), compared a chunk at a time: the worker checks its inputs so
    instead of keeping a pristine copy of each (another 1x of the region's inputs on the
    device, issue 13, item 4). The draws are deterministic on the device.

    A float argument is compared in the parts it is drawn in, each freed before the next is
    drawn: its magnitudes (|input| against them) and then its signs (the input's sign bits
    against them), never the whole signed draw beside the input (that held the input, the
    magnitudes and the signs' float draw at once: 3.00x a 32768x32768 region's bytes, H200).
    The same generator calls in the same order as iter_inputs, so the same values."""
    gen = torch.Generator(device=device).manual_seed(int(seed))
    scale = seed_scale(seed)
    changed = []
    for j, a in enumerate(sig.args):
        shape = a.concrete(dynamic_size)
        dtype = TORCH_DTYPES[a.dtype]
        t = tensors[j]
        same = tuple(t.shape) == shape and t.dtype == dtype
        if not dtype.is_floating_point:
            fresh = _draw_integers(a, shape, dtype, gen, device)
            same = same and _equal_in_chunks(t, fresh, lambda x: x, lambda y: y)
            del fresh
        else:
            mag = _draw_magnitudes(a, shape, gen, scale, device)
            same = same and _equal_in_chunks(t, mag, torch.abs, lambda m: m.to(dtype))
            del mag
            if _signed(a, domain):
                sign = _draw_signs(shape, gen, device)
                same = same and _equal_in_chunks(t, sign, torch.signbit, lambda y: y)
                del sign
            else:
                same = same and not any(torch.signbit(c).any() for c in _chunks(t, device))
        if not same:
            changed.append(j)
        del t
    return changed


def _chunks(t: torch.Tensor, device: str):
    """`t`, flat, a chunk at a time on `device`."""
    flat = t.reshape(-1)
    for k in range(0, flat.numel(), _CHUNK):
        yield flat[k:k + _CHUNK].to(device)


def _equal_in_chunks(t: torch.Tensor, drawn: torch.Tensor, of_input, of_draw) -> bool:
    """Whether of_input(t) equals of_draw(drawn) everywhere, a chunk at a time."""
    flat = drawn.reshape(-1)
    return all(torch.equal(of_input(c), of_draw(flat[k:k + _CHUNK]))
               for k, c in zip(range(0, flat.numel(), _CHUNK), _chunks(t, flat.device)))


def _signed(a: TensorSig, domain: str) -> bool:
    """Whether a float argument is drawn with mixed signs under `domain` (see iter_inputs)."""
    return domain == "mixed" or (domain == "positive_rest" and a.operand)


def _draw_integers(a: TensorSig, shape: tuple, dtype, gen, device: str) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen, device=device) < 0.5
    low, high = (0, int(a.int_high)) if a.int_high else (1, 5)
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64,
                         device=device).to(dtype)


def _draw_magnitudes(a: TensorSig, shape: tuple, gen, scale: float, device: str) -> torch.Tensor:
    # float32 draws (float64 took seconds per GPU-sized tensor, in both processes)
    mag = torch.empty(shape, dtype=torch.float32, device=device).uniform_(
        math.log(0.05), math.log(2.0), generator=gen).exp_().mul_(scale)
    if a.fan_in:
        mag = mag.mul_(1.0 / math.sqrt(a.fan_in))
    return mag


def _draw_signs(shape: tuple, gen, device: str) -> torch.Tensor:
    return torch.rand(shape, generator=gen, device=device) < 0.5


def iter_inputs(sig: Signature, seed: int, dynamic_size: int,
                domain: str = "mixed", device: str = "cpu"):
    """Random arguments for one check, from a seed, drawn on `device` (the verifier and its
    worker both draw on the GPU they verify on: the same seed gives the same tensors there, and
    a prefill region's gigabytes of inputs take milliseconds instead of seconds on the CPU).

    Floats: mixed signs (domain "mixed"); for regions whose body is undefined on negative inputs
    (log, sqrt of a variance argument), "positive_rest" (contraction operands keep mixed signs,
    every other float argument positive: a product of positive operands would be a far easier
    sum than a model's) or "positive" (all positive); magnitudes spread log-uniformly over
    [0.05, 2] times a per-seed scale, never zero; a weight that a contraction reads is divided
    by sqrt(its reduction extent), the scale a layer's initialization gives it (products then
    stay O(inputs), as in a real model, instead of sqrt(K) times larger). Integers: 1..4 (never zero, valid as small
    indices); booleans: random.
    """
    gen = torch.Generator(device=device).manual_seed(int(seed))
    scale = seed_scale(seed)
    for a in sig.args:
        shape = a.concrete(dynamic_size)
        dtype = TORCH_DTYPES[a.dtype]
        if not dtype.is_floating_point:
            t = _draw_integers(a, shape, dtype, gen, device)
        else:
            mag = _draw_magnitudes(a, shape, gen, scale, device)
            if _signed(a, domain):
                sign = _draw_signs(shape, gen, device)
                # negated in place a chunk at a time: the values of torch.where(sign, -mag,
                # mag), without two more tensors of the argument's size
                flat, flip = mag.view(-1), sign.view(-1)
                for k in range(0, flat.numel(), _CHUNK):
                    m = flat[k:k + _CHUNK]
                    m.copy_(torch.where(flip[k:k + _CHUNK], -m, m))
                del sign, flat, flip
            t = mag.to(dtype)
            del mag
        yield t.contiguous()
        del t
