"""One compile of a symbolic graph: kernels whose loop bounds are isl parameters.

    decide   the static pipeline (`compiler.compile_graph`) at a few bindings of the
             symbols (`kernel.generalise.choose_probes`): base, one per symbol, check
    general  the probes must have made the same decisions (fusion, kernels, schedule
             trees, tiles, marks); every size in the kernels is fitted as an affine
             function of the symbols (`generalise`), else the compile is refused naming
             the kernel and where
    prove    each kernel's model is built again with the symbols as isl parameters and
             their ranges as context, its dependences computed, and the probes' tree,
             set on the parametric domain, checked against them: legal for every value
    emit     isl's AST of that tree: loops bounded by the parameters (full tiles and
             the remainder), which the C function takes as int64_t arguments

The decisions (fusion, tile sizes, which loop is parallel) are those the pipeline makes
at the base probe, sizes of about a thousand; they are kept only when the other probes
make the very same ones. Microkernel marks carry sizes (`gemm ... m=N`), generalised
like the rest. When the probes differ, the graph is compiled again with tiles and gemm
blocks that do not follow the extents (`CpuOptions.balance_tiles`: a tile of 127 cuts
1019 evenly, 1009 not); when they still differ, or a microkernel's emitter decides by a
size it cannot compare, without microkernels (the portable loops, with `omp simd`);
the report says which. A parallel loop whose work depends on
the symbols runs its threads only when a call has enough work (an OpenMP `if`).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import replace

import islpy as isl

from .errors import GraphError, InternalError, Problem
from .graph.binding import bind_graph
from .graph.ir import Graph
from .graph.symbols import C_PREFIX, Tight
from .kernel import Kernel
from .kernel.comprehension import FloorDiv, Index, Mod, loads
from .kernel.generalise import NotGeneral, choose_probes, generalise
from .schedule_tree import marks as mk
from .schedule_tree.dependences import compute_dependences, respects_dependences
from .schedule_tree.model import build_model
from .schedule_tree.state import KernelState

_DOMAIN = re.compile(r'domain: "[^"]*"')
_MARK = re.compile(r'mark: "([^"]*)"')


def compile_symbolic(loaded: Graph, backend, machine, options, trace, *, compile_graph,
                     quiet_trace):
    """The primitive graph (symbolic types, the loaded graph's inputs and symbols), the
    fusion plan, per kernel (kernel, parametric model with its tree, report, trees), the
    C functions, and the options used. `compile_graph` is the static pipeline
    (`compiler.compile_graph`); `quiet_trace()` a trace for the probes after the first."""
    pipeline = (compile_graph, quiet_trace)
    if backend.name != "cpu":
        raise GraphError(Problem(f"target {backend.name!r} does not compile symbolic shapes "
                                 f"(symbols {', '.join(loaded.symbols)}): give the inputs "
                                 "static shapes for it", field="target"))
    fit_probes, probes = _probes(loaded)
    tried, failure = [], None
    for change in _FALLBACKS:
        attempt = replace(options, **change)
        if attempt in tried:
            continue
        note = () if failure is None else (
            f"symbolic shapes: {', '.join(_CHANGED[k] for k in change)} (before, "
            f"{failure.where} depended on the sizes)",)
        try:
            g, plan, results, functions = _attempt(
                loaded, probes, fit_probes, backend, machine, attempt,
                trace if not tried else quiet_trace(), note, pipeline)
        except NotGeneral as e:
            tried.append(attempt)
            failure = e
            if e.final:
                raise _refusal(loaded, e) from None
            continue
        options = attempt
        break
    else:
        raise _refusal(loaded, failure)
    # the loaded graph's inputs: each names its own symbols (a symbol assumed equal to
    # another is written as that one in the generalised types)
    primitive = replace(g, inputs=loaded.inputs, symbols=loaded.symbols,
                        assumptions=loaded.assumptions)
    return primitive, plan, results, functions, options


# what a compile changes, in turn, when the probes decide differently: tiles cut to the
# extent (1009 in 8 tiles of 127) differ at every probe, the model's sizes do not; a
# microkernel's emitter may decide by a size it cannot compare
_FALLBACKS = ({}, {"balance_tiles": False}, {"balance_tiles": False, "microkernels": False})
_CHANGED = {"balance_tiles": "tiles and gemm blocks not balanced to the extents",
            "microkernels": "microkernels off, the portable loops instead"}


def _attempt(loaded, probes, fit_probes, backend, machine, options, trace, note, pipeline):
    """Decide at the probes, generalise, prove and emit every kernel; a NotGeneral when
    the probes disagree or an emitter decides on a size it cannot compare."""
    compile_graph, quiet_trace = pipeline
    runs = [compile_graph(bind_graph(loaded, p), backend, machine, options,
                          trace if k == 0 else quiet_trace())[:3]
            for k, p in enumerate(probes)]
    g, plan, kernels, trees = _generalise(runs, fit_probes)
    ranges = ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in loaded.symbols.items())
    base = ", ".join(f"{k}={v}" for k, v in sorted(probes[0].items()))
    results, functions = [], []
    for kernel, tree, probe_result in zip(kernels, trees, runs[0][2]):
        try:
            emitted, code = trace.run(f"symbolic {kernel.name}", _emit, kernel, tree,
                                      probe_result.promotions, loaded, backend, machine,
                                      options, show=lambda r: r[1])
        except TypeError as e:  # sympy refuses `N > 0`: a choice codegen makes by size
            if "truth value of Relational" not in str(e):
                raise
            raise NotGeneral(f"kernel {kernel.name}'s code generation", ["compares sizes"])
        report = (probe_result.fusion_report + note
                  + (f"decided at {base}; schedule proved legal by isl for {ranges}",))
        results.append((kernel, emitted, report,
                        probe_result.trees + (("symbolic", emitted.schedule),)))
        functions.append(code)
    return g, plan, results, functions


def _probes(graph: Graph) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The probes of `choose_probes` over the symbols that stay free, and the same with a
    value for every symbol: a symbol the graph assumes equal to another (`Eq(M, N)`, two
    dims broadcast together) takes that one's value, so the probes satisfy it. A probe
    that breaks another assumption is refused."""
    same = {}
    for relation, _ in graph.assumptions:
        sides = [relation.lhs, relation.rhs] if relation.rel_op == "==" else []
        if sides and all(s.is_Symbol for s in sides):
            a, b = sorted(s.name for s in sides)
            same[b] = same.get(a, a)
    free = {k: r for k, r in graph.symbols.items() if k not in same}
    for k, rep in same.items():
        free[rep] = _meet(free[rep], graph.symbols[k])
    for relation, _ in graph.assumptions:  # N - 2 >= 1: the probes take N >= 3
        bound = _linear_bound(relation)
        if bound is not None and bound[0] in free:
            free[bound[0]] = _meet(free[bound[0]], bound[1])
    fit = choose_probes(free)
    full = [{**p, **{k: p[rep] for k, rep in same.items()}} for p in fit]
    for p in full:
        for relation, message in graph.assumptions:
            if not bool(relation.subs({s: p[s.name] for s in relation.free_symbols})):
                raise GraphError(Problem(f"cannot compile once for every value: {message} "
                                         "leaves no sizes to decide the code at; give static "
                                         "shapes", field="symbols"))
    return fit, full


def _meet(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo <= hi else a  # an empty range: the probes' check reports it


def _linear_bound(relation):
    """(symbol, range) a relation `c*N + d >= 0` of one symbol keeps N in, else None."""
    import sympy
    if relation.rel_op not in (">=", "=="):
        return None
    expr = sympy.expand(relation.lhs - relation.rhs)
    if len(expr.free_symbols) != 1:
        return None
    (sym,) = expr.free_symbols
    poly = sympy.Poly(expr, sym)
    if poly.degree() != 1:
        return None
    c, d = (int(v) for v in poly.all_coeffs())
    edge = sympy.Rational(-d, c)
    if relation.rel_op == "==":
        return (sym.name, (int(edge), int(edge))) if edge.is_Integer else None
    return (sym.name, (int(sympy.ceiling(edge)), 2**31 - 1) if c > 0
            else (1, int(sympy.floor(edge))))


def _refusal(graph: Graph, e: NotGeneral) -> GraphError:
    return GraphError(Problem(f"cannot compile once for every value of {', '.join(graph.symbols)}: "
                              f"the compiles at different sizes differ in {e} (not an affine "
                              "function of the symbols); give static shapes", field="symbols"))


def _generalise(runs, probes) -> tuple[Graph, object, list[Kernel], list[str]]:
    """The primitive graph (user's symbol names), the fusion plan, the kernels (the
    symbols' C names) and their trees' texts the probes agree on."""
    graphs = [r[0] for r in runs]
    g = generalise(graphs, probes, "the primitive graph")
    plan = runs[0][1]  # its report speaks of the base probe's sizes
    if len({r[1].groups for r in runs}) > 1:
        raise NotGeneral("the fusion groups", [r[1].groups for r in runs])
    if len({len(r[2]) for r in runs}) > 1:
        raise NotGeneral("the number of kernels", [len(r[2]) for r in runs])
    c_names = {name: C_PREFIX + name for name in probes[0]}  # the free symbols
    kernels, trees = [], []
    for results in zip(*(r[2] for r in runs)):
        name = results[0].kernel.name
        trees.append(_general_tree([str(r.schedule) for r in results], probes, name, c_names))
        # the cpu's copies are a microkernel's packed panels, whose size the tiles fix:
        # the same at every probe, they are used as they are (their isl footprints,
        # which codegen does not read on the cpu, stay the base probe's)
        plain = [tuple((p.buffer, p.array, p.box, p.layout, p.pad, p.element_bytes)
                       for p in r.promotions) for r in results]
        if any(p != plain[0] for p in plain):
            raise NotGeneral(f"kernel {name}'s copies between memory levels", ["differ"])
        # a contracted buffer as long as a symbol is allocated per call (and per thread)
        kernel = generalise([r.kernel for r in results], probes, f"kernel {name}", c_names)
        for s in kernel.statements:  # isl divides by constants only
            divisors = [e.d for index in (s.index, *(ld.index for ld, _ in loads(s.expr)))
                        for e in index for e in _divisions(e) if type(e.d) is not int]
            if divisors:
                raise NotGeneral(f"kernel {name}'s statement {s.name}, whose index divides "
                                 "by a size", divisors, final=True)
        kernels.append(replace(kernel, symbols=tuple(sorted(c_names.values()))))
    return g, plan, kernels, trees


def _divisions(e: Index):
    """The floor divisions and modulos in an index expression, outermost first."""
    while isinstance(e, (FloorDiv, Mod)):
        yield e
        e = e.arg


def _general_tree(texts: list[str], probes, name: str, c_names) -> str:
    """The probes' trees as one text: equal but for the domain (set later) and the sizes
    in marks (a microkernel's plan: m=N), which are generalised like the kernel's."""
    skeletons = {_MARK.sub("mark", _DOMAIN.sub("", t)) for t in texts}
    if len(skeletons) > 1:
        raise NotGeneral(f"kernel {name}'s schedule tree", ["differs"])
    per_probe = [_MARK.findall(t) for t in texts]
    general = []
    for i, words in enumerate(zip(*per_probe)):
        mark = generalise([mk.parse(w) for w in words], probes, f"kernel {name}'s mark "
                          f"{mk.word(words[0])!r}", c_names)
        fields = {f.name: Tight(v) for f in dataclasses.fields(mark)
                  if not isinstance(v := getattr(mark, f.name), (int, str, tuple))}
        general.append(str(dataclasses.replace(mark, **fields)))
    marks = iter(general)
    return _MARK.sub(lambda m: f'mark: "{next(marks)}"', texts[0])


def _emit(kernel: Kernel, tree: str, promotions, graph: Graph, backend, machine, options):
    """The kernel's parametric model with its tree, proved for every value, and its C."""
    ctx = isl.Context()
    free = {k: graph.symbols[k[len(C_PREFIX):]] for k in kernel.symbols}
    names = sorted(free)
    bounds = " and ".join(f"{lo} <= {k} <= {hi}" for k, (lo, hi) in sorted(free.items()))
    context = isl.Set.read_from_str(ctx, f"[{', '.join(names)}] -> {{ : {bounds} }}")
    arrays = {a.tensor: a.c_name for a in kernel.arrays}
    model = compute_dependences(build_model(kernel.statements, arrays, ctx, context))
    text = _DOMAIN.sub(lambda m: f'domain: "{model.domain}"', tree, count=1)
    schedule = isl.Schedule.read_from_str(ctx, text)
    violated = respects_dependences(model, schedule)
    if not violated.is_empty():
        raise InternalError(f"symbolic {kernel.name}",
                            f"the tree decided at the probes violates {violated}")
    model = model.with_schedule(_parallel_when(schedule, kernel))
    state = KernelState(kernel, ctx, model=model, promotions=promotions)
    code, _ = backend.codegen(state, machine, options)
    return model, code


def _parallel_when(schedule: isl.Schedule, kernel: Kernel) -> isl.Schedule:
    """Each `parallel` mark with the work below it, when that depends on the symbols:
    the threads were chosen at the probes' sizes, a call with too few instances to pay
    for waking them runs the loop on its own thread (an OpenMP `if`)."""
    import math

    extents = {s.name: math.prod(s.extents) for s in kernel.statements}

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.mark:
            return node
        mark = mk.parse(node.mark_get_id().get_name())
        if not isinstance(mark, mk.Parallel):
            return node
        names: list[str] = []
        node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
        work = sum(extents[n] for n in names)
        if isinstance(work, int) or not _affine(work):
            return node
        text = str(replace(mark, work=Tight(work)))
        return node.delete().insert_mark(isl.Id(text, context=node.get_ctx()))

    return schedule.map_schedule_node_bottom_up(visit)


def _affine(expr) -> bool:
    import sympy
    return sympy.Poly(expr, *expr.free_symbols).total_degree() <= 1


