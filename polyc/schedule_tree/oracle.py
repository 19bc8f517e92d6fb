"""The fusion oracle: the graph layer proposes merging two groups of nodes, isl answers.

For a proposal the oracle builds the polyhedral model of the merged group, computes its
dependences with isl and builds the fused kernel's loop structure from them (the very
schedule the kernel will get, `fusion_tree`). It answers:

- shared depth: how many outer loops a statement of each group share, each keeping its
  own loop order; 0 when one iteration of the consumer's outer loop needs the producer's
  for several values (a reduction across the loop, a full reduction, a transpose);
- permutable: whether the outermost shared band may be tiled;
- footprint: bytes of distinct array elements one iteration of the shared loops touches,
  counted exactly with isl, against the capacity of the target's fusion level;
- saved bytes: the intermediate memory traffic the merge removes.

Two answers come before the loops are looked at: a cheap elementwise producer of a
contraction's operand, or of its epilogue, is folded into it (`prologue.py`: no loop is
shared, none is needed), and a merge that would leave a large contraction no microkernel
can compute (a matmul with a reduction over its rows after it; on the chips, with the
softmax of its rows, which the cpu's nest runs as a row tail) is refused. Which
contraction a target's microkernels compute is the backend's to say: it hands the oracle
a `Microkernels` question. When the merged kernel is one, the footprint leaves out the
contraction's operands: the microkernel's nest blocks them itself.

`ask_parallel` answers the last proposals, of groups with no path between them: they
may be independent parts of one kernel (`fusion_tree`), a sequence of their own loop
nests, when nothing joins their statements and no contraction leaves its microkernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import islpy as isl

from ..budget import OutOfOperations, isl_operations
from ..graph.fuse import group_label, pointwise
from ..graph.ir import Graph
from ..graph.ops import OPS
from ..graph.storage import STORAGE
from ..kernel import Kernel
from ..kernel.comprehension import first_sum, loads
from ..machine import Machine
from .fusion_tree import Level, column_block, independent_parts, shared_depth
from .group_models import GroupModels
from .model import PolyModel
from .passes import element_bytes

# (kernel, least flops worth one) -> the name of the microkernel that would compute the
# kernel's contraction, or None: the backend's answer
Microkernels = Callable[[Kernel, int], "str | None"]

# below this a contraction's plain loops fused with their neighbours (a tiny attention
# in one kernel) beat a microkernel call between separate kernels
KEEP_MICROKERNEL_FLOPS = 1 << 20
# ... but a convolution's plain loops reduce over windows of a few elements, which do
# not vectorise: a 442 KFLOP 3x3 conv of a small CNN fused with its batch norm and the
# next conv ran 5x slower than the two on their microkernel
KEEP_CONV_MICROKERNEL_FLOPS = 1 << 16

@dataclass(frozen=True)
class FusionAnswer:
    legal: bool  # a legal schedule shares at least one outer loop between the groups
    depth: int  # how many outer loops they share
    permutable: bool  # the shared band can be tiled
    footprint: int  # bytes touched by one iteration of the shared loops
    capacity: int  # bytes of the target level the footprint must fit
    saved_bytes: int  # intermediate memory traffic removed by fusing
    reason: str
    over_budget: bool = False  # isl ran past its operations before it could answer

    @property
    def profitable(self) -> bool:
        return self.legal and self.footprint <= self.capacity


# a group of statements that run at most this many times in all may join a neighbour it
# shares no loop with (in sequence, in one kernel)
TINY_INSTANCES = 64
# ... and so may one that does at most this share of its neighbour's work, when what it
# hands over fits the fusion level: its loops cost little next to the other's, and one
# kernel saves a call and keeps its result in cache (a reduction's per-channel result
# reshaped, a bias reshaped before it is broadcast over an image)
SMALL_SHARE = 1 / 16


def _small_side(graph: Graph, kernel: Kernel, capacity: int,
                *groups: tuple[tuple[str, ...], set[str]]) -> tuple[tuple[str, ...], str] | None:
    """The group that may run in sequence with the other in one kernel, and why (see
    TINY_INSTANCES and SMALL_SHARE), if any: scalars computed before the loops that
    broadcast them, or after a whole reduction (MindSpore's fused kernels are full of
    them), cost a call and a round trip through memory in a kernel of their own."""
    work = [sum(math.prod(s.extents) for s in kernel.statements if s.name in names)
            for _, names in groups]
    for (nodes, _), mine, theirs in zip(groups, work, reversed(work)):
        if mine <= TINY_INSTANCES:
            return nodes, f"computes at most {TINY_INSTANCES} values: it runs once"
        handed = sum(graph.types[graph.node(n).output].nbytes for n in nodes)
        if mine <= SMALL_SHARE * theirs and handed <= capacity:
            return nodes, (f"does {mine} iterations, at most 1/{round(1 / SMALL_SHARE)} of "
                           f"the other's {theirs}, and its results ({_mib(handed)}) stay in "
                           "cache: it runs")
    return None


def _statements_of(kernel: Kernel, nodes: tuple[str, ...]) -> set[str]:
    """isl names of the statements lowered from `nodes` (S<j> and S<j>_init)."""
    index = {n: j for j, n in enumerate(kernel.nodes)}
    prefixes = {f"S{index[n]}" for n in nodes}
    return {s.name for s in kernel.statements if s.name.split("_")[0] in prefixes}


def footprint(model: PolyModel, kernel: Kernel, levels: tuple[Level, ...], block: int = 0,
              skip: frozenset[str] = frozenset(), boxes: bool = False) -> int:
    """Bytes of distinct elements (with `boxes`, of each array's bounding box: a chip's
    copies) touched by the first iteration of the shared loops over `levels` (on box
    domains every iteration is alike) by the statements not in `skip`; with `block`, one
    of them is a column block: the first `block` columns."""
    parts = []
    for s in kernel.statements:
        if s.name in skip:
            continue
        n = len(s.extents)
        iters = ", ".join(s.iter_name(d) for d in range(n))
        at = [lv if isinstance(lv, int) else lv.get(s.name, n) for lv in levels]
        fixed = [f"{s.iter_name(d)} = 0" for d in at if d < n]
        if block and n:
            fixed.append(f"{s.iter_name(n - 1)} < {block}")
        parts.append(f"{s.name}[{iters}]" + (f" : {' and '.join(fixed)}" if fixed else ""))
    first = isl.UnionSet.read_from_str(model.domain.get_ctx(), "{ " + "; ".join(parts) + " }")
    return model.bytes_touched(first, element_bytes(kernel), boxes)


def ask_fusion(graph: Graph, a: tuple[str, ...], b: tuple[str, ...], machine: Machine,
               microkernels: Microkernels = lambda kernel, flops: None, *,
               max_operations: int = 0, models: GroupModels | None = None) -> FusionAnswer:
    """Can groups `a` and `b` (node names) share outer loops, and is it worth it? isl
    may spend `max_operations` on the question (0: no limit); past them the answer is a
    refusal marked `over_budget`. `models` keeps the groups' models between the
    proposals of one fuse stage (`group_models.py`)."""
    if (answer := _pointwise_answer(graph, a, b, machine)) is not None:
        return answer
    return _isl_answer(graph, a, b, machine, microkernels, max_operations, models)


def ask_parallel(graph: Graph, a: tuple[str, ...], b: tuple[str, ...], machine: Machine,
                 microkernels: Microkernels = lambda kernel, flops: None, *,
                 models: GroupModels | None = None) -> FusionAnswer:
    """May groups `a` and `b`, which no path joins in the kernel graph, be independent
    parts of one kernel? Each part keeps its own loops and their marks, so the merge
    costs no parallelism and saves a kernel call (and reads a common single value once).
    `models` keeps the groups' models between proposals, as for `ask_fusion`: the merged
    dependences are the two groups' and the few between them (the graph of
    size1-everywhere spent a third of its fuse stage on dataflow over the whole merge)."""
    if (refused := _no_sequence(machine, "independent")) is not None:
        return refused
    models = models or GroupModels(graph)
    kernel, lost = _merged_kernel(graph, a, b, microkernels, models)
    capacity = machine.fusion_level.capacity
    if lost:
        return FusionAnswer(False, 0, False, 0, capacity, 0, lost)
    kept_a, kept_b = _statements_of(kernel, a), _statements_of(kernel, b)
    for part in independent_parts(models.merged(kernel, a, b), kernel.statements):
        names = {s.name for s in part}
        if names & kept_a and names & kept_b:
            return FusionAnswer(False, 0, False, 0, capacity, 0,
                                "they read a common tensor beyond single elements: in one "
                                "kernel they would share loops, which reuse nothing")
    saved = _saved_bytes(graph, a, b)
    return FusionAnswer(True, 0, True, 0, capacity, saved,
                        "independent: parts of one kernel, in sequence, each with its own "
                        f"loops; saves {_mib(saved)} and a kernel call")


def _merged_kernel(graph: Graph, a: tuple[str, ...], b: tuple[str, ...],
                   microkernels: Microkernels, models: GroupModels) -> tuple[Kernel, str]:
    """The kernel of `a` and `b` merged, and why a contraction of theirs would lose its
    microkernel in it ('' if none would)."""
    order = {n.name: k for k, n in enumerate(graph.nodes)}
    merged = tuple(sorted(a + b, key=order.__getitem__))
    kernel = models.kernel(merged)
    return kernel, _microkernel_lost(graph, kernel, (a, b), microkernels, models)


def _nest_blocked(kernel: Kernel, microkernels: Microkernels) -> frozenset[str]:
    """The contraction statement of a kernel a microkernel computes: the nest blocks its
    operands itself (B packed once for every row block, in the block level), so one
    iteration of the shared loops does not hold them (attention's scores with their
    softmax: a row needs all of k, yet the nest keeps k in L3 and a block of rows in L2)."""
    if microkernels(kernel, 0) is None:
        return frozenset()
    first = first_sum(kernel.statements)
    return frozenset({first.name}) if first is not None else frozenset()


def _pointwise_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...],
                      machine: Machine) -> FusionAnswer | None:
    """The answer for groups of elementwise nodes over one shape, without isl (None
    for any other groups). Each statement instance reads and writes its own point of
    every tensor of the groups, and one element of each tensor it broadcasts (from
    outside them: every tensor the groups make has their shape), so every dependence
    stays at one point: all loops are shared and permutable, and one iteration touches
    one element of each tensor. It is what isl answers for such groups (a test compares
    them), at a cost linear in the groups' size rather than isl's model of the merged
    kernel. Not for groups touching a storage type (float16, bfloat16, bool): the casts
    widening it are recomputed where read (`kernel.prologue`), which this count does not
    model."""
    shape = graph.types[graph.node(a[0]).output].shape
    if not all(pointwise(graph, n) and graph.types[graph.node(n).output].shape == shape
               for n in a + b):
        return None
    tensors = {t: graph.types[t].itemsize for n in a + b
               for t in (*graph.node(n).inputs, graph.node(n).output)
               if graph.types[t].shape}  # a scalar constant is a literal
    depth = len(shape)
    return _loop_answer(graph, a, b, machine, depth, True, sum(tensors.values()), 0)


def _epilogue_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...], machine: Machine,
                     kernel: Kernel, blocked: frozenset[str]) -> FusionAnswer | None:
    """The answer for a contraction on its microkernel's nest (`blocked`) with
    elementwise work on its result, without isl (None for any other groups, or a merge
    too large for the fusion level, whose other answers isl gives). Every other node is
    unary or binary over the contraction's output shape, reading each tensor of the
    groups at its own point (a tensor from outside them may be broadcast). Then every
    statement but the update has the output's loops, all shared and permutable, and one
    iteration touches one element of each array it names. It is what isl answers (a
    test compares them), without the model of the merged kernel: two thirds of the fuse
    stage of linear+gelu."""
    contractions = [n for n in a + b if graph.node(n).op in ("matmul", "conv2d")]
    if len(contractions) != 1 or not blocked:
        return None
    shape = graph.types[graph.node(contractions[0]).output].shape
    inside = {graph.node(n).output for n in a + b}
    for n in a + b:
        node = graph.node(n)
        if n == contractions[0]:
            continue
        if (OPS[node.op].family not in ("unary", "binary")
                or graph.types[node.output].shape != shape):
            return None
        if any(graph.types[t].dtype in STORAGE or (t in inside and graph.types[t].shape != shape)
               for t in (*node.inputs, node.output)):
            return None
    statements = [s for s in kernel.statements if s.name not in blocked]
    if any(s.extents != shape for s in statements):
        return None
    size = {x.tensor: x.type.itemsize for x in kernel.arrays}
    named = {s.target for s in statements} | {load.tensor for s in statements
                                              for load, _ in loads(s.expr)}
    answer = _loop_answer(graph, a, b, machine, len(shape), True,
                          sum(size[t] for t in named), 0)
    return answer if answer.profitable else None


def _isl_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...], machine: Machine,
                microkernels: Microkernels, max_operations: int = 0,
                models: GroupModels | None = None) -> FusionAnswer:
    """The answer from isl's model of the merged kernel (see the module docstring)."""
    models = models or GroupModels(graph)
    kernel, lost = _merged_kernel(graph, a, b, microkernels, models)
    capacity = machine.fusion_level.capacity
    if lost:
        return FusionAnswer(False, 0, False, 0, capacity, 0, lost)
    kept_a, kept_b = _statements_of(kernel, a), _statements_of(kernel, b)
    if not (kept_a and kept_b):  # one side folded into the other's contraction
        saved = _saved_bytes(graph, a, b)
        kept = b if kept_b else a
        # into the operand, the contraction reads it; into the epilogue, it is as alone
        operand = ([s.expr for s in kernel.statements if s.reduce] !=
                   [s.expr for s in models.kernel(kept).statements if s.reduce])
        where = ("the operand of {}, evaluated where the contraction reads it (while "
                 "packing, with a microkernel)" if operand else
                 "the epilogue of {}, evaluated where it is read (in the write-back, "
                 "from the output's indices, with a microkernel)")
        return FusionAnswer(True, 0, True, 0, capacity, saved,
                            f"folded into {where.format(group_label(kept))}; "
                            f"saves {_mib(saved)}")
    blocked = _nest_blocked(kernel, microkernels)
    if (answer := _epilogue_answer(graph, a, b, machine, kernel, blocked)) is not None:
        return answer
    try:
        with isl_operations(models.ctx, max_operations):
            return _shared_loop_answer(graph, a, b, machine, kernel, kept_a, kept_b,
                                       models.merged(kernel, a, b), blocked)
    except OutOfOperations as e:
        return FusionAnswer(False, 0, False, 0, capacity, 0, f"{e} before answering",
                            over_budget=True)


