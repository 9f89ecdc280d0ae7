"""The builtin provider on a real GPU (skipped without CUDA): generated kernels at realistic
sizes, verified against the reference under each precision policy, timed against PyTorch eager.

Also a script: `python test/python/test_builtin_gpu.py [--configs N] [--json OUT]` prints a
table (region, policy, config, error, kernel ms, eager ms, speedup, fraction of the roofline
floor) and checks that GEMM kernels use wgmma on Hopper.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "fixtures" / "specs"))

TOL = {"strict": 1e-4, "tf32": 1e-2, "bf16": 1e-2}


def _eager_linear_relu(x, w, b):
    return (F.relu(F.linear(x, w, b)),)


def _eager_softmax(x):
    return (torch.softmax(x, -1),)


def _eager_layer_norm(x, g, b):
    return (F.layer_norm(x, (x.shape[-1],), g, b),)


def _eager_gelu(x):
    return (F.gelu(x),)


def _eager_bmm(q, k):
    return (torch.softmax(q @ k.transpose(1, 2) * 0.25, -1),)


def _eager_mlp(x, w, b, g, beta):
    return (torch.softmax(F.layer_norm(F.gelu(F.linear(x, w, b)), (w.shape[0],), g, beta), -1),)


def _eager_conv(x, w, b):
    return (F.conv2d(x, w, b),)


def _eager_group_norm(x, g, b):
    return (F.group_norm(x, 32, g, b),)


def _eager_log_softmax(x):
    return (torch.log_softmax(x, -1),)


def _eager_attention(q, k, v):
    return (torch.softmax(q @ k.transpose(1, 2) * 0.25, -1) @ v,)


def _eager_gn_silu_mean(x):
    h = F.silu(F.group_norm(x, 32, eps=1e-5))
    return (h.mean(1, keepdim=True), h)


def workloads(directory: Path):
    """(name, spec path, eager fn) at realistic sizes, written by the fixture builders."""
    import make_fixtures as mf
    mf.HERE = directory
    mf.matmul_bias_relu(M=1024, K=8192, N=8192)
    mf.softmax(R=8192, C=8192)
    mf.layer_norm(R=8192, C=8192)
    mf.gelu(R=8192, C=8192)
    mf.bmm_scale_softmax(B=16, M=2048, K=1024, N=2048)
    mf.linear_gelu_layer_norm_softmax(M=4096, K=1024, N=4096)
    mf.conv2d(N=16, C=64, H=34, W=34, O=128, KH=3, KW=3)
    mf.group_norm(M=8192, N=4096, G=32)
    mf.matmul_bias_relu(M=128, K=16384, N=4096, name="small_m_linear_relu")
    mf.attention(B=64, S=1024, D=64, T=1024)
    mf.group_norm_silu_row_mean(M=4096, N=4096, G=32)
    mf.softmax(R=1024, C=32768, name="log_softmax", log=True)
    return [("matmul_bias_relu", _eager_linear_relu, 1.0), ("softmax", _eager_softmax, 1.0),
            ("layer_norm", _eager_layer_norm, 1.0), ("gelu_erf", _eager_gelu, 1.0),
            # q.k / 4 over K=1024 with q, k ~ N(0, 0.25): logits ~ N(0, 4), like attention
            ("bmm_scale_softmax", _eager_bmm, 0.5),
            ("linear_gelu_layer_norm_softmax", _eager_mlp, 1.0),
            ("conv2d_bias", _eager_conv, 1.0), ("group_norm", _eager_group_norm, 1.0),
            ("log_softmax", _eager_log_softmax, 1.0),
            ("small_m_linear_relu", _eager_linear_relu, 1.0),
            ("attention", _eager_attention, 1.0),
            ("group_norm_silu_row_mean", _eager_gn_silu_mean, 1.0)]


def _load(source: str, path: Path):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(spec, seed, device, scale=1.0):
    """Activations ~ N(0, scale^2); matrix weights uniform in +-1/sqrt(fan_in) (nn.Linear's
    initialization); vectors ~ N(0, 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for a in spec.args:
        if a.weight and len(a.shape) >= 2:
            bound = 1 / math.sqrt(math.prod(a.shape[1:]))
            t = (torch.rand(a.shape, generator=g) * 2 - 1) * bound
        else:
            t = torch.randn(a.shape, generator=g) * (1.0 if a.weight else scale)
        out.append(t.to(device))
    return out


def _prepared(module, spec, args):
    args = list(args)
    if hasattr(module, "prepare_weights"):
        for i, t in module.prepare_weights({i: args[i] for i, a in enumerate(spec.args)
                                            if a.weight}).items():
            args[i] = t
    return args


def _uses_wgmma(module) -> bool | None:
    import triton
    for fn in vars(module).values():
        if isinstance(fn, triton.runtime.jit.JITFunction) and "gemm" in fn.__name__:
            for caches in fn.device_caches.values():
                for compiled in caches[0].values():
                    return "wgmma" in compiled.asm.get("ptx", "")
    return None


def _mixed_errors(module, spec, eager, ref64, device, seeds=(0, 1, 2)):
    """Error over the 1e-4 tolerance of the candidate and of eager fp32, both against the fp64
    reference, on the verifier's own inputs (kforge.verify.inputs: mixed signs, magnitudes
    over two decades times a per-seed scale): the candidate should not be worse than eager."""
    from kforge.verify.inputs import make_inputs, signature_of
    sig = signature_of(spec)
    worst = [0.0, 0.0]
    for seed in seeds:
        args = [t.to(device) for t in make_inputs(sig, seed, 0)]
        expected = [e.float() for e in ref64(*args)]
        for j, got in enumerate((module.launch(*_prepared(module, spec, args)), eager(*args))):
            worst[j] = max([worst[j]] + [((g - e).abs() / (1e-4 + 1e-4 * e.abs())).max().item()
                                         for g, e in zip(got, expected)])
    return worst


def evaluate(name, eager, spec_path, precision, max_configs, workdir: Path, scale=1.0,
             schemes=None, mixed=False):
    from kforge.providers.builtin import candidates, kernel_metadata
    from kforge.reference import reference_fn
    from kforge.spec import load_spec
    from kforge.targets import get_target
    target = get_target("cuda")
    spec = load_spec(spec_path)
    rows = []
    ref64 = reference_fn(spec, dtype=torch.float64)
    args = _args(spec, 0, "cuda", scale)
    expected = [e.float() for e in ref64(*args)]
    eager_ms = target.time_ms(lambda: eager(*args))
    floor = target.floor_ms(spec.flops, spec.min_bytes or sum(
        t.numel() * t.element_size() for t in args + expected), precision)
    cands = candidates(spec, target, precision)
    if schemes:       # the first max_configs of each named scheme (input_precision)
        cands = [c for sch in schemes
                 for c in [c for c in cands if c.config.get("input_precision") == sch][:max_configs]]
    else:
        cands = cands[:max_configs]
    for cand in cands:
        row = {"region": name, "precision": precision, "config": cand.config}
        try:
            module = _load(cand.source, workdir / f"{cand.id.replace('-', '_')}.py")
            prepared = _prepared(module, spec, args)
            got = module.launch(*prepared)
            torch.cuda.synchronize()
            err = max(((g - e).abs() / (TOL[precision] + TOL[precision] * e.abs())).max().item()
                      for g, e in zip(got, expected))
            row["err_over_tol"] = err
            row["ok"] = err <= 1.0
            row["ms"] = target.time_ms(lambda: module.launch(*prepared))
            row["eager_ms"] = eager_ms
            row["speedup"] = eager_ms / row["ms"]
            row["floor_frac"] = floor / row["ms"]
            row["wgmma"] = _uses_wgmma(module)
            row["kernels"] = kernel_metadata(module)
            if mixed and precision == "strict":
                row["mixed_err_over_tol"], row["eager_mixed_err_over_tol"] = _mixed_errors(
                    module, spec, eager, ref64, "cuda")
        except Exception as exc:      # a report, not a verifier: record and go on
            row["ok"] = False
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=int, default=3)
    parser.add_argument("--precisions", default="strict,tf32,bf16")
    parser.add_argument("--only", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--schemes", default="", help="strict schemes, e.g. fp16x3,3xtf32")
    parser.add_argument("--mixed", action="store_true",
                        help="also the error on the verifier's mixed-magnitude inputs")
    args = parser.parse_args(argv)
    all_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, eager, scale in workloads(tmp):
            if args.only and name not in args.only.split(","):
                continue
            spec_path = tmp / f"{name}.json"
            for precision in args.precisions.split(","):
                schemes = [x for x in args.schemes.split(",") if x] if precision == "strict" \
                    else None
                for row in evaluate(name, eager, spec_path, precision, args.configs, tmp, scale,
                                    schemes, args.mixed):
                    all_rows.append(row)
                    cfg = {k: v for k, v in row["config"].items() if k != "rows"}
                    if "error" in row:
                        print(f"{name:32s} {precision:6s} FAILED {row['error']}  {cfg}",
                              flush=True)
                    else:
                        print(f"{name:32s} {precision:6s} {'ok ' if row['ok'] else 'BAD'} "
                              f"err/tol={row['err_over_tol']:.3g} {row['ms']:.3f} ms "
                              f"eager {row['eager_ms']:.3f} ms x{row['speedup']:.2f} "
                              f"floor {row['floor_frac']:.0%} wgmma={row['wgmma']} "
                              f"{row['kernels'][:3]} {cfg}"
                              + (f" mixed err/tol {row['mixed_err_over_tol']:.3g} (eager "
                                 f"{row['eager_mixed_err_over_tol']:.3g})"
                                 if "mixed_err_over_tol" in row else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1, default=str))
    return 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["strict", "tf32", "bf16"])
def test_builtin_kernels_verify_on_gpu(precision, tmp_path):
    for name, eager, scale in workloads(tmp_path):
        rows = evaluate(name, eager, tmp_path / f"{name}.json", precision, 1, tmp_path, scale)
        assert rows and all(r["ok"] for r in rows), rows


if __name__ == "__main__":
    sys.exit(main())
