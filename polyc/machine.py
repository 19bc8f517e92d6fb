"""Machine descriptions: what the passes may know about a target, as data.

A machine is its memory levels, fastest first, each with a capacity, an alignment, who
addresses it and the roles the passes give it; its vector width and cores; and, for a
CPU, the instruction set the code is built for. Passes ask for a level by role, never by
position:

    tile    where one tile's operands should stay (cpu: L1; many-core: the LDM)
    fusion  where one iteration of a fused band should stay (cpu: L2)
    block   what a core may fill with a block read by several passes (cpu: its share
            of the last cache level)
    main    main memory

A level that is `managed` is a scratchpad: data reaches it only by copies the generated
code makes (DMA on the many-core chip, the NPU's buffer copies); a cache is not.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

ROLES = ("tile", "fusion", "block", "main")


@dataclass(frozen=True)
class MemoryLevel:
    name: str
    capacity: int  # bytes
    alignment: int = 64  # bytes, of every buffer at this level
    shared: bool = False  # addressed by every core (else private to one core)
    managed: bool = False  # a scratchpad the code copies into and out of
    roles: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Machine:
    name: str
    levels: tuple[MemoryLevel, ...]  # fastest first; the last is main memory
    vector_bytes: int
    cores: int
    arch: str = ""  # the compiler's -march, where there is one
    features: frozenset[str] = field(default_factory=frozenset)  # ISA extensions it enables

    def level(self, name: str) -> MemoryLevel:
        return next(m for m in self.levels if m.name == name)

    def with_capacity(self, name: str, capacity: int) -> Machine:
        """This machine with level `name` holding `capacity` bytes: the cache a plan is
        about pinned, whatever the host's (a test's, a cross-build's)."""
        return replace(self, levels=tuple(replace(m, capacity=capacity) if m.name == name
                                          else m for m in self.levels))

    def role(self, role: str) -> MemoryLevel:
        """The level the passes use for `role` (see the module docstring)."""
        found = [m for m in self.levels if role in m.roles]
        if len(found) != 1:
            raise ValueError(f"machine {self.name!r} has {len(found)} levels of role {role!r}")
        return found[0]

    @property
    def tile_level(self) -> MemoryLevel:
        return self.role("tile")

    @property
    def fusion_level(self) -> MemoryLevel:
        return self.role("fusion")

    @property
    def block_bytes(self) -> int:
        """Bytes one core may fill with a block of data read by several passes."""
        level = self.role("block")
        return level.capacity // max(1, self.cores) if level.shared else level.capacity
