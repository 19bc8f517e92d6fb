"""How a simulated chip's C is built: for the host by gcc, against the chip's runtime
header and the simulator base it includes (`runtime/polyc_sim.h`), both in the key."""
from __future__ import annotations

from pathlib import Path

from ...codegen.build import Toolchain, cc

SIM_HEADER = Path(__file__).resolve().parent / "runtime" / "polyc_sim.h"
CFLAGS = ("-O2", "-fPIC", "-shared", "-pthread", "-std=gnu11", "-fno-math-errno",
          "-Wall", "-Werror=implicit-function-declaration", "-Wno-unused-variable",
          "-Wno-unused-but-set-variable")


def simulator_toolchain(header: Path) -> Toolchain:
    return Toolchain(cc(), (*CFLAGS, f"-I{header.parent}"), (header, SIM_HEADER))
