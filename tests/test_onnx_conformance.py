"""The ONNX node tests (the cases the onnx package generates for backends) that polyc's
importer takes on: each one matches ONNX's expected outputs or is refused with a
GraphError that says what polyc cannot express; none is wrong, none crashes.
`python benchmarks/onnx_conformance.py` prints the same run as a table per op."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from onnx_conformance import eligible_cases, run_case  # noqa: E402

CASES = {case.name: case for case in eligible_cases()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case(name):
    verdict = run_case(CASES[name])
    assert verdict.kind in ("match", "refused"), verdict.detail
    if verdict.kind == "refused":
        assert verdict.detail  # a message saying what polyc cannot express


def test_most_cases_are_taken_on():
    # the importer's op list covers the cases: a registry that lost ops would shrink this
    assert len(CASES) >= 400
