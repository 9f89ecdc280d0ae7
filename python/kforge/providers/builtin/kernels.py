"""The builtin generator's entry: a region's stages become Triton kernels, one candidate source.

A region becomes one or more Triton kernels of three kinds (`rows`: elementwise and rows
kernels; `gemm`: GEMMs and their operand passes), cut into stages by `analysis` and given
schemes and tiles by `schemes`; `host` writes the module around them.

`generate_source(spec, target, precision, config)` returns the candidate's Python source.
"""
from __future__ import annotations

import math

from kforge.providers.builtin.analysis import (RegionShape, analyze_region, partial_reductions,
                                               unpaired, weight_source)
from kforge.providers.builtin.builder import Builder
from kforge.providers.builtin.emitter import CannotGenerate
from kforge.providers.builtin.gemm import (build_cast_pass, build_gemm, build_split_pass,
                                           gemm_outputs_on_tile)
from kforge.providers.builtin.gluon import build_gluon_gemm
from kforge.providers.builtin.host import assemble
from kforge.providers.builtin.rows import build_elementwise, build_rows
from kforge.providers.builtin.schemes import (FP16X3, FP16_SCHEMES, bf16_a_source,
                                              fp16x3_eligible, gemm_input_precisions,
                                              stage_configs, tma_configs)
from kforge.spec import GenericOp, KernelSpec


def generate_source(spec: KernelSpec, target, precision: str, config: dict,
                    shape: RegionShape | None = None) -> str:
    """The Python source of one candidate (kernels, optional prepare_weights, launch).
    `config` tunes the first stage; later stages take their kind's first configuration.
    `shape`: the region's cut (default: the fused one; the provider passes the cut its
    region_shape chose)."""
    shape = shape or analyze_region(spec)
    b = Builder(spec, target, precision)
    stages = shape.stages or [shape]
    for i, stage in enumerate(stages):
        cfg = config if i == 0 else _default_config(spec, target, precision, stage)
        stem = spec.name if len(stages) == 1 else f"{spec.name}_{i}"
        _build_stage(b, stage, cfg, stem)
        for v in stage.materialize:
            b.temporaries.setdefault(v, None)
    return assemble(b, shape, config)


def _default_config(spec, target, precision: str, stage: RegionShape) -> dict:
    scheme = None
    if stage.kind == "gemm":
        scheme = gemm_input_precisions(spec, target, precision, stage)[0]
    configs = stage_configs(spec, target, precision, stage, scheme)
    if not configs:
        raise CannotGenerate(f"no {stage.kind} configuration for a later stage")
    config = dict(configs[0])
    if scheme:
        config["input_precision"] = scheme
    return config


