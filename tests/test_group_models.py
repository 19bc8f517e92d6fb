"""The fusion oracle's kept group models: a merged group's model built from its parts'
(renamed) and the dependences between them equals the one computed afresh."""
from __future__ import annotations

import pytest

from polyc import GraphBuilder
from polyc.graph.decompose import decompose_graph
from polyc.graph.simplify import simplify_graph
from polyc.kernel import build_kernels
from polyc.schedule_tree.dependences import compute_dependences
from polyc.schedule_tree.group_models import GroupModels
from polyc.schedule_tree.model import build_model

FIELDS = ("domain", "reads", "writes", "order", "flow", "anti", "output", "input")


def _matmul_chain():
    b = GraphBuilder("chain")
    t = b.input("x", [8, 12])
    for i in range(4):
        t = b.matmul(b.exp(t) if i == 2 else t, b.input(f"w{i}", [12, 12]))
    return b.build([b.op("softmax", t, axis=-1)])


def _siblings_and_reductions():
    b = GraphBuilder("sib")
    x = b.input("x", [6, 10])
    m = b.reduce_max(x, axes=[1], keepdims=True)
    return b.build([b.sub(x, m), b.reduce_sum(x, axes=[0]), b.op("transpose", x, perm=[1, 0])])


@pytest.mark.parametrize("make", [_matmul_chain, _siblings_and_reductions])
def test_a_group_grown_node_by_node_has_the_dependences_of_the_whole(make):
    graph = simplify_graph(decompose_graph(make()))
    models = GroupModels(graph)
    names = [n.name for n in graph.nodes]
    group = (names[0],)
    for name in names[1:]:
        merged = group + (name,)
        (kernel,) = build_kernels(graph, (merged,))
        got = models.merged(kernel, group, (name,))
        want = compute_dependences(build_model(
            kernel.statements, {a.tensor: a.c_name for a in kernel.arrays}, models.ctx))
        for field in FIELDS:
            assert getattr(got, field).is_equal(getattr(want, field)), (merged, field)
        group = merged
