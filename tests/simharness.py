"""The harness the simulators' runtime tests share: build a C harness against a runtime
header, and a run of it through the header's ctypes exports (`<prefix>_run_new_x`, ...),
launching one scenario at a time."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np

from polyc.codegen.build import cc


def build(tmp_path: Path, name: str, source: str, runtime: Path) -> ctypes.CDLL:
    c_file = tmp_path / f"{name}.c"
    c_file.write_text(source)
    so = tmp_path / f"{name}.so"
    done = subprocess.run([cc(), "-O2", "-pthread", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                           "-fPIC", "-shared", f"-I{runtime}", str(c_file), "-o", str(so)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(so))


def declare_run_api(lib: ctypes.CDLL, prefix: str) -> None:
    getattr(lib, f"{prefix}_run_new_x").restype = ctypes.c_void_p
    getattr(lib, f"{prefix}_run_free_x").argtypes = [ctypes.c_void_p]
    getattr(lib, f"{prefix}_run_error_x").restype = ctypes.c_char_p
    getattr(lib, f"{prefix}_run_error_x").argtypes = [ctypes.c_void_p]
    getattr(lib, f"{prefix}_run_stats_x").argtypes = [ctypes.c_void_p,
                                                      ctypes.POINTER(ctypes.c_ulonglong)]


def declare_scenarios(lib: ctypes.CDLL, harness: str, argtypes: list) -> None:
    """Every `SCENARIO(name)` of the harness's source takes `argtypes`."""
    for line in harness.splitlines():
        if line.startswith("SCENARIO("):
            getattr(lib, line.split("(")[1].split(")")[0]).argtypes = argtypes


class Run:
    """One run of a runtime (`prefix`, its record's field names `STATS`): launches
    scenarios (a subclass's `launch`) and reads the record."""
    prefix: str
    STATS: tuple[str, ...]

    def __init__(self, lib):
        self.lib = lib
        self.ptr = getattr(lib, f"{self.prefix}_run_new_x")()
        assert self.ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        getattr(self.lib, f"{self.prefix}_run_free_x")(self.ptr)

    @staticmethod
    def address(a: np.ndarray | None):
        return None if a is None else a.ctypes.data

    @property
    def stats(self) -> dict:
        out = (ctypes.c_ulonglong * len(self.STATS))()
        getattr(self.lib, f"{self.prefix}_run_stats_x")(self.ptr, out)
        return dict(zip(self.STATS, out))

    @property
    def error(self) -> str | None:
        e = getattr(self.lib, f"{self.prefix}_run_error_x")(self.ptr)
        return None if e is None else e.decode()


class Record(NamedTuple):
    stats: dict
    error: str | None


def launch_once(run_class: type[Run], lib, scenario: str, **kw) -> Record:
    """The record of a run of one launch (the run is freed)."""
    with run_class(lib) as run:
        run.launch(scenario, **kw)
        return Record(run.stats, run.error)


def data(nbytes: int) -> np.ndarray:
    return np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
