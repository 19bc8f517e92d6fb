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
1019 evenly, 1009 not); when one kernel's plan still differs, or its microkernel's
emitter decides by a size it cannot compare, that kernel without microkernels
(`Options.portable_kernels`: the portable loops, with `omp simd`), then the next such
kernel; the report says which. Each kernel's gemm kernel is the one the base probe chose
(`CpuOptions.kernel_gemm`). A parallel loop whose work depends on the symbols runs its
threads only when a call has enough work (an OpenMP `if`).

Versions by size: the ranges of a graph's one or two symbols are cut into regimes
(`SPLITS`), boxes each decided at probes inside it, the largest first. A regime whose
decisions differ from those of its parent (the box above it) becomes a version of each
kernel (a function of its own, proved for its sizes); the kernel's function calls one
per call, on conditions isl writes from the versions' sizes (`_conditions`). A regime
that decides the same, or whose probes disagree, or whose fusion differs, or that comes
after `MAX_PROBE_RUNS`, joins its parent's version, and the report says why.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
from dataclasses import replace

import islpy as isl

from .errors import GraphError, InternalError, Problem
from .graph.binding import bind_graph
from .graph.ir import Graph
from .codegen.ast_to_c import dispatcher
from .graph.symbols import C_PREFIX, Tight
from .kernel import Kernel
from .kernel.comprehension import FloorDiv, Index, Mod, loads
from .kernel.generalise import NotGeneral, choose_probes, generalise
from .schedule_tree import marks as mk
from .schedule_tree.dependences import compute_dependences, respects_dependences
from .schedule_tree.model import build_model, statement_names
from .schedule_tree.state import KernelState

_DOMAIN = re.compile(r'domain: "[^"]*"')
_MARK = re.compile(r'mark: "([^"]*)"')


def compile_symbolic(loaded: Graph, backend, machine, options, trace, *, compile_graph,
                     quiet_trace):
    """The primitive graph (symbolic types, the loaded graph's inputs and symbols), the
    fusion plan, per kernel (kernel, parametric model with its tree, report, trees), the
    C functions, and the options used. `compile_graph` is the static pipeline
    (`compiler.compile_graph`); `quiet_trace()` a trace for the probes after the first."""
    if backend.name != "cpu":
        raise GraphError(Problem(f"target {backend.name!r} does not compile symbolic shapes "
                                 f"(symbols {', '.join(loaded.symbols)}): give the inputs "
                                 "static shapes for it", field="target"))
    # the row tail's own contraction fused at a probe's lengths would leave the whole
    # kernel to the portable loops when the tail's rows cannot be blocked for every length;
    # so would a Winograd convolution, whose blocks of tile rows follow every size
    options = replace(options, tail_contraction=False, winograd=False)
    probes = _ProbeRuns(loaded, backend, machine, trace, compile_graph, quiet_trace)
    (top, _), *lower = size_regimes(_free_ranges(loaded)[0])
    first, options = _first_version(probes, top, options, "_v0" if lower else "")
    versions, home = [first], [0]  # home: each regime's version
    for ranges, parent in lower:  # each its own version, or its parent's (sizes above)
        above = versions[home[parent]]
        decision, why = (_own_decision(probes, ranges, above.decision, first.decision, options)
                         if probes.compiles < MAX_PROBE_RUNS else
                         (None, f"the compile's {MAX_PROBE_RUNS} probes are spent"))
        if why is None:
            try:
                versions.append(probes.emitted(_Version((ranges,), decision),
                                               f"_v{len(versions)}"))
                home.append(len(versions) - 1)
                continue
            except NotGeneral as e:
                why = f"its code generation differs: {e}"
        home.append(home[parent])  # proved again and emitted for its ranges and these
        versions[home[parent]] = _Version(
            _add_box(above.boxes, ranges), above.decision,
            above.notes + (f"{_text((ranges,))}: this version too, since {why}",))
    versions = [probes.emitted(v, f"_v{i}" if len(versions) > 1 else "")
                for i, v in enumerate(versions)]
    results, functions = _emit_versions(versions)
    g, plan = versions[0].decision.graph, versions[0].decision.plan
    # the loaded graph's inputs: each names its own symbols (a symbol assumed equal to
    # another is written as that one in the generalised types)
    primitive = replace(g, inputs=loaded.inputs, symbols=loaded.symbols,
                        assumptions=loaded.assumptions)
    return primitive, plan, results, functions, options


