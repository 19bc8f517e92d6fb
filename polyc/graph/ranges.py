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

`constant_digests`: each static constant's data as sha256, the name under which codegen
may keep something made from it (a contraction's operand packed once per loaded kernel).

`masked_exponentials`: the exponentials of a softmax along the last axis of
select(mask, -inf, x), exp(masked - max), the mask one of the above, and the softmax
itself, those divided by their row's sum (causal attention's, normalised after its
product with v or before it; only its decomposition makes a -inf constant): exactly 0
where the mask holds, unless the row's unmasked elements are NaN too. With
d >= 0 every row keeps its first column, so its max is that of some unmasked element: if
finite, the masked exp(-inf - max) is 0 and the row's sum at least 1; if not, every
unmasked element of the row is NaN (x - max is NaN or the sum is) and so is anything
computed from the row.
"""
from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

from .ir import Graph


def _kept(compute):
    """`compute(graph)` once per graph (`Graph.derived`)."""
    @functools.wraps(compute)
    def kept(graph: Graph):
        if compute.__name__ not in graph.derived:
            graph.derived[compute.__name__] = compute(graph)
        return graph.derived[compute.__name__]
    return kept


@_kept
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


@_kept
def iota_constants(graph: Graph) -> dict[str, int]:
    """Constant -> the axis along which each element equals its index (every other
    axis of extent 1)."""
    found = {}
    for t in graph.constants:
        long = [d for d, n in enumerate(t.type.shape) if n > 1]
        if t.data is None or len(long) != 1 or not t.type.dtype.startswith(("int", "uint")):
            continue
        if np.array_equal(t.array, np.arange(t.type.shape[long[0]])):
            found[t.name] = long[0]
    return found


@_kept
def constant_digests(graph: Graph) -> dict[str, str]:
    """Static constant -> sha256 of its type and data. Not for 0, 1, ..., n - 1, whose
    data its size implies: a symbolic graph's compiles at probes make such a constant
    (an `Iota`) at each size, and their kernels must agree."""
    out = {}
    for t in graph.constants:
        if not isinstance(t.data, tuple) or not t.type.static:
            continue
        data = t.array
        if np.array_equal(data, np.arange(data.size)):
            continue
        h = hashlib.sha256(str(t.type).encode())
        h.update(data.tobytes())
        out[t.name] = h.hexdigest()
    return out


@_kept
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
        values = t.array.reshape(t.type.shape[r], t.type.shape[c]) != 0
        rows, cols = np.indices(values.shape)
        first = np.flatnonzero(values[0])
        d = int(first[0]) - 1 if first.size else values.shape[1] - 1
        if np.array_equal(values, cols > rows + d):
            found[t.name] = (r, c, d)
    return found


@_kept
def masked_exponentials(graph: Graph) -> dict[str, tuple[int, int, int]]:
    """Exponentials or probabilities -> (row dim, column dim, d): 0 where index[col] >
    index[row] + d, unless its row is NaN where unmasked (see the module docstring)."""
    producer = {n.output: n for n in graph.nodes}
    consts = {t.name: t for t in graph.constants}
    iotas, triangles = iota_constants(graph), triangle_constants(graph)
    ndim = {name: t.ndim for name, t in graph.types.items()}

    def node(t: str, op: str):
        n = producer.get(t)
        return n if n is not None and n.op == op else None

    def last_axis_reduce(n, op: str, x: str) -> bool:
        return (n is not None and n.op == op and n.inputs[0] == x and n.attrs.get("keepdims")
                and tuple(n.attrs.get("axes", ())) in ((ndim[x] - 1,), (-1,)))

    def mask_of(m: str, rank: int) -> int | None:
        """d when tensor m, right-aligned to `rank` dims, holds exactly where the last
        dim's index exceeds the one before's plus d."""
        rows, cols = rank - 2, rank - 1
        shift = rank - ndim[m]
        if m in triangles:
            r, c, d = triangles[m]
            return d if (r + shift, c + shift) == (rows, cols) else None
        g = node(m, "greater")
        if g is None:
            return None
        a, b = g.inputs
        if a in iotas and b in iotas and (iotas[a] + rank - ndim[a], iotas[b] + rank - ndim[b]) \
                == (cols, rows):
            return 0
        return None

    found = {}
    for e in graph.nodes:  # exp(select(mask, -inf, x) - max)
        sh = node(e.inputs[0], "sub") if e.op == "exp" else None
        if sh is None:
            continue
        x, mx = sh.inputs
        sel = node(x, "select")
        if sel is None or not last_axis_reduce(producer.get(mx), "reduce_max", x):
            continue
        m, neg, _ = sel.inputs
        value = consts.get(neg)
        if value is None or value.type.size != 1 or value.data[0] != -math.inf:
            continue
        rank = ndim[e.output]
        d = mask_of(m, rank) if rank >= 2 else None
        if d is not None and d >= 0:
            found[e.output] = (rank - 2, rank - 1, d)
    for n in graph.nodes:  # those exponentials times the reciprocal of their row's sum
        if n.op != "mul":
            continue
        for ex, inv in (n.inputs, n.inputs[::-1]):
            r = node(inv, "reciprocal")
            if ex in found and r is not None and last_axis_reduce(
                    producer.get(r.inputs[0]), "reduce_sum", ex):
                found[n.output] = found[ex]
    return found
