"""The backend registry: each target name to the backend that compiles for it.

A target is a machine description plus what it adds to the neutral pipeline
(`backend.Backend`). compiler.py, the CLI and the service find targets here, and only
here: nothing else names one.
"""
from __future__ import annotations

from ..errors import GraphError
from .backend import Backend
from .cpu import CpuBackend
from .manycore import ManycoreBackend
from .npu import NpuBackend

_BACKENDS: dict[str, Backend] = {b.name: b for b in (CpuBackend(), ManycoreBackend(), NpuBackend())}


def names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def backend(name: str) -> Backend:
    found = _BACKENDS.get(name)
    if found is None:
        raise GraphError(f"unknown target {name!r} (available: {', '.join(_BACKENDS)})")
    return found


def tunable() -> tuple[str, ...]:
    """The targets `polyc tune` measures (`polyc/tune/`)."""
    return tuple(name for name, b in _BACKENDS.items() if b.tunable)


def option_types() -> tuple[type, ...]:
    """Every target's options type (the service's schema is their union)."""
    return tuple(dict.fromkeys(b.options_type for b in _BACKENDS.values()))


__all__ = ["Backend", "backend", "names", "option_types", "tunable"]
