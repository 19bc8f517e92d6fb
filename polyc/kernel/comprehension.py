"""Tensor comprehensions: the one form every primitive node takes before it meets isl.

    out[idx(i)] (= | += | max= | min= | *=) expr(in_k[idx_k(i)], constants)   for i in box

over a box domain `0 <= i_d < extents[d]`, with index expressions that are quasi-affine in
the iterators (affine, plus floor division and modulo for reshape). A reduction is two
statements: an init over the output's box, then the update over the full box. Guards
(`Guarded`) express padding, concatenation and convolution borders, so no load is ever
out of bounds and every access relation is exact.

The printers give isl's syntax (`isl_*`) for the polyhedral model and C (`c_*`) for
codegen, so the two can never disagree about an index.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Union

from ..graph.ir import INT_BITS, Node, Tensor, TensorType, int_range
from ..graph.ops import conv2d_out_hw, norm_axes, slice_params


# --- index expressions -------------------------------------------------------------

@dataclass(frozen=True)
class Aff:
    """sum(coeff * iterator) + const; `terms` maps iterator position -> nonzero coeff."""

    terms: tuple[tuple[int, int], ...] = ()
    const: int = 0

    @staticmethod
    def it(pos: int, coeff: int = 1, const: int = 0) -> "Aff":
        return Aff(((pos, coeff),) if coeff else (), const)

    def __add__(self, other: "Aff | int") -> "Aff":
        if isinstance(other, int):
            return Aff(self.terms, self.const + other)
        d = dict(self.terms)
        for p, c in other.terms:
            d[p] = d.get(p, 0) + c
        return Aff(tuple(sorted((p, c) for p, c in d.items() if c)), self.const + other.const)

    def scale(self, k: int) -> "Aff":
        return Aff(tuple((p, c * k) for p, c in self.terms if c * k), self.const * k)

    def render(self, names: Callable[[int], str]) -> str:
        parts = []
        for p, c in self.terms:
            parts.append(names(p) if c == 1 else f"-{names(p)}" if c == -1 else f"{c}*{names(p)}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class FloorDiv:
    arg: "Index"
    d: int


@dataclass(frozen=True)
class Mod:
    arg: "Index"
    d: int


Index = Union[Aff, FloorDiv, Mod]


def isl_index(e: Index, names: Callable[[int], str]) -> str:
    if isinstance(e, Aff):
        return e.render(names)
    if isinstance(e, FloorDiv):
        return f"floor(({isl_index(e.arg, names)})/{e.d})"
    return f"(({isl_index(e.arg, names)}) mod {e.d})"


def c_index(e: Index, names: Callable[[int], str]) -> str:
    """C for a quasi-affine index; `/` and `%` are exact here because every index
    expression is non-negative on its domain."""
    if isinstance(e, Aff):
        return e.render(names)
    op = "/" if isinstance(e, FloorDiv) else "%"
    return f"(({c_index(e.arg, names)}) {op} {e.d})"


# --- value expressions -----------------------------------------------------------

@dataclass(frozen=True)
class Load:
    tensor: str
    index: tuple[Index, ...]
    dtype: str


@dataclass(frozen=True)
class Const:
    value: float | int
    dtype: str


@dataclass(frozen=True)
class Call:
    """An op applied to values: the primitive op names of ops.py, or 'cast'."""

    fn: str
    args: tuple["Expr", ...]
    dtype: str


@dataclass(frozen=True)
class Bound:
    """lo <= aff < hi."""

    aff: Aff
    lo: int
    hi: int


@dataclass(frozen=True)
class Guarded:
    """`then` where every bound holds, else `otherwise`: loads in `then` happen only
    inside the bounds, which is what the access relations record."""

    bounds: tuple[Bound, ...]
    then: "Expr"
    otherwise: "Expr"
    dtype: str


Expr = Union[Load, Const, Call, Guarded]


@dataclass(frozen=True)
class Outside:
    """Not every one of `bounds` holds: the condition of a guard's `otherwise`."""

    bounds: tuple[Bound, ...]


