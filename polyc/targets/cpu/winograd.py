"""3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3): which, how blocked, the tree.

Each 2x2 block of outputs (a tile) comes from a 4x4 patch of the input through 16
products summed over the channels, M[e] = U[e] V[e] (U from the weights, O x C; V from
the patches, C x tiles), then a transform of the 16 back to the 2x2: 16 multiply-adds
a tile and channel pair where the direct convolution has 36 (`microkernels/
winograd_f2x3.c` holds the transforms, a gemm kernel the products). The tiles run in
blocks of whole tile rows (two output rows of one image each), a block's transformed
patches, products and outputs in scratch while it is in cache; each tile row's patches
are laid out two floats a tile with one tile more (its right pad), so the transforms are
long unit-stride loops over a block, at the cost of that tile's products.

Taken where it pays: 3x3 windows of stride 1 over float32, at least MIN_CHANNELS
channels in and out, tiles that waste little of the output (a 7x7 output is 4x4 tiles
of 2x2, 5 wide with the pad: 1.4x fewer multiply-adds than direct, before the
transforms), for a team, work enough (MIN_TEAM_FLOPS), and for weights transformed on
every call, tiles enough (MIN_CALL_TILES). Zen 5, polyc's direct
convolution's time over this one's, in pairs of calls (bias and relu, constant
weights), 1 and 2 threads: 1x32x56x56 to 32 1.27x and 1.41x, 8x32x56x56 1.25x and
1.27x, 1x48x28x28 1.31x and 1.29x, 1x32x28x28 to 64 1.38x and 1.33x, 8x64x14x14 1.17x
and 1.04x, 1x128x14x14 1.16x and 1.15x, 1x256x10x10 1.53x and 1.44x; ResNet-50's 3x3s
(`bench_cpu.py --suite resnet50`, best times) 1.33-1.69x; 8x512x7x7 (not taken) in a
harness of this code 0.9x.

The rounding differs from the direct sum's: the transforms add and subtract up to nine
inputs or products (a few ulps of the largest), about what a direct sum's order changes.
`CpuOptions.winograd` False keeps the direct convolution.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def TY(self) -> int:  # tile rows of an image (two output rows each)
        return -(-self.OH // 2)

    @property
    def TX(self) -> int:  # tiles of a tile row (two output columns each)
        return -(-self.OW // 2)

    @property
    def tile_rows(self) -> int:  # of every image
        return self.N * self.TY

    @property
    def row_tiles(self) -> int:  # tiles a tile row takes, its pad tile counted
        return self.TX + 1

    @property
    def gain(self) -> float:
        return 9 * self.OH * self.OW / (16 * self.TY * self.row_tiles)


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
    cap = max(ts, min(MAX_BLOCK_COLUMNS, MAX_BLOCK_FLOATS // (16 * conv.C)))
    best = None
    for rows in range(1, R + 1):
        if rows * ts > cap and rows > 1:
            break
        full, last = divmod(R, rows)
        cols = full * up(rows * ts, mk.nr) + (up(last * ts, mk.nr) if last else 0)
        if best is None or (cols, -rows) < (best[1], -best[0]):
            best = (rows, cols)
    return best


def plan_winograd(kernel: Kernel, machine: Machine, options
                  ) -> tuple[Conv, marks.Winograd, str] | None:
    """The Winograd plan of a 3x3 convolution where it pays (see the module doc), the
    convolution and why its kernel, or None."""
    if not options.winograd:
        return None
    conv = conv_of(kernel)
    if conv is None or min(conv.C, conv.O) < MIN_CHANNELS or conv.gain < MIN_GAIN:
        return None
    asked = asked_gemm_kernel(kernel, machine, options)
    if asked is not None:
        mk, why = asked
    else:
        isa = options.microkernel_isa
        rates = measured(machine)
        fits = [m for m in allowed_gemm_kernels(machine, isa) if not m.window and m.name in rates]
        if not fits:
            return None
        useful = conv.tile_rows * conv.row_tiles

        def speed(m: registry.Microkernel) -> float:
            return rates[m.name] * conv.O / up(conv.O, m.mr) * useful / blocking(conv, m)[1]
        mk = max(fits, key=speed)
        why = (f"the fastest on its products by the calibration's rate ({rates[mk.name]:.1f} "
               f"GFLOP/s) times the share of them inside the tiles")
    rows, cols = blocking(conv, mk)
    blocks = -(-conv.tile_rows // rows)
    team = tuning.team(options, machine)
    flops = 2 * 16 * conv.O * conv.C * cols
    if team > 1 and flops < MIN_TEAM_FLOPS:
        return None
    par = "none"
    if team > 1 and flops >= MIN_PARALLEL_FLOPS:
        par = "blocks" if blocks >= 2 * team or blocks % team == 0 else "team"
    weights = "const" if constant_operand(conv.view, kernel, "a") else "call"
    if weights == "call" and conv.tile_rows * conv.row_tiles < MIN_CALL_TILES:
        return None
    return conv, marks.Winograd(conv.view.stmt.name, mk.name, rows, par, options.threads,
                                weights), why


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
