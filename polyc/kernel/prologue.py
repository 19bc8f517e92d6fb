"""Folding a contraction's cheap producers into its operand or its epilogue.

    before:  S0: t[i0, i1] = a[i1, i0]                       (transpose, t local)
             S1_init: y[i0, i1] = 0
             S1: y[i0, i1] += t[i0, i2] * w[i2, i1]
    after:   S1_init: y[i0, i1] = 0
             S1: y[i0, i1] += a[i2, i0] * w[i2, i1]

A local tensor written by one elementwise statement (a transpose, broadcast, scaling,
relu, cast, ...) and read only inside one operand of one contraction is not stored: its
expression is substituted where the contraction reads it. With a microkernel the operand
is evaluated while packing, about once per element, so the prologue costs no pass over
memory; without one it is evaluated in the loop nest, so only cheap expressions fold.

The same holds after the contraction (`fold_epilogues`). Attention's causal mask, a
compare of two iotas over [Lq, Lk] broadcast over the heads, is no epilogue statement of
the scores' matmul (its domain is not the output's); substituted into the select that
reads it, the kernel is again one contraction with an elementwise epilogue (`gemm_view`),
and the mask is evaluated in the write-back from the output's indices:

    before:  S0: mask[i0, i1] = greater(col[0, i1], row[i0, 0])
             S1_init, S1: s[i0, i1, i2] += q[i0, i1, i3] * k[i0, i2, i3]
             S2: y[i0, i1, i2] = select(mask[i1, i2], -inf, s[i0, i1, i2])
    after:   S1_init, S1 as before
             S2: y[i0, i1, i2] = select(greater(col[0, i2], row[i1, 0]), -inf,
                                        s[i0, i1, i2])
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from ..graph.storage import STORAGE
from .comprehension import (Aff, Bound, Call, Const, Expr, FloorDiv, Guarded, Index, Load,
                            Mod, Outside, Statement, first_sum, identity, loads,
                            settle_guards)

# which statements a producer (its position) folds into; none when it does not fold
Readers = Callable[[list[Statement], int], list[int]]

# a few vector instructions each: recomputing them where the operand is read is cheap
CHEAP = frozenset({"add", "sub", "mul", "div", "neg", "abs", "relu", "maximum", "minimum",
                   "cast", "select", "equal", "greater", "less", "floor", "ceil"})
MAX_CALLS = 4


def fold_prologues(statements: Iterable[Statement], local: set[str]
                   ) -> tuple[tuple[Statement, ...], tuple[str, ...]]:
    """The statements with every foldable producer substituted into its contraction
    (chains fold one after the other: relu, then transpose), and the tensors folded."""
    return _fold(statements, local, _operand_reader)


def fold_epilogues(statements: Iterable[Statement], local: set[str]
                   ) -> tuple[tuple[Statement, ...], tuple[str, ...]]:
    """The statements with every cheap producer that does not depend on the kernel's
    contraction and is read only by its epilogue substituted into its readers, and the
    tensors folded. A producer that does depend on it is an epilogue statement already."""
    return _fold(statements, local, _epilogue_readers)


def _fold(statements: Iterable[Statement], local: set[str], readers_of: Readers
          ) -> tuple[tuple[Statement, ...], tuple[str, ...]]:
    """Fold, one at a time, each cheap producer for which `readers_of(statements, p)`
    names the statements to substitute it into."""
    statements, folded = list(statements), []
    while (found := _foldable(statements, local, readers_of)) is not None:
        p, readers = found
        for r in readers:
            statements[r] = _substitute_into(statements[r], statements[p])
        folded.append(statements[p].target)
        del statements[p]
    return tuple(statements), tuple(folded)


def _foldable(statements: list[Statement], local: set[str], readers_of: Readers
              ) -> tuple[int, list[int]] | None:
    for p, prod in enumerate(statements):
        t = prod.target
        if (t not in local or prod.reduce is not None or _calls(prod.expr) > MAX_CALLS
                or prod.index != identity(len(prod.extents))
                or sum(x.target == t for x in statements) != 1):
            continue
        readers = readers_of(statements, p)
        if readers:
            return p, readers
    return None


def _readers(statements: list[Statement], t: str) -> list[int]:
    return [k for k, x in enumerate(statements)
            if any(ld.tensor == t for ld, _ in loads(x.expr))]


def _operand_reader(statements: list[Statement], p: int) -> list[int]:
    """The one contraction whose operand alone reads statement `p`'s tensor, at affine
    indices (else none)."""
    t = statements[p].target
    readers = _readers(statements, t)
    if len(readers) != 1 or readers[0] < p:
        return []
    s = statements[readers[0]]
    if not _sum_of_product(s):
        return []
    if _depends_on_first_sum(statements, p):
        # attention's probabilities, read by the product with v after the softmax of the
        # scores: kept, so the row tail writes their rows and the second contraction
        # reads them in place (`GemmView.then`)
        return []
    reads = [[ld for ld, _ in loads(arg) if ld.tensor == t] for arg in s.expr.args]
    if min(map(len, reads)) == 0 and all(isinstance(e, Aff) for ld in reads[0] + reads[1]
                                         for e in ld.index):
        return readers
    return []


def _depends_on_first_sum(statements: list[Statement], p: int) -> bool:
    """Does statement `p` read, directly or not, what the kernel's first sum computes?"""
    c = first_sum(statements)
    if c is None:
        return False
    after = {c.target}
    for x in statements[statements.index(c) + 1:p + 1]:
        if any(ld.tensor in after for ld, _ in loads(x.expr)):
            after.add(x.target)
    return statements[p].target in after


