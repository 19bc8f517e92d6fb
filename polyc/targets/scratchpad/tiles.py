"""Tiles for the cores of a chip with scratchpads: every buffer of a tile in the target's
tile level (the many-core LDM, the NPU's unified buffer), and what the copies move.

The kernel's outermost band is cut into tiles whose data fits one core's scratchpad (or,
where one iteration of it is too much, the band below it, in each of its iterations): for a
candidate tile size, the intermediates are contracted (`contract.py`) and every other
array the tile touches is promoted (`promotion.py`): its footprint per tile, computed with
isl, becomes a buffer there. What a tile reads of an array before writing it is got
before the tile; what it writes that is needed elsewhere (an output, an intermediate a
later kernel pass reads) is put after it; an intermediate written and read inside the
tile never leaves the scratchpad; an input every tile reads alike (a layer norm's gamma) is
copied once per core, before the tiles, and reused. With double buffering every moved
buffer is allocated twice (the next tile's inputs arrive, and the last tile's outputs leave, while this one
computes). The sizes start from the whole band and halve its largest member until
everything fits; of a band that is not permutable only the first member is cut.

    before: band(i) -> sequence[ band(j){max}, band(j){exp, sum}, band(j){div} ]
    after:  band(4*floor(i/4)) -> mark "tile LDM" -> band(i) -> sequence[ ... ]
            promotions: t0_x -> ldm_t0_x 4x4096 (in), t5_y -> ldm_t5_y 4x4096 (out)

Steps. Where even a tile of one iteration does not fit (a sum over the 16000 rows of a
column block, a row of 2^20 floats), the loops inside the tile are cut too: the first
band on each path below the tile's own loops is cut in steps (`tile <level> step<i>`
marks), the largest member halved until everything fits, and where steps of one
iteration are still too much, the bands below those. An array touched only in steps
(written in one at most) is promoted in each step that touches it, a step's worth at a
time (double-buffered, the next step's part arriving while this one computes; each
step's statements through a buffer of their own, `Promotion.statements`, where several
steps read it); every other array stays promoted per tile, so a sum's accumulator
stays on chip across the steps of its rows:

    band(floor(j/16)) -> mark "tile LDM" -> band(j) -> sequence[ init,
        band(4000*floor(i/4000), j) -> mark "tile LDM step1" -> band(i, j){sum} ]
    promotions: t3_s -> ldm_t3_s 16 (out, per tile), t0_x -> ldm_t0_x 4000x16 (in, per step)

A kernel no tiling of either kind fits is an error naming the largest buffer of its
smallest tile and the capacity.
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl

from ...errors import NoTiling, Problem
from ...kernel import Kernel
from ...kernel.comprehension import loads
from ...machine import Machine, MemoryLevel
from ...schedule_tree import marks
from ...schedule_tree.contract import contract_arrays
from ...schedule_tree.model import PolyModel, statement_names
from ...schedule_tree.passes import fused_schedule, recompute_stored
from ...schedule_tree.promotion import Promotion, box, find, footprint, promote, tile_prefix
from ...schedule_tree.state import KernelState

_BAND = isl.schedule_node_type.band
MIN_TILE_BYTES = 8 << 10  # a tile's data, below which more tiles for more cores stop


def _of(umap: isl.UnionMap, array: str) -> isl.UnionMap:
    """The part of an access relation that touches `array`."""
    maps: list[isl.Map] = []
    umap.foreach_map(lambda m: maps.append(m) if m.get_tuple_name(isl.dim_type.out) == array else None)
    out = isl.UnionMap.empty(umap.get_space())
    for m in maps:
        out = out.union(m)
    return out


def promotions_at(node: isl.ScheduleNode, kernel: Kernel, model: PolyModel, level: str,
                  at: str, skip: frozenset[str] = frozenset(),
                  written_before: frozenset[str] = frozenset()) -> tuple[Promotion, ...]:
    """The promotion of every array (but contracted ones and `skip`) the statements below
    `node` touch: got when the tile reads what it did not write itself, put when it
    writes an output or an intermediate read elsewhere (see the module docstring); an
    input every tile reads alike is got once, before them, unless the kernel writes it
    on chip before each tile (`written_before`: a contraction's C)."""
    below = node.get_domain()
    prefix = tile_prefix(node)
    inside = statement_names(below)
    by_name = {s.name: s for s in kernel.statements}
    out = []
    for a in kernel.arrays:
        if a.kept is not None or a.c_name in skip:
            continue
        reads = _of(model.reads, a.c_name).intersect_domain(below)
        writes = _of(model.writes, a.c_name).intersect_domain(below)
        if reads.is_empty() and writes.is_empty():
            continue
        get = False
        if not reads.is_empty():
            inits = isl.UnionSet.empty(below.get_space())
            for name in inside:
                s = by_name[name]
                if s.target == a.tensor and s.reduce is None:
                    inits = inits.union(below.intersect(isl.UnionSet(
                        isl.Set.read_from_str(below.get_ctx(), f"{{ {name}[{_iters(s)}] }}"))))
            written_first = _of(model.writes, a.c_name).intersect_domain(inits)
            get = (written_first.is_empty() or not footprint(node, reads, prefix).is_subset(
                footprint(node, written_first, prefix)))
        elsewhere = {s.name for s in kernel.statements if s.name not in inside
                     and any(ld.tensor == a.tensor for ld, _ in loads(s.expr))}
        put = not writes.is_empty() and (a.role == "out" or bool(elsewhere))
        direction = "inout" if get and put else "in" if get else "out" if put else "local"
        touched = reads.union(writes)
        p = promote(node, touched, buffer=f"{level.lower()}_{a.c_name}", array=a.c_name, level=level,
                    direction=direction, element_bytes=a.type.itemsize, at=at, prefix=prefix)
        once = direction == "in" and a.c_name not in written_before and _invariant(p.footprint)
        out.append(hoisted(p) if once else p)
    return tuple(out)


def _invariant(fp: isl.Map) -> bool:
    """Does every tile touch the same elements (a layer norm's gamma)?"""
    return fp.is_equal(isl.Map.from_domain_and_range(fp.domain(), fp.range()))


def hoisted(p: Promotion) -> Promotion:
    """`p` copied once per core before any tile (`at` ""): an input every tile reads
    alike is reused across the tile loop instead of fetched for each tile."""
    once = isl.Map.from_range(p.footprint.range())
    lo, extents = box(once)
    return replace(p, footprint=once, lo=lo, box=extents, at="")


def _iters(s) -> str:
    return ", ".join(s.iter_name(d) for d in range(len(s.extents)))


def buffers(p: Promotion, double_buffer: bool) -> int:
    """How many buffers `p` takes: its slots, or two when double-buffered and copied
    for every tile."""
    if p.slots:
        return p.slots
    return 2 if double_buffer and p.direction != "local" and p.at else 1


def scratch_bytes(promotions: tuple[Promotion, ...], kernel: Kernel, double_buffer: bool,
                  alignment: int) -> int:
    """What a core allocates in its scratchpad: every promoted buffer (twice when
    double-buffered and moved), every contracted intermediate but scalars, each rounded
    up to the level's alignment."""
    def up(n: int) -> int:
        return -(-n // alignment) * alignment

    total = sum(up(p.bytes) * buffers(p, double_buffer) for p in promotions)
    for a in kernel.arrays:
        if a.kept:
            n = 1
            for e in a.buffer_shape:
                n *= e
            total += up(n * a.type.itemsize)
    return total


def _spans(band: isl.ScheduleNode) -> list[int]:
    """How many values each member of `band` takes over the statements below it."""
    domain, sched = band.get_domain(), band.band_get_partial_schedule()
    out = []
    for m in range(band.band_n_member()):
        values = (isl.UnionMap.from_union_pw_aff(sched.get_at(m)).intersect_domain(domain)
                  .range().as_set())
        out.append((values.dim_max_val(0) - values.dim_min_val(0)).to_python() + 1)
    return out


def _tilable(schedule: isl.Schedule, depth: int) -> isl.Schedule:
    """`schedule` with a band at `depth` that may be cut in tiles: a band that is not
    permutable keeps only its first member (strip-mining one loop is always legal)."""
    band = _band(schedule, depth)
    if band is None or band.band_get_permutable() or band.band_n_member() == 1:
        return schedule
    return band.band_split(1).get_schedule()


def _band(schedule: isl.Schedule, depth: int) -> isl.ScheduleNode | None:
    """The band `depth` bands down from the root, through marks, each the only child of
    the node above it (so every statement is below it), or None."""
    node = schedule.get_root()
    for _ in range(depth + 1):
        if node.n_children() != 1:
            return None
        node = node.child(0)
        while node.get_type() == isl.schedule_node_type.mark:
            node = node.child(0)
        if node.get_type() != _BAND:
            return None
    return node


def _tile(schedule: isl.Schedule, depth: int, sizes: list[int] | None,
          level: str) -> isl.ScheduleNode:
    """The node below which one tile runs: under the tile band of the band at `depth`
    (cut by `sizes`), or below the band itself (None: its iterations are the tiles), or
    the root's child when there is no band; marked `tile <level>`."""
    band = _band(schedule, depth)
    if band is None:
        node = schedule.get_root().child(0)
    elif sizes is None:
        node = band.child(0)
    else:
        node = _cut(band, sizes)
    return node.insert_mark(isl.Id(str(marks.Tile(level)))).child(0)


def _cut(band: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """The point band of `band` cut in tiles of `sizes` (the tile band is its parent)."""
    mv = isl.MultiVal.zero(band.band_get_space())
    for m, s in enumerate(sizes):
        mv = mv.set_val(m, isl.Val.int_from_si(band.get_ctx(), s))
    return band.band_tile(mv).child(0)


def _tiles(schedule: isl.Schedule, depth: int) -> int:
    """How many iterations the tile band's first loop (the one the cores share) has."""
    band = _band(schedule, depth)
    first = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_union_pw_aff(0))
    return first.intersect_domain(band.get_domain()).range().as_set().count_val().to_python()


def _fit(state: KernelState, depth: int, level: MemoryLevel, options
         ) -> tuple[KernelState | None, tuple[Kernel, tuple[Promotion, ...], int]]:
    """The state with the band at `depth` cut in the largest tiles that fit `level`
    (double-buffered if they can be), or None; and the smallest tile tried (its kernel,
    promotions and bytes)."""
    tilable = _tilable(state.schedule, depth)
    band = _band(tilable, depth)
    extents = _spans(band) if band is not None else None
    for double in ((True, False) if options.double_buffer else (False,)):
        sizes = list(extents) if extents else None
        while True:
            node = _tile(tilable, depth, sizes, level.name)
            schedule = node.get_schedule()
            kernel = contract_arrays(state.kernel, state.model, schedule)
            promotions = promotions_at(node, kernel, state.model, level.name,
                                       str(marks.Tile(level.name)))
            if _across_tiles(promotions, kernel):
                return None, (kernel, promotions, 0)
            need = scratch_bytes(promotions, kernel, double, level.alignment)
            # enough tiles for every core, as long as a tile moves enough data that a
            # transfer's latency does not dominate it
            shared = bool(sizes) and sizes[0] > 1 and _tiles(schedule, depth) < options.cores
            few = shared and sum(p.bytes for p in promotions) >= 2 * MIN_TILE_BYTES
            if need <= level.capacity and not few:
                what = (f"tiles of {'x'.join(map(str, sizes)) if sizes else 'one iteration'}"
                        f"{f' inside the outer {depth} band(s)' if depth else ''} "
                        "for the cores")
                fitted = _fitted(state, schedule, kernel, promotions, what, need, level,
                                 double, options)
                return fitted, (kernel, fitted.promotions, need)
            if not sizes or max(sizes) == 1:
                break
            # the shared loop's first while the cores lack tiles (a tile then keeps whole
            # rows: long transfers, a reduction in one tile), else the largest member
            m = 0 if shared else max(range(len(sizes)), key=lambda k: (sizes[k], -k))
            sizes[m] = max(1, sizes[m] // 2)
    return None, (kernel, promotions, need)


def _fitted(state: KernelState, schedule: isl.Schedule, kernel: Kernel,
            promotions: tuple[Promotion, ...], what: str, need: int, level: MemoryLevel,
            double: bool, options) -> KernelState:
    """The state with the tiles found, noted (`what` they are, the bytes they take)."""
    if options.double_buffer and not double:
        # what did not fit twice: the code must allocate it once, as planned
        promotions = tuple(replace(p, slots=1) for p in promotions)
    return replace(state.with_schedule(schedule), kernel=kernel, promotions=promotions).note(
        f"{what}: {need} of {level.capacity} bytes of {level.name}"
        f"{', double-buffered' if double else ''}", *map(str, promotions))


def _fit_steps(state: KernelState, level: MemoryLevel, options) -> KernelState | None:
    """The state with its outermost band cut in tiles for the cores and the loops inside
    a tile in steps (see "Steps" in the module docstring), or None: for a kernel no tile
    fits alone."""
    tilable = _tilable(state.schedule, 0)
    band = _band(tilable, 0)
    if band is None:
        return None
    outer = _spans(band)
    # a tile for every core, as `_fit` orders its sizes; else the smallest tile
    while outer[0] > 1 and _tiles(_tile(tilable, 0, outer, level.name).get_schedule(),
                                  0) < options.cores:
        outer[0] = max(1, outer[0] // 2)
    for outer in dict.fromkeys((tuple(outer), (1,) * len(outer))):
        schedule = _tile(tilable, 0, list(outer), level.name).get_schedule()
        for double in ((True, False) if options.double_buffer else (False,)):
            if (found := _fit_in_steps(state, schedule, level, double)) is not None:
                stepped, kernel, promotions, steps, need = found
                return _fitted(state, stepped, kernel, promotions,
                               f"tiles of {'x'.join(map(str, outer))} for the cores, {steps}",
                               need, level, double, options)
    return None


_Steps = tuple[isl.Schedule, Kernel, tuple[Promotion, ...], str, int]


def _fit_in_steps(state: KernelState, schedule: isl.Schedule, level: MemoryLevel,
                  double: bool) -> _Steps | None:
    """`schedule` (tiled, marked `tile <level>`) with the first band on each path below
    the tile's point band cut in the largest steps that fit `level`, the largest member
    halved at a time (where steps of one iteration do not fit, the bands below those):
    the schedule, its kernel and promotions, what it steps, and the bytes it takes; or
    None."""
    at = str(marks.Tile(level.name))
    paths = _band_paths(find(schedule, at).child(0), (0,))
    while paths:
        if (found := _fit_bands_in_steps(state, schedule, at, paths, level, double)):
            return found
        deeper = [_band_paths(_at(schedule, at, path).child(0), path + (0,)) or [path]
                  for path in paths]
        paths = [] if deeper == [[p] for p in paths] else [p for d in deeper for p in d]
    return None


def _fit_bands_in_steps(state: KernelState, schedule: isl.Schedule, at: str,
                        paths: list[tuple[int, ...]], level: MemoryLevel, double: bool
                        ) -> _Steps | None:
    """`_fit_in_steps` on the bands at `paths` (below the mark `at`)."""
    spans = []
    for path in paths:
        band = _at(schedule, at, path)
        whole = band.band_get_permutable() or band.band_n_member() == 1
        spans.append(_tile_spans(band) if whole else _tile_spans(band)[:1])
    sizes = [list(s) for s in spans]
    while True:
        b, m = max(((b, m) for b, s in enumerate(sizes) for m in range(len(s))),
                   key=lambda bm: sizes[bm[0]][bm[1]], default=(0, None))
        if m is None or sizes[b][m] == 1:
            return None
        sizes[b][m] = max(1, sizes[b][m] // 2)
        stepped, steps = schedule, {}
        for i, (path, size, span) in enumerate(zip(paths, sizes, spans)):
            if size != span:
                band = _at(stepped, at, path)
                if len(size) < band.band_n_member():
                    band = band.band_split(len(size))
                mark = str(marks.Tile(level.name, f"step{i}"))
                steps[mark] = size
                stepped = _cut(band, size).insert_mark(isl.Id(mark)).get_schedule()
        kernel, promotions, streamed = _step_promotions(state, stepped, at, list(steps), level)
        if not streamed:
            continue
        need = scratch_bytes(promotions, kernel, double, level.alignment)
        if need <= level.capacity and not _across_tiles(promotions, kernel):
            what = "; ".join(
                f"the loops of {', '.join(sorted(statement_names(find(stepped, s).get_domain())))}"
                f" in steps of {'x'.join(map(str, size))}" for s, size in steps.items())
            return (stepped, kernel, promotions,
                    f"{what} ({', '.join(sorted(streamed))} copied per step)", need)


def _tile_spans(band: isl.ScheduleNode) -> list[int]:
    """How many values each member of `band` takes in one iteration of the loops above
    it (the largest over them)."""
    outer = tile_prefix(band).reverse()
    sched = band.band_get_partial_schedule()
    return [box(isl.Map.from_union_map(outer.apply_range(
        isl.UnionMap.from_union_pw_aff(sched.get_at(m)))))[1][0]
        for m in range(band.band_n_member())]


def _band_paths(node: isl.ScheduleNode, path: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The child positions (from `node`'s parent, `path` leading to `node`) of the first
    band on each path down from `node`."""
    if node.get_type() == _BAND:
        return [path]
    return [p for i in range(node.n_children()) for p in _band_paths(node.child(i), path + (i,))]


def _at(schedule: isl.Schedule, at: str, path: tuple[int, ...]) -> isl.ScheduleNode:
    node = find(schedule, at)
    for i in path:
        node = node.child(i)
    return node


def _step_promotions(state: KernelState, schedule: isl.Schedule, at: str, steps: list[str],
                     level: MemoryLevel) -> tuple[Kernel, tuple[Promotion, ...], set[str]]:
    """The kernel contracted on `schedule`, the promotions of its tile (below mark `at`)
    and of its steps (marks `steps`), and the tensors copied per step: those touched
    only in steps (in one, if written), each step's statements reading them through a
    buffer of its own; every other per tile."""
    kernel = contract_arrays(state.kernel, state.model, schedule)
    model, tile = state.model, find(schedule, at)
    inside = {s: statement_names(find(schedule, s).get_domain()) for s in steps}
    per_step: dict[str, set[str]] = {s: set() for s in steps}
    for a in kernel.arrays:
        writes = _of(model.writes, a.c_name).intersect_domain(tile.get_domain())
        touched = statement_names(_of(model.reads, a.c_name).intersect_domain(
            tile.get_domain()).union(writes).domain())
        where = [s for s in steps if inside[s] & touched]
        if a.kept is None and where and touched <= set().union(*(inside[s] for s in where)) \
                and (writes.is_empty() or len(where) == 1):
            for s in where:
                per_step[s].add(a.c_name)
    streamed = set().union(*per_step.values())
    every = {a.c_name for a in kernel.arrays}
    promotions = promotions_at(tile, kernel, model, level.name, at, skip=frozenset(streamed))
    for i, s in enumerate(steps):
        for p in promotions_at(find(schedule, s), kernel, model, level.name, s,
                               skip=frozenset(every - per_step[s])):
            # several steps read it: each through its own buffer
            shared = sum(p.array in per_step[t] for t in steps) > 1
            promotions += (replace(p, buffer=f"{p.buffer}_step{i}",
                                   statements=tuple(sorted(inside[s]))) if shared else p,)
    return kernel, promotions, {a.tensor for a in kernel.arrays if a.c_name in streamed}


def _across_tiles(promotions: tuple[Promotion, ...], kernel: Kernel) -> str:
    """The intermediate a tile would get from memory though the kernel computes it (a
    transpose read through a reshape: a tile reads rows another tile computed, and no
    tile puts an intermediate), else ''. No size of these tiles is right."""
    local = {a.c_name: a.tensor for a in kernel.arrays if a.role == "local"}
    return next((local[p.array] for p in promotions
                 if p.array in local and p.direction in ("in", "inout")), "")


def _fit_a_band(state: KernelState, level: MemoryLevel, options
               ) -> tuple[KernelState | None, tuple[Kernel, tuple[Promotion, ...], int]]:
    """`_fit` on the outermost band; where one iteration of it is too much (a batch of
    one: the whole image), on the band below it, in each of its iterations, and so on."""
    depth = 0
    while (found := _fit(state, depth, level, options))[0] is None and \
            _band(state.schedule, depth + 1) is not None:
        depth += 1
    return found


def tile_pass(state: KernelState, machine: Machine, options) -> KernelState:
    if state.promotions:  # a contraction planned its own tiles and copies
        return state
    # point loops keep the array's own index (i, not i - its tile's start): the loop
    # then pins it, and contraction drops that dimension from a tile's buffers
    state.ctx.set_tile_shift_point_loops(0)
    level = machine.tile_level
    fitted, tried = _fit_a_band(state, level, options)
    if fitted is not None:
        return fitted
    if len(state.kernel.nodes) > 1:
        # the kept axes outermost can make a tile's box of an input read through a
        # reshape span the rows between (rows i, i + 128, ... of [8 x 128, C]): the
        # column blocks alone, the statements' own loops inside them, may fit
        plain = replace(state, model=fused_schedule(state, machine, kept=False))
        if not plain.schedule.plain_is_equal(state.schedule):
            fitted, tried = _fit_a_band(plain, level, options)
            if fitted is not None:
                return fitted.note("the axes every dependence keeps left in the statements' "
                                   f"own loops: no tile over them fits the {level.name}")
    kernel, promotions, need = tried
    # an intermediate no tile holds (a transpose read through a reshape, whose rows
    # the shared loop visits out of step) computed again where it is read, if it can be
    again = recompute_stored(replace(state, kernel=kernel), quasi=True)
    if again.restart:
        return again
    if not (crossing := _across_tiles(promotions, kernel)) and \
            (stepped := _fit_steps(state, level, options)) is not None:
        return stepped
    if crossing:
        raise NoTiling(Problem(
            f"intermediate {crossing!r} is read by tiles other than those that compute it, "
            f"and cannot be computed again where it is read: no tiles of the kernel for the "
            f"{level.name}", field=f"kernel {kernel.name}"), crossing,
            f"in their kernel tiles of the {level.name} would read {crossing!r} where other "
            "tiles computed it")
    biggest = max(promotions, key=lambda p: p.bytes)
    tensor = next(a.tensor for a in kernel.arrays if a.c_name == biggest.array)
    raise NoTiling(Problem(
        f"cannot fit one tile's data in the {level.name} of {level.capacity} bytes: even the "
        f"smallest tile needs {need} bytes, {biggest.bytes} of them for tensor {tensor!r} "
        f"({'x'.join(map(str, biggest.box))} elements); nothing in the kernel can be split "
        "further", field=f"kernel {kernel.name}"), tensor,
        f"no tile of their kernel fits the {level.name} (the smallest needs {need} bytes, "
        f"{biggest.bytes} of them for {tensor!r})")
