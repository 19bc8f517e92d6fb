"""Facts about the values of tensors that follow from how they are computed, for codegen
to drop checks that cannot fire.

`nonpositive_tensors`: x - max(x) over some axes, the max kept (softmax's and
log_softmax's shift): every element of x is at most the max of the elements it was
reduced with, so the difference is <= 0 (or NaN when a NaN or an infinity took part).
An exp of it cannot overflow.
"""
from __future__ import annotations

from .ir import Graph


def nonpositive_tensors(graph: Graph) -> frozenset[str]:
    producer = {n.output: n for n in graph.nodes}
    found = set()
    for n in graph.nodes:
        if n.op != "sub":
            continue
        x, m = n.inputs
        reduced = producer.get(m)
        if (reduced is not None and reduced.op == "reduce_max" and reduced.inputs[0] == x
                and reduced.attrs.get("keepdims")):
            found.add(n.output)
    return frozenset(found)
