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


class _Steps:
    """`step_pairs` for each member of one band: what the members share (the pairs with
    every outer loop fixed, each member's own relations) is computed once."""

    def __init__(self, band: isl.ScheduleNode, domain: isl.UnionSet | None = None):
        domain = band.get_domain() if domain is None else domain
        outer = band.get_prefix_schedule_union_map().intersect_domain(domain)
        self.outer = outer.apply_range(outer.reverse())
        partial = band.band_get_partial_schedule()
        step = isl.UnionMap.read_from_str(band.get_ctx(), "{ [t] -> [t + 1] }")
        self.fixed, self.stepped = [], []  # per member: its pairs equal, one step apart
        for m in range(band.band_n_member()):
            u = isl.UnionMap.from_union_pw_aff(partial.get_union_pw_aff(m)).intersect_domain(domain)
            self.fixed.append(u.apply_range(u.reverse()))
            self.stepped.append(u.apply_range(step).apply_range(u.reverse()))

    def of(self, member: int) -> isl.UnionMap:
        pairs = self.outer
        for m, (fixed, stepped) in enumerate(zip(self.fixed, self.stepped)):
            pairs = pairs.intersect(stepped if m == member else fixed)
        return pairs


def step_pairs(band: isl.ScheduleNode, member: int,
               domain: isl.UnionSet | None = None) -> isl.UnionMap:
    """Pairs of instances (of the band, or of `domain`) one step of band member `member`
    apart, with every outer loop and other member fixed."""
    return _Steps(band, domain).of(member)


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


def _jumps(band: isl.ScheduleNode, pairs: isl.UnionMap, accesses: list[tuple[isl.Map, int]]) -> int:
    """Weighted count of the accesses that are not contiguous when the member whose
    `step_pairs` are `pairs` is inner."""
    cost = 0
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
            steps = _Steps(node)
            costs = [_jumps(node, steps.of(m), accesses) for m in range(n)]
            best = min(range(n), key=lambda m: (costs[m], m != n - 1))
            if best != n - 1:
                node = _reorder(node, [m for m in range(n) if m != best] + [best])
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return model.with_schedule(visit(model.schedule.get_root()).get_schedule())
