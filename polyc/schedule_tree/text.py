"""isl text written from statements: schedule trees (the YAML `isl_schedule_read_from_str`
parses) for the trees a target builds whole (a contraction's blocks and K steps) rather
than gets from the scheduler, and access relations."""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import islpy as isl

from ..kernel.comprehension import Index, Statement
from . import marks


def decl(s: Statement) -> str:
    """s's instance tuple, `S2[i0, i1]`."""
    return f"{s.name}[{', '.join(s.iter_name(d) for d in range(len(s.extents)))}]"


def member(stmts: Iterable[Statement], expr: Callable[[Statement], str]) -> str:
    """One band member: each statement's instance to expr(s)."""
    return "{ " + "; ".join(f"{decl(s)} -> [({expr(s)})]" for s in stmts) + " }"


def band(members: list[str], child: str | None = None, *, coincident: bool = False,
         permutable: bool = True, extra: str = "") -> str:
    """A band of `members`, every one coincident or none; `extra` adds fields (options)."""
    flags = ", ".join("1" if coincident else "0" for _ in members)
    return (f'{{ schedule: "[{", ".join(members)}]", permutable: {int(permutable)}, '
            f"coincident: [ {flags} ]{extra}" + (f", child: {child}" if child else "") + " }")


def mark(m: marks.Mark, child: str) -> str:
    return f'{{ mark: "{m}", child: {child} }}'


def sequence(parts: Iterable[tuple[Iterable[Statement], str | None]]) -> str:
    """A sequence of filters, each of some statements with an optional subtree."""
    filters = []
    for stmts, child in parts:
        f = f'{{ filter: "{{ {"; ".join(decl(s) for s in stmts)} }}"'
        filters.append(f + (f", child: {child}" if child else "") + " }")
    return "{ sequence: [ " + ", ".join(filters) + " ] }"


def access(s: Statement, index: Sequence[Index], array: str, ctx: isl.Context) -> isl.UnionMap:
    """s's accesses at `index` (a load's or its target's) of the array named `array` (its
    C name, as buffers are named)."""
    at = ", ".join(e.render(s.iter_name) for e in index)
    return isl.UnionMap.read_from_str(ctx, f"{{ {decl(s)} -> {array}[{at}] }}")
