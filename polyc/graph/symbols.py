"""Symbolic dims: a dim may be an identifier (`["N", 1024]`), its range in `symbols`.

Static graphs never meet sympy: their dims stay Python ints and every helper here
returns at once on two ints (sympy is imported only when a symbol appears). A symbolic
dim is a sympy expression of integer symbols (`64*N`, `N + M`); shape rules compare dims
with `same_dim`, which answers from the symbols' ranges:

    always equal          -> fine
    never equal in range  -> OpError now (the loader names the node and field)
    equal for some values -> an assumption, kept in the graph and checked when a call
                             binds the symbols (`binding.bind_symbols`)

Assumptions are collected in the `Scope` the loader opens around shape inference.
"""
from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

DEFAULT_MIN, DEFAULT_MAX = 1, 2**31 - 1
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
C_PREFIX = "polyc_sym_"  # symbols' names in isl and C: never a keyword or a name polyc makes


def is_identifier(v: Any) -> bool:
    return isinstance(v, str) and _IDENT.fullmatch(v) is not None


def is_static(d: Any) -> bool:
    return type(d) is int


def is_static_shape(shape: Iterable) -> bool:
    return all(type(d) is int for d in shape)


def symbol(name: str):
    import sympy
    return sympy.Symbol(name, integer=True, positive=True)


def free_names(dims: Iterable) -> set[str]:
    """Names of the symbols in `dims`."""
    return {s.name for d in dims if not is_static(d) for s in d.free_symbols}


def as_int(d):
    """`d` as a Python int when sympy folded it to a number, else unchanged."""
    if is_static(d):
        return d
    if d.is_Integer:
        return int(d)
    return d


@dataclass
class Scope:
    """What shape inference of one graph may assume: the symbols' ranges; it collects
    the assumptions (`(relation, message)`) a call must check."""

    ranges: Mapping[str, tuple[int, int]]
    assumptions: list[tuple[Any, str]] = field(default_factory=list)
    where: str = ""  # the node being inferred, for the assumption's message


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("polyc_symbols",
                                                                       default=None)


def open_scope(scope: Scope):
    return _SCOPE.set(scope)


def close_scope(token) -> None:
    _SCOPE.reset(token)


def _bounds(expr, ranges: Mapping[str, tuple[int, int]]) -> tuple[float, float] | None:
    """Lowest and highest value of an affine `expr` over the ranges (None: not affine)."""
    import sympy
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    try:
        poly = sympy.Poly(expr, *syms)
    except sympy.PolynomialError:
        return None
    if poly.total_degree() > 1:
        return None
    lo = hi = float(poly.coeff_monomial(1))
    for s in syms:
        c = float(poly.coeff_monomial(s))
        a, b = ranges.get(s.name, (DEFAULT_MIN, DEFAULT_MAX))
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


def _ranges() -> Mapping[str, tuple[int, int]]:
    scope = _SCOPE.get()
    return scope.ranges if scope is not None else {}


def sign_of(expr) -> str:
    """'zero', 'pos', 'neg', 'nonneg', 'nonpos' when that holds for every value in range,
    else 'unknown'."""
    if is_static(expr):
        return "zero" if expr == 0 else "pos" if expr > 0 else "neg"
    import sympy
    expr = sympy.expand(expr)
    if expr.is_number:
        v = int(expr) if expr.is_Integer else float(expr)
        return "zero" if v == 0 else "pos" if v > 0 else "neg"
    b = _bounds(expr, _ranges())
    if b is None:
        return "unknown"
    lo, hi = b
    if lo > 0:
        return "pos"
    if hi < 0:
        return "neg"
    if lo == 0:
        return "nonneg"
    if hi == 0:
        return "nonpos"
    return "unknown"


def assume(relation, message: str) -> None:
    """Record that a call must check `relation` (a sympy relational)."""
    scope = _SCOPE.get()
    if scope is None:  # a front end's own inference: the loader records it after
        return
    scope.assumptions.append((relation, f"{scope.where}: {message}" if scope.where else message))


def same_dim(a, b, message: str) -> bool:
    """True when `a == b` for every value of the symbols; False when for none; otherwise
    the equality is assumed (checked at call time) and True is returned."""
    if type(a) is int and type(b) is int:
        return a == b
    s = sign_of(a - b)
    if s == "zero":
        return True
    if s in ("pos", "neg"):
        return False
    import sympy
    assume(sympy.Eq(a, b), message)
    return True


def at_least(a, b, message: str) -> bool:
    """`a >= b`: True for every value, False for none, or assumed (True)."""
    if type(a) is int and type(b) is int:
        return a >= b
    s = sign_of(a - b)
    if s in ("zero", "pos", "nonneg"):
        return True
    if s == "neg":
        return False
    import sympy
    assume(sympy.Ge(a, b), message)
    return True


def substitute(d, values: Mapping[str, int]) -> int:
    """The int value of dim `d` once the symbols are bound."""
    if is_static(d):
        return d
    return int(d.subs({s: values[s.name] for s in d.free_symbols}))


def substitute_shape(shape: tuple, values: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(substitute(d, values) for d in shape)


def user_symbols(expr):
    """`expr` with the symbols' C names (C_PREFIX + name) back to the user's names."""
    if is_static(expr):
        return expr
    return expr.xreplace({s: symbol(s.name[len(C_PREFIX):]) for s in expr.free_symbols
                          if s.name.startswith(C_PREFIX)})


_TERM = re.compile(r"([+-]?)(?:(\d+)\*)?(" + C_PREFIX + r"[A-Za-z0-9_]+|\d+)")


def parse_affine(text: str):
    """An affine expression of symbols' C names as printed without spaces
    (`64*polyc_sym_N-1`), parsed without eval (mark texts may come from a saved tree);
    a ValueError for anything else."""
    pos, expr = 0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or (pos and not m.group(1)):
            raise ValueError(f"not an affine expression of symbols: {text!r}")
        sign = -1 if m.group(1) == "-" else 1
        coeff = int(m.group(2) or 1)
        atom = m.group(3)
        expr = expr + sign * coeff * (int(atom) if atom.isdigit() else symbol(atom))
        pos = m.end()
    if pos == 0:
        raise ValueError(f"not an affine expression of symbols: {text!r}")
    return as_int(expr) if not isinstance(expr, int) else expr


@dataclass(frozen=True)
class Reciprocal:
    """The float 1/count, `count` an affine expression of the symbols: the factor of a
    mean over a symbolic axis, which the static pipeline makes a constant 1/N at each
    size (`kernel.generalise`). Generated C computes it from the bound parameter, in
    double and then rounded, as the static literal is."""

    count: Any

    def at(self, values: Mapping[str, int]) -> float:
        """Its value once the symbols take `values` (by name: the user's or C's)."""
        return 1.0 / substitute(self.count, values)

    def __str__(self) -> str:
        return f"1/({self.count})"


@dataclass(frozen=True)
class Iota:
    """The data 0, 1, ..., count - 1 of a constant as long as `count`, an affine
    expression of the symbols: the positions a causal mask compares, which the static
    pipeline makes constants at each size (`kernel.generalise`); a call makes them
    from the bound values (`reference.constant_value`)."""

    count: Any

    def __str__(self) -> str:
        return f"0..{self.count}-1"


class Tight:
    """A symbolic value that formats without spaces: a field of a mark's text, whose
    words are split at spaces."""

    def __init__(self, expr):
        self.expr = expr

    def __format__(self, spec: str) -> str:
        return str(self.expr).replace(" ", "")

    __str__ = __repr__ = lambda self: format(self, "")