# where the range of a symbol is cut into size regimes, each compiled at probes inside
# it: a few rows (a microkernel's tile or two), up to the rows a cache keeps, beyond;
# with two symbols only the second cut (9 boxes would cost up to 36 compiles), with
# more none
SPLITS = ((16, 512), (512,))
# a regime is decided apart only while the compiles at probes are fewer than this (a
# regime takes one, or one per symbol and two more): a symbolic compile stays within a
# few static ones
MAX_PROBE_RUNS = 16


def size_regimes(free: dict[str, tuple[int, int]]
                 ) -> list[tuple[dict[str, tuple[int, int]], int | None]]:
    """The boxes of sizes decided apart, each with its parent's place in the list (the
    box one step larger in its first symbol not at its largest), parents first: the
    largest sizes, then by how many steps down. A range is cut only into pieces of three
    values or more, which the probes fit as functions."""
    names = sorted(free)
    pieces = []
    for name in names:
        lo, hi = free[name]
        cuts = [b for b in (SPLITS[len(names) - 1] if len(names) <= len(SPLITS) else ())
                if lo + 3 <= b <= hi - 2]
        edges = [lo, *cuts, hi + 1]
        pieces.append([(a, b - 1) for a, b in zip(edges, edges[1:])][::-1])
    order = sorted(itertools.product(*(range(len(p)) for p in pieces)), key=lambda v: (sum(v), v))
    place = {v: i for i, v in enumerate(order)}

    def parent(v):
        if not any(v):
            return None
        i = next(i for i, x in enumerate(v) if x)
        return place[v[:i] + (v[i] - 1,) + v[i + 1:]]

    return [({n: pieces[k][x] for k, (n, x) in enumerate(zip(names, v))}, parent(v))
            for v in order]


@dataclasses.dataclass(frozen=True)
class _Decision:
    """What the probes of one range agreed on, generalised."""

    graph: Graph
    plan: object
    kernels: tuple[Kernel, ...]
    trees: tuple[str, ...]
    promotions: tuple  # per kernel
    results: tuple  # the base probe's KernelResults
    fit: tuple[dict[str, int], ...]  # the probes (`_probes`), the free symbols'
    probes: tuple[dict[str, int], ...]  # and every symbol's
    options: object  # those of the probes after the first
    note: tuple[str, ...] = ()

    @property
    def base(self) -> dict[str, int]:
        return self.probes[0]


@dataclasses.dataclass(frozen=True)
class _Version:
    boxes: tuple[dict[str, tuple[int, int]], ...]  # the sizes it runs: a union of boxes
    decision: _Decision
    notes: tuple[str, ...] = ()
    emitted: tuple = ()  # per kernel (model, C, codegen's lines), for these ranges