Guard = Union[Bound, Outside]


def loads(e: Expr, guards: tuple[Guard, ...] = ()):
    """Every load of an expression with the guards under which it happens: a load in a
    guard's `otherwise` happens only where the guard fails (a concat's last part is read
    only past the others), which the access relations must say exactly (what a tile
    reads is copied, and nothing outside an array may be)."""
    if isinstance(e, Load):
        yield e, guards
    elif isinstance(e, Call):
        for a in e.args:
            yield from loads(a, guards)
    elif isinstance(e, Guarded):
        yield from loads(e.then, guards + e.bounds)
        yield from loads(e.otherwise, guards + (Outside(e.bounds),))


def calls(e: Expr):
    """Every call of an expression, outermost first."""
    if isinstance(e, Call):
        yield e
        for a in e.args:
            yield from calls(a)
    elif isinstance(e, Guarded):
        yield from calls(e.then)
        yield from calls(e.otherwise)


# --- statements ------------------------------------------------------------------

REDUCE_KIND = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min",
               "reduce_prod": "prod"}


@dataclass(frozen=True)
class Statement:
    """One statement: `target[index] (reduce)= expr` for every point of the box."""

    name: str  # isl tuple name, unique within a kernel
    extents: tuple[int, ...]
    target: str
    index: tuple[Index, ...]
    expr: Expr
    dtype: str
    reduce: str | None  # None for '=', else 'sum' | 'max' | 'min' | 'prod'
    origin: str  # provenance: the node (and composite op) it came from

    def iter_name(self, pos: int) -> str:
        return f"i{pos}"

    def __str__(self) -> str:
        box = ", ".join(f"0<=i{d}<{n}" for d, n in enumerate(self.extents))
        op = "=" if self.reduce is None else {"sum": "+=", "max": "max=", "min": "min=",
                                                "prod": "*="}[self.reduce]
        idx = ", ".join(isl_index(e, self.iter_name) for e in self.index)
        return (f"{self.name}: {self.target}[{idx}] {op} {show_expr(e=self.expr)}"
                f"  for {box or 'a single point'}  # {self.origin}")


def show_expr(e: Expr) -> str:
    names = lambda p: f"i{p}"  # noqa: E731 (one-line printer of iterator names)
    if isinstance(e, Load):
        return f"{e.tensor}[{', '.join(isl_index(x, names) for x in e.index)}]"
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(show_expr(a) for a in e.args)})"
    cond = " and ".join(f"{b.lo}<={b.aff.render(names)}<{b.hi}" for b in e.bounds)
    return f"({cond} ? {show_expr(e.then)} : {show_expr(e.otherwise)})"


def first_sum(statements: Iterable[Statement]) -> Statement | None:
    """The statement a kernel's contraction is looked for in: its first sum. A sum after
    it reduces what the contraction produced (softmax's denominator of the scores), so
    it is a row operation on the result, never a second contraction."""
    return next((s for s in statements if s.reduce == "sum"), None)


# --- lowering of primitive nodes ---------------------------------------------------

def identity(rank: int, offset: int = 0) -> tuple[Aff, ...]:
    return tuple(Aff.it(offset + d) for d in range(rank))


def broadcast_index(shape: tuple[int, ...], out_rank: int, out_shape: tuple[int, ...]) -> tuple[Aff, ...]:
    """Index of an operand broadcast numpy-style against an output of `out_shape`."""
    lead = out_rank - len(shape)
    return tuple(Aff() if d == 1 and out_shape[lead + k] != 1 else Aff.it(lead + k)
                 for k, d in enumerate(shape))


