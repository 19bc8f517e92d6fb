"""graph.simplify: no-op removal, constant folding, CSE and DCE, keeping every output."""
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from polyc.graph import Graph, GraphBuilder, Node
from polyc.graph.decompose import decompose_graph
from polyc.graph.ir import FrozenDict
from polyc.graph.ops import broadcast_shapes
from polyc.graph.reference import run_reference
from polyc.graph.verify import verify_graph
from polyc.graph.simplify import FOLD_LIMIT, simplify_graph


def check_well_formed(g: Graph) -> None:
    verify_graph(g, "test")


def assert_same_results(before: Graph, after: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    inputs = {t.name: rng.standard_normal(t.type.shape).astype(t.type.dtype)
              for t in before.inputs}
    want, got = run_reference(before, inputs), run_reference(after, inputs)
    assert list(got) == list(want)
    for name in want:
        # Folding evaluates each op exactly as the reference does: equal, not close.
        np.testing.assert_array_equal(got[name], want[name])


def simplified(g: Graph) -> Graph:
    s = simplify_graph(g)
    check_well_formed(s)
    assert s.outputs == g.outputs and s.inputs == g.inputs
    assert_same_results(g, s)
    assert simplify_graph(s) == s  # one round reaches the fixed point
    return s


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


# --- no-ops ---------------------------------------------------------------------------

NOOPS = {
    "reshape": dict(shape=[3, 4]),
    "transpose": dict(perm=[0, 1]),
    "cast": dict(to="float32"),
    "broadcast_to": dict(shape=[3, 4]),
    "slice": dict(starts=[0, -4], ends=[3, 100]),
    "pad": dict(pads=[[0, 0], [0, 0]], value=1.0),
    "concat": dict(axis=1),
}


@pytest.mark.parametrize("op", sorted(NOOPS))
def test_noop_is_bypassed(op):
    b = GraphBuilder()
    x = b.input("x", [3, 4])
    y = b.exp(b.op(op, x, **NOOPS[op]), out="y")
    s = simplified(b.build([y]))
    assert ops(s) == ["exp"] and s.nodes[0].inputs == ("x",)


def test_transpose_of_a_vector_without_perm_is_a_noop():
    b = GraphBuilder()
    y = b.exp(b.transpose(b.input("x", [5])), out="y")
    assert ops(simplified(b.build([y]))) == ["exp"]


@pytest.mark.parametrize("op, attrs", [
    ("transpose", dict(perm=[1, 0])),  # same shape on a square matrix, not the identity
    ("reshape", dict(shape=[4, 4, 1])),
    ("slice", dict(starts=[1], ends=[4])),
    ("pad", dict(pads=[[0, 1], [0, 0]])),
])
def test_real_data_movement_stays(op, attrs):
    b = GraphBuilder()
    x = b.input("x", [4, 4])
    y = b.exp(b.op(op, x, **attrs), out="y")
    assert ops(simplified(b.build([y]))) == [op, "exp"]


def test_concat_of_several_inputs_stays():
    b = GraphBuilder()
    x = b.input("x", [4, 4])
    y = b.exp(b.concat(x, x, axis=0), out="y")
    assert ops(simplified(b.build([y]))) == ["concat", "exp"]


def test_noop_producing_a_graph_output_stays():
    b = GraphBuilder()
    x = b.input("x", [3, 4])
    r = b.reshape(x, shape=[3, 4], out="r")
    y = b.exp(r, out="y")
    s = simplified(b.build([r, y]))
    assert ops(s) == ["reshape", "exp"]
    assert s.producer("y").inputs == ("x",)  # but consumers read past the copy


# --- constant folding -------------------------------------------------------------------

def test_constant_nodes_fold_into_constants_of_the_same_name():
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    c = b.constant("c", [3], [1.0, 2.0, 3.0])
    two = b.constant("two", [], [2.0])
    h = b.exp(b.mul(c, two), out="h")
    y = b.add(x, h, out="y")
    s = simplified(b.build([y]))
    assert ops(s) == ["add"]
    folded = s.constant_map["h"]
    assert folded.type == s.types["h"]
    assert folded.data == pytest.approx(tuple(math.exp(2 * v) for v in (1, 2, 3)), rel=1e-6)
    assert all(type(v) is float for v in folded.data)
    assert set(s.constant_map) == {"h"}  # c and two are dead now


def test_int32_folding_stores_python_ints():
    b = GraphBuilder()
    x = b.input("x", [3], "int32")
    c = b.constant("c", [3], [7, -7, 9], "int32")
    d = b.constant("d", [], [2], "int32")
    y = b.add(x, b.div(c, d, out="q"), out="y")
    s = simplified(b.build([y]))
    assert s.constant_map["q"].data == (3, -3, 4)  # C division truncates toward zero
    assert all(type(v) is int for v in s.constant_map["q"].data)


def test_large_results_are_not_folded():
    b = GraphBuilder()
    x = b.input("x", [65, 64])
    big = b.broadcast_to(b.constant("c", [], [1.0]), shape=[65, 64], out="big")
    small = b.broadcast_to(b.constant("d", [], [2.0]), shape=[64, 64], out="small")
    g = b.build([b.add(x, big, out="y"), b.mul(b.slice(x, starts=[1], ends=[65]), small)])
    s = simplified(g)
    assert 65 * 64 > FOLD_LIMIT >= 64 * 64
    assert s.producer("big").op == "broadcast_to"
    assert s.producer("small") is None and s.constant_map["small"].type.shape == (64, 64)
    assert simplify_graph(g, fold_limit=0).producer("small") is not None


def test_a_folded_graph_output_becomes_a_constant_output():
    b = GraphBuilder()
    b.input("x", [1])
    y = b.neg(b.constant("c", [2], [1.0, -2.0]), out="y")
    s = simplified(b.build([y]))
    assert s.nodes == () and s.constant_map["y"].data == (-1.0, 2.0)


def test_small_causal_mask_folds_and_a_large_one_stays_computed():
    def attention(lq, lk):
        b = GraphBuilder()
        q, k, v = b.input("q", [lq, 4]), b.input("k", [lk, 4]), b.input("v", [lk, 4])
        return decompose_graph(b.build([b.attention(q, k, v, causal=True, out="y")]))

    small = simplified(attention(3, 5))
    assert "greater" not in ops(small)
    masks = [c for c in small.constants if c.type.shape == (3, 5)]
    assert len(masks) == 1 and masks[0].type.dtype == "int32"
    assert np.array_equal(np.reshape(masks[0].data, (3, 5)), np.triu(np.ones((3, 5)), 1))
    large = simplify_graph(attention(100, 100))
    assert "greater" in ops(large)
    assert max(c.type.size for c in large.constants) == 100


# --- common subexpressions ----------------------------------------------------------------

def test_duplicates_merge_and_consumers_follow():
    b = GraphBuilder()
    x = b.input("x", [4])
    e1, e2 = b.exp(x, out="e1"), b.exp(x, out="e2")
    n1, n2 = b.neg(e1, out="n1"), b.neg(e2, out="n2")
    y = b.add(n1, n2, out="y")
    s = simplified(b.build([y]))
    assert [str(n) for n in s.nodes] == ["e1 = exp(x)", "n1 = neg(e1)", "y = add(n1, n1)"]


def test_different_attributes_do_not_merge():
    b = GraphBuilder()
    x = b.input("x", [4, 4])
    y = b.add(b.reduce_sum(x, axes=[0]), b.reduce_sum(x, axes=[1]), out="y")
    assert ops(simplified(b.build([y]))) == ["reduce_sum", "reduce_sum", "add"]


def test_duplicate_graph_outputs_are_all_kept():
    b = GraphBuilder()
    x = b.input("x", [4])
    y1, y2 = b.exp(x, out="y1"), b.exp(x, out="y2")
    s = simplified(b.build([y1, y2, b.neg(y2, out="z")]))
    assert [str(n) for n in s.nodes] == ["y1 = exp(x)", "y2 = exp(x)", "z = neg(y1)"]


def test_a_later_output_takes_over_an_earlier_duplicate():
    b = GraphBuilder()
    x = b.input("x", [4])
    t = b.exp(x, out="t")
    u = b.neg(t, out="u")  # reads the duplicate before the output exists
    y = b.exp(x, out="y")
    s = simplified(b.build([u, y]))
    assert [str(n) for n in s.nodes] == ["y = exp(x)", "u = neg(y)"]


def test_classes_with_several_outputs_read_their_first_emitted_member():
    b = GraphBuilder()
    x = b.input("x", [4])
    a1, a2, a3 = (b.exp(x, out=name) for name in ("a1", "a2", "a3"))
    b1, b2 = b.neg(a1, out="b1"), b.neg(a3, out="b2")
    g = b.build([a2, a3, b2, b.add(b1, x, out="z")])
    # Order the nodes so that b1, which b2 replaces, comes before a3, which b2 reads.
    g = replace(g, nodes=tuple(g.producer(t) for t in ("a1", "b1", "a2", "a3", "b2", "z")))
    s = simplified(g)
    assert [str(n) for n in s.nodes] == ["a2 = exp(x)", "b2 = neg(a2)", "a3 = exp(x)",
                                         "z = add(b2, x)"]


def test_equal_constants_merge_bitwise():
    b = GraphBuilder()
    x = b.input("x", [2])
    c1, c2 = b.constant("c1", [2], [1.0, 0.0]), b.constant("c2", [2], [1.0, 0.0])
    c3 = b.constant("c3", [2], [1.0, -0.0])  # differs from c1 under division
    y = b.add(b.add(b.div(x, c1), b.div(x, c2)), b.div(x, c3), out="y")
    s = simplified(b.build([y]))
    assert set(s.constant_map) == {"c1", "c3"}
    assert ops(s) == ["div", "div", "add", "add"]


def test_decomposed_composites_share_their_pieces():
    b = GraphBuilder()
    x = b.input("x", [4, 8])
    g = decompose_graph(b.build([b.softmax(x, out="p"), b.log_softmax(x, out="q")]))
    s = simplified(g)
    assert ops(s).count("reduce_max") == 1 and ops(s).count("exp") == 1
    assert len(s.nodes) == len(g.nodes) - 4  # max, shifted, exp and sum computed once


# --- dead code ------------------------------------------------------------------------------

def test_dead_nodes_and_constants_go_inputs_stay():
    b = GraphBuilder()
    x, _ = b.input("x", [3]), b.input("unused", [3])
    b.constant("c", [3], [1.0, 2.0, 3.0])
    g = b.build([b.relu(x, out="y")])
    # The loader already drops dead nodes, so add one behind its back.
    g = replace(g, nodes=g.nodes + (Node("exp", ("x",), "dead", name="dead"),),
                types=FrozenDict({**g.types, "dead": g.types["x"]}))
    s = simplified(g)
    assert ops(s) == ["relu"] and s.constants == ()
    assert [t.name for t in s.inputs] == ["x", "unused"]


def test_outputs_that_are_inputs_or_constants_survive():
    b = GraphBuilder()
    x = b.input("x", [3])
    c = b.constant("c", [3], [1.0, 2.0, 3.0])
    s = simplified(b.build([x, c]))
    assert s.nodes == () and set(s.constant_map) == {"c"}


# --- properties -----------------------------------------------------------------------------

_UNARY = ["neg", "exp", "relu", "abs"]
_BINARY = ["add", "mul", "maximum"]
# (op, attrs, output shape), each applicable to any [2, 3] tensor; most are no-ops.
_MOVES = [("reshape", dict(shape=[2, 3]), (2, 3)), ("transpose", dict(perm=[0, 1]), (2, 3)),
          ("cast", dict(to="float32"), (2, 3)), ("slice", dict(starts=[0], ends=[2]), (2, 3)),
          ("pad", dict(pads=[[0, 0], [0, 0]]), (2, 3)),
          ("reduce_sum", dict(axes=[1], keepdims=True), (2, 1)),
          ("reduce_max", dict(axes=[1], keepdims=True), (2, 1))]


@st.composite
def random_graphs(draw):
    """Small DAGs over two inputs and two constants, with duplicates and no-ops likely.
    Shapes stay [2, 3], [2, 1] or [], so every binary op broadcasts."""
    b = GraphBuilder("random")
    shapes = {b.input("x", [2, 3]): (2, 3), b.input("y", [2, 3]): (2, 3),
              b.constant("c", [2, 3], [0.5, -1.0, 2.0, 0.0, 1.5, -0.25]): (2, 3),
              b.constant("d", [], [0.75]): ()}
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "move", "broadcast"]))
        pick = st.sampled_from(list(shapes))
        out = f"t{i}"
        if kind == "unary":
            src = draw(pick)
            b.op(draw(st.sampled_from(_UNARY)), src, out=out)
            shapes[out] = shapes[src]
        elif kind == "binary":
            lhs, rhs = draw(pick), draw(pick)
            b.op(draw(st.sampled_from(_BINARY)), lhs, rhs, out=out)
            shapes[out] = broadcast_shapes(shapes[lhs], shapes[rhs])
        elif kind == "move":
            op, attrs, shape = draw(st.sampled_from(_MOVES))
            b.op(op, draw(st.sampled_from([t for t, s in shapes.items() if s == (2, 3)])),
                 out=out, **attrs)
            shapes[out] = shape
        else:
            b.broadcast_to(draw(pick), shape=[2, 3], out=out)
            shapes[out] = (2, 3)
    outs = draw(st.lists(st.sampled_from(list(shapes)), min_size=1, max_size=4, unique=True))
    return b.build(outs)


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_simplify_keeps_results_and_reaches_a_fixed_point(g):
    s = simplified(g)
    assert len(s.nodes) <= len(g.nodes)
    outputs = set(s.outputs)
    keys = [(n.op, n.inputs, n.attrs) for n in s.nodes if n.output not in outputs]
    assert len(keys) == len(set(keys))
    assert not any(n.op in ("reshape", "cast") and s.types[n.inputs[0]] == s.types[n.output]
                   and n.output not in outputs for n in s.nodes)
    assert simplify_graph(g) == s  # deterministic


