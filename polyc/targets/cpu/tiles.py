"""Tile sizes of a contraction from the target's memory model (BLIS's analysis), with
overrides from the options and from `polyc tune`.

    kc: one B micro-panel (kc x nr) fills L1; every A micro-panel of the block reuses it
        while A and C stream through (deeper blocks halve the passes over C: measured
        faster on every benchmark shape than the textbook 3/4 of L1 for A and B together).
        Each K block past the first is a pass over C, read and written again: where C
        cannot stay in cache (over twice L2, `c_streams`) the passes cost more than L1
        saves, and a B
        micro-panel fills an eighth of L2 instead (on a 2 MiB L2, 1 thread, avx512:
        linear+gelu 1024x1024x4096 in one K block 24% faster than in 3, matmul alone
        9%; 1024^3, whose C stays in cache, 3% slower, so it keeps the L1 rule), or
        K whole where its micro-panel then fills at most half of L2 (Zen 5, 1 MiB L2,
        in pairs of calls, 1 and 2 threads: linear+gelu 1024x1024x4096 on 8x48 in one
        K block rather than two 0.85x and 0.88x the time, the matmul alone 0.99x and
        0.98x; with K 2048, 8x48 rather than in 4 blocks 0.88-0.93x and 0.86-0.87x,
        alone 0.96-0.97x, 14x32 rather than in 2 0.95x and 0.93x, alone 0.99x: a
        fused epilogue waits for the last pass over C). Twice L2, not four times as
        before: on Zen 5 C of 3-4 MiB lost to its passes too (1024^3 in one K block
        0.96-0.97x the time at 1 thread, 0.98-0.99x at 2; 768x1024x1024 with a gelu
        0.92-0.93x; 8x1024x14x14 to 2048 1x1 /2 0.965x and 0.88-0.91x), where on
        Sapphire Rapids 1024^3, C twice its L2, was 3% slower so (above). Where
        B is read in place (conv2d's window rows, `in_place`: no panel to keep in L1) a
        tile's rows fill a quarter of L2 (2 MiB L2: ResNet-50's 3x3 convs with K = 576
        whole 5% faster than in 3 blocks, K = 2304 in 2 blocks 14% faster than in 9; on
        Zen 3's 512 KiB, 1 thread, in turns either way round, K = 1152 whole rather
        than in 2 blocks: 1x128x28x28 to 128 3x3 +4-13%, batch 8 +13-34%; K = 2304 in 2
        blocks rather than 4, 8x256x28x28 /2: +4-9%). Where one thread computes the
        whole contraction and A is a constant packed once (conv2d's weights) that fits a
        quarter of L2 whole, K is one block: no pass over C again, and no more A to pack
        for the narrower B blocks that follow (below). Sapphire Rapids, 1 thread, in
        pairs of calls, two runs: 8x512x28x28 to 128 1x1 (K 512 against 2 blocks of 256)
        1.06x and 1.08x the speed, one image 1.04x and 1.05x; the same rule for matmuls,
        whose A is packed again for each B block, 0.98-1.02x (64x1024 @ 1024x2048,
        256x512 @ 512x4096, 128x512 @ 512x1024)
    mc: the packed A block (mc x kc) fills a quarter of L2 (the B micro-panel and the C
        tiles stream through it too: on a 2 MiB L2, 1024^3 with the 14x32 kernel ran at
        185 GFLOP/s with half, 199-203 with a quarter to an eighth)
    nc: the packed B block (kc x nc) fills an eighth of one core's share of L3: it must
        stay there while every A block and the whole C panel (M x nc) stream past it,
        and other tenants share the L3 too (2 MiB blocks measured 3-6% faster than 8 MiB
        on 1024x1024x4096 and 512x2048x8192 at 1 and 2 threads, and on linear+gelu at 1
        thread; level with it there at 2); at most B_BLOCK bytes, as a virtual machine
        is shown its socket's whole L3 (300 MiB on a 2-core Sapphire Rapids guest: 16
        MiB blocks, where 4 MiB ones made 1024x1024 @ 1024x4096 and linear+gelu 8-22%
        faster at 1 thread in three runs, in turns; 1-2% slower at 2, in two). Where A
        is one block (M <= mc) no other block reads B's, and where one thread computes
        the whole contraction (`alone`: no team shares the block) it fills an eighth of
        L2 instead: packed, it is read back from L2, not L3 (Sapphire Rapids, 1 thread,
        in pairs of calls: 8x256x56x56 to 64 1x1 1.16x the speed, 8x512x28x28 to 128
        1.05x, 64x1024 @ 1024x2048 1.10x, 256x512 @ 512x4096 1.03x, 127x255x383 and
        300x512 @ 512x1000 level; a quarter of L2 1-3% slower, a sixteenth up to 8%. A
        team sharing each block, at 2 threads, lost 5-18% to its smaller blocks)

Each is then balanced: the extent is cut into as many blocks as that size needs, and
the blocks made equal (rounded up to the kernel's tile), so no block is a sliver.
"""
from __future__ import annotations

