"""Every way a user's model can fail to import gives one clear UserError, and no file is lost."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from torch import nn

from kforge.errors import UserError
from kforge.frontend import import_model

HEADER = "import torch\nfrom torch import nn\n"


def model_file(tmp_path: Path, body: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def kernelbench(forward: str, *, inputs: str = "[torch.randn(4, 8)]", init: str = "") -> str:
    """A KernelBench-format file whose Model has one Linear(8, 8) and the given forward body."""
    return f"""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
    def forward(self, x):
{textwrap.indent(textwrap.dedent(forward).strip(), ' ' * 8)}
def get_inputs():
    return {inputs}
def get_init_inputs():
    return [{init}]
"""


def import_error(tmp_path: Path, source, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        import_model(source, tmp_path / "out" / "model.mlir", **kwargs)
    return str(info.value)


def test_file_without_model(tmp_path):
    path = model_file(tmp_path, "def get_inputs():\n    return [torch.randn(2)]\n")
    message = import_error(tmp_path, path)
    assert str(path) in message and "no `Model` class" in message
    assert "get_init_inputs" in message          # says what the format is


def test_file_variant_selector_says_what_to_set(tmp_path):
    """`FILE.py::VARIANT` is `kforge bench`'s selector; elsewhere it was an import path that
    failed with "cannot import ... (is it installed?)". Now: the variant's variables to set,
    or the variants the file has."""
    path = model_file(tmp_path, kernelbench("return self.fc(x)") +
                      'VARIANTS = {"prefill": {"KFORGE_LLM_PHASE": "prefill"}, "decode": {}}\n')
    message = import_error(tmp_path, f"{path}::prefill")
    assert "`KFORGE_LLM_PHASE=prefill kforge ... " + str(path) + "`" in message
    message = import_error(tmp_path, f"{path}::train")
    assert "no variant 'train'" in message and "decode, prefill" in message
    plain = model_file(tmp_path, kernelbench("return self.fc(x)"), name="plain.py")
    assert "defines no VARIANTS" in import_error(tmp_path, f"{plain}::x")


def test_file_with_syntax_error(tmp_path):
    path = model_file(tmp_path, "class Model(nn.Module:\n    pass\n")
    message = import_error(tmp_path, path)
    assert f"{path}:3: syntax error" in message


def test_file_that_raises_on_import(tmp_path):
    path = model_file(tmp_path, "import no_such_module_kforge_test\n")
    message = import_error(tmp_path, path)
    assert "failed to import" in message and "no_such_module_kforge_test" in message
    assert f"{path}:3" in message


def test_missing_file(tmp_path):
    assert "no such file" in import_error(tmp_path, tmp_path / "absent.py")


def test_file_without_get_inputs(tmp_path):
    path = model_file(tmp_path, kernelbench("return self.fc(x)").replace("def get_inputs",
                                                                          "def other_inputs"))
    message = import_error(tmp_path, path)
    assert "no `get_inputs()`" in message and str(path) in message


def test_constructor_that_raises(tmp_path):
    path = model_file(tmp_path, kernelbench("return self.fc(x)", init="1, 2, 3"))
    message = import_error(tmp_path, path)
    assert "Model(*get_init_inputs())" in message and "TypeError" in message


def test_data_dependent_control_flow(tmp_path):
    path = model_file(tmp_path, kernelbench("""
        y = self.fc(x)
        if y.sum() > 0:
            return y
        return -y
    """))
    message = import_error(tmp_path, path)
    assert "torch.export cannot trace" in message
    assert "depends on tensor values" in message
    assert f"{path}:" in message                 # points at the user's line


def test_ops_without_linalg_lowering_become_fallback_ops(tmp_path):
    """lgamma has no linalg lowering and cumsum lowers to torch-mlir's own tm_tensor dialect:
    both become fallback ops (test_fallback_ops.py) instead of import errors."""
    path = model_file(tmp_path, kernelbench("return torch.cumsum(torch.lgamma(self.fc(x)), 1)"))
    text = import_model(path, tmp_path / "out" / "model.mlir").mlir_path.read_text()
    assert "@kforge.fallback.aten.lgamma." in text and "@kforge.fallback.aten.cumsum." in text
    assert "tm_tensor" not in text


def test_dynamic_batch_on_a_model_that_fixes_the_batch(tmp_path):
    path = model_file(tmp_path, kernelbench("return self.fc(x).reshape(4, 8)"))
    message = import_error(tmp_path, path, dynamic_batch=True)
    assert "batch dimension cannot be dynamic" in message
    import_model(path, tmp_path / "static.mlir")      # static import still works


def test_module_instance_needs_example_inputs(tmp_path):
    message = import_error(tmp_path, nn.Linear(4, 4))
    assert "needs example_inputs" in message


def test_non_tensor_inputs(tmp_path):
    message = import_error(tmp_path, nn.Linear(4, 4), example_inputs=[3])
    assert "example input 0 is a int" in message


def test_bad_import_path(tmp_path):
    assert "cannot import" in import_error(tmp_path, "kforge_no_such_pkg.models:Net")
    assert "has no attribute 'Nope'" in import_error(tmp_path, "kforge.errors:Nope")
    assert "not an nn.Module" in import_error(tmp_path, "kforge.errors:UserError")


def test_failed_import_keeps_existing_files(tmp_path):
    out = tmp_path / "out" / "model.mlir"
    out.parent.mkdir()
    out.write_text("// the user's previous IR\n")
    weights = out.with_suffix(".safetensors")
    weights.write_bytes(b"previous weights")
    path = model_file(tmp_path, kernelbench("""
        if x.sum() > 0:
            return x
        return -x
    """))
    with pytest.raises(UserError):
        import_model(path, out)
    assert out.read_text() == "// the user's previous IR\n"
    assert weights.read_bytes() == b"previous weights"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.mlir", "model.safetensors"]


def test_cli_reports_user_errors_with_exit_status_2(tmp_path, run_kforge):
    path = model_file(tmp_path, "x = 1\n")
    proc = run_kforge("import", path, "-o", tmp_path / "model.mlir")
    assert proc.returncode == 2
    assert "kforge import: error:" in proc.stderr and "no `Model` class" in proc.stderr
    assert "Traceback" not in proc.stderr
