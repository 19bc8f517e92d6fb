"""CPU target lowering: which loops run in parallel (OpenMP threads) and which vectorise.

Both decisions are marks inserted into the schedule tree, so they show in the printed
tree and the browser view, and codegen only has to translate them:

- `parallel` above the outermost band on each path whose first member is coincident,
  when the work below it is large enough to pay for waking the thread team;
- `simd` above the last member of an innermost band when that member is coincident
  (the band is split so the mark sits on exactly that loop);
- `reduce` instead when that member carries a float reduction, the band's only
  statement: its partial results may be combined in any order (sum, max, ...), so the
  loop vectorises with one accumulator per lane.
"""
from __future__ import annotations

import math

import islpy as isl

from ..schedule_tree.comprehension import Statement

MIN_PARALLEL_INSTANCES = 1 << 15

_BAND, _LEAF = isl.schedule_node_type.band, isl.schedule_node_type.leaf


def _instances(node: isl.ScheduleNode, sizes: dict[str, int]) -> int:
    """Statement instances below `node`, counting each statement whole."""
    names: list[str] = []
    node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    return sum(sizes[n] for n in names)


def _below_mark(node: isl.ScheduleNode, *marks: str) -> bool:
    return (node.has_parent() and node.parent().get_type() == isl.schedule_node_type.mark
            and node.parent().mark_get_id().get_name() in marks)


def _single_float_reduction(band: isl.ScheduleNode, by_name: dict[str, Statement]) -> bool:
    names: list[str] = []
    band.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    return (len(names) == 1 and by_name[names[0]].reduce is not None
            and by_name[names[0]].dtype != "int32")


def mark_cpu_loops(schedule: isl.Schedule, statements: tuple[Statement, ...], *,
                   parallel: bool = True) -> isl.Schedule:
    """Insert `parallel` and `simd` marks (see the module docstring)."""
    sizes = {s.name: math.prod(s.extents) for s in statements}
    by_name = {s.name: s for s in statements}

    def visit(node: isl.ScheduleNode, in_band: bool) -> isl.ScheduleNode:
        inserted = 0
        if node.get_type() == _BAND and not _below_mark(node, "simd", "reduce"):
            n = node.band_n_member()
            inner = None
            if node.child(0).get_type() == _LEAF:
                if node.band_member_get_coincident(n - 1):
                    inner = "simd"
                elif _single_float_reduction(node, by_name):
                    inner = "reduce"
            if inner and n > 1:
                node = node.band_split(n - 1)
                node = node.child(0).insert_mark(isl.Id(inner)).parent()
                inner = None
            marks = [inner] if inner else []
            if (parallel and not in_band and node.band_member_get_coincident(0)
                    and _instances(node, sizes) >= MIN_PARALLEL_INSTANCES):
                marks.append("parallel")
            for mark in marks:
                node = node.insert_mark(isl.Id(mark)).child(0)
            inserted = len(marks)
            in_band = True
        for i in range(node.n_children()):
            node = visit(node.child(i), in_band).parent()
        for _ in range(inserted):
            node = node.parent()
        return node

    return visit(schedule.get_root(), False).get_schedule()
