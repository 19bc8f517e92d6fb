"""The polyhedral record of one kernel (after PPCG's `ppcg_scop`), built from its statements.

Every field is an isl object, immutable in islpy's functional API:

- `domain`  statement instances: `{ S0[i0, i1] : 0 <= i0 < 64 and 0 <= i1 < 32; ... }`
- `reads`   instance -> array element read, exact, restricted to the domain and guards
- `writes`  instance -> array element written
- `order`   the original execution order: statements in sequence, each in its own nest
- `flow`, `anti`, `output`  dependences from isl's dataflow analysis (`dependences` pass)
- `input`   read-after-read pairs: not constraints, only reuse for the scheduler to exploit
- `schedule`  the isl schedule tree (`schedule` pass onwards)

Array names in isl are the kernels' C identifiers, so isl never sees a user's string.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

import islpy as isl

from ..kernel.comprehension import Guard, Outside, Statement, isl_index, loads
from .tree import schedule_to_text


@dataclass(frozen=True)
class PolyModel:
    domain: isl.UnionSet
    reads: isl.UnionMap
    writes: isl.UnionMap
    order: isl.UnionMap
    flow: isl.UnionMap | None = None
    anti: isl.UnionMap | None = None
    output: isl.UnionMap | None = None
    input: isl.UnionMap | None = None
    schedule: isl.Schedule | None = None

    @property
    def dependences(self) -> isl.UnionMap:
        """Every dependence a schedule must respect."""
        return self.flow.union(self.anti).union(self.output)

    def bytes_touched(self, instances: isl.UnionSet, element_bytes: Mapping[str, int],
                      boxes: bool = False) -> int:
        """Bytes of the distinct array elements that `instances` read or write, counted
        exactly by isl, or with `boxes` of each array's bounding box (what a copy into a
        scratchpad moves: rows 0, 128, 256 of an array take the 257 rows between);
        `element_bytes` maps array names to their element size."""
        touched = self.reads.union(self.writes).intersect_domain(instances).range()
        # counted after the walk, not in its callback: an error there (an operation
        # budget running out, `budget.py`) would only be printed by islpy, not raised
        arrays: list[isl.Set] = []
        touched.foreach_set(arrays.append)
        size = _box_size if boxes else count
        return sum(size(elements) * element_bytes[elements.get_tuple_name()]
                   for elements in arrays)

    def with_schedule(self, schedule: isl.Schedule) -> "PolyModel":
        return replace(self, schedule=schedule)

    def __str__(self) -> str:
        fields = [("domain", self.domain), ("reads", self.reads), ("writes", self.writes),
                  ("order", self.order), ("flow", self.flow), ("anti", self.anti),
                  ("output", self.output), ("input", self.input)]
        text = "\n".join(f"{k}: {v}" for k, v in fields if v is not None)
        if self.schedule is not None:
            text += "\nschedule:\n" + schedule_to_text(self.schedule)
        return text


def count(points: isl.Set) -> int:
    """How many points `points` has: a box (a tile's block of an array, the usual
    footprint) by its extents, anything else by isl's count, which visits every point (a
    tile of 45 M elements took 40 ms a count, a tile search 2.5 s)."""
    box = points.coalesce()
    if box.is_box() and not box.is_empty() and (n := _box_size(box)) is not None:
        return n
    return points.count_val().to_python()


def _box_size(points: isl.Set) -> int | None:
    """How many points the bounding box of `points` has (None when it is unbounded)."""
    bounds = [(points.dim_min_val(d), points.dim_max_val(d))
              for d in range(points.dim(isl.dim_type.set))]
    if not all(lo.is_int() and hi.is_int() for lo, hi in bounds):
        return None
    return math.prod(hi.to_python() - lo.to_python() + 1 for lo, hi in bounds)


def _domain(s: Statement) -> str:
    iters = ", ".join(s.iter_name(d) for d in range(len(s.extents)))
    box = " and ".join(f"0 <= {s.iter_name(d)} < {n}" for d, n in enumerate(s.extents))
    return f"{s.name}[{iters}]" + (f" : {box}" if box else "")


def _guard(g: Guard, s: Statement) -> str:
    if isinstance(g, Outside):  # not (a and b ...): one of them fails
        return "(" + " or ".join(f"{b.aff.render(s.iter_name)} < {b.lo} or "
                                 f"{b.aff.render(s.iter_name)} >= {b.hi}" for b in g.bounds) + ")"
    return f"{g.lo} <= {g.aff.render(s.iter_name)} < {g.hi}"


def _access(s: Statement, array: str, index, guards: tuple[Guard, ...]) -> str:
    iters = ", ".join(s.iter_name(d) for d in range(len(s.extents)))
    idx = ", ".join(isl_index(e, s.iter_name) for e in index)
    cond = " and ".join(_guard(g, s) for g in guards)
    return f"{s.name}[{iters}] -> {array}[{idx}]" + (f" : {cond}" if cond else "")


def statement_names(uset: isl.UnionSet) -> set[str]:
    """The names of the statements (tuples) of `uset`."""
    out: list[str] = []
    uset.foreach_set(lambda s: out.append(s.get_tuple_name()))
    return set(out)


def _union_map(parts: list[str], domain: isl.UnionSet, ctx: isl.Context,
               prefix: str = "") -> isl.UnionMap:
    text = prefix + ("{ " + "; ".join(parts) + " }" if parts else "{ }")
    return isl.UnionMap.read_from_str(ctx, text).intersect_domain(domain)


def build_model(statements: tuple[Statement, ...], arrays: Mapping[str, str],
                ctx: isl.Context | None = None, context: isl.Set | None = None) -> PolyModel:
    """The polyhedral model of a kernel; `arrays` maps tensor names to C names. The
    statements of a symbolic kernel have extents and offsets in its symbols: `context`
    (`[N] -> { : 1 <= N <= 8192 }`) declares them as isl parameters and their ranges."""
    ctx = ctx or isl.DEFAULT_CONTEXT
    params = context.get_space().get_var_names(isl.dim_type.param) if context else []
    prefix = f"[{', '.join(params)}] -> " if params else ""
    domain = isl.UnionSet.read_from_str(ctx, prefix + "{ " + "; ".join(_domain(s) for s in statements) + " }")
    if context is not None:
        domain = domain.intersect_params(context)
    reads, writes = [], []
    for s in statements:
        writes.append(_access(s, arrays[s.target], s.index, ()))
        if s.reduce is not None:  # `+=` reads what it writes
            reads.append(_access(s, arrays[s.target], s.index, ()))
        for load, guards in loads(s.expr):
            reads.append(_access(s, arrays[load.tensor], load.index, guards))
    return PolyModel(domain, _union_map(reads, domain, ctx, prefix),
                     _union_map(writes, domain, ctx, prefix),
                     original_order(statements, domain, prefix))


def original_order(statements: tuple[Statement, ...], domain: isl.UnionSet,
                   prefix: str = "") -> isl.UnionMap:
    """The statements in sequence, each in its own nest: `S1[i0] -> [1, i0, 0]`."""
    order = []
    depth = max(len(s.extents) for s in statements)
    for pos, s in enumerate(statements):
        iters = [s.iter_name(d) for d in range(len(s.extents))]
        padded = iters + ["0"] * (depth - len(iters))
        order.append(f"{s.name}[{', '.join(iters)}] -> [{', '.join([str(pos)] + padded)}]")
    return _union_map(order, domain, domain.get_ctx(), prefix)
