"""Targets as data: memory levels, vector width, cores, compiler flags.

The memory model is what tiling and the fusion oracle read: a tile's footprint (computed
with isl) must fit the capacity of the level it is meant to live in.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemoryLevel:
    name: str
    capacity: int  # bytes
    alignment: int = 64
    shared: bool = False  # addressed by every core (else private to one core)


@dataclass(frozen=True)
class Target:
    name: str
    levels: tuple[MemoryLevel, ...]  # fastest first; the last is main memory
    vector_bytes: int
    cores: int

    def level(self, name: str) -> MemoryLevel:
        return next(m for m in self.levels if m.name == name)

    @property
    def fusion_level(self) -> MemoryLevel:
        """Where the working set of one iteration of a fused band should stay: the
        largest private cache."""
        private = [m for m in self.levels if not m.shared]
        return private[-1]

    @property
    def last_cache(self) -> MemoryLevel:
        """The level in front of main memory."""
        return self.levels[-2]

    @property
    def tile_level(self) -> MemoryLevel:
        """Where a tile's operands should stay: the fastest level."""
        return self.levels[0]


def _cache_size(level: int, default: int) -> int:
    """The host's data cache of `level` from sysfs, else `default`."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            if (int((index / "level").read_text()) == level
                    and (index / "type").read_text().strip() in ("Data", "Unified")):
                text = (index / "size").read_text().strip()
                unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
                return int(text.rstrip("KM")) * unit
    except (OSError, ValueError):
        pass
    return default


@functools.lru_cache(maxsize=None)
def cpu_target() -> Target:
    """The host CPU."""
    return Target(
        "cpu",
        (MemoryLevel("L1", _cache_size(1, 32 << 10)),
         MemoryLevel("L2", _cache_size(2, 512 << 10)),
         MemoryLevel("L3", _cache_size(3, 16 << 20), shared=True),
         MemoryLevel("DRAM", 1 << 40, shared=True)),
        vector_bytes=32,
        cores=os.cpu_count() or 1,
    )


def get_target(name: str) -> Target:
    if name == "cpu":
        return cpu_target()
    raise KeyError(name)
