"""int64 (a compute type: exact, wrapping like C) and bfloat16 (a storage type: computed
in float32, rounded to nearest even when stored) through the pipeline, against the
reference executor: one graph per op class, casts between every pair of dtypes, the C
conversions against ml_dtypes bit for bit, and a kernel that mixes them."""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import GraphBuilder, GraphError, targets
from polyc.graph.ir import DTYPES
from polyc.graph.reference import random_inputs, run_reference

# one rounding of bfloat16 is 2^-9 relative; a kernel (float32) and the reference
# (float64) may round to neighbouring bfloat16s, and a composite's inner values differ
RTOL, ATOL = 1.6e-2, 1e-2
BIG = 2**40  # int64 values past int32's range


def _run(graph, target="cpu", scale=None, seed=5):
    inputs = random_inputs(graph, seed=seed)
    for name, factor in (scale or {}).items():
        inputs[name] = inputs[name] * factor
    compiled = polyc.compile(graph, target)
    return compiled, compiled(**inputs), run_reference(graph, inputs)


def _check(graph, target="cpu", scale=None):
    compiled, got, want = _run(graph, target, scale)
    for name in graph.outputs:
        assert got[name].dtype == want[name].dtype == graph.types[name].dtype, name
        if graph.types[name].dtype == "int64":
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        else:
            np.testing.assert_allclose(got[name].astype(np.float64),
                                       want[name].astype(np.float64),
                                       rtol=RTOL, atol=ATOL, err_msg=name)
    return compiled


def _int64_graphs():
    b = GraphBuilder("elementwise")
    x, y = b.input("x", (6, 40), "int64"), b.input("y", (40,), "int64")
    yield "elementwise", b.build([
        b.div(x, y, out="q"), b.sub(b.mul(x, y), b.neg(x), out="m"),
        b.maximum(b.abs(x), b.relu(y), out="mx"), b.minimum(x, y, out="mn"),
        b.select(b.greater(x, y), x, y, out="s"), b.equal(x, x, out="e")])
    b = GraphBuilder("reductions")
    x = b.input("x", (12, 70), "int64")
    yield "reductions", b.build([
        b.reduce_sum(x, axes=[1], out="s"), b.reduce_max(x, axes=[0], out="mx"),
        b.reduce_min(x, out="mn"), b.reduce_prod(x, axes=[1], out="p")])
    b = GraphBuilder("matmul")
    yield "matmul", b.build([b.matmul(b.input("x", (24, 40), "int64"),
                                      b.input("y", (40, 16), "int64"), out="z")])
    b = GraphBuilder("moves")
    x, y = b.input("x", (8, 12), "int64"), b.input("y", (12, 4), "int64")
    yield "moves", b.build([
        b.concat(b.transpose(x), b.pad(y, pads=[[0, 0], [1, 3]], value=-BIG), axis=1, out="c"),
        b.slice(x, starts=[1, 2], ends=[7, 12], steps=[2, 3], out="sl"),
        b.broadcast_to(b.reshape(y, shape=[48]), shape=[3, 48], out="br")])


