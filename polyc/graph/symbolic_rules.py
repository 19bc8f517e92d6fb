"""The parts of the op registry's shape rules (`ops.py`) that meet symbolic dims.

Broadcasting, reshape and slicing of dims that are sympy expressions of the symbols
(`symbols.py`): each compares dims with `same_dim` / `at_least`, which decide from the
symbols' ranges or record an assumption a call checks.
"""
from __future__ import annotations

from typing import Any

from .op_error import OpError
from .symbols import as_int, at_least, is_static, is_static_shape, same_dim, sign_of


def not_broadcastable(shapes) -> OpError:
    return OpError("shapes " + " and ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
                   + " cannot be broadcast together", "inputs")


def symbolic_broadcast(dims: set, shapes) -> Any:
    """A symbol broadcasts against a 1 only; against any other dim it must be equal to
    it (for every value, or checked when a call binds the symbols)."""
    ordered = sorted(dims, key=lambda d: (not is_static(d), str(d)))  # a constant first
    for d in ordered[1:]:
        if not same_dim(ordered[0], d, f"dims {ordered[0]} and {d} of shapes "
                        + " and ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
                        + " must be equal to broadcast"):
            raise not_broadcastable(shapes)
    return ordered[0]


def same_shape(a: tuple, b: tuple, message: str) -> bool:
    """Shapes equal (symbolic dims compared with `same_dim`, assumed where undecided)."""
    if is_static_shape(a) and is_static_shape(b):
        return a == b
    return len(a) == len(b) and all(same_dim(x, y, message) for x, y in zip(a, b))


def symbolic_reshape(shape: tuple[int, ...], size, known: int) -> tuple:
    """A symbolic size reshaped: the -1 takes `size / known`, which must be a polynomial
    with integer coefficients (64*N into [-1, 64] gives N; 7*N into [2, -1] is refused);
    without a -1 the sizes must agree."""
    import sympy
    if -1 not in shape:
        if not same_dim(size, known, f"{size} elements must equal the target's {known}"):
            raise OpError(f"cannot reshape {size} elements into {list(shape)}", "shape")
        return shape
    rest = sympy.cancel(size / known)
    num, den = sympy.fraction(rest)
    poly = sympy.Poly(num, *sorted(num.free_symbols, key=str))
    if den != 1 or not all(c.is_Integer for c in poly.coeffs()):
        raise OpError(f"cannot reshape {size} elements into {list(shape)} for every value of "
                      f"{', '.join(sorted(map(str, size.free_symbols)))}", "shape")
    return tuple(as_int(rest) if d == -1 else d for d in shape)


def symbolic_slice(d, s: int, e: int, step: int, axis: int) -> tuple:
    """numpy's slice of a symbolic dim `d`: negative indices count from its end, an end
    past it is clamped, where the symbols' ranges decide it (else the unclamped case is
    assumed and checked per call); a step > 1 is refused (its length is not affine)."""
    if step != 1:
        raise OpError(f"a step of {step} on axis {axis}, whose dim {d} is symbolic, is not "
                      "supported (only 1)", "steps")
    start = s
    if s < 0:
        start = d + s
        if not at_least(start, 0, f"start {s} needs axis {axis} ({d}) >= {-s}"):
            start = 0  # clamped for every value in range
    stop = e
    if e < 0:
        stop = d + e
    elif _always(e, d):
        stop = d
    elif not _always(d, e):
        at_least(d, e, f"end {e} needs axis {axis} ({d}) >= {e}")
    length = as_int(stop - start)
    if not at_least(length, 1, f"axis {axis} (dim {d}) sliced [{s}:{e}] must not be empty"):
        raise OpError(f"axis {axis} would be empty (start {s}, end {e} on a dim of {d})",
                      "starts")
    return (as_int(start), 1, length)


def _always(a, b) -> bool:
    """`a >= b` for every value of the symbols (no assumption recorded)."""
    return sign_of(a - b) in ("zero", "pos", "nonneg")