def _shared_loop_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...],
                        machine: Machine, kernel: Kernel, kept_a: set[str], kept_b: set[str],
                        model: PolyModel, blocked: frozenset[str] = frozenset()
                        ) -> FusionAnswer:
    """The answer from the loops the merged kernel's statements can share (`model`, its
    dependences computed); the statements `blocked` by a microkernel's nest count in no
    footprint."""
    capacity = machine.fusion_level.capacity
    block = column_block(model, kernel.statements, element_bytes(kernel),
                         machine.block_bytes, machine.cores)
    shared = shared_depth(model, kernel.statements, kept_a, kept_b, block)
    depth, permutable, siblings, block = (shared.depth, shared.permutable, shared.siblings,
                                          shared.block)
    if depth == 0 and siblings:
        return FusionAnswer(False, 0, False, 0, capacity, 0,
                            "no shared loop reads their common input at the same index: "
                            "their loops traverse it differently, nothing would be reused")
    small = _small_side(graph, kernel, capacity, (a, kept_a), (b, kept_b))
    if depth == 0 and small:
        return _sequence_answer(graph, a, b, small, machine, "no loop is shared")
    if depth == 0:
        blocking = reversed_dependence(model, kernel, kept_a, kept_b)
        return FusionAnswer(False, 0, False, 0, capacity, 0,
                            "no loop can be shared in the nodes' own loop orders: one "
                            "iteration of the consumer's outer loop needs the producer's "
                            "for several values (a reduction across it, or a transposed read)"
                            + (f"; sharing the outer loop {blocking}" if blocking else ""))
    foot = footprint(model, kernel, shared.levels, block, blocked,
                     boxes=machine.tile_level.managed)
    answer = _loop_answer(graph, a, b, machine, depth, permutable, foot, block, shared.kept)
    if not answer.profitable and small:
        # sharing a loop of one iteration with a scalar puts the whole of the other
        # side under it; in sequence the other keeps its own loops and tiles
        return _sequence_answer(graph, a, b, small, machine,
                                f"sharing {depth} loop(s) touches {_mib(foot)} per iteration")
    return answer


