"""Host-memory peaks (ru_maxrss) of the two verification steps issue 13 item 4's device run
found over 3x, on the CPU, where no GPU is at hand: the builtin's fp16x3 weight split
(prepare_weights) and the worker's comparison of its inputs with their redraw; each the whole-tensor
way of 3c9f48c and the way of now, each in a fresh process (ru_maxrss is a high-water mark).

    PYTHONPATH=python python3 benchmarks/verify/host_peaks.py [N]      (an N x N fp32 weight)

Prints each process's peak in weights (N*N*4 bytes) above its start, and its peak before
the step. The device's numbers come from bench_verify.py; these only show the temporaries.
"""
from __future__ import annotations

import resource
import subprocess
import sys

import torch


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def whole_split(w, n_dims, planes):
    """The fp16x3 split as prepare_weights computed it before 4ba4eb9 (the whole weight)."""
    w = w.to(torch.float32)
    k_dims = tuple(d for d in range(w.dim()) if d not in n_dims)
    amax = w.abs().amax(dim=k_dims, keepdim=True) if k_dims else w.abs()
    e = torch.frexp(amax)[1].clamp(-100, 100)
    e = torch.where(amax > 0, e, torch.zeros_like(e))
    ws = w * torch.ldexp(torch.ones_like(amax), 15 - e)
    hi = ws.to(torch.float16)
    parts = [hi.reshape(-1)]
    if planes == 2:
        parts.append((ws - hi.to(torch.float32)).to(torch.float16).reshape(-1))
    return torch.cat(parts + [(e - 15).to(torch.float16).reshape(-1)])


def step(what: str, n: int) -> str:
    from kforge.providers.builtin.host import FP16_PREPARE_WEIGHTS
    from kforge.verify import inputs as m
    weight = n * n * 4
    start = _rss()
    if what.startswith("split"):
        w = torch.randn(n, n)
        before = _rss()
        if what == "split_whole":
            out = whole_split(w, (0,), 2)
        else:
            ns = {"torch": torch}
            exec(FP16_PREPARE_WEIGHTS.replace("FP16_WEIGHTS", repr({0: ((0,), 2)})), ns)
            out = ns["prepare_weights"]({0: w})[0]
        assert out.numel() == 2 * n * n + n
    else:
        sig = m.Signature((m.TensorSig("w", (n, n), "f32", "w", n, True),), ())
        held = m.make_inputs(sig, 2, 0, "mixed")
        before = _rss()
        if what == "redraw_whole":      # 3c9f48c: the whole signed draw beside the input
            assert torch.equal(next(m.iter_inputs(sig, 2, 0, "mixed")), held[0])
        else:                           # now: magnitudes, then signs, each freed
            assert m.changed_inputs(sig, 2, 0, "mixed", held) == []
    return (f"{what}: peak {(_rss() - start) / weight:.2f} weights "
            f"(peak before the step: {(before - start) / weight:.2f})")


def main() -> int:
    if len(sys.argv) > 2:
        print(step(sys.argv[2], int(sys.argv[1])))
        return 0
    n = sys.argv[1] if len(sys.argv) > 1 else "8192"
    for what in ("split_whole", "split_blocked", "redraw_whole", "redraw_parts"):
        subprocess.run([sys.executable, __file__, n, what], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
