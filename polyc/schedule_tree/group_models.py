"""The polyhedral models of fusion groups, kept from one proposal to the next.

The oracle answers a proposal from the dependences of the merged group. Computed afresh,
they cost isl's dataflow over every statement of the group, again at each proposal as
the group grows: a chain of 32-node groups of matmuls spent 0.15 s per proposal there.
But a merge adds no dependence inside either group, only between them: each tensor is
written by the statements of one node (its init and its update), so no write of one
group lies between a write and a read of the other's tensors, and nothing either
group's dataflow found is killed or changed by the merge. The merged dependences are the
two groups' (their statements renamed to the merged kernel's) and the cross ones,
computed with only one group's accesses as sinks and the other's as sources:

    deps(a + b) = deps(a) | deps(b) | flow, anti, output, input between a and b

The merged domain and accesses are the two groups' too (renamed); only the original
order is written anew. A group's model is kept after the proposal that built it, so the
next proposal about that group (the usual case: a chain grows by one node) pays for the
new node and the pairs it makes. When a group's statements differ in the merged kernel (a prologue folded
into a contraction once its producer joined the same kernel), the merged model is
computed afresh.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import islpy as isl

from ..graph.ir import Graph
from ..kernel import Kernel, build_kernels
from .dependences import compute_dependences, cross_dependences
from .model import PolyModel, build_model, original_order

# groups kept: a fuse stage works on a few groups at a time (the one growing and its
# neighbours); older ones are rebuilt when asked about again
KEPT_GROUPS = 64
# kernels kept (cheaper than models, asked about more: each proposal builds the merged
# kernel and each side's alone)
KEPT_KERNELS = 4 * KEPT_GROUPS


class GroupModels:
    """Models with dependences of a graph's fusion groups, all in one isl context."""

    def __init__(self, graph: Graph, kept: int = KEPT_GROUPS):
        self.graph = graph
        self.ctx = isl.Context()
        self.kept = kept
        self._models: OrderedDict[tuple[str, ...], tuple[Kernel, PolyModel]] = OrderedDict()
        self._kernels: OrderedDict[tuple[str, ...], Kernel] = OrderedDict()

    def kernel(self, group: tuple[str, ...]) -> Kernel:
        """The kernel of `group` alone, as `build_kernels` builds it: a proposal's merged
        kernel is, once accepted, the group the next proposals are about."""
        if group in self._kernels:
            self._kernels.move_to_end(group)
        else:
            (self._kernels[group],) = build_kernels(self.graph, (group,))
            while len(self._kernels) > KEPT_KERNELS:
                self._kernels.popitem(last=False)
        return self._kernels[group]

    def merged(self, kernel: Kernel, a: tuple[str, ...], b: tuple[str, ...]) -> PolyModel:
        """The model with dependences of `kernel`, the merge of groups `a` and `b`."""
        parts = ([_renamed(*self._group(g), kernel) for g in (a, b)]
                 if a in self._models or b in self._models else [None])
        if None not in parts:
            x, y = parts
            domain = x.domain.union(y.domain)
            model = PolyModel(domain, x.reads.union(y.reads), x.writes.union(y.writes),
                              original_order(kernel.statements, domain))
            model = cross_dependences(model, x, y)
        else:  # neither is known (one dataflow over the whole costs less than three), or
            # the merge changed a statement
            model = build_model(kernel.statements, _arrays(kernel), self.ctx)
            model = compute_dependences(model, siblings_only=True)
        self._keep(kernel.nodes, kernel, model)
        return model

    def known(self, kernel: Kernel) -> PolyModel | None:
        """The model with dependences of `kernel` if a proposal built it (in `ctx`): the
        kernel of a final group is most often the last merge accepted, whose dataflow
        need not run again (the model and dependences passes: 11% of the compile
        time over the examples and the tests' graphs)."""
        kept = self._models.get(kernel.nodes)
        if kept is None or kept[0].statements != kernel.statements \
                or _arrays(kept[0]) != _arrays(kernel):
            return None
        return kept[1]

    def _group(self, group: tuple[str, ...]) -> tuple[Kernel, PolyModel]:
        if group in self._models:
            self._models.move_to_end(group)
            return self._models[group]
        kernel = self.kernel(group)
        model = compute_dependences(build_model(kernel.statements, _arrays(kernel), self.ctx),
                                    siblings_only=len(kernel.nodes) > 1)
        self._keep(group, kernel, model)
        return kernel, model

    def _keep(self, group: tuple[str, ...], kernel: Kernel, model: PolyModel) -> None:
        self._models[group] = (kernel, model)
        self._models.move_to_end(group)
        while len(self._models) > self.kept:
            self._models.popitem(last=False)


def _arrays(kernel: Kernel) -> dict[str, str]:
    return {x.tensor: x.c_name for x in kernel.arrays}


def _renamed(kernel: Kernel, model: PolyModel, merged: Kernel) -> PolyModel | None:
    """`model` (of `kernel`) with its statements named as in `merged`, or None when a
    statement of `kernel` is not in `merged` unchanged."""
    position = {n: j for j, n in enumerate(merged.nodes)}
    in_merged = {s.name: s for s in merged.statements}
    names: dict[str, str] = {}
    for s in kernel.statements:
        head, sep, tail = s.name.partition("_")
        node = kernel.nodes[int(head[1:])]
        name = f"S{position[node]}{sep}{tail}"
        if in_merged.get(name) != replace(s, name=name):
            return None
        names[s.name] = name
    if all(old == new for old, new in names.items()):
        # the usual case: a group that grows at its end keeps its statements' names
        return model
    domain = isl.UnionSet.empty(model.domain.get_space())
    sets: list[isl.Set] = []
    model.domain.foreach_set(sets.append)
    for one in sets:
        domain = domain.add_set(one.set_tuple_name(names[one.get_tuple_name()]))
    dependences = {kind: _rename(getattr(model, kind), names, names)
                   for kind in ("flow", "anti", "output", "input")}
    return replace(model, domain=domain, reads=_rename(model.reads, names),
                   writes=_rename(model.writes, names), **dependences)


def _rename(relation: isl.UnionMap, names: dict[str, str],
            sinks: dict[str, str] | None = None) -> isl.UnionMap:
    """`relation` with its statements (its domain's, and its range's by `sinks`) renamed."""
    out = isl.UnionMap.empty(relation.get_space())
    maps: list[isl.Map] = []
    relation.foreach_map(maps.append)
    for m in maps:
        m = m.set_tuple_name(isl.dim_type.in_, names[m.get_tuple_name(isl.dim_type.in_)])
        if sinks is not None:
            m = m.set_tuple_name(isl.dim_type.out, sinks[m.get_tuple_name(isl.dim_type.out)])
        out = out.union(m)
    return out