def _no_sequence(machine: Machine, why: str) -> FusionAnswer | None:
    """The refusal of a kernel whose groups share no loop (in sequence, or independent
    parts) on a chip with scratchpads, whose cores share the tiles of one band
    (scratchpad/tiles.py): a sequence has none, so it would run as one tile on one core,
    or not fit its scratchpad at all. None where such a kernel is fine."""
    if not machine.tile_level.managed:
        return None
    return FusionAnswer(False, 0, False, 0, machine.fusion_level.capacity, 0,
                        f"{why}, but the cores of a chip with scratchpads share the tiles of "
                        "one loop nest: each is a kernel of its own")


def _sequence_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...],
                     small: tuple[tuple[str, ...], str], machine: Machine, why: str
                     ) -> FusionAnswer:
    if (refused := _no_sequence(machine, why)) is not None:
        return refused
    capacity = machine.fusion_level.capacity
    saved = _saved_bytes(graph, a, b)
    side, because = small
    return FusionAnswer(True, 0, True, 0, capacity, saved,
                        f"{why}, but {group_label(side)} {because} in sequence with the "
                        f"other's loops, in one kernel; saves {_mib(saved)}")


def _loop_answer(graph: Graph, a: tuple[str, ...], b: tuple[str, ...], machine: Machine,
                 depth: int, permutable: bool, foot: int, block: int,
                 kept: int = 0) -> FusionAnswer:
    """A legal merge sharing `depth` loops (`kept` of them over axes every dependence
    keeps, moved outermost: `fusion_tree.kept_axes`), weighed by its footprint."""
    capacity = machine.fusion_level.capacity
    saved = _saved_bytes(graph, a, b)
    head = f"legal at depth {depth}, {'permutable' if permutable else 'not permutable'}"
    if kept:
        head += (", its outer loop over an axis" if kept == 1 else
                 f", its outer {kept} loops over axes") + " every dependence keeps"
    level = machine.fusion_level.name
    if block:
        # a block is read by several passes: it should stay where the block role says
        capacity, level = machine.block_bytes, f"a core's share of {machine.role('block').name}"
        head += (f", the columns in blocks of {block} (every dependence keeps its column; "
                 "the reductions run down the rows inside a block)")
    if foot > capacity:
        reason = (f"{head}, but one iteration touches {_mib(foot)}, more than "
                  f"{level} ({_mib(capacity)})")
    else:
        reason = f"{head}, footprint {_mib(foot)} per iteration; saves {_mib(saved)}"
    return FusionAnswer(True, depth, permutable, foot, capacity, saved, reason)


