"""Discrete selections decided by near-ties: the float64 model that follows the package's
choices where the exact scores cannot tell the candidates apart.

An MoE router picks each token's experts with `topk` over its logits. Where the k-th and the
(k+1)-th logits of a token are closer than fp32 arithmetic can resolve, which expert is
taken depends on the order of additions: two correct fp32 computations can pick differently,
and the token's output then differs by the experts' difference, not by rounding. With a
sliding-window layer after it, that one token's change reaches the next window's tokens.
On gpt-oss-20b's prefill (3 layers, 2 x 1,200 tokens, H100, 2026-12-06) the package's
fp32-grade router inputs left 127 of 2,400 rows outside the bf16 policy against eager fp32
*and* against a float64 copy of the model. The layer-1 router's 4th and 5th logits at the
first of those tokens differ by 4.4e-8 in float64, under one fp32 ulp of a logit near 1
(benchmarks/results/2026-12-06k-h100-ties/).

No rule on the outputs alone can accept such a row without accepting a wrong expert
anywhere. This module judges the choices themselves:

* `Recorder` records every `aten.topk` the package runs (a host-plan fallback, through the
  dispatcher), in order;
* `Follower` runs the float64 model and, at its i-th `topk`, compares each row's chosen set
  with the package's i-th. Where they differ, the package's choice is a *near-tie* when,
  under the float64 scores, the least score among the package's picks is within the strict
  policy's allowance (atol x max(1, RMS(scores)) + rtol x |score|) of the float64 k-th
  score: a computation whose scores are within strict's tolerance of the exact ones can make
  that choice. There the float64 model takes the package's choice; everywhere else its own.
  A choice that differs by more is an *error*: it is counted and not followed.
* `follow_ties` returns the float64 model's outputs after following, with the counts. The
  package is then within its policy at a row by the tie rule only if no choice was an error
  and its outputs are within the policy against the float64 model that chose as it did.

Rows of a selection are its input's leading dimensions flattened (a router's tokens). A model
run in parts of its batch (BATCH_SEPARABLE, `kforge.bench.runner._rows_on_device`) takes the
i-th selection's rows part after part, in batch order, as the flattened tokens are.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TOPK = torch.ops.aten.topk.default


def _topk_args(args, kwargs):
    """(input, k, dim, largest) of an aten.topk call."""
    names = ("self", "k", "dim", "largest", "sorted")
    bound = dict(zip(names, args))
    bound.update(kwargs or {})
    x = bound["self"]
    dim = bound.get("dim", -1)
    return x, int(bound["k"]), dim % max(1, x.dim()), bool(bound.get("largest", True))


class Recorder(TorchDispatchMode):
    """Every aten.topk run inside the block: its chosen indices as [rows, k] on the host, or
    None where it selects along another than the last dimension or the smallest."""

    def __init__(self):
        super().__init__()
        self.calls: list[torch.Tensor | None] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is _TOPK:
            x, k, dim, largest = _topk_args(args, kwargs)
            last = dim == x.dim() - 1 and largest
            self.calls.append(out[1].detach().reshape(-1, k).cpu() if last else None)
        return out


@dataclass
class TieCounts:
    """What following the package's choices found."""
    selections: int = 0             # topk calls the float64 model made (its last attempt)
    rows_differ: int = 0            # rows whose chosen set differs from the package's
    ties: int = 0                   # of them, near-ties: followed
    errors: int = 0                 # of them, farther apart: not followed
    worst_tie: float = 0.0          # the largest gap followed, over its allowance (<= 1)
    worst_error: float = 0.0        # the largest gap not followed, over its allowance
    unmatched: str = ""             # why the calls could not be paired, if they could not
    where: list = field(default_factory=list)   # (selection, row, gap) of the first differing

    @property
    def followed(self) -> bool:
        """Every differing choice was a near-tie and the calls paired up."""
        return not self.unmatched and not self.errors

    def text(self) -> str:
        if self.unmatched:
            return f"the package's selections could not be paired with the model's: {self.unmatched}"
        if not self.rows_differ:
            return (f"the package chose as the float64 model does at every row of its "
                    f"{self.selections} selections")
        parts = []
        if self.ties:
            parts.append(f"{self.ties} near-tie(s) (gap at most {self.worst_tie:.2g} of "
                         "strict's allowance), followed")
        if self.errors:
            parts.append(f"{self.errors} farther apart (up to {self.worst_error:.3g} of "
                         "strict's allowance): a wrong choice, not followed")
        out = (f"the package chose differently from the float64 model at {self.rows_differ} "
               f"row(s) of its {self.selections} selections: " + "; ".join(parts))
        where = ", ".join(f"selection {s + 1} row {r} (gap {g:.2g})" for s, r, g in self.where)
        return out + (f" [{where}]" if where else "")