class _ProbeRuns:
    """The static pipeline at probes, each binding and options compiled once (the
    regimes' probes meet when a range is decided again with other options)."""

    def __init__(self, loaded, backend, machine, trace, compile_graph, quiet_trace):
        self.loaded, self.backend, self.machine = loaded, backend, machine
        self.trace, self.compile_graph, self.quiet_trace = trace, compile_graph, quiet_trace
        self.done: dict = {}
        self.fused: dict = {}  # per probe: its fusions (`compiler.compile_graph`)

    @staticmethod
    def _key(probe: dict[str, int], options):
        return tuple(sorted(probe.items())), options

    @property
    def compiles(self) -> int:
        """The compiles made so far (a base probe's is also kept under its pinned options)."""
        return len({id(r) for r in self.done.values()})

    def run(self, probe: dict[str, int], options):
        key = self._key(probe, options)
        if key not in self.done:
            trace = self.trace if not self.done else self.quiet_trace()
            # unverified: the tree the probes agree on is proved for every value (`_emit`)
            try:
                self.done[key] = self.compile_graph(
                    bind_graph(self.loaded, probe), self.backend, self.machine,
                    replace(options, verify=False), trace, codegen=False,
                    fused=self.fused.setdefault(key[0], {}))[:3]
            except GraphError as e:
                # kernels the first version's options name (`portable_kernels`), which
                # another range's fusion does not make
                if not all((p.field or "").startswith(_KERNEL_OPTIONS) for p in e.problems):
                    raise
                raise NotGeneral("the kernels", [p.message for p in e.problems]) from None
        return self.done[key]

    def decide(self, ranges: dict[str, tuple[int, int]], options, note=()) -> _Decision:
        """The decisions the probes inside `ranges` agree on and that hold for all of
        them (`_check_gemm_loops`), else a NotGeneral. The other probes use the gemm
        kernel the first chose (`_pinned`)."""
        fit, full = self.probes(ranges)
        base = self.run(full[0], options)
        pinned = _pinned(options, base)
        self.done.setdefault(self._key(full[0], pinned), base)
        runs = [base] + [self.run(p, pinned) for p in full[1:]]
        g, plan, kernels, trees, promotions = _generalise(runs, fit)
        for k, tree in zip(kernels, trees):
            with _kernel_at_fault(k.name):
                _check_gemm_loops(k.name, tree, ranges)
        return _Decision(g, plan, tuple(kernels), tuple(trees), tuple(promotions),
                         tuple(base[2]), tuple(fit), tuple(full), pinned, note)

    def probes(self, ranges: dict[str, tuple[int, int]]):
        """`_probes` of the graph with its free symbols in `ranges`."""
        return _probes(_within(self.loaded, ranges))

    def base(self, ranges: dict[str, tuple[int, int]], options):
        """The compile at the first probe of `ranges` with `options`."""
        return self.run(self.probes(ranges)[1][0], options)

    def folds(self, ranges: dict[str, tuple[int, int]], options) -> bool:
        """Does a contraction fold a batch into its columns, or read B in place over a
        batch (copied for all its images at some sizes, image by image at others:
        `CpuOptions.fold_batch`), at the first probe?"""
        return any(m.b == "folded" or (m.b == "rows" and any(loop[0] == "b" for loop in m.loops))
                   for r in self.base(ranges, options)[2] for m in r.marks(mk.Gemm))

    def maps(self, ranges: dict[str, tuple[int, int]], options, kernel: str | None) -> bool:
        """Is `kernel` mapped onto microkernels at the first probe?"""
        return kernel is not None and any(r.kernel.name == kernel and r.microkernels
                                          for r in self.base(ranges, options)[2])

    def decides_alike(self, ranges: dict[str, tuple[int, int]], above: _Decision, options) -> bool:
        """Whether the first probe of `ranges` makes `above`'s decisions, its sizes the
        affine functions `above`'s probes fitted (it takes the place of their check):
        then the range needs no probes of its own."""
        fit, full = self.probes(ranges)
        runs = [self.run(p, above.options) for p in above.probes[:-1]]
        runs.append(self.run(full[0], options))
        try:
            g, plan, kernels, trees, _ = _generalise(runs, [*above.fit[:-1], fit[0]])
        except NotGeneral:
            return False
        return (g, plan.groups, tuple(kernels), tuple(trees)) == \
            (above.graph, above.plan.groups, above.kernels, above.trees)

    def emitted(self, version: _Version, suffix: str) -> _Version:
        """The version with its kernels proved for its ranges and emitted (a NotGeneral
        when codegen decides by a size), each function's name the kernel's and `suffix`
        (a kernel with several versions: `_v0` the largest sizes', `_v1` the next)."""
        if version.emitted:
            return version
        d = version.decision
        out = []
        for k, tree, promoted in zip(d.kernels, d.trees, d.promotions):
            with _kernel_at_fault(k.name):
                out.append(self.trace.run(f"symbolic {k.name}{suffix}", _emit,
                                          replace(k, name=k.name + suffix), tree, promoted,
                                          version.boxes, self.backend, self.machine, d.options,
                                          show=lambda e: e[1]))
        return replace(version, emitted=tuple(out))


