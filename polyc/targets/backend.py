"""What a target is to the compiler: a machine description and what it adds to the
neutral pipeline.

    machine()          the machine description the passes read (memory levels by role)
    options_type       its options (the common ones, extended)
    microkernels(...)  the fusion oracle's question: which microkernel would compute a
                       kernel's contraction (a merge must not take it away)
    passes()           the kernel passes after the neutral ones (`schedule_tree.passes`)
    codegen(...)       C for one kernel's final state, and the report lines it adds
    prelude(machine)   the C before every translation unit
    toolchain(machine) the compiler and flags that build it
    program(...)       what runs the built object on numpy arrays
    key_parts(machine) what, besides the request and the toolchain, changes its code
                       (the service's cache key)
    prepare(machine)   what a service does once at start-up, before workers compile
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..codegen.build import Toolchain
from ..errors import GraphError
from ..graph.ir import Graph
from ..kernel import Kernel
from ..machine import Machine
from ..options import Options
from ..schedule_tree.oracle import Microkernels
from ..schedule_tree.state import KernelState, Pass


class Backend:
    name: ClassVar[str] = ""
    options_type: ClassVar[type[Options]] = Options
    tunable: ClassVar[bool] = False  # `polyc tune` measures its microkernels' tiles

    def machine(self) -> Machine:
        raise NotImplementedError

    def options(self, given: Options | Mapping[str, Any] | None) -> Options:
        """`given` as this target's options: None for the defaults, a JSON object, or
        options of another target whose fields this one lacks are at their defaults."""
        if given is None:
            return self.options_type()
        if isinstance(given, Mapping):
            return self.options_type.from_json(given, self.name)
        if not isinstance(given, Options):
            raise GraphError(f"options must be an Options or a mapping, not {type(given).__name__}")
        return given.to(self.options_type, self.name)

    def microkernels(self, machine: Machine, options: Options) -> Microkernels:
        return lambda kernel, min_flops: None

    def passes(self) -> tuple[Pass, ...]:
        raise NotImplementedError

    def codegen(self, state: KernelState, machine: Machine, options: Options
                ) -> tuple[str, tuple[str, ...]]:
        raise NotImplementedError

    def prelude(self, machine: Machine) -> str:
        raise NotImplementedError

    def toolchain(self, machine: Machine) -> Toolchain:
        raise NotImplementedError

    def program(self, graph: Graph, kernels: tuple[Kernel, ...], so_path: Path,
                machine: Machine, options: Options):
        raise NotImplementedError

    def key_parts(self, machine: Machine) -> tuple[str, ...]:
        return ()

    def prepare(self, machine: Machine) -> dict[str, str]:
        """Work done once when a service starts, before its workers compile (what it
        returns is shown with the toolchain)."""
        return {}
