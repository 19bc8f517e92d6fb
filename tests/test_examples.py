"""The shipped examples load, and their outputs have the types their names promise.

The examples are what a new user copies first, so a format change that breaks one must
fail here rather than in someone's first session.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyc import load_graph
from polyc.graph.ir import TensorType
from polyc.graph.symbols import symbol

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Output types worked out by hand from DESIGN.md's op semantics, not from the loader.
EXPECTED = {
    "linear_gelu.json": {"y": TensorType((256, 1024), "float32")},
    "log_softmax.json": {"y": TensorType((512, 1000), "float32")},
    "softmax.json": {"y": TensorType((512, 1000), "float32")},
    "softmax_symbolic.json": {"y": TensorType((symbol("N"), 1000), "float32")},
    "layer_norm.json": {"y": TensorType((256, 768), "float32")},
    "attention.json": {"y": TensorType((2, 4, 64, 32), "float32")},
    # pads [1, 1, 1, 1] with a 3x3 kernel keep the 32x32 image size.
    "conv2d.json": {"y": TensorType((1, 32, 32, 32), "float32")},
}


def example_files() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.json"))


def test_every_example_has_expected_types():
    # A new example without an entry here would otherwise be checked only for loading.
    assert set(example_files()) == set(EXPECTED)


@pytest.mark.parametrize("name", example_files())
def test_example_loads_with_the_expected_output_types(name):
    g = load_graph(EXAMPLES / name)
    assert {o: g.type_of(o) for o in g.outputs} == EXPECTED[name]
    assert g.notes == (), "an example should have no dead nodes"


@pytest.mark.parametrize("name", example_files())
def test_example_survives_a_canonical_round_trip(name):
    # The service keys its cache on the canonical JSON, so it must load back unchanged.
    g = load_graph(str(EXAMPLES / name))
    assert load_graph(json.dumps(g.to_json())) == g


def test_the_package_compiles_at_its_top_level():
    # DESIGN.md's Python API: polyc.compile, the same function as polyc.compiler.compile
    import numpy as np

    import polyc
    import polyc.compiler
    assert polyc.compile is polyc.compiler.compile and polyc.Options is polyc.compiler.Options
    compiled = polyc.compile(EXAMPLES / "softmax.json", options=polyc.Options(threads=1))
    x = np.random.default_rng(0).standard_normal((512, 1000)).astype(np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(compiled(logits=x)["y"], want / want.sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(AttributeError):
        polyc.no_such_thing  # noqa: B018
