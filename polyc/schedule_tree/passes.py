"""The target-neutral passes of a kernel, each `(state, machine, options) -> state`.

    model        isl domain, access relations and the original order (`model.py`)
    dependences  flow, anti and output dependences with isl's dataflow (`dependences.py`)
    schedule     the loop structure: a fused kernel's from its fusion decisions, with
                 column blocks sized from the machine's block role; one node's from isl's
                 scheduler (`schedule.py`), or its original order once the scheduling
                 budget is spent (`budget.py`)
    contract     intermediates into per-iteration buffers, proved with isl (`contract.py`)
    recompute    a cheap intermediate no buffer could hold is computed again where it
                 is read: the statements change, so the passes run again

Every backend runs `NEUTRAL` first, then its own list, which reuses `CONTRACT`,
`RECOMPUTE` and tiling's `TILE` where it wants them.
"""
from __future__ import annotations

from dataclasses import replace

from ..budget import Ledger, OutOfOperations
from ..kernel import recompute_locals
from ..kernel.prologue import recomputable
from .contract import contract_arrays
from .dependences import compute_dependences
from .fusion_tree import column_block
from .model import PolyModel, build_model
from .schedule import original_order, schedule_kernel
from .state import KernelState, Pass


def element_bytes(kernel) -> dict[str, int]:
    """Bytes of one element of each array, by C name (what isl's counts are scaled by)."""
    return {a.c_name: a.type.itemsize for a in kernel.arrays}


def model_pass(state: KernelState, machine, options) -> KernelState:
    if state.model is not None:  # the fusion oracle's, with its dependences
        return state
    arrays = {a.tensor: a.c_name for a in state.kernel.arrays}
    return replace(state, model=build_model(state.kernel.statements, arrays, state.ctx))


def dependences_pass(state: KernelState, machine, options) -> KernelState:
    if state.model.flow is not None:
        return state
    return replace(state, model=compute_dependences(
        state.model, siblings_only=len(state.kernel.nodes) > 1))


def fused_schedule(state: KernelState, machine, kept: bool = True) -> PolyModel:
    """A fused kernel's model with fusion_tree's structure (linear in the dependences,
    no budget needed): column blocks sized for the machine's block role, and with `kept`
    the kept axes."""
    kernel = state.kernel
    block = column_block(state.model, kernel.statements, element_bytes(kernel),
                         machine.block_bytes, machine.cores, kept=kept)
    return schedule_kernel(state.model, kernel.statements, fused=True, block=block,
                           points_inside=machine.tile_level.managed, kept=kept)


def schedule_pass(state: KernelState, machine, options) -> KernelState:
    kernel = state.kernel
    if len(kernel.nodes) > 1:
        return replace(state, model=fused_schedule(state, machine))
    ledger = state.ledger or Ledger.of(options)
    why = ledger.out_of_time("schedule") if ledger.exhausted("schedule") else ""
    if not why:
        try:
            with ledger.timing("schedule"):
                return replace(state, model=schedule_kernel(
                    state.model, kernel.statements, fused=False,
                    max_operations=options.max_operations))
        except OutOfOperations as e:
            why = str(e)
    line = ledger.fell_back(f"schedule fallback: kernel {kernel.name}: {why}: the original "
                            "order (each statement in its own loop order) instead of isl's "
                            "scheduler")
    return replace(state, model=original_order(state.model, kernel.statements)).note(line)


def contract_pass(state: KernelState, machine, options) -> KernelState:
    return replace(state, kernel=contract_arrays(state.kernel, state.model, state.schedule))


def recompute_pass(state: KernelState, machine, options) -> KernelState:
    return recompute_stored(state)


def recompute_stored(state: KernelState, quasi: bool = False) -> KernelState:
    """The state restarted on its kernel with every local stored whole that can be
    recomputed (`recomputable`, `quasi` passed on) computed again where it is read; the
    state itself when none can be."""
    kernel = state.kernel
    stored = tuple(a.tensor for a in kernel.arrays if a.role == "local" and a.kept is None
                   and recomputable(kernel.statements, a.tensor, quasi))
    if not stored:
        return state
    lines = tuple(f"{t} is computed again where it is read: no buffer of the loop structure "
                  "could hold it, and storing it whole costs a pass over memory" for t in stored)
    return state.rewritten(recompute_locals(kernel, stored), *lines)


NEUTRAL = (Pass("model", model_pass), Pass("dependences", dependences_pass),
           Pass("schedule", schedule_pass, changes_schedule=True))
CONTRACT = Pass("contract", contract_pass)
RECOMPUTE = Pass("recompute", recompute_pass)