def _build_stage(b: Builder, stage: RegionShape, config: dict, stem: str) -> None:
    spec, target = b.spec, b.target
    outputs = stage.stores
    share_a = None      # the partner's product whose A pass this stage reads instead of its own
    if stage.kind == "elementwise":
        _elementwise_by_size(b, outputs, config, f"{stem}_elementwise")
        return
    if stage.kind == "rows":
        build_rows(b, outputs, stage.rows, stage.cols, config, f"{stem}_rows")
        return
    if stage.partner is not None and not _both_products_in_one_kernel(stage, config):
        # the partner's GEMM first, storing its product (its scheme the configuration's), then
        # this stage reading it
        first, stage = unpaired(stage)
        first_config = _partner_config(spec, target, b.precision, first, config)
        _build_stage(b, first, first_config, f"{stem}_p")
        for v in first.materialize:
            b.temporaries.setdefault(v, None)
        if _same_a_pass(first_config, config):      # one pass over A serves both products
            share_a = first.contraction.op.results[0]
    con = stage.contraction
    vc = con.op.results[0]
    vc_numel = math.prod(spec.tensor(vc).shape)
    split_k = config.get("SPLIT_K", 1)
    if stage.reductions and split_k > 1:
        raise CannotGenerate("split-K with row reductions is not generated")
    fuse = (bool(stage.reductions) and config["BLOCK_N"] >= con.extent(con.n)
            and stage.cols == con.extent(con.n)
            and all(math.prod(spec.tensor(o).shape) == vc_numel for o in outputs))
    if config.get("input_precision") in FP16_SCHEMES:
        scheme = config["input_precision"]
        if not fp16x3_eligible(spec, stage):
            raise CannotGenerate(f"{scheme} needs fp32 operands and an fp32 result")
        n_planes = 2 if scheme == FP16X3 else 1
        # the operands' fp16 planes and scales: A always by a pass; B by prepare_weights when it
        # is a weight, else by a pass too
        sides = ["a"] + ([] if weight_source(spec, con.op.operands[con.b]) else ["b"])
        if config.get("INSPLIT"):       # A's planes made in the GEMM kernel (_split_a_in_kernel)
            sides.remove("a")
        elif share_a:
            sides.remove("a")
            b.temporaries[f"{vc}_a16"] = f"{share_a}_a16   # the partner's planes of this A"
            b.temporaries[f"{vc}_as"] = f"{share_a}_as"
        for side in sides:
            rows = con.extent(con.batch) * con.extent(con.m if side == "a" else con.n)
            K = con.extent(con.k)
            planes, scale = f"{vc}_{side}16", f"{vc}_{side}s"
            b.temporaries[planes] = (f"torch.empty(({n_planes}, {rows}, {K}), device=device, "
                                     f"dtype=torch.float16)  # {scheme} planes of "
                                     f"{side.upper()}")
            b.temporaries[scale] = (f"torch.empty(({rows},), device=device, "
                                    f"dtype=torch.float32)  # its row scales")
        for side in sides:
            build_split_pass(b, stage, side, f"{vc}_{side}16", f"{vc}_{side}s",
                             f"{stem}_split_{side}", lo=scheme == FP16X3)
    if config.get("TMA") and config.get("input_precision") is None \
            and bf16_a_source(spec, con) is None:
        # the TMA kernel's A: a bf16 [M, K] copy that a descriptor can read (fp16x1 reads the
        # split pass's fp16 plane; a bf16 model's activation is read where it lies)
        a16 = f"{vc}_a16"
        if share_a:
            b.temporaries[a16] = f"{share_a}_a16   # the partner's bf16 copy of this A"
        else:
            b.temporaries[a16] = (f"torch.empty(({con.extent(con.m)}, {con.extent(con.k)}), "
                                  "device=device, dtype=torch.bfloat16)  # A in bf16 for TMA")
            build_cast_pass(b, stage, a16, f"{stem}_cast_a")
    if config.get("GLUON"):
        # the Gluon fp16x3 kernel (kforge.providers.builtin.gluon): the region's epilogue on
        # its tile where it can; else it stores the product, and the epilogue kernels (or the
        # rows kernel) finish the region from it
        if config.get("input_precision") != FP16X3:
            raise CannotGenerate("GLUON: the fp16x3 scheme")
        if not stage.reductions and gemm_outputs_on_tile(spec, stage):
            # the region's epilogue fused on the kernel's tile (gluon._fused)
            saved = b.snapshot()
            try:
                build_gluon_gemm(b, stage, config, f"{stem}_gemm_gluon", outputs)
                return
            except CannotGenerate:
                b.restore(saved)
        build_gluon_gemm(b, stage, config, f"{stem}_gemm_gluon")
        if vc not in outputs:                   # else the kernel stores the region's result
            b.temporaries[vc] = None
        rest = [o for o in outputs if o != vc]
        if stage.reductions:
            build_rows(b, rest, stage.rows, stage.cols, _rows_config(target, config, stage),
                       f"{stem}_rows")
        elif rest:
            _epilogues(b, rest, config, stem)
        return
    if split_k > 1:
        ws_shape = (split_k,) + tuple(spec.tensor(vc).shape)
        b.temporaries[vc] = (f"torch.empty({ws_shape!r}, device=device, "
                             "dtype=torch.float32)  # split-K partial products")
        build_gemm(b, stage, [], config, f"{stem}_gemm_partial", False, split_k)
        b.split_sums[vc] = split_k
        _epilogues(b, outputs, config, stem)
    elif stage.reductions and not fuse and config.get("PARTIAL"):
        # each GEMM tile reduces its own columns into partials; the rows kernel reduces the
        # partials and finishes the region (no product stored)
        reds = partial_reductions(spec, stage)
        if reds is None:
            raise CannotGenerate("PARTIAL: reductions a tile cannot reduce over its columns")
        M, parts = con.extent(con.m), -(-con.extent(con.n) // config["BLOCK_N"])
        bufs = {r: (f"{r}_part", parts) for r in reds}
        for r, (buf, _) in bufs.items():
            b.temporaries[buf] = (f"torch.empty(({M}, {parts}), device=device, "
                                  f"dtype=torch.float32)  # {r}: the GEMM tiles' partials")
        # (the rows kernel's own first configuration for rows of `parts` columns: a tuned
        # "rows" entry of the configuration was sized for the product's N)
        rows_config = target.configs("rows", {"rows": stage.rows, "cols": parts})[0]
        b.gemm_partials = bufs
        try:
            build_gemm(b, stage, [buf for buf, _ in bufs.values()], config, f"{stem}_gemm",
                       False)
        finally:
            b.gemm_partials = {}
        b.rows_partials = bufs
        try:
            build_rows(b, outputs, stage.rows, parts, rows_config, f"{stem}_rows")
        finally:
            b.rows_partials = {}
    elif stage.reductions and not fuse:
        # the GEMM kernel stores the product (or the model's own bf16 rounding of it), which
        # the rows kernel reads back; the rows kernel stores the rest
        handoff = rounded_handoff(spec, vc)
        build_gemm(b, stage, [handoff], config, f"{stem}_gemm", False)
        b.temporaries[handoff] = None
        build_rows(b, [o for o in outputs if o not in (vc, handoff)], stage.rows, stage.cols,
                   _rows_config(target, config, stage), f"{stem}_rows")
    elif not stage.reductions:
        if gemm_outputs_on_tile(spec, stage):
            saved = b.snapshot()
            try:
                build_gemm(b, stage, outputs, config, f"{stem}_gemm", False)
                return
            except CannotGenerate:      # an output index that does not fold back to the tile
                b.restore(saved)
        # outputs that are not the tile moved (slices of the product: q, k, v of one
        # projection): the GEMM stores the product, elementwise kernels finish from it
        build_gemm(b, stage, [vc], config, f"{stem}_gemm", False)
        b.temporaries[vc] = None
        _epilogues(b, outputs, config, stem)
    else:
        build_gemm(b, stage, outputs, config, f"{stem}_gemm", fuse)


def _rows_config(target, config: dict, stage: RegionShape) -> dict:
    """The rows kernel's configuration after a GEMM that stores the product: the region's
    tuned `rows` entry, else the target's first for the stage's rows and columns."""
    return config.get("rows") or target.configs(
        "rows", {"rows": stage.rows, "cols": stage.cols})[0]


def rounded_handoff(spec: KernelSpec, vc: str) -> str:
    """What a GEMM stage hands its rows kernel: the product `vc`, or, where the region rounds
    it to bf16 on the way (a bf16 model's Linear: product, bias, `truncf`), the last bf16 value
    of the chain of elementwise ops that alone read the product. Each link is the only reader of
    the one before, same shape, read and written at the identity index (its other operands,
    a bias, any); not a region result. The rows kernel then reads half the bytes, rounded where
    the model rounds. H100 2026-12-07: a bf16 model's row mean over 32768 x 1024 read an fp32
    product at 0.67x torch.compile, whose mm writes bf16; with the handoff (and the TMA kernel)
    0.94x, and the suite's other row reductions after a GEMM 0.97-1.16x (results 07c; no A/B
    of the handoff alone)."""
    shape = spec.tensor(vc).shape
    ident = tuple(range(len(shape)))
    cur, best = vc, vc
    while cur not in spec.results:
        users = spec.users(cur)
        if len(users) != 1 or not isinstance(users[0], GenericOp):
            break
        op = users[0]
        if op.reduction_dims or len(op.results) != 1 or op.operands.count(cur) != 1 \
                or op.operands.index(cur) >= op.num_inputs:
            break
        nxt = op.results[0]
        read, wrote = op.indexing_maps[op.operands.index(cur)], op.indexing_maps[op.num_inputs]
        if spec.tensor(nxt).shape != shape or wrote.num_dims != len(shape) \
                or read.result_dims() != ident or wrote.result_dims() != ident:
            break
        cur = nxt
        if cur not in spec.results and spec.tensor(cur).dtype == "bf16":
            best = cur
    return best


def _both_products_in_one_kernel(stage: RegionShape, config: dict) -> bool:
    """A PAIRED configuration of the persistent TMA kernel (schemes.PAIRED_ENV) computes a
    stage's product and its partner's from one pass over A (bf16 operands or fp16x1, no
    split-K, no row reduction, the epilogue in 2 or 4 slices, N a multiple of half the tile:
    gemm.py's paired weights); every other configuration computes one product at a time."""
    con = stage.contraction
    return (bool(config.get("PAIRED")) and bool(config.get("TMA"))
            and config.get("input_precision") in (None, "fp16x1")
            and config.get("SPLIT_K", 1) == 1 and not config.get("N_PARTS")
            and not stage.reductions and config.get("EPI_SPLIT", 1) in (2, 4)
            and con.extent(con.n) % (config["BLOCK_N"] // 2) == 0)


def _same_a_pass(first: dict, second: dict) -> bool:
    """Whether two sibling products' configurations pass over their common A alike: the same
    fp16 scheme (its planes and row scales), or both on the TMA kernel with bf16 operands (its
    bf16 copy); then the second reads the first's."""
    scheme = first.get("input_precision")
    if scheme != second.get("input_precision"):
        return False
    if scheme in FP16_SCHEMES:
        return True
    return scheme is None and bool(first.get("TMA")) and bool(second.get("TMA"))


def _partner_config(spec, target, precision: str, first: RegionShape, config: dict) -> dict:
    """The partner's GEMM where it runs alone: the configuration itself where it is a TMA
    tile of the partner's (the two products have the same sizes), else the first tile of the
    configuration's scheme (the scheme the tuner or the whole-model check chose applies to
    both products)."""
    scheme = config.get("input_precision")
    if config.get("TMA") and not config.get("PAIRED") and config in [
            dict(c, input_precision=scheme) if scheme else c
            for c in tma_configs(spec, target, precision, first, scheme)]:
        return dict(config)
    if "input_precision" not in config:
        return _default_config(spec, target, precision, first)
    configs = stage_configs(spec, target, precision, first, scheme)
    if not configs:
        raise CannotGenerate(f"no {scheme} configuration for the partner's GEMM")
    return dict(configs[0], input_precision=scheme)


def _epilogues(b: Builder, outputs: list[str], config: dict, stem: str) -> None:
    """Elementwise kernels that finish a stored GEMM product into the region's outputs (q and k
    rotated by RoPE are [.., 64] halves and [.., 128] wholes of one product)."""
    _elementwise_by_size(b, outputs, config.get("epilogue", {"BLOCK": 1024, "num_warps": 4}),
                         f"{stem}_epilogue")


def _elementwise_by_size(b: Builder, outputs: list[str], config: dict, name: str) -> None:
    """One elementwise kernel per output size (a launch covers one domain), `name`, or
    `name_0`, `name_1`, ... where there are several."""
    groups: dict[int, list[str]] = {}
    for o in outputs:
        groups.setdefault(math.prod(b.spec.tensor(o).shape), []).append(o)
    for i, group in enumerate(groups.values()):
        build_elementwise(b, group, config, name + ("" if len(groups) == 1 else f"_{i}"))
