"""The host side of a builtin candidate: `prepare_weights` (weights scaled and split, or cast,
once at load) and the module source that defines the kernels and `launch`.
"""
from __future__ import annotations

import hashlib
import re
import textwrap

from kforge.providers.builtin.analysis import RegionShape
from kforge.providers.builtin.builder import Builder, ops_comment
from kforge.providers.builtin.emitter import TORCH_DTYPES, combine_function


# fp16x3 / fp16x1 weights, split once at load. A block of at most `block` elements at a time
# (one dim's rows, single indices of the dims before it), written into the preallocated planes:
# the temporaries are a few blocks, not a few weights (split whole, a 32768x32768 fp32 weight
# held 3.5 weight-sized temporaries: 4.06x the region's bytes in the verifier's worker, H200).
# Elementwise, and the column max is exact however it is blocked: the planes are the same values.
FP16_PREPARE_WEIGHTS = """\
def prepare_weights(weights, block=1 << 24):
    # fp16x3 / fp16x1: each matrix weight scaled per output column by a power of two (column
    # max < 2**15), split into fp16 hi + lo (fp16x1: hi alone), stored flat: [hi plane, lo
    # plane, column exponents e - 15]; computed a block of at most `block` elements at a time
    def blocks(shape):
        # index tuples covering `shape`: rows of its first dim, or one row and blocks of the rest
        if not shape:
            yield ()
            return
        inner = shape[1:].numel()
        if inner <= block:
            rows = max(1, block // max(inner, 1))
            for r in range(0, shape[0], rows):
                yield (slice(r, min(r + rows, shape[0])),)
        else:
            for r in range(shape[0]):
                for rest in blocks(shape[1:]):
                    yield (slice(r, r + 1),) + rest

    def columns(blk, k_dims):
        # a block's index into a per-column tensor (size 1 along the K dims)
        return tuple(slice(None) if d in k_dims else s for d, s in enumerate(blk))

    out = dict(weights)
    for i, (n_dims, planes) in FP16_WEIGHTS.items():  # weight: its output-column dims, planes
        w = weights[i]
        k_dims = tuple(d for d in range(w.dim()) if d not in n_dims)
        amax = torch.zeros([1 if d in k_dims else n for d, n in enumerate(w.shape)],
                           device=w.device, dtype=torch.float32)
        for blk in blocks(w.shape):
            part = w[blk].to(torch.float32).abs()
            part = part.amax(dim=k_dims, keepdim=True) if k_dims else part
            col = amax[columns(blk, k_dims)]
            torch.maximum(col, part, out=col)
        e = torch.frexp(amax)[1].clamp(-100, 100)            # amax < 2**e
        e = torch.where(amax > 0, e, torch.zeros_like(e))     # zero columns
        scale = torch.ldexp(torch.ones_like(amax), 15 - e)
        n = w.numel()
        flat = torch.empty(planes * n + amax.numel(), device=w.device, dtype=torch.float16)
        hi = flat[:n].view(w.shape)
        lo = flat[n:2 * n].view(w.shape) if planes == 2 else None
        for blk in blocks(w.shape):
            ws = w[blk].to(torch.float32) * scale[columns(blk, k_dims)]
            h = ws.to(torch.float16)
            hi[blk] = h
            if lo is not None:
                lo[blk] = ws.sub_(h.to(torch.float32)).to(torch.float16)
        flat[planes * n:] = (e - 15).to(torch.float16).reshape(-1)
        out[i] = flat
    return out
"""


# 3xtf32 weights, split once at load a block at a time into the preallocated planes (split
# whole: the rounding's int32 temporaries, w - hi and the stack, 4 weight-sized at once).
TF32_PREPARE_WEIGHTS = """\
def prepare_weights(weights, block=1 << 24):
    # matrix weights stored once as [hi, lo] planes: hi rounded to tf32 (10 mantissa bits),
    # lo = w - hi exactly; computed a block of at most `block` elements at a time
    out = dict(weights)
    for i in TF32_WEIGHTS:
        w = weights[i].to(torch.float32).contiguous().view(-1)
        planes = torch.empty((2, w.numel()), device=w.device, dtype=torch.float32)
        for k in range(0, w.numel(), block):
            x = w[k:k + block]
            hi = ((x.view(torch.int32) + 0x1000) & -8192).view(torch.float32)
            planes[0, k:k + block] = hi
            planes[1, k:k + block] = x - hi
        out[i] = planes.view((2,) + tuple(weights[i].shape))
    return out
"""


