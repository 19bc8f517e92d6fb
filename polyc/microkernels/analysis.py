"""Recognising what a microkernel can compute, from a kernel's statements alone.

`gemm_view` finds a contraction with its init and epilogue,

    C[b.., I.., J..] = init(b, I, J);  C[b, I, J] += f(b, I, K) * g(b, K, J);  E1; E2; ...

where the output's last dims J (its columns) are read by one operand only, the dims I
before them by the other only, and every epilogue statement E is elementwise on C's box,
reading what the kernel produces only at its own point. That covers matmul (batched,
broadcast, transposed), linear, and conv2d as an implicit GEMM (I = output channels,
J = output pixels, K = input channels x kernel window: the gather and its zero padding
are f and g, evaluated when packing). Codegen and the matcher both call it, so the
roles are never stored twice.

`row_view` finds a reduction along a contiguous innermost axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import Kernel
from ..schedule_tree.comprehension import (Aff, Call, Expr, FloorDiv, Guarded, Load, Mod,
                                           Statement)


def iterators(e) -> set[int]:
    """Iterator positions an expression or index depends on (guards included)."""
    if isinstance(e, Aff):
        return {p for p, _ in e.terms}
    if isinstance(e, (FloorDiv, Mod)):
        return iterators(e.arg)
    if isinstance(e, Load):
        return set().union(*(iterators(x) for x in e.index)) if e.index else set()
    if isinstance(e, Call):
        return set().union(*(iterators(a) for a in e.args)) if e.args else set()
    if isinstance(e, Guarded):
        out = iterators(e.then) | iterators(e.otherwise)
        for b in e.bounds:
            out |= iterators(b.aff)
        return out
    return set()


def loads_of(e: Expr):
    if isinstance(e, Load):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from loads_of(a)
    elif isinstance(e, Guarded):
        yield from loads_of(e.then)
        yield from loads_of(e.otherwise)


def _pure(index) -> tuple[int, ...] | None:
    """Iterator positions of an index whose every dim is one distinct iterator."""
    out = []
    for e in index:
        if not (isinstance(e, Aff) and e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1):
            return None
        out.append(e.terms[0][0])
    return tuple(out) if len(set(out)) == len(out) else None


def _identity(s: Statement) -> bool:
    return _pure(s.index) == tuple(range(len(s.extents)))


@dataclass(frozen=True)
class GemmView:
    stmt: Statement  # the contraction
    init: Statement
    epilogue: tuple[Statement, ...]  # in program order
    out_iter: tuple[int, ...]  # contraction iterator of each output dim
    batch: tuple[int, ...]  # output dims that are batch dims
    rows: tuple[int, ...]  # output dims flattened into M
    cols: tuple[int, ...]  # output dims flattened into N (the last ones)
    red: tuple[int, ...]  # contraction iterators flattened into K, in order
    a_arg: int  # which operand of the product is the A (rows) side
    shape: tuple[int, ...]  # the output's shape

    @property
    def M(self) -> int:
        return math.prod(self.shape[d] for d in self.rows)

    @property
    def N(self) -> int:
        return math.prod(self.shape[d] for d in self.cols)

    @property
    def K(self) -> int:
        return math.prod(self.stmt.extents[p] for p in self.red)

    @property
    def batches(self) -> int:
        return math.prod(self.shape[d] for d in self.batch)

    @property
    def a_expr(self) -> Expr:
        return self.stmt.expr.args[self.a_arg]

    @property
    def b_expr(self) -> Expr:
        return self.stmt.expr.args[1 - self.a_arg]

    def strides(self, dims: tuple[int, ...]) -> dict[int, int]:
        """Output dim -> its weight in the flattened index of `dims` (row-major)."""
        out, w = {}, 1
        for d in reversed(dims):
            out[d] = w
            w *= self.shape[d]
        return out

    def red_strides(self) -> dict[int, int]:
        out, w = {}, 1
        for p in reversed(self.red):
            out[p] = w
            w *= self.stmt.extents[p]
        return out

    @property
    def flops(self) -> int:
        return 2 * self.batches * self.M * self.N * self.K


def gemm_view(kernel: Kernel) -> GemmView | None:
    """The kernel as one contraction with init and epilogue, or None (see the module
    docstring for the form)."""
    sums = [s for s in kernel.statements if s.reduce == "sum"]
    if len(sums) != 1:
        return None
    s = sums[0]
    if not (s.dtype == "float32" and isinstance(s.expr, Call) and s.expr.fn == "mul"
            and len(s.expr.args) == 2):
        return None
    out_iter = _pure(s.index)
    if out_iter is None or not out_iter:
        return None
    shape = kernel.array(s.target).type.shape
    if tuple(s.extents[p] for p in out_iter) != shape:
        return None
    red = tuple(p for p in range(len(s.extents)) if p not in out_iter)
    if not red:
        return None
    f_it, g_it = (iterators(a) for a in s.expr.args)
    last = out_iter[-1]
    if last in g_it and last not in f_it:
        a_arg = 0
    elif last in f_it and last not in g_it:
        a_arg, f_it, g_it = 1, g_it, f_it
    else:
        return None
    t = len(out_iter)
    d = t
    while d > 0 and out_iter[d - 1] in g_it and out_iter[d - 1] not in f_it:
        d -= 1
    cols = tuple(range(d, t))
    r = d
    while r > 0 and out_iter[r - 1] in f_it and out_iter[r - 1] not in g_it:
        r -= 1
    rows = tuple(range(r, d))
    if not rows:
        return None
    # the rest of the kernel: exactly one init before, elementwise epilogue after
    pos = kernel.statements.index(s)
    before, after = kernel.statements[:pos], kernel.statements[pos + 1:]
    if len(before) != 1:
        return None
    init = before[0]
    if not (init.target == s.target and init.reduce is None and init.extents == shape
            and _identity(init)):
        return None
    produced = {s.target}
    if any(x.tensor in produced for x in loads_of(init.expr)) or any(
            x.tensor in produced for x in loads_of(s.expr)):
        return None
    for e in after:
        if e.reduce is not None or e.extents != shape or not _identity(e) or e.target in produced:
            return None
        for x in loads_of(e.expr):
            if x.tensor in produced and _pure(x.index) != tuple(range(t)):
                return None
        produced.add(e.target)
    return GemmView(s, init, tuple(after), out_iter, tuple(range(r)), rows, cols, red, a_arg,
                    shape)


@dataclass(frozen=True)
class RowView:
    stmt: Statement  # a reduction whose innermost iterator walks a contiguous row
    load: Load
    axis: int  # the innermost iterator position
    length: int


def row_views(kernel: Kernel) -> list[RowView]:
    """Reductions (sum, max) of float32 whose expression is one load, contiguous along
    the statement's innermost iterator, which only that reduction walks."""
    out = []
    for s in kernel.statements:
        if s.reduce not in ("sum", "max") or s.dtype != "float32" or not isinstance(s.expr, Load):
            continue
        axis = len(s.extents) - 1
        if axis < 0 or axis in iterators_of_index(s.index):
            continue
        load = s.expr
        if not load.index or any(axis in iterators(e) for e in load.index[:-1]):
            continue
        last = load.index[-1]
        if not (isinstance(last, Aff) and dict(last.terms).get(axis) == 1):
            continue
        out.append(RowView(s, load, axis, s.extents[axis]))
    return out


def iterators_of_index(index) -> set[int]:
    return set().union(*(iterators(e) for e in index)) if index else set()
