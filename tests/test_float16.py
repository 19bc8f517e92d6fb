"""float16 as a storage type: loaded, computed in float32, rounded to nearest even when
stored (DESIGN.md), on every target, against the reference at float16's tolerance."""
from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc import GraphBuilder, targets
from polyc.graph.reference import random_inputs, run_reference
from polyc.graph.storage import unshare_widening, widen_storage

# one rounding of float16 is 2^-11 relative; a kernel and the reference may round a
# value computed in float32 and in float64 to neighbouring float16s
RTOL, ATOL = 2e-3, 1e-3


def _check(graph, target, rtol=RTOL, atol=ATOL):
    inputs = random_inputs(graph, seed=3)
    compiled = polyc.compile(graph, target)
    got, want = compiled(**inputs), run_reference(graph, inputs)
    for name in graph.outputs:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                   rtol=rtol, atol=atol, err_msg=name)
    return compiled


def _graphs():
    b = GraphBuilder("linear_gelu")
    x, w, bias = (b.input("x", (48, 96), "float16"), b.input("w", (96, 80), "float16"),
                  b.input("b", (80,), "float16"))
    yield "linear_gelu", b.build([b.gelu(b.linear(x, w, bias), approximate="tanh", out="y")]), 2e-2
    b = GraphBuilder("norms")
    x = b.input("x", (40, 300), "float16")
    g, beta = b.input("g", (300,), "float16"), b.input("beta", (300,), "float16")
    yield "norms", b.build([b.softmax(x, out="s"), b.layer_norm(x, g, beta, out="n"),
                            b.log_softmax(x, axis=0, out="l")]), ATOL
    b = GraphBuilder("moves")
    x, z = b.input("x", (16, 24), "float16"), b.input("z", (24, 8), "float16")
    t = b.transpose(x, perm=[1, 0])
    yield "moves", b.build([b.concat(t, b.pad(z, pads=[[0, 0], [0, 8]], value=1.5), axis=1,
                                     out="c"),
                            b.cast(b.reduce_sum(x, axes=[1]), to="float32", out="s32"),
                            b.cast(b.input("i", (16, 24), "float32"), to="float16", out="h")]), ATOL


@pytest.mark.parametrize("target", targets.names())
@pytest.mark.parametrize("name,graph,atol", list(_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_float16_graphs_match_the_reference(name, graph, atol, target):
    _check(graph, target, atol=atol)


def test_a_composite_rounds_once_at_its_end():
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (4, 8), "float16"), out="y")])
    wide = widen_storage(graph)
    assert [(n.op, wide.types[n.output].dtype) for n in wide.nodes] == [
        ("cast", "float32"), ("softmax", "float32"), ("cast", "float16")]
    assert wide.nodes[-1].output == "y" and wide.nodes[1].name == "y"


def test_each_reader_casts_the_float16_tensor_itself():
    b = GraphBuilder("two")
    x = b.input("x", (8, 8), "float16")
    graph = b.build([b.exp(x, out="e"), b.relu(x, out="r")])
    g = unshare_widening(polyc.compile(graph, build=False).primitive)
    casts = [n for n in g.nodes if n.op == "cast" and n.inputs == ("x",)]
    assert len(casts) == 2


def test_a_float16_kernel_loads_and_stores_float16_and_keeps_no_float32_copy():
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (64, 128), "float16"), out="y")])
    compiled = _check(graph, "cpu")
    (kernel,) = compiled.kernels
    assert [(a.tensor, a.type.dtype) for a in kernel.kernel.params] == [
        ("x", "float16"), ("y", "float16")]
    assert re.search(r"_Float16 \*__restrict__ t\d+_y\)", compiled.c_source)


def test_a_float16_matmul_folds_its_casts_into_the_packing():
    b = GraphBuilder("mm")
    x, w = b.input("x", (128, 96), "float16"), b.input("w", (96, 64), "float16")
    compiled = _check(b.build([b.matmul(x, w, out="y")]), "cpu", atol=2e-2)
    (kernel,) = compiled.kernels
    assert kernel.microkernels and {a.tensor for a in kernel.kernel.params} == {"x", "w", "y"}
