"""The host CPU as a machine description: its caches by role, cores, and instruction set.

The memory model is what tiling and the fusion oracle read: a tile's footprint (computed
with isl) must fit the capacity of the level it is meant to live in. L1 is the tile
level, L2 the fusion level, L3 (shared) holds blocks read by several passes.

The instruction set is part of the description too: `arch` is the gcc `-march` value the
code is built for and `features` the ISA extensions that enables (what gcc reports for
it), so the microkernel registry chooses only kernels that build and run with those
flags. The host default is `POLYC_CPU_ARCH` (inherited by the service's workers), else
`native`; a test or a cross-build asks for `cpu_machine("x86-64-v3")`.
"""
from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path

from ...codegen.build import Toolchain, cc
from ...machine import Machine, MemoryLevel
from ...microkernels import registry
from .prelude import PRELUDE

# reassociation lets gcc vectorise sums; infinities and NaN keep their IEEE meaning
# (no -ffinite-math-only: reductions start from -inf, causal masks hold -inf); -pipe:
# the assembly goes to `as` through a pipe, not a temporary file (the conv2d example's
# build, median of 30 in turns: 243 -> 237 ms); functions on 64-byte lines: a prebuilt
# microkernel is linked after the unit's own code, and with gcc's 16-byte alignment its
# loops sat wherever the unit's size put them (1x512x7x7 3x3 at 2 threads: two units
# differing in one loop's form, the same kernel 12-18% slower in one, in turns; level
# once aligned); no MMX: on SSE4 without AVX (x86-64-v2, nehalem) gcc 12 moves a 64-bit
# half of a vector through an MMX register (movq2dq, a float reduction) and never clears
# the x87 state MMX takes over, so the caller's next long double, a numpy longdouble or
# an int64 to float16 cast (through x87), was a NaN
CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
          "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-Wall",
          "-Werror=implicit-function-declaration", "-pipe", "-falign-functions=64", "-mno-mmx")
# for the generated units only: gcc peels every loop of a few iterations completely,
# and a write-back's 48 columns are three vectors of a heavy epilogue (linear+gelu: six
# copies of the sigmoid where two make the loop). Without that, gcc's time on the
# examples' units is 15-26% less (linear_gelu 0.20 -> 0.17 s of CPU, conv2d 0.21 ->
# 0.17, attention 0.27 -> 0.20, medians of 15 in turns) and the kernels run as fast
# (Sapphire Rapids, pairs of calls: linear+gelu, attention, convs, softmax, norms at
# 1 and 2 threads, 0.98-1.02x). The prebuilt parts keep gcc's peeling: the 8x8
# transpose that packs attention's k lost a third of its speed without it
UNIT_FLAGS = ("--param=max-completely-peel-times=1",)


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


_ARCH = re.compile(r"[a-z0-9][a-z0-9.\-]*")


def default_arch() -> str:
    """POLYC_CPU_ARCH (a gcc -march value), else the host's own instruction set."""
    return os.environ.get("POLYC_CPU_ARCH") or "native"


