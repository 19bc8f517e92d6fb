"""End to end: every op of the registry compiled to C, run, and compared with the numpy
reference executor (PPCG's polybench_test.sh, loopy's auto_test_vs_ref).

Each case builds one small graph on fixed shapes chosen to hit the edges of the lowering:
odd sizes, size-1 dims, broadcasting, negative axes, keepdims, scalars, strided and
padded windows, and a few cases large enough to run on threads. Inputs stay inside each
op's domain (positive for log / sqrt / pow, nonzero int32 divisors) and never hold NaN:
the C kernels' relu / maximum / minimum drop a NaN (fmax) where numpy propagates it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from polyc import GraphBuilder, targets
from polyc.compiler import compile
from polyc.graph.ops import OPS
from polyc.graph.reference import run_reference

RTOL = {"float32": 1e-4, "float64": 1e-9}
ATOL = {"float32": 1e-5, "float64": 1e-12}  # for values that cross zero


@dataclass(frozen=True)
class Case:
    id: str
    ops: tuple[str, ...]  # the ops it exercises, for the coverage test
    make: Callable[[GraphBuilder, "Inputs"], list[str]]  # adds inputs and nodes, returns outputs


CASES: list[Case] = []


def case(id: str, *ops: str):
    def register(fn):
        CASES.append(Case(id, ops, fn))
        return fn
    return register


# --- inputs ------------------------------------------------------------------------------

class Inputs(dict):
    """Graph inputs declared on the builder and their values, side by side."""

    def __init__(self, b: GraphBuilder, rng: np.random.Generator):
        super().__init__()
        self.b, self.rng = b, rng

    def add(self, name: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        self[name] = value
        return self.b.input(name, value.shape, str(value.dtype))

    def real(self, name, shape, lo=-2.0, hi=2.0, dtype="float32") -> str:
        return self.add(name, self.rng.uniform(lo, hi, shape).astype(dtype))

    def positive(self, name, shape, dtype="float32") -> str:
        return self.real(name, shape, 0.5, 2.0, dtype)

    def ints(self, name, shape, lo=-20, hi=20, nonzero=False) -> str:
        v = self.rng.integers(lo, hi, shape, dtype=np.int32)
        if nonzero:
            v = np.where(v == 0, 3, v).astype(np.int32)
        return self.add(name, v)


def _run(make, target: str = "cpu") -> None:
    b = GraphBuilder("case")
    rng = np.random.default_rng(20240601)
    x = Inputs(b, rng)
    outputs = make(b, x)
    graph = b.build(outputs=outputs)
    compiled = compile(graph, target)
    got = compiled(**x)
    want = run_reference(graph, dict(x))
    assert set(got) == set(want) == set(graph.outputs)
    for name in graph.outputs:
        g, w = got[name], want[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if w.dtype == np.int32:
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=RTOL[str(w.dtype)], atol=ATOL[str(w.dtype)],
                                       err_msg=name)


# --- unary ----------------------------------------------------------------------------------

POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}

for _op in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "relu",
            "reciprocal", "floor", "ceil"):
    @case(f"{_op}-7x13", _op)
    def _unary(b, x, op=_op):
        a = x.positive("a", (7, 13)) if op in POSITIVE_ONLY else x.real("a", (7, 13), -3, 3)
        return [b.op(op, a)]


@case("exp-float64", "exp")
def _(b, x):
    return [b.exp(x.real("a", (5, 3), dtype="float64"))]


@case("erf-tanh-sigmoid-float64", "erf", "tanh", "sigmoid")
def _(b, x):
    a = x.real("a", (17,), -4, 4, dtype="float64")
    return [b.erf(a), b.tanh(a), b.sigmoid(a)]


@case("scalar-unary", "log", "neg")
def _(b, x):
    return [b.neg(b.log(x.positive("a", ())))]


# --- binary and broadcasting ---------------------------------------------------------------

BROADCASTS = {  # shapes of (a, b)
    "same": ((7, 13), (7, 13)),
    "row": ((7, 13), (13,)),
    "outer": ((7, 1), (1, 13)),
    "batch": ((2, 1, 5), (3, 1)),
    "scalar": ((), (4, 3)),
}

for _op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "greater", "less"):
    for _kind, (_sa, _sb) in BROADCASTS.items():
        if _op not in ("add", "div", "pow", "greater") and _kind not in ("same", "outer"):
            continue  # every op on two shapes, every broadcast on a few ops
        @case(f"{_op}-{_kind}", _op)
        def _binary(b, x, op=_op, sa=_sa, sb=_sb):
            if op == "pow":
                return [b.pow(x.positive("a", sa), x.real("b", sb))]
            if op == "div":
                return [b.div(x.real("a", sa), x.positive("b", sb))]
            return [b.op(op, x.real("a", sa), x.real("b", sb))]


@case("equal-broadcast", "equal")
def _(b, x):
    # whole numbers so that some pairs are equal
    a = x.add("a", x.rng.integers(0, 3, (6, 4)).astype(np.float32))
    c = x.add("c", x.rng.integers(0, 3, (4,)).astype(np.float32))
    return [b.equal(a, c)]


@case("compare-or-equal-broadcast", "greater_equal", "less_equal", "not_equal")
def _(b, x):
    a = x.add("a", x.rng.integers(0, 3, (6, 4)).astype(np.float32))
    c = x.add("c", x.rng.integers(0, 3, (4,)).astype(np.float32))
    return [b.greater_equal(a, c), b.less_equal(a, c), b.not_equal(a, c)]


@case("one-hot", "one_hot")
def _(b, x):
    indices = x.ints("i", (5, 3), -1, 6)  # out of [0, 4): off everywhere
    on, off = b.constant("on", [1], [2.5]), b.constant("off", [], [-1.0])
    return [b.one_hot(indices, on, off, depth=4), b.one_hot(indices, on, off, depth=4, axis=1)]


@case("select-broadcast-3", "select", "greater")
def _(b, x):
    cond = b.greater(x.real("p", (7, 1)), x.real("q", (13,)))
    return [b.select(cond, x.real("a", (7, 13)), x.real("c", (13,)))]


@case("float64-binary", "add", "mul", "pow", "div")
def _(b, x):
    a, c = x.positive("a", (4, 5), "float64"), x.real("c", (5,), dtype="float64")
    return [b.div(b.mul(b.add(a, c), c), b.pow(a, c))]


@case("scalar-binary", "add", "mul")
def _(b, x):
    s, t = x.real("s", ()), x.real("t", ())
    return [b.mul(b.add(s, t), s)]


@case("constant-operands", "add", "mul")
def _(b, x):
    c = b.constant("c", [3], [1.5, -2.0, 0.25])
    k = b.constant("k", [], [3.0])
    return [b.mul(b.add(x.real("a", (4, 3)), c), k)]


# --- int32 ---------------------------------------------------------------------------------

@case("int32-arith", "add", "sub", "mul", "div", "neg", "abs", "relu")
def _(b, x):
    a, c = x.ints("a", (5, 7), -50, 50), x.ints("c", (7,), -6, 6, nonzero=True)
    # div truncates toward zero: -7 / 2 = -3
    return [b.div(a, c), b.sub(b.mul(a, c), b.neg(a)), b.abs(a), b.relu(b.add(a, c))]


@case("int32-compare-select", "greater", "less", "equal", "select", "maximum", "minimum")
def _(b, x):
    a, c = x.ints("a", (6, 5), -3, 3), x.ints("c", (5,), -3, 3)
    cond = b.less(a, c)
    return [b.select(cond, b.maximum(a, c), b.minimum(a, c)), b.greater(a, c), b.equal(a, c)]


@case("int32-reductions", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod")
def _(b, x):
    a = x.ints("a", (3, 4, 5), -4, 5)
    return [b.reduce_sum(a, axes=[1]), b.reduce_max(a, axes=[0, 2], keepdims=True),
            b.reduce_min(a), b.reduce_prod(a, axes=[-1])]


@case("cast-float-int", "cast")
def _(b, x):
    a = x.real("a", (7, 13), -9, 9)  # truncation toward zero, both signs
    i = b.cast(a, to="int32")
    return [i, b.cast(i, to="float32"), b.cast(a, to="float64"),
            b.cast(x.real("d", (3,), dtype="float64"), to="float32")]


# --- reductions -------------------------------------------------------------------------------

REDUCE_ATTRS = {
    "all": {},
    "axis1": {"axes": [1]},
    "neg-axis-keep": {"axes": [-1], "keepdims": True},
    "two-axes": {"axes": [0, 2]},
    "all-keep": {"keepdims": True},
}

for _op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
    for _kind, _attrs in REDUCE_ATTRS.items():
        if _op != "reduce_sum" and _kind not in ("axis1", "neg-axis-keep"):
            continue
        @case(f"{_op}-{_kind}", _op)
        def _reduce(b, x, op=_op, attrs=_attrs):
            # products stay near 1 over the 7 terms of an axis
            a = x.real("a", (3, 7, 5), 0.7, 1.3) if op == "reduce_prod" else x.real("a", (3, 7, 5))
            return [b.op(op, a, **attrs)]


@case("reduce-size1-dims", "reduce_sum", "reduce_max")
def _(b, x):
    a = x.real("a", (1, 9, 1))
    return [b.reduce_sum(a, axes=[0, 1]), b.reduce_max(a, axes=[2], keepdims=True)]


@case("reduce-scalar", "reduce_sum")
def _(b, x):
    return [b.reduce_sum(x.real("a", ()))]  # over no axis at all: the value itself


@case("reduce-float64", "reduce_sum", "reduce_prod")
def _(b, x):
    a = x.real("a", (4, 6), 0.5, 1.5, dtype="float64")
    return [b.reduce_sum(a, axes=[0]), b.reduce_prod(a)]


# --- contractions -----------------------------------------------------------------------------

MATMULS = {  # shapes of (a, b) and attrs
    "2d-odd": ((7, 13), (13, 5), {}),
    "vec-mat": ((13,), (13, 5), {}),
    "mat-vec": ((7, 13), (13,), {}),
    "vec-vec": ((6,), (6,), {}),
    "batch-broadcast": ((2, 1, 3, 4), (5, 4, 6), {}),
    "transpose-a": ((13, 7), (13, 5), {"transpose_a": True}),
    "transpose-b": ((7, 13), (5, 13), {"transpose_b": True}),
    "transpose-both-batch": ((3, 4, 2), (1, 5, 4), {"transpose_a": True, "transpose_b": True}),
    "batch-vec": ((2, 3, 4), (4,), {}),
    "size1": ((1, 1), (1, 9), {}),
}

for _kind, (_sa, _sb, _attrs) in MATMULS.items():
    @case(f"matmul-{_kind}", "matmul")
    def _matmul(b, x, sa=_sa, sb=_sb, attrs=_attrs):
        return [b.matmul(x.real("a", sa), x.real("w", sb), **attrs)]


@case("matmul-float64", "matmul")
def _(b, x):
    return [b.matmul(x.real("a", (3, 5), dtype="float64"), x.real("w", (5, 2), dtype="float64"))]


@case("matmul-int32", "matmul")
def _(b, x):
    return [b.matmul(x.ints("a", (3, 5), -5, 5), x.ints("w", (5, 4), -5, 5))]


CONVS = {  # x shape, w shape, attrs, bias
    "plain": ((1, 2, 7, 9), (3, 2, 3, 3), {}, False),
    "bias": ((2, 3, 5, 6), (4, 3, 3, 2), {}, True),
    "strides-pads": ((1, 2, 9, 8), (3, 2, 3, 3), {"strides": [2, 3], "pads": [1, 2, 0, 1]}, True),
    "dilations": ((1, 1, 9, 9), (2, 1, 3, 2), {"dilations": [2, 3], "pads": [2, 0, 1, 3]}, False),
    "1x1": ((2, 4, 3, 5), (6, 4, 1, 1), {}, True),
}

for _kind, (_sx, _sw, _attrs, _bias) in CONVS.items():
    @case(f"conv2d-{_kind}", "conv2d")
    def _conv(b, x, sx=_sx, sw=_sw, attrs=_attrs, bias=_bias):
        args = [x.real("x", sx), x.real("w", sw)] + ([x.real("b", (sw[0],))] if bias else [])
        return [b.conv2d(*args, **attrs)]


# --- data movement ---------------------------------------------------------------------------

@case("transpose-default", "transpose")
def _(b, x):
    return [b.transpose(x.real("a", (2, 3, 5)))]


@case("transpose-perm", "transpose")
def _(b, x):
    a = x.real("a", (2, 3, 5, 1))
    return [b.transpose(a, perm=[1, 3, 0, 2]), b.transpose(x.real("v", (4,)))]


@case("reshape", "reshape")
def _(b, x):
    a = x.real("a", (6, 5, 2))
    return [b.reshape(a, shape=[-1, 4]), b.reshape(a, shape=[3, 2, -1]),
            b.reshape(x.real("t", ()), shape=[1, 1, 1])]


@case("reshape-to-scalar", "reshape")
def _(b, x):
    return [b.reshape(x.real("s", (1, 1)), shape=[])]


@case("broadcast_to", "broadcast_to")
def _(b, x):
    return [b.broadcast_to(x.real("a", (3, 1)), shape=[2, 3, 4]),
            b.broadcast_to(x.real("s", ()), shape=[2, 3])]


@case("slice-steps-negative", "slice")
def _(b, x):
    a = x.real("a", (9, 11, 4))
    return [b.slice(a, starts=[1, -8], ends=[8, 11], steps=[3, 2]),
            b.slice(a, starts=[-3], ends=[100], axes=[-1]),  # an end past the dim clamps
            b.slice(a, starts=[2, 1], ends=[-1, 3], axes=[-1, 0])]


@case("concat-3", "concat")
def _(b, x):
    a, c, d = x.real("a", (3, 2, 4)), x.real("c", (3, 5, 4)), x.real("d", (3, 1, 4))
    return [b.concat(a, c, d, axis=1), b.concat(a, a, axis=-1)]


@case("pad", "pad")
def _(b, x):
    a = x.real("a", (3, 4, 2))
    return [b.pad(a, pads=[[1, 2], [0, 0], [3, 1]], value=-1.5), b.pad(a, pads=[[0, 1]] * 3)]


@case("pad-int32", "pad")
def _(b, x):
    return [b.pad(x.ints("a", (2, 3)), pads=[[1, 0], [2, 2]], value=7)]


# --- composites ------------------------------------------------------------------------------

@case("softmax", "softmax")
def _(b, x):
    a = x.real("a", (5, 7, 3), -4, 4)
    return [b.softmax(a), b.softmax(a, axis=0), b.softmax(a, axis=-2)]


@case("log_softmax", "log_softmax")
def _(b, x):
    return [b.log_softmax(x.real("a", (7, 13), -4, 4), axis=0)]


@case("logsumexp", "logsumexp")
def _(b, x):
    a = x.real("a", (4, 6, 3), -4, 4)
    return [b.logsumexp(a, axes=[-1]), b.logsumexp(a, axes=[0, 2], keepdims=True)]


@case("logsumexp-all", "logsumexp")
def _(b, x):
    return [b.logsumexp(x.real("a", (4, 6, 3), -4, 4))]


@case("reduce_mean-variance", "reduce_mean", "variance")
def _(b, x):
    a = x.real("a", (5, 7, 2))
    return [b.reduce_mean(a, axes=[1]), b.variance(a, axes=[0, -1], keepdims=True)]


@case("variance-all", "variance")
def _(b, x):
    return [b.variance(x.real("a", (5, 7, 2)))]


@case("layer_norm", "layer_norm")
def _(b, x):
    a = x.real("a", (3, 4, 7))
    g, be = x.real("g", (4, 7)), x.real("be", (4, 7))
    return [b.layer_norm(a), b.layer_norm(a, g, be, axis=-2, epsilon=1e-3)]


@case("rms_norm", "rms_norm")
def _(b, x):
    a = x.real("a", (3, 7))
    return [b.rms_norm(a, x.real("g", (7,))), b.rms_norm(a, axis=0)]


@case("batch_norm", "batch_norm")
def _(b, x):
    params = [x.real("scale", (3,)), x.real("bias", (3,)), x.real("mean", (3,)),
              x.positive("var", (3,))]
    return [b.batch_norm(x.real("a", (2, 3, 4, 5)), *params)]


@case("gelu", "gelu")
def _(b, x):
    a = x.real("a", (7, 13), -4, 4)
    return [b.gelu(a), b.gelu(a, approximate="tanh")]


@case("silu", "silu")
def _(b, x):
    return [b.silu(x.real("a", (7, 13), -6, 6))]


@case("linear", "linear")
def _(b, x):
    a, w = x.real("a", (2, 3, 5)), x.real("w", (5, 4))
    return [b.linear(a, w, x.real("bias", (4,))), b.linear(a, w)]


@case("attention", "attention")
def _(b, x):
    q, k, v = x.real("q", (2, 3, 5, 4)), x.real("k", (3, 7, 4)), x.real("v", (1, 7, 6))
    return [b.attention(q, k, v), b.attention(q, k, v, causal=True, scale=0.3)]


# --- large enough for threads ------------------------------------------------------------------
# Above lower_cpu's MIN_PARALLEL_INSTANCES, so the outer loops get `omp parallel for`
# (and inner ones `omp simd`): a wrongly parallel reduction shows up as a race here.

@case("parallel-elementwise-broadcast", "mul", "sigmoid")
def _(b, x):
    return [b.sigmoid(b.mul(x.real("a", (190, 203)), x.real("c", (190, 1))))]


@case("parallel-simd-1d", "tanh")
def _(b, x):
    return [b.tanh(x.real("a", (40009,)))]  # one loop: `omp parallel for simd`


@case("parallel-reductions", "reduce_sum", "reduce_max")
def _(b, x):
    a = x.real("a", (301, 157))
    return [b.reduce_sum(a, axes=[0]), b.reduce_max(a, axes=[1], keepdims=True)]


@case("parallel-matmul-softmax", "matmul", "softmax")
def _(b, x):
    h = b.matmul(x.real("a", (45, 37)), x.real("w", (37, 41)))
    return [b.softmax(h, axis=0), h]


@case("parallel-conv2d", "conv2d")
def _(b, x):
    return [b.conv2d(x.real("x", (2, 3, 20, 20)), x.real("w", (8, 3, 3, 3)),
                     x.real("b", (8,)), pads=[1, 1, 1, 1])]


# --- graph shape edge cases ---------------------------------------------------------------------

@case("size1-everywhere", "softmax", "batch_norm", "layer_norm", "attention", "matmul")
def _(b, x):
    a = x.real("a", (1, 3))
    params = [x.real(n, (3,)) for n in ("scale", "bias", "mean")] + [x.positive("var", (3,))]
    q, k = x.real("q", (1, 1, 4)), x.real("k", (2, 1, 4))
    return [b.softmax(a, axis=0), b.batch_norm(a, *params), b.layer_norm(a, axis=0),
            b.attention(q, k, x.real("v", (1, 5)), causal=True),
            b.matmul(x.real("m", (1, 1, 1)), x.real("n", (1, 1)))]

@case("output-is-input-and-constant", "exp")
def _(b, x):
    a = x.real("a", (2, 3))
    c = b.constant("c", [2], [4.0, -1.0])
    return [a, b.exp(a), c]


@case("two-outputs-sharing-a-producer", "exp", "reduce_sum", "sub")
def _(b, x):
    e = b.exp(x.real("a", (4, 6)))
    return [b.reduce_sum(e, axes=[1]), b.sub(e, x.real("c", (6,)))]


# --- the tests ---------------------------------------------------------------------------------

def test_every_op_is_covered():
    assert set(OPS) <= {op for c in CASES for op in c.ops}


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("target", targets.names())
@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_compiled_matches_reference(c: Case, target: str):
    _run(c.make, target)
