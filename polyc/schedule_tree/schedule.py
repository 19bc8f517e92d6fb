"""Scheduling a kernel with isl's scheduler (a Pluto-style algorithm) under an
operation budget, so that a schedule space too large to explore answers with an error
instead of hanging a worker."""
from __future__ import annotations

import islpy as isl

from ..errors import ScheduleTooComplex
from ..kernel.comprehension import Statement
from ..options import DEFAULT_MAX_OPERATIONS
from .fusion_tree import fusion_schedule
from .interchange import interchange_for_locality
from .model import PolyModel


def schedule_kernel(model: PolyModel, statements: tuple[Statement, ...], *, fused: bool,
                    max_operations: int = DEFAULT_MAX_OPERATIONS, block: int = 0) -> PolyModel:
    """The kernel's schedule tree: a fused kernel's loop structure from its fusion
    decisions (`fusion_tree`, with column blocks of `block` where they apply), a single
    node's from isl's scheduler, its bands' contiguous members moved innermost
    (`interchange`)."""
    if fused:
        return model.with_schedule(fusion_schedule(model, statements, block))
    return interchange_for_locality(isl_schedule(model, max_operations=max_operations))


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
    ctx.set_max_operations(max_operations)
    ctx.reset_operations()
    try:
        sc = (isl.ScheduleConstraints.on_domain(model.domain)
              .set_validity(model.dependences)
              .set_coincidence(model.dependences)
              .set_proximity(model.flow.union(model.input)))
        schedule = sc.compute_schedule()
    except isl.Error as e:
        if "maximal number of operations exceeded" in str(e):
            raise ScheduleTooComplex(
                f"schedule too complex: isl exceeded {max_operations} operations") from None
        raise
    finally:
        ctx.set_max_operations(0)
    return model.with_schedule(schedule)
