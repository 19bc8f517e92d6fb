"""Schedule trees for fused kernels, built loop level by loop level from exact dependences.

Every statement is scheduled by its own iterators in order (its loop nest, outermost
first: kept axes before reduced ones), so a fused kernel is a question of which
statements share which loops. At level l, statements that already share loops 0..l-1
are cut, in program order, into runs that can also share loop l: a statement joins the
run before it when every dependence between them, at equal outer iterations, has
distance >= 0 along l (isl decides, on the exact dependence relations). Runs become a
sequence; each run's loop a band; the recursion goes on below. Bands that follow each
other with nothing between are merged when every dependence below them has non-negative
distance along each member: that band is permutable, i.e. tilable.

This builds the loop structure the graph layer's fusion decisions ask for directly, in
time linear in the number of dependence relations, where isl's general scheduler on a
whole fused group (an ILP over all statements) can take minutes. The result is checked
against every dependence like any other schedule.

    softmax rows: band(i) -> sequence[ band(j){max_init, max},
                                       band(j){sub, exp, sum_init, sum},
                                       band(j){div} ]

Column blocks. A reduction over a leading axis (a softmax over the columns, `axis=0`)
shares no outer loop with its consumers: row i of the subtract needs the maximum over
every row. But when every dependence keeps each statement's last iterator equal (the
column j), the columns are independent, and a band over blocks of `block` columns can
go outermost, shared by every statement; inside a block each pass keeps its own order,
rows outer and the block's columns innermost (contiguous, vectorisable):

    softmax columns: band(floor(j/B)) -> sequence[ band(i) -> band(j) {max}, ... ]

`column_block` sizes the blocks: long rows of a block stream well from memory, and a
block's data is read again by the passes after the first, so it should stay in the
last cache level (a core's share of it); one block per core at least.

Kept axes. Any other axis every dependence keeps equal (the rows of a softmax over the
leading axis of a 3-d tensor, the kept axis of a reduction over axes 0 and 2) joins that
band, outside the block, so one iteration holds one of its values, not all of them:

    softmax over axis 0 of [A, B, C]: band(j, floor(k/B)) -> sequence[ band(i, j, k) ... ]

A chip's cores tile that band: without the kept axis in it, the smallest tile held
every row of the axis (a whole [A, B, 16] slab); a reduction over axes 0 and 2 had no
shared loop at all.

Independent parts. Statements that neither depend on each other nor read a common
tensor (beyond a single element each, a scalar) are parts of the kernel that have
nothing to share (AKG's "parallel fusion" of independent subgraphs into one kernel):
each part gets its own tree, the parts a sequence, so each keeps its own loops and the
target's marks on them (a parallel outer loop each):

    two independent scalings: sequence[ band(i){mul_a}, band(i, j){mul_b} ]
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import islpy as isl

from ..kernel.comprehension import Statement, isl_index
from . import marks
from .model import PolyModel


@dataclass
class _Band:
    levels: list[int]
    statements: list[Statement]
    coincident: list[bool]
    permutable: bool
    child: "_Node"
    block: int = 0  # > 0: a last member, floor(last iterator / block) (a column block)
    kept: list[dict[str, int]] = field(default_factory=list)  # first members: kept axes


@dataclass
class _Sequence:
    runs: list[tuple[list[Statement], "_Node"]]


@dataclass
class _Leaf:
    pass


_Node = _Band | _Sequence | _Leaf
_last: tuple[PolyModel, "_Deps"] | None = None  # `_Deps.of`'s last model, read once


@dataclass
class _Deps:
    """Dependence relations by (source statement, sink statement)."""

    by_pair: dict[tuple[str, str], isl.Map] = field(default_factory=dict)
    # by id of a map asked about, with the map (so its id stays its own)
    distances: dict[int, tuple[isl.Map, isl.Set]] = field(default_factory=dict)
    # `kept_axes` by the statements asked about
    kept: dict[tuple[str, ...], list[dict[str, int]]] = field(default_factory=dict)

    @staticmethod
    def of(model: PolyModel, relation: isl.UnionMap | None = None) -> "_Deps":
        """The model's dependences, or `relation` (e.g. its read-after-read pairs). The
        last model's are kept: the column block's size, the tree and the shared loops
        are asked of one model in turn, and each would compute the same distances."""
        global _last
        last = _last
        if relation is None and last is not None and last[0] is model:
            return last[1]
        deps = _Deps()
        maps = (model.dependences if relation is None else relation).get_map_list()
        for m in (maps.get_at(i) for i in range(maps.n_map())):
            key = (m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out))
            deps.by_pair[key] = deps.by_pair[key].union(m) if key in deps.by_pair else m
        if relation is None:
            _last = (model, deps)
        return deps

    def between(self, group: list[Statement] | set[str], other: list[Statement] | set[str]):
        names = {s if isinstance(s, str) else s.name for s in group}
        others = {s if isinstance(s, str) else s.name for s in other}
        for (src, dst), m in self.by_pair.items():
            if (src in names and dst in others) or (src in others and dst in names):
                yield m

    def has(self, m: isl.Map, level: int, relation: str, outer: int | None = None) -> bool:
        """Is there a pair with equal iterators before `outer` (default `level`) whose
        sink and source iterators at `level` are in `relation` ('<' or '!=')?"""
        if level >= m.dim(isl.dim_type.in_) or level >= m.dim(isl.dim_type.out):
            return False
        d = self._distances(m)
        for k in range(level if outer is None else outer):
            d = d.fix_dim_si(k, 0)
        one = isl.Val.one(d.get_ctx())
        if not d.upper_bound_val(isl.dim_type.set, level, one.neg()).is_empty():
            return True
        return relation == "!=" and not d.lower_bound_val(isl.dim_type.set, level, one).is_empty()

    def _distances(self, m: isl.Map) -> isl.Set:
        """The pairs' distance vectors (sink - source) over the iterators both
        statements have, computed once for every question on `m` (a convolution's
        7-deep reduction: 15 -> 5 ms of pair tests against one per question)."""
        key = id(m)
        if key not in self.distances:
            n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
            n = min(n_in, n_out)
            common = (m.project_out(isl.dim_type.in_, n, n_in - n)
                      .project_out(isl.dim_type.out, n, n_out - n)
                      .set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, "S"))
            self.distances[key] = (m, common.deltas())
        return self.distances[key][1]


def _rank(s: Statement) -> int:
    return len(s.extents)


def _loops(s: Statement, level: int) -> bool:
    """Does `s` iterate at `level` (a loop of more than one iteration)?"""
    return _rank(s) > level and s.extents[level] > 1


def _unit(s: Statement, level: int) -> bool:
    """Does `s` have a loop of one iteration at `level` (a dim of size 1) along which it
    writes (not a reduction's axis: the passes after scheduling take a reduction's
    loops for its reduction)?"""
    if _rank(s) <= level or s.extents[level] != 1:
        return False
    written = " ".join(isl_index(e, s.iter_name) for e in s.index)
    return re.search(rf"\b{s.iter_name(level)}\b", written) is not None


def _hoisted(statements: list[Statement], level: int, deps: _Deps) -> list[Statement]:
    """Statements that do not loop at `level` (a reduction's init, a per-row scalar)
    moved up to just after the last statement they depend on, so they run before a
    shared loop instead of as a test inside it."""
    order: list[Statement] = []
    for s in statements:
        if _loops(s, level) or not order:
            order.append(s)
            continue
        at = len(order)
        while at > 0 and not any(True for _ in deps.between([order[at - 1]], [s])):
            at -= 1
        order.insert(at, s)
    return order


def _point(s: Statement, level: int) -> bool:
    """Is `s` one instance with an iterator at `level` (a whole sum's init, [1, 1]), or
    one without iterators (a sum's init to a scalar) at the outermost level?"""
    return (_rank(s) > level or _rank(s) == level == 0) and all(e == 1 for e in s.extents)


def _runs(statements: list[Statement], level: int, deps: _Deps,
          points_inside: bool = False) -> list[list[Statement]]:
    runs: list[list[Statement]] = []
    for s in _hoisted(statements, level, deps):
        last = runs[-1] if runs else None
        # statements share a loop when all of them iterate at this level, or when it is
        # a dim of size 1 for all of them ([1, N, C] tensors: the loops below it may
        # still be shared)
        alike = ((_loops(s, level) and all(_loops(r, level) for r in last))
                 or (_unit(s, level) and all(_unit(r, level) for r in last))) if last else False
        if alike and not any(deps.has(m, level, "<") for m in deps.between(last, [s])):
            last.append(s)
        else:
            runs.append([s])
    if points_inside:  # each run of single instances joins the loop after it, if legal
        for k in range(len(runs) - 2, -1, -1):
            points, after = runs[k], runs[k + 1]
            if (all(_point(s, level) for s in points) and all(_loops(s, level) for s in after)
                    and not any(deps.has(m, level, "<") for m in deps.between(points, after))):
                runs[k:k + 2] = [points + after]
    return runs


def _build(statements: list[Statement], level: int, deps: _Deps,
           points_inside: bool = False) -> _Node:
    runs = _runs(statements, level, deps, points_inside)
    built = []
    for run in runs:
        if any(_rank(s) > level for s in run):  # a scalar among them: a point joined
            inner = list(deps.between(run, run))
            scalars = [s for s in run if _rank(s) <= level]
            # a scalar runs at the loop's first iteration: what the others read of it
            # crosses the loop's iterations, which `has` does not see (no iterator)
            coincident = not any(deps.has(m, level, "!=") for m in inner) and not any(
                True for _ in deps.between(scalars, run))
            # below the outermost loop they run before the loops again (the cores' tiles
            # need the one band; an innermost loop, no test of its first iteration)
            built.append((run, _Band([level], run, [coincident], True,
                                     _build(run, level + 1, deps))))
        elif len(run) == 1:
            built.append((run, _Leaf()))
        else:  # pragma: no cover - a run only groups statements that all have the level
            raise AssertionError("run of statements without a shared loop")
    if len(built) == 1:
        return built[0][1]
    return _Sequence(built)


def _merge(node: _Node, deps: _Deps) -> _Node:
    """Fuse a band with the band right below it when the result stays permutable."""
    if isinstance(node, _Sequence):
        return _Sequence([(run, _merge(child, deps)) for run, child in node.runs])
    if isinstance(node, _Leaf):
        return node
    node.child = _merge(node.child, deps)
    child = node.child
    if isinstance(child, _Band) and child.statements == node.statements:
        first = node.levels[0]
        inner = list(deps.between(node.statements, node.statements))
        levels = node.levels + child.levels
        if not any(deps.has(m, lv, "<", outer=first) for m in inner for lv in levels):
            return _Band(levels, node.statements, node.coincident + child.coincident,
                         True, child.child)
    return node


def _iters(s: Statement) -> str:
    return ", ".join(s.iter_name(d) for d in range(_rank(s)))


def _filter(statements: list[Statement]) -> str:
    return "{ " + "; ".join(f"{s.name}[{_iters(s)}]" for s in statements) + " }"


def _text(node: _Node) -> str:
    if isinstance(node, _Leaf):
        return ""
    if isinstance(node, _Sequence):
        parts = []
        for run, child in node.runs:
            body = _text(child)
            parts.append(f'{{ filter: "{_filter(run)}"' + (f", child: {body}" if body else "") + " }")
        return "{ sequence: [ " + ", ".join(parts) + " ] }"
    members = ["{ " + "; ".join(f"{s.name}[{_iters(s)}] -> [({s.iter_name(axis[s.name])})]"
                                for s in node.statements) + " }" for axis in node.kept]
    for lv in node.levels:  # a scalar joined to the loop: its first iteration
        members.append("{ " + "; ".join(
            f"{s.name}[{_iters(s)}] -> [({s.iter_name(lv) if lv < _rank(s) else 0})]"
            for s in node.statements) + " }")
    if node.block:  # after the kept axes: consecutive blocks of one row
        members.append("{ " + "; ".join(
            f"{s.name}[{_iters(s)}] -> [(floor(({s.iter_name(_rank(s) - 1)})/{node.block}))]"
            for s in node.statements) + " }")
    coincident = ", ".join(str(int(c)) for c in node.coincident)
    body = _text(node.child)
    text = (f'{{ schedule: "[{", ".join(members)}]", permutable: {int(node.permutable)}, '
            f"coincident: [ {coincident} ]")
    text += (f", child: {body}" if body else "") + " }"
    # the mark tells later passes that the bands below it work on one block
    mark = marks.ColumnBlock(node.block)
    return f'{{ mark: "{mark}", child: {text} }}' if node.block else text


def _keeps(statements: list[Statement], deps: _Deps, level,
           skip: set[str] = frozenset()) -> bool:
    """Does every dependence (but those within `skip`, known to) keep its source's and
    sink's iterators at `level` (a function of the statement: its last level, say)
    equal?"""
    at = {s.name: level(s) for s in statements}
    if min(at.values(), default=-1) < 0:
        return False
    for (src, dst), m in deps.by_pair.items():
        if src in skip and dst in skip:
            continue
        if not _equal_at(m, at[src], at[dst]):
            return False
    return True


def _equal_at(m: isl.Map, source: int, sink: int) -> bool:
    """Does every pair of `m` have its source's iterator `source` equal to its sink's
    iterator `sink`?"""
    return m.is_subset(m.equate(isl.dim_type.in_, source, isl.dim_type.out, sink))


def kept_axes(statements: list[Statement], deps: _Deps) -> list[dict[str, int]]:
    """The axes but the last that every dependence keeps equal and that some statement
    loops over (see "Kept axes"), each as every statement's level for it: the level
    itself in the statements of the highest rank, the level a dependence keeps equal to
    it in the others (a sum's init over the kept axes alone)."""
    key = tuple(s.name for s in statements)
    if key not in deps.kept:
        deps.kept[key] = _kept_axes(statements, deps)
    return deps.kept[key]


def _kept_axes(statements: list[Statement], deps: _Deps) -> list[dict[str, int]]:
    rank = max(map(_rank, statements), default=0)
    top = {s.name for s in statements if _rank(s) == rank}
    axes = []
    for lv in range(rank - 1):
        extent = max(s.extents[lv] for s in statements if s.name in top)
        # (the statements of the highest rank first, on the distances `has` keeps)
        if extent == 1 or any(deps.has(m, lv, "!=", outer=0) for (src, dst), m
                              in deps.by_pair.items() if src in top and dst in top):
            continue
        at = dict.fromkeys(top, lv)
        while len(at) < len(statements):
            found = {}
            for s in statements:
                if s.name not in at:
                    levels = _kept_with(s, at, deps, extent)
                    if levels:
                        found[s.name] = levels[0]
            if not found:
                break
            at.update(found)
        if (len(at) == len(statements) and not any(map(_innermost, statements, at.values()))
                and _keeps(statements, deps, lambda s, at=at: at[s.name], skip=top)):
            axes.append(at)
    return axes


def _innermost(s: Statement, level: int) -> bool:
    """Is `level` the last of `s`, which loops at another (its contiguous axis: one
    value of it per iteration would leave the statement's loops strided, unvectorised;
    a column block takes such an axis)?"""
    return level == _rank(s) - 1 and any(_loops(s, lv) for lv in range(level))


def _kept_with(s: Statement, at: dict[str, int], deps: _Deps, extent: int) -> list[int]:
    """The levels of `s` (of `extent` iterations, the axis's) that every dependence
    between `s` and a statement placed in `at` keeps equal to that statement's level
    (none when no dependence joins them)."""
    levels = [k for k in range(_rank(s)) if s.extents[k] == extent]
    joined = False
    for (src, dst), m in deps.by_pair.items():
        if src == s.name and dst in at:
            pairs = [(k, at[dst]) for k in levels]
        elif dst == s.name and src in at:
            pairs = [(at[src], k) for k in levels]
        else:
            continue
        joined = True
        levels = [k for k, (a, b) in zip(levels, pairs) if _equal_at(m, a, b)]
    return levels if joined else []


def _blocked(tree: _Node, statements: list[Statement], deps: _Deps, block: int,
             kept: bool = True) -> _Node:
    """`tree` with a band over blocks of `block` columns and (with `kept`) the kept axes
    (see the module docstring) below its outer bands shared by every statement, when
    they do not already share every loop and the columns (or kept axes) are independent
    (one block may be all of them)."""
    if block <= 0:
        return tree
    everyone = {s.name for s in statements}
    chain: list[_Band] = []
    node = tree
    while isinstance(node, _Band) and {s.name for s in node.statements} == everyone:
        chain.append(node)
        node = node.child
    shared = [lv for b in chain for lv in b.levels]
    if len(shared) >= max(map(_rank, statements)):
        return tree  # every loop is shared already
    axes = [axis for axis in (kept_axes(statements, deps) if kept else [])
            if not all(lv in shared for lv in axis.values())]
    columns = block if _keeps(statements, deps, lambda s: _rank(s) - 1) else 0
    if not axes and not columns:
        return tree
    blocked = _Band([], list(statements), [True] * (len(axes) + bool(columns)), True,
                    node, columns, axes)
    if not chain:
        return blocked
    chain[-1].child = blocked
    return tree


def _tree(model: PolyModel, statements: tuple[Statement, ...], block: int,
          points_inside: bool = False, kept: bool = True) -> _Node:
    deps = _Deps.of(model)
    parts = independent_parts(model, statements)
    trees = []
    for part in parts:
        names = {s.name for s in part}
        own = deps if len(parts) == 1 else _Deps(
            {k: m for k, m in deps.by_pair.items() if k[0] in names}, deps.distances)
        tree = _build(part, 0, own, points_inside)
        trees.append((part, _blocked(_merge(tree, own), part, own, block, kept)))
    return trees[0][1] if len(trees) == 1 else _Sequence(trees)


def independent_parts(model: PolyModel, statements: tuple[Statement, ...]
                      ) -> list[list[Statement]]:
    """The statements in parts, each in program order, ordered by their first statement:
    two statements are in one part when a dependence joins them, or both read a tensor
    of which one of them reads more than one element (the reuse that sharing a loop can
    exploit), or a chain of such links does."""
    part = {s.name: s.name for s in statements}

    def find(x: str) -> str:
        while part[x] != x:
            part[x] = part[part[x]]
            x = part[x]
        return x

    for src, dst in _Deps.of(model).by_pair:
        part[find(src)] = find(dst)
    readers: dict[str, list[isl.Map]] = {}  # by tensor, its reads by statement
    by_statement: list[isl.Map] = []
    model.reads.foreach_map(by_statement.append)
    for m in by_statement:
        readers.setdefault(m.get_tuple_name(isl.dim_type.out), []).append(m)
    for reads in readers.values():
        # (isl's count of a read's elements only where it could join two statements)
        if len(reads) > 1 and any(not m.range().is_singleton() for m in reads):
            for a, b in zip(reads, reads[1:]):
                part[find(a.get_tuple_name(isl.dim_type.in_))] = \
                    find(b.get_tuple_name(isl.dim_type.in_))
    parts: dict[str, list[Statement]] = {}
    for s in statements:
        parts.setdefault(find(s.name), []).append(s)
    return list(parts.values())


def column_block(model: PolyModel, statements: tuple[Statement, ...],
                 element_bytes: dict[str, int], capacity: int, cores: int = 1,
                 vector: int = 16, kept: bool = True) -> int:
    """Columns per block for `_blocked`: the largest power of two (at least `vector`
    elements) whose columns' bytes (one column's counted with isl) fit `capacity`,
    leaving a block for each of `cores`. Long blocks matter more than small ones: the
    first pass reads each row's run of the block from memory, strided (a column
    log_softmax of 1024 x 4096 on two threads: 2.3 ms with blocks of 128 columns, 1.9
    with 256, 1.5 with 512, 1.3 with 2048); a power of two divides the usual widths, so
    isl's loops have no partial block. A column is counted at one value of the kept
    axes (`kept`), which the band iterates too, and there are blocks for the cores at
    each."""
    if not all(s.extents for s in statements):
        return 0
    axes = kept_axes(list(statements), _Deps.of(model)) if kept else []
    parts = [f"{s.name}[{_iters(s)}] : " + " and ".join(
        f"{s.iter_name(lv)} = 0" for lv in [axis[s.name] for axis in axes] + [_rank(s) - 1])
        for s in statements]
    one = isl.UnionSet.read_from_str(model.domain.get_ctx(), "{ " + "; ".join(parts) + " }")
    per_column = max(1, model.bytes_touched(one, element_bytes))
    columns = max(s.extents[-1] for s in statements)
    outer = 1
    for axis in axes:
        outer *= max(s.extents[axis[s.name]] for s in statements)
    block = vector
    while (block < columns and block * 2 * per_column <= capacity
           and block * 2 * cores <= columns * outer):
        block *= 2
    return block


def fusion_schedule(model: PolyModel, statements: tuple[Statement, ...],
                    block: int = 0, points_inside: bool = False,
                    kept: bool = True) -> isl.Schedule:
    """The schedule tree of a fused kernel (see the module docstring); `block` > 0
    allows column blocks of that many columns, and with `kept` the kept axes in their
    band; `points_inside` puts a statement of one instance (a whole sum's init) in the
    outermost loop after it, at its first iteration, not before it: a chip's cores tile
    one band, which a sequence at the root has not."""
    tree = _tree(model, statements, block, points_inside, kept)
    body = _text(tree)
    text = f'{{ domain: "{model.domain}"' + (f", child: {body}" if body else "") + " }"
    return isl.Schedule.read_from_str(model.domain.get_ctx(), text)


# a shared loop's level: one for every statement, or each statement's (a kept axis)
Level = int | dict[str, int]


@dataclass(frozen=True)
class Shared:
    """The loops two groups of statements share in a fused kernel: how many, whether
    the outermost band holding them is permutable, whether the groups are siblings (no
    dependence between them), the column block's size when one of the loops is a
    column block (else 0), and the levels the other shared loops run over."""

    depth: int
    permutable: bool
    siblings: bool
    block: int
    levels: tuple[Level, ...]

    @property
    def kept(self) -> int:
        """How many of the shared loops run over kept axes."""
        return sum(isinstance(level, dict) for level in self.levels)


def shared_depth(model: PolyModel, statements: tuple[Statement, ...], a: set[str],
                 b: set[str], block: int = 0) -> Shared:
    """The loops the groups of statements `a` and `b` share in the fused kernel.

    Only statements that meet count: for every dependence between the groups, the loops
    its source and sink share; the fewest over them. Siblings meet where they read the
    same element, and a loop along which they read it at different indices is shared
    but reuses nothing, so it ends their shared loops.
    """
    deps = _Deps.of(model)
    tree = _tree(model, statements, block)
    pairs = [(src, dst) for (src, dst) in deps.by_pair
             if (src in a and dst in b) or (src in b and dst in a)]
    siblings = not pairs
    if siblings:
        reuse = _Deps.of(model, model.input)
        pairs = [p for p in reuse.by_pair if (p[0] in a and p[1] in b) or (p[0] in b and p[1] in a)]
    if not pairs:
        return Shared(0, False, siblings, 0, ())
    loops = min((_shared_loops(tree, src, dst) for src, dst in pairs), key=len)
    if siblings:
        for k, axis in enumerate(loops):
            if any(reuse.has(reuse.by_pair[p], _level(axis, p[0], k), "!=") for p in pairs):
                loops = loops[:k]
                break
    permutable = tree.permutable if isinstance(tree, _Band) else True
    return Shared(len(loops), permutable, siblings, block if None in loops else 0,
                  tuple(axis for axis in loops if axis is not None))


def _level(loop: Level | None, statement: str, position: int) -> int:
    """The level of `statement` a shared loop runs over (a column block's: its position,
    as the levels once were)."""
    if loop is None:
        return position
    return loop if isinstance(loop, int) else loop.get(statement, position)


def _shared_loops(node: _Node, x: str, y: str) -> list[Level | None]:
    """The loops statements `x` and `y` share in a built tree, outermost first: the
    level each runs over, None for a column block's."""
    loops: list[Level | None] = []
    while True:
        if isinstance(node, _Band):
            loops += node.kept + node.levels + ([None] if node.block else [])
            node = node.child
        elif isinstance(node, _Sequence):
            runs = [child for run, child in node.runs
                    if {x, y} <= {s.name for s in run}]
            if not runs:
                return loops
            node = runs[0]
        else:
            return loops
