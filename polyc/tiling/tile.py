"""Tiling permutable bands with sizes from the target's memory model.

Bands under a `column_block` mark are left whole: the block was sized to fit.

Only permutable bands are tiled (isl proved every dependence has non-negative distance
along each member, so any rectangular tiling is legal; a reduction loop is tiled only
when that holds). Tile sizes are chosen so that the tile's footprint, the distinct array
elements touched by one tile counted exactly with isl, fits the target's tile level (L1
on the CPU): start from the whole band and halve the largest outer tile size until it
fits, keeping the innermost, contiguous one long enough to vectorise. isl's `band_tile`
puts the point loops innermost.

    band [i, j, k] of a 512^3 matmul -> tile band [32*floor(i/32), ...] -> point band [i, j, k]

The search counts footprints with isl, so it has budgets (`budget.py`): isl operations
per band, wall seconds per compile. Past either, the kernel's bands left get default
sizes (DEFAULT_TILE, the innermost MIN_INNER_TILE): any rectangular tile of a permutable
band is legal, only its fit is unknown.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Sequence

import islpy as isl

from ..budget import Ledger, OutOfOperations, isl_operations
from ..errors import GraphError, Problem
from ..kernel import Kernel
from ..kernel.comprehension import Statement
from ..machine import Machine
from ..schedule_tree import marks
from ..schedule_tree.model import PolyModel
from ..schedule_tree.state import KernelState, Pass

_BAND = isl.schedule_node_type.band
MIN_INNER_TILE = 64  # elements along the contiguous loop: whole vectors, whole lines
DEFAULT_TILE = 32  # an outer member's size when the search is out of budget


def _members(band: isl.ScheduleNode, statements: dict[str, Statement]) -> list[int]:
    """The extent of each band member (the largest over the band's statements), when
    every member is a plain iterator of each statement; else []."""
    extents = []
    sched = band.band_get_partial_schedule()
    for m in range(band.band_n_member()):
        best = 0
        for text in sched.get_at(m).to_str().strip("{} ").split(";"):
            name, _, expr = text.partition("->")
            stmt = statements.get(name.strip().split("[")[0])
            expr = expr.strip().strip("[]()")
            if stmt is None or not expr.startswith("i") or not expr[1:].isdigit():
                return []
            best = max(best, stmt.extents[int(expr[1:])])
        extents.append(best)
    return extents


def tile_footprint(model: PolyModel, band: isl.ScheduleNode, sizes: Sequence[int],
                   element: dict[str, int]) -> int:
    """Bytes of distinct elements one tile (the first: members in [0, size)) touches."""
    sched = band.band_get_partial_schedule_union_map().intersect_domain(band.get_domain())
    n = band.band_n_member()
    box = " and ".join(f"0 <= t{m} < {s}" for m, s in enumerate(sizes))
    tile = isl.Set.read_from_str(model.domain.get_ctx(),
                                 f"{{ [{', '.join(f't{m}' for m in range(n))}] : {box} }}")
    return model.bytes_touched(sched.intersect_range(isl.UnionSet.from_set(tile)).domain(), element)


def _passes_apart(model: PolyModel, band: isl.ScheduleNode, extents: list[int],
                  element: dict[str, int]) -> bool:
    """Does `band` run a sequence of passes per iteration (a fused row kernel over the
    rows of a 3-d tensor) whose iterations share no element? Its tiles would gain no
    reuse, and their point loops would leave a row's scalars (a max, a sum) no buffer
    to be contracted into: a log_softmax over rows of 128 of 64x512x128 was 5x slower
    tiled than as 32768x128 (its scalars computed again for every element)."""
    if band.n_children() != 1 or band.child(0).get_type() != isl.schedule_node_type.sequence:
        return False
    one = tile_footprint(model, band, [1] * len(extents), element)
    return tile_footprint(model, band, extents, element) >= one * math.prod(extents)


def choose_tile_sizes(model: PolyModel, band: isl.ScheduleNode, extents: list[int],
                      capacity: int, element: dict[str, int], *,
                      balance: bool = True) -> list[int]:
    """Sizes halved from the whole band (equal tiles), or with `balance` False from the
    powers of two above the extents: the same sizes for every extent they cut."""
    sizes = list(extents) if balance else [1 << (e - 1).bit_length() for e in extents]
    while tile_footprint(model, band, sizes, element) > capacity:
        # halve the largest outer size; the innermost only once the others are small
        outer = [m for m in range(len(sizes) - 1) if sizes[m] > 8]
        inner_ok = sizes[-1] > MIN_INNER_TILE
        if outer and (not inner_ok or max(sizes[m] for m in outer) >= sizes[-1] // 4):
            m = max(outer, key=lambda m: sizes[m])
        elif inner_ok:
            m = len(sizes) - 1
        elif outer:
            m = max(outer, key=lambda m: sizes[m])
        else:
            break
        sizes[m] = max(1, sizes[m] // 2)
    return sizes


def default_tile_sizes(extents: list[int]) -> list[int]:
    """The sizes a band gets when the search is out of budget."""
    return [DEFAULT_TILE] * (len(extents) - 1) + [MIN_INNER_TILE]


def tile_bands(model: PolyModel, schedule: isl.Schedule, kernel: Kernel, machine: Machine, *,
               sizes: Sequence[int] | None = None, max_operations: int = 0,
               ledger: Ledger | None = None, balance: bool = True) -> tuple[isl.Schedule, str]:
    """Tile every permutable band of >= 2 members whose tile must shrink to fit the
    target's tile level (or with explicit `sizes`, the first entries per band), and say
    why the search fell back to default sizes ('' if it did not): isl ran past
    `max_operations` on a band (0: no limit), or `ledger`'s tiling seconds are spent."""
    by_name = {s.name: s for s in kernel.statements}
    element = {a.c_name: a.type.itemsize for a in kernel.arrays}
    capacity = machine.tile_level.capacity
    fallback = ""

    def search(node: isl.ScheduleNode, extents: list[int]) -> list[int]:
        nonlocal fallback
        if sizes:
            return list(sizes[:len(extents)]) + extents[len(sizes):]
        if not fallback and ledger is not None and ledger.exhausted("tile"):
            fallback = ledger.out_of_time("tile")
        if not fallback:
            try:
                with (ledger.timing("tile") if ledger else nullcontext(),
                      isl_operations(node.get_ctx(), max_operations)):
                    return choose_tile_sizes(model, node, extents, capacity, element,
                                             balance=balance)
            except OutOfOperations as e:
                fallback = str(e)
        return default_tile_sizes(extents)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if (node.get_type() == isl.schedule_node_type.mark
                and marks.word(node.mark_get_id().get_name()) == marks.ColumnBlock.word):
            return node  # the block was sized for the fusion level: its bands stay whole
        if (node.get_type() == _BAND and node.band_n_member() >= 2
                and node.band_get_permutable()):
            extents = _members(node, by_name)
            if extents and (sizes or not _passes_apart(model, node, extents, element)):
                # unbalanced, a size past the extent is kept: cut to it, it would differ
                # with the extent (the tile loop then has one iteration)
                chosen = [max(1, min(s, e) if balance else s)
                          for s, e in zip(search(node, extents), extents)]
                # tiling only the outermost loop is strip-mining: no locality gained
                if any(s < e for s, e in zip(chosen[1:], extents[1:])):
                    mv = isl.MultiVal.zero(node.band_get_space())
                    for m, s in enumerate(chosen):
                        mv = mv.set_val(m, isl.Val.int_from_si(node.get_ctx(), s))
                    node = node.band_tile(mv)  # now the tile band; its child the points
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return visit(schedule.get_root()).get_schedule(), fallback


def untileable(model: PolyModel, schedule: isl.Schedule) -> str:
    """Why no band of `schedule` can take explicit tile sizes: each band of two or more
    members that isl could not prove permutable, with a dependence that has a negative
    distance along one of its members (tiling would run its sink before its source)."""
    found: list[str] = []

    def visit(node: isl.ScheduleNode) -> None:
        if node.get_type() == _BAND and node.band_n_member() >= 2:
            if node.band_get_permutable():
                found.append(f"band {node.band_get_partial_schedule()} is permutable but "
                             "the sizes cover it whole")
            else:
                found.append(f"band {node.band_get_partial_schedule()} is not permutable"
                             + _negative_distance(model, node))
        for i in range(node.n_children()):
            visit(node.child(i))

    visit(schedule.get_root())
    return "; ".join(found) or "it has no band of two or more loops (each loop is a band "\
        "of its own: isl could not prove any two adjacent loops permutable together)"


def _negative_distance(model: PolyModel, band: isl.ScheduleNode) -> str:
    sched = band.band_get_partial_schedule_union_map().intersect_domain(band.get_domain())
    deltas = model.dependences.apply_domain(sched).apply_range(sched).deltas()
    for m in range(band.band_n_member()):
        sets: list[isl.Set] = []
        deltas.foreach_set(sets.append)
        for d in sets:
            negative = d.upper_bound_val(isl.dim_type.set, m, isl.Val.int_from_si(d.get_ctx(), -1))
            if not negative.is_empty():
                return (f": a dependence has distance {negative.sample_point()}, negative "
                        f"along member {m}")
    # no dependence forbids it: a pass laid this band out to its own plan (a
    # microkernel's blocking, whose sizes options.microkernel_tiles sets)
    return " (it is a target pass's own blocking, e.g. a microkernel's: no dependence " \
        "forbids tiling, but its sizes are set by that pass's options)"


def tile_pass(state: KernelState, machine: Machine, options) -> KernelState:
    if not options.tile:
        return state
    edits = [k for k, (name, _) in enumerate(options.kernel_tile_sizes)
             if name == state.kernel.name]
    sizes = options.kernel_tile_sizes[edits[0]][1] if edits else options.tile_sizes
    ledger = state.ledger or Ledger.of(options)
    # the cpu's pass (the chips tile to their scratchpads): CpuOptions.balance_tiles
    tiled, fallback = tile_bands(state.model, state.schedule, state.kernel, machine,
                                 sizes=sizes, max_operations=options.max_operations,
                                 ledger=ledger, balance=options.balance_tiles)
    if edits and tiled.plain_is_equal(state.schedule):
        # a person asked for these sizes: say why isl cannot apply them, never ignore them
        raise GraphError(Problem(f"kernel {state.kernel.name} cannot be tiled with "
                                 f"{list(sizes)}: {untileable(state.model, state.schedule)}",
                                 field=f"options.kernel_tile_sizes.{edits[0]}"))
    state = state.with_schedule(tiled)
    if fallback:
        state = state.note(ledger.fell_back(
            f"tile fallback: kernel {state.kernel.name}: {fallback}: default tile sizes "
            f"({DEFAULT_TILE} per loop, {MIN_INNER_TILE} innermost) instead of sizes "
            "fitted to the tile level"))
    return state


TILE = Pass("tile", tile_pass, changes_schedule=True)
