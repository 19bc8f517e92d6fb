"""The NPU target's options: the common ones, how many AI cores share the work, and
double buffering."""
from __future__ import annotations

from dataclasses import dataclass

from ...options import Options
from .machine import MAX_CORES


@dataclass(frozen=True)
class NpuOptions(Options):
    cores: int = 1  # AI cores the parallel loops are split over (they share GM bandwidth)
    double_buffer: bool = True  # copy the next tile's data while this one computes

    def checks(self) -> list[tuple[str, bool, str]]:
        return super().checks() + [
            ("cores", 1 <= self.cores <= MAX_CORES, f"must be 1 to {MAX_CORES}, got {self.cores}")]
