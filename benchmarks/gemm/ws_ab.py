"""The warp-specialized Gluon GEMM (ws_gluon.py) against cuBLAS, bf16, in one process per step:

    OUT=$OUT python3 benchmarks/gemm/ws_ab.py            (on the device machine)

1. Check: each variant runs in a child process of its own, all at once, with a time limit
   (WS_CHECK_S, default 120 s): a variant whose barriers deadlock hangs only its child, and is
   recorded as a hang. Each child compares the kernel's output with torch.mm in fp32 of the same
   bf16 values on a ragged shape (M, N, K not multiples of the tile) and a square one, and with
   an fp32 C on the ragged one: the worst element within 1e-2 of max(1, |ref|) for a bf16 C
   (its rounding is 2^-9), 5e-4 for an fp32 C (a bf16-rounded store would miss it), and no
   NaN (C is poisoned with NaN before).
2. Time: the variants that passed, beside cuBLAS (torch.mm on the bf16 operands, bf16 out),
   per shape, cuBLAS first and last (the ratio's denominator is their mean), with
   triton.testing.do_bench (L2 flushed, median). Shapes: Llama-3-8B prefill's four products at
   16,384 tokens, 8192^3, M = 256, and the LM head at 4,096 tokens with our kernel writing fp32
   (a bf16 package of an fp32 model does) against cuBLAS writing bf16 (WS_SHAPES="M,N,K[,fp32];..."
   overrides).

Writes $OUT/ws_ab.json and prints a table. Exits 1 where `ws` or `pp` (the builtin's two
configurations) failed its check, so that a device call can stop before packages that hold it. Variants (WS_VARIANTS, comma-separated):
  ws           128 x 256 x 64, 3 stages, the store in 4 column slices (gluon_ws.CONFIG)
  ws_s4        the same with 4 stages (229,448 bytes of shared memory of sm_90's 232,448)
  ws_n128_s4   128 x 128 x 64, 4 stages
  ws_n128_s6   128 x 128 x 64, 6 stages
  ws_g16       ws with GROUP_M = 16
  pp           the ping-pong schedule (gluon_ws.PINGPONG): each consumer takes every other
               128 x 128 tile whole, so one's epilogue runs while the other's products do;
               4 stages
  pp_s6        pp with 6 stages
(An epilogue storing the wgmma fragments where they lie made ptxas serialize the wgmmas for a
bf16 C, C7514, in the sm_90 cross-compile: the template moves each slice through shared memory.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("OUT", "."))
VARIANTS = {
    "ws": {},
    "ws_s4": {"STAGES": 4},
    "ws_n128_s4": {"BLOCK_N": 128, "STAGES": 4},
    "ws_n128_s6": {"BLOCK_N": 128, "STAGES": 6},
    "ws_g16": {"GROUP_M": 16},
    "pp": {"BLOCK_N": 128, "STAGES": 4, "PINGPONG": True},
    "pp_s6": {"BLOCK_N": 128, "STAGES": 6, "PINGPONG": True},
}
SHAPES = [(16384, 6144, 4096), (16384, 4096, 4096), (16384, 28672, 4096), (16384, 4096, 14336),
          (8192, 8192, 8192), (256, 8192, 8192), (4096, 128256, 4096, "fp32")]


def _check(name: str) -> dict:
    """In the child: run variant `name` on two shapes, against torch.mm in fp32."""
    import torch
    sys.path.insert(0, str(HERE))
    import ws_gluon
    cfg = VARIANTS[name]
    rows = []
    # the fp32 output (a bf16 package of an fp32 model writes one) on the ragged shape
    for M, N, K, out in ((1000, 1100, 1032, torch.bfloat16), (2048, 2048, 2048, torch.bfloat16),
                         (1000, 1100, 1032, torch.float32)):
        g = torch.Generator(device="cuda").manual_seed(M)
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        b = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
        c = torch.full((M, N), float("nan"), device="cuda", dtype=out)
        ws_gluon.launch(a, b, c, **cfg)
        torch.cuda.synchronize()
        ref = a.float() @ b.float().t()
        err = ((c.float() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
        rows.append({"shape": [M, N, K], "out": str(out), "worst": err,
                     "finite": bool(torch.isfinite(c).all().item())})
    # bf16 C: its rounding (2^-9); fp32 C: the tensor cores' fp32 sums against torch's, well under
    # a bf16 rounding
    ok = all(r["finite"] and r["worst"] <= (1e-2 if r["out"] == str(torch.bfloat16) else 5e-4)
             for r in rows)
    return {"name": name, "ok": ok, "rows": rows}


def check_all(names, limit_s: float) -> dict:
    procs = {n: subprocess.Popen([sys.executable, __file__, "--check", n], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for n in names}
    t0, res = time.time(), {}
    for n, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(1.0, limit_s - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            res[n] = {"name": n, "ok": False, "error": f"hang: no result in {limit_s:g} s"}
            continue
        last = (out.strip().splitlines() or [""])[-1]
        try:
            res[n] = json.loads(last)
        except json.JSONDecodeError:
            res[n] = {"name": n, "ok": False, "error": (err or out)[-1500:]}
    return res


def main() -> int:
    import torch
    from triton.testing import do_bench
    sys.path.insert(0, str(HERE))
    import ws_gluon  # noqa: F401 - the kernel's module compiles here before any child runs
    if not torch.cuda.is_available():
        print("ws_ab.py: no CUDA device here; the kernel is for sm_90 (run it on the device "
              "machine; ws_gluon.py cross-compiles without one)", file=sys.stderr)
        return 2
    names = [n for n in os.environ.get("WS_VARIANTS", ",".join(VARIANTS)).split(",") if n]
    shapes = SHAPES
    if os.environ.get("WS_SHAPES"):
        shapes = [tuple(int(v) if v.isdigit() else v for v in s.split(","))
                  for s in os.environ["WS_SHAPES"].split(";")]
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "variants": VARIANTS}
    res["check"] = check_all(names, float(os.environ.get("WS_CHECK_S", "120")))
    for n, r in res["check"].items():
        print(n, "ok" if r.get("ok") else "FAILED", r.get("rows") or r.get("error", "")[-300:],
              flush=True)
    good = [n for n in names if res["check"][n].get("ok")]
    res["rows"] = []
    for M, N, K, *out_dtype in shapes:
        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        b = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        # "fp32": our kernel writes fp32 (a bf16 package's LM head on an fp32 model), cuBLAS bf16
        # (the model cast to bf16)
        ours = torch.empty(M, N, device="cuda", dtype=torch.float32) \
            if out_dtype == ["fp32"] else c
        flop = 2.0 * M * N * K
        row = {"shape": [M, N, K], "out": str(ours.dtype)}
        t_first = do_bench(lambda: torch.mm(a, b.t(), out=c), warmup=10, rep=50,
                           return_mode="median")
        for n in good:
            cfg = VARIANTS[n]
            row[n] = do_bench(lambda: ws_gluon.launch(a, b, ours, **cfg), warmup=10, rep=50,
                              return_mode="median")
        del ours
        t_last = do_bench(lambda: torch.mm(a, b.t(), out=c), warmup=10, rep=50,
                          return_mode="median")
        row["cublas"] = (t_first + t_last) / 2
        row["cublas_spread"] = abs(t_first - t_last) / row["cublas"]
        res["rows"].append(row)
        line = f"{M:>6} {N:>6} {K:>6}  cublas {row['cublas']:.3f} ms " \
               f"{flop / row['cublas'] / 1e9:.0f} TFLOP/s"
        for n in good:
            line += f" | {n} {row[n]:.3f} ms {row['cublas'] / row[n]:.2f}x"
        print(line, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ws_ab.json").write_text(json.dumps(res, indent=1))
    # the builtin's two configurations (gluon_ws.CONFIG and PINGPONG): exit 1 where either
    # failed its check, so that a device call does not go on to verify packages that hold it
    # (a deadlock there costs each package the verifier's time limit)
    return 0 if all(res["check"].get(n, {}).get("ok") for n in ("ws", "pp")
                    if n in res["check"]) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        try:
            print(json.dumps(_check(sys.argv[2])))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which records it
            print(json.dumps({"name": sys.argv[2], "ok": False, "error": repr(e)[-1500:]}))
        sys.exit(0)
    sys.exit(main())
