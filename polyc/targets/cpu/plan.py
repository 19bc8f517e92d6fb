"""The cpu backend's plan for a contraction: which microkernel, which tiles, which threads.

The kernel is the one `options.kernel_gemm` names for this kernel, or else
`options.gemm_kernel` for every kernel, else the one `polyc tune` measured
fastest for this contraction, else, for a convolution's window read in place, the
target's window kernel (`window_kernel`), else the fastest the host's calibration measured for C's
shape (`registry.choose` on `calibrate.rates`); tiles come from the memory model
(`tiles.py`), then the tuning cache, then `options.microkernel_tiles`. The plan is the
`gemm` mark (`schedule_tree.marks.Gemm`): everything codegen needs beyond the kernel's
statements.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...errors import GraphError, Problem
from ...kernel import Kernel
from ...kernel.comprehension import Load
from ...machine import Machine
from ...microkernels import registry
from ...microkernels.analysis import (BRows, GemmView, a_row_stride, b_rows, flat_columns_from,
                                     gemm_view, iterators, masked_columns, masked_depth,
                                     window_taps, windowed)
from ...schedule_tree.marks import Gemm
from . import calibrate, tuning
from .tiles import apply_overrides, balanced, c_streams, model_tiles

# below this many multiply-adds the naive loops win: packing and the call cost more
MIN_GEMM_FLOPS = 2 * 8 * 8 * 8
# threads are woken only when the contraction has this many multiply-adds
MIN_PARALLEL_FLOPS = 1 << 21
# a row block of a contraction with a row tail reuses each packed B micro-panel for this
# many micro-panels of rows at least: fewer stream B from L3 for every few tiles
# (attention, 1 thread, Zen 3, two kernels against three: 768 and 1024 long, blocks of
# 84 and 60 rows, 16% and 12% faster; 2048 long, blocks of 30 rows, 42% slower)
MIN_TAIL_PANELS = 8
# a block of A serving this many column tiles or fewer is read in place, not packed.
# Zen 3, 6x16 kernel, 1 thread, packed against in place: 512x512 @ 512x64 (4 tiles, as
# attention's probabilities times V) 66 against 92 GFLOP/s, 1x2048x7x7 to 512 1x1 (4)
# 54 against 64, @ 512x128 (8) 87 against 95; past 8 the gain is small or a loss:
# @ 512x256 92 against 94, 1x256x14x14 to 256 3x3 (13) 73 against 64, 1024^3 (64) 93
# against 88
A_IN_PLACE_TILES = 8
# an image of this many columns keeps its batch loop (`cpu_gemm_view`); smaller ones
# are folded into the columns. Zen 3, folded against not: 2 threads, 8x512x28x28 to
# 128 1x1 97 against 108 GFLOP/s, 8x1024x14x14 to 256 97 against 105, 8x2048x7x7 to
# 512 116 against 79; 1 thread, 3x3 read in place against folded: 8x512x7x7 66 against
# 80, 8x512x14x14 /2 57 against 72, 8x256x14x14 76 against 78. Sapphire Rapids, 1
# thread, in pairs of calls, the images kept against folded: 8x512x28x28 to 128 1x1
# 0.80x the time, 8x1024x14x14 to 256 0.84x, 8x512x28x28 to 1024 /2 0.86x, 8x256x56x56
# to 512 /2 0.94x, 8x256x14x14 3x3 0.98x; 7x7 outputs 1.10-1.25x
FOLD_COLUMNS = 64
# a C under this many columns with B packed, at least this deep, weighs the window
# kernels' packed entry too (`choose_gemm_kernel`): up to a 14x14 image, 196 columns in
# 14 tiles of 14 where the 8x48 computes 208, or eight 7x7 images folded, 392 for 400;
# deep enough for K blocks of 512 (ResNet's 1x1s that it wins are 512-2048 deep)
WINDOW_PACKED_COLUMNS = 400
WINDOW_PACKED_MIN_K = 512
# with fewer column tiles than this per thread, each thread of a team takes whole row
# blocks (par=rows) instead of sharing the tiles of every block (Zen 3, 2 threads:
# conv5 512x7x7 3x3, 4 tiles: 93 GFLOP/s shared, 106 by row blocks; conv4 256x28x28
# /2, 9 tiles: by row blocks 3-7% faster in three runs in turns; 14 tiles of a 14x14
# image: shared 124, by row blocks 100)
ROWS_TEAM_TILES = 5
# the window kernel reads a window in place in tiles every 14 virtual columns (where
# they cannot start at each output row: `row_tiles`) where those take at most this many
# times the tiles of 14 the output's own would (a 20x20 output: 30 for 29)
WINDOW_TILE_WASTE = 1.1
# ... and only where K (channels x window) is at least this deep: a tile's stores and
# its write-back are paid once per K steps. With C scattered, ResNet's 64 channels 3x3
# (K = 576) had run 1.03-1.07x the time of the 8x48 kernel; stored by rows after a
# transpose in registers, 0.983-0.990x at 1 and 2 threads (Zen 5, in pairs)
WINDOW_MIN_K = 576


def measured(machine: Machine, streaming: bool = False) -> dict[str, float]:
    """The host's calibrated GFLOP/s of every gemm kernel `machine` can build, in cache
    or with B streaming from L2 (`streams_b`)."""
    return calibrate.rates(machine, tuple(m for m in registry.REGISTRY if m.kind == "gemm"
                                          and set(m.features) <= machine.features), streaming)


def microkernel_name(kernel: Kernel, machine: Machine, min_flops: int = 0,
                     then: bool = True) -> str | None:
    """The fusion oracle's question: the microkernel that computes `kernel`'s contraction
    (at least `min_flops` of it), or None; `then` as in `cpu_gemm_view`."""
    view = cpu_gemm_view(kernel, then=then)
    mk = gemm_microkernel(view, machine, min_flops=min_flops,
                          streaming=view is not None and streams_b(view, kernel, machine))
    return mk.name if mk else None


def cpu_gemm_view(kernel: Kernel, fold: bool = True, then: bool = True,
                  window: registry.Microkernel | None = None) -> GemmView | None:
    """`gemm_view` with the row tail the cpu nest places (`trees._tail_tree`), except
    after a contraction whose B is read in place (conv2d, `analysis.b_rows`): packing it
    for the tail's single column block would cost more than the tail's kernel saves.
    Where B is packed and has no tail, its batch dims A does not read are folded into
    the columns (`gemm_view(fold=True)`): one A block then serves every image's columns,
    packed once, and a small image (conv5's 7x7) does not leave most of a column panel
    empty (49 columns in 64); images that small are folded and packed even where B
    could be read in place. Not when an image has FOLD_COLUMNS columns or more:
    an image's blocks stay in cache where all images' do not (one thread), and each
    thread's own images (par=batch) beat a team sharing every block. `fold` False:
    never folded (`CpuOptions.fold_batch`). `then`: a contraction after the tail is
    taken too (`Options.tail_contraction`). Nor where `window`, the target's window
    kernel (`window_kernel`), reads B in place (`reads_windows`): it does so image by
    image."""
    view = gemm_view(kernel, tail=True, then=then)
    if view is None or (not view.tail and not fold):
        return view
    if window is not None and reads_windows(view, kernel, window):
        return view
    in_place = b_rows(view, kernel) is not None
    if view.tail:
        return None if in_place else view
    if view.N >= FOLD_COLUMNS:
        return view
    folded = gemm_view(kernel, fold=True)
    return view if in_place and folded.c_matrix else folded


def window_kernel(kernel: Kernel, machine: Machine, options) -> registry.Microkernel | None:
    """The kernel that reads a convolution's window in place with the weights as its
    vectors (`Microkernel.window`), if the target has one within
    `options.microkernel_isa`, and neither the options nor `polyc tune` name another
    for `kernel`. Sapphire Rapids, 1 thread, in pairs of calls against torch in one
    process, the plans before it and with it: 8x256x14x14 3x3 0.86-0.88x and 1.04x,
    8x512x7x7 0.88x and 0.96x, 8x128x28x28 0.92x and 1.09-1.19x, one image of 512x7x7
    1.20x and 1.61x. Not for 1x1 convolutions: their K rows are whole planes apart, 14
    floats of a line each (by hand, 1.4-2.6x the time). Of two that fit, the one the
    calibration measured faster deep (`measured`, streaming: a window is read in place
    only 576 or more deep): they differ in how a pixel is broadcast, which cores rank
    differently (Zen 5 runs the register broadcast faster, sgemm_avx512_32x14_bcast.c;
    on Sapphire Rapids the 14x32 tile had run 8-15% faster with its broadcast folded)."""
    isa = options.microkernel_isa
    mine = [name for k, name in options.kernel_gemm if k == kernel.name]
    asked = mine[0] if mine else options.gemm_kernel
    tuned = tuning.lookup(kernel, machine, tuning.team(options, machine)) or {}
    named = asked or tuned.get("microkernel", "")
    fits = [m for m in registry.REGISTRY if m.window and set(m.features) <= machine.features
            and (not isa or m.name in registry.ISAS[isa]) and (not named or m.name == named)]
    if len(fits) > 1:
        rates = measured(machine, streaming=True)  # {} where the host cannot run them
        fits.sort(key=lambda m: -rates.get(m.name, 0.0))
    return fits[0] if fits else None


def reads_windows(view: GemmView, kernel: Kernel, mk: registry.Microkernel) -> bool:
    """Does `mk`, a window kernel, read this contraction's B in place: a window
    (`analysis.windowed`) at least WINDOW_MIN_K deep, as rows of its (padded) input
    (`plan_rows`), in tiles at each output row or pair of rows (`row_tiles`), or of one
    image? Where a tile would span rows and the pads between them (a 7x7 output's 49
    pixels in 4 tiles of 14 virtual columns, a window other than 3x3), a batch of
    images is folded for the other kernels instead (`cpu_gemm_view`; Sapphire Rapids,
    1 thread, in pairs of calls against torch: 8x512x7x7 0.85x so, 0.87x folded; one
    image 1.42x and 1.22x)."""
    if not (mk.window and windowed(view)) or view.K < WINDOW_MIN_K:
        return False
    rows = plan_rows(view, kernel, mk)
    return rows is not None and (row_tiles(view, rows, mk, kernel) > 0 or view.batches == 1)


def plan_rows(view: GemmView, kernel: Kernel, mk: registry.Microkernel,
              sliced: bool | None = None) -> BRows | None:
    """B as the rows `mk` reads in place (`analysis.b_rows`, `sliced` as there), or None.
    A window kernel's tiles are its own 14 columns: at each output row or pair of rows
    (`row_tiles`) they are the output's own, else WINDOW_TILE_WASTE bounds those past
    it."""
    if not mk.b_rows_variant:
        return None
    if not mk.window:
        return b_rows(view, kernel, sliced=sliced)
    rows = b_rows(view, kernel, mk.nr, math.inf, sliced)
    if rows is None or row_tiles(view, rows, mk, kernel):
        return rows
    return rows if -(-rows.width // mk.nr) <= WINDOW_TILE_WASTE * -(-view.N // mk.nr) else None


def row_tiles(view: GemmView, rows: BRows, mk: registry.Microkernel, kernel: Kernel) -> int:
    """The output rows a window kernel's column tile covers where its tiles start at
    each output row, or pair of rows (`jy` loop, then `jr` within the row), rather than
    every 14 virtual columns; 0 where they do not. 1 where the rows are whole tiles wide:
    a 14x14 output is 14 tiles so, 15 across the pad columns between its rows (0.92x
    the time of 8x256x14x14 3x3, 1 thread, in pairs of calls), and every tile is
    straight, written back without a test of where its rows wrap. 2 where two rows fill
    a tile, read as two runs by the kernel's `b_taps_variant` (a 3x3 window), one flat
    run in every tensor the write-back touches (`analysis.flat_columns_from`): a 7x7
    output is 3.5 tiles so, 4 across the pads (by hand, against torch in pairs:
    8x512x7x7 1.02x so, 0.85x across; 8x512x14x14 /2 1.10x and 0.89x)."""
    if not mk.window or len(view.cols) < 2:
        return 0
    width = view.shape[view.cols[-1]]
    if width % mk.nr == 0:
        return 1
    flat = flat_columns_from(view, lambda t: kernel.array(t).type.shape) <= len(view.cols) - 2
    return 2 if 2 * width == mk.nr and mk.b_taps_variant and window_taps(view, rows) and flat else 0


def plan_view(kernel: Kernel, plan: Gemm) -> GemmView | None:
    """The view `plan` was made for: the plan records whether it folded (`b=folded`),
    so the decision is not taken again."""
    return (gemm_view(kernel, fold=True) if plan.b == "folded"
            else cpu_gemm_view(kernel, fold=False, then=bool(plan.then)))


def gemm_microkernel(view: GemmView | None, machine: Machine, isa: str = "",
                     min_flops: int = MIN_GEMM_FLOPS, streaming: bool = False
                     ) -> registry.Microkernel | None:
    """The gemm microkernel for a contraction (`gemm_view`), if any and if it has at
    least `min_flops`: what the microkernels pass maps, and the fusion oracle keeps. With
    a row tail, only where blocks of whole rows fit (`tail_rows`); `streaming` as in
    `streams_b`."""
    if view is None or view.flops < max(min_flops, MIN_GEMM_FLOPS):
        return None
    mk = registry.select("gemm", "float32", machine, isa, shape=(view.M, view.N),
                         rates=measured(machine, streaming), streaming=streaming)
    return None if mk is None or (view.tail and not tail_rows(view, mk, machine)) else mk


def then_kernel(view: GemmView, machine: Machine, isa: str = "") -> registry.Microkernel:
    """The kernel of a row tail's contraction (`GemmView.then`): its A, rows the tail has
    just written, is read in place, so a kernel with an `a_rows_variant`, within `isa` if
    one there has it (the portable kernel has it, so there is always one): by rank, then
    the share of its tiles inside the result (64 columns: all of 6x16's, 89% of 4x24's),
    then the host's measured rate."""
    rates = measured(machine)
    fits = [m for m in registry.REGISTRY if m.kind == "gemm" and m.a_rows_variant
            and set(m.features) <= machine.features]
    asked = [m for m in fits if isa and m.name in registry.ISAS[isa]]
    shape = (view.then.M, view.then.N)
    return max(asked or fits, key=lambda m: (m.rank, round(registry.tile_efficiency(m, *shape), 2),
                                            rates.get(m.name, 0.0)))


def tail_rows(view: GemmView, mk: registry.Microkernel, machine: Machine) -> int:
    """The rows of a block of C whose row operations (`GemmView.tail`) run right after
    the block is final: at most what fills half of L2 with whole rows of C, so the tail
    reads them from L2 (attention's 512-wide scores: 126 rows of the 6x16 kernel on a
    512 KiB L2); 0 when that is under MIN_TAIL_PANELS micro-panels of rows. With a
    contraction after the tail (`then`), the block's probabilities share that half
    where the rows allow it (attention 8x512x64 on a 2 MiB L2, 14x32: blocks of 126
    rows, or 266 balanced, against 504 and a last one of 8, 1.07-1.09x at 1 thread and
    1.22-1.26x at 2, best of 20 in turns)."""
    for buffers in ((2, 1) if view.then else (1,)):
        rows = machine.fusion_level.capacity // 2 // (4 * view.N * buffers)
        rows -= rows % mk.mr
        if rows >= MIN_TAIL_PANELS * mk.mr:
            return rows
    return 0


def choose_gemm_kernel(view: GemmView, kernel: Kernel, machine: Machine, options,
                       streaming: bool = False, window: registry.Microkernel | None = None
                       ) -> tuple[registry.Microkernel, str]:
    """The gemm kernel for this contraction and why: the one `options.kernel_gemm` names
    for this kernel, else the one `options.gemm_kernel` names, else the one `polyc tune`
    measured fastest for this kernel, else `window` (`window_kernel`) where it reads B
    in place, else the fastest the calibration measured for the shape
    (`registry.choose`, `streaming` as in `streams_b`); within `options.microkernel_isa`
    when it names one."""
    isa = options.microkernel_isa
    allowed = allowed_gemm_kernels(machine, isa)
    asked = asked_gemm_kernel(kernel, machine, options)
    if asked is not None:
        return asked
    tuned = tuning.lookup(kernel, machine, tuning.team(options, machine)) or {}
    name = tuned.get("microkernel")
    if name and any(m.name == name for m in allowed):
        return registry.by_name(name), (f"measured fastest by polyc tune "
                                        f"({tuned['seconds'] * 1e3:.3f} ms)")
    if window is not None and reads_windows(view, kernel, window):
        rates = measured(machine, streaming=True)
        other = next((m for m in allowed if m.window and m is not window and m.name in rates),
                     None)
        faster = (f"; {window.name} measured on this host at {rates[window.name]:.1f} GFLOP/s, "
                  f"{other.name} at {rates[other.name]:.1f}"
                  if other is not None and window.name in rates else "")
        return window, ("B is a window read in place: the weights as vectors, its pixels "
                        "broadcast (the direct convolution)" + faster)
    narrow = (window is not None and view.N < WINDOW_PACKED_COLUMNS
              and view.K >= WINDOW_PACKED_MIN_K and not windowed(view)
              and b_rows(view, kernel) is None)
    if narrow:
        # no window (a 1x1 convolution, a matmul), deep, under WINDOW_PACKED_COLUMNS
        # columns (a 7x7 or 14x14 image, or 7x7 images folded), B packed: the window kernels'
        # packed entry among the candidates, its 14 columns wasting less of a 7x7 or 14x14
        # image than the 48 of 8x48 (56 computed for 49, against 64; 196 against 208), by
        # the rates measured deep, as its narrow panels make its K blocks (512-684 deep;
        # the in-cache calibration's are 256). Zen 5, in pairs of calls, the 8x48 kernel
        # pinned against it: 1x2048x7x7 to 512 1x1 0.90x the time at 1 thread, 0.87x at
        # 2; 1x1024x14x14 to 2048 /2 0.80x and 0.90x. 196 columns, once C's rows were made
        # in registers (1.02x the other way with C scattered): 1x512x28x28 to 1024 /2
        # 0.935x and 0.943x, 8x512x28x28 to 1024 /2 0.888x and 0.935x, 1x1024x14x14 to
        # 256 0.99x and 0.96x; 392 (eight 7x7 images folded, 8x48: 400) 8x2048x7x7 to 512
        # 0.97x and 0.95x, 8x1024x14x14 to 2048 /2 0.93-0.95x and 0.955x; 784 columns and
        # more it loses (1.04-1.42x)
        return registry.choose("gemm", "float32", machine, isa, shape=tile_shape(view, kernel),
                               rates=measured(machine, streaming=True), windows=True)
    return registry.choose("gemm", "float32", machine, isa, shape=tile_shape(view, kernel),
                           rates=measured(machine, streaming), streaming=streaming)


def allowed_gemm_kernels(machine: Machine, isa: str) -> list[registry.Microkernel]:
    return [m for m in registry.REGISTRY if m.kind == "gemm" and set(m.features) <= machine.features
            and (not isa or m.name in registry.ISAS[isa])]


def asked_gemm_kernel(kernel: Kernel, machine: Machine, options
                      ) -> tuple[registry.Microkernel, str] | None:
    """The gemm kernel `options.kernel_gemm` names for this kernel, else the one
    `options.gemm_kernel` names, and why; None when neither names one. A kernel the
    target cannot run (or outside `options.microkernel_isa`) is the user's error."""
    isa = options.microkernel_isa
    mine = [k for k, (name, _) in enumerate(options.kernel_gemm) if name == kernel.name]
    field = f"kernel_gemm.{mine[0]}" if mine else "gemm_kernel"
    asked = options.kernel_gemm[mine[0]][1] if mine else options.gemm_kernel
    if not asked:
        return None
    mk, allowed = registry.by_name(asked), allowed_gemm_kernels(machine, isa)
    if mk not in allowed:
        raise GraphError(Problem(
            f"{asked} needs {', '.join(mk.features) or 'nothing'}; the target (-march="
            f"{machine.arch}{f', microkernel_isa {isa}' if isa else ''}) offers "
            f"{', '.join(m.name for m in allowed) or 'no gemm kernel'}",
            field=f"options.{field}"))
    return mk, f"asked for by options.{field.split('.')[0]}"


def tile_shape(view: GemmView, kernel: Kernel) -> tuple[int, int]:
    """The rows and columns a kernel's tiles cover: with B read in place, its virtual
    columns (`BRows.width`), the image's own and its pads between rows. A 14x14 output
    of a stride-2 window is 209 of them: 14 tiles of 16 (224, 12.5% of the multiply-adds
    wasted) or 9 of 24 (216, 9%); the 4x24 kernel measured 5.7% faster on 8x256x28x28 to
    256 3x3 /2 and 18% on one image (Zen 3, 1 thread, medians over 6 runs), where C's
    own 196 columns ranked the 6x16 first."""
    rows = b_rows(view, kernel)
    return view.M, rows.width if rows is not None else view.N


def streams_b(view: GemmView, kernel: Kernel, machine: Machine) -> bool:
    """Do B's micro-panels stream from L2 (`registry.choose` then takes the
    calibration's rates measured so)? Where B is packed and C cannot stay in cache
    (`tiles.c_streams`), `model_tiles` makes them an eighth of L2 or more, not L1; the
    in-cache rates do not see what loading them then costs (Zen 3, 6x16 against 4x24,
    8-image 1x1 convolutions folded into one C: 8x256x56x56 to 512 /2, 71 against 52
    GFLOP/s; 8x512x28x28 to 128, 71 against 60; one image of the latter, whose C stays
    in cache, 52 against 70). Not a B read in place, a window's, whose neighbouring rows
    overlap in cache (3x3: 4x24 5% faster)."""
    return b_rows(view, kernel) is None and c_streams(view.M, view.N, machine)


def plan_gemm(view: GemmView, mk: registry.Microkernel, kernel: Kernel, machine: Machine,
              options, rows: BRows | None = None) -> Gemm:
    """Tiles and loops; with `rows` (B read in place) there is no B block to size, so no
    jc loop, and the column tiles step through the virtual columns."""
    M, N, K = view.M, view.N, view.K
    team = tuning.team(options, machine)
    par = "none"
    if view.flops >= MIN_PARALLEL_FLOPS and team > 1:
        first = next((view.shape[d] for d in view.batch if view.shape[d] > 1), 1)
        par = "batch" if first >= team and (first % team == 0 or first >= 4 * team) else "inner"
    const = constant_operand(view, kernel, "a")  # never packed again: images outside
    tiles = model_tiles(M, N, K, mk, machine, in_place=rows is not None,
                        alone=par != "inner", const_a=const, balance=options.balance_tiles)
    tuned = tuning.lookup(kernel, machine, team) or {}
    overrides = dict(tuned.get("tiles", {})) if tuned.get("microkernel", mk.name) == mk.name else {}
    overrides.update(dict(options.microkernel_tiles))
    tiles = apply_overrides(tiles, overrides, M, N, K, mk)
    if view.tail:  # every column in one block, so a block of rows is final at its end
        block = max(mk.mr, tail_rows(view, mk, machine))
        if options.balance_tiles:  # 512 rows in 266 and 246, not 504 and a sliver of 8
            block = balanced(M, block, mk.mr)
        tiles = replace(tiles, mc=min(tiles.mc, block),
                        nc=max(tiles.nc, -(-N // mk.nr) * mk.nr))
    # too few column tiles to share: each thread takes whole row blocks instead (a
    # packed B still packed by the team, `_team_packs`). One image only: no batch loop,
    # which the per-image copies of B (`BRows.slices`) would share inside the blocks
    few_tiles = par == "inner" and not view.tail and view.batches == 1 \
        and -(-min(tiles.nc, rows.width if rows else N) // mk.nr) < ROWS_TEAM_TILES * team
    # or a window kernel reading its window in place with two row blocks or more a thread
    # (Zen 5, 2 threads, in pairs of calls, by row blocks against sharing each block's
    # tiles: 1x128x28x28 3x3 and 1x128x56x56 /2 0.94x the time, 1x256x28x28 /2 and
    # 1x256x14x14 0.98x; 64 channels, one block a thread, 1.01x)
    window_rows = (par == "inner" and rows is not None and mk.window
                   and M >= 2 * team * mk.mr)
    # or a window kernel's weights, each block serving every image (the batch loop then
    # inside each thread's row blocks)
    if few_tiles or window_rows or (par == "batch" and shares_weights(view, mk, rows, machine)):
        par = "rows"  # about four blocks a thread (mc rounded up to the kernel's rows)
        tiles = replace(tiles, mc=min(tiles.mc, -(-M // (4 * team * mk.mr)) * mk.mr))
    batch = [f"b{d}" for d in view.batch if view.shape[d] > 1]
    loops = ["jc"] if N > tiles.nc and rows is None else []
    loops += ["pc"] if K > tiles.kc else []
    loops += ["ic"] if M > tiles.mc else []
    # a constant A is never packed again: images outside, but for a window kernel reading
    # its window in place, whose block of weights then serves every image from L2
    # (8x512x7x7 3x3, its 9.4 MB streamed once, not once per image: 0.96-0.97x the time,
    # 1 thread, in pairs; level on 14x14 to 56x56 outputs). Its packed entry would pack
    # each image's B again in every block of A (8x1024x14x14 to 256 1x1: 1.11x the 8x48's
    # time so, Zen 5, 1 thread, in pairs; images outside at 2 threads, 0.98x)
    inside = ((not const or (mk.window and rows is not None)) and not view.tail
              and _batch_inside_a(view, rows, par, loops, -(-M // tiles.mc)))
    loops = loops + batch if inside else batch + loops
    per_tile = row_tiles(view, rows, mk, kernel) if rows else 0
    # a 3x3 window's taps in one K block (a K block would have to start at a channel);
    # two rows a tile only so: their partial sums would need split virtual columns too
    taps = 9 if rows and mk.b_taps_variant and window_taps(view, rows) and "pc" not in loops else 0
    if per_tile == 2 and not taps:
        per_tile = 0
    if per_tile:
        width = view.shape[view.cols[-1]]
        loops += ["jy"] if N > per_tile * width else []
        loops += ["jr"] if width > mk.nr else []
    else:
        loops += ["jr"] if (rows.width if rows else min(N, tiles.nc)) > mk.nr else []
    # unbalanced, a block's row-tile loop stays where the rows fill one tile: whether it
    # is there must not hinge on a size a symbolic compile's probes fall either side of
    # (rows 2 to 15 probed at 13, 11 and 7 on an 8-row kernel)
    loops += ["ir"] if (min(M, tiles.mc) if options.balance_tiles else tiles.mc) > mk.mr else []
    if par == "inner" and not {"jy", "jr", "ir"} & set(loops):
        par = "none"  # one tile per block: nothing for a team to share
    if par == "rows" and "ic" not in loops:
        par = "none"  # one row block
    b = "rows" if rows else "packed" if view.c_matrix else "folded"
    a = "rows" if b == "packed" and reads_a_in_place(view, kernel, mk, tiles.nc) else "packed"
    if const:  # its panels, made once, beat rows read in place too
        a = "const"
    elif a == "packed" and packs_a_once(view, mk, machine, loops, par):
        a = "once"
    # masked tiles are skipped where each is computed in one piece (no K blocks)
    masked = masked_columns(view, kernel) if b == "packed" and "pc" not in loops else None
    depth = masked_depth(view, kernel) if b == "packed" else None
    if b == "packed" and constant_operand(view, kernel, "b"):
        b = "const"
    then = then_kernel(view, machine, options.microkernel_isa).name if view.then else ""
    then_depth = masked_depth(view.then, kernel) if view.then else None
    return Gemm(view.stmt.name, mk.name, M, N, K, tiles.mc, tiles.nc, tiles.kc, par,
                options.threads, tuple(loops), b, "-" if masked is None else str(masked),
                "-" if depth is None else str(depth), a, then,
                "-" if then_depth is None else str(then_depth), row_tile=per_tile, taps=taps,
                sliced=int(bool(rows and rows.slices)))


def shares_weights(view: GemmView, mk: registry.Microkernel, rows: BRows | None,
                   machine: Machine) -> bool:
    """Does a team take whole row blocks of a window kernel's weights, each block serving
    every image (`par=rows`, the batch loop inside), rather than an image each
    (`par=batch`, every thread streaming all the weights for each of its images)? Where
    the weights are over L2 and an image is small (under FOLD_COLUMNS columns: each
    weight then serves few multiply-adds an image), and B's copy is made once for all
    the images (not `BRows.slices`, which would be made again in each row block).
    Sapphire Rapids, 2 threads, in pairs of calls: 8x512x7x7 3x3 (9.4 MB of weights,
    49 columns an image) 1.14x the speed; 8x256x14x14 (2.4 MB, 196 columns) 0.97x."""
    return (mk.window and rows is not None and not rows.slices and view.N < FOLD_COLUMNS
            and 4 * view.M * view.K > machine.fusion_level.capacity)


def constant_operand(view: GemmView, kernel: Kernel, side: str) -> bool:
    """Is the operand on `side` ('a' or 'b') a static constant of the graph, read whole
    as it is, the same for every image (conv2d's weights, a linear layer's, in a model's
    inference graph)? Then it is packed on the kernel's first call and kept (`Gemm.a` or
    `Gemm.b` 'const'): each call had packed all of it again (conv5's 1x512x7x7 to 512
    3x3: 9.4 MB of weights against 0.1 MB of image, the pack 14% of the time)."""
    e = view.a_expr if side == "a" else view.b_expr
    return (isinstance(e, Load) and bool(kernel.array(e.tensor).constant)
            and not iterators(e) & {view.out_iter[d] for d in view.batch})


def packs_a_once(view: GemmView, mk: registry.Microkernel, machine: Machine,
                 loops: list[str], par: str) -> bool:
    """Is A packed whole before the loop over images (`Gemm.a` 'once')? Where that loop
    runs outside A's blocks (`_batch_inside_a`: B copied image by image, or A one block)
    each image packed all of A again; an A without batch dims is the same for every
    image. Its panels must fit in the L3 (they are read from there, image after image),
    and not with par=rows, where each thread packs its own blocks."""
    if not loops or loops[0][0] != "b" or par == "rows":
        return False
    if iterators(view.a_expr) & {view.out_iter[d] for d in view.batch}:
        return False
    return 4 * -(-view.M // mk.mr) * mk.mr * view.K <= machine.role("block").capacity


def reads_a_in_place(view: GemmView, kernel: Kernel, mk: registry.Microkernel, nc: int) -> bool:
    """Do the tiles read A's rows where they are (`Gemm.a`), rather than a packed block?
    Where a block of A serves at most A_IN_PLACE_TILES column tiles, its pack is not paid
    back: a row-major A that reads K at unit stride (`analysis.a_row_stride`) is then
    read in place."""
    return (bool(mk.a_rows_variant) and -(-min(view.N, nc) // mk.nr) <= A_IN_PLACE_TILES
            and a_row_stride(view, kernel) is not None)


def _batch_inside_a(view: GemmView, rows: BRows | None, par: str, blocks: list[str],
                    a_blocks: int) -> bool:
    """Run the batch loop inside the A block (`pc, ic, b0, jr, ir`) when A has no batch
    dim: each block of A is then packed once for all the images, not once per image
    (conv5 8x512x7x7 to 512 3x3 packed its 9.4 MB of weights 8 times). A packed B block
    (one per image, no jc loop) is then packed again for each of the `a_blocks` row
    blocks: done when that costs less than the A packs saved. Not when B is copied image
    by image (`BRows.slices`: the copy would be remade per A block), when A is one block
    (`blocks` empty) or when the batch loop is the parallel one."""
    if not blocks or par == "batch" or (rows is not None and rows.slices) or "jc" in blocks:
        return False
    if iterators(view.a_expr) & {view.out_iter[d] for d in view.batch}:
        return False
    images = view.batches
    return rows is not None or images * (a_blocks - 1) * view.N < (images - 1) * view.M
