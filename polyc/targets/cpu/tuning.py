"""The tuning cache: the fastest microkernel and tile sizes `polyc tune` measured, per
(kernel, target, machine, team size), in one JSON file under the cache directory.
Compiles look a kernel up here before falling back to the calibration's kernel and the
memory model's tiles. The team is part of the key because the best blocks differ: two
threads share one L3 and split each block. (`polyc/tune/` is the measuring driver.)

The kernel's key hashes its printed statements (shapes, accesses, epilogue), so any
graph that produces the same kernel reuses the measurement.
"""
from __future__ import annotations

import hashlib
import os

from ...kernel import Kernel
from ...machine import Machine
from ...paths import cache_dir, read_cache_json, write_cache_json
from .machine import cpu_model


def machine_id(machine: Machine) -> str:
    """The CPU model, core count, and the arch and features the code is built for: where
    a measurement holds."""
    model = cpu_model()
    feats = ",".join(sorted(f for f in machine.features if f.startswith(("avx", "fma", "sse"))))
    return (f"{model}|{os.cpu_count()}|{machine.arch}|"
            f"{hashlib.sha256(feats.encode()).hexdigest()[:12]}")


def team(options, machine: Machine) -> int:
    """The threads a compile with `options` plans its parallel loops for: `threads`,
    else one per core (what OpenMP starts when OMP_NUM_THREADS is unset); 1 when
    parallel loops are off."""
    if not getattr(options, "parallel", True):
        return 1
    return int(getattr(options, "threads", 0) or 0) or max(1, machine.cores)


def kernel_key(kernel: Kernel, machine: Machine, threads: int) -> str:
    text = "\n".join(str(s).split("  #")[0] for s in kernel.statements)
    where = f"{machine.name}\n{machine_id(machine)}\n{threads} threads"
    return hashlib.sha256(f"{text}\n{where}".encode()).hexdigest()


FILE = "tuning.json"


_digest: tuple[tuple, str] | None = None  # (the file's path and stat, its digest)


def fingerprint() -> str:
    """Changes whenever the tuning file's content does: compile keys that cover it are
    never served code built with older tiles, and replicas that hold the same tunings
    (pulled from a shared cache, `polyc/tune/shared.py`) agree on their keys. On the
    path of every cache hit: a stat, and a read only when the file changed."""
    global _digest
    path = cache_dir() / FILE
    try:
        st = path.stat()
        seen = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        if _digest is None or _digest[0] != seen:
            _digest = (seen, hashlib.sha256(path.read_bytes()).hexdigest()[:16])
    except OSError:
        return ""
    return _digest[1]


def lookup(kernel: Kernel, machine: Machine, threads: int) -> dict | None:
    """The stored measurement of `kernel`: {"microkernel": name, "tiles": {...},
    "seconds": ...}, or None."""
    return read_cache_json(FILE).get(kernel_key(kernel, machine, threads))


def store(kernel: Kernel, machine: Machine, threads: int, microkernel: str,
          tiles: dict[str, int], seconds: float, winograd: int | None = None
          ) -> tuple[str, dict]:
    """Record the fastest microkernel and tiles for `kernel` run by `threads` threads
    (written atomically: tuners may race); returns the entry's key and record. For a 3x3
    convolution, `winograd`: the tile of Winograd's that ran fastest, its products on
    `microkernel`, or 0 for the direct convolution (`winograd.plan_winograd`)."""
    key = kernel_key(kernel, machine, threads)
    record = {"kernel": kernel.name, "microkernel": microkernel, "tiles": tiles,
              "seconds": seconds, "machine": machine_id(machine), "threads": threads}
    if winograd is not None:
        record["winograd"] = winograd
    data = read_cache_json(FILE)
    data[key] = record
    write_cache_json(FILE, data)
    return key, record


def merge(entries: dict[str, dict]) -> int:
    """Take `entries` (key -> record, from a shared cache) into the tuning file, over
    what it holds for the same keys; returns how many entries changed."""
    data = read_cache_json(FILE)
    changed = {k: v for k, v in entries.items() if data.get(k) != v}
    if changed:
        write_cache_json(FILE, {**data, **changed})
    return len(changed)
