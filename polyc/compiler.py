"""The pipeline of DESIGN.md as one readable function, and what it returns.

    graph    load -> widen (float16, bfloat16 computed in float32) -> decompose -> simplify
             -> unshare (each reader of a widened storage tensor casts it itself)
             -> fuse (each proposal asked of the oracle) -> kernels
    kernel   the neutral passes (model, dependences, schedule: `schedule_tree.passes`)
             then the target's (`targets.<name>`), each `(state, machine, options) ->
             state`, every tree checked against every dependence -> the target's codegen
    unit     the target's prelude + one C function per kernel -> its toolchain -> a
             program that runs on numpy arrays

Each pass is recorded by a `Trace`: its printed output and its time, so that
`--print-after-all`, the dump folder and the browser view all read the same record. The
trace also carries the compile's budgets (`budget.Ledger`): fusion, scheduling and
tiling each fall back to a cheaper correct answer once theirs is spent, and say so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import islpy as isl
import numpy as np

from . import targets
from .budget import Ledger
from .codegen.build import build_shared_object
from .errors import GraphError, InternalError, NoTiling, Problem
from .graph.decompose import decompose_graph
from .graph.fuse import FusionPlan, fuse_graph
from .graph.ir import Graph
from .graph.load import Limits, load_graph
from .graph.simplify import simplify_graph
from .graph.symbols import user_symbols
from .graph.storage import unshare_widening, widen_storage
from .graph.verify import verify_graph
from .kernel import Kernel, build_kernels
from .kernel.comprehension import loads
from .machine import Machine
from .options import Options as CommonOptions
from .schedule_tree import marks as mk
from .schedule_tree.dependences import respects_dependences
from .schedule_tree.group_models import GroupModels
from .schedule_tree.model import PolyModel
from .schedule_tree.oracle import Microkernels, ask_fusion, ask_parallel
from .schedule_tree.passes import NEUTRAL
from .schedule_tree.promotion import Promotion
from .schedule_tree.state import KernelState, Pass
from .schedule_tree.tree import schedule_to_json, schedule_to_text
from .symbolic import compile_symbolic
from .targets.backend import Backend
from .targets.cpu.options import CpuOptions
from .tiling.tile import TILE

Options = CpuOptions  # the default target's options (`polyc.Options`)


@dataclass
class Trace:
    """The printed IR after each pass and the time it took, in pipeline order, and what
    the budgeted stages have spent."""

    echo: Callable[[str], None] | None = None  # --print-after-all
    dump_dir: Path | None = None
    ledger: Ledger = field(default_factory=lambda: Ledger.of(CommonOptions()))
    passes: list[tuple[str, str, float]] = field(default_factory=list)
    # a list: `run_passes` leaves its trees' dependence checks there, made while gcc
    # builds the unit (`translate`; they were a tenth of linear+gelu's compile)
    checks: list[tuple[PolyModel, isl.Schedule, str]] | None = None

    def run(self, name: str, fn: Callable[..., Any], *args, show=str, **kw) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kw)
        seconds = time.perf_counter() - start
        text = show(result)
        self.passes.append((name, text, seconds))
        if self.echo:
            self.echo(f"// ----- IR after {name} ({seconds * 1e3:.1f} ms) -----\n{text}\n")
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            safe = name.replace(" ", "_").replace("/", "_")
            (self.dump_dir / f"{len(self.passes):02d}_{safe}.txt").write_text(text + "\n")
        return result

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per stage, summed over every kernel."""
        return self.timings_of(None)

    def timings_of(self, kernel: str | None) -> dict[str, float]:
        """Seconds per stage of one kernel's passes (named "<pass> <kernel>"), or of the
        whole compile when `kernel` is None."""
        out: dict[str, float] = {}
        for name, _, seconds in self.passes:
            stage, _, of = name.partition(" ")
            if kernel is None or of == kernel:
                out[stage] = out.get(stage, 0.0) + seconds
        return out