@functools.lru_cache(maxsize=None)
def arch_features(arch: str) -> frozenset[str]:
    """The x86 extensions gcc enables with -march=`arch` (its -m flags, without -m);
    for the host, from /proc/cpuinfo when gcc cannot be asked. An arch gcc does not know
    is a ValueError naming it."""
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"POLYC_CPU_ARCH / arch {arch!r} is not a gcc -march value")
    try:
        proc = subprocess.run([cc(), f"-march={arch}", "-Q", "--help=target"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    if proc is not None and proc.returncode != 0 and "march" in proc.stderr:
        raise ValueError(f"gcc does not know -march={arch}: {proc.stderr.strip()[:200]}")
    found = re.findall(r"^\s+-m([a-z0-9.\-]+)\s+\[enabled\]", proc.stdout if proc else "", re.M)
    if found:  # (-mno-sse4 is "enabled" where SSE4 is not: not an extension)
        return frozenset(f for f in found if not f.startswith("no-"))
    if arch == "native":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
        except OSError:
            pass
    return frozenset()


# What -march turns on that gcc emits only where its intrinsics ask (transactions,
# enclaves, protection keys, random numbers, state saving, cache-line flushes, AMX
# tiles, ...: polyc's C calls none) or that is no extension at all: a host without them
# (an AMD one, a VM hiding system features) runs the code. Without this, no AMD host
# ran -march=haswell (hle) or skylake-avx512 (hle, pku, sgx). Not avx512fp16 (gcc
# emits it for _Float16 arithmetic) nor prfchw (for a write prefetch)
_INTRINSICS_ONLY = frozenset({
    "hle", "rtm", "sgx", "pku", "pconfig", "wbnoinvd", "cldemote", "enqcmd", "movdiri",
    "movdir64b", "ptwrite", "serialize", "tsxldtrk", "uintr", "waitpkg", "hreset", "kl",
    "widekl", "amx-tile", "amx-int8", "amx-bf16", "amx-fp16", "amx-complex", "rdrnd",
    "rdseed", "rdpid", "fsgsbase", "fxsr", "xsave", "xsaveopt", "xsavec", "xsaves",
    "clflushopt", "clwb", "mwaitx", "lwp", "shstk", "accumulate-outgoing-args"})


@functools.lru_cache(maxsize=None)
def host_can_run(arch: str) -> bool:
    """Does this machine execute code built with -march=`arch`?"""
    return arch_features(arch) - _INTRINSICS_ONLY <= arch_features("native") | {"native"}


@functools.lru_cache(maxsize=None)
def cpu_machine(arch: str | None = None) -> Machine:
    """The host CPU, with code built for `arch` (default: `default_arch()`)."""
    arch = arch or default_arch()
    features = arch_features(arch)
    return Machine(
        "cpu",
        (MemoryLevel("L1", _cache_size(1, 32 << 10), roles=frozenset({"tile"})),
         MemoryLevel("L2", _cache_size(2, 512 << 10), roles=frozenset({"fusion"})),
         MemoryLevel("L3", _cache_size(3, 16 << 20), shared=True, roles=frozenset({"block"})),
         MemoryLevel("DRAM", 1 << 40, shared=True, roles=frozenset({"main"}))),
        vector_bytes=64 if "avx512f" in features else 32 if "avx" in features else 16,
        cores=os.cpu_count() or 1,
        arch=arch,
        features=features,
    )


def cpu_toolchain(machine: Machine) -> Toolchain:
    """gcc with the flags code for `machine` is built with: its -march and the rest.

    Without native float16 arithmetic: with it gcc turns float16 -> float32 -> op ->
    float16 into a float16 op, which -fassociative-math may then reassociate across the
    rounding each op owes (x * (y * z) computed as (x * y) * z in float16)."""
    fp16 = ("-mno-avx512fp16",) if "avx512fp16" in machine.features else ()
    # gcc's Intel tunings vectorise with 256 bits even where 512 are there: the loops it
    # vectorises itself (epilogues, softmax, norms) then run at half the width the
    # microkernels use (linear+gelu's gelu 30% cheaper, softmax 4096x4096 5% faster)
    wide = ("-mprefer-vector-width=512",) if "avx512f" in machine.features else ()
    return Toolchain(cc(), (*CFLAGS, f"-march={machine.arch}", *fp16, *wide),
                     parts=registry.prebuilt_parts(machine.features), prelude=PRELUDE,
                     unit_flags=UNIT_FLAGS)


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name (where a measurement of speed holds)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return model


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """The lines of /proc/cpuinfo that decide what -march=native generates."""
    wanted = ("vendor_id", "cpu family", "model", "model name", "flags")
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first_cpu = f.read().split("\n\n", 1)[0]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    found = {}
    for line in first_cpu.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in wanted:
            found[name] = " ".join(sorted(value.split())) if name == "flags" else value.strip()
    return "; ".join(f"{k}={found[k]}" for k in wanted if k in found)
