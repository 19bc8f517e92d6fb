"""Opening composite ops into primitive ones.

After `decompose_graph` every node is a primitive op of DESIGN.md, so each becomes one
statement in one perfectly nested loop nest, and fusion can regroup the pieces of a
composite (a softmax's row max with the subtract after it) with its neighbours.

Example (a softmax over the last axis of x: float32[4,8]):

    before:  y = softmax(x; axis=-1)
    after:   y.max = reduce_max(x; axes=[1], keepdims=True)  # from softmax 'y'
             y.shifted = sub(x, y.max)                        # from softmax 'y'
             y.exp = exp(y.shifted)                           # from softmax 'y'
             y.sum = reduce_sum(y.exp; axes=[1], keepdims=True)  # from softmax 'y'
             y = div(y.exp, y.sum)                            # from softmax 'y'

Naming: the composite's output tensor and node name are kept by its last primitive, so
graph outputs and consumers are untouched; every intermediate tensor and constant is
named "<node name>.<role>" (a numeric suffix if taken), which is stable across runs.
Every new node's `origin` is the composite's provenance, e.g. "softmax 'y'".

Constants (epsilon, 1/N, 0.5, ...) become scalar graph constants in the composite's dtype
and reach full shape by broadcasting. The causal mask of `attention` is not stored as an
[Lq, Lk] constant, which would grow quadratically with the sequence: it is computed as
`greater(col, row)` from two small int32 index constants ([1, Lk] and [Lq, 1]), and masked
scores are replaced by `select(mask, -inf, scores)`, exactly the "-inf where j > i" of
DESIGN.md. The constant holds float('-inf'): the rule against infinities is for the
client's JSON, and with a top-left aligned mask every row keeps key 0, so the row max
stays finite and exp(-inf - max) is exactly 0. `simplify_graph` folds the mask into a
constant when it is small.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterable

from ..errors import InternalError
from .ir import INT_BITS, FrozenDict, Graph, Node, Tensor, TensorType
from .ops import OPS, OpError, check_attrs, infer, norm_axes, norm_axis, reduced_shape


def decompose_graph(graph: Graph, *, normalise_after: bool = True) -> Graph:
    """Replace every composite node of `graph` by primitive nodes computing the same
    tensor; primitive nodes pass through unchanged, in place. `normalise_after`:
    attention divides its product with v by the rows' sums (where that product runs in
    the scores' nest, `Options.tail_contraction`), not its exponentials before it (a
    softmax): a symbolic compile's product over a symbolic Lk then has no epilogue at
    its last K block, which is no affine function of Lk."""
    e = _Emitter(graph, normalise_after)
    for node in graph.nodes:
        if OPS[node.op].composite:
            e.source = node
            _RULES[node.op](e, node)
            if e.nodes[-1].output != node.output:
                raise InternalError("decompose", f"{node.provenance}: the last primitive "
                                                 f"does not produce {node.output!r}")
        else:
            e.nodes.append(node)
    return replace(graph, constants=graph.constants + tuple(e.constants),
                   nodes=tuple(e.nodes), types=FrozenDict(e.types))


class _Emitter:
    """Appends typed primitive nodes and constants for the composite `source` being
    opened; a small builder that infers each new tensor's type as it goes."""

    def __init__(self, graph: Graph, normalise_after: bool = True):
        self.normalise_after = normalise_after
        self.types: dict[str, TensorType] = dict(graph.types)
        # Node names share the namespace so intermediate nodes, named after their
        # output, never clash with a user's node name either.
        self.used = set(graph.types) | {n.name for n in graph.nodes}
        self.nodes: list[Node] = []
        self.constants: list[Tensor] = []
        self.source: Node | None = None

    def type(self, tensor: str) -> TensorType:
        return self.types[tensor]

    @property
    def dtype(self) -> str:
        return self.types[self.source.inputs[0]].dtype

    def fresh(self, role: str) -> str:
        base = f"{self.source.name}.{role}"
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def const(self, role: str, values: float | Iterable, shape: tuple[int, ...] = (),
              dtype: str | None = None) -> str:
        dtype = dtype or self.dtype
        data = tuple(values) if isinstance(values, Iterable) else (values,)
        convert = int if dtype in INT_BITS else bool if dtype == "bool" else float
        t = TensorType(shape, dtype)
        name = self.fresh(role)
        self.constants.append(Tensor(name, t, tuple(convert(v) for v in data)))
        self.types[name] = t
        return name

    def op(self, op: str, *inputs: str, role: str | None = None, **attrs) -> str:
        """Emit an intermediate node; returns its output's name."""
        name = self.fresh(role or op)
        return self._emit(op, inputs, attrs, name, name)

    def last(self, op: str, *inputs: str, **attrs) -> str:
        """Emit the node that takes over the composite's output (and node name)."""
        return self._emit(op, inputs, attrs, self.source.output, self.source.name)

    def _emit(self, op: str, inputs: tuple[str, ...], attrs: dict, output: str,
              node_name: str) -> str:
        spec = OPS[op]
        try:
            checked = check_attrs(spec, attrs)
            t = infer(spec, checked, [self.types[i] for i in inputs])
        except OpError as err:
            raise InternalError("decompose", f"{self.source.provenance}: {op} "
                                             f"{err.field}: {err}") from None
        if output == self.source.output and t != self.types[output]:
            raise InternalError("decompose", f"{self.source.provenance}: decomposed to {t}, "
                                             f"but the composite is {self.types[output]}")
        self.types[output] = t
        self.nodes.append(Node(op, inputs, output, checked, node_name,
                               self.source.provenance))
        return output


