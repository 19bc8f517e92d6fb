"""Value facts the graph guarantees by construction (`polyc.graph.ranges`)."""
from __future__ import annotations

import numpy as np

from polyc import GraphBuilder
from polyc.graph.decompose import decompose_graph
from polyc.graph.ranges import iota_constants, nonpositive_tensors, triangle_constants


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
