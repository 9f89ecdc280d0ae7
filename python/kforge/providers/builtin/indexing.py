"""Symbolic index arithmetic for generated kernels.

An index is a small expression tree over kernel variables (`offs`, `rows`, `cols`, `rm`, ...).
Unravelled components remember where they came from, so that reading a contiguous tensor at
unravel(flat, shape) folds back to `flat`, and reshapes cost nothing.
"""
from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Union

# Value ranges [lo, hi) of the kernel variables on in-bounds lanes, for simplification:
# (rows * 64 + cols) // 64 is rows when cols < 64. Masked lanes may compute other indices;
# their loads and stores are masked, so only in-bounds lanes must be exact.
_RANGES: ContextVar[dict] = ContextVar("index_ranges", default={})


@contextlib.contextmanager
def ranges(table: dict[str, tuple[int, int]]):
    token = _RANGES.set(dict(table))
    try:
        yield
    finally:
        _RANGES.reset(token)


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


@dataclass(frozen=True)
class IClamp:
    """min(max(e, lo), hi): keeps the address of a padded read in bounds."""
    e: "Index"
    lo: int
    hi: int


Index = Union[IVar, IConst, IBin, IUnravel, IClamp]


def clamp(e: Index, lo: int, hi: int) -> Index:
    b = bounds(e)
    if b is not None and b[0] >= lo and b[1] - 1 <= hi:
        return e
    return IClamp(e, lo, hi)

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


def bounds(e: Index) -> tuple[int, int] | None:
    """[lo, hi) of e on in-bounds lanes, when known."""
    if isinstance(e, IConst):
        return e.value, e.value + 1
    if isinstance(e, IVar):
        return _RANGES.get().get(e.name)
    if isinstance(e, IUnravel):
        return 0, e.shape[e.k]
    if isinstance(e, IClamp):
        return e.lo, e.hi + 1
    a, b = bounds(e.lhs), bounds(e.rhs)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a[0] + b[0], a[1] + b[1] - 1
    if e.op == "mul" and isinstance(e.rhs, IConst) and e.rhs.value >= 0:
        c = e.rhs.value
        return a[0] * c, (a[1] - 1) * c + 1
    if e.op == "floordiv" and isinstance(e.rhs, IConst) and e.rhs.value > 0:
        c = e.rhs.value
        return a[0] // c, (a[1] - 1) // c + 1
    if e.op == "mod" and isinstance(e.rhs, IConst) and e.rhs.value > 0 and a[0] >= 0:
        return 0, min(e.rhs.value, a[1])
    return None


def _terms(e: Index) -> list[Index]:
    if isinstance(e, IBin) and e.op == "add":
        return _terms(e.lhs) + _terms(e.rhs)
    return [e]


def _coefficient(t: Index) -> int:
    if isinstance(t, IConst):
        return t.value
    if isinstance(t, IBin) and t.op == "mul" and isinstance(t.rhs, IConst):
        return t.rhs.value
    return 1