def dims_json(shape: tuple) -> list:
    """A shape for JSON: a symbolic dim as its expression's text, in the user's names."""
    return [d if type(d) is int else str(user_symbols(d)) for d in shape]


@dataclass(frozen=True)
class KernelResult:
    """One generated C function: what it covers and the schedule trees that made it."""

    kernel: Kernel
    model: PolyModel
    schedule: isl.Schedule  # final, with the target's marks
    fusion_report: tuple[str, ...]  # fusion proposals about its nodes, then each pass's lines
    trees: tuple[tuple[str, isl.Schedule], ...] = ()  # (pass, the tree after it)
    promotions: tuple[Promotion, ...] = ()  # copies between memory levels

    @property
    def name(self) -> str:
        return self.kernel.name

    def marks(self, kind: type[mk.Mark]) -> list[mk.Mark]:
        """Its final tree's marks of one kind, outermost first."""
        found: list[mk.Mark] = []

        def visit(node: dict) -> None:
            if "mark" in node and mk.word(node["mark"]) == kind.word:
                found.append(mk.parse(node["mark"]))
            for child in node["children"]:
                visit(child)

        visit(schedule_to_json(self.schedule))
        return found

    @property
    def microkernels(self) -> list[str]:
        """The hand-written kernels its marks call, e.g. ['sgemm_avx2_6x16'] (a Winograd
        convolution's: its transforms', then its products')."""
        winograd = [name for m in self.marks(mk.Winograd) for name in (m.transforms, m.kernel)]
        return list(dict.fromkeys(winograd + [m.kernel for m in self.marks(mk.Microkernel)]))

    def provenance(self) -> list[dict]:
        """Per statement: the primitive node it computes (S<j> is the kernel's j-th node),
        the node and composite op it came from, the tensor it writes and those it reads:
        what links a tree node, a line of C and a node of the graph in the browser view."""
        out = []
        for s in self.kernel.statements:
            head = s.name.split("_")[0][1:]
            node = self.kernel.nodes[int(head)] if head.isdigit() else None
            out.append({"statement": s.name, "node": node, "origin": s.origin,
                        "writes": s.target,
                        "reads": sorted({load.tensor for load, _ in loads(s.expr)})})
        return out

    def to_json(self) -> dict:
        return {
            "name": self.kernel.name,
            "nodes": list(self.kernel.nodes),
            "statements": [str(s) for s in self.kernel.statements],
            "arrays": [{"tensor": a.tensor, "c_name": a.c_name, "role": a.role,
                        "shape": dims_json(a.type.shape), "dtype": a.type.dtype}
                       for a in self.kernel.arrays],
            "dependences": str(self.model.dependences),
            "schedule_tree": schedule_to_json(self.schedule),
            "schedule_text": schedule_to_text(self.schedule),
            "trees": {name: schedule_to_json(tree) for name, tree in self.trees},
            "fusion_report": list(self.fusion_report),
            "provenance": self.provenance(),
            "microkernels": self.microkernels,
            "promotions": [str(p) for p in self.promotions],
            # the same, as fields: the browser view draws each copy at its place in the tree
            "promoted": [{"buffer": p.buffer, "array": p.array, "level": p.level,
                          "direction": p.direction, "shape": list(p.extents),
                          "bytes": p.bytes, "layout": p.layout, "at": p.at,
                          "statements": list(p.statements)}
                         for p in self.promotions],
            "buffers": {a.tensor: dims_json(a.buffer_shape) for a in self.kernel.arrays
                        if a.kept is not None},
        }


