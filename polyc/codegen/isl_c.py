"""isl functions as C expressions, for code that computes a tile's bounds itself (a
promotion's first element, its extent at an edge)."""
from __future__ import annotations

import islpy as isl


def c_of(pa: isl.PwAff, names: list[str]) -> str:
    """`pa` (a function of its input dimensions) as a C expression in `names`, one per
    input dimension: isl's own AST printer, with the inputs made parameters."""
    n = pa.dim(isl.dim_type.in_)
    for k in range(n):
        pa = pa.set_dim_id(isl.dim_type.in_, k, isl.Id(names[k]))
    pa = pa.move_dims(isl.dim_type.param, 0, isl.dim_type.in_, 0, n)
    build = isl.AstBuild.from_context(isl.Set.universe(pa.get_domain_space()))
    return build.expr_from_pw_aff(pa).to_C_str()


def c_of_set(s: isl.Set, names: list[str]) -> str:
    """The condition that a point (`names`, one per dimension) lies in `s`, as C."""
    n = s.dim(isl.dim_type.set)
    for k in range(n):
        s = s.set_dim_id(isl.dim_type.set, k, isl.Id(names[k]))
    s = s.move_dims(isl.dim_type.param, 0, isl.dim_type.set, 0, n)
    build = isl.AstBuild.from_context(isl.Set.universe(s.get_space().params()))
    return build.expr_from_set(s.params()).to_C_str()