@contextlib.contextmanager
def _kernel_at_fault(name: str):
    """A NotGeneral raised inside names kernel `name` as the one whose decisions differ."""
    try:
        yield
    except NotGeneral as e:
        e.kernel = e.kernel or name
        raise


def _pinned(options, run):
    """`options` with the gemm kernel `run` chose for each kernel's contraction: the
    probes of a range then agree on it. Left to itself, each probe picks by how evenly
    its rows fill the kernel's tiles (1009 rows, 503, 499: 14x32 or 8x48), which says
    nothing of the sizes between them."""
    if options.gemm_kernel:
        return options
    pins = dict(options.kernel_gemm)
    for r in run[2]:
        chosen = {m.kernel for m in r.marks(mk.Gemm)}
        if len(chosen) == 1:
            pins.setdefault(r.kernel.name, chosen.pop())
    return replace(options, kernel_gemm=tuple(sorted(pins.items())))


# what a compile changes, in turn, when the probes decide differently: a symbolic batch
# folded into a contraction's columns makes a column block that grows with it (a copy
# of B for all its images too, made at some probes and not others); tiles
# cut to the extent (1009 in 8 tiles of 127) differ at every probe, the model's sizes do
# not; a microkernel's emitter may decide by a size it cannot compare
_FALLBACKS = ({}, {"fold_batch": False}, {"fold_batch": False, "balance_tiles": False},
              {"fold_batch": False, "balance_tiles": False, "microkernels": False})
# the options naming kernels, which the first version's decisions set
_KERNEL_OPTIONS = ("options.portable_kernels", "options.kernel_gemm")
_CHANGED = {"balance_tiles": "tiles and gemm blocks not balanced to the extents",
            "fold_batch": "no batch folded into a contraction's columns, nor B copied "
                          "for all its images",
            "microkernels": "microkernels off, the portable loops instead"}


def _first_version(probes: _ProbeRuns, ranges, options, suffix) -> tuple[_Version, object]:
    """The largest sizes' version and the options it was decided with: when its probes
    disagree, it is compiled again with the fallbacks' options in turn (the other
    versions keep those options). A fallback that changes nothing the probes decided is
    skipped (no batch was folded); before microkernels are turned off everywhere, each
    kernel whose own plan differs, one at a time, is compiled without them."""
    tried, failure = [], None
    for change in _FALLBACKS:
        if tried and "fold_batch" in change and not probes.folds(ranges, tried[0]):
            change = {k: v for k, v in change.items() if k != "fold_batch"}  # none folded
        attempt = replace(options, **change)
        if attempt in tried:
            continue
        while True:
            note = () if failure is None else _fallback_note(attempt, options, failure)
            try:
                return probes.emitted(_Version((ranges,), probes.decide(ranges, attempt, note)),
                                      suffix), attempt
            except NotGeneral as e:
                tried.append(attempt)
                failure = e
                if e.final:
                    raise _refusal(probes.loaded, e) from None
            if attempt.balance_tiles or not probes.maps(ranges, attempt, failure.kernel):
                break
            attempt = replace(attempt, portable_kernels=(*attempt.portable_kernels,
                                                         failure.kernel))
    raise _refusal(probes.loaded, failure)


def _fallback_note(attempt, options, failure: NotGeneral) -> tuple[str, ...]:
    """The report's line on what `attempt` changed from `options`, and why."""
    changed = [text for k, text in _CHANGED.items() if getattr(attempt, k) != getattr(options, k)]
    portable = attempt.portable_kernels[len(options.portable_kernels):]
    if portable and attempt.microkernels:
        changed.append(f"kernel{'s' * (len(portable) > 1)} {', '.join(portable)} without "
                       "microkernels, the portable loops instead")
    return (f"symbolic shapes: {', '.join(changed)} (before, {failure.where} depended on "
            "the sizes)",)