# --- shared pieces -------------------------------------------------------------------

def _axes_attr(axes: tuple[int, ...]) -> tuple[int, ...] | None:
    # A scalar has no axes; an empty list is refused, and absent means "all (none)".
    return axes or None


def _mean(e: _Emitter, x: str, axes: tuple[int, ...], keepdims: bool,
          last: bool = False, role: str = "mean") -> str:
    """reduce_sum * (1/N): a multiply by a constant is cheaper than a divide."""
    n = math.prod(e.type(x).shape[a] for a in axes)
    total = e.op("reduce_sum", x, axes=_axes_attr(axes), keepdims=keepdims, role="sum")
    inv_n = e.const("inv_n", 1.0 / n)
    return e.last("mul", total, inv_n) if last else e.op("mul", total, inv_n, role=role)


def _chain(e: _Emitter, x: str, steps: list[tuple[str, str, str]]) -> None:
    """Apply binary steps (op, operand, role) to x in turn; the last one produces the
    composite's output."""
    for i, (op, operand, role) in enumerate(steps):
        x = e.last(op, x, operand) if i == len(steps) - 1 else e.op(op, x, operand, role=role)


def _centred(e: _Emitter, x: str, axes: tuple[int, ...]) -> tuple[str, str]:
    """x - mean(x) and its square, both full-shape: the centred variance avoids the
    cancellation of E[x^2] - E[x]^2."""
    d = e.op("sub", x, _mean(e, x, axes, keepdims=True), role="centred")
    return d, e.op("mul", d, d, role="sq")


def _exp_shifted(e: _Emitter, x: str, axes: tuple[int, ...]) -> tuple[str, str, str]:
    """(max, x - max, exp(x - max)) over `axes`, max kept: the shift keeps exp finite."""
    m = e.op("reduce_max", x, axes=_axes_attr(axes), keepdims=True, role="max")
    d = e.op("sub", x, m, role="shifted")
    return m, d, e.op("exp", d, role="exp")


def _softmax_into(e: _Emitter, x: str, axis: int, last: bool) -> str:
    _, _, ex = _exp_shifted(e, x, (axis,))
    s = e.op("reduce_sum", ex, axes=(axis,), keepdims=True, role="sum")
    # one division per row, then a multiply per element: a vector divide costs several
    # multiplies, and the result differs by at most an ulp
    inv = e.op("reciprocal", s, role="inv_sum")
    return e.last("mul", ex, inv) if last else e.op("mul", ex, inv, role="probs")


