"""How far fp32-grade split GEMMs (3xTF32 with cvt.rna rounding, fp16x3 unscaled) and a plain
K-blocked fp32 accumulation are from float64, relative to torch's own CPU fp32 GEMM (MKL), the
yardstick of the strict contract (kforge.verify.contract allows 2x). Emulated with torch on the
CPU: products of the parts are exact in fp32, as on tensor cores; K blocks of 16 accumulate in
fp32 as a Triton kernel does. Output of one run (2026-12-01, torch 2.13 CPU) in split_error_cpu.txt.
Run: python benchmarks/contract/split_error_cpu.py"""
import torch, math
def rna(a):
    return ((a.view(torch.int32) + 0x1000) & -8192).view(torch.float32)
def blocked(parts, BK=16):
    # acc += dot over K blocks, as a Triton kernel does (each dot in fp32)
    M = parts[0][0].shape[0]; N = parts[0][1].shape[1]; K = parts[0][0].shape[1]
    acc = torch.zeros(M, N)
    for k in range(0, K, BK):
        for a, b in parts:
            acc = acc + a[:, k:k+BK] @ b[k:k+BK]
    return acc
g = torch.Generator().manual_seed(1)
for M,K,N in [(8,32,16),(16,256,64),(32,1024,256),(64,4096,128)]:
  for trial in range(2):
    x = torch.randn(M,K,generator=g); w = torch.randn(K,N,generator=g)/math.sqrt(K)
    ref = (x.double() @ w.double())
    e32 = ((x @ w).double() - ref).abs().max().item()
    eb = (blocked([(x,w)]).double()-ref).abs().max().item()
    xh, wh = rna(x), rna(w); xl, wl = rna(x - xh), rna(w - wh)
    e3 = (blocked([(xh,wh),(xh,wl),(xl,wh)]).double() - ref).abs().max().item()
    a, c = x.half().float(), w.half().float(); b, d = (x-a).half().float(), (w-c).half().float()
    eh = (blocked([(a,c),(a,d),(b,c)]).double()-ref).abs().max().item()
    print(M,K,N, f"e32 {e32:.2e} blocked-fp32 {eb/e32:.2f}x 3xtf32(rna) {e3/e32:.2f}x f16x3 {eh/e32:.2f}x")
