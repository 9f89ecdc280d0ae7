"""Symbolic index arithmetic for generated kernels.

An index is a small expression tree over kernel variables (`offs`, `rows`, `cols`, `rm`, ...).
Unravelled components remember where they came from, so that reading a contiguous tensor at
unravel(flat, shape) folds back to `flat`, and reshapes cost nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class IVar:
    name: str


@dataclass(frozen=True)
class IConst:
    value: int


@dataclass(frozen=True)
class IBin:
    op: str            # add | mul | floordiv | mod
    lhs: "Index"
    rhs: "Index"


@dataclass(frozen=True)
class IUnravel:
    """Component k of unravel(flat, shape) (shape without size-1 dims)."""
    flat: "Index"
    shape: tuple[int, ...]
    k: int


Index = Union[IVar, IConst, IBin, IUnravel]

ZERO = IConst(0)


def const(c: int) -> Index:
    return IConst(int(c))


def add(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value + b.value)
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    return IBin("add", a, b)


def mul(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value * b.value)
    if a == ZERO or b == ZERO:
        return ZERO
    if a == IConst(1):
        return b
    if b == IConst(1):
        return a
    return IBin("mul", a, b)


def floordiv(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value // b.value)
    if b == IConst(1):
        return a
    return IBin("floordiv", a, b)


def mod(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value % b.value)
    if b == IConst(1):
        return ZERO
    return IBin("mod", a, b)


def ceildiv(a: Index, b: Index) -> Index:
    return floordiv(add(a, add(b, IConst(-1))), b) if isinstance(b, IConst) else \
        IBin("floordiv", add(a, add(b, IConst(-1))), b)


def unravel(flat: Index, shape) -> tuple[Index, ...]:
    """Row-major multi-index of `flat` in `shape` (size-1 dims give 0)."""
    norm = tuple(s for s in shape if s != 1)
    out, k = [], 0
    for s in shape:
        if s == 1:
            out.append(ZERO)
        elif len(norm) == 1:
            out.append(flat)
            k += 1
        else:
            out.append(IUnravel(flat, norm, k))
            k += 1
    return tuple(out)


def ravel(index, shape) -> Index:
    """Row-major flat offset of `index` in a contiguous tensor of `shape`."""
    comps = [(i, s) for i, s in zip(index, shape) if s != 1]
    strides = []
    acc = 1
    for _, s in reversed(comps):
        strides.append(acc)
        acc *= s
    strides.reverse()
    total: Index = ZERO
    j = 0
    while j < len(comps):
        i, _ = comps[j]
        if isinstance(i, IUnravel) and i.k == 0:
            n = len(i.shape)
            run = comps[j:j + n]
            if len(run) == n and all(isinstance(c, IUnravel) and c.flat == i.flat and
                                     c.shape == i.shape and c.k == t and c.shape[t] == s
                                     for t, (c, s) in enumerate(run)):
                total = add(total, mul(i.flat, IConst(strides[j + n - 1])))
                j += n
                continue
        total = add(total, mul(i, IConst(strides[j])))
        j += 1
    return total


def variables(e: Index) -> frozenset[str]:
    if isinstance(e, IVar):
        return frozenset((e.name,))
    if isinstance(e, IBin):
        return variables(e.lhs) | variables(e.rhs)
    if isinstance(e, IUnravel):
        return variables(e.flat)
    return frozenset()


def render(e: Index) -> str:
    """Triton source for an index expression."""
    if isinstance(e, IVar):
        return e.name
    if isinstance(e, IConst):
        return str(e.value)
    if isinstance(e, IUnravel):
        stride = math.prod(e.shape[e.k + 1:])
        code = render(e.flat)
        if stride != 1:
            code = f"({code} // {stride})"
        if e.k != 0:
            code = f"({code} % {e.shape[e.k]})"
        return code
    sym = {"add": "+", "mul": "*", "floordiv": "//", "mod": "%"}[e.op]
    return f"({render(e.lhs)} {sym} {render(e.rhs)})"
