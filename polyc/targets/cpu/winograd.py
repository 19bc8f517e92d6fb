"""3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3) or F(4x4, 3x3): which, which
tile, how blocked, the tree.

Each m x m block of outputs (a tile; m = 2 or 4) comes from an (m + 2) x (m + 2) patch of
the input through (m + 2)^2 products summed over the channels, M[e] = U[e] V[e] (U from
the weights, O x C; V from the patches, C x tiles), then a transform of them back to the
m x m: 16 multiply-adds a tile and channel pair where the direct convolution has 36 (m =
2), 36 where it has 144 (m = 4) (`microkernels/winograd_f2x3.c` and `winograd_f4x3.c`
hold the transforms, a gemm kernel the products). The tiles run in blocks of whole tile
rows (m output rows of one image each), a block's transformed patches, products and
outputs in scratch while it is in cache; each tile row's patches are laid out m floats a
tile with one tile more (its right pad), so the transforms are long unit-stride loops
over a block, at the cost of that tile's products.

Taken where it pays: 3x3 windows of stride 1 over float32, at least MIN_CHANNELS
channels in and out, tiles that waste little of the output (a 7x7 output is 4x4 tiles
of 2x2, 5 wide with the pad: 1.4x fewer multiply-adds than direct, before the
transforms), products that, their panels rounded up, keep enough of that
(MIN_PANEL_GAIN), for a team, work enough (MIN_TEAM_FLOPS), and for weights transformed
on every call, tiles enough (MIN_CALL_TILES). Of the two tiles, where
`winograd_max_tile` allows 4 (its rounding, below), 4 where its products take
F4_MARGIN less time: its transforms cost more a tile. Zen 5, polyc's direct
convolution's time over this one's, in pairs of calls (bias and relu, constant
weights), 1 and 2 threads, F(2x2, 3x3) alone: 1x32x56x56 to 32 1.27x and 1.41x,
8x32x56x56 1.25x and 1.27x, 1x48x28x28 1.31x and 1.29x, 1x32x28x28 to 64 1.38x and
1.33x, 8x64x14x14 1.17x and 1.04x, 1x128x14x14 1.16x and 1.15x, 1x256x10x10 1.53x and
1.44x; with F(4x4, 3x3) (on the usual points), ResNet-50's: 1x64x56x56 2.21x and 2.20x, 8x64x56x56 2.16x and
1.95x, 1x128x28x28 2.05x and 2.05x, 8x128x28x28 2.11x and 1.81x, 8x512x7x7 1.00-1.12x
and 1.14x (F(2x2, 3x3)'s time over F(4x4, 3x3)'s there 1.29-1.59x), 14x14 images keep
F(2x2, 3x3) (1.27-1.35x).

The rounding differs from the direct sum's: F(2x2, 3x3)'s transforms add and subtract
up to nine inputs or products (a few ulps of the largest), about what a direct sum's
order changes; F(4x4, 3x3)'s scale by up to 8 and 16/15, about seven times that, even
on points chosen for it (`winograd_f4x3.c`; float32, 8x128x28x28: 5.2e-6 off a float64
reference, F(2x2, 3x3)'s 7.2e-7; ResNet-18's first block missed onnxruntime's output at
rtol 1e-4, atol 1e-5 on 171 of 200704 elements, where F(2x2, 3x3) misses none): it is
taken only where `CpuOptions.winograd_max_tile` is 4. `winograd` False keeps the
direct convolution, `winograd_tile` 2 or 4 asks for one tile wherever it applies.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from ...kernel import Kernel
from ...kernel.comprehension import Aff, Const, Guarded, Load
from ...machine import Machine
from ...microkernels import registry
from ...microkernels.analysis import GemmView, gemm_view
from ...schedule_tree import marks, text
from ...schedule_tree.model import PolyModel
from . import tuning
from .emit.common import up
from .plan import (MIN_PARALLEL_FLOPS, allowed_gemm_kernels, asked_gemm_kernel,
                   constant_operand, measured)

MIN_CHANNELS = 32
TILES = (2, 4)  # F(2x2, 3x3) and F(4x4, 3x3)
# F(2x2, 3x3)'s products' time over F(4x4, 3x3)'s above which 4 wins: its transforms
# cost more a tile, and its weights take 36 / 16 the memory (Zen 5, 1 thread, in pairs
# of calls: products 1.11x fewer ran 0.93x the speed (8x256x14x14 to 256), 1.52x fewer
# 1.31x (1x128x28x28), 1.75x 1.50x (8x64x56x56)). Its products' time counts this much
# more against the direct convolution too (MIN_PANEL_GAIN)
F4_MARGIN = 1.25
# the direct convolution's multiply-adds at the fastest kernel's rate over the products'
# as their kernel computes them (its panels rounded up, at its rate; F(4x4, 3x3)'s
# times F4_MARGIN) under which Winograd loses (Zen 5, 1 thread, the direct
# convolution's time over Winograd's): F(2x2, 3x3) on 1x128x14x14 1.43, 1.20x; F(4x4,
# 3x3) on 8x512x7x7 1.63, 1.12x; on 4x512x7x7 1.10 (24 tiles, one 32-wide panel),
# 0.67x; on 2x512x7x7 0.62 (one 16-wide panel of avx2's 6x16 at half the rate), 0.46x
MIN_PANEL_GAIN = 1.2
# the direct convolution's multiply-adds over the products' (a tile's pad counted): 2.1
# on 28x28 outputs, 1.97 on 14x14, 1.38 on 7x7, which lost (above)
MIN_GAIN = 1.8
# a block's transformed patches, floats: they and the products stay in L3 between the
# phases, each of the 16 operands read panel by panel
MAX_BLOCK_FLOATS = 1 << 20
MAX_BLOCK_COLUMNS = 512
# products' multiply-adds under which a team's direct convolution wins: Zen 5, 2
# threads, 1x64x14x14 to 64 (8.4 M) 0.97x the direct one's speed; 1x128x14x14 to 128
# (34 M) 1.15x (in pairs of calls; at 1 thread 1.05x and 1.16x)
MIN_TEAM_FLOPS = 1 << 24
# tiles (a tile row's pad counted) that weights transformed on every call (a graph
# input, not a constant) must serve: their transform costs about what the products of
# 64 tiles do. Zen 5, in pairs of calls, the direct convolution's time over this one's:
# 1x256x14x14 to 256 (56 tiles) 0.91x at 1 thread, 1.08x at 2; 1x128x28x28 to 128 (210)
# 1.29x and 1.49x
MIN_CALL_TILES = 128


@dataclass(frozen=True)
class Conv:
    """The convolution a Winograd plan computes: y[n, o, i, j] over an N x C x H x W
    input x, zero outside it, from weights w[o, c, 3, 3]."""

    view: GemmView
    x: str
    w: str
    N: int
    C: int
    H: int
    W: int
    O: int
    OH: int
    OW: int
    pad_top: int
    pad_left: int
    m: int = 2  # F(m x m, 3x3): a tile's outputs a side; 2 or 4

    @property
    def operands(self) -> int:  # the products a tile: its patch's points
        return (self.m + 2) ** 2

    @property
    def TY(self) -> int:  # tile rows of an image (m output rows each)
        return -(-self.OH // self.m)

    @property
    def TX(self) -> int:  # tiles of a tile row (m output columns each)
        return -(-self.OW // self.m)

    @property
    def tile_rows(self) -> int:  # of every image
        return self.N * self.TY

    @property
    def row_tiles(self) -> int:  # tiles a tile row takes, its pad tile counted
        return self.TX + 1

    @property
    def gain(self) -> float:
        return 9 * self.OH * self.OW / (self.operands * self.TY * self.row_tiles)


def conv_of(kernel: Kernel) -> Conv | None:
    """The kernel as a 3x3 convolution of stride 1 (its contraction reads x[n, c, i + ky
    - pt, j + kx - pl], zero outside x's bounds, times w[o, c, ky, kx]) with an init and
    an elementwise epilogue and nothing else, or None."""
    view = gemm_view(kernel)
    if view is None or view.tail or len(view.shape) != 4 or (view.batch, view.rows, view.cols) \
            != ((0,), (1,), (2, 3)) or len(view.red) != 3 \
            or not all(type(n) is int for n in (*view.shape, *view.stmt.extents)):
        return None
    n, o, i, j = view.out_iter
    c, ky, kx = view.red
    ext = view.stmt.extents
    if ext[ky] != 3 or ext[kx] != 3:
        return None
    w, b = view.a_expr, view.b_expr
    bounds, x, pad = (b.bounds, b.then, b.otherwise) if isinstance(b, Guarded) else ((), b, None)
    if pad is not None and not (isinstance(pad, Const) and pad.value == 0):
        return None
    if not (isinstance(w, Load) and isinstance(x, Load) and w.dtype == x.dtype == "float32"):
        return None
    O, C = view.shape[o], ext[c]
    if w.index != (Aff(((o, 1),)), Aff(((c, 1),)), Aff(((ky, 1),)), Aff(((kx, 1),))) \
            or kernel.array(w.tensor).type.shape != (O, C, 3, 3):
        return None
    shape = kernel.array(x.tensor).type.shape
    if len(x.index) != 4 or x.index[:2] != (Aff(((n, 1),)), Aff(((c, 1),))) \
            or shape[:2] != (view.shape[0], C) or not all(type(d) is int for d in shape):
        return None
    pads = []
    for d, (out, k) in zip((2, 3), ((i, ky), (j, kx))):
        index = x.index[d]
        if not isinstance(index, Aff) or dict(index.terms) != {out: 1, k: 1}:
            return None
        pads.append(-index.const)
    if min(pads) < 0:  # the window starts past its output point: no pad, a shift
        return None
    # the guard must read x exactly inside its bounds: then a read outside is a zero
    valid = {d: [0, shape[d]] for d in range(4)}
    for bound in bounds:
        d = next((d for d in range(4) if dict(x.index[d].terms) == dict(bound.aff.terms)), None)
        if d is None:
            return None
        shift = bound.aff.const - x.index[d].const
        valid[d] = [max(valid[d][0], bound.lo - shift), min(valid[d][1], bound.hi - shift)]
    if any(valid[d] != [0, shape[d]] for d in range(4)):
        return None
    reach = {2: (-pads[0], view.shape[2] + 1 - pads[0]), 3: (-pads[1], view.shape[3] + 1 - pads[1])}
    for d, (lo, hi) in reach.items():  # unguarded, every read must be inside
        if not any(dict(bd.aff.terms) == dict(x.index[d].terms) for bd in bounds) \
                and (lo < 0 or hi >= shape[d]):
            return None
    return Conv(view, x.tensor, w.tensor, shape[0], C, shape[2], shape[3], O, view.shape[2],
                view.shape[3], pads[0], pads[1])


def blocking(conv: Conv, mk: registry.Microkernel) -> tuple[int, int]:
    """(tile rows a block, columns the products compute over all blocks) for kernel
    `mk`: the fewest columns (a block's tiles rounded up to whole panels of mk.nr), then
    the largest blocks, within MAX_BLOCK_FLOATS of patches and MAX_BLOCK_COLUMNS."""
    R, ts = conv.tile_rows, conv.row_tiles
    cap = max(ts, min(MAX_BLOCK_COLUMNS, MAX_BLOCK_FLOATS // (conv.operands * conv.C)))
    best = None
    for rows in range(1, R + 1):
        if rows * ts > cap and rows > 1:
            break
        full, last = divmod(R, rows)
        cols = full * up(rows * ts, mk.nr) + (up(last * ts, mk.nr) if last else 0)
        if best is None or (cols, -rows) < (best[1], -best[0]):
            best = (rows, cols)
    return best


@dataclass(frozen=True)
class Choice:
    """A 3x3 convolution's algorithm: its Winograd plan, or None for the direct
    convolution, and why (the kernel's report says it either way)."""

    conv: Conv
    plan: marks.Winograd | None
    why: str


def plan_winograd(kernel: Kernel, machine: Machine, options) -> Choice | None:
    """The algorithm of a 3x3 convolution of stride 1, or None for any other kernel. The
    tile `options.winograd_tile` asks for, else the one `polyc tune` measured fastest (or
    the direct convolution), wherever the convolution is one; otherwise of the tiles up
    to `options.winograd_max_tile` that pay (see the module doc), F(4x4, 3x3) where its
    products take F4_MARGIN times less time than F(2x2, 3x3)'s."""
    conv = conv_of(kernel)
    if conv is None:
        return None
    if not options.winograd:
        return Choice(conv, None, "options.winograd=False asks for it")
    if options.winograd_tile:
        return _asked(conv, options.winograd_tile, kernel, machine, options,
                      f"asked for by options.winograd_tile={options.winograd_tile}")
    tuned = tuning.lookup(kernel, machine, tuning.team(options, machine)) or {}
    measured_tile = tuned.get("winograd")  # 0: the direct convolution measured fastest
    if measured_tile is not None and measured_tile <= options.winograd_max_tile:
        if not measured_tile:
            return Choice(conv, None, f"polyc tune measured it fastest "
                                      f"({tuned['seconds'] * 1e3:.3f} ms)")
        return _asked(conv, measured_tile, kernel, machine, options,
                      f"measured fastest by polyc tune ({tuned['seconds'] * 1e3:.3f} ms)",
                      tuned["microkernel"])
    if min(conv.C, conv.O) < MIN_CHANNELS:
        return Choice(conv, None, f"{conv.C} channels in, {conv.O} out: Winograd's "
                                  f"transforms pay from {MIN_CHANNELS} each")
    found = {m: _plan(replace(conv, m=m), kernel, machine, options) for m in TILES}
    plans = {m: p for m, p in found.items() if not isinstance(p, str)}
    if not any(m <= options.winograd_max_tile for m in plans):
        if plans:
            return Choice(conv, None, f"F(2x2, 3x3) does not pay ({found[2]}); F(4x4, "
                                      "3x3) would: options.winograd_max_tile=4 allows it")
        return Choice(conv, None, "; ".join(f"F({m}x{m}, 3x3) does not pay ({why})"
                                            for m, why in found.items()
                                            if m <= options.winograd_max_tile))
    if len(plans) == 1:
        [(conv, plan, why, _)] = plans.values()
        return Choice(conv, plan, f"the only tile that pays; {why}")
    ratio = plans[2][3] / plans[4][3] * F4_MARGIN
    m = 4 if ratio >= F4_MARGIN and options.winograd_max_tile >= 4 else 2
    conv, plan, why, _ = plans[m]
    because = (f"F(2x2, 3x3)'s products take {ratio:.2f}x F(4x4, 3x3)'s time, "
               f"{'at least' if ratio >= F4_MARGIN else 'under'} the {F4_MARGIN}x that pays "
               "for 4's dearer transforms")
    if m != 4 and ratio >= F4_MARGIN:
        because += ("; options.winograd_max_tile=4 would take F(4x4, 3x3), at about seven "
                    "times the rounding")
    return Choice(conv, plan, f"{because}; {why}")


def _asked(conv: Conv, m: int, kernel: Kernel, machine: Machine, options, because: str,
           products: str = "") -> Choice:
    """The plan of tile `m` whether or not it pays, its products on kernel `products`
    where the target still offers it (and options ask for no other)."""
    found = _plan(replace(conv, m=m), kernel, machine, options, asked=True, products=products)
    if isinstance(found, str):
        return Choice(conv, None, f"F({m}x{m}, 3x3) was {because}, but {found}")
    return Choice(found[0], found[1], f"{because}; {found[2]}")


def _plan(conv: Conv, kernel: Kernel, machine: Machine, options, asked: bool = False,
          products: str = "") -> tuple[Conv, marks.Winograd, str, float] | str:
    """`plan_winograd`'s plan for the tile `conv.m` and its products' time (in units of
    the calibration's; F(4x4, 3x3)'s times F4_MARGIN), or why not where it does not pay
    (unless `asked`). `products`: their gemm kernel, if allowed."""
    if conv.gain < MIN_GAIN and not asked:
        return (f"{conv.gain:.2f}x fewer multiply-adds than direct, its tiles' pads "
                f"counted, under {MIN_GAIN}")
    rates = measured(machine)
    fits = [m for m in allowed_gemm_kernels(machine, options.microkernel_isa)
            if not m.window and (m.name in rates or m.name == products)]
    chosen = asked_gemm_kernel(kernel, machine, options)
    if chosen is None and any(m.name == products for m in fits):
        chosen = registry.by_name(products), "the products' kernel it was measured with"
    if chosen is not None:  # the direct convolution's kernel too
        (mk, why), fits = chosen, [chosen[0]]
    elif fits:
        def seconds(m: registry.Microkernel) -> float:
            return up(conv.O, m.mr) * blocking(conv, m)[1] / rates[m.name]
        mk = min(fits, key=seconds)
        why = (f"the fastest on its products by the calibration's rate ({rates[mk.name]:.1f} "
               f"GFLOP/s) times the share of them inside the tiles")
    else:
        return "no gemm kernel this target offers has a calibrated rate for its products"
    rows, cols = blocking(conv, mk)
    work = conv.operands * conv.C * up(conv.O, mk.mr) * cols
    # what the panels' rounding and the kernel's rate leave of the gain
    rate = rates.get(mk.name, 1.0)
    best = max((rates.get(m.name, 1.0) for m in fits), default=rate)
    time = work / rate * (F4_MARGIN if conv.m == 4 else 1.0)
    direct = 9 * conv.C * conv.O * conv.N * conv.OH * conv.OW / best
    if direct < MIN_PANEL_GAIN * time and not asked:
        return (f"its products, in whole panels on {mk.name}, take {time / direct:.2f}x "
                f"the direct convolution's time, over the 1 / {MIN_PANEL_GAIN} that pays")
    blocks = -(-conv.tile_rows // rows)
    team = tuning.team(options, machine)
    flops = 2 * conv.operands * conv.O * conv.C * cols
    if team > 1 and flops < MIN_TEAM_FLOPS and not asked:
        return (f"{flops / 1e6:.1f} M floating-point operations of products, too few for a "
                f"team of {team} (from {MIN_TEAM_FLOPS / 1e6:.1f} M)")
    par = "none"
    if team > 1 and flops >= MIN_PARALLEL_FLOPS:
        par = "blocks" if blocks >= 2 * team or blocks % team == 0 else "team"
    weights = "const" if constant_operand(conv.view, kernel, "a") else "call"
    if weights == "call" and conv.tile_rows * conv.row_tiles < MIN_CALL_TILES and not asked:
        tiles = conv.tile_rows * conv.row_tiles
        return (f"weights given on every call, transformed on every call: {tiles} tiles, "
                f"under the {MIN_CALL_TILES} that pay for it")
    return (conv, marks.Winograd(conv.view.stmt.name, mk.name, conv.m, rows, par,
                                 options.threads, weights), why, time)


def winograd_schedule(model: PolyModel, conv: Conv, plan: marks.Winograd) -> isl.Schedule:
    """The kernel's own loop nest (output points, then init, the contraction over its
    window and the epilogue in order) under the plan's mark: the tree is checked against
    the dependences as it stands, and codegen replaces all of it by the blocks."""
    view = conv.view
    s0 = view.stmt
    red = text.band([text.member([s0], lambda s, p=p: s.iter_name(p)) for p in view.red],
                    permutable=False)
    tree = text.sequence([([view.init], None), ([s0], red)] + [([e], None) for e in view.epilogue])
    point = [text.member((s0, view.init, *view.epilogue), lambda s, d=d: view.out_name(s, d))
             for d in range(4)]
    tree = text.mark(plan, text.band(point, tree, permutable=False))
    return isl.Schedule.read_from_str(model.domain.get_ctx(),
                                      f'{{ domain: "{model.domain}", child: {tree} }}')