def _divide_term(t: Index, c: int) -> Index:
    if isinstance(t, IConst):
        return IConst(t.value // c)
    return mul(t.lhs, IConst(t.rhs.value // c))


def _sum(terms) -> Index:
    total: Index = ZERO
    for t in terms:
        total = add(total, t)
    return total


def _split_multiples(a: Index, c: int):
    """a = c * high + rest, high from the terms whose coefficient c divides."""
    terms = _terms(a)
    high = [_divide_term(t, c) for t in terms if _coefficient(t) % c == 0]
    rest = [t for t in terms if _coefficient(t) % c != 0]
    return _sum(high), _sum(rest), bool(high)


def floordiv(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value // b.value)
    if b == IConst(1):
        return a
    if isinstance(b, IConst) and b.value > 0:
        c = b.value
        if isinstance(a, IBin) and a.op == "floordiv" and isinstance(a.rhs, IConst):
            return floordiv(a.lhs, IConst(a.rhs.value * c))
        high, rest, split = _split_multiples(a, c)
        r = bounds(rest)
        if r is not None and r[0] >= 0 and r[1] <= c:
            return high
        if split and r is not None and r[0] >= 0:
            return add(high, IBin("floordiv", rest, b))
        g = _common_factor(a, c)
        if g is not None:       # (x * g + r) // (g * q) = x // q when 0 <= r < g
            return floordiv(g[1], IConst(c // g[0]))
    return IBin("floordiv", a, b)


def mod(a: Index, b: Index) -> Index:
    if isinstance(a, IConst) and isinstance(b, IConst):
        return IConst(a.value % b.value)
    if b == IConst(1):
        return ZERO
    if isinstance(b, IConst) and b.value > 0:
        c = b.value
        _, rest, split = _split_multiples(a, c)
        r = bounds(rest)
        if r is not None and r[0] >= 0 and r[1] <= c:
            return rest
        if split and r is not None and r[0] >= 0:
            return IBin("mod", rest, b)
        g = _common_factor(a, c)
        if g is not None:       # (x * g + r) % (g * q) = (x % q) * g + r when 0 <= r < g
            return add(mul(mod(g[1], IConst(c // g[0])), IConst(g[0])), g[2])
    return IBin("mod", a, b)


def _common_factor(a: Index, c: int):
    """(g, x, r) with a = x * g + r, 1 < g < c, g dividing c and 0 <= r < g on in-bounds
    lanes (the largest such g), or None: a row index times a row length plus a column."""
    for g in sorted({math.gcd(_coefficient(t), c) for t in _terms(a)}, reverse=True):
        if g <= 1 or g >= c:
            continue
        high, rest, split = _split_multiples(a, g)
        r = bounds(rest)
        if split and r is not None and r[0] >= 0 and r[1] <= g:
            return g, high, rest
    return None


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
            out.append(_unravel_component(flat, norm, k))
            k += 1
    return tuple(out)


def _unravel_component(flat: Index, shape: tuple[int, ...], k: int) -> Index:
    """IUnravel(flat, shape, k), or a simpler equal expression when the ranges show one."""
    if not isinstance(flat, (IVar, IUnravel)):
        stride = math.prod(shape[k + 1:])
        e = floordiv(flat, IConst(stride))
        if k:
            e = mod(e, IConst(shape[k]))
        simplified = not any(isinstance(x, IBin) and x.op in ("floordiv", "mod") and
                             x.lhs == flat for x in (e, getattr(e, "lhs", None)))
        if simplified:
            return e
    return IUnravel(flat, shape, k)


def ravel(index, shape) -> Index:
    """Row-major flat offset of `index` in a contiguous tensor of `shape`."""
    comps = _merge_split_dims([(i, s) for i, s in zip(index, shape) if s != 1])
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


def _merge_split_dims(comps: list) -> list:
    """Adjacent components (x // q, x % q) (or (x // q % s, x % q)) of dims (s, q) are one
    component x (x % (s * q)) of a dim s * q: a row index that a reshape split into
    (batch, seq) is raveled back to the row."""
    out = list(comps)
    j = 0
    while j + 1 < len(out):
        (hi, s), (lo, q) = out[j], out[j + 1]
        merged = None
        if isinstance(lo, IBin) and lo.op == "mod" and lo.rhs == IConst(q):
            x = lo.lhs
            if hi == floordiv(x, IConst(q)):
                merged = x
            elif hi == mod(floordiv(x, IConst(q)), IConst(s)):
                merged = mod(x, IConst(s * q))
        if merged is not None:
            out[j:j + 2] = [(merged, s * q)]
            j = max(0, j - 1)
        else:
            j += 1
    return out


def variables(e: Index) -> frozenset[str]:
    if isinstance(e, IVar):
        return frozenset((e.name,))
    if isinstance(e, IBin):
        return variables(e.lhs) | variables(e.rhs)
    if isinstance(e, IUnravel):
        return variables(e.flat)
    if isinstance(e, IClamp):
        return variables(e.e)
    return frozenset()


def render(e: Index, wide: bool = False) -> str:
    """Triton source for an index expression; `wide`: every variable widened to int64 first
    (an offset into a tensor of 2**31 elements or more, which int32 arithmetic overflows)."""
    if isinstance(e, IVar):
        return f"{e.name}.to(tl.int64)" if wide else e.name
    if isinstance(e, IConst):
        return str(e.value)
    if isinstance(e, IUnravel):
        stride = math.prod(e.shape[e.k + 1:])
        code = render(e.flat, wide)
        if stride != 1:
            code = f"({code} // {stride})"
        if e.k != 0:
            code = f"({code} % {e.shape[e.k]})"
        return code
    if isinstance(e, IClamp):
        return f"tl.minimum(tl.maximum({render(e.e, wide)}, {e.lo}), {e.hi})"
    sym = {"add": "+", "mul": "*", "floordiv": "//", "mod": "%"}[e.op]
    return f"({render(e.lhs, wide)} {sym} {render(e.rhs, wide)})"
