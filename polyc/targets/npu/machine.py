"""The NPU as a machine description: an Ascend-like AI core (DESIGN.md, "Targets").

    GM -> L1 (1 MiB) -> L0A / L0B (64 KiB each) -> cube -> L0C (256 KiB) -> UB (256 KiB)
                                                           UB <-> vector unit, UB -> GM

The unified buffer is the tile, fusion and block level: the vector unit computes there,
so a tile's data, one iteration of a fused band and a column block must fit it. L1 and
the L0 buffers serve the cube (`cube.py`). A chip may have several AI cores sharing the
GM bandwidth (`options.cores`); the default is one. The C is built for the host by gcc
against the simulator's runtime header.
"""
from __future__ import annotations

import functools
from pathlib import Path

from ...codegen.build import Toolchain
from ...machine import Machine, MemoryLevel
from ..scratchpad.toolchain import simulator_toolchain

RUNTIME = Path(__file__).resolve().parent / "runtime"
MAX_CORES = 32
FRACTAL = 16  # the cube's block edge
CUBE_FLOPS = {"float16": 8192, "float32": 2048}  # per cycle, by operand type
MMA_CYCLES = {"float16": 1, "float32": 4}  # one 16x16x16 block product
VECTOR_LANES = 64  # float32 lanes of a vector op
VECTOR_FLOPS = 128
GM_BYTES_PER_CYCLE, GM_LATENCY = 64, 300
L1_BYTES_PER_CYCLE = 256  # L1 -> L0A/L0B, and L0C -> UB
FEATURES = frozenset({"npu_cube"})


@functools.lru_cache(maxsize=None)
def npu_machine() -> Machine:
    return Machine(
        "npu",
        (MemoryLevel("L0A", 64 << 10, alignment=512, managed=True),
         MemoryLevel("L0B", 64 << 10, alignment=512, managed=True),
         MemoryLevel("L0C", 256 << 10, alignment=512, managed=True),
         MemoryLevel("UB", 256 << 10, alignment=32, managed=True,
                     roles=frozenset({"tile", "fusion", "block"})),
         MemoryLevel("L1", 1 << 20, alignment=32, managed=True),
         MemoryLevel("GM", 1 << 40, shared=True, roles=frozenset({"main"}))),
        vector_bytes=4 * VECTOR_LANES, cores=1, features=FEATURES)


def npu_toolchain(machine: Machine) -> Toolchain:
    return simulator_toolchain(RUNTIME / "polyc_npu.h")
