"""Compile every GEMM variant x config for sm_90 on a machine WITHOUT a GPU (Triton's own ptxas).

Checks what costs no device time: wgmma in the PTX, shared memory per block (H200 limit 232448 B),
registers/spills where the backend reports them. Triton here may be newer than the device's 3.6:
treat as a lead. Usage: python benchmarks/gemm/compile_check.py [--json out.json]
"""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kforge.kernels.gemm import config_space, render_gemm, load_source  # noqa: E402

SMEM_LIMIT = 232448
VARIANTS = [("strict", "fp16x3", "pass"), ("strict", "3xtf32", "kernel"), ("strict", "3xtf32", "pass"),
            ("strict", "bf16x3", "pass"), ("strict", "tf32x3", "kernel"), ("strict", "tri-bf16x6", "kernel"),
            ("tf32", "tf32", "kernel"), ("bf16", "bf16", "kernel"), ("bf16", "bf16", "pass")]


def compile_one(prec, impl, a_prep, cfg):
    src = render_gemm("g", precision=prec, impl=impl, a_prep=a_prep, has_bias=True,
                      epilogue="acc = tl.maximum(acc, 0.0)")
    m = load_source(src)
    fn = m.g_kernel
    adt = {"3xtf32": "fp32", "bf16x3": "bf16", "bf16": "bf16", "fp16x3": "fp16"}.get(impl, "fp32") \
        if a_prep == "pass" else "fp32"
    bdt = {"bf16": "bf16", "bf16x3": "bf16", "fp16x3": "fp16"}.get(impl, "fp32")
    types = {"a_ptr": "*" + adt, "b_ptr": "*" + bdt, "c_ptr": "*fp32", "bias_ptr": "*fp32",
             "kf_sa_ptr": "*fp32", "kf_sb_ptr": "*fp32"}
    consts = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K")}
    consts.update(EVEN_K=True, DOT_F32=False, stride_ak=1, stride_bk=1, stride_cn=1)
    sig, attrs = {}, {}
    for i, nm in enumerate(fn.arg_names):
        if nm in consts:
            sig[nm] = "constexpr"
        elif nm in types:
            sig[nm] = types[nm]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[nm] = "i32"
            if nm.startswith("stride") or nm in ("K",):
                attrs[(i,)] = [["tt.divisibility", 16]]
    t = time.time()
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
    ptx = k.asm["ptx"]
    return {"prec": prec, "impl": impl, "a_prep": a_prep, "cfg": cfg, "compile_s": round(time.time() - t, 2),
            "wgmma": "wgmma" in ptx, "n_wgmma": len(re.findall(r"wgmma.mma_async", ptx)),
            "shared": k.metadata.shared, "fits": k.metadata.shared <= SMEM_LIMIT,
            "ttgir_local_alloc": k.asm["ttgir"].count("local_alloc")}


if __name__ == "__main__":
    rows = []
    for prec, impl, ap in VARIANTS:
        for cfg in config_space(prec, impl, tma=False):
            try:
                r = compile_one(prec, impl, ap, cfg)
            except Exception as e:  # noqa: BLE001
                r = {"prec": prec, "impl": impl, "a_prep": ap, "cfg": cfg, "error": str(e)[:200]}
            rows.append(r)
            c = cfg
            print(f"{impl:7s} {ap:6s} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']} s{c['num_stages']}:",
                  r.get("error") or f"wgmma={r['wgmma']}({r['n_wgmma']}) smem={r['shared']} fits={r['fits']} "
                  f"allocs={r['ttgir_local_alloc']} {r['compile_s']}s", flush=True)
    if "--json" in sys.argv:
        json.dump(rows, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
