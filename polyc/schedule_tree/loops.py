"""What a loop of a schedule tree carries: the facts vectorisation and parallel loops
rest on, decided with isl on the dependences and the schedule (every target asks)."""
from __future__ import annotations

import islpy as isl

from ..graph.ir import INT_BITS
from ..kernel.comprehension import Statement
from . import marks

_BAND, _LEAF = isl.schedule_node_type.band, isl.schedule_node_type.leaf


def only_statements(node: isl.ScheduleNode) -> bool:
    """Is there no loop below `node` (a leaf, or a sequence of statements)?"""
    if node.get_type() == _LEAF:
        return True
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        return all(node.child(i).child(0).get_type() == _LEAF for i in range(node.n_children()))
    return False


def equal_at(pairs: isl.UnionMap, schedule: isl.MultiUnionPwAff) -> isl.UnionMap:
    """The pairs of instances in `pairs` to which `schedule` gives equal values. (Asked
    of the pairs themselves: forming every pair of instances with equal values first,
    schedule . schedule^-1, is quadratic in the statements of a kernel.)"""
    return pairs.eq_at_multi_union_pw_aff(schedule)


def carried(band: isl.ScheduleNode, member: isl.MultiUnionPwAff,
            deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences among `band`'s statements that its loop `member` (a schedule of
    them) carries: equal in every loop outside the band, not in this one."""
    domain = band.get_domain()
    inside = equal_at(deps.intersect_domain(domain).intersect_range(domain),
                      band.get_prefix_schedule_multi_union_pw_aff())
    return inside.subtract(equal_at(inside, member))


def inner_loop_kind(band: isl.ScheduleNode, deps: isl.UnionMap,
                     by_name: dict[str, Statement]) -> marks.Mark | None:
    """Simd when the last member of `band` carries no dependence, Reduce when it carries
    only float reductions' dependences on themselves (partial results may combine in any
    order: one accumulator per vector lane), else None; only for a band with no loop
    below it."""
    if not only_statements(band.child(0)):
        return None
    n = band.band_n_member()
    last = band.band_split(n - 1).child(0) if n > 1 else band
    across = carried(last, last.band_get_partial_schedule(), deps)
    if across.is_empty():
        return marks.Simd()
    maps = across.get_map_list()
    for m in (maps.get_at(i) for i in range(maps.n_map())):
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if src != dst or by_name[src].reduce is None or by_name[src].dtype in INT_BITS:
            return None
    return marks.Reduce()
