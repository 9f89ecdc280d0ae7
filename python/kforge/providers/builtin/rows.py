"""Elementwise and rows kernel templates of the builtin generator.

* elementwise: one program per BLOCK of output elements (a flat index unravelled per tensor);
* rows: one program per BLOCK_R rows; reductions over the trailing BLOCK_C columns, in one block
  or looped over column blocks when rows are long.
"""
from __future__ import annotations

import math

from kforge.providers.builtin import indexing as ix
from kforge.providers.builtin.analysis import row_index
from kforge.providers.builtin.builder import Builder, COL, ROW, ops_comment
from kforge.providers.builtin.emitter import CannotGenerate, ColumnSpace, KVar, Scope


def build_elementwise(b: Builder, outputs: list[str], config: dict, name: str) -> None:
    sizes = {o: math.prod(b.spec.tensor(o).shape) for o in outputs}
    if len(set(sizes.values())) > 1:     # one launch covers one domain: the rest go unwritten
        raise CannotGenerate(f"{name}: one elementwise kernel for outputs of different sizes "
                             f"({', '.join(f'{o}: {n}' for o, n in sizes.items())})")
    numel = sizes[outputs[0]]
    with ix.ranges({"offs": (0, numel)}):
        _emit_elementwise(b, outputs, config, name)


def _emit_elementwise(b: Builder, outputs: list[str], config: dict, name: str) -> None:
    spec = b.spec
    numel = math.prod(spec.tensor(outputs[0]).shape)
    BLOCK = config["BLOCK"]
    mask = "mask" if numel % BLOCK else None
    kvars = {"offs": KVar("offs", mask, ("BLOCK",))}
    em = b.emitter(kvars)
    root = Scope(None, binds={"offs"})
    em.root = root
    start = "pid.to(tl.int64) * BLOCK" if numel >= 2 ** 31 else "pid * BLOCK"
    root.emit("pid = tl.program_id(0)")
    root.emit(f"offs = {start} + tl.arange(0, BLOCK)")
    if mask:
        root.emit(f"mask = offs < {numel}")
    for o in outputs:
        index = ix.unravel(ix.IVar("offs"), spec.tensor(o).shape)
        val = em.value(o, index, root)
        root.emit(f"# {o}: {spec.tensor(o).dtype}{list(spec.tensor(o).shape)}")
        b.store(root, em, o, f"{o}_out", index, val)
    b.finish(em, name, outputs, {"BLOCK": BLOCK}, root.lines,
             f"(triton.cdiv({numel}, {BLOCK}),)", config["num_warps"],
             comment=f"elementwise over {numel} elements: {ops_comment(spec, em)}")


def build_rows(b: Builder, outputs: list[str], rows: int, cols: int, config: dict,
               name: str) -> None:
    with ix.ranges({"rows": (0, rows), "cols": (0, cols)}):
        _emit_rows(b, outputs, rows, cols, config, name)


def _emit_rows(b: Builder, outputs: list[str], rows: int, cols: int, config: dict,
               name: str) -> None:
    spec = b.spec
    BR, BC = config["BLOCK_R"], config["BLOCK_C"]
    looped = BC < cols
    row_mask = "row_mask" if rows % BR else None
    col_mask = "col_mask" if (looped or cols % BC) else None
    kvars = {"rows": KVar("rows", row_mask, ROW), "cols": KVar("cols", col_mask, COL)}
    columns = ColumnSpace("cols", cols, "[BLOCK_R, BLOCK_C]", "BLOCK_C", looped)
    em = b.emitter(kvars, columns)
    em.partials = dict(b.rows_partials)
    root = Scope(None, binds={"rows"} if looped else {"rows", "cols"})
    em.root = root
    root.emit("pid = tl.program_id(0)")
    root.emit("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    if row_mask:
        root.emit(f"row_mask = rows < {rows}")
    if not looped:
        root.emit("cols = tl.arange(0, BLOCK_C)[None, :]")
        if col_mask:
            root.emit(f"col_mask = cols < {cols}")
    wide, narrow = [], []
    for o in outputs:
        shape = spec.tensor(o).shape
        numel = math.prod(shape)
        if numel == rows * cols and row_index(shape, rows, cols) is not None:
            wide.append(o)
        elif numel == rows:
            narrow.append(o)
        else:
            raise CannotGenerate(f"{o} is neither one value per row nor a row of {cols}")
    for o in narrow:
        shape = spec.tensor(o).shape
        index = ix.unravel(ix.IVar("rows"), shape)
        val = em.value(o, index, root)
        b.store(root, em, o, f"{o}_out", index, val)
    scope = root
    if looped and wide:
        scope = Scope(root, binds={"cols"}, depth=2,
                      header=f"for c0 in range(0, {cols}, BLOCK_C):")
        scope.emit("cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        scope.emit(f"col_mask = cols < {cols}")
    for o in wide:
        index = row_index(spec.tensor(o).shape, rows, cols)
        val = em.value(o, index, scope)
        b.store(scope, em, o, f"{o}_out", index, val)
    if scope is not root:
        scope.close()
    how = "looped over column blocks" if looped else "one block per row"
    b.finish(em, name, outputs, {"BLOCK_R": BR, "BLOCK_C": BC}, root.lines,
             f"(triton.cdiv({rows}, {BR}),)", config["num_warps"],
             comment=f"{rows} rows of {cols}, {how}: {ops_comment(spec, em)}")