def _sum_of_product(s: Statement) -> bool:
    """Is `s` a sum of the product of two factors (a contraction's update)?"""
    return (s.reduce == "sum" and isinstance(s.expr, Call) and s.expr.fn == "mul"
            and len(s.expr.args) == 2)


def _operand_of_product(s: Statement, tensor: str) -> bool:
    """Does the sum of a product `s` read `tensor` in one factor only (a contraction's
    operand, not a row sum of squares)?"""
    if not _sum_of_product(s):
        return False
    reads = [any(ld.tensor == tensor for ld, _ in loads(a)) for a in s.expr.args]
    return reads.count(True) == 1


def _epilogue_readers(statements: list[Statement], p: int) -> list[int]:
    """The statements reading statement `p`'s tensor when all are elementwise statements
    over the output of the kernel's first contraction, after it, reading it at affine
    indices, and `p` reads nothing the contraction computes (else none)."""
    c = first_sum(statements)
    if c is None:
        return []
    at = statements.index(c)
    if not _sum_of_product(c):
        return []  # a sum of other terms (softmax's) has no write-back to fold into
    init = next((x for x in statements if x.target == c.target and x.reduce is None), None)
    if init is None:
        return []
    after = {c.target}  # the tensors that depend on the contraction
    for x in statements[at + 1:]:
        if any(ld.tensor in after for ld, _ in loads(x.expr)):
            after.add(x.target)
    prod = statements[p]
    if any(ld.tensor in after for ld, _ in loads(prod.expr)):
        return []
    readers = _readers(statements, prod.target)
    for r in readers:
        x = statements[r]
        if (r < at or x.reduce is not None or x.extents != init.extents
                or x.index != identity(len(x.extents))
                or not all(isinstance(e, Aff) for ld, _ in loads(x.expr)
                           if ld.tensor == prod.target for e in ld.index)):
            return []
    return readers


def _calls(e: Expr) -> int:
    if isinstance(e, Call):
        return (1 if e.fn in CHEAP else MAX_CALLS + 1) + sum(_calls(a) for a in e.args)
    if isinstance(e, Guarded):
        return _calls(e.then) + _calls(e.otherwise)
    return 0


def _substitute_into(s: Statement, prod: Statement) -> Statement:
    def visit(e: Expr) -> Expr:
        if isinstance(e, Load) and e.tensor == prod.target:
            return _rename(prod.expr, dict(enumerate(e.index)))
        if isinstance(e, Call):
            return Call(e.fn, tuple(visit(a) for a in e.args), e.dtype)
        if isinstance(e, Guarded):
            return Guarded(e.bounds, visit(e.then), visit(e.otherwise), e.dtype)
        return e
    return Statement(s.name, s.extents, s.target, s.index,
                     settle_guards(visit(s.expr), s.extents), s.dtype, s.reduce, s.origin)


def _rename(e: Expr, to: dict[int, Index]) -> Expr:
    """`e` over the producer's iterators, each replaced by the consumer's index `to[p]`."""
    if isinstance(e, Load):
        return Load(e.tensor, tuple(_index(x, to) for x in e.index), e.dtype)
    if isinstance(e, Call):
        return Call(e.fn, tuple(_rename(a, to) for a in e.args), e.dtype)
    if isinstance(e, Guarded):
        return Guarded(tuple(Bound(_aff(b.aff, to), b.lo, b.hi) for b in e.bounds),
                       _rename(e.then, to), _rename(e.otherwise, to), e.dtype)
    assert isinstance(e, Const)
    return e


def _aff(a: Aff, to: dict[int, Aff]) -> Aff:
    out = Aff((), a.const)
    for p, c in a.terms:
        out = out + to[p].scale(c)
    return out


