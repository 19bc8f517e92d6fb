"""The one record a kernel's passes hand each other, and what a pass is.

A pass is a function `(state, machine, options) -> state`. The state carries the kernel
(its statements and arrays, whose buffer plans `contract` fills in), the polyhedral model
(its `schedule` is the current tree), the tree after each pass that changed it (named by
that pass: what the service and the browser view show), the report lines of every
decision, the copies between memory levels `promote` planned, and the compile's budgets
(`budget.Ledger`, the one part shared by every kernel of a compile). A pass that rewrites
the kernel's statements (`recompute`) asks for the passes to run again from the first
(`rewritten`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import islpy as isl

from ..kernel import Kernel
from . import marks
from .model import PolyModel
from .tree import schedule_to_json, schedule_to_text

if TYPE_CHECKING:
    from ..budget import Ledger
    from ..machine import Machine
    from ..options import Options
    from .promotion import Promotion


@dataclass(frozen=True)
class KernelState:
    kernel: Kernel
    ctx: isl.Context  # the kernel's own, or the compile's whose fusion oracle modelled it
    fusion: tuple[str, ...] = ()  # the fusion proposals that concern its nodes
    decisions: tuple[str, ...] = ()  # each pass's, in order
    model: PolyModel | None = None
    trees: tuple[tuple[str, isl.Schedule], ...] = ()  # (pass, tree after it)
    promotions: tuple["Promotion", ...] = ()
    restart: bool = False  # the statements changed: run the passes again
    # the compile's budgets, shared by its kernels (None: the options' budgets afresh)
    ledger: "Ledger | None" = field(default=None, compare=False)

    @property
    def schedule(self) -> isl.Schedule:
        return self.model.schedule

    def with_schedule(self, schedule: isl.Schedule) -> "KernelState":
        return replace(self, model=self.model.with_schedule(schedule))

    def note(self, *lines: str) -> "KernelState":
        return replace(self, decisions=self.decisions + lines)

    def rewritten(self, kernel: Kernel, *lines: str) -> "KernelState":
        """A fresh start on new statements: the passes run again from the first (their
        decisions too), these lines kept."""
        return KernelState(kernel, self.ctx, self.fusion, lines, restart=True,
                           ledger=self.ledger)

    def marks(self, kind: type[marks.Mark]) -> list[marks.Mark]:
        """The current tree's marks of one kind, outermost first."""
        found: list[marks.Mark] = []

        def visit(node: dict) -> None:
            if "mark" in node and marks.word(node["mark"]) == kind.word:
                found.append(marks.parse(node["mark"]))
            for child in node["children"]:
                visit(child)

        visit(schedule_to_json(self.schedule))
        return found

    def show(self) -> str:
        """The state as text: the current tree, or the kernel before there is one."""
        if self.model is not None and self.model.schedule is not None:
            return schedule_to_text(self.schedule)
        if self.model is not None:
            return str(self.model)
        return str(self.kernel)


Run = Callable[[KernelState, "Machine", "Options"], KernelState]


@dataclass(frozen=True)
class Pass:
    name: str
    run: Run
    changes_schedule: bool = False  # its tree is kept, and checked against every dependence
    verify: bool = True  # (a pass that only adds statements of its own, e.g. copies, is not)
