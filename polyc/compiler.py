"""The pipeline of DESIGN.md as one readable function, and what it returns.

Each pass is recorded by a `Trace`: its printed output IR and its time, so that
`--print-after-all`, the dump folder and the browser view all read the same record.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import islpy as isl
import numpy as np

from .codegen.ast_to_c import CpuBuilder
from .codegen.build import build_shared_object
from .codegen.cexpr import PRELUDE
from .codegen.lower_cpu import mark_cpu_loops
from .codegen.runtime import Program
from .errors import GraphError, InternalError, Problem
from .graph.decompose import decompose_graph
from .graph.fuse import FusionPlan, fuse_graph
from .graph.ir import Graph
from .graph.load import Limits, load_graph
from .graph.simplify import simplify_graph
from .graph.verify import verify_graph
from .kernel import Kernel, build_kernels, recompute_locals
from .microkernels import registry
from .microkernels.match import map_microkernels
from .schedule_tree.contract import contract_arrays
from .schedule_tree.fusion_tree import column_block
from .schedule_tree.oracle import ask_fusion, block_capacity, element_bytes
from .schedule_tree.prologue import recomputable
from .target import Target, get_target
from .tiling.tile import tile_bands
from .schedule_tree.dependences import compute_dependences, respects_dependences
from .schedule_tree.model import PolyModel, build_model
from .schedule_tree.schedule import DEFAULT_MAX_OPERATIONS, schedule_kernel
from .schedule_tree.tree import schedule_to_json, schedule_to_text

TARGETS = ("cpu",)
MAX_THREADS = 1024  # an OpenMP team; more is a typo, and would spawn them all
MAX_TILE = 1 << 30  # tile sizes stay C ints
ISAS = ("", *registry.ISAS)  # microkernel_isa: '' is the fastest measured on the host
GEMM_KERNELS = ("", *(m.name for m in registry.REGISTRY if m.kind == "gemm"))


@dataclass(frozen=True)
class Options:
    """Every option that changes the generated code (and so the cache key)."""

    parallel: bool = True  # OpenMP threads over outer parallel loops
    max_operations: int = DEFAULT_MAX_OPERATIONS  # isl's budget per kernel
    verify: bool = True  # check every schedule against every dependence
    fuse: bool = True  # let the graph layer fuse nodes (else one kernel per node)
    tile: bool = True  # tile permutable bands to fit the target's fastest memory
    tile_sizes: tuple[int, ...] | None = None  # explicit sizes instead of the memory model's
    microkernels: bool = True  # contractions and row reductions onto polyc/microkernels
    microkernel_isa: str = ""  # '' the fastest measured, else 'avx512' | 'avx2' | 'portable'
    gemm_kernel: str = ""  # '' the fastest measured for the shape, else a registry name
    microkernel_tiles: tuple[tuple[str, int], ...] = ()  # (("kc", 256),): over model and tuning
    # the OpenMP team of every parallel loop (0: OMP_NUM_THREADS; column sums are then
    # blocked for one thread per core)
    threads: int = 0

    def __post_init__(self):
        tiles_ok = all(len(t) == 2 and t[0] in ("mc", "nc", "kc") and 1 <= t[1] <= MAX_TILE
                       for t in self.microkernel_tiles)
        checks = (
            ("threads", 0 <= self.threads <= MAX_THREADS,
             f"must be 0 (OMP_NUM_THREADS) to {MAX_THREADS}, got {self.threads}"),
            ("max_operations", self.max_operations >= 1,
             f"must be at least 1, got {self.max_operations}"),
            ("microkernel_isa", self.microkernel_isa in ISAS,
             f"must be one of {', '.join(map(repr, ISAS))}, got {self.microkernel_isa!r}"),
            ("gemm_kernel", self.gemm_kernel in GEMM_KERNELS,
             f"must be one of {', '.join(map(repr, GEMM_KERNELS))}, got {self.gemm_kernel!r}"),
            ("tile_sizes", all(1 <= t <= MAX_TILE for t in self.tile_sizes or ()),
             f"sizes must be 1 to {MAX_TILE}, got {list(self.tile_sizes or ())}"),
            ("microkernel_tiles", tiles_ok, "must be pairs of 'mc', 'nc' or 'kc' and a size "
             f"1 to {MAX_TILE}, got {[list(t) for t in self.microkernel_tiles]}"),
        )
        problems = [Problem(message, field=f"options.{name}") for name, ok, message in checks
                    if not ok]
        if problems:
            raise GraphError(problems)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Options":
        """The options `to_json` wrote (JSON has arrays where Options has tuples)."""
        doc = dict(doc)
        if doc.get("tile_sizes") is not None:
            doc["tile_sizes"] = tuple(doc["tile_sizes"])
        doc["microkernel_tiles"] = tuple(tuple(t) for t in doc.get("microkernel_tiles", ()))
        return cls(**doc)

    def to_json(self) -> dict:
        return {"parallel": self.parallel, "max_operations": self.max_operations,
                "verify": self.verify, "fuse": self.fuse, "tile": self.tile,
                "tile_sizes": list(self.tile_sizes) if self.tile_sizes else None,
                "microkernels": self.microkernels, "microkernel_isa": self.microkernel_isa,
                "gemm_kernel": self.gemm_kernel,
                "microkernel_tiles": [list(t) for t in self.microkernel_tiles],
                "threads": self.threads}


@dataclass
class Trace:
    """The printed IR after each pass and the time it took, in pipeline order."""

    echo: Callable[[str], None] | None = None  # --print-after-all
    dump_dir: Path | None = None
    passes: list[tuple[str, str, float]] = field(default_factory=list)

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
        out: dict[str, float] = {}
        for name, _, seconds in self.passes:
            stage = name.split(" ")[0]
            out[stage] = out.get(stage, 0.0) + seconds
        return out


@dataclass(frozen=True)
class KernelResult:
    """One generated C function: what it covers and the schedule trees that made it."""

    kernel: Kernel
    model: PolyModel
    schedule: isl.Schedule  # final, with target marks
    fusion_report: tuple[str, ...]  # the fusion proposals that concern this kernel's nodes

    @property
    def name(self) -> str:
        return self.kernel.name

    def marks(self, word: str) -> list[str]:
        """The texts of its schedule tree's marks that start with `word`, outermost first,
        e.g. marks("gemm") -> ['gemm S0 sgemm_avx2_6x16 m=512 ...']."""
        found: list[str] = []

        def visit(node: dict) -> None:
            if node.get("mark", "").split(" ", 1)[0] == word:
                found.append(node["mark"])
            for child in node["children"]:
                visit(child)

        visit(schedule_to_json(self.schedule))
        return found

    @property
    def microkernels(self) -> list[str]:
        """The hand-written kernels its marks call, e.g. ['sgemm_avx2_6x16']."""
        return list(dict.fromkeys(m.split()[1] for m in self.marks("microkernel")))

    def to_json(self) -> dict:
        return {
            "name": self.kernel.name,
            "nodes": list(self.kernel.nodes),
            "statements": [str(s) for s in self.kernel.statements],
            "arrays": [{"tensor": a.tensor, "c_name": a.c_name, "role": a.role,
                        "shape": list(a.type.shape), "dtype": a.type.dtype}
                       for a in self.kernel.arrays],
            "dependences": str(self.model.dependences),
            "schedule_tree": schedule_to_json(self.schedule),
            "schedule_text": schedule_to_text(self.schedule),
            "initial_schedule_tree": schedule_to_json(self.model.schedule),
            "fusion_report": list(self.fusion_report),
            "microkernels": self.microkernels,
            "buffers": {a.tensor: list(a.buffer_shape) for a in self.kernel.arrays
                        if a.kept is not None},
        }


@dataclass
class CompiledGraph:
    graph: Graph  # as loaded
    primitive: Graph  # after decomposition and simplification
    target: str
    options: Options
    fusion: FusionPlan
    kernels: tuple[KernelResult, ...]
    c_source: str
    trace: Trace
    program: Program | None = None  # None when built with build=False

    def __call__(self, out: Mapping[str, np.ndarray] | None = None, **inputs) -> dict[str, np.ndarray]:
        if self.program is None:
            raise GraphError("this graph was compiled with build=False and cannot run")
        return self.program(inputs, out)


def compile_kernel(kernel: Kernel, report: tuple[str, ...], target: Target, options: Options,
                   trace: Trace) -> tuple[KernelResult, str]:
    """The per-kernel half of the pipeline: isl model -> schedule -> tiles -> buffers ->
    marks -> C."""
    ctx = isl.Context()  # one per kernel: the operation budget is per context
    k = kernel.name
    chosen: list[str] = []
    model, schedule, kernel = _schedule(kernel, target, options, trace, ctx, chosen)
    # a cheap elementwise local that no buffer could hold (it is read a pass later, as a
    # column softmax's exp): computed again where it is read instead of stored whole
    stored = tuple(a.tensor for a in kernel.arrays if a.role == "local" and a.kept is None
                   and recomputable(kernel.statements, a.tensor))
    if stored:
        kernel = trace.run(f"recompute {k}", recompute_locals, kernel, stored)
        report += tuple(f"{t} is computed again where it is read: no buffer of the loop "
                        "structure could hold it, and storing it whole costs a pass over "
                        "memory" for t in stored)
        chosen.clear()
        model, schedule, kernel = _schedule(kernel, target, options, trace, ctx, chosen)
    # the cpu target: parallel and simd marks
    marked = trace.run(f"lower-cpu {k}", mark_cpu_loops, schedule, kernel, model, target,
                       parallel=options.parallel, threads=options.threads, show=schedule_to_text)
    if options.verify:
        _verify(model, marked, f"lower-cpu {k}")
    ast = isl.AstBuild.from_context(isl.Set.read_from_str(ctx, "{ : }")).node_from_schedule(marked)
    builder = CpuBuilder(kernel)
    code = trace.run(f"codegen {k}", lambda: str(builder.function(ast)))
    report += tuple(f"microkernel {line}" for line in chosen)
    return KernelResult(kernel, model, marked, report + _buffer_report(kernel, builder)), code


def _schedule(kernel: Kernel, target: Target, options: Options, trace: Trace,
              ctx: isl.Context, chosen: list[str]) -> tuple[PolyModel, isl.Schedule, Kernel]:
    """model -> dependences -> schedule -> microkernels -> tile -> contract."""
    arrays = {a.tensor: a.c_name for a in kernel.arrays}
    k = kernel.name
    model = trace.run(f"model {k}", build_model, kernel.statements, arrays, ctx)
    model = trace.run(f"dependences {k}", compute_dependences, model)
    fused = len(kernel.nodes) > 1
    block = (column_block(model, kernel.statements, element_bytes(kernel),
                          block_capacity(target), target.cores) if fused else 0)
    model = trace.run(f"schedule {k}", schedule_kernel, model, kernel.statements,
                      fused=fused, max_operations=options.max_operations, block=block)
    if options.verify:
        _verify(model, model.schedule, f"schedule {k}")
    # before tiling: bands under a microkernel's marks are already tiled for its shape
    model = trace.run(f"microkernels {k}", map_microkernels, model, kernel, options=options,
                      target=target, report=chosen, show=lambda m: schedule_to_text(m.schedule))
    schedule = model.schedule
    if options.tile:
        schedule = trace.run(f"tile {k}", tile_bands, model, schedule, kernel, target,
                             sizes=options.tile_sizes, show=schedule_to_text)
        if options.verify:
            _verify(model, schedule, f"tile {k}")
    # buffers are sized on the final loop order, which tiling may have changed
    kernel = trace.run(f"contract {k}", contract_arrays, kernel, model, schedule)
    return model, schedule, kernel


def _buffer_report(kernel: Kernel, builder: CpuBuilder) -> tuple[str, ...]:
    lines = []
    for a in kernel.arrays:
        if a.kept is not None:
            shape = "x".join(map(str, a.buffer_shape)) or "1"
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: a buffer of "
                         f"{shape} element(s) per thread holds it")
        elif a in builder.unstored:
            where = ("with the partial sums of its K blocks in scratch"
                     if a.tensor in builder.microkernels.partial_sums
                     else "in registers until its consumers are applied at the write-back")
            lines.append(f"{a.tensor} ({a.type}) is not materialised in memory: the "
                         f"microkernel computes it tile by tile, {where}")
        elif a.role == "local":
            lines.append(f"{a.tensor} ({a.type}) stays inside the kernel but could not be "
                         "contracted: it is materialised whole in scratch memory")
    return tuple(lines)


def plan_fusion(graph: Graph, target: Target, options: Options) -> FusionPlan:
    """The graph layer's partition, every proposal answered by the oracle."""
    if not options.fuse:
        return FusionPlan(tuple((n.name,) for n in graph.nodes), (), ())
    return fuse_graph(graph, lambda g, a, b: ask_fusion(g, a, b, target))