class Follower(TorchDispatchMode):
    """Inside the block, the i-th aten.topk takes the package's i-th choice (`recorded`) at the
    rows where that choice is a near-tie under this run's own scores; `restart()` before each
    attempt at a whole run."""

    def __init__(self, recorded: list, atol: float, rtol: float, keep_where: int = 8):
        super().__init__()
        self.recorded = recorded
        self.atol, self.rtol = atol, rtol
        self.keep_where = keep_where
        self.restart()

    def restart(self) -> None:
        self.n = 0
        self.cursor = [0] * len(self.recorded)
        self.counts = TieCounts()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is not _TOPK or not self.recorded:
            return out
        c = self.counts
        j = self.n % len(self.recorded)
        self.n += 1
        c.selections = self.n
        x, k, dim, largest = _topk_args(args, kwargs)
        rec = self.recorded[j]
        if rec is None or dim != x.dim() - 1 or not largest:
            c.unmatched = c.unmatched or f"selection {j + 1} is not a largest-k over its last dimension"
            return out
        scores = x.reshape(-1, x.shape[-1])
        n = scores.shape[0]
        theirs = rec[self.cursor[j]:self.cursor[j] + n]
        self.cursor[j] += n
        if tuple(theirs.shape) != (n, k):
            c.unmatched = c.unmatched or (f"selection {j + 1}: the model's {n} x {k} rows against "
                                          f"the package's {tuple(theirs.shape)}")
            return out
        values, idx = out
        own = idx.reshape(n, k)
        theirs = theirs.to(own.device)
        differ = (own.sort(dim=1).values != theirs.sort(dim=1).values).any(dim=1)
        if not bool(differ.any()):
            return out
        wide = scores.to(torch.float64)
        kth = values.reshape(n, k).to(torch.float64).min(dim=1).values
        least = wide.gather(1, theirs).min(dim=1).values      # their weakest pick, our scores
        rms = float(wide[torch.isfinite(wide)].pow(2).mean().sqrt()) if wide.numel() else 0.0
        allowance = self.atol * max(1.0, rms) + self.rtol * kth.abs()
        ratio = ((kth - least).clamp(min=0) / allowance)[differ]
        rows = differ.nonzero().flatten()
        tie = ratio <= 1.0
        c.rows_differ += int(differ.sum())
        c.ties += int(tie.sum())
        c.errors += int((~tie).sum())
        if bool(tie.any()):
            c.worst_tie = max(c.worst_tie, float(ratio[tie].max()))
        if bool((~tie).any()):
            c.worst_error = max(c.worst_error, float(ratio[~tie].max()))
        for r, g in zip(rows.tolist(), ratio.tolist()):
            if len(c.where) < self.keep_where:
                c.where.append((j, self.cursor[j] - n + r, g))
        follow = torch.zeros_like(differ)
        follow[rows[tie]] = True
        chosen = torch.where(follow[:, None], theirs, own)
        picked = scores.gather(1, chosen)
        picked, order = picked.sort(dim=1, descending=True)
        chosen = chosen.gather(1, order)
        return picked.reshape(values.shape), chosen.reshape(idx.shape)


@dataclass
class Followed:
    """follow_ties' result."""
    package_outputs: list | None = None     # the package's outputs in the recorded run
    outputs: list | None = None             # the float64 model's, following the near-ties
    counts: TieCounts = field(default_factory=TieCounts)
    note: str = ""                          # why nothing could be followed


def follow_ties(out, calls, module, inputs, empty_cache=lambda: None) -> Followed:
    """A float64 copy of `module` on `inputs` following, at near-ties (`Follower`, strict's
    allowance), the topk choices `calls` (Recorder.calls) that the package recorded in the run
    that gave `out` (run without its CUDA graph, so that its selections passed the
    dispatcher)."""
    from kforge.bench.runner import float64_runs
    from kforge.verify.policy import get_policy
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if not calls:
        return Followed(outs, None, TieCounts(), "the package makes no topk selection")
    strict = get_policy("strict")
    follower = Follower(calls, strict.atol, strict.rtol)
    with follower:
        res, why = float64_runs(module, [inputs], empty_cache, restart=follower.restart)
    if res is None:
        return Followed(outs, None, follower.counts, why)
    counts = follower.counts
    short = [j + 1 for j, (c, r) in enumerate(zip(follower.cursor, calls))
             if r is not None and c != r.shape[0]]
    if not counts.unmatched and (counts.selections % len(calls) or short):
        counts.unmatched = (f"the model made {counts.selections} selections, the package "
                            f"{len(calls)}" + (f"; rows left over at selection(s) {short}"
                                                   if short else ""))
    got = res[0]
    return Followed(outs, [got] if isinstance(got, torch.Tensor) else list(got), counts)


__all__ = ["Recorder", "Follower", "TieCounts", "Followed", "follow_ties"]
