"""The many-core chip as a machine description: a Sunway-like core group of 64 compute
cores, each with a 256 KiB scratchpad (LDM) that data reaches only by DMA.

The LDM is the tile, fusion and block level alike: a tile's data, one iteration of a
fused band and a column block must all fit it (double buffers included, `tiles.py`).
The chip's C is built for the host by gcc against the simulator's runtime header.
"""
from __future__ import annotations

import functools
from pathlib import Path

from ...codegen.build import Toolchain
from ...machine import Machine, MemoryLevel
from ..scratchpad.toolchain import simulator_toolchain

RUNTIME = Path(__file__).resolve().parent / "runtime"
CORES = 64
LDM_BYTES = 256 << 10
PEAK_FLOPS = 16  # fp32 per cycle per compute core
LANES = 8  # fp32 lanes of a vector op
FEATURES = frozenset({"sw_cpe"})  # what its microkernels need (the registry's features)


@functools.lru_cache(maxsize=None)
def manycore_machine() -> Machine:
    return Machine(
        "manycore",
        (MemoryLevel("LDM", LDM_BYTES, alignment=64, managed=True,
                     roles=frozenset({"tile", "fusion", "block"})),
         MemoryLevel("main", 1 << 40, shared=True, roles=frozenset({"main"}))),
        vector_bytes=4 * LANES, cores=CORES, features=FEATURES)


def manycore_toolchain(machine: Machine) -> Toolchain:
    return simulator_toolchain(RUNTIME / "polyc_manycore.h")
