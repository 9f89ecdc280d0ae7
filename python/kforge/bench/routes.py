"""The routes a user would take in PyTorch at each precision policy: what KForge is measured
against beside the fp32 baselines (issue 13, "matched baselines").

Each route is plain data: how the model is prepared (as written, or a bf16 copy), which
numerics are switched on around every call (fp32 with TF32 off, TF32 matmuls and
convolutions, bf16 autocast) and whether it runs eagerly or under torch.compile (with which
mode). The runner times each one and checks it against eager fp32 at the policy's tolerance;
the headline per policy is the speedup over the faster route that passes.

    strict  eager, torch.compile                      fp32; TF32 off for matmuls AND cuDNN
    tf32    eager, torch.compile                      allow_tf32 for matmuls and cuDNN
    bf16    eager, torch.compile, torch.compile       the model cast to bf16 (`model.bfloat16()`,
            (max-autotune-no-cudagraphs)              float inputs cast before the call)
            eager under autocast(bf16)                the fp32 model, bf16 autocast

fp32 means TF32 off for convolutions as well: PyTorch's default leaves
`torch.backends.cudnn.allow_tf32` on, and eager's TF32 convolutions miss a 1e-4 check (ResNet
on the H200, measured 2026-12-01), so a "strict" baseline with the default is neither fp32 nor
the reference it is checked against.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

NUMERICS = ("fp32", "tf32", "autocast-bf16")


@dataclass(frozen=True)
class Route:
    name: str                    # as reported: "eager[tf32]", "torch.compile[bf16 model]" ...
    policy: str
    compiled: bool               # torch.compile or eager
    numerics: str                # one of NUMERICS: the switches held around every call
    cast: str | None = None      # "bf16": a bf16 copy of the model, float inputs cast
    compile_mode: str | None = None   # torch.compile mode (None: Inductor's default)

    @property
    def kind(self) -> str:
        return "compile" if self.compiled else "eager"

    def describe(self) -> str:
        how = f"torch.compile(mode={self.compile_mode or 'default'})" if self.compiled else "eager"
        what = {"fp32": "fp32 (TF32 off for matmuls and cuDNN)",
                "tf32": "allow_tf32 for matmuls and cuDNN",
                "autocast-bf16": "autocast(bf16)"}[self.numerics]
        return f"{how}, {'model.bfloat16(), inputs cast to bf16, ' if self.cast else ''}{what}"


MATCHED: dict[str, tuple[Route, ...]] = {
    "strict": (Route("eager", "strict", False, "fp32"),
               Route("torch.compile", "strict", True, "fp32")),
    "tf32": (Route("eager[tf32]", "tf32", False, "tf32"),
             Route("torch.compile[tf32]", "tf32", True, "tf32")),
    "bf16": (Route("eager[bf16 model]", "bf16", False, "fp32", cast="bf16"),
             Route("torch.compile[bf16 model]", "bf16", True, "fp32", cast="bf16"),
             Route("torch.compile[bf16 model, max-autotune-no-cudagraphs]", "bf16", True, "fp32",
                   cast="bf16", compile_mode="max-autotune-no-cudagraphs"),
             Route("eager[autocast bf16]", "bf16", False, "autocast-bf16")),
}


def matched_routes(policy: str) -> tuple[Route, ...]:
    """The routes a user of `policy` would take in PyTorch, in the order they are run."""
    try:
        return MATCHED[policy]
    except KeyError:
        raise ValueError(f"no matched routes for policy {policy!r}") from None


@contextlib.contextmanager
def numerics(mode: str, device: str):
    """Hold PyTorch's precision switches for `mode` (restored afterwards)."""
    import torch

    if mode not in NUMERICS:
        raise ValueError(f"unknown numerics {mode!r}")
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    old = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = (mode == "tf32")
    try:
        if mode == "autocast-bf16":
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                yield
        else:
            yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = old


def prepare_model(route: Route, model):
    """The module the route runs: the model itself, or a bf16 copy (the original is kept as
    it is: it is the fp32 reference and KForge's weights)."""
    if route.cast == "bf16":
        import torch
        return copy.deepcopy(model).to(torch.bfloat16)
    return model


def cast_inputs(route: Route, inputs):
    """Inputs as the route's user feeds them: float tensors in bf16 for a bf16 model."""
    if route.cast != "bf16":
        return list(inputs)
    import torch
    return [x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in inputs]


class RouteFn:
    """A route's callable over the workload's own (fp32) inputs, for the correctness checks:
    casts them as the route does, calls under the route's numerics. Timing calls `timed` with
    inputs cast beforehand (a user of a bf16 model holds bf16 activations: the cast is not
    part of the model's time)."""

    def __init__(self, route: Route, fn, device: str):
        self.route, self.fn, self.device = route, fn, device

    def __call__(self, *inputs):
        with numerics(self.route.numerics, self.device):
            return self.fn(*cast_inputs(self.route, inputs))

    def timed(self, cast_inputs_):
        def call():
            with numerics(self.route.numerics, self.device):
                return self.fn(*cast_inputs_)
        return call


def headline(routes: list):
    """The faster *correct* route: status "ok" and timed (a route outside the policy's
    tolerance is "mismatch" and does not count). Works on ContenderResult objects and on their
    JSON dicts. None when no route passed."""
    def field(r, k):
        return r.get(k) if isinstance(r, dict) else getattr(r, k)

    def ms(r):
        t = field(r, "timing")
        if t is None:
            return None
        return t.get("median_ms") if isinstance(t, dict) else t.median_ms

    ok = [r for r in routes if field(r, "status") == "ok" and ms(r) is not None]
    return min(ok, key=ms) if ok else None


__all__ = ["MATCHED", "NUMERICS", "Route", "RouteFn", "cast_inputs", "headline",
           "matched_routes", "numerics", "prepare_model"]