@dataclass
class CompiledGraph:
    graph: Graph  # as loaded
    primitive: Graph  # after decomposition and simplification
    target: str
    options: CommonOptions
    fusion: FusionPlan
    kernels: tuple[KernelResult, ...]
    c_source: str
    trace: Trace
    machine: Machine | None = None
    program: Any = None  # what runs it; None when built with build=False

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """Each budget that ran out and what was done instead (`budget.py`), in order."""
        return tuple(self.trace.ledger.fallbacks)

    def __call__(self, out: Mapping[str, np.ndarray] | None = None, **inputs) -> dict[str, np.ndarray]:
        if self.program is None:
            raise GraphError("this graph was compiled with build=False and cannot run")
        return self.program(inputs, out)

    def profile(self, **inputs) -> dict:
        """Run once on a simulated target and return its profile (DESIGN.md: outputs,
        cycles, flops, peak_fraction, bytes, transfers, high_water)."""
        if self.program is None:
            raise GraphError("this graph was compiled with build=False and cannot run")
        if not self.program.simulated:
            raise GraphError(f"target {self.target!r} runs on the host: it has no simulated "
                             "profile (time it instead)")
        return self.program.profile(inputs)


def run_passes(state: KernelState, passes: tuple[Pass, ...], machine: Machine,
               options: CommonOptions, trace: Trace) -> KernelState:
    """Every pass in order; each tree a pass changed is kept under its name and, with
    `options.verify`, checked against every dependence (now, or by `compile` later:
    `Trace.checks`). A pass that rewrote the statements (`state.restart`) has them run
    again from the first."""
    k = state.kernel.name
    checked = None  # the last tree's check, for `_verify`
    for p in passes:
        before = state.model.schedule if state.model is not None else None
        state = trace.run(f"{p.name} {k}", p.run, state, machine, options,
                          show=KernelState.show)
        if state.restart:
            return run_passes(replace(state, restart=False), passes, machine, options, trace)
        if p.changes_schedule and not (before is not None and before.plain_is_equal(state.schedule)):
            state = replace(state, trees=state.trees + ((p.name, state.schedule),))
            if options.verify and p.verify:
                if trace.checks is not None:
                    trace.checks.append((state.model, state.schedule, f"{p.name} {k}"))
                else:
                    checked = _verify(state.model, state.schedule, f"{p.name} {k}", checked)
    return state


def compile_kernel(kernel: Kernel, fusion: tuple[str, ...], backend: Backend, machine: Machine,
                   options: CommonOptions, trace: Trace, codegen: bool = True,
                   models: GroupModels | None = None) -> tuple[KernelResult, str]:
    """The per-kernel half of the pipeline: the passes, then the target's C (none without
    `codegen`: a symbolic compile's probes only decide). The model and dependences the
    fusion oracle built for the kernel's group (`models`) are taken as they are."""
    known = models.known(kernel) if models is not None else None
    if known is not None:
        state = KernelState(kernel, models.ctx, fusion, model=known, ledger=trace.ledger)
    else:
        state = KernelState(kernel, isl.Context(), fusion, ledger=trace.ledger)
    state = run_passes(state, NEUTRAL + backend.passes(), machine, options, trace)
    code, lines = (trace.run(f"codegen {kernel.name}", backend.codegen, state, machine, options,
                             show=lambda result: result[0]) if codegen else ("", ()))
    report = state.fusion + state.decisions + lines
    return KernelResult(state.kernel, state.model, state.schedule, report, state.trees,
                        state.promotions), code


def fusion_options(options: CommonOptions) -> tuple:
    """What `plan_fusion` and the backend's `microkernels` read of the options: compiles of
    one graph that agree on it fuse alike."""
    return (options.fuse, options.fuse_force, options.fuse_forbid, options.max_operations,
            options.fuse_seconds, options.microkernels, options.tail_contraction)


def plan_fusion(graph: Graph, machine: Machine, microkernels: Microkernels,
                options: CommonOptions, ledger: Ledger, models: GroupModels,
                apart: tuple[tuple[str, str, str], ...] = ()) -> FusionPlan:
    """The graph layer's partition, every proposal answered by the oracle within the
    fusion budgets; each proposal builds on the groups' `models`; the pairs `apart`
    (node, node, why) are not merged."""
    if not options.fuse:
        return FusionPlan(tuple((n.name,) for n in graph.nodes), (), ())
    ops = options.max_operations
    # a forced pair needs only legality: losing a microkernel is a cost the person chose
    return fuse_graph(graph, lambda g, a, b: ask_fusion(g, a, b, machine, microkernels,
                                                        max_operations=ops, models=models),
                      force=options.fuse_force, forbid=options.fuse_forbid, apart=apart,
                      force_oracle=lambda g, a, b: ask_fusion(g, a, b, machine, models=models),
                      parallel=lambda g, a, b: ask_parallel(g, a, b, machine, microkernels,
                                                          models=models),
                      ledger=ledger)


