"""Budgets: how much fusion, scheduling and tiling may spend before they fall back.

Each of the three stages has two budgets, both options (so both are in the cache key):

- isl operations (`max_operations`), per isl question: one fusion proposal, one
  kernel's scheduler, one kernel's tile-size search. isl counts its own operations and
  stops a call past the limit, so this budget is the same on every machine.
- wall seconds (`fuse_seconds`, `schedule_seconds`, `tile_seconds`), per compile: what
  the stage may spend over all its proposals or kernels (a symbolic compile's probes
  each have their own, `Ledger.for_probe`). islpy holds the GIL through a
  call, so nothing can stop one from outside: the clock is read between isl questions,
  and once a stage has spent its seconds the questions left get the fallback unasked.

A stage out of budget falls back to a cheaper answer that is still correct:

    fuse      the proposal is not merged (groups stay smaller; a node never merged is a
              kernel of its own)
    schedule  the original order: each statement in its own loop order, bands and their
              flags from the dependences (`fusion_tree`), without isl's scheduler
    tile      default tile sizes instead of the search over isl's footprint counts

Every fallback is a line of the compile report, and the compile lists them
(`CompiledGraph.fallbacks`). A wall-time fallback depends on the machine's speed and
load; the result is correct and is cached under the budgets that produced it, so a
compile with a larger budget is a different key and is never served it.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import islpy as isl

from .options import STAGES

# isl's message when a call ran past `set_max_operations`
_EXCEEDED = "maximal number of operations exceeded"


class OutOfOperations(Exception):
    """An isl question ran past its operation budget."""


@contextmanager
def isl_operations(ctx: isl.Context, limit: int) -> Iterator[None]:
    """Run the body's isl calls on `ctx` under `limit` operations (counted afresh; 0: no
    limit); past it they raise `OutOfOperations`. The context is unlimited again
    afterwards: the passes after a budgeted question must not trip over what it spent."""
    ctx.set_max_operations(limit)
    ctx.reset_operations()
    try:
        yield
        # not every isl call that runs out says so (a count can come back empty, an
        # error in a callback is only printed): a body that ran past the limit may
        # have computed on wrong values, so its answer is not used
        if limit and _past_limit(ctx):
            raise OutOfOperations(f"isl ran past options.max_operations ({limit})")
    except OutOfOperations:
        raise
    except Exception:
        if limit and _past_limit(ctx):
            raise OutOfOperations(f"isl ran past options.max_operations ({limit})") from None
        raise
    finally:
        ctx.set_max_operations(0)


def _past_limit(ctx: isl.Context) -> bool:
    """Has `ctx` run past its operation limit? Then every further call fails."""
    try:
        isl.Set.read_from_str(ctx, "{ [i] : 0 <= i < 2 }")
    except isl.Error as e:
        return _EXCEEDED in str(e)
    return False


_once = threading.local()  # seconds this thread has spent in `once` blocks


def _once_seconds() -> float:
    return getattr(_once, "seconds", 0.0)


@contextmanager
def once() -> Iterator[None]:
    """Work done once per machine, whichever stage it falls in (the cpu target's gemm
    kernel calibration, `calibrate.rates`): no stage's budget pays for it. A new
    machine's first compile had spent most of its 20 s of fusion building and timing
    every gemm kernel (16.7 s), and a slower host would have fused nothing."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _once.seconds = _once_seconds() + time.perf_counter() - start


@dataclass
class Ledger:
    """The wall seconds each stage may spend in one compile and has spent, and the
    fallbacks taken: the one record the stages of a compile share as they go, so it is
    mutable (unlike the IR)."""

    seconds: dict[str, float]  # stage -> budget
    spent: dict[str, float] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)

    @staticmethod
    def of(options) -> "Ledger":
        return Ledger({s: getattr(options, f"{s}_seconds") for s in STAGES})

    def for_probe(self) -> "Ledger":
        """The ledger of one probe of a symbolic compile: each probe is a compile with
        budgets of its own (shared, 20 s of fusion went over a transformer block's 18
        probes, and on a loaded host the last probes fused nothing, so they disagreed and
        the block was compiled per shape), its fallbacks recorded with this one's."""
        return Ledger(self.seconds, fallbacks=self.fallbacks)

    def left(self, stage: str) -> float:
        return self.seconds[stage] - self.spent.get(stage, 0.0)

    def exhausted(self, stage: str) -> bool:
        return self.left(stage) <= 0

    @contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        start, before = time.perf_counter(), _once_seconds()
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (_once_seconds() - before)
            self.spent[stage] = self.spent.get(stage, 0.0) + spent

    def out_of_time(self, stage: str) -> str:
        """Why a question of `stage` is not asked (for its fallback line)."""
        return (f"the {stage} budget of {self.seconds[stage]:g} s (options.{stage}_seconds) "
                "is spent")

    def fell_back(self, line: str) -> str:
        """Record a fallback (the line names the stage, what ran out and what was done
        instead) and return it, for the report. A kernel whose passes run again
        (`recompute`) falls back again the same way: that is one fallback."""
        if line not in self.fallbacks:
            self.fallbacks.append(line)
        return line