def _bare(e: Index) -> int | None:
    """The iterator `e` is, alone (not scaled, not shifted), or None."""
    if isinstance(e, Aff) and e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1:
        return e.terms[0][0]
    return None


def _index(e: Index, to: dict[int, Index]) -> Index:
    if (p := _bare(e)) is not None:
        return to[p]  # the reader's index as it is (a floor or mod of a reshape too)
    if isinstance(e, Aff):
        return _aff(e, to)
    if isinstance(e, FloorDiv):
        return FloorDiv(_index(e.arg, to), e.d)
    return Mod(_index(e.arg, to), e.d)


def widening_loads(statements: Iterable[Statement], local: set[str]) -> tuple[str, ...]:
    """The local tensors that are a float16 tensor read into float32 (`graph.storage`):
    one cast of one load, recomputed where read (a conversion per element is what
    reading the float16 tensor costs anyway)."""
    statements = list(statements)
    return tuple(s.target for s in statements
                 if s.target in local and isinstance(s.expr, Call) and s.expr.fn == "cast"
                 and isinstance(s.expr.args[0], Load) and s.expr.args[0].dtype in STORAGE
                 and recomputable(statements, s.target))


# recomputing costs a few instructions per element; storing costs a pass over memory
RECOMPUTE = CHEAP | {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "reciprocal"}


def recomputable(statements: Iterable[Statement], tensor: str, quasi: bool = False) -> bool:
    """Is `tensor` written by exactly one elementwise statement of at most MAX_CALLS ops
    (transcendental ones included), and read only at affine indices? With `quasi`, also
    at a reshape's floor and mod where the writer loads by that iterator alone (a
    transpose: its loads take the reader's index as it is)."""
    statements = list(statements)
    writers = [s for s in statements if s.target == tensor]
    if len(writers) != 1:
        return False
    w = writers[0]
    if (w.reduce is not None or w.index != identity(len(w.extents))
            or _cost(w.expr) > MAX_CALLS):
        return False
    if _depends_on_first_sum(statements, statements.index(w)) and any(
            _operand_of_product(s, tensor) for s in statements):
        return False  # a second contraction reads its rows in place (`GemmView.then`)
    bare = _bare_iterators(w) if quasi else set()
    return all(all(isinstance(e, Aff) or d in bare for d, e in enumerate(ld.index))
               for s in statements for ld, _ in loads(s.expr) if ld.tensor == tensor)


def _bare_iterators(w: Statement) -> set[int]:
    """The iterators `w` uses only alone in its loads' indices (never scaled, shifted or
    in a guard's bounds): a reader's quasi-affine index may replace them as it is."""
    bare = set(range(len(w.extents)))
    for ld, guards in loads(w.expr):
        for g in guards:
            for bound in (g.bounds if isinstance(g, Outside) else (g,)):
                bare -= _iterators(bound.aff)
        for e in ld.index:
            if _bare(e) is None:
                bare -= _iterators(e)
    return bare


def _iterators(e: Index) -> set[int]:
    return {p for p, _ in e.terms} if isinstance(e, Aff) else _iterators(e.arg)


def recompute(statements: Iterable[Statement], tensors: Iterable[str],
              nonpositive: frozenset[str] = frozenset()) -> tuple[Statement, ...]:
    """The statements with each of `tensors` (all `recomputable`) no longer stored: its
    producer's expression is substituted wherever it is read. A tensor known to hold
    no positive value (`graph.ranges`) keeps that fact as a `nonpositive(...)` call
    around its expression (codegen's exp then skips its overflow check).

        before:  S1: shifted[i0, i1] = x[i0, i1] - max[0, i1]
                 S5: y[i0, i1] = shifted[i0, i1] - log[0, i1]
        after:   S5: y[i0, i1] = nonpositive(x[i0, i1] - max[0, i1]) - log[0, i1]
    """
    out = list(statements)
    for t in tensors:
        prod = next(s for s in out if s.target == t)
        if t in nonpositive:
            prod = replace(prod, expr=Call("nonpositive", (prod.expr,), prod.dtype))
        out = [_substitute_into(s, prod) if any(ld.tensor == t for ld, _ in loads(s.expr))
               else s for s in out if s.target != t]
    return tuple(out)


def _cost(e: Expr) -> int:
    if isinstance(e, Call) and e.fn == "nonpositive":
        return _cost(e.args[0])
    if isinstance(e, Call):
        return (1 if e.fn in RECOMPUTE else MAX_CALLS + 1) + sum(_cost(a) for a in e.args)
    if isinstance(e, Guarded):
        return _cost(e.then) + _cost(e.otherwise)
    return 0
