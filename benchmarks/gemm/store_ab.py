"""A/B of the builtin TMA GEMM's epilogue store on a package's own kernels, against cuBLAS.

    python benchmarks/gemm/store_ab.py PACKAGE HASH [HASH ...] [--out DIR]

For each region HASH of PACKAGE (a compiled package whose kernels/HASH/kernel.py is a builtin
persistent TMA GEMM), times on the GPU, in one process, with triton.testing.do_bench (L2
flushed, median):
  base      the kernel as generated (epilogue slices stored by masked tl.store)
  tma_store the same source with each slice's tl.store of the output replaced by a TMA
            descriptor store (what kernels/gemm.py's tma2 does)
  noflat    base with the tile loop not flattened
  pass      the launch without the GEMM (the activation's split pass, and any kernel after
            the GEMM, such as a norm's rows kernel or RoPE's elementwise kernel)
  sweep_*   (--sweep) base with other tiles, GROUP_M or stages on the GEMM's launch line
  cublas    torch.mm on bf16 copies of the operands, bf16 out (the bf16 model's GEMM), and
            with out_dtype=float32 (cuBLAS writing fp32, as KForge does)
  tma_bf16out  tma_store writing a bf16 output (what the fp32 output costs)
Each variant's output is compared with base's (max abs difference over max abs). The rewrites
are textual and apply only where the store is the plain `tl.store(out + ((rm * N) + rn), x)`
of an unmasked [M, N] fp32 output; other regions get base, pass and cublas only.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import types
from pathlib import Path

import torch
import triton

STORE = re.compile(r"^(\s*)tl\.store\((\w+) \+ \(\(rm \* (\d+)\) \+ rn\), (\w+)\)\s*$")
SLICE = re.compile(r"rn = pid_n \* BLOCK_N \+ (\d+) \* EPI_N")
MROWS = re.compile(r"num_pid_m = \((\d+) \+ BLOCK_M - 1\)")
TILE_LOAD = re.compile(r"tl\.load\((\w+) \+ \(\(rm \* (\d+)\) \+ rn\)\)")


SWEEP = {"g8": {"GROUP_M": 8}, "g32": {"GROUP_M": 32}, "s3": {"num_stages": 3},
         "256x128": {"BLOCK_M": 256, "BLOCK_N": 128, "EPI_N": 32},
         "256x128_s3": {"BLOCK_M": 256, "BLOCK_N": 128, "EPI_N": 32, "num_stages": 3}}


def tma_store_source(src: str, loads: bool = False) -> str | None:
    """`src` with the GEMM's output stores done by a TMA descriptor (`loads`: the epilogue's
    [M, N] tile operands read by one too), or None if not plain."""
    lines, out, made, m_rows, j = src.splitlines(), [], set(), None, 0
    for line in lines:
        mm = MROWS.search(line)
        if mm:
            m_rows = int(mm.group(1))
        sl = SLICE.search(line)
        if sl:
            j = int(sl.group(1))
        if loads and m_rows:
            for ptr, n in set(TILE_LOAD.findall(line)):
                if ptr not in made:
                    at = max(i for i, l in enumerate(out)
                             if "w_desc = tl.make_tensor_descriptor" in l)
                    top = re.match(r"^(\s*)", out[at]).group(1)
                    out.insert(at + 1, f"{top}{ptr}_desc = tl.make_tensor_descriptor({ptr}, "
                               f"shape=[{m_rows}, {n}], strides=[{n}, 1], "
                               f"block_shape=[BLOCK_M, EPI_N])")
                    made.add(ptr)
                line = line.replace(f"tl.load({ptr} + ((rm * {n}) + rn))",
                                    f"{ptr}_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N + {j} "
                                    "* EPI_N])")
        st = STORE.match(line)
        if st and m_rows:
            ind, ptr, n, val = st.groups()
            if ptr not in made:
                # the descriptor right after w_desc (the kernel's top level)
                at = max(i for i, l in enumerate(out) if "w_desc = tl.make_tensor_descriptor" in l)
                top = re.match(r"^(\s*)", out[at]).group(1)
                out.insert(at + 1, f"{top}{ptr}_desc = tl.make_tensor_descriptor({ptr}, "
                           f"shape=[{m_rows}, {n}], strides=[{n}, 1], "
                           f"block_shape=[BLOCK_M, EPI_N])")
                made.add(ptr)
            out.append(f"{ind}{ptr}_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + {j} * EPI_N],"
                       f" {val})")
            continue
        out.append(line)
    return "\n".join(out) + "\n" if made else None


def load(src: str, name: str):
    mod = types.ModuleType(name)
    path = Path(f"/tmp/kforge_store_ab_{name}.py")
    path.write_text(src)
    code = compile(src, str(path), "exec")
    exec(code, mod.__dict__)
    return mod


def inputs(spec: dict, device):
    args, weights = [], {}
    g = torch.Generator(device=device).manual_seed(0)
    for i, a in enumerate(spec["args"]):
        shape = a["shape"]
        if a.get("weight"):
            t = (torch.rand(shape, device=device, generator=g) * 2 - 1) / shape[-1] ** 0.5
            weights[i] = t
        else:
            t = torch.randn(shape, device=device, generator=g)
        args.append(t)
    return args, weights


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("hashes", nargs="+")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="", help="comma-separated variants to time (e.g. base)")
    ap.add_argument("--sweep", default="", help="comma-separated hashes to try SWEEP's tiles on")
    o = ap.parse_args()
    o.sweep = set(filter(None, o.sweep.split(",")))
    o.only = set(filter(None, o.only.split(",")))
    dev = torch.device("cuda")
    rows = []
    for h in o.hashes:
        pkg = Path(o.package)
        spec = json.loads((pkg / "regions" / f"{h}.json").read_text())
        src = (pkg / "kernels" / h / "kernel.py").read_text()
        variants = {"base": src}
        t = tma_store_source(src)
        if t:
            variants["tma_store"] = t
        if t:
            # the same with a bf16 output: what writing fp32 costs over the bf16 model's output
            outs = sorted(set(re.findall(r"(\w+)_out_desc\.store", t)))
            b16 = re.sub(r"(\w+_out_desc\.store\(\[[^\]]*\], )(\w+)\)", r"\1\2.to(tl.bfloat16))", t)
            for v in outs:
                b16 = re.sub(rf"(\n\s*{v} = torch\.empty\([^\n]*dtype=torch\.)float32", r"\1bfloat16",
                             b16)
            variants["tma_bf16out"] = b16
        t2 = tma_store_source(src, loads=True)
        if t2 and t2 != t:
            variants["tma_io"] = t2
        if "flatten=True" in src:
            variants["noflat"] = src.replace("flatten=True", "num_stages=1")
            if t:
                variants["tma_noflat"] = t.replace("flatten=True", "num_stages=1")
        if h in o.sweep:
            # other tiles of the persistent kernel, by its launch line (EPI_N = BLOCK_N / 4)
            launch = re.search(r"_gemm\[\(\d+,\)\]\([^\n]*", src).group(0)
            for tag, sub in SWEEP.items():
                new = launch
                for k, v in sub.items():
                    new = re.sub(rf"\b{k}=\d+", f"{k}={v}", new)
                variants[f"sweep_{tag}"] = src.replace(launch, new)
        # the split pass alone: launch() up to (not including) the GEMM's launch
        head = re.sub(r"\n(\s*)(\w+_gemm\[.*)\n", r"\n\1pass  # \2\n", src)
        if head != src:
            variants["pass"] = head
        if o.only:
            variants = {k: v for k, v in variants.items() if k in o.only}
        args, weights = inputs(spec, dev)
        mods = {k: load(v, f"{h}_{k}") for k, v in variants.items()}
        prepared = mods["base"].prepare_weights(weights)
        call = [prepared.get(i, a) for i, a in enumerate(args)]
        ref = mods["base"].launch(*call)[0]
        scale = ref.abs().max().item()
        row = {"region": h, "fused": spec.get("fused"), "flops": spec.get("flops")}
        for k, m in mods.items():
            try:
                if k != "pass":
                    got = m.launch(*call)[0]
                    row[f"{k}_diff"] = (got - ref).abs().max().item() / scale
                    del got
                row[f"{k}_ms"] = bench(lambda: m.launch(*call))
            except Exception as e:                      # a variant that does not compile
                row[f"{k}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps({k2: v for k2, v in row.items() if k2.startswith(k)}), flush=True)
        del ref
        # cuBLAS: the GEMM of the region on bf16 copies (activation [M, K], weight [N, K])
        w_i = next(i for i, t in weights.items() if t.dim() == 2)
        w = weights[w_i].to(torch.bfloat16)
        a_i = next(i for i, a in enumerate(spec["args"]) if not a.get("weight")
                   and a["shape"][-1] == w.shape[-1])
        a = args[a_i].reshape(-1, w.shape[-1]).to(torch.bfloat16)
        row["cublas_ms"] = bench(lambda: torch.mm(a, w.T))
        try:                            # cuBLAS with an fp32 output (torch >= 2.9)
            row["cublas_fp32out_ms"] = bench(lambda: torch.mm(a, w.T, out_dtype=torch.float32))
        except Exception as e:          # noqa: BLE001 - not in this torch
            row["cublas_fp32out_error"] = str(e)[:200]
        row["shape_mnk"] = [a.shape[0], w.shape[0], w.shape[1]]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del a, w, args, weights, prepared, call, mods
        torch.cuda.empty_cache()
    if o.out:
        Path(o.out).mkdir(parents=True, exist_ok=True)
        (Path(o.out) / "store_ab.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
