"""kforge.spec: loading, validation (errors name the file and the field) and round trips."""
import json
from pathlib import Path

import pytest

from kforge.errors import UserError
from kforge.spec import (AffineBinary, AffineDim, CallStep, ConstantOp, GenericOp, HostPlan,
                         KernelSpec, ReshapeOp, load_host_plan, load_spec, to_dict, to_json)

SPECS = Path(__file__).parent / "fixtures" / "specs"
FIXTURES = sorted(SPECS.glob("*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_loads_and_round_trips(path):
    spec = load_spec(path)
    assert isinstance(spec, KernelSpec)
    assert spec.results and spec.ops
    again = load_spec(json.loads(to_json(spec)))
    assert again == spec
    # frozen: specs are values
    with pytest.raises(Exception):
        spec.name = "x"


def test_fields_of_a_matmul_region():
    spec = load_spec(SPECS / "matmul_bias_relu.json")
    mm = next(op for op in spec.ops if isinstance(op, GenericOp) and op.name == "linalg.matmul")
    assert mm.iterator_types == ("parallel", "parallel", "reduction")
    assert mm.reduction_dims == (2,) and mm.parallel_dims == (0, 1)
    assert mm.indexing_maps[0].results == (AffineDim(0), AffineDim(2))
    assert mm.indexing_maps[1].is_projected_permutation()
    assert [s.op for s in mm.body.stmts] == ["arith.mulf", "arith.addf"]
    assert spec.tensor("arg1").weight == "fc.weight"
    assert spec.producer(mm.results[0]) is mm
    fill = spec.producer(mm.inits[0])
    assert fill.indexing_maps[0].results == ()      # scalar operand of linalg.fill


def test_convolution_maps_are_trees():
    spec = load_spec(SPECS / "conv2d_bias.json")
    conv = next(op for op in spec.ops if isinstance(op, GenericOp) and "conv" in op.name)
    e = conv.indexing_maps[0].results[2]
    assert e == AffineBinary("add", AffineDim(2), AffineDim(5))
    assert not conv.indexing_maps[0].is_projected_permutation()


def _doc(name="softmax"):
    return json.loads((SPECS / f"{name}.json").read_text())


def _write(tmp_path, doc, name="bad.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_wrong_schema_names_file_and_field(tmp_path):
    doc = _doc()
    doc["schema"] = "something.else"
    p = _write(tmp_path, doc)
    with pytest.raises(UserError, match=r"bad\.json: field schema"):
        load_spec(p)


def test_newer_version_is_refused(tmp_path):
    doc = _doc()
    doc["version"] = 2
    with pytest.raises(UserError, match="version 2 is not supported"):
        load_spec(_write(tmp_path, doc))


def test_missing_field_is_named(tmp_path):
    doc = _doc()
    i = next(i for i, o in enumerate(doc["ops"]) if o["op"] == "generic")
    del doc["ops"][i]["iterator_types"]
    with pytest.raises(UserError, match=rf"ops\[{i}\]\.iterator_types: missing"):
        load_spec(_write(tmp_path, doc))


def test_bad_dtype_and_shape(tmp_path):
    doc = _doc()
    doc["args"][0]["dtype"] = "f33"
    with pytest.raises(UserError, match=r"args\[0\]\.dtype: unknown element type 'f33'"):
        load_spec(_write(tmp_path, doc))
    doc = _doc()
    doc["args"][0]["shape"] = [4, -1]
    with pytest.raises(UserError, match=r"args\[0\]\.shape\[1\]"):
        load_spec(_write(tmp_path, doc))


def test_body_use_before_definition(tmp_path):
    doc = _doc()
    gen = next(o for o in doc["ops"] if o["op"] == "generic" and o["body"]["stmts"])
    gen["body"]["stmts"][0]["operands"] = ["nope"]
    with pytest.raises(UserError, match="'nope' is neither a block argument"):
        load_spec(_write(tmp_path, doc))


def test_unknown_op_record_and_undefined_operand(tmp_path):
    doc = _doc()
    doc["ops"][0]["op"] = "extract_slice"
    with pytest.raises(UserError, match="unknown op record kind 'extract_slice'"):
        load_spec(_write(tmp_path, doc))
    doc = _doc()
    doc["results"] = ["v999"]
    with pytest.raises(UserError, match="'v999' is not defined"):
        load_spec(_write(tmp_path, doc))


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="x.json: not valid JSON"):
        load_spec(p)
    with pytest.raises(UserError, match="cannot read"):
        load_spec(tmp_path / "missing.json")


def test_special_float_constants_round_trip():
    spec = load_spec(SPECS / "softmax.json")
    splats = [op.splat for op in spec.ops if isinstance(op, ConstantOp)]
    assert float("-inf") in splats
    assert '"-inf"' in to_json(spec)


def _plan_doc():
    return {
        "schema": "kforge.host-plan", "version": 1, "function": "main",
        "inputs": [{"name": "arg0", "shape": [6, 10], "dtype": "f32", "weight": None}],
        "values": [{"name": "v0", "shape": [6, 10], "dtype": "f32"},
                   {"name": "v1", "shape": [60], "dtype": "f32"}],
        "steps": [{"call": "9a5fd614ff183bba", "operands": ["arg0"], "results": ["v0"]},
                  {"op": "reshape", "name": "tensor.collapse_shape", "operands": ["v0"],
                   "results": ["v1"], "reassociation": [[0, 1]]}],
        "outputs": ["v1"]}


def test_host_plan(tmp_path):
    p = tmp_path / "host_plan.json"
    p.write_text(json.dumps(_plan_doc()))
    plan = load_host_plan(p)
    assert isinstance(plan, HostPlan) and plan.directory == str(tmp_path)
    assert plan.steps[0] == CallStep("9a5fd614ff183bba", ("arg0",), ("v0",))
    assert isinstance(plan.steps[1], ReshapeOp)
    assert load_host_plan(to_dict(plan)) == HostPlan(**{**plan.__dict__, "directory": None})
    doc = _plan_doc()
    doc["steps"][1]["operands"] = ["v7"]
    p.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"host_plan.json: field steps\[1\]\.operands"):
        load_host_plan(p)


def test_pad_and_opaque_records():
    from kforge.spec import OpaqueOp, PadOp
    spec = load_spec(SPECS / "conv2d_pad_relu.json")
    pad = spec.ops[0]
    assert isinstance(pad, PadOp) and pad.low == (0, 0, 1, 1) and pad.value == 0.0
    assert load_spec(json.loads(to_json(spec))) == spec
    doc = _plan_doc()
    doc["steps"].insert(0, {"op": "opaque", "name": "tensor.pad", "operands": ["arg0"],
                            "results": ["v9"], "mlir": "%p = tensor.pad ..."})
    doc["values"].append({"name": "v9", "shape": [6, 12], "dtype": "f32"})
    plan = load_host_plan(doc)
    assert isinstance(plan.steps[0], OpaqueOp) and plan.steps[0].mlir.startswith("%p")
    doc = _doc("conv2d_pad_relu")
    doc["ops"][0]["low"] = [0, 0, "1", 1]
    with pytest.raises(UserError, match=r"ops\[0\]\.low: expected a list of static integers"):
        load_spec(doc)
