"""Value facts the graph guarantees by construction (`polyc.graph.ranges`)."""
from __future__ import annotations

from polyc import GraphBuilder
from polyc.graph.decompose import decompose_graph
from polyc.graph.ranges import nonpositive_tensors


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
