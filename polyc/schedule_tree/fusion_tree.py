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
    block: int = 0  # > 0: one member, floor(last iterator / block) (a column block)


@dataclass
class _Sequence:
    runs: list[tuple[list[Statement], "_Node"]]


@dataclass
class _Leaf:
    pass


_Node = _Band | _Sequence | _Leaf


@dataclass
class _Deps:
    """Dependence relations by (source statement, sink statement)."""

    by_pair: dict[tuple[str, str], isl.Map] = field(default_factory=dict)
    # by id of a map asked about, with the map (so its id stays its own)
    distances: dict[int, tuple[isl.Map, isl.Set]] = field(default_factory=dict)

    @staticmethod
    def of(model: PolyModel, relation: isl.UnionMap | None = None) -> "_Deps":
        """The model's dependences, or `relation` (e.g. its read-after-read pairs)."""
        deps = _Deps()
        maps = (model.dependences if relation is None else relation).get_map_list()
        for m in (maps.get_at(i) for i in range(maps.n_map())):
            key = (m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out))
            deps.by_pair[key] = deps.by_pair[key].union(m) if key in deps.by_pair else m
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
    members = []
    if node.block:
        members.append("{ " + "; ".join(
            f"{s.name}[{_iters(s)}] -> [(floor(({s.iter_name(_rank(s) - 1)})/{node.block}))]"
            for s in node.statements) + " }")
    for lv in node.levels:  # a scalar joined to the loop: its first iteration
        members.append("{ " + "; ".join(
            f"{s.name}[{_iters(s)}] -> [({s.iter_name(lv) if lv < _rank(s) else 0})]"
            for s in node.statements) + " }")
    coincident = ", ".join(str(int(c)) for c in node.coincident)
    body = _text(node.child)
    text = (f'{{ schedule: "[{", ".join(members)}]", permutable: {int(node.permutable)}, '
            f"coincident: [ {coincident} ]")
    text += (f", child: {body}" if body else "") + " }"
    # the mark tells later passes that the bands below it work on one block
    mark = marks.ColumnBlock(node.block)
    return f'{{ mark: "{mark}", child: {text} }}' if node.block else text


def _keeps_last(statements: list[Statement], deps: _Deps) -> bool:
    """Does every dependence keep its source's and sink's last iterators equal?"""
    last = {s.name: _rank(s) - 1 for s in statements}
    if min(last.values(), default=-1) < 0:
        return False
    for (src, dst), m in deps.by_pair.items():
        equal = m.equate(isl.dim_type.in_, last[src], isl.dim_type.out, last[dst])
        if not m.is_subset(equal):
            return False
    return True


def _blocked(tree: _Node, statements: list[Statement], deps: _Deps, block: int) -> _Node:
    """`tree` with a band over blocks of `block` columns (see the module docstring)
    below its outer bands shared by every statement, when they do not already share
    every loop and the columns are independent (one block may be all of them)."""
    if block <= 0 or not _keeps_last(statements, deps):
        return tree
    everyone = [s.name for s in statements]
    chain: list[_Band] = []
    node = tree
    while isinstance(node, _Band) and [s.name for s in node.statements] == everyone:
        chain.append(node)
        node = node.child
    if sum(len(b.levels) for b in chain) >= max(map(_rank, statements)):
        return tree  # every loop is shared already
    blocked = _Band([], list(statements), [True], True, node, block)
    if not chain:
        return blocked
    chain[-1].child = blocked
    return tree


def _tree(model: PolyModel, statements: tuple[Statement, ...], block: int,
          points_inside: bool = False) -> _Node:
    deps = _Deps.of(model)
    parts = independent_parts(model, statements)
    trees = []
    for part in parts:
        names = {s.name for s in part}
        own = _Deps({k: m for k, m in deps.by_pair.items() if k[0] in names})
        tree = _build(part, 0, own, points_inside)
        trees.append((part, _blocked(_merge(tree, own), part, own, block)))
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
                 vector: int = 16) -> int:
    """Columns per block for `_blocked`: the largest power of two (at least `vector`
    elements) whose columns' bytes (one column's counted with isl) fit `capacity`,
    leaving a block for each of `cores`. Long blocks matter more than small ones: the
    first pass reads each row's run of the block from memory, strided (a column
    log_softmax of 1024 x 4096 on two threads: 2.3 ms with blocks of 128 columns, 1.9
    with 256, 1.5 with 512, 1.3 with 2048); a power of two divides the usual widths, so
    isl's loops have no partial block."""
    parts = []
    for s in statements:
        if not s.extents:
            return 0
        parts.append(f"{s.name}[{_iters(s)}] : {s.iter_name(_rank(s) - 1)} = 0")
    one = isl.UnionSet.read_from_str(model.domain.get_ctx(), "{ " + "; ".join(parts) + " }")
    per_column = max(1, model.bytes_touched(one, element_bytes))
    columns = max(s.extents[-1] for s in statements)
    block = vector
    while block * 2 * per_column <= capacity and block * 2 * cores <= columns:
        block *= 2
    return block


def fusion_schedule(model: PolyModel, statements: tuple[Statement, ...],
                    block: int = 0, points_inside: bool = False) -> isl.Schedule:
    """The schedule tree of a fused kernel (see the module docstring); `block` > 0
    allows column blocks of that many columns; `points_inside` puts a statement of one
    instance (a whole sum's init) in the outermost loop after it, at its first iteration,
    not before it: a chip's cores tile one band, which a sequence at the root has not."""
    tree = _tree(model, statements, block, points_inside)
    body = _text(tree)
    text = f'{{ domain: "{model.domain}"' + (f", child: {body}" if body else "") + " }"
    return isl.Schedule.read_from_str(model.domain.get_ctx(), text)


def shared_depth(model: PolyModel, statements: tuple[Statement, ...], a: set[str],
                 b: set[str], block: int = 0) -> tuple[int, bool, bool, int]:
    """How many outer loops the groups of statements `a` and `b` share in the fused
    kernel, whether the outermost band holding them is permutable, whether they are
    siblings (no dependence between them), and the column block size when one of the
    shared loops is a column block (else 0).

    Only statements that meet count: for every dependence between the groups, the loops
    its source and sink share; the minimum over them. Siblings meet where they read the
    same element, and a loop along which they read it at different indices is shared
    but reuses nothing, so it ends their shared depth.
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
        return 0, False, siblings, 0
    depth = min(_common_depth(tree, src, dst) for src, dst in pairs)
    if siblings:
        for level in range(depth):
            if any(reuse.has(reuse.by_pair[p], level, "!=") for p in pairs):
                depth = level
                break
    permutable = tree.permutable if isinstance(tree, _Band) else True
    return depth, permutable, siblings, _shared_block(tree, depth)


def _shared_block(node: _Node, depth: int) -> int:
    """The block size of a column block among the outer `depth` loops, else 0."""
    while depth > 0 and isinstance(node, _Band):
        if node.block:
            return node.block
        depth -= len(node.levels)
        node = node.child
    return 0


def _common_depth(node: _Node, x: str, y: str) -> int:
    """The number of loops statements `x` and `y` share in a built tree."""
    depth = 0
    while True:
        if isinstance(node, _Band):
            depth += len(node.levels) + (1 if node.block else 0)
            node = node.child
        elif isinstance(node, _Sequence):
            runs = [child for run, child in node.runs
                    if {x, y} <= {s.name for s in run}]
            if not runs:
                return depth
            node = runs[0]
        else:
            return depth