import math

from ...machine import Machine
from ...microkernels.registry import Microkernel
from ...schedule_tree.marks import Tiles

B_BLOCK = 4 << 20  # bytes: the most a packed B block takes, whatever L3 says (nc above)


def balanced(extent: int, size: int, unit: int, balance: bool = True) -> int:
    size = max(unit, size - size % unit)
    if not balance:
        # the largest unit * 2^k within the extent, the same for every extent up to
        # twice that, and at least four units: one block for all the small extents a
        # symbolic range's probes take below that (13, 11 and 7 rows: 24, where 12, 6
        # and 6 made the probes disagree and N in [2, 15] could not compile once)
        return min(size, unit << max(2, (extent // unit).bit_length() - 1))
    blocks = math.ceil(extent / size)
    return min(size, unit * math.ceil(math.ceil(extent / blocks) / unit))


def c_streams(M: int, N: int, machine: Machine) -> bool:
    """Can an M x N float32 C not stay in cache between passes over it (over twice L2)?"""
    return M * N * 4 > 2 * machine.fusion_level.capacity


def streaming_kc(mk: Microkernel, machine: Machine) -> int:
    """The depth of B's micro-panel where C streams (`c_streams`): an eighth of L2."""
    return machine.fusion_level.capacity // 8 // (mk.nr * 4)


def a_block_rows(kc: int, machine: Machine) -> int:
    """The rows of a packed A block kc deep: a quarter of L2."""
    return machine.fusion_level.capacity // 4 // (kc * 4)


def model_tiles(M: int, N: int, K: int, mk: Microkernel, machine: Machine, *,
                in_place: bool = False, alone: bool = False, const_a: bool = False,
                balance: bool = True) -> Tiles:
    """The blocks of an M x N x K contraction; `alone`: one thread computes all of it;
    `const_a`: A's panels are packed once, for every block of B (a constant's,
    `plan.constant_operand`); `balance` False keeps the model's sizes whatever the
    extents (`CpuOptions.balance_tiles`)."""
    l1, l2 = machine.tile_level.capacity, machine.fusion_level.capacity
    l3 = machine.role("block").capacity
    elem = 4
    streams = not in_place and c_streams(M, N, machine)
    kc = (l2 // 4 // (mk.nr * elem) if in_place else streaming_kc(mk, machine) if streams
          else l1 // (mk.nr * elem))
    if streams and K * mk.nr * elem <= l2 // 2:
        kc = K  # one pass over C: see the module's docstring
    if alone and const_a and balance and not in_place and M * K * elem <= l2 // 4:
        kc = K  # A whole in a quarter of L2: see the module's docstring
    kc = balanced(K, kc, 4, balance)
    mc = balanced(M, a_block_rows(kc, machine), mk.mr, balance)
    block = min(B_BLOCK, l3 // 8 // max(1, machine.cores))
    if alone and balance and not in_place and M <= mc:  # unbalanced, sizes ignore M
        block = min(block, l2 // 8)
    nc = balanced(N, block // (kc * elem), mk.nr, balance)
    return Tiles(mc, nc, kc)


def apply_overrides(tiles: Tiles, overrides: dict[str, int], M: int, N: int, K: int,
                    mk: Microkernel) -> Tiles:
    """Tile sizes asked for (options or the tuning cache), made legal: mc a multiple of
    mr, nc of nr, kc at least 1."""
    mc = overrides.get("mc", tiles.mc)
    nc = overrides.get("nc", tiles.nc)
    kc = overrides.get("kc", tiles.kc)
    mc = max(mk.mr, mc - mc % mk.mr)
    nc = max(mk.nr, nc - nc % mk.nr)
    return Tiles(mc, nc, max(1, kc))