# --- the rules -------------------------------------------------------------------------

def _softmax(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    _softmax_into(e, x, norm_axis(n.attrs["axis"], e.type(x).ndim), last=True)


def _log_softmax(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    axis = norm_axis(n.attrs["axis"], e.type(x).ndim)
    _, d, ex = _exp_shifted(e, x, (axis,))
    s = e.op("reduce_sum", ex, axes=(axis,), keepdims=True, role="sum")
    e.last("sub", d, e.op("log", s, role="log"))


def _logsumexp(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    t = e.type(x)
    axes = norm_axes(n.attrs.get("axes"), t.ndim)
    keep = n.attrs["keepdims"]
    m, _, ex = _exp_shifted(e, x, axes)
    s = e.op("reduce_sum", ex, axes=_axes_attr(axes), keepdims=keep, role="sum")
    log = e.op("log", s, role="log")
    if not keep:
        m = e.op("reshape", m, shape=reduced_shape(t.shape, axes, False), role="max_flat")
    e.last("add", log, m)


def _reduce_mean(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    axes = norm_axes(n.attrs.get("axes"), e.type(x).ndim)
    _mean(e, x, axes, n.attrs["keepdims"], last=True)


def _variance(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    axes = norm_axes(n.attrs.get("axes"), e.type(x).ndim)
    _, sq = _centred(e, x, axes)
    _mean(e, sq, axes, n.attrs["keepdims"], last=True)


def _inv_std(e: _Emitter, var: str, epsilon: float) -> str:
    return e.op("rsqrt", e.op("add", var, e.const("eps", epsilon), role="var_eps"),
                role="inv_std")


def _trailing_axes(e: _Emitter, n: Node) -> tuple[int, ...]:
    ndim = e.type(n.inputs[0]).ndim
    return tuple(range(norm_axis(n.attrs["axis"], ndim), ndim))


def _layer_norm(e: _Emitter, n: Node) -> None:
    x, *affine = n.inputs  # gamma, beta: optional
    axes = _trailing_axes(e, n)
    d, sq = _centred(e, x, axes)
    r = _inv_std(e, _mean(e, sq, axes, keepdims=True, role="var"), n.attrs["epsilon"])
    steps = [("mul", r, "normed")]
    steps += zip(("mul", "add"), affine, ("scaled", "shifted"))
    _chain(e, d, steps)


def _rms_norm(e: _Emitter, n: Node) -> None:
    x, *gamma = n.inputs
    sq = e.op("mul", x, x, role="sq")
    ms = _mean(e, sq, _trailing_axes(e, n), keepdims=True, role="mean_sq")
    r = _inv_std(e, ms, n.attrs["epsilon"])
    _chain(e, x, [("mul", r, "normed")] + [("mul", g, "scaled") for g in gamma])


def _batch_norm(e: _Emitter, n: Node) -> None:
    x, scale, bias, mean, var = n.inputs
    ndim = e.type(x).ndim
    # scale * rsqrt(var + eps) on the [C] parameters, so the full tensor sees only
    # (x - mean) * a + bias; subtracting first avoids cancelling x*a against mean*a.
    a = e.op("mul", scale, _inv_std(e, var, n.attrs["epsilon"]), role="factor")
    if ndim > 2:
        # [C] must line up with axis 1, not the last axis: [C, 1, ..., 1].
        shape = (e.type(x).shape[1],) + (1,) * (ndim - 2)
        a, bias, mean = (e.op("reshape", p, shape=shape, role=f"{role}_c")
                         for p, role in ((a, "factor"), (bias, "bias"), (mean, "mean")))
    _chain(e, x, [("sub", mean, "centred"), ("mul", a, "normed"), ("add", bias, "out")])


def _gelu(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    if n.attrs["approximate"] == "tanh":
        # 0.5 (1 + tanh z) = sigmoid(2 z): one exp and one division, where tanh needs
        # those plus a second polynomial for small z; and no cancellation in 1 + tanh z
        x2 = e.op("mul", x, x, role="x2")
        x3 = e.op("mul", x2, x, role="x3")
        inner = e.op("add", x, e.op("mul", x3, e.const("k", 0.044715), role="cubic"),
                     role="inner")
        scaled = e.op("mul", inner, e.const("two_sqrt_2_over_pi", 2 * math.sqrt(2 / math.pi)),
                      role="scaled")
        e.last("mul", x, e.op("sigmoid", scaled, role="sigmoid"))
        return
    scaled = e.op("mul", x, e.const("inv_sqrt2", 1 / math.sqrt(2)), role="scaled")
    t = e.op("erf", scaled, role="erf")
    one_plus = e.op("add", t, e.const("one", 1.0), role="one_plus")
    e.last("mul", e.op("mul", x, e.const("half", 0.5), role="half_x"), one_plus)


def _silu(e: _Emitter, n: Node) -> None:
    x = n.inputs[0]
    e.last("mul", x, e.op("sigmoid", x, role="sigmoid"))


def _linear(e: _Emitter, n: Node) -> None:
    x, w, *b = n.inputs
    if b:
        e.last("add", e.op("matmul", x, w, role="xw"), b[0])
    else:
        e.last("matmul", x, w)


def _one_hot(e: _Emitter, n: Node) -> None:
    # out[.., j, ..] = on if indices[..] == j else off, j on the new axis: the index j is
    # a constant [depth] of the indices' dtype along that axis, compared with the indices
    # broadcast to it
    indices, on, off = n.inputs
    shape = e.type(n.output).shape
    axis = norm_axis(n.attrs["axis"], len(shape))
    along = tuple(d if k == axis else 1 for k, d in enumerate(shape))
    iota = e.const("iota", range(shape[axis]), along, e.type(indices).dtype)
    lifted = e.op("reshape", indices, shape=tuple(1 if k == axis else d
                                                  for k, d in enumerate(shape)))
    hot = e.op("equal", lifted, iota, role="hot")
    e.last("select", hot, e.op("reshape", on, shape=()), e.op("reshape", off, shape=()))


def _attention(e: _Emitter, n: Node) -> None:
    q, k, v = n.inputs
    tq, tk = e.type(q), e.type(k)
    scores = e.op("matmul", q, k, transpose_b=True, role="scores")
    scale = n.attrs.get("scale", 1 / math.sqrt(tq.shape[-1]))
    scores = e.op("mul", scores, e.const("scale", scale), role="scaled")
    if n.attrs["causal"]:
        lq, lk = tq.shape[-2], tk.shape[-2]
        rows = e.const("row", range(lq), (lq, 1), "int32")
        cols = e.const("col", range(lk), (1, lk), "int32")
        mask = e.op("greater", cols, rows, role="mask")  # key j after query i
        scores = e.op("select", mask, e.const("neg_inf", -math.inf), scores,
                      role="masked")
    axis = e.type(scores).ndim - 1
    if not e.normalise_after:
        e.last("matmul", _softmax_into(e, scores, axis, last=False), v)
        return
    # normalised after the product with v: Lq x D multiplies, not Lq x Lk, and no pass
    # over the probabilities (8x512x64 on Sapphire Rapids, 1 and 2 threads: 2% faster)
    _, _, ex = _exp_shifted(e, scores, (axis,))
    inv = e.op("reciprocal", e.op("reduce_sum", ex, axes=(axis,), keepdims=True, role="sum"),
               role="inv_sum")
    e.last("mul", e.op("matmul", ex, v, role="unscaled"), inv)


_RULES: dict[str, Callable[[_Emitter, Node], None]] = {
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "logsumexp": _logsumexp,
    "reduce_mean": _reduce_mean,
    "variance": _variance,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "batch_norm": _batch_norm,
    "gelu": _gelu,
    "silu": _silu,
    "linear": _linear,
    "attention": _attention,
    "one_hot": _one_hot,
}