def _check_kernel_edits(options: CommonOptions, kernels: tuple[Kernel, ...],
                        backend: Backend) -> None:
    """Every kernel an option names exists (`Options.named_kernels`), and a pass of this
    target reads `kernel_tile_sizes` (the chip targets size their tiles from the
    scratchpads)."""
    if options.kernel_tile_sizes and TILE not in backend.passes():
        raise GraphError(Problem(f"does not apply to target {backend.name!r}: its tiles are "
                                 "sized from its scratchpads", field="options.kernel_tile_sizes"))
    names = [k.name for k in kernels]
    problems = [Problem(f"no kernel is named {name!r} (kernels: {', '.join(names)})",
                        field=f"options.{field}")
                for field, name in options.named_kernels() if name not in names]
    if problems:
        raise GraphError(problems)


def _verify(model: PolyModel, schedule: isl.Schedule, where: str,
            checked: tuple | None = None) -> tuple:
    """Check `schedule` against every dependence of `model`; returns what `checked`
    takes at the next call. The check reads only the schedule's map: a tree that maps
    every instance as the tree checked before did, against the same dependences (a
    pass that added marks only), holds too, without asking again."""
    order = schedule.get_map()
    deps = (model.domain, model.flow, model.anti, model.output)
    if checked is not None and all(x is y for x, y in zip(checked[0], deps)) \
            and checked[1].is_equal(order):
        return checked
    violated = respects_dependences(model, order)
    if not violated.is_empty():
        raise InternalError(where, f"schedule violates dependences {violated}")
    return deps, order


def _verify_all(checks: list[tuple[PolyModel, isl.Schedule, str]]) -> None:
    """`_verify` on each tree in the order the passes made them."""
    checked = None
    for model, schedule, where in checks:
        checked = _verify(model, schedule, where, checked)


def compile_graph(loaded: Graph, backend: Backend, machine: Machine, options: CommonOptions,
                  trace: Trace, codegen: bool = True, fused: dict | None = None,
                  apart: tuple[tuple[str, str, str], ...] = ()
                  ) -> tuple[Graph, FusionPlan, list[KernelResult], list[str]]:
    """A static graph through every pass up to C: the primitive graph, the fusion plan,
    each kernel's result and its C function (see `compile_kernel` for `codegen`).
    `fused` keeps the primitive graph, its group models and fusion plan by the options
    fusion reads (`fusion_options`), for the next compile of this graph: a symbolic
    compile's probe compiled again with other tiles or kernels fuses as before.

    A kernel of several nodes that no tiling of the target fits (`NoTiling`) is split:
    the graph is fused again with the tensor that took the most of it passing between
    kernels (its producer kept `apart` from its readers there), the fusion report saying
    why."""
    key = (fusion_options(options), apart)
    if fused is not None and key in fused:
        g, models, plan = fused[key]
    else:
        g = trace.run("widen", widen_storage, loaded)
        g = trace.run("decompose", decompose_graph, g, normalise_after=options.tail_contraction)
        g = trace.run("simplify", simplify_graph, g)
        g = trace.run("unshare", unshare_widening, g)
        if options.verify:
            verify_graph(g, "decompose/simplify")
        # fusion needs the primitive graph: only opened composites can share loops
        models = GroupModels(g)
        plan = trace.run("fuse", plan_fusion, g, machine, backend.microkernels(machine, options),
                         options, trace.ledger, models, apart)
        if fused is not None:
            fused[key] = g, models, plan
    kernels = trace.run("kernels", build_kernels, g, plan.groups,
                        show=lambda ks: "\n\n".join(map(str, ks)))
    _check_kernel_edits(options, kernels, backend)
    results, functions = [], []
    for kernel in kernels:
        try:
            result, code = compile_kernel(kernel, plan.report_for(kernel.nodes), backend,
                                          machine, options, trace, codegen, models)
        except NoTiling as e:
            split = _split_at(g, kernel, e)
            if not split or set(split) <= set(apart):
                raise
            return compile_graph(loaded, backend, machine, options, trace, codegen, fused,
                                 apart + split)
        results.append(result)
        functions.append(code)
    return g, plan, results, functions