def _probes(graph: Graph) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """The probes of `choose_probes` over the symbols that stay free, and the same with a
    value for every symbol: a symbol the graph assumes equal to another (`Eq(M, N)`, two
    dims broadcast together) takes that one's value, so the probes satisfy it. A probe
    that breaks another assumption is refused."""
    free, same = _free_ranges(graph)
    fit = choose_probes(free)
    full = [{**p, **{k: p[rep] for k, rep in same.items()}} for p in fit]
    for p in full:
        for relation, message in graph.assumptions:
            if not bool(relation.subs({s: p[s.name] for s in relation.free_symbols})):
                raise GraphError(Problem(f"cannot compile once for every value: {message} "
                                         "leaves no sizes to decide the code at; give static "
                                         "shapes", field="symbols"))
    return fit, full


def _free_ranges(graph: Graph) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """The symbols that stay free with their ranges (narrowed by the graph's assumptions),
    and the symbol each other one is assumed equal to."""
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
    return free, same


def _within(graph: Graph, ranges: dict[str, tuple[int, int]]) -> Graph:
    """The graph with its free symbols in `ranges`, and the symbols equal to them too."""
    _, same = _free_ranges(graph)
    narrowed = {k: ranges.get(same.get(k, k), r) for k, r in graph.symbols.items()}
    return replace(graph, symbols=narrowed)


def _add_box(boxes, box: dict[str, tuple[int, int]]) -> tuple[dict[str, tuple[int, int]], ...]:
    """`boxes` and `box`, joined to one it adjoins along one symbol (16..511 and 512..8192:
    16..8192) where there is one."""
    for i, b in enumerate(boxes):
        differ = [k for k in b if b[k] != box[k]]
        if len(differ) == 1 and (b[differ[0]][1] + 1 == box[differ[0]][0]
                                 or box[differ[0]][1] + 1 == b[differ[0]][0]):
            k = differ[0]
            joined = {**b, k: (min(b[k][0], box[k][0]), max(b[k][1], box[k][1]))}
            return _add_box(boxes[:i] + boxes[i + 1:], joined)
    return (*boxes, box)


def _text(boxes) -> str:
    return " or ".join(", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in sorted(r.items()))
                       for r in boxes)


def _own_decision(probes: _ProbeRuns, ranges, above: _Decision, first: _Decision, options
                  ) -> tuple[_Decision | None, str | None]:
    """A range's decisions if they make a version of their own, else why not. Its tiles
    are the memory model's, not balanced to the extent at its probes: the range spans a
    factor of 32, no one extent. The versions of a kernel are functions behind one
    signature, so they must agree on the graph, its kernels and their arrays."""
    options = replace(options, balance_tiles=False)
    fusion_differs = "its fusion differs (the versions of a kernel need the same kernels)"
    try:
        if probes.decides_alike(ranges, above, options):
            return None, "its first probe decides the same"
        if probes.base(ranges, options)[1].groups != first.plan.groups:
            return None, fusion_differs  # known before the other probes are compiled
        mine = probes.decide(ranges, options)
    except NotGeneral as e:
        return None, f"the compiles in it differ in {e}"
    if mine.kernels == above.kernels and mine.trees == above.trees:
        return None, "its probes decide the same"
    if mine.graph != first.graph or mine.plan.groups != first.plan.groups:
        return None, fusion_differs
    if [(k.name, k.params, k.symbols) for k in mine.kernels] != \
            [(k.name, k.params, k.symbols) for k in first.kernels]:
        return None, "its kernels take other arrays"
    return mine, None


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


