"""Scheduling a kernel with isl's scheduler (a Pluto-style algorithm) under an
operation budget, and the original order it falls back to past that budget."""
from __future__ import annotations

import islpy as isl

from ..budget import isl_operations
from ..kernel.comprehension import Statement
from ..options import DEFAULT_MAX_OPERATIONS
from .fusion_tree import fusion_schedule
from .interchange import interchange_for_locality
from .model import PolyModel


def schedule_kernel(model: PolyModel, statements: tuple[Statement, ...], *, fused: bool,
                    max_operations: int = DEFAULT_MAX_OPERATIONS, block: int = 0,
                    points_inside: bool = False, kept: bool = True) -> PolyModel:
    """The kernel's schedule tree: a fused kernel's loop structure from its fusion
    decisions (`fusion_tree`, with column blocks of `block` and, with `kept`, the kept
    axes where they apply, statements
    of one instance inside the loops after them with `points_inside`), a single
    node's from isl's scheduler, its bands' contiguous members moved innermost
    (`interchange`). Raises `budget.OutOfOperations` when isl's scheduler runs past
    `max_operations`."""
    if fused:
        return model.with_schedule(fusion_schedule(model, statements, block, points_inside,
                                                   kept))
    return interchange_for_locality(isl_schedule(model, max_operations=max_operations))


def original_order(model: PolyModel, statements: tuple[Statement, ...]) -> PolyModel:
    """The fallback when isl's scheduler is out of budget: every statement in its own
    loop order, those that share a loop under one band (the structure `fusion_tree`
    builds from the dependences, in time linear in them), each band's permutable and
    coincident flags from the dependences, so tiling and parallel loops still apply.

        matmul: band(i, j) -> sequence[ {init}, band(k){update} ]
    """
    return model.with_schedule(fusion_schedule(model, statements))


def isl_schedule(model: PolyModel, *, max_operations: int = DEFAULT_MAX_OPERATIONS) -> PolyModel:
    """Compute a schedule tree respecting every dependence with isl's scheduler.

    Validity and coincidence constraints are all dependences (coincident band members
    are then exactly the parallel loops); proximity is the flow and read-after-read
    pairs, so that a consumer is pulled next to its producer and siblings next to each
    other. Scheduling whole components (not strongly connected pieces first) is what
    lets isl find one outer loop shared by a reduction and its consumers.
    """
    ctx = model.domain.get_ctx()
    ctx.set_schedule_whole_component(1)
    with isl_operations(ctx, max_operations):
        sc = (isl.ScheduleConstraints.on_domain(model.domain)
              .set_validity(model.dependences)
              .set_coincidence(model.dependences)
              .set_proximity(model.flow.union(model.input)))
        schedule = sc.compute_schedule()
    return model.with_schedule(schedule)
