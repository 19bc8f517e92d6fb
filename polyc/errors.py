"""The two kinds of error polyc raises (after Halide's user_error / internal_error).

A `GraphError` is the client's fault: it names the node, the op and the field so the
message can be shown as is by the CLI and turned into a 4xx by the service. An
`InternalError` is polyc's fault: it names the pass that failed.
"""
from __future__ import annotations

from dataclasses import dataclass


class PolycError(Exception):
    """Base of every error polyc raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a subgraph: where it is (node, field) and what is wrong."""

    message: str
    node: str | None = None
    op: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = []
        if self.node is not None:
            where.append(f"node '{self.node}'" + (f" ({self.op})" if self.op else ""))
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return (": ".join(where) + ": " if where else "") + self.message


class GraphError(PolycError, ValueError):
    """The subgraph is invalid. `problems` lists every problem found, in order."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = Problem(problems)
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


class NoTiling(GraphError):
    """No tiling of a kernel fits the target's memory, `tensor` (a tensor of the kernel)
    taking the most of it: a kernel of several nodes may be split where it passes."""

    def __init__(self, problem: Problem, tensor: str, reason: str):
        super().__init__(problem)
        self.tensor, self.reason = tensor, reason


class BuildError(PolycError):
    """The C compiler rejected generated code. Always a polyc bug, never the client's."""


class BuildInterrupted(PolycError):
    """The C compiler was killed by a signal (an operator, the OOM killer): neither the
    code's fault nor the client's; building again may well succeed."""


class InternalError(PolycError):
    """A pass broke an invariant. Names the pass so the dump of its input can be found."""

    def __init__(self, pass_name: str, message: str):
        self.pass_name = pass_name
        super().__init__(f"internal error in pass '{pass_name}': {message}")