def _generalise(runs, probes):
    """The primitive graph (user's symbol names), the fusion plan, the kernels (the
    symbols' C names), their trees' texts and their copies the probes agree on."""
    graphs = [r[0] for r in runs]
    g = generalise(graphs, probes, "the primitive graph")
    plan = runs[0][1]  # its report speaks of the base probe's sizes
    if len({r[1].groups for r in runs}) > 1:
        raise NotGeneral("the fusion groups", [r[1].groups for r in runs])
    if len({len(r[2]) for r in runs}) > 1:
        raise NotGeneral("the number of kernels", [len(r[2]) for r in runs])
    c_names = {name: C_PREFIX + name for name in probes[0]}  # the free symbols
    kernels, trees, promotions = [], [], []
    for results in zip(*(r[2] for r in runs)):
        name = results[0].kernel.name
        with _kernel_at_fault(name):
            trees.append(_general_tree([str(r.schedule) for r in results], probes, name, c_names))
            # the cpu's copies are a microkernel's packed panels: a tile's rows, or all the
            # rows when fewer (`N` below a block of 512), an affine box like the rest;
            # only their size is read on the cpu (their isl footprints stay the base probe's)
            plain = [tuple((p.buffer, p.array, p.layout, p.pad, p.element_bytes)
                           for p in r.promotions) for r in results]
            if any(p != plain[0] for p in plain):
                raise NotGeneral(f"kernel {name}'s copies between memory levels", ["differ"])
            promotions.append(tuple(
                replace(p, box=generalise([r.promotions[i].box for r in results], probes,
                                          f"kernel {name}'s copy {p.buffer}", c_names))
                for i, p in enumerate(results[0].promotions)))
            # a contracted buffer as long as a symbol is allocated per call (and per thread)
            kernel = generalise([r.kernel for r in results], probes, f"kernel {name}", c_names)
            for s in kernel.statements:  # isl divides by constants only
                divisors = [e.d for index in (s.index, *(ld.index for ld, _ in loads(s.expr)))
                            for e in index for e in _divisions(e) if type(e.d) is not int]
                if divisors:
                    raise NotGeneral(f"kernel {name}'s statement {s.name}, whose index divides "
                                     "by a size", divisors, final=True)
            kernels.append(replace(kernel, symbols=tuple(sorted(c_names.values()))))
    return g, plan, kernels, trees, promotions


def _check_gemm_loops(name: str, tree: str, ranges: dict[str, tuple[int, int]]) -> None:
    """A gemm plan leaves out the loop over blocks (or tiles) of a dim its probes fit in
    one: made at 1009 rows with blocks of 1022, it has no loop over row blocks, and 2048
    rows would run one block. A NotGeneral when a size in `ranges` outgrows one."""
    from .microkernels.registry import by_name
    for word in _MARK.findall(tree):
        mark = mk.parse(word)
        if not isinstance(mark, mk.Gemm):
            continue
        kernel = by_name(mark.kernel)
        for extent, block, loop in ((mark.m, mark.mc, "ic"), (mark.n, mark.nc, "jc"),
                                    (mark.k, mark.kc, "pc"), (mark.m, kernel.mr, "ir"),
                                    (mark.n, kernel.nr, "jr")):
            if type(extent) is int or loop in mark.loops:
                continue
            # tiles within a block
            blocks = [block] + ([mark.mc if loop == "ir" else mark.nc] if loop in ("ir", "jr")
                                else [])
            if any(type(b) is not int for b in blocks):  # a block as large as the dim
                raise NotGeneral(f"kernel {name}'s gemm plan", [
                    f"no {loop} loop, its block grows with the sizes ({blocks})"])
            block = min(blocks)
            names = {str(sym): sym for sym in extent.free_symbols}
            corners = itertools.product(*([(names[C_PREFIX + k], lo), (names[C_PREFIX + k], hi)]
                                          for k, (lo, hi) in ranges.items()
                                          if C_PREFIX + k in names))
            top = max(int(extent.subs(dict(c))) for c in corners)
            if top > block:
                raise NotGeneral(f"kernel {name}'s gemm plan", [
                    f"no {loop} loop, yet {extent} reaches {top} > {block}"])


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


