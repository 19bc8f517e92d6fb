"""The microkernels pass: contraction and row-reduction tiles -> marked schedule trees.

`map_microkernels` rewrites the schedule tree of a kernel that `analysis.gemm_view`
recognises (a contraction with its init and elementwise epilogue) into BLIS's loop nest,
every loop a band of the tree and every decision a mark:

    mark "gemm S0 sgemm_avx2_6x16 m=1024 n=1024 k=1024 mc=210 nc=1024 kc=256 par=inner ..."
      band [batch dims]                   (when batched; parallel when par=batch)
        band [jc = nc*floor(j/nc)]        (dropped when one block covers N, etc.)
          band [pc = kc*floor(k/kc)]      init at pc = 0, epilogue at the last pc
            mark "pack_b S0"              pack B (kc x nc) into kc x nr row panels
              band [ic = mc*floor(i/mc)]
                mark "pack_a S0"          pack A (mc x kc) into mr x kc column panels
                  mark "team_for S0"      (par=inner: the team shares these tiles)
                    band [jr = nr*floor(j/nr)]
                      band [ir = mr*floor(i/mr)]
                        mark "microkernel sgemm_avx2_6x16 S0"
                          band [i.., j..]  sequence [init, S0 (band [k..]), E1, E2, ...]

A contraction followed by row operations on its result (`GemmView.tail`: attention's
softmax of the scores, a row sum) keeps every column in one block (no jc loop) and rows
in blocks of at most half of L2; the row operations run beside `pack_a`, on the block's
rows once its tiles are final, while they are still in cache (`_tail_tree`). A second
contraction reading what the tail wrote (`GemmView.then`: the probabilities times v)
follows on the same rows, its tiles reading them in place (`_then_tree`, `emit/then.py`):

              band [ic]
                sequence
                  filter [init, S0, E..]  mark "pack_a S0" ...   (as above)
                  filter [tail]           band [i] -> sequence [ band [j] ... ]
                  filter [S9_init, S9]    mark "microkernel sgemm_avx2_6x16 S9" -> ...

The statements stay in the tree below the microkernel mark, so the tree is checked
against every dependence like any other; codegen replaces that subtree by the kernel
call and a write-back that applies init and epilogue on the tile (`emit.py`). Packing
evaluates the operands' expressions, so transposes, broadcasting, scaling folded into an
operand and a strided conv2d's gather with its zero padding all happen while packing.

When B's K rows are runs of one (padded) tensor (`analysis.b_rows`: conv2d, a strided
one from a copy split into phases) and the kernel has a variant that reads B in place,
B is not packed (`b=rows`): `mark "b_rows S0"` above the batch band (below it when the
copy is made per image, `BRows.slices`) makes the padded copy and
the row offsets once, there is no jc band and no pack_b, and the jr tiles cut the
output's columns linearised with the copy's strides (`57*i2 + i3`), so each tile's B
rows are contiguous in the copy. That is the direct convolution, without im2col. With
the window kernel (`plan.window_kernel`: the weights its vectors, the pixels broadcast)
the column tiles start at each output row or pair of rows (`Gemm.row_tile`): a band
`jy` over the rows' first virtual columns (`15*(2*floor(i2/2))`), then `jr` within a row.

When a block of A serves a few column tiles only (`plan.reads_a_in_place`) and A is
row-major along K, `pack_a` packs nothing: it sets the block's first row, and the tiles
read A's rows in place (`a=rows`).

When A has no batch dim (conv2d's weights), the batch band may go below `pack_a`
instead (`plan.loops` `pc, ic, b0, jr, ir`; `Gemm.batch_inside`): each A block is
packed once and serves every image, not once per image; a packed B then has its
`pack_b` below the batch band, packed per image and A block.

Reductions of float32 along a contiguous innermost axis (sum, max) get a mark above
their innermost band: `mark "microkernel row_sum_f32 S0"`.
"""
from __future__ import annotations

from dataclasses import replace

import islpy as isl

