"""bool as a storage type: one byte holding 0 or 1, read as 0.0 / 1.0 by the ops that
take it, a cast to it is "nonzero"; compiled kernels agree exactly with the reference."""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc.errors import GraphError
from polyc.graph.reference import random_inputs, run_reference


def check(graph, inputs):
    got = polyc.compile(graph)(**inputs)
    ref = run_reference(graph, inputs)
    for name, r in ref.items():
        assert got[name].dtype == r.dtype, name
        np.testing.assert_array_equal(got[name], r, err_msg=name)
    return got


def test_cast_to_bool_is_nonzero_and_move_ops_keep_bool():
    b = polyc.GraphBuilder("b")
    x = b.input("x", [3, 5])
    m = b.cast(x, to="bool")
    moved = b.pad(b.concat(b.transpose(b.reshape(m, shape=[5, 3])), m, axis=0),
                  pads=[[1, 0], [0, 2]])
    graph = b.build(outputs=[m, moved])
    xs = np.array([[0, -0.0, 2, -3, np.nan]] * 3, np.float32)
    got = check(graph, {"x": xs})
    np.testing.assert_array_equal(got[m][0], [False, False, True, True, True])
    assert got[moved].shape == (7, 7) and got[moved].dtype == np.bool_


def test_bool_inputs_constants_and_logic():
    b = polyc.GraphBuilder("b")
    p, q = b.input("p", [64, 33], "bool"), b.input("q", [33], "bool")
    f = b.input("f", [64, 33], "float16")
    either = b.maximum(p, q)
    both = b.minimum(p, b.constant("t", [1], [True], "bool"))
    neither = b.equal(either, b.constant("no", [], [0], "bool"))
    picked = b.select(neither, f, b.neg(f))
    count = b.reduce_sum(b.cast(either, to="int32"), axes=[1])
    graph = b.build(outputs=[either, both, neither, picked, count])
    got = check(graph, random_inputs(graph, 3))
    assert got[either].dtype == np.bool_ and got[picked].dtype == np.float16


def test_bool_constant_data_must_be_true_false_0_or_1():
    b = polyc.GraphBuilder("b")
    c = b.constant("c", [2], [1, 2], "bool")
    with pytest.raises(GraphError, match="'c'.*true, false, 0 or 1"):
        b.build(outputs=[c])
