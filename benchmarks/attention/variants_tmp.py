"""Temporary: source-patch variants of the bf16 prefill kernel, timed on the H200."""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch, triton
from triton.testing import do_bench
from kforge.kernels.attention import attention_source, load_source, reference_attention

TRANS = [
 ("kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd",
  "kt_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd"),
 ("kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)",
  "kt = tl.trans(tl.load(kt_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0))"),
 ("kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)",
  "kt = tl.trans(tl.load(kt_ptrs, mask=d_ok[None, :], other=0.0))"),
 ("kt = tl.load(kt_ptrs)", "kt = tl.trans(tl.load(kt_ptrs))"),
]
GUARD = [("    m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)    # a row with nothing kept yet\n",
          "    if BOUNDS or MASK_KIND != 0:\n        m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)\n    else:\n        m_use = m_new\n")]
NOREV = [("    if CAUSAL:\n        start_m = n_m - 1 - start_m\n", "")]
VARIANTS = {"base": [], "trans_k": TRANS, "guard": GUARD, "norev": NOREV, "all": TRANS + GUARD + NOREV,
            "trans_guard": TRANS + GUARD}
B, H, S, D = 8, 32, 2048, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
ref = reference_attention(q[:1].double(), k[:1].double(), v[:1].double(), causal=True)
flops = 4.0 * D * (S * (S + 1) / 2) * B * H
cfgs = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 2)]
res = []
for name, patches in VARIANTS.items():
    for bm, bn, w, s in cfgs:
        if name not in ("base", "all", "trans_guard") and (bm, bn, w, s) != (128, 64, 8, 3):
            continue
        src = attention_source(head_dim=D, causal=True, dtype="bf16", dot_precision="bf16",
                               block_m=bm, block_n=bn, num_warps=w, num_stages=s)
        for a, b_ in patches:
            assert a in src, (name, a)
            src = src.replace(a, b_)
        try:
            mod = load_source(src, f"var_{name}")
            (o,) = mod.launch(q, k, v)
            err = ((o[:1].double() - ref).abs().max()).item()
            ms = do_bench(lambda: mod.launch(q, k, v), warmup=25, rep=200, return_mode="median")
            ms2 = do_bench(lambda: mod.launch(q, k, v), warmup=25, rep=200, return_mode="median")
            r = dict(variant=name, cfg=f"{bm}x{bn} w{w} s{s}", ms=ms, ms_again=ms2, tflops=flops / ms / 1e9, max_err=err)
        except Exception as exc:
            r = dict(variant=name, cfg=f"{bm}x{bn} w{w} s{s}", error=str(exc)[:300])
        print(r, flush=True)
        res.append(r)
sd = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), warmup=25, rep=200, return_mode="median")
print("sdpa ms", sd, "tflops", flops / sd / 1e9)
json.dump(dict(res=res, sdpa_ms=sd), open(os.path.join(os.environ.get("OUT", "."), "variants.json"), "w"), indent=1)