class _Lowering:
    def __init__(self, node: Node, name: str, types: Mapping[str, TensorType],
                 constants: Mapping[str, Tensor]):
        self.node = node
        self.name = name
        self.types = types
        self.constants = constants
        self.out = types[node.output]

    def load(self, k: int, index: tuple[Index, ...]) -> Expr:
        tensor = self.node.inputs[k]
        t = self.types[tensor]
        const = self.constants.get(tensor)
        if const is not None and t.size == 1:
            return Const(const.data[0], t.dtype)  # scalars are folded into the code
        return Load(tensor, tuple(index), t.dtype)

    def stmt(self, extents, index, expr, reduce=None, suffix="") -> Statement:
        return Statement(self.name + suffix, tuple(extents), self.node.output, tuple(index),
                         settle_guards(expr, tuple(extents)), self.out.dtype, reduce,
                         self.node.provenance)

    def elementwise(self, expr: Expr) -> list[Statement]:
        return [self.stmt(self.out.shape, identity(self.out.ndim), expr)]

    def operand(self, k: int) -> Expr:
        shape = self.types[self.node.inputs[k]].shape
        return self.load(k, broadcast_index(shape, self.out.ndim, self.out.shape))

    def lower(self) -> list[Statement]:
        op = self.node.op
        if op in REDUCE_KIND:
            return self.reduction()
        method = getattr(self, "op_" + op, None)
        if method is not None:
            return method()
        args = tuple(self.operand(k) for k in range(len(self.node.inputs)))
        return self.elementwise(Call(op, args, self.out.dtype))

    def op_cast(self) -> list[Statement]:
        return self.elementwise(Call("cast", (self.operand(0),), self.out.dtype))

    def reduction(self) -> list[Statement]:
        x = self.types[self.node.inputs[0]]
        axes = norm_axes(self.node.attrs.get("axes"), x.ndim)
        keep = self.node.attrs["keepdims"]
        kind = REDUCE_KIND[self.node.op]
        # the update iterates the input in its own order, the reduced axes in place: a
        # sum over rows (axis 0) walks each row contiguously, its columns vectorise, and
        # every statement of a fused column softmax keeps the column as its last
        # iterator (fusion_tree's column blocks)
        # a reduced axis of one element is no loop: kept as a loop of one iteration it
        # would stand first in the update's order and share nothing with the consumers
        # (a sum over the axes [0, 2, 3] of an [1, C, H, W] image, read per channel)
        looped = [d for d in range(x.ndim) if not (d in axes and x.shape[d] == 1)]
        pos = {d: k for k, d in enumerate(looped)}
        out_index = tuple(Aff() if d in axes else Aff.it(pos[d])
                          for d in range(x.ndim) if keep or d not in axes)
        init = self.stmt(self.out.shape, identity(self.out.ndim),
                         Const(reduce_identity(kind, x.dtype), x.dtype), suffix="_init")
        read = tuple(Aff.it(pos[d]) if d in pos else Aff() for d in range(x.ndim))
        update = self.stmt(tuple(x.shape[d] for d in looped), out_index, self.load(0, read),
                           kind)
        return [init, update]

    def op_matmul(self) -> list[Statement]:
        a_shape, b_shape = (self.types[t].shape for t in self.node.inputs)
        ta, tb = self.node.attrs["transpose_a"], self.node.attrs["transpose_b"]
        nb = max(len(a_shape), 2) - 2
        nb = max(nb, max(len(b_shape), 2) - 2)
        # iterators: batch dims, then i, j, k
        i, j, k = Aff.it(nb), Aff.it(nb + 1), Aff.it(nb + 2)
        m = a_shape[-1] if ta else (a_shape[-2] if len(a_shape) > 1 else 1)
        n = b_shape[-2] if tb else (b_shape[-1] if len(b_shape) > 1 else 1)
        kk = a_shape[-2] if ta else a_shape[-1]
        batch = self.out.shape[:nb]

        def operand(shape, rows, cols, trans):
            if len(shape) == 1:
                return (cols if rows is i else rows,)  # a vector holds only the k axis
            own = shape[:-2]
            lead = nb - len(own)
            bidx = tuple(Aff() if d == 1 and batch[lead + q] != 1 else Aff.it(lead + q)
                         for q, d in enumerate(own))
            return bidx + ((cols, rows) if trans else (rows, cols))

        a_idx = operand(a_shape, i, k, ta)
        b_idx = operand(b_shape, k, j, tb)
        out_idx = identity(nb) + ((i,) if len(a_shape) > 1 else ()) + ((j,) if len(b_shape) > 1 else ())
        extents = batch + (m, n, kk)
        init = self.stmt(self.out.shape, identity(self.out.ndim), Const(0, self.out.dtype),
                         suffix="_init")
        prod = Call("mul", (self.load(0, a_idx), self.load(1, b_idx)), self.out.dtype)
        return [init, self.stmt(extents, out_idx, prod, "sum")]

    def op_conv2d(self) -> list[Statement]:
        xs, ws = self.types[self.node.inputs[0]].shape, self.types[self.node.inputs[1]].shape
        a = self.node.attrs
        (sh, sw), (pt, pl, _, _), (dh, dw) = a["strides"], a["pads"], a["dilations"]
        oh, ow = conv2d_out_hw(xs, ws, a)
        # iterators: n o h w | c kh kw
        h_in = Aff.it(2, sh) + Aff.it(5, dh) + (-pt)
        w_in = Aff.it(3, sw) + Aff.it(6, dw) + (-pl)
        x = self.load(0, (Aff.it(0), Aff.it(4), h_in, w_in))
        zero = Const(0, self.out.dtype)
        x = Guarded((Bound(h_in, 0, xs[2]), Bound(w_in, 0, xs[3])), x, zero, self.out.dtype)
        w = self.load(1, (Aff.it(1), Aff.it(4), Aff.it(5), Aff.it(6)))
        init_value = self.load(2, (Aff.it(1),)) if len(self.node.inputs) == 3 else zero
        init = self.stmt(self.out.shape, identity(4), init_value, suffix="_init")
        extents = (xs[0], ws[0], oh, ow, ws[1], ws[2], ws[3])
        update = self.stmt(extents, identity(4), Call("mul", (x, w), self.out.dtype), "sum")
        return [init, update]

    def op_transpose(self) -> list[Statement]:
        n = self.out.ndim
        perm = self.node.attrs.get("perm") or tuple(range(n))[::-1]
        index = [Aff()] * n
        for d, p in enumerate(perm):
            index[p] = Aff.it(d)
        return self.elementwise(self.load(0, tuple(index)))

    def op_reshape(self) -> list[Statement]:
        x, out = self.types[self.node.inputs[0]].shape, self.out.shape
        # dims of one are left out (read at 0), and the leading dims both shapes then
        # share are read in place; only the rest is flattened: so no stride or divisor
        # is a symbolic size where none need be ([L, 192] into [1, L, 4, 48])
        xs = [k for k, n in enumerate(x) if n != 1]
        outs = [d for d, n in enumerate(out) if n != 1]
        index: list[Index] = [Aff()] * len(x)
        p = 0
        while p < min(len(xs), len(outs)) and x[xs[p]] == out[outs[p]]:
            index[xs[p]] = Aff.it(outs[p])
            p += 1
        flat = Aff()
        for d, s in zip(outs[p:], _strides(tuple(out[d] for d in outs[p:]))):
            flat = flat + Aff.it(d, s)
        rest = xs[p:]
        for j, (k, s) in enumerate(zip(rest, _strides(tuple(x[k] for k in rest)))):
            e: Index = flat if s == 1 else FloorDiv(flat, s)
            index[k] = _exact(e if j == 0 else Mod(e, x[k]), out)
        return self.elementwise(self.load(0, tuple(index)))

    def op_broadcast_to(self) -> list[Statement]:
        return self.elementwise(self.operand(0))

    def op_slice(self) -> list[Statement]:
        x = self.types[self.node.inputs[0]].shape
        params = slice_params(x, self.node.attrs)
        return self.elementwise(self.load(0, tuple(Aff.it(d, step, start)
                                                   for d, (start, step, _) in enumerate(params))))

    def op_concat(self) -> list[Statement]:
        axis = self.node.attrs["axis"] % self.out.ndim
        pieces = []
        offset = 0
        for k, tensor in enumerate(self.node.inputs):
            size = self.types[tensor].shape[axis]
            index = tuple(Aff.it(d, 1, -offset if d == axis else 0) for d in range(self.out.ndim))
            pieces.append((Bound(Aff.it(axis), offset, offset + size), self.load(k, index)))
            offset += size
        expr = pieces[-1][1]
        for bound, value in reversed(pieces[:-1]):
            expr = Guarded((bound,), value, expr, self.out.dtype)
        return self.elementwise(expr)

    def op_pad(self) -> list[Statement]:
        x = self.types[self.node.inputs[0]].shape
        pads = self.node.attrs["pads"]
        index = tuple(Aff.it(d, 1, -before) for d, (before, _) in enumerate(pads))
        bounds = tuple(Bound(Aff.it(d), before, before + n)
                       for d, ((before, after), n) in enumerate(zip(pads, x)) if before or after)
        value = Const(_typed(self.node.attrs["value"], self.out.dtype), self.out.dtype)
        expr = self.load(0, index)
        return self.elementwise(Guarded(bounds, expr, value, self.out.dtype) if bounds else expr)