from ...kernel import Kernel
from ...kernel.comprehension import Statement
from ...machine import Machine
from ...microkernels import registry
from ...microkernels.analysis import BRows, GemmView, b_rows, iterators, loads_of, row_views
from ...schedule_tree import marks, text
from ...schedule_tree.model import PolyModel, statement_names
from ...schedule_tree.promotion import Promotion, find, promote
from ...schedule_tree.state import KernelState, Pass
from .plan import (choose_gemm_kernel, cpu_gemm_view, gemm_microkernel, plan_gemm, plan_rows,
                   plan_view, streams_b, window_kernel)
from .winograd import plan_winograd, winograd_schedule

# shorter rows reduce as fast in the compiler's own vectorised loop
MIN_ROW = 128

_ATOMIC = ', options: "{ atomic[x] }"'


def map_microkernels(model: PolyModel, kernel: Kernel, *, options, machine: Machine,
                     report: list[str] | None = None) -> PolyModel:
    """Map the kernel's contraction (or its row reductions) onto microkernels.

    Before: band(i, j) -> sequence[S0_init, S0 -> band(k), S1 (bias), S2 (gelu) ...].
    After: the tree in the module docstring; a kernel with no match is returned as is.
    Options read: `microkernels` and `portable_kernels` (off for this kernel: no change),
    `microkernel_isa`, `kernel_gemm`, `gemm_kernel`, `microkernel_tiles`, `parallel`,
    `threads`, `fold_batch`. Why a gemm kernel was chosen is appended to `report`.
    """
    if not options.uses_microkernels(kernel.name):
        return model
    winograd = plan_winograd(kernel, machine, options)
    if winograd is not None and report is not None:
        conv, plan = winograd.conv, winograd.plan
        what = (f"{conv.view.stmt.name} ({conv.N}x{conv.C}x{conv.H}x{conv.W} to {conv.O}, "
                "3x3, stride 1)")
        if plan is None:
            report.append(f"{what} direct, not by Winograd: {winograd.why}"
                          + ("; options.winograd_tile=2 or 4 forces a tile" if options.winograd
                             else ""))
        else:
            report.append(
                f"{what} by Winograd's F({conv.m}x{conv.m}, 3x3): {conv.gain:.2f}x fewer "
                f"multiply-adds than direct, as {conv.operands} products of {conv.O}x{conv.C} @ "
                f"{conv.C}x(tiles) in blocks of {plan.rows} tile rows on {plan.kernel} "
                f"({winograd.why}); weights transformed "
                f"{'once' if plan.weights == 'const' else 'on every call'}; "
                "options.winograd=False for the direct convolution")
    if winograd is not None and winograd.plan is not None:
        return model.with_schedule(winograd_schedule(model, winograd.conv, winograd.plan))
    window = window_kernel(kernel, machine, options)
    view = cpu_gemm_view(kernel, options.fold_batch, options.tail_contraction, window)
    streaming = view is not None and streams_b(view, kernel, machine)
    if gemm_microkernel(view, machine, options.microkernel_isa, streaming=streaming) is not None:
        mk, why = choose_gemm_kernel(view, kernel, machine, options, streaming, window)
        if report is not None:
            report.append(f"{view.stmt.name} ({view.M}x{view.N}x{view.K}) on {mk.name}: {why}")
        # unfolded, a batch's copy of B is made image by image too: for all its images
        # it would grow with a symbolic batch
        rows = plan_rows(view, kernel, mk, None if options.fold_batch else True)
        plan = plan_gemm(view, mk, kernel, machine, options, rows)
        if not view.c_matrix and report is not None:
            dims = ", ".join(f"dim {d} ({view.shape[d]})" for d in view.cols if d < view.rows[0])
            report.append(f"{view.stmt.name} columns: batch {dims} of C folded into its "
                          f"{view.N} columns, B packed across them: one A block serves all")
        if plan.masked != "-" and report is not None:
            report.append(f"{view.stmt.name} masked tiles: C is read only where its column "
                          f"<= its row + {plan.masked} (a select on the indices, e.g. a "
                          "causal mask): a tile past that is not computed, zeros stand in")
        if plan.depth != "-" and report is not None:
            report.append(f"{view.stmt.name} masked K: A is 0 past K index row + {plan.depth} "
                          "(a softmax of masked scores): each tile stops its K steps "
                          "there, unless B holds an inf or NaN (checked once per call)")
        if view.tail and report is not None:
            tensors = ", ".join(dict.fromkeys(s.target for s in view.tail))
            report.append(f"{view.stmt.name} row tail ({tensors}): on each block of {plan.mc} "
                          f"rows of C once its {view.N} columns are final, while the block is "
                          f"in cache (one column block; rows filling at most half of "
                          f"{machine.fusion_level.name})")
        if view.then and report is not None:
            t = view.then
            report.append(f"{view.stmt.name} row tail's contraction {t.stmt.name} "
                          f"({t.M}x{t.N}x{t.K}) on {plan.then}: on each block of rows once the "
                          f"tail has written their {t.a_expr.tensor}, read in place while in "
                          f"cache; its B packed once per batch point")
        return model.with_schedule(gemm_schedule(model, view, plan, rows))
    rows = [r for r in row_views(kernel) if r.length >= MIN_ROW]
    if len(rows) == 1 and len(kernel.statements) == 2:
        tree = row_schedule(model, kernel, rows[0])
        if tree is not None:
            return model.with_schedule(tree)
    return model.with_schedule(_mark_rows(model.schedule, kernel))


