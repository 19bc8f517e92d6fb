"""Facts about the values of tensors that follow from how they are computed, for codegen
to drop checks that cannot fire.

`nonpositive_tensors`: x - max(x) over some axes, the max kept (softmax's and
log_softmax's shift): every element of x is at most the max of the elements it was
reduced with, so the difference is <= 0 (or NaN when a NaN or an infinity took part).
An exp of it cannot overflow.

`iota_constants`: integer constants whose every element is its own index along one
axis (causal attention's row and column positions, `decompose.py`): a comparison of two
is an affine condition on the indices, which codegen can reason about per tile. And
`triangle_constants`: such a comparison folded into a constant (`simplify.py` folds a
small causal mask): nonzero exactly where the column index exceeds the row's plus d.
"""
from __future__ import annotations

import numpy as np

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


def iota_constants(graph: Graph) -> dict[str, int]:
    """Constant -> the axis along which each element equals its index (every other
    axis of extent 1)."""
    found = {}
    for t in graph.constants:
        long = [d for d, n in enumerate(t.type.shape) if n > 1]
        if t.data is None or len(long) != 1 or not t.type.dtype.startswith(("int", "uint")):
            continue
        if np.array_equal(np.asarray(t.data), np.arange(t.type.shape[long[0]])):
            found[t.name] = long[0]
    return found


def triangle_constants(graph: Graph) -> dict[str, tuple[int, int, int]]:
    """Constant -> (row dim, column dim, d): its element is nonzero exactly where the
    index along the column dim exceeds the one along the row dim plus d (every other
    dim of extent 1)."""
    found = {}
    for t in graph.constants:
        long = [d for d, n in enumerate(t.type.shape) if n > 1]
        if t.data is None or len(long) != 2 or t.type.dtype.startswith("float"):
            continue
        r, c = long
        values = np.asarray(t.data).reshape(t.type.shape[r], t.type.shape[c]) != 0
        rows, cols = np.indices(values.shape)
        first = np.flatnonzero(values[0])
        d = int(first[0]) - 1 if first.size else values.shape[1] - 1
        if np.array_equal(values, cols > rows + d):
            found[t.name] = (r, c, d)
    return found
