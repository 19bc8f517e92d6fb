"""A reshape's read index: the elements numpy's row-major reshape reads, with what
divides exactly taken out of its floor divisions and modulos (`comprehension._exact`)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.kernel import build_kernels
from polyc.kernel.comprehension import Aff, FloorDiv, Mod


def _value(e, point) -> int:
    if isinstance(e, Aff):
        return e.const + sum(c * point[p] for p, c in e.terms)
    if isinstance(e, FloorDiv):
        return _value(e.arg, point) // e.d
    return _value(e.arg, point) % e.d


def _read_index(x_shape, out_shape):
    b = GraphBuilder("r")
    graph = b.build([b.reshape(b.input("x", x_shape), shape=list(out_shape))])
    (kernel,) = build_kernels(graph, ((graph.nodes[0].name,),))
    (statement,) = kernel.statements
    return statement.expr.index


CASES = [((2, 64, 4, 32), (128, 128)), ((2, 64, 128), (128, 128)), ((128, 384), (2, 64, 384)),
         ((128, 128), (2, 64, 4, 32)), ((6, 10), (4, 15)), ((3, 1, 8), (2, 12)),
         ((12,), (3, 2, 2)), ((5, 7, 3), (35, 3)), ((4, 6, 5), (2, 60)), ((9, 4), (2, 3, 6))]


@pytest.mark.parametrize("x_shape,out_shape", CASES, ids=str)
def test_every_element_is_read_where_numpy_reads_it(x_shape, out_shape):
    index = _read_index(x_shape, out_shape)
    for point in itertools.product(*map(range, out_shape)):
        want = np.unravel_index(np.ravel_multi_index(point, out_shape), x_shape)
        assert tuple(_value(e, point) for e in index) == tuple(map(int, want)), point


def test_a_head_merge_reads_each_row_in_place():
    # PyTorch's merge of 4 heads of 32: the column j is never divided together with the
    # row i, so a row is one contiguous run of x
    assert _read_index((2, 64, 4, 32), (128, 128)) == (
        FloorDiv(Aff.it(0), 64), Mod(Aff.it(0), 64), FloorDiv(Aff.it(1), 32), Mod(Aff.it(1), 32))
    assert _read_index((128, 384), (2, 64, 384)) == (Aff.it(0, 64) + Aff.it(1), Aff.it(2))