# Sibling products (SwiGLU's gate and up, gemm.py's partner): each weight prepared as above, then
# their rows interleaved in blocks of `half` ([rows 0..half of the first, rows 0..half of the
# second, rows half..2 half of the first, ...]), fp16x1's column exponents the same way after
# the plane: one tile of the GEMM reads half its columns from each through one descriptor. The
# second weight's own copy is dropped (its argument is not read).
PAIR_WEIGHTS = """\
def prepare_weights(weights):
    # sibling products' weights, prepared each (above), then interleaved in blocks of rows
    out = _prepare_each(weights)
    for i, (j, half, n, k) in PAIRED_WEIGHTS.items():
        a, b = out[i].reshape(-1), out[j].reshape(-1)
        blocks = lambda t: t[:n * k].view(n // half, half, k)
        parts = [torch.stack((blocks(a), blocks(b)), 1).reshape(-1)]
        if a.numel() > n * k:           # fp16x1: the column exponents after the plane
            parts.append(torch.stack((a[n * k:].view(n // half, half),
                                      b[n * k:].view(n // half, half)), 1).reshape(-1))
        out[i] = torch.cat(parts) if len(parts) > 1 else parts[0].view(2 * n, k)
        out[j] = b.new_empty(0)
    return out
"""


# A pass's outputs are a function of its inputs: the package runtime serves a pass that another
# region's launch already ran on the same tensors (kforge.passcache: Q, K and V's projections
# each split the same normed activation); alone (verification, tests) every launch runs its own.
SHARED_PASS = """\
def _shared_pass(key, inputs, run):
    # run() allocates the pass's outputs and launches it; the package runtime rebinds this name
    # to kforge.passcache.shared_pass, which returns the outputs of an earlier run of the same
    # pass (key) on the same, unchanged input tensors
    return run()
"""


