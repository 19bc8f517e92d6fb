"""Loop interchange for spatial locality: the innermost loop of a permutable band walks
memory contiguously.

isl's scheduler minimises dependence distances (proximity), which says nothing about the
order of a band's parallel members: a broadcast `y[i, j] = a[i, j] + c[j]` comes back
with `j` outer, as reusing `c[j]` across `i` is a proximity gain, and every access of the
inner loop then strides by a row. Within a permutable band any order of the members is
legal (that is what permutable means), so each band's innermost member is chosen as the
one under which the fewest accesses jump: an access is contiguous under a member when
stepping that member by one, the others fixed, moves it by nothing (a reduction's
accumulator, a broadcast operand) or by one element of its last dimension. Writes count
double, as a strided store costs a whole line. Ties keep isl's order. The strides are
computed with isl on the access relations, PPCG-style, not guessed from names.
"""
from __future__ import annotations

import islpy as isl

from .model import PolyModel

_BAND = isl.schedule_node_type.band


def step_pairs(band: isl.ScheduleNode, member: int,
               domain: isl.UnionSet | None = None) -> isl.UnionMap:
    """Pairs of instances (of the band, or of `domain`) one step of band member `member`
    apart, with every outer loop and other member fixed."""
    domain = band.get_domain() if domain is None else domain
    outer = band.get_prefix_schedule_union_map().intersect_domain(domain)
    pairs = outer.apply_range(outer.reverse())
    partial = band.band_get_partial_schedule()
    step = isl.UnionMap.read_from_str(band.get_ctx(), "{ [t] -> [t + 1] }")
    for m in range(band.band_n_member()):
        u = isl.UnionMap.from_union_pw_aff(partial.get_union_pw_aff(m)).intersect_domain(domain)
        moved = u.apply_range(step) if m == member else u
        pairs = pairs.intersect(moved.apply_range(u.reverse()))
    return pairs


def access_moves(pairs: isl.UnionMap, access: isl.UnionMap) -> isl.UnionSet:
    """How the elements `access` touches move (per array, as index differences) across
    `pairs` (`step_pairs`). Empty when no access is under the band."""
    return pairs.apply_domain(access).apply_range(access).deltas()


def unit_step(ctx: isl.Context, array: str, rank: int) -> isl.UnionSet:
    """One element along the last dimension of `array` (nothing for a scalar)."""
    if rank == 0:
        return isl.UnionSet.read_from_str(ctx, "{ }")
    return isl.UnionSet.read_from_str(
        ctx, f"{{ {array}[{', '.join(['0'] * (rank - 1) + ['1'])}] }}")


def _jumps(band: isl.ScheduleNode, member: int, accesses: list[tuple[isl.Map, int]]) -> int:
    """Weighted count of the accesses that are not contiguous when `member` is inner."""
    cost = 0
    pairs = step_pairs(band, member)
    for access, weight in accesses:
        moves = access_moves(pairs, isl.UnionMap(access))
        if moves.is_empty():
            continue  # the access's statement is not under this band
        name, rank = access.get_tuple_name(isl.dim_type.out), access.dim(isl.dim_type.out)
        still = isl.UnionSet.read_from_str(band.get_ctx(), f"{{ {name}[{', '.join(['0'] * rank)}] }}")
        if not moves.is_subset(still.union(unit_step(band.get_ctx(), name, rank))):
            cost += weight
    return cost


def _accesses(model: PolyModel) -> list[tuple[isl.Map, int]]:
    out: list[tuple[isl.Map, int]] = []
    for union, weight in ((model.reads, 1), (model.writes, 2)):
        maps = union.get_map_list()
        out += [(maps.get_at(i), weight) for i in range(maps.n_map())]
    return out


def _reorder(band: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """`band` with its members in `order`, keeping it permutable and each member's
    coincidence."""
    partial = band.band_get_partial_schedule()
    coincident = [band.band_member_get_coincident(m) for m in order]
    upas = isl.UnionPwAffList.alloc(band.get_ctx(), len(order))
    for m in order:
        upas = upas.add(partial.get_union_pw_aff(m))
    space = partial.get_space()
    permuted = isl.MultiUnionPwAff.from_union_pw_aff_list(space, upas)
    node = band.delete().insert_partial_schedule(permuted)
    node = node.band_set_permutable(1)
    for m, c in enumerate(coincident):
        node = node.band_member_set_coincident(m, c)
    return node


def interchange_for_locality(model: PolyModel) -> PolyModel:
    """Every permutable band of the schedule with its most contiguous member innermost."""
    accesses = _accesses(model)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == _BAND and node.band_n_member() >= 2 and node.band_get_permutable():
            n = node.band_n_member()
            costs = [_jumps(node, m, accesses) for m in range(n)]
            best = min(range(n), key=lambda m: (costs[m], m != n - 1))
            if best != n - 1:
                node = _reorder(node, [m for m in range(n) if m != best] + [best])
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return model.with_schedule(visit(model.schedule.get_root()).get_schedule())
