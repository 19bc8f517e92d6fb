"""Partitioning a primitive graph into kernels, by asking the fusion oracle.

The partitioner only proposes; `oracle(graph, a, b)` (the schedule-tree engine) answers
whether groups `a` and `b` can share outer loops and at what cost. Proposals, in order:

0. a float16 tensor's conversion to float32 joins its one reader, unasked; then short
   elementwise chains (`pointwise`: the oracle answers them without isl), so that a
   chain joins the contraction or reduction before it in one question;
1. vertical: each producer with each of its consumers (this covers a reduction followed
   by elementwise work along the kept axes);
2. horizontal: groups that read the same tensor;

repeated, each pair of groups asked once, until a round merges nothing; then

3. parallel (when a `parallel` oracle is given): groups that no path joins, each in
   execution order with the earlier ones, as independent parts of one kernel (AKG's
   "parallel fusion": a kernel call for the graph, not one per independent subgraph).
   They come last so that they never take the place of a merge that shares loops.

A person's edits come first (`force`, `forbid`: pairs of node names, the options
`fuse_force` and `fuse_forbid`): a forced pair is merged when the oracle finds a legal
shared loop, whatever the cost, and is otherwise an error carrying the oracle's reason
(the dependence that would reverse); a forbidden pair is never merged. So is a pair the
compile keeps `apart` (node, node, why): a kernel of both that no tiling fit, split
where its largest tensor passes (`compiler.compile_graph`).

A merge that would make the kernel graph cyclic (a path from one group to the other
through a third) is never proposed: no loop schedule could order such kernels, nor one
that would make a group larger than the fusion budget (MAX_GROUP_NODES): the oracle and
the kernel's passes cost more than linearly in a group's size, so a 1,000-node chain
becomes kernels of at most that many nodes and compiles in linear time. Every
proposal, answer and decision is one line of the fusion report.

Budgets (`budget.py`): an answer isl could not give within its operations is a refusal,
and once the stage's wall seconds are spent no proposal is asked any more: the groups
stay as they are (a node never merged is a kernel of its own). Either is a line of the
report and a fallback of the compile.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ..errors import GraphError, Problem
from .ir import Graph
from .ops import OPS
from .storage import STORAGE, widens

if TYPE_CHECKING:
    from ..budget import Ledger


class Answer(Protocol):
    legal: bool
    profitable: bool
    reason: str
    over_budget: bool  # isl ran past its operations: no answer, so no merge


Oracle = Callable[[Graph, tuple[str, ...], tuple[str, ...]], Answer]


@dataclass(frozen=True)
class FusionPlan:
    groups: tuple[tuple[str, ...], ...]  # node names per kernel, in execution order
    proposals: tuple[tuple[frozenset, str], ...]  # (nodes involved, report line)
    local: tuple[str, ...]  # tensors that no longer leave a kernel

    @property
    def report(self) -> tuple[str, ...]:
        return tuple(line for _, line in self.proposals)

    def report_for(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        """The report lines of proposals that involved any of `nodes`."""
        return tuple(line for involved, line in self.proposals if involved & set(nodes))

    def __str__(self) -> str:
        lines = [f"kernel {k}: {', '.join(g)}" for k, g in enumerate(self.groups)]
        lines += [f"  {line}" for line in self.report]
        if self.local:
            lines.append("not materialised in memory: " + ", ".join(self.local))
        return "\n".join(lines)


class _Partition:
    """Groups of nodes and the DAG between them, kept up to date merge by merge: each
    question (a group's successors, a path between two groups, the execution order)
    costs what the groups' edges cost, never a scan of every node."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.order = {n.name: k for k, n in enumerate(graph.nodes)}
        self.group_of = {n.name: n.name for n in graph.nodes}  # node -> group id
        self.members = {n.name: (n.name,) for n in graph.nodes}
        self.succ: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
        self.pred: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
        for n in graph.nodes:
            for c in graph.consumers(n.output):
                self.succ[n.name].add(c.name)
                self.pred[c.name].add(n.name)

    def group(self, node: str) -> tuple[str, ...]:
        return self.members[self.group_of[node]]

    def reaches(self, src: str, dst: str, skip_direct: bool) -> bool:
        """Is there a path src -> ... -> dst between groups (of length >= 2 when
        skip_direct)?"""
        frontier = [s for s in self.succ[src] if not (skip_direct and s == dst)]
        seen = set(frontier)
        while frontier:
            g = frontier.pop()
            if g == dst:
                return True
            for s in self.succ[g] - seen:
                seen.add(s)
                frontier.append(s)
        return False

    def would_cycle(self, ga: str, gb: str) -> bool:
        return self.reaches(ga, gb, True) or self.reaches(gb, ga, True)

    def merge(self, ga: str, gb: str) -> None:
        """Merge group `gb` into `ga` (both members lists stay in graph order)."""
        self.members[ga] = tuple(heapq.merge(self.members[ga], self.members.pop(gb),
                                             key=self.order.__getitem__))
        for n in self.members[ga]:
            if self.group_of[n] == gb:
                self.group_of[n] = ga
        for edges, back in ((self.succ, self.pred), (self.pred, self.succ)):
            for other in edges.pop(gb):
                back[other].discard(gb)
                if other != ga:
                    back[other].add(ga)
                    edges[ga].add(other)
            edges[ga].discard(gb)

    def groups(self) -> tuple[tuple[str, ...], ...]:
        """Groups in an execution order: topological over the group DAG, the ready group
        whose first node comes first in the graph first."""
        first = {g: self.order[m[0]] for g, m in self.members.items()}
        waiting = {g: len(self.pred[g]) for g in self.members}
        ready = [(first[g], g) for g, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        done: list[tuple[str, ...]] = []
        while ready:
            _, g = heapq.heappop(ready)
            done.append(self.members[g])
            for s in self.succ[g]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    heapq.heappush(ready, (first[s], s))
        return tuple(done)


def group_label(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else f"{{{', '.join(group)}}}"


# nodes one fusion group may hold: the oracle's answer and the kernel's own passes
# cost about their node count each, so long chains are cut into kernels of this size
# (an intermediate tensor between two of them is the price) and compile in linear time
MAX_GROUP_NODES = 32
CHAIN_NODES = 8  # the first round's elementwise chains, at most


def pointwise(graph: Graph, name: str) -> bool:
    """Is node `name` elementwise over its output's shape: a unary or binary op whose
    every operand has that shape or is broadcast to it (one element of it read at each
    point: layer_norm's gamma, its rows' 1 / std), no storage type, or is a scalar
    constant (a literal in the C)? Groups of such nodes over one shape share every
    loop, point by point; the oracle answers them without isl."""
    node = graph.node(name)
    out = graph.types[node.output]
    constants = {c.name for c in graph.constants}
    return (bool(out.shape) and OPS[node.op].family in ("unary", "binary")
            and all((t in constants and not graph.types[t].shape)
                    or (t not in constants and graph.types[t].dtype not in STORAGE
                        and _broadcasts_to(graph.types[t].shape, out.shape))
                    for t in (*node.inputs, node.output)))


def _broadcasts_to(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    return len(shape) <= len(out) and all(
        n in (1, m) for n, m in zip(reversed(shape), reversed(out)))


def _check_names(graph: Graph, pairs, option: str) -> None:
    names = {n.name for n in graph.nodes}
    problems = [Problem(f"no primitive node is named {x!r} (the kernels' node lists name "
                        "them)", field=f"options.{option}.{k}")
                for k, pair in enumerate(pairs) for x in pair if x not in names]
    if problems:
        raise GraphError(problems)


def _across(x: str, y: str, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Is one of nodes `x`, `y` in group `a` and the other in `b`?"""
    return (x in a and y in b) or (x in b and y in a)


def fuse_graph(graph: Graph, oracle: Oracle, *, force: tuple[tuple[str, str], ...] = (),
               forbid: tuple[tuple[str, str], ...] = (),
               apart: tuple[tuple[str, str, str], ...] = (),
               force_oracle: Oracle | None = None, parallel: Oracle | None = None,
               max_group_nodes: int = MAX_GROUP_NODES,
               ledger: "Ledger | None" = None) -> FusionPlan:
    """Grow fusion groups by asking `oracle` (see the module docstring); a merge that
    would make a group of more than `max_group_nodes` nodes is not proposed, and the
    report says so; with `ledger`, the oracle is asked only while the fusion budget
    lasts.

    Before: softmax as reduce_max, sub, exp, reduce_sum, div (five kernels). After: one
    group of all five, with report lines such as "fused sub into {reduce_max}: legal at
    depth 1, permutable, footprint 64.0 KiB per iteration; saves 128.0 MiB".
    """
    _check_names(graph, force, "fuse_force")
    _check_names(graph, forbid, "fuse_forbid")
    p = _Partition(graph)
    report: list[tuple[frozenset, str]] = []
    # pairs of groups, in either order, with the oracle asked (a parallel proposal is
    # another question than a sibling one about the same pair)
    asked: set[tuple[frozenset[tuple[str, ...]], Oracle]] = set()
    out_of_time = False  # the wall budget ran out: the proposals left are not asked
    answered = 0  # proposals the oracle answered

    def ask(question: Oracle, a: tuple[str, ...], b: tuple[str, ...], pair: str) -> Answer | None:
        """`question`'s answer within the budgets, or None once the wall budget is spent
        (the first time, a report line says so)."""
        nonlocal out_of_time, answered
        if ledger is None:
            return question(graph, a, b)
        if out_of_time:
            return None
        if ledger.exhausted("fuse"):
            out_of_time = True
            line = ledger.fell_back(
                f"fusion fallback: {ledger.out_of_time('fuse')} after {answered} "
                f"proposals: {pair} and every later proposal were not asked; the groups "
                "stay as they are")
            report.append((frozenset(n.name for n in graph.nodes), line))
            return None
        with ledger.timing("fuse"):
            answer = question(graph, a, b)
        answered += 1
        return answer

    def forbidden(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        return any(_across(x, y, a, b) for x, y in forbid)

    def kept_apart(a: tuple[str, ...], b: tuple[str, ...]) -> str:
        return next((why for x, y, why in apart if _across(x, y, a, b)), "")

    def propose(a_node: str, b_node: str, kind: str, question: Oracle = oracle) -> bool:
        """Ask about the groups of two nodes, once per pair of groups; True if merged."""
        ga, gb = p.group_of[a_node], p.group_of[b_node]
        a, b = p.members[ga], p.members[gb]
        if ga == gb or (frozenset((a, b)), question) in asked:
            return False
        asked.add((frozenset((a, b)), question))
        involved = frozenset(a + b)
        pair = f"{group_label(b)} + {group_label(a)}"
        if forbidden(a, b):
            report.append((involved, f"{kind}: {pair}: rejected: forbidden by options.fuse_forbid"))
            return False
        if why := kept_apart(a, b):
            report.append((involved, f"{kind}: {pair}: kept apart: {why}"))
            return False
        if len(a) + len(b) > max_group_nodes:
            report.append((involved, f"{kind}: {pair}: kept apart: together they would "
                           f"be {len(a) + len(b)} nodes, over the fusion budget of "
                           f"{max_group_nodes} per kernel"))
            return False
        if p.would_cycle(ga, gb):
            cycle = "another kernel sits between them (fusing would create a cycle)"
            report.append((involved, f"{kind}: {pair}: rejected: {cycle}"))
            return False
        answer = ask(question, a, b, pair)
        if answer is None:
            return False
        if answer.legal and answer.profitable:
            p.merge(ga, gb) if p.order[a[0]] <= p.order[b[0]] else p.merge(gb, ga)
            fused = f"fused {group_label(b)} into {group_label(a)}"
            report.append((involved, f"{kind}: {fused}: {answer.reason}"))
            return True
        line = f"{kind}: {pair}: rejected: {answer.reason}"
        if answer.over_budget and ledger is not None:
            line = ledger.fell_back(f"fusion fallback: {kind}: {pair}: kept apart: "
                                    f"{answer.reason}")
        report.append((involved, line))
        return False

    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for t in dict.fromkeys(node.inputs):
            readers.setdefault(t, []).append(node.name)
    # a float16 tensor read into float32 is part of its one reader (`storage.py`): the
    # kernel converts where it loads, a contraction's operand stays a load of its own
    for node in graph.nodes:
        (reader, *more) = readers.get(node.output, [None])
        if widens(node, graph) and not more and reader and node.output not in graph.outputs:
            p.merge(p.group_of[node.name], p.group_of[reader])
            report.append((frozenset((node.name, reader)),
                           f"widening: {node.name} is read as float32 where {reader} loads it"))
    for k, (x, y) in enumerate(force):
        ga, gb = p.group_of[x], p.group_of[y]
        a, b = p.members[ga], p.members[gb]
        where = f"options.fuse_force.{k}"
        if ga == gb:
            continue
        if forbidden(a, b):
            raise GraphError(Problem(f"{x} and {y} are also in options.fuse_forbid", field=where))
        if p.would_cycle(ga, gb):
            raise GraphError(Problem(f"fusing {group_label(b)} into {group_label(a)} would "
                                     "create a cycle: another kernel sits between them",
                                     field=where))
        answer = (force_oracle or oracle)(graph, a, b)
        if not answer.legal:
            raise GraphError(Problem(f"fusing {group_label(b)} into {group_label(a)} is "
                                     f"illegal: {answer.reason}", field=where))
        p.merge(ga, gb) if p.order[a[0]] <= p.order[b[0]] else p.merge(gb, ga)
        asked.add((frozenset((a, b)), oracle))
        report.append((frozenset(a + b), f"forced by options.fuse_force: fused "
                                         f"{group_label(b)} into {group_label(a)}: {answer.reason}"))
    # short elementwise chains first (`pointwise` over one shape, each link its
    # producer's one consumer): the oracle answers them without isl, and a chain that is
    # one group costs the contraction or reduction it then joins one question, not one
    # per node (linear+gelu: 8 of isl's answers to 2). Kept to CHAIN_NODES, far under the
    # fusion budget: a long one could fill a group the later rounds would have grown
    for node in graph.nodes:
        (consumer, *more) = graph.consumers(node.output) or [None]
        if (consumer is not None and not more and pointwise(graph, node.name)
                and pointwise(graph, consumer.name)
                and graph.types[node.output].shape == graph.types[consumer.output].shape
                and len(p.members[p.group_of[node.name]])
                + len(p.members[p.group_of[consumer.name]]) <= CHAIN_NODES):
            propose(node.name, consumer.name, "vertical")
    # a merge changes what the merged group can share, so a pair refused before may be
    # accepted now: propose again until a whole round merges nothing (each round that
    # merges leaves fewer groups, so this ends)
    merged = True
    while merged:
        merged = False
        for node in graph.nodes:
            for consumer in graph.consumers(node.output):
                merged |= propose(node.name, consumer.name, "vertical")
        for t, names in readers.items():
            for first, other in zip(names, names[1:]):
                merged |= propose(first, other, f"horizontal (both read {t})")
    if parallel is not None:
        anchors: list[str] = []  # the first node of each group kept so far
        for group in p.groups():
            joined = False
            for anchor in anchors:
                ga, gb = p.group_of[anchor], p.group_of[group[0]]
                if not (p.reaches(ga, gb, False) or p.reaches(gb, ga, False)):
                    joined = propose(anchor, group[0], "parallel (independent)", parallel)
                    if joined:
                        break
            if not joined:
                anchors.append(group[0])

    groups = p.groups()
    # a tensor stays inside its kernel when it is no output and every reader is there
    local = tuple(graph.nodes[p.order[n]].output for g in groups for n in g
                  if graph.nodes[p.order[n]].output not in graph.outputs
                  and all(p.group_of[c.name] == p.group_of[n]
                          for c in graph.consumers(graph.nodes[p.order[n]].output)))
    return FusionPlan(groups, tuple(report), local)
