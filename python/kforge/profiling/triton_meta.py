"""Compile metadata and code facts of Triton kernels.

Two ways in: a compiled kernel in this process (`facts_from_compiled`: `CompiledKernel.metadata`,
`.asm` and, once its binary is loaded, `n_regs` / `n_spills`), or what Triton writes to its cache
and what the profiling worker dumps (`facts_from_dump`: the metadata JSON and the PTX / TTGIR /
LLIR text). The code facts are read from the text: matrix instructions (wgmma, mma.sync, DPAS),
bulk tensor copies (TMA) and the widths in bytes of the kernel's global loads.
"""
from __future__ import annotations

import re
from collections import Counter

from kforge.profiling.schema import KernelFacts

_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "f16": 16, "bf16": 16, "u16": 16, "s16": 16,
         "b32": 32, "f32": 32, "u32": 32, "s32": 32, "b64": 64, "f64": 64, "u64": 64, "s64": 64,
         "b128": 128}
_LD_GLOBAL = re.compile(r"\bld\.global((?:\.[\w:]+)+)")
_CP_ASYNC = re.compile(r"\bcp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)*\s*\[[^\]]*\],\s*"
                       r"\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")
_LLIR_LOAD = re.compile(r"load <(\d+) x (float|half|bfloat|double|i8|i16|i32|i64)>, ptr "
                        r"addrspace\(1\)")
_LLIR_BITS = {"float": 32, "half": 16, "bfloat": 16, "double": 64, "i8": 8, "i16": 16,
              "i32": 32, "i64": 64}


def ptx_load_widths(ptx: str) -> Counter:
    """Bytes per global load -> number of load instructions, from PTX: `ld.global[.nc][.L1::..]
    [.vN].TYPE` and the asynchronous copies `cp.async.cg.shared.global [..], [..], BYTES`."""
    widths: Counter = Counter()
    for m in _LD_GLOBAL.finditer(ptx):
        parts = m.group(1).strip(".").split(".")
        vec, bits = 1, None
        for p in parts:
            if re.fullmatch(r"v\d", p):
                vec = int(p[1:])
            elif p in _BITS:
                bits = _BITS[p]
        if bits:
            widths[vec * bits // 8] += 1
    for m in _CP_ASYNC.finditer(ptx):
        widths[int(m.group(1), 0)] += 1
    return widths


def llir_load_widths(llir: str) -> Counter:
    """Bytes per global (addrspace 1) vector load in LLVM IR: the fallback where there is no
    PTX (Intel's backend)."""
    widths: Counter = Counter()
    for m in _LLIR_LOAD.finditer(llir):
        widths[int(m.group(1)) * _LLIR_BITS[m.group(2)] // 8] += 1
    return widths


def code_facts(asm: dict) -> dict:
    """wgmma / mma_sync / tma / dpas flags and load widths from a kernel's code, by kind
    ("ptx", "ttgir", "llir", "spv"...): whichever are given."""
    ptx = asm.get("ptx") or ""
    ttgir = asm.get("ttgir") or ""
    llir = asm.get("llir") or ""
    other = " ".join(str(v) for k, v in asm.items() if k in ("spv", "spirv", "zebin_text"))
    widths = ptx_load_widths(ptx) if ptx else llir_load_widths(llir)
    return {
        "wgmma": "wgmma.mma_async" in ptx or "warp_group_dot" in ttgir,
        "mma_sync": "mma.sync" in ptx,
        "tma": "cp.async.bulk.tensor" in ptx or "async_tma_copy" in ttgir
               or "tt.descriptor_load" in ttgir or "tensormap" in ttgir,
        "dpas": bool(re.search(r"dpas", ttgir + llir + other, re.I)),
        "load_widths": dict(sorted(widths.items())),
        "max_load_bytes": max(widths) if widths else None,
        "asm": tuple(k for k in ("ptx", "ttgir", "llir", "spv") if asm.get(k)),
    }


def _get(meta, name, default=None):
    if isinstance(meta, dict):
        return meta.get(name, default)
    return getattr(meta, name, default)


def facts_from_dump(meta: dict, asm: dict, n_regs=None, n_spills=None,
                    name: str | None = None) -> KernelFacts:
    """KernelFacts from a metadata dict (Triton's cache JSON or the worker's dump) and code
    text. `n_regs` / `n_spills` come from the loaded binary (or ptxas -v) when known; a
    metadata dict that carries them ("n_regs", "n_spills") is read too."""
    return KernelFacts(
        name=name or str(_get(meta, "name", "?")),
        n_regs=_int(n_regs if n_regs is not None else _get(meta, "n_regs")),
        n_spills=_int(n_spills if n_spills is not None else _get(meta, "n_spills")),
        shared_bytes=_int(_get(meta, "shared")),
        num_warps=_int(_get(meta, "num_warps")),
        num_stages=_int(_get(meta, "num_stages")),
        num_ctas=_int(_get(meta, "num_ctas")),
        **code_facts(asm))


def facts_from_compiled(compiled, name: str | None = None) -> KernelFacts:
    """KernelFacts of a `triton.compiler.CompiledKernel` of this process (its binary is loaded
    to read registers and spills; on a machine without the GPU those stay unknown)."""
    try:
        compiled._init_handles()
    except Exception:   # noqa: BLE001 - no device here: metadata and code only
        pass
    asm = {k: v for k, v in (getattr(compiled, "asm", None) or {}).items()
           if isinstance(v, str)}
    return facts_from_dump(getattr(compiled, "metadata", {}) or {}, asm,
                           getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None),
                           name)


def metadata_dict(compiled) -> dict:
    """The JSON-able part of a compiled kernel's metadata, plus registers and spills."""
    meta = getattr(compiled, "metadata", None)
    d = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta)) if meta else {}
    out = {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool, type(None)))}
    if "target" in d:
        out["target"] = {k: getattr(d["target"], k, None)
                         for k in ("backend", "arch", "warp_size")} \
            if not isinstance(d["target"], dict) else d["target"]
    out["n_regs"] = getattr(compiled, "n_regs", None)
    out["n_spills"] = getattr(compiled, "n_spills", None)
    return out


def _int(x):
    try:
        return None if x is None else int(x)
    except (TypeError, ValueError):
        return None
