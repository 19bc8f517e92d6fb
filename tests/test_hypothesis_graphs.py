"""Random small graphs of chained ops, compiled and compared with the reference.

Hypothesis draws a recipe (input shapes and a chain of steps, each an op applied to the
tensors made so far); the recipe is replayed on a `GraphBuilder` while tracking shapes,
so every drawn graph is valid by construction. Dims stay in 1..6 and ranks in 1..3: the
cost of an example is the gcc build, not the data. Every op keeps values bounded (no
exp of an unbounded value, no division), so no inf or NaN ever appears and float32
against the float64-internal reference stays within a tolerance scaled to the output.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from polyc import GraphBuilder, targets
from polyc.compiler import compile
from polyc.graph.reference import run_reference

UNARY = ("neg", "abs", "tanh", "sigmoid", "relu", "erf")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
REDUCE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean")
STEPS = ("unary", "exp_tanh", "binary_new", "binary_old", "reduce", "transpose", "softmax",
         "matmul")

MIN_RANK = 0
shapes = st.lists(st.integers(1, 6), min_size=MIN_RANK, max_size=3).map(tuple)


def _broadcast_partner(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that `_fits` `shape`: a suffix of it, with some dims set to 1."""
    keep = draw(st.integers(min(MIN_RANK, len(shape)), len(shape)))
    suffix = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


@st.composite
def recipes(draw, shapes=shapes):
    """(input shapes, steps); a step names its op, its operand(s) by index into the
    tensors made so far, and every attribute. `shapes` draws the first input's."""
    inputs = [draw(shapes)]
    tensors = list(inputs)  # shapes of every tensor so far, inputs first
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(STEPS))
        src = draw(st.integers(0, len(tensors) - 1))
        shape = tensors[src]
        if kind == "unary":
            steps.append((kind, src, draw(st.sampled_from(UNARY))))
        elif kind == "exp_tanh":
            steps.append((kind, src, None))
        elif kind == "binary_new":
            other = _broadcast_partner(draw, shape)
            inputs.append(other)
            tensors.append(other)
            # the new input is the other operand, on either side
            steps.append((kind, src, (draw(st.sampled_from(BINARY)), draw(st.booleans()))))
        elif kind == "binary_old":
            partners = [k for k, s in enumerate(tensors) if _fits(s, shape)]
            steps.append((kind, src, (draw(st.sampled_from(BINARY)),
                                      draw(st.sampled_from(partners)))))
        elif kind == "reduce":
            if not shape:
                continue
            axis = st.integers(-len(shape), len(shape) - 1)
            axes = draw(st.none() | st.lists(axis, min_size=1, max_size=len(shape),
                                             unique_by=lambda a: a % len(shape)))
            every_axis = axes is None or len(axes) == len(shape)
            keep = draw(st.booleans()) or (every_axis and MIN_RANK > 0)
            steps.append((kind, src, (draw(st.sampled_from(REDUCE)), axes, keep)))
            norm = range(len(shape)) if axes is None else {a % len(shape) for a in axes}
            shape = tuple(1 if d in norm else n for d, n in enumerate(shape)
                          if keep or d not in norm)
        elif kind == "transpose":
            perm = draw(st.none() | st.permutations(range(len(shape))))
            steps.append((kind, src, perm))
            shape = shape[::-1] if perm is None else tuple(shape[p] for p in perm)
        elif kind == "softmax":
            if not shape:
                continue
            steps.append((kind, src, draw(st.integers(-len(shape), len(shape) - 1))))
        elif kind == "matmul":
            if not shape:
                continue
            n = draw(st.integers(1, 6))
            trans_b = draw(st.booleans())
            w = (n, shape[-1]) if trans_b else (shape[-1], n)
            inputs.append(w)
            tensors.append(w)
            steps.append((kind, src, trans_b))
            shape = shape[:-1] + (n,)
        tensors.append(shape)
    return inputs, steps


def _fits(other: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether `other` broadcasts against `shape` without growing it."""
    try:
        return np.broadcast_shapes(other, shape) == shape
    except ValueError:
        return False


def _build(inputs, steps):
    b = GraphBuilder("random")
    names = [b.input(f"x{k}", s) for k, s in enumerate(inputs)]
    tensors = names[:1]
    pending = iter(names[1:])  # the inputs later steps bring in, in order
    for kind, src, arg in steps:
        x = tensors[src]
        if kind == "unary":
            y = b.op(arg, x)
        elif kind == "exp_tanh":
            y = b.exp(b.tanh(x))
        elif kind == "binary_new":
            op, swap = arg
            other = next(pending)
            tensors.append(other)
            y = b.op(op, other, x) if swap else b.op(op, x, other)
        elif kind == "binary_old":
            op, other = arg
            y = b.op(op, x, tensors[other])
        elif kind == "reduce":
            op, axes, keep = arg
            y = b.op(op, x, **({} if axes is None else {"axes": axes}), keepdims=keep)
        elif kind == "transpose":
            y = b.transpose(x, **({} if arg is None else {"perm": list(arg)}))
        elif kind == "softmax":
            y = b.softmax(x, axis=arg)
        else:
            w = next(pending)
            tensors.append(w)
            y = b.matmul(x, w, transpose_b=arg)
        tensors.append(y)
    # the last tensor (an input when every step was skipped), and the first made one
    # when there are two: two outputs
    made = [t for t in tensors if not t.startswith("x")]
    outputs = [tensors[-1]] + ([made[0]] if len(made) > 1 else [])
    return b.build(outputs=outputs)


@pytest.mark.slow
@pytest.mark.parametrize("target", targets.names())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes(), st.integers(0, 2**32 - 1))
def test_random_graph_matches_reference(target, recipe, seed):
    inputs, steps = recipe
    graph = _build(inputs, steps)
    note(str(graph))  # the graph, not the recipe, is the readable repro
    rng = np.random.default_rng(seed)
    values = {t.name: rng.uniform(-2, 2, t.type.shape).astype(np.float32) for t in graph.inputs}
    got = compile(graph, target)(**values)
    want = run_reference(graph, values)
    for name in graph.outputs:
        assert got[name].shape == want[name].shape
        # float32 rounding scales with the magnitudes summed, not with a result that
        # cancels to near zero: an absolute floor relative to the output's scale
        scale = 1.0 + float(np.max(np.abs(want[name]), initial=0.0))
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=name)
