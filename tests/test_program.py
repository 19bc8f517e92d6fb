"""A compiled graph's call (`codegen/runtime.Program`): dense arrays of the graph's types
go straight to the kernels by a plan laid out once; anything else (another dtype, a
strided view, a missing or unknown name, an out array that cannot be written)
goes through `bind`, which makes a dense copy or names what is wrong. Every result
against the reference executor."""
from __future__ import annotations

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.compiler import compile
from polyc.errors import GraphError
from polyc.graph.reference import run_reference


@pytest.fixture(scope="module")
def compiled():
    b = GraphBuilder("mm_relu_exp")
    h = b.relu(b.matmul(b.input("x", (16, 24)), b.input("w", (24, 32))))
    return compile(b.build([b.exp(b.mul(h, h)), h]))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-1, 1, (16, 24)).astype(np.float32),
            "w": rng.uniform(-1, 1, (24, 32)).astype(np.float32)}


def _check(compiled, got, inputs):
    want = run_reference(compiled.graph, {k: np.asarray(v, np.float32) for k, v in inputs.items()})
    for name in compiled.graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_dense_arrays_of_the_graph_s_types_skip_bind(compiled, monkeypatch):
    program = compiled.program
    assert program._direct is not None
    monkeypatch.setattr(program, "bind", lambda *a: pytest.fail("bind was called"))
    for seed in range(3):  # the intermediates' buffers are reused across calls
        inputs = _inputs(seed)
        _check(compiled, program(inputs), inputs)
    out = {name: np.empty(compiled.graph.types[name].shape, np.float32)
           for name in compiled.graph.outputs}
    got = program(_inputs(), out)
    assert all(got[name] is out[name] for name in out)
    _check(compiled, got, _inputs())


def test_other_arrays_go_through_bind_and_are_converted(compiled):
    inputs = _inputs()
    strided = np.zeros((16, 48), np.float32)
    strided[:, ::2] = inputs["x"]
    row = np.broadcast_to(inputs["w"][:1], (24, 32))  # every row the first: strides 0
    for given, want in (({"x": strided[:, ::2], "w": inputs["w"]}, inputs),  # not dense
                        ({"x": np.asfortranarray(inputs["x"]), "w": inputs["w"]}, inputs),
                        ({"x": inputs["x"], "w": row}, {"x": inputs["x"], "w": np.array(row)})):
        _check(compiled, compiled.program(given), want)


@pytest.mark.parametrize("change, says", [
    (lambda i: {**i, "x": i["x"].astype(np.float64)}, "input 'x' must be float32[16,24]"),
    (lambda i: {"w": i["w"]}, "input 'x' (float32[16,24]) is missing"),
    (lambda i: {**i, "z": i["x"]}, "input 'z' is not an input of graph 'mm_relu_exp'"),
    (lambda i: {**i, "x": i["x"][:8]}, "input 'x' must be float32[16,24], got float32[8,24]"),
], ids=["dtype", "missing", "unknown", "shape"])
def test_inputs_the_kernels_cannot_take_are_named(compiled, change, says):
    with pytest.raises(GraphError) as e:
        compiled.program(change(_inputs()))
    assert says in str(e.value)


def test_an_out_array_that_cannot_be_written_is_named(compiled):
    name = compiled.graph.outputs[0]
    frozen = np.empty(compiled.graph.types[name].shape, np.float32)
    frozen.flags.writeable = False
    for bad in (frozen, np.empty((3, 3), np.float32)):
        with pytest.raises(GraphError, match=rf"out\['{name}'\] must be a writeable C-contiguous"):
            compiled.program(_inputs(), {name: bad})


def test_an_input_returned_as_an_output_is_copied_not_aliased():
    b = GraphBuilder("through")
    x = b.input("x", (4, 8))
    compiled = compile(b.build([x, b.relu(x)]))
    assert compiled.program._direct is None
    value = np.arange(32, dtype=np.float32).reshape(4, 8) - 10
    got = compiled.program({"x": value})
    assert got["x"] is not value and np.array_equal(got["x"], value)
    np.testing.assert_array_equal(got[compiled.graph.outputs[1]], np.maximum(value, 0))
    assert not compiled.program.run_at({})  # no plan: nothing run, the caller uses a call


def test_run_at_takes_the_callers_addresses(compiled):
    """PyTorch's route (`torch_compile._run`): the data addresses of dense memory the
    caller vouches for, no arrays made or checked."""
    inputs = _inputs(5)
    out = {name: np.full(compiled.graph.types[name].shape, np.nan, np.float32)
           for name in compiled.graph.outputs}
    at = {name: a.ctypes.data for name, a in (inputs | out).items()}
    assert compiled.program.run_at(at)
    _check(compiled, out, inputs)