def _static(b: Bound, extents: tuple) -> bool:
    """Are the sizes of every iterator in `b` known (not symbols, whose bounds stay)?"""
    return all(type(extents[q]) is int for q, _ in b.aff.terms)


def _always_within(b: Bound, extents: tuple) -> bool:
    if not _static(b, extents):
        return False
    lo, hi = _range(b.aff, extents)
    return lo >= b.lo and hi < b.hi


# values of an index `_never_within` lists, at most, to find none inside a bound: a
# strided window's rows (2*i + k - 1 over i < 2, k < 1: -1 and 1, none in [0, 1))
MAX_LISTED = 1 << 16


def _never_within(b: Bound, extents: tuple) -> bool:
    if not _static(b, extents):
        return False
    lo, hi = _range(b.aff, extents)
    if hi < b.lo or lo >= b.hi:
        return True
    if all(abs(c) == 1 for _, c in b.aff.terms):
        return False  # every value between lo and hi is taken
    values = {b.aff.const}
    for q, c in b.aff.terms:
        if len(values) * extents[q] > MAX_LISTED:
            return False  # too many to list: the guard stays
        values = {v + c * k for v in values for k in range(extents[q])}
    return not any(b.lo <= v < b.hi for v in values)


def settle_guards(e: Expr, extents: tuple) -> Expr:
    """`e` with what its guards decide over the whole iteration box (`extents`) decided:
    a guard that fails everywhere is its `otherwise` (its loads happen nowhere: a conv2d
    whose every window falls in the pad, a 1-wide image padded on one side and strided
    past it, whose input a target that copies what a tile reads has no copy of), a bound
    that holds everywhere is dropped (a conv2d's rows where its pads are never reached),
    and a guard left with none is its `then`."""
    if isinstance(e, Call):
        return Call(e.fn, tuple(settle_guards(a, extents) for a in e.args), e.dtype)
    if not isinstance(e, Guarded):
        return e
    if any(_never_within(b, extents) for b in e.bounds):
        return settle_guards(e.otherwise, extents)
    bounds = tuple(b for b in e.bounds if not _always_within(b, extents))
    if not bounds:
        return settle_guards(e.then, extents)
    return Guarded(bounds, settle_guards(e.then, extents), settle_guards(e.otherwise, extents),
                   e.dtype)