def _emit_versions(versions: list[_Version]):
    """Per kernel (kernel, model, report, trees) and its C: one function, or one per
    version and the kernel's function choosing among them by the symbols' values, on
    conditions isl writes from the versions' ranges."""
    results, functions = [], []
    several = len(versions) > 1
    for j, kernel in enumerate(versions[0].decision.kernels):
        first = versions[0].decision.results[j]
        model, _, lines = versions[0].emitted[j]
        report = first.fusion_report + versions[0].decision.note + lines
        trees = first.trees
        fused = len(versions[0].decision.plan.report_for(kernel.nodes))
        for i, v in enumerate(versions):
            where = f"version {i} for {_text(v.boxes)}: " if several else ""
            own = [line for line in v.decision.results[j].fusion_report[fused:]
                   if line not in first.fusion_report]  # the same fusion at other sizes
            report += tuple(where + line for line in own) + (
                f"{where}decided at {_text_binding(v.decision.base)}; schedule proved legal "
                f"by isl for {_text(v.boxes)}",) + v.notes
            trees += ((f"symbolic {_text(v.boxes)}" if several else "symbolic",
                       v.emitted[j][0].schedule),)
        results.append((kernel, model, report, trees))
        functions += [v.emitted[j][1] for v in versions]
        if several:
            functions.append(str(dispatcher(kernel, _conditions(
                [v.boxes for v in versions],
                [f"{kernel.name}_v{i}" for i in range(len(versions))]))))
    return results, functions


def _conditions(boxes: list[tuple[dict[str, tuple[int, int]], ...]], names: list[str]
                ) -> list[tuple[str, str]]:
    """(C condition, function) per version, tested in order: each version's sizes as isl
    writes them knowing the earlier ones did not hold (`N >= 16` below `N >= 512`)."""
    ctx = isl.Context()
    sets = [_union(ctx, b) for b in boxes]
    left = sets[0]
    for s in sets[1:]:
        left = left.union(s)
    out = []
    for s, name in zip(sets, names):
        out.append((isl.AstBuild.from_context(left).expr_from_set(s.coalesce()).to_C_str(),
                    name))
        left = left.subtract(s)
    return out


def _union(ctx: isl.Context, boxes) -> isl.Set:
    """The parameter set of the symbols' ranges (a union of boxes), in their C names."""
    names = ", ".join(sorted(C_PREFIX + k for k in boxes[0]))
    pieces = "; ".join(" : " + " and ".join(f"{lo} <= {C_PREFIX + k} <= {hi}"
                                            for k, (lo, hi) in sorted(b.items()))
                       for b in boxes)
    return isl.Set.read_from_str(ctx, f"[{names}] -> {{ {pieces} }}").coalesce()


def _text_binding(binding: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(binding.items()))


def _emit(kernel: Kernel, tree: str, promotions, boxes, backend, machine, options):
    """The kernel's parametric model with its tree, proved for every size in `boxes`
    (ranges of the free symbols), its C and the lines codegen reports."""
    ctx = isl.Context()
    context = _union(ctx, boxes)
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
    try:
        code, lines = backend.codegen(state, machine, options)
    except TypeError as e:  # sympy refuses `N > 0`: a choice codegen makes by size
        if "truth value of Relational" not in str(e):
            raise
        raise NotGeneral(f"kernel {kernel.name}'s code generation", ["compares sizes"])
    return model, code, lines


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
        work = sum(extents[n] for n in statement_names(node.get_domain()))
        if isinstance(work, int) or not _affine(work):
            return node
        text = str(replace(mark, work=Tight(work)))
        return node.delete().insert_mark(isl.Id(text, context=node.get_ctx()))

    return schedule.map_schedule_node_bottom_up(visit)


def _affine(expr) -> bool:
    import sympy
    return sympy.Poly(expr, *expr.free_symbols).total_degree() <= 1