def reversed_dependence(model: PolyModel, kernel: Kernel, a: set[str], b: set[str]) -> str:
    """Which dependence between statements of `a` and `b` sharing their outermost loop
    would reverse ('' if none): one whose sink is at an earlier iteration of that loop
    than its source, named by kind with one instance pair isl picks, e.g. "would reverse
    the flow dependence S0[i0 = 5, i1 = 0] -> S1[i0 = 4] (y.max -> y.sub)"."""
    nodes = {f"S{j}": n for j, n in enumerate(kernel.nodes)}
    for kind in ("flow", "anti", "output"):
        maps: list[isl.Map] = []
        getattr(model, kind).foreach_map(maps.append)
        for m in maps:
            src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if not ((src in a and dst in b) or (src in b and dst in a)):
                continue
            if m.dim(isl.dim_type.in_) == 0 or m.dim(isl.dim_type.out) == 0:
                continue
            back = m.order_lt(isl.dim_type.out, 0, isl.dim_type.in_, 0)
            if back.is_empty():
                continue
            pair = isl.Map.from_basic_map(back.sample())
            names = f"{nodes[src.split('_')[0]]} -> {nodes[dst.split('_')[0]]}"
            return f"would reverse the {kind} dependence {_instances(pair)} ({names})"
    return ""