# --- reshapes around elementwise work ---------------------------------------------------

def _around(shape_in, shape_mid, shape_back, *, other=None, output_mid=False, reduce=False):
    """x: shape_in -> reshape to shape_mid -> gelu-like work -> reshape to shape_back."""
    b = GraphBuilder("around")
    x = b.input("x", shape_in)
    r = b.reshape(x, shape=list(shape_mid))
    h = b.mul(r, b.constant("half", (), [0.5]))
    e = b.erf(b.mul(r, b.constant("k", (1, 1), [0.7])))
    y = b.mul(h, b.add(e, b.constant("one", (), [1.0])))
    if other is not None:
        y = b.add(y, b.input("o", other))
    if reduce:
        y = b.reduce_sum(y, axes=[-1], keepdims=True)
    outs = [b.relu(b.reshape(y, shape=list(shape_back)))] + ([y] if output_mid else [])
    return b.build(outputs=outs)


def test_elementwise_work_between_a_reshape_and_its_way_back_keeps_the_first_shape():
    g = _around((6, 8), (2, 3, 8), (6, 8))
    s = simplified(decompose_graph(g))
    assert "reshape" not in ops(s)
    assert all(s.types[n.output].shape == (6, 8) for n in s.nodes)


@pytest.mark.parametrize("case", [
    dict(shape_back=(3, 16)),                  # back to another shape
    dict(other=(2, 3, 8)),                     # reads a tensor of the second shape
    dict(output_mid=True),                     # the second shape is an output
    dict(reduce=True, shape_back=(2, 3, 1)),   # a reduction over the second shape
])
def test_reshapes_stay_where_the_work_needs_the_second_shape(case):
    kw = dict(shape_in=(6, 8), shape_mid=(2, 3, 8), shape_back=(6, 8)) | case
    s = simplified(decompose_graph(_around(**kw)))
    assert "reshape" in ops(s)


def test_a_reshape_of_a_reshape_reads_the_first_ones_input():
    # PyTorch's head merge: transpose, view [2, 64, 4, 32] -> [2, 64, 128] -> [128, 128]
    b = GraphBuilder("heads")
    t = b.transpose(b.input("x", (2, 4, 64, 32)), perm=[0, 2, 1, 3])
    mid = b.reshape(t, shape=[2, 64, 128])
    g = b.build(outputs=[b.reshape(mid, shape=[128, 128]), b.reshape(mid, shape=[2, 8192])])
    s = simplified(g)
    reshapes = [n for n in s.nodes if n.op == "reshape"]
    assert len(reshapes) == 2 and {n.inputs[0] for n in reshapes} == {s.nodes[0].output}
    assert_same_results(g, s)