@pytest.mark.parametrize("name,graph", list(_int64_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_int64_graphs_match_the_reference_exactly(name, graph):
    # x spans past int32: a kernel computing in 32 bits would differ everywhere
    _check(graph, scale={"x": BIG})


def _bfloat16_graphs():
    b = GraphBuilder("elementwise")
    x, y = b.input("x", (6, 40), "bfloat16"), b.input("y", (40,), "bfloat16")
    yield "elementwise", b.build([
        b.div(b.exp(x), y, out="d"), b.tanh(b.sub(x, y), out="t"),
        b.select(b.less(x, y), x, b.sqrt(y), out="s"), b.maximum(x, y, out="mx")])
    b = GraphBuilder("norms")
    x = b.input("x", (20, 96), "bfloat16")
    g = b.input("g", (96,), "bfloat16")
    yield "norms", b.build([b.softmax(x, out="s"), b.layer_norm(x, g, out="n"),
                            b.reduce_sum(x, axes=[0], out="r"), b.reduce_max(x, out="m")])
    b = GraphBuilder("linear")
    x, w = b.input("x", (48, 96), "bfloat16"), b.input("w", (96, 80), "bfloat16")
    yield "linear", b.build([b.gelu(b.linear(x, w, b.input("b", (80,), "bfloat16")), out="y")])
    b = GraphBuilder("moves")
    x, y = b.input("x", (8, 12), "bfloat16"), b.input("y", (12, 4), "bfloat16")
    yield "moves", b.build([
        b.concat(b.transpose(x), b.pad(y, pads=[[0, 0], [1, 3]], value=1.3), axis=1, out="c"),
        b.slice(x, starts=[1, 2], ends=[7, 12], steps=[2, 3], out="sl")])


@pytest.mark.parametrize("name,graph", list(_bfloat16_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_bfloat16_graphs_match_the_reference(name, graph):
    _check(graph)


def test_bfloat16_data_movement_is_exact():
    # a pad's value is rounded to bfloat16 as the reference rounds it (1.3 is not one)
    graph = dict(_bfloat16_graphs())["moves"]
    _, got, want = _run(graph)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name].view(np.uint16), want[name].view(np.uint16))


@pytest.mark.parametrize("target", [t for t in targets.names() if t != "cpu"])
def test_int64_and_bfloat16_on_the_simulated_chips(target):
    b = GraphBuilder("chips")
    x, i = b.input("x", (16, 32), "bfloat16"), b.input("i", (16, 32), "int64")
    w = b.input("w", (32, 24), "bfloat16")
    graph = b.build([b.softmax(x, out="s"), b.reduce_sum(b.mul(i, i), axes=[1], out="r"),
                     b.matmul(x, w, out="mm"), b.matmul(i, b.transpose(i), out="ii")])
    _check(graph, target, scale={"i": 2**20})


def test_casts_between_every_pair_of_dtypes():
    b = GraphBuilder("casts")
    outs = []
    for src in DTYPES:
        x = b.input(f"x_{src}", (5, 7), src)
        outs += [b.cast(x, to=dst, out=f"{src}_to_{dst}") for dst in DTYPES if dst != src]
    graph = b.build(outs)
    _, got, want = _run(graph)
    for name in outs:
        # small integers and values in [0.5, 2]: every cast is exact or rounds once
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_casts_round_large_and_tied_values_like_the_reference():
    b = GraphBuilder("round")
    f, i = b.input("f", (6,), "float64"), b.input("i", (4,), "int64")
    graph = b.build([b.cast(f, to="bfloat16", out="fb"), b.cast(i, to="bfloat16", out="ib"),
                     b.cast(b.cast(i, to="bfloat16"), to="int64", out="back"),
                     b.cast(b.cast(f, to="bfloat16"), to="int64", out="trunc")])
    inputs = {"f": np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5e30, 300.7, -0.9, 65.5]),
              "i": np.array([2**40 + 2**32, -(2**62), 257, 3], np.int64)}
    got, want = polyc.compile(graph)(**inputs), run_reference(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["fb"][:2].tolist() == [1.0, 1.0 + 2**-6]  # ties to even


def test_bfloat16_conversions_match_ml_dtypes_bit_for_bit():
    # every bfloat16 (the high half), each with low halves around the rounding point:
    # ties, either side of them, the extremes; NaNs of every payload and both infinities
    high = np.arange(2**16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7fff, 0x8000, 0x8001, 0xffff], np.uint32)
    bits = (high[:, None] | low[None, :]).reshape(-1)
    b = GraphBuilder("bits")
    graph = b.build([b.cast(b.input("x", (bits.size,), "float32"), to="bfloat16", out="n"),
                     b.cast(b.input("h", (2**16,), "bfloat16"), to="float32", out="w")])
    inputs = {"x": bits.view(np.float32),
              "h": np.arange(2**16, dtype=np.uint32).astype(np.uint16).view("bfloat16")}
    got, want = polyc.compile(graph)(**inputs), run_reference(graph, inputs)
    # a NaN's payload may differ (the reference's float64 round trip quiets it)
    for out, x in (("n", inputs["x"]), ("w", inputs["h"])):
        nan = np.isnan(x.astype(np.float32))
        have, expect = got[out].view(f"uint{got[out].itemsize * 8}"), want[out].view(
            f"uint{want[out].itemsize * 8}")
        np.testing.assert_array_equal(have[~nan], expect[~nan], err_msg=out)
        assert np.isnan(got[out][nan].astype(np.float32)).all(), out


def test_a_kernel_mixing_int64_and_bfloat16():
    b = GraphBuilder("mixed")
    x, i = b.input("x", (16, 64), "bfloat16"), b.input("i", (16, 64), "int64")
    scaled = b.mul(x, b.cast(b.div(i, b.constant("k", [], [BIG], "int64")), to="bfloat16"))
    graph = b.build([b.add(scaled, x, out="y"),
                     b.reduce_sum(b.mul(i, b.cast(b.greater(x, b.constant("one", [], [1.0],
                                                                            "bfloat16")),
                                                  to="int64")), axes=[1], out="n")])
    compiled = _check(graph, scale={"i": BIG})
    assert len(compiled.kernels) == 1
    (kernel,) = compiled.kernels
    assert {(a.tensor, a.type.dtype) for a in kernel.kernel.params} >= {
        ("x", "bfloat16"), ("i", "int64"), ("y", "bfloat16"), ("n", "int64")}


def test_int64_indices_of_one_hot():
    b = GraphBuilder("one_hot")
    on, off = b.constant("on", [], [2.0]), b.constant("off", [], [0.5])
    graph = b.build([b.one_hot(b.input("k", (10,), "int64"), on, off, depth=12, out="y")])
    _check(graph)


@pytest.mark.parametrize("op,dtype,says", [
    ("exp", "int64", "'exp' is not defined on int64"),
    ("one_hot", "bfloat16", "indices must be int32 or int64, got bfloat16")])
def test_bad_dtypes_are_refused_naming_node_and_field(op, dtype, says):
    b = GraphBuilder("bad")
    x = b.input("x", (4,), dtype)
    args = (x, b.constant("on", [], [1.0]), b.constant("off", [], [0.0])) if op == "one_hot" else (x,)
    with pytest.raises(GraphError) as info:
        b.build([b.op(op, *args, out="y", **({"depth": 3} if op == "one_hot" else {}))])
    (problem,) = info.value.problems
    assert (problem.node, problem.field) == ("y", "inputs") and says in problem.message