def _exact(e: Index, extents: tuple) -> Index:
    """`e` over iterators 0 <= i_p < extents[p] with what divides exactly taken out of its
    floor divisions and modulos: a reshape's index is then affine in the dims the two
    shapes split alike. [2, 64, 4, 32] read as [128, 128] is x[i / 64, i % 64, j / 32,
    j % 32], whose inner loop is a contiguous row, not x[(128i + j) / 8192, (128i + j) /
    128 % 64, (128i + j) / 32 % 4, (128i + j) % 32], which gcc computed element by
    element (a transformer block's merge of its heads: 1 GB/s)."""
    if isinstance(e, Aff) or not all(isinstance(n, int) for n in (*extents, *_divisors(e))):
        return e  # a symbolic size: left to isl
    if isinstance(e, FloorDiv) and isinstance(e.arg, Aff):
        return _floor_div(e.arg, e.d, extents)
    if isinstance(e, Mod) and isinstance(e.arg, Aff):
        return _mod(e.arg, e.d, extents)
    if isinstance(e, Mod) and isinstance(e.arg, FloorDiv) and isinstance(e.arg.arg, Aff):
        # floor((d B + C) / d) = B + floor(C / d), and B's multiples of m vanish mod m
        arg, d = e.arg.arg, e.arg.d
        if all(c % d != 0 or (c // d) % e.d == 0 for _, c in arg.terms):
            inner = _floor_div(Aff(tuple((q, c) for q, c in arg.terms if c % d), arg.const),
                               d, extents)
            if isinstance(inner, Aff):
                return _mod(inner, e.d, extents)
            low, high = _range(inner.arg, extents)
            return inner if 0 <= low // inner.d and high // inner.d < e.d else Mod(inner, e.d)
    return type(e)(_exact(e.arg, extents), e.d)


def _divisors(e: Index) -> list:
    return [] if isinstance(e, Aff) else [e.d, *_divisors(e.arg)]


def _range(a: Aff, extents: tuple) -> tuple[int, int]:
    """The least and greatest value of `a` over the iterators' extents."""
    low = a.const + sum(c * (extents[q] - 1) for q, c in a.terms if c < 0)
    high = a.const + sum(c * (extents[q] - 1) for q, c in a.terms if c > 0)
    return low, high


def _floor_div(a: Aff, d: int, extents: tuple) -> Index:
    """floor(a / d): where a = f big + small with f dividing d and 0 <= small < f, it is
    floor(big / (d / f)), affine when f = d."""
    for f in sorted({c for _, c in a.terms if c > 0 and d % c == 0} | {d}, reverse=True):
        small = Aff(tuple((q, c) for q, c in a.terms if c % f), a.const)
        low, high = _range(small, extents)
        if 0 <= low <= high < f:
            big = Aff(tuple((q, c // f) for q, c in a.terms if c % f == 0))
            return big if f == d else FloorDiv(big, d // f)
    return FloorDiv(a, d)


def _mod(a: Aff, m: int, extents: tuple) -> Index:
    """a mod m without a's multiples of m; the rest alone where it lies in [0, m)."""
    rest = Aff(tuple((q, c) for q, c in a.terms if c % m), a.const % m)
    low, high = _range(rest, extents)
    return rest if 0 <= low <= high < m else Mod(rest, m)


def _strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _typed(v: float, dtype: str) -> float | int:
    return int(v) if dtype in INT_BITS or dtype == "bool" else float(v)


def reduce_identity(kind: str, dtype: str) -> float | int:
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if dtype in INT_BITS:
        return int_range(dtype)[kind == "min"]
    return -math.inf if kind == "max" else math.inf


def lower_node(node: Node, name: str, types: Mapping[str, TensorType],
               constants: Mapping[str, Tensor]) -> list[Statement]:
    """The statements of one primitive node: one, or init + update for reductions and
    contractions. `name` prefixes the statements' isl names."""
    return _Lowering(node, name, types, constants).lower()

