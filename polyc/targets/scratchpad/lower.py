"""Marks and copies of a chip with scratchpads: which loop the cores share, which loops
vectorise, and the copies as statements of the tree.

- `parallel threads=P` above the tile band when its first loop carries no dependence:
  its iterations are dealt to P = min(cores, iterations) cores in turn; a tile band
  whose loop carries one (a full sum) runs on one core;
- `simd` / `reduce` on innermost loops (as on the cpu): the simulators charge them as
  vector ops, every other loop as scalar ops;
- copies: below the `tile` mark, each promoted array gets a statement `copy_in_<buffer>`
  before the tile (it fixes the tile's box, and gets what the tile reads) and, when the
  tile's writes leave, `copy_out_<buffer>` after it, grafted as extension nodes whose
  instances are the outer loop values: isl's AST generation places the copies, and the
  tree printed after this pass shows them; an input every tile reads alike is copied
  once, before the tile loop.
"""
from __future__ import annotations

import islpy as isl

from ...machine import Machine
from ...schedule_tree import marks
from ...schedule_tree.loops import inner_loop_kind, only_statements
from ...schedule_tree.promotion import tile_prefix
from ...schedule_tree.state import KernelState

_BAND, _MARK = isl.schedule_node_type.band, isl.schedule_node_type.mark


def tile_node(schedule: isl.Schedule, at: str | None = None) -> isl.ScheduleNode:
    """The node right below the `tile` mark whose text is `at` (the first one)."""
    found: list[isl.ScheduleNode] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == _MARK and (
                node.mark_get_id().get_name() == at if at
                else marks.word(node.mark_get_id().get_name()) == marks.Tile.word):
            found.append(node.child(0))
        return not found

    schedule.get_root().foreach_descendant_top_down(visit)
    return found[0]


def _iterations(band: isl.ScheduleNode) -> int:
    first = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_union_pw_aff(0))
    return first.intersect_domain(band.get_domain()).range().as_set().count_val().to_python()


def lower_pass(state: KernelState, machine: Machine, options) -> KernelState:
    node = tile_node(state.schedule).parent()  # the tile mark
    band = node.parent() if node.has_parent() else None
    if (options.parallel and band is not None and band.get_type() == _BAND
            and band.band_member_get_coincident(0)):
        cores = min(options.cores, _iterations(band))
        if cores > 1:
            node = band.insert_mark(isl.Id(str(marks.Parallel(cores))))
    by_name = {s.name: s for s in state.kernel.statements}
    deps = state.model.dependences

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == _BAND and only_statements(node.child(0)):
            kind = inner_loop_kind(node, deps, by_name)
            if kind is not None:
                n = node.band_n_member()
                if n > 1:
                    node = node.band_split(n - 1).child(0)
                    return node.insert_mark(isl.Id(str(kind))).parent()
                return node.insert_mark(isl.Id(str(kind)))
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return state.with_schedule(visit(node.get_schedule().get_root()).get_schedule())


def _extension(node: isl.ScheduleNode, names: list[str]) -> isl.UnionMap:
    """Outer loop values -> one instance of each statement of `names` per tile."""
    values = tile_prefix(node).range()
    sets: list[isl.Set] = []
    values.foreach_set(sets.append)
    ext = isl.UnionMap.empty(values.get_space())
    for name in names:
        for s in sets:
            ext = ext.union(isl.Map.identity(s.get_space().map_from_set())
                            .intersect_domain(s).set_tuple_name(isl.dim_type.out, name))
    return ext


def copy_statement(direction: str, buffer: str) -> str:
    return f"copy_{direction}_{buffer}"


def copies_pass(state: KernelState, machine: Machine, options) -> KernelState:
    schedule = state.schedule
    for at in dict.fromkeys(p.at for p in state.promotions):
        here = [p for p in state.promotions if p.at == at]
        # "": copied once, before everything (an input every tile reads alike)
        node = tile_node(schedule, at) if at else schedule.get_root().child(0)
        ins = [copy_statement("in", p.buffer) for p in here]
        outs = [copy_statement("out", p.buffer) for p in here if p.direction in ("out", "inout")]
        node = node.graft_before(isl.ScheduleNode.from_extension(_extension(node, ins)))
        if outs:
            node = node.graft_after(isl.ScheduleNode.from_extension(_extension(node, outs)))
        schedule = node.get_schedule()
    return state.with_schedule(schedule)