def _instances(pair: isl.Map) -> str:
    """`{ S0[i0, i1] -> S1[o0] : i0 = 5 and ... }` as `S0[5, 0] -> S1[4]`."""
    point = isl.Set.from_basic_set(pair.wrap().sample()).sample_point()
    values = [point.get_coordinate_val(isl.dim_type.set, k).to_python()
              for k in range(pair.dim(isl.dim_type.in_) + pair.dim(isl.dim_type.out))]
    n_in = pair.dim(isl.dim_type.in_)
    src, dst = pair.get_tuple_name(isl.dim_type.in_), pair.get_tuple_name(isl.dim_type.out)
    return (f"{src}[{', '.join(map(str, values[:n_in]))}] -> "
            f"{dst}[{', '.join(map(str, values[n_in:]))}]")


def _microkernel_lost(graph: Graph, merged: Kernel, groups, microkernels: Microkernels,
                      models: GroupModels) -> str:
    """Why merging would take a contraction off its microkernel ('' if it would not): a
    matmul fused with a reduction its target's nest cannot place (over C's columns on
    the chips; over its rows, or rows too long for the cache, on the cpu) leaves a plain
    loop nest five times slower than the microkernel and a second pass."""
    if microkernels(merged, 0) is not None:
        return ""
    for group in groups:
        alone = models.kernel(group)
        conv = any(graph.node(n).op == "conv2d" for n in group)
        mk = microkernels(alone, KEEP_CONV_MICROKERNEL_FLOPS if conv else KEEP_MICROKERNEL_FLOPS)
        if mk is not None:
            return (f"{group_label(group)} computes its contraction with the {mk} "
                    "microkernel; merged, the kernel is no contraction the target's "
                    "microkernels take (with an elementwise epilogue; on the cpu also row "
                    "operations on its result, rows that fit half of L2), and would not")
    return ""


def _saved_bytes(graph: Graph, a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Traffic the merge removes. A tensor that becomes local is no longer written to
    memory nor read back by its consumers in the group; siblings read a shared input
    once instead of twice. (Costs the groups' size: the graph's consumer index answers
    who reads what.)"""
    nodes = {n: graph.node(n) for n in a + b}
    own = {**dict.fromkeys(a, set(a)), **dict.fromkeys(b, set(b))}
    merged = set(nodes)

    def leaves(tensor: str, group: set[str]) -> bool:
        return tensor in graph.outputs or any(c.name not in group
                                              for c in graph.consumers(tensor))

    newly_local = {nodes[n].output for n in merged
                   if leaves(nodes[n].output, own[n]) and not leaves(nodes[n].output, merged)}
    saved = sum(graph.types[t].nbytes * (1 + sum(t in nodes[n].inputs for n in merged))
                for t in newly_local)
    produced = {nodes[n].output for n in merged}
    shared = {t for n in a for t in nodes[n].inputs} & {t for n in b for t in nodes[n].inputs}
    return saved + sum(graph.types[t].nbytes for t in shared - produced)


def _mib(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"