def _split_at(graph: Graph, kernel: Kernel, e: NoTiling) -> tuple[tuple[str, str, str], ...]:
    """The pairs of `kernel`'s nodes between `e.tensor`'s producer and its readers, with
    why they are kept apart (none when the kernel does not produce it)."""
    producer = next((n for n in graph.nodes if n.output == e.tensor and n.name in kernel.nodes),
                    None)
    if producer is None:
        return ()
    return tuple((producer.name, n.name, e.reason) for n in graph.nodes
                 if n.name in kernel.nodes and e.tensor in n.inputs)


def translate(graph: Graph | dict | str | Path, target: str | Machine = "cpu", *,
              options: CommonOptions | Mapping[str, Any] | None = None,
              limits: Limits = Limits(),
              print_after_all: Callable[[str], None] | None = None,
              dump_dir: str | Path | None = None) -> tuple[CompiledGraph, Callable[[], None]]:
    """Everything `compile` does up to the C (the result has no program), and the check
    of its schedules against their dependences still to make: a caller that builds the
    C makes it while gcc runs (`codegen.build.compile_c(during=)`), before it uses what
    gcc built."""
    backend = targets.backend(target.name if isinstance(target, Machine) else target)
    machine = target if isinstance(target, Machine) else backend.machine()
    options = backend.options(options)
    trace = Trace(print_after_all, Path(dump_dir) if dump_dir else None, Ledger.of(options),
                  checks=[])
    loaded = graph if isinstance(graph, Graph) else trace.run("load", load_graph, graph, limits=limits)
    try:
        if loaded.symbols:  # one compile for every value of the symbols
            g, plan, parts, functions, options = compile_symbolic(
                loaded, backend, machine, options, trace, compile_graph=compile_graph,
                quiet_trace=lambda: Trace(ledger=trace.ledger.for_probe()))
            results = [KernelResult(kernel, model, model.schedule, report, trees)
                       for kernel, model, report, trees in parts]
        else:
            g, plan, results, functions = compile_graph(loaded, backend, machine, options, trace)
    except Exception:
        _verify_all(trace.checks)  # a schedule that broke a dependence is the first fault
        raise
    source = backend.prelude(machine) + "\n" + "\n\n".join(functions) + "\n"
    return (CompiledGraph(loaded, g, backend.name, options, plan, tuple(results), source, trace,
                          machine), lambda: _verify_all(trace.checks))


def compile(graph: Graph | dict | str | Path, target: str | Machine = "cpu", *,
            options: CommonOptions | Mapping[str, Any] | None = None,
            limits: Limits = Limits(), build: bool = True,
            print_after_all: Callable[[str], None] | None = None,
            dump_dir: str | Path | None = None) -> CompiledGraph:
    """Compile a subgraph for `target` (a name from `targets.names()`, or a machine
    description such as `cpu_machine("x86-64-v3")`); the result runs on numpy arrays."""
    result, check = translate(graph, target, options=options, limits=limits,
                              print_after_all=print_after_all, dump_dir=dump_dir)
    if not build:
        check()
        return result
    backend = targets.backend(result.target)
    so = result.trace.run("build", build_shared_object, result.c_source,
                          backend.toolchain(result.machine), during=check)
    result.program = backend.program(result.primitive, tuple(r.kernel for r in result.kernels),
                                     so, result.machine, result.options)
    return result
