"""The many-core target's options: the common ones, and how its cores and DMA are used."""
from __future__ import annotations

from dataclasses import dataclass

from ...options import Options
from .machine import CORES


@dataclass(frozen=True)
class ManycoreOptions(Options):
    cores: int = CORES  # compute cores the parallel loops are split over
    double_buffer: bool = True  # fetch a tile's inputs while the tile before computes

    def checks(self) -> list[tuple[str, bool, str]]:
        return super().checks() + [
            ("cores", 1 <= self.cores <= CORES, f"must be 1 to {CORES}, got {self.cores}")]