def pass_digest(k, allocs: dict[str, str]) -> str:
    """What a shared pass computes, whatever region it is in: its body and launch with the
    parameter and tensor names numbered, its outputs' allocations, not its name or comment."""
    body = "\n".join(k.lines)
    for j, p in sorted(enumerate(k.params), key=lambda jp: -len(jp[1])):
        body = re.sub(rf"\b{re.escape(p)}\b", f"_p{j}", body)
    call = k.call([f"_t{j}" for j in range(len(k.tensors))], name="_pass")
    shapes = [allocs[o].split("#")[0].strip() for o in k.outputs]
    text = "\n".join([body, call, *shapes])       # (the call names the constexprs' values)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def assemble(b: Builder, shape: RegionShape, config: dict) -> str:
    spec, target = b.spec, b.target
    args = [a.name for a in spec.args]
    lines = [f'"""KForge builtin kernel for region {spec.hash} ({spec.name}).',
             "",
             f"Fused: {', '.join(spec.fused) or ops_comment(spec)}. "
             f"Kind: {' + '.join(st.kind for st in (shape.stages or [shape]))}. "
             f"Precision: {b.precision}. Target: {target.name}.",
             f"Config: {config}",
             '"""',
             "import torch",
             "import triton",
             "import triton.language as tl"]
    if b.math_used and target.math_imports:
        lines.append(target.math_imports)
    if b.gluon:
        from kforge.providers.builtin.gluon import HEADER
        lines.append(HEADER.rstrip("\n"))
    lines.append("")
    for name in b.combiners:
        lines += ["", combine_function(name)]
    for k in b.kernels:
        lines += ["", k.source()]
    prepared = []
    partners = {p for p, *_ in b.paired_weights.values()}
    if b.precision == "bf16" and not config.get("input_precision"):
        for i, a in enumerate(spec.args):
            if a.weight and a.dtype == "f32" and (b.dot_loads.get(a.name) == {"dot"}
                                                  or a.name in partners):
                prepared.append(i)
    # weights a TMA descriptor reads as they are (a bf16 model's): stored 16-byte aligned once
    # (a tensor mapped from a weights file may start at any even address)
    aligned = [i for i, a in enumerate(spec.args) if a.weight and a.name in b.descriptor_args
               and i not in prepared and a.dtype != "f32"]
    split = [i for i, a in enumerate(spec.args) if a.name in b.split_weights]
    fp16 = {i: b.fp16_weights[a.name] for i, a in enumerate(spec.args)
            if a.name in b.fp16_weights}
    prep = None
    if fp16:
        prep = FP16_PREPARE_WEIGHTS.replace("FP16_WEIGHTS", repr(fp16))
    elif prepared or aligned:
        prep = ("def prepare_weights(weights):\n"
                "    # weights read only as matrix operands are cast to bf16 once, at load;\n"
                "    # those a TMA descriptor reads as they are, 16-byte aligned\n"
                f"    return {{i: (w.to(torch.bfloat16) if i in {tuple(prepared)!r} else "
                f"w.clone() if i in {tuple(aligned)!r} and w.data_ptr() % 16 else w)"
                " for i, w in weights.items()}\n")
    elif split:
        prep = TF32_PREPARE_WEIGHTS.replace("TF32_WEIGHTS", repr(tuple(split)))
    if prep and b.paired_weights:
        # the weights prepared each by the function above (nested: all of prepare_weights'
        # work stays in prepare_weights), then paired
        index = {a.name: i for i, a in enumerate(spec.args)}
        pairs = {index[w]: (index[p], half, n, k)
                 for w, (p, half, n, k) in b.paired_weights.items()}
        each = textwrap.indent(prep.replace("def prepare_weights(", "def _prepare_each("), "    ")
        head, body = PAIR_WEIGHTS.replace("PAIRED_WEIGHTS", repr(pairs)).split("\n", 1)
        prep = f"{head}\n{each}{body}"
    if prep:
        lines += ["", prep]
    if any(k.shared for k in b.kernels):
        lines += ["", SHARED_PASS]
    lines += ["", f"def launch({', '.join(args)}):"]
    lines.append(f"    for t in ({', '.join(args)}{',' if len(args) == 1 else ''}):")
    lines.append("        if not t.is_contiguous():")
    lines.append(f'            raise ValueError("{spec.name}: arguments must be contiguous")')
    for a in spec.args:
        if a.name in b.descriptor_args and not a.weight:
            # TMA needs a 16-byte aligned base: an activation viewed at an odd offset is copied
            lines.append(f"    if {a.name}.data_ptr() % 16:")
            lines.append(f"        {a.name} = {a.name}.clone()")
    # a region without operands (a mask from index ranges) computes on the target's device
    lines.append(f"    device = {args[0]}.device" if args else f"    device = {b.target.device!r}")
    results = set(shape.outputs) | {o for st in shape.stages for o in st.outputs}
    allocs: dict[str, str] = {}
    for v, alloc in b.temporaries.items():
        if v in results:
            continue                          # a region result, allocated below
        if alloc is None:
            t = spec.tensor(v)
            alloc = (f"torch.empty({tuple(t.shape)!r}, device=device, "
                     f"dtype={TORCH_DTYPES[t.dtype]})")
        allocs[v] = alloc
    # passes the runtime may share between regions (Kernel.shared): their outputs allocated
    # where they run, and names that alias those outputs (a partner's planes) right after
    shared = [k for k in b.kernels if k.shared and k.outputs
              and all(o in allocs and allocs[o].startswith("torch.") for o in k.outputs)]
    made_by = {o: k.name for k in shared for o in k.outputs}
    after: dict[str, list[str]] = {}
    for v, alloc in allocs.items():
        if v in made_by:
            continue
        refs = [n for n in made_by if re.search(rf"\b{re.escape(n)}\b", alloc.split("#")[0])]
        if refs:
            after.setdefault(made_by[refs[0]], []).append(f"    {v} = {alloc}")
        else:
            lines.append(f"    {v} = {alloc}")
    for o in dict.fromkeys(o for st in (shape.stages or [shape]) for o in st.outputs):
        t = spec.tensor(o)
        lines.append(f"    {o} = torch.empty({tuple(t.shape)!r}, device=device, "
                     f"dtype={TORCH_DTYPES[t.dtype]})")
    if b.tma:
        lines.append("    # tl.make_tensor_descriptor writes the descriptors to scratch memory "
                     "it takes from this allocator")
        lines.append("    triton.set_allocator(lambda size, alignment, stream: "
                     "torch.empty(size, device=device, dtype=torch.int8))")
    shared_ids = {id(k) for k in shared}
    for i, k in enumerate(b.kernels):
        if id(k) not in shared_ids:
            lines.append(f"    {k.call()}")
            continue
        outs = ", ".join(k.outputs)
        ins = k.tensors[:len(k.tensors) - len(k.outputs)]
        lines.append(f"    def _pass_{i}():")
        lines += [f"        {o} = {allocs[o]}" for o in k.outputs]
        lines += [f"        {k.call()}", f"        return ({outs},)"]
        lines.append(f"    ({outs},) = _shared_pass({pass_digest(k, allocs)!r}, "
                     f"({', '.join(ins)}{',' if len(ins) == 1 else ''}), _pass_{i})")
        lines += after.get(k.name, [])
    lines.append(f"    return ({', '.join(spec.results)}{',' if len(spec.results) == 1 else ''})")
    return "\n".join(lines) + "\n"