def _verify(model: PolyModel, schedule: isl.Schedule, where: str) -> None:
    violated = respects_dependences(model, schedule)
    if not violated.is_empty():
        raise InternalError(where, f"schedule violates dependences {violated}")


def compile(graph: Graph | dict | str | Path, target: str | Target = "cpu", *,
            options: Options = Options(), limits: Limits = Limits(), build: bool = True,
            print_after_all: Callable[[str], None] | None = None,
            dump_dir: str | Path | None = None) -> CompiledGraph:
    """Compile a subgraph for `target` (a name, or a machine description such as
    `cpu_target("x86-64-v3")`); the result runs on numpy arrays."""
    machine = target if isinstance(target, Target) else None
    target = machine.name if machine else target
    if target not in TARGETS:
        raise GraphError(f"unknown target {target!r} (available: {', '.join(TARGETS)})")
    trace = Trace(print_after_all, Path(dump_dir) if dump_dir else None)
    loaded = graph if isinstance(graph, Graph) else trace.run("load", load_graph, graph, limits=limits)
    g = trace.run("decompose", decompose_graph, loaded)
    g = trace.run("simplify", simplify_graph, g)
    if options.verify:
        verify_graph(g, "decompose/simplify")
    # fusion needs the primitive graph: only opened composites can share loops
    machine = machine or get_target(target)
    plan = trace.run("fuse", plan_fusion, g, machine, options)
    kernels = trace.run("kernels", build_kernels, g, plan.groups,
                        show=lambda ks: "\n\n".join(map(str, ks)))
    results, functions = [], []
    for kernel in kernels:
        result, code = compile_kernel(kernel, plan.report_for(kernel.nodes), machine, options,
                                      trace)
        results.append(result)
        functions.append(code)
    source = PRELUDE + "\n" + "\n\n".join(functions) + "\n"
    program = None
    if build:
        so = trace.run("build", build_shared_object, source, machine)
        program = Program(g, tuple(r.kernel for r in results), so)
    return CompiledGraph(loaded, g, target, options, plan, tuple(results), source, trace, program)
