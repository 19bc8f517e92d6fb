"""Value facts the graph guarantees by construction (`polyc.graph.ranges`)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.graph.decompose import decompose_graph
from polyc.graph.ranges import (iota_constants, masked_exponentials, nonpositive_tensors,
                                triangle_constants)
from polyc.graph.simplify import simplify_graph


def test_softmax_shift_is_nonpositive():
    b = GraphBuilder("sm")
    graph = decompose_graph(b.build([b.softmax(b.input("x", [4, 6]), out="y")]))
    (shifted,) = nonpositive_tensors(graph)
    node = next(n for n in graph.nodes if n.output == shifted)
    assert node.op == "sub"


def test_other_differences_are_not():
    b = GraphBuilder("g")
    x, z = b.input("x", [4, 6]), b.input("z", [4, 6])
    graph = b.build([b.sub(z, b.reduce_max(x, axes=[1], keepdims=True), out="other_max"),
                     b.sub(x, b.reduce_min(x, axes=[1], keepdims=True), out="min"),
                     b.sub(b.reduce_max(x, axes=[1], keepdims=True), x, out="reversed")])
    assert nonpositive_tensors(graph) == frozenset()


def test_causal_positions_are_iotas_and_a_folded_mask_a_triangle():
    b = GraphBuilder("att")
    q, k, v = b.input("q", [2, 5, 4]), b.input("k", [2, 7, 4]), b.input("v", [2, 7, 4])
    graph = decompose_graph(b.build([b.attention(q, k, v, causal=True, out="y")]))
    assert iota_constants(graph) == {"y.row": 0, "y.col": 1}
    rows, cols = np.indices((5, 7))
    b = GraphBuilder("c")
    x = b.input("x", [5, 7])
    shapes = {"tri": (cols > rows + 2), "lower": (cols <= rows), "full": np.ones((5, 7), bool)}
    consts = [b.constant(name, (1, 5, 7), m.astype(np.int32).ravel().tolist(), "int32")
              for name, m in shapes.items()]
    consts += [b.constant("shifted", (1, 6), list(range(1, 7)), "int32"),
               b.constant("float_iota", (6,), list(range(6)))]
    graph = b.build([b.add(x, b.cast(c, to="float32")) for c in consts[:3]]
                    + [b.cast(consts[3], to="float32"), consts[4]])
    assert triangle_constants(graph) == {"tri": (1, 2, 2)}
    assert iota_constants(graph) == {}


@pytest.mark.parametrize("lq", [5, 300])  # the mask folded into a constant, or not
def test_causal_attention_exponentials_and_probabilities_are_zero_past_the_diagonal(lq):
    b = GraphBuilder("att")
    q, k, v = b.input("q", [2, lq, 4]), b.input("k", [2, lq, 4]), b.input("v", [2, lq, 4])
    for causal, after in itertools.product((True, False), (True, False)):
        graph = b.build([b.attention(q, k, v, causal=causal, out=f"y{causal}{after}")])
        graph = simplify_graph(decompose_graph(graph, normalise_after=after))
        zero = [f"y{causal}{after}.exp"] + ([] if after else [f"y{causal}{after}.probs"])
        assert masked_exponentials(graph) == (dict.fromkeys(zero, (1, 2, 0)) if causal else {})


def test_a_softmax_over_a_finite_fill_is_not_known_zero():
    # -1e30 where masked: exp(-1e30 - max) is 0 only if the max is not itself -1e30
    b = GraphBuilder("m")
    x = b.input("x", [6, 6])
    rows, cols = np.indices((6, 6))
    mask = b.constant("mask", (6, 6), (cols > rows).astype(np.int32).ravel().tolist(), "int32")
    graph = decompose_graph(b.build([b.softmax(b.select(mask, b.constant("fill", (), [-1e30]), x))]))
    assert masked_exponentials(graph) == {}