# --- the gemm tree, as isl's schedule-tree text ----------------------------------------

def gemm_schedule(model: PolyModel, view: GemmView, plan: marks.Gemm,
                  rows: BRows | None = None) -> isl.Schedule:
    """The tree of the module docstring for `view` with `plan`'s tiles. With `rows`, the
    column tiles cut the virtual columns (`analysis.BRows`), `mark "b_rows S0"` above
    the batch band prepares B once, and there is no pack_b."""
    s0, mk = view.stmt, registry.by_name(plan.kernel)
    others = (view.init,) + view.epilogue
    then = (view.then.init, view.then.stmt, *view.then.epilogue) if view.then else ()
    t = plan.tiles

    def out(s: Statement, d: int) -> str:
        return (view.then if s in then else view).out_name(s, d)

    def flat(s: Statement, dims: tuple[int, ...]) -> str:
        w = dict(zip(view.cols, rows.col_weights)) if rows and dims == view.cols else view.strides(dims)
        return " + ".join(f"{w[d]}*{out(s, d)}" for d in dims) or "0"

    kflat = " + ".join(f"{w}*{s0.iter_name(p)}" for p, w in view.red_strides().items())
    last_pc = t.kc * ((view.K - 1) // t.kc)

    def member(expr_of, tail: bool = True) -> str:
        return text.member((s0,) + others + ((*view.tail, *then) if tail else ()), expr_of)

    def band(members: list[str], child: str, coincident: bool = False, options: bool = True) -> str:
        return text.band(members, child, coincident=coincident, permutable=False,
                         extra=_ATOMIC if options else "")

    mark = text.mark
    loops = plan.loops
    # innermost first: the point loops and the statements' own order
    red = text.band([text.member([s0], lambda s, p=p: s.iter_name(p)) for p in view.red],
                    permutable=False)
    tree = text.sequence([([view.init], None), ([s0], red)] + [([e], None) for e in view.epilogue])
    point = [member(lambda s, d=d: view.out_name(s, d), False) for d in view.rows + view.cols]
    tree = band(point, tree, options=False)
    tree = mark(marks.Microkernel(plan.kernel, s0.name), tree)
    tiled = {
        "ir": lambda s: f"{mk.mr}*floor(({flat(s, view.rows)})/{mk.mr})",
        "jr": lambda s: (f"{mk.nr}*floor(({out(s, view.cols[-1])})/{mk.nr})" if plan.row_tile
                         else f"{mk.nr}*floor(({flat(s, view.cols)})/{mk.nr})"),
        # a window kernel's tiles at each output row, or pair of rows (`plan.row_tiles`):
        # the first one's first virtual column, `jr` then the tile's within the row
        "jy": lambda s: " + ".join(
            f"{w}*({plan.row_tile}*floor(({out(s, d)})/{plan.row_tile}))" if d == view.cols[-2]
            else f"{w}*{out(s, d)}" for d, w in zip(view.cols[:-1], rows.col_weights)),
        "ic": lambda s: f"{t.mc}*floor(({flat(s, view.rows)})/{t.mc})",
        "pc": lambda s: (f"{t.kc}*floor(({kflat})/{t.kc})" if s is s0
                         else "0" if s is view.init else str(last_pc)),
        "jc": lambda s: f"{t.nc}*floor(({flat(s, view.cols)})/{t.nc})",
    }
    for name in ("ir", "jr", "jy"):
        if name in loops:
            tree = band([member(tiled[name], False)], tree)
    if plan.par == "inner":
        tree = mark(marks.TeamFor(s0.name), tree)
    batch = [d for d in view.batch if view.shape[d] > 1]
    members = [member(lambda s, d=d: out(s, d)) for d in batch]
    if plan.batch_inside:  # B, which has the batch dim, packed per image below it
        tree = band(members, mark(marks.PackB(s0.name), tree) if not rows else tree)
    tree = mark(marks.PackA(s0.name), tree)
    if view.tail:
        tree = text.sequence([((s0,) + others, tree), (view.tail, _tail_tree(view, plan))]
                             + ([(then, _then_tree(view.then, plan))] if then else []))
    if "ic" in loops:
        tree = band([member(tiled["ic"])], tree)
        if plan.par == "rows":
            tree = mark(marks.TeamFor(s0.name), tree)
    if not rows and not plan.batch_inside:
        tree = mark(marks.PackB(s0.name), tree)
    for name in ("pc", "jc"):
        if name in loops:
            tree = band([member(tiled[name])], tree)
    if rows and rows.slices:  # the copy made per batch point, inside the batch loop
        tree = mark(marks.BRows(s0.name), tree)
    if batch and not plan.batch_inside:
        tree = band(members, tree, coincident=plan.par == "batch")
        if plan.par == "batch":
            tree = mark(marks.Parallel(plan.threads), tree)
    if rows and not rows.slices:
        tree = mark(marks.BRows(s0.name), tree)
    tree = mark(plan, tree)
    return isl.Schedule.read_from_str(model.domain.get_ctx(),
                                      f'{{ domain: "{model.domain}", child: {tree} }}')


def _tail_tree(view: GemmView, plan: marks.Gemm) -> str:
    """The row operations after a block of C is final (`GemmView.tail`), as the subtree
    beside its pack_a under the row-block band: a band over the block's rows, then the
    statements in order, each run of them that reads what the run produces only at its
    own point sharing one loop over the columns (softmax: max; subtract, exp and sum;
    the reciprocal of a row; the product). The reductions' initial values go first.

        band [i] -> sequence [ S2_init, S5_init, band [j] S2, band [j] (S3, S4, S5),
                               S6, band [j] S7 ]

    With par=inner the team shares the rows (`team_for`)."""
    def scalar(s: Statement) -> bool:
        return all(s.extents[d] == 1 for d in view.cols)

    produced = ({view.stmt.target} | {e.target for e in view.epilogue}
                | {t.target for t in view.tail})
    inits = [s for s in view.tail if scalar(s) and s.reduce is None
             and not any(x.tensor in produced for x in loads_of(s.expr))]
    parts: list[tuple[tuple[Statement, ...], str | None]] = [(tuple(inits), None)] if inits else []
    run: list[Statement] = []

    def close() -> None:
        if run:
            cols = [text.member(run, lambda s, d=d: s.iter_name(d)) for d in view.cols]
            inner = text.sequence([((s,), None) for s in run]) if len(run) > 1 else None
            parts.append((tuple(run), text.band(cols, inner, permutable=False)))
            run.clear()

    for s in view.tail:
        if s in inits:
            continue
        if scalar(s):
            close()
            parts.append(((s,), None))
            continue
        mine = {t.target: t for t in run}
        if any(x.tensor in mine and (mine[x.tensor].reduce is not None
                                     or x.index != mine[x.tensor].index)
               for x in loads_of(s.expr)):
            close()
        run.append(s)
    close()
    rows = [text.member(view.tail, lambda s, d=d: s.iter_name(d)) for d in view.rows]
    tree = text.band(rows, text.sequence(parts), permutable=False)
    return text.mark(marks.TeamFor(view.stmt.name), tree) if plan.par == "inner" else tree


def _then_tree(then: GemmView, plan: marks.Gemm) -> str:
    """The row tail's contraction (`GemmView.then`) on the block's rows, after the tail:
    codegen replaces it by the tiles of `plan.then`'s kernel.

        mark "microkernel sgemm_avx2_6x16 S9" -> band [i, j] -> sequence [ S8, S9 band [k],
                                                                       S10 ... ]
    """
    init, s = then.init, then.stmt
    point = [text.member((init, s, *then.epilogue), lambda x, d=d: then.out_name(x, d))
             for d in then.rows + then.cols]
    red = text.band([text.member([s], lambda x: x.iter_name(then.red[0]))], permutable=False)
    tree = text.band(point, text.sequence([([init], None), ([s], red)]
                                          + [([e], None) for e in then.epilogue]),
                     permutable=False)
    return text.mark(marks.Microkernel(plan.then, s.name), tree)


# --- row reductions ------------------------------------------------------------------

def row_schedule(model: PolyModel, kernel: Kernel, row) -> isl.Schedule | None:
    """A kernel that is one reduction (init, update) along its innermost axis:

        band [kept dims] -> sequence [ init, mark "microkernel row_sum_f32 S0" -> band [k] ]
    """
    s = row.stmt
    init = next((x for x in kernel.statements if x is not s), None)
    kept = list(range(len(s.extents) - 1))
    where: dict[int, int] = {}  # update iterator -> init iterator
    for j, e in enumerate(s.index):
        if e.terms:
            if len(e.terms) != 1 or e.terms[0][1] != 1 or e.const:
                return None
            where[e.terms[0][0]] = j
    if (init is None or init.target != s.target or init.reduce is not None
            or sorted(where) != kept or kernel.statements.index(init) != 0):
        return None
    kind = "row_sum" if s.reduce == "sum" else "row_max"
    inner = text.mark(marks.Microkernel(f"{kind}_f32", s.name),
                      text.band([text.member([s], lambda x: x.iter_name(row.axis))],
                                permutable=False))
    tree = text.sequence([([init], None), ([s], inner)])
    members = [text.member([init, s], lambda x, p=p: x.iter_name(where[p] if x is init else p))
               for p in kept]
    if members:
        tree = text.band(members, tree, coincident=True)
    return isl.Schedule.read_from_str(model.domain.get_ctx(),
                                      f'{{ domain: "{model.domain}", child: {tree} }}')


_BAND, _LEAF, _MARK = (isl.schedule_node_type.band, isl.schedule_node_type.leaf,
                       isl.schedule_node_type.mark)


def _mark_rows(schedule: isl.Schedule, kernel: Kernel) -> isl.Schedule:
    """A `microkernel row_*` mark above the innermost band of each matching reduction
    (split off its band so the mark holds exactly the row loop)."""
    rows = {r.stmt.name: r for r in row_views(kernel) if r.length >= MIN_ROW}
    if not rows:
        return schedule

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == _BAND and node.child(0).get_type() == _LEAF:
            names = statement_names(node.get_domain())
            if len(names) == 1 and (name := next(iter(names))) in rows:
                r = rows[name]
                n = node.band_n_member()
                got = isl.UnionMap.from_union_pw_aff(node.band_get_partial_schedule().get_at(n - 1))
                want = isl.UnionMap.read_from_str(
                    node.get_ctx(), text.member([r.stmt], lambda s: s.iter_name(r.axis)))
                if got.intersect_domain(node.get_domain()).is_equal(
                        want.intersect_domain(node.get_domain())):
                    kind = "row_sum" if r.stmt.reduce == "sum" else "row_max"
                    name = isl.Id(str(marks.Microkernel(f"{kind}_f32", r.stmt.name)))
                    if n > 1:  # back to the outer half: the caller steps up from here
                        return node.band_split(n - 1).child(0).insert_mark(name).parent()
                    return node.insert_mark(name)
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return visit(schedule.get_root()).get_schedule()




def operand_access(view: GemmView, side: str, ctx: isl.Context) -> isl.UnionMap:
    """The contraction's operand `side` ('a' or 'b') as an array: S0[...] -> S0.a[batch..,
    rows, k] (or S0.b[batch.., k, cols]), its dims the view's flattened row, column and
    reduction indices."""
    s0 = view.stmt

    def flat(dims, weights) -> str:
        return " + ".join(f"{weights[d]}*{s0.iter_name(view.out_iter[d])}" for d in dims) or "0"

    kflat = " + ".join(f"{w}*{s0.iter_name(p)}" for p, w in view.red_strides().items())
    # a batch dim the operand does not vary with is 0: its block is one for all the
    # images (A's, when the batch loop runs inside the A block: `Gemm.batch_inside`)
    used = iterators(view.a_expr if side == "a" else view.b_expr)
    batch = [s0.iter_name(view.out_iter[d]) if view.out_iter[d] in used else "0"
             for d in view.batch]
    own = (flat(view.rows, view.strides(view.rows)) if side == "a"
           else flat(view.cols, view.strides(view.cols)))
    index = batch + ([own, kflat] if side == "a" else [kflat, own])
    return isl.UnionMap.read_from_str(
        ctx, f"{{ {text.decl(s0)} -> {s0.name}_{side}[{', '.join(index)}] }}")


def panel_promotions(schedule: isl.Schedule, view: GemmView, plan: marks.Gemm,
                     machine: Machine) -> tuple[Promotion, ...]:
    """The packed blocks of A (under `pack_a`) and B (under `pack_b`) as promotions of the
    operands' footprints, in panels of the kernel's tile width: the buffers' sizes the
    packing code allocates. An operand read in place (`a=rows`, `b=rows`) has none; an A
    packed once (`a=once`) or a constant (`a=const`, `b=const`) is all of it, under the
    `gemm` mark."""
    mk = registry.by_name(plan.kernel)
    ctx = schedule.get_ctx()
    out = []
    sides = []
    if plan.a != "rows":
        level = machine.role("block" if plan.whole("a") else "fusion").name
        sides.append(("a", marks.PackA, mk.mr, level, "mk_pa"))
    if plan.b != "rows":
        sides.append(("b", marks.PackB, mk.nr, machine.role("block").name, "mk_pb"))
    for side, kind, width, level, buffer in sides:
        node = find(schedule, str(plan if plan.whole(side) else kind(view.stmt.name)))
        dim = len(view.batch) + (0 if side == "a" else 1)
        out.append(promote(node, operand_access(view, side, ctx), buffer=buffer,
                           array=f"{view.stmt.name}.{side}", level=level, direction="in",
                           layout=f"panels {width} {dim}"))
    return tuple(out)


def block_buffers(kernel: Kernel, view: GemmView, plan: marks.Gemm) -> Kernel:
    """`kernel` with C (stored for its row tail) and the A of the tail's contraction held
    one block of rows at a time (`Array.block`): the nest touches a block's rows only
    while it runs that block (no K blocks: C's partial sums would outlive it), so a
    buffer of the block's rows serves every batch point and block, and stays in cache
    (attention 8x512x64, Zen 3, 1 thread: 8 MiB of scores and 8 of probabilities
    each written to memory and read back, against 252 KiB of each: 0.91-0.92x the
    time, by hand)."""
    if not view.tail or "pc" in plan.loops or len(view.rows) != 1 or type(plan.mc) is not int:
        return kernel
    names = {view.stmt.target} | ({view.then.a_expr.tensor} if view.then else set())
    block = (view.rows[0], plan.mc)
    return replace(kernel, arrays=tuple(
        replace(a, block=block) if a.tensor in names and a.role == "local" and a.kept is None
        and all(type(n) is int for n in a.type.shape) else a for a in kernel.arrays))


def microkernels_pass(state: KernelState, machine: Machine, options) -> KernelState:
    chosen: list[str] = []
    model = map_microkernels(state.model, state.kernel, options=options, machine=machine,
                             report=chosen)
    state = replace(state, model=model).note(*(f"microkernel {line}" for line in chosen))
    plans = state.marks(marks.Gemm)
    if not plans:
        return state
    view = plan_view(state.kernel, plans[0])
    promotions = panel_promotions(state.schedule, view, plans[0], machine)
    return replace(state, kernel=block_buffers(state.kernel, view, plans[0]),
                   promotions=promotions).note(*map(str, promotions))


MICROKERNELS = Pass("microkernels", microkernels_pass, changes_schedule=True)
