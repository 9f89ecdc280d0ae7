"""Every adversarial candidate in test/python/adversarial/ is rejected, with its specific reason.

Each file names its region spec and the reason it must be rejected for in its docstring:
`kforge-adversarial: spec=add_relu expect=mismatch`. They run through the real verifier: static
checks, then the sandboxed Triton interpreter.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kforge.spec import load_spec
from kforge.verify import verify_candidate

HERE = Path(__file__).parent
ADVERSARIAL = sorted((HERE / "adversarial").glob("*.py"))
FIXTURES = HERE / "fixtures" / "engine"


def _meta(path: Path) -> tuple[str, str]:
    m = re.search(r"kforge-adversarial: spec=(\w+) expect=(\w+)", path.read_text())
    assert m, f"{path.name} has no kforge-adversarial header"
    return m[1], m[2]


def _memory_mb(path: Path) -> dict:
    m = re.search(r"kforge-adversarial: .*memory_mb=(\d+)", path.read_text())
    return {"memory_mb": int(m[1])} if m else {}


def test_at_least_ten_adversarial_candidates():
    assert len(ADVERSARIAL) >= 10


@pytest.mark.parametrize("path", ADVERSARIAL, ids=[p.stem for p in ADVERSARIAL])
def test_adversarial_candidate_is_rejected_for_its_reason(path):
    spec_name, expected = _meta(path)
    spec = load_spec(FIXTURES / f"{spec_name}.json")
    record = verify_candidate(spec, path.read_text(), "cpu", "strict", timeout_s=12,
                              **_memory_mb(path))
    assert record.status == "rejected", record
    assert record.reason == expected, f"{path.name}: {record.reason}: {record.message}"
    assert record.message            # a reason a kernel writer can act on


# The same candidates with the static checks switched off: the sandbox alone still rejects
# the ones whose cheating shows at run time.
DYNAMIC = {
    "cheat_reference": "forbidden_import",     # import hook refuses kforge in the sandbox
    "crash_abort": "crash",                    # SIGABRT ends the worker, not the verifier
    "torch_fallback": "torch_compute",         # torch calls seen during launch
    "host_numpy": "torch_compute",
    "result_caching": "no_triton_kernel",      # the cached call launches nothing
    "global_state": "mismatch",                # second call differs from the first
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_sandbox_rejects_without_static_checks(name):
    path = HERE / "adversarial" / f"{name}.py"
    spec = load_spec(FIXTURES / f"{_meta(path)[0]}.json")
    record = verify_candidate(spec, path.read_text(), "cpu", "strict", timeout_s=30,
                              run_static_checks=False)
    assert record.status == "rejected"
    assert record.reason == DYNAMIC[name], record.message
