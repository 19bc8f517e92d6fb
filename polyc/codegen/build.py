"""Building generated C into a shared object: the one gcc path every caller takes.

A `Toolchain` is the compiler command and the flags a target builds with (each backend
makes its own: -march for the cpu, the simulator's include path for the chips).
`compile_c` runs it once, with a time limit, and sorts its failures: a full disk
(OSError ENOSPC), exhausted memory (MemoryError), a compiler killed by a signal
(BuildInterrupted: not the code's fault), anything else a BuildError (generated C that
does not compile is a polyc bug). `build_shared_object` caches objects on disk by
content: the key covers the source, the command, the flags, the compiler's version and
the headers it includes (a simulator's runtime), so a toolchain upgrade never serves a
stale object; objects are written to a temporary
name and renamed into place, so concurrent builds of the same source are safe. The
service's workers call `compile_c` with their own process-group and resource limits.

A toolchain may carry prebuilt parts: C that many units need and that costs more to
compile than they do (the cpu's gemm microkernels). A unit names the parts it links on
lines `/* polyc link: NAME */`; each part is compiled once per toolchain into an object
cached in the cache directory's `parts/`, and the unit is built with POLYC_PREBUILT
defined and linked with it. A toolchain's `unit_flags` are the generated units' own: the
parts, hand-written C tuned under the common flags, are built without them.

A toolchain may also name its prelude: the C every unit it builds begins with (headers
and helpers; the x86 intrinsics headers alone are most of an unoptimised small unit's
gcc time). It is compiled once per toolchain into a precompiled header next to the
parts, and a unit that begins with it includes that header instead. Where the compiler
cannot use the precompiled header (another compiler, other flags) it reads the header's
text: the same C either way.
"""
from __future__ import annotations

import atexit
import errno
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BuildError, BuildInterrupted
from ..paths import cache_dir

BUILD_TIMEOUT_S = 120
LINK = re.compile(r"^/\* polyc link: (\S+) \*/$", re.MULTILINE)


def cc() -> str:
    """The C compiler: POLYC_CC, else gcc (read at each use, so a test may change it)."""
    return os.environ.get("POLYC_CC", "gcc")


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise BuildError(f"cannot run the C compiler {cc!r}: {e.strerror}") from None
    return out.stdout.splitlines()[0] if out.stdout else cc


@dataclass(frozen=True)
class Toolchain:
    cc: str
    flags: tuple[str, ...]  # everything but the input and output names
    headers: tuple[Path, ...] = ()  # what the source includes besides system headers
    parts: tuple[tuple[str, str], ...] = ()  # prebuilt parts a unit may link: (name, C)
    prelude: str = ""  # C every unit begins with, precompiled once (module docstring)
    unit_flags: tuple[str, ...] = ()  # the generated units' (and prelude's) own, not the parts'

    def command(self, c_file: Path | str, out: Path | str, objects: tuple[Path, ...] = (),
                include: Path | None = None) -> list[str]:
        """The one command line that turns generated C into a shared object."""
        prebuilt = ("-DPOLYC_PREBUILT",) if objects else ()
        quote = ("-iquote", str(include)) if include else ()
        return [self.cc, *self.flags, *self.unit_flags, *prebuilt, *quote, "-o", str(out),
                str(c_file), *map(str, objects), "-lm"]

    def part_command(self, c_file: Path | str, out: Path | str) -> list[str]:
        # a part pastes support code only some of its users call
        return [self.cc, *self._object_flags(), "-Wno-unused-function", "-c", "-o", str(out),
                str(c_file)]

    def header_command(self, header: Path | str, out: Path | str) -> list[str]:
        """The command that precompiles the prelude: the units' own flags, as gcc wants."""
        return [self.cc, *self._object_flags(), *self.unit_flags, "-x", "c-header", "-o",
                str(out), str(header)]

    @property
    def unit_build_flags(self) -> tuple[str, ...]:
        """Every flag a unit is built with: what its object depends on."""
        return (*self.flags, *self.unit_flags)

    def _object_flags(self) -> list[str]:
        return [f for f in self.flags if f != "-shared"]

    def linked(self, source: str) -> list[tuple[str, str]]:
        """The (name, C) of the parts `source` links."""
        parts = dict(self.parts)
        names = dict.fromkeys(LINK.findall(source))
        unknown = [n for n in names if n not in parts]
        if unknown:
            raise BuildError(f"the generated unit links {unknown}, which this toolchain "
                             f"has no prebuilt part for (a polyc bug)")
        return [(n, parts[n]) for n in names]

    def headers_digest(self) -> str:
        """sha256 of the headers' contents: a simulator's runtime that changes changes
        every object built against it."""
        h = hashlib.sha256()
        for path in self.headers:
            h.update(path.read_bytes())
        return h.hexdigest()

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, self.cc, " ".join(self.unit_build_flags), compiler_version(self.cc),
                     self.headers_digest(), *(text for _, text in self.linked(source))):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def _run(command: list[str], cc: str, *, timeout_s: float, new_session: bool,
         preexec_fn: Callable[[], None] | None, during: Callable[[], None] | None = None
         ) -> None:
    """Run one compiler command (see the module docstring for the failures), and
    `during` it the caller's own work, if any: an exception of that work kills the
    compiler and is raised."""
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, encoding="utf-8", errors="replace",
                                start_new_session=new_session, preexec_fn=preexec_fn)
    except OSError as e:
        raise BuildError(f"cannot run the C compiler {cc!r}: {e.strerror}") from None
    start = time.monotonic()
    if during is not None:
        try:
            during()
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    try:
        _, stderr = proc.communicate(timeout=max(0.0, timeout_s - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise BuildError(f"{cc} took longer than {timeout_s:g} s") from None
    if proc.returncode < 0:
        raise BuildInterrupted(f"{cc} was killed by signal {-proc.returncode}")
    if "signal terminated program" in stderr:  # the driver outlived its cc1 or as
        raise BuildInterrupted(f"{cc}: {stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        if "No space left on device" in stderr:
            raise OSError(errno.ENOSPC, f"{cc}: no space left on device")
        if "memory exhausted" in stderr or "out of memory" in stderr.lower():
            raise MemoryError()
        raise BuildError(f"{cc} failed on generated code (a polyc bug):\n{stderr[-4000:]}")


def compile_c(source: str, toolchain: Toolchain, out: Path, *, timeout_s: float = BUILD_TIMEOUT_S,
              new_session: bool = True, preexec_fn: Callable[[], None] | None = None,
              during: Callable[[], None] | None = None) -> None:
    """Build `source` into `out` (see the module docstring for the failures), doing
    `during` while the unit's compiler runs (`_run`)."""
    run = functools.partial(_run, cc=toolchain.cc, timeout_s=timeout_s,
                            new_session=new_session, preexec_fn=preexec_fn)
    objects = tuple(_part_object(text, toolchain, run) for _, text in toolchain.linked(source))
    header = None
    if toolchain.prelude and source.startswith(toolchain.prelude):
        header = _precompiled_prelude(toolchain, run)
        # the #line keeps gcc's messages on the lines of `source`
        first = toolchain.prelude.count("\n") + 1
        source = f'#include "{header.name}"\n#line {first}\n' + source[len(toolchain.prelude):]
    with tempfile.TemporaryDirectory(prefix="polyc-build-") as tmp:
        c_file = Path(tmp) / "kernels.c"
        c_file.write_text(source, encoding="utf-8")
        run(toolchain.command(c_file, out, objects, header.parent if header else None),
            during=during)


def _parts_dir() -> Path:
    """Where prebuilt parts are kept: the cache's `parts/`, or where the cache cannot be
    written (a read-only cache), the process's own directory."""
    obj_dir = cache_dir() / "parts"
    try:
        obj_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(obj_dir, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable", str(obj_dir))
    except OSError:
        obj_dir = _private_dir()
    return obj_dir


def _precompiled_prelude(toolchain: Toolchain, run: Callable[[list[str]], None]) -> Path:
    """The prelude as a header, with its precompiled form (`.h.gch`, which gcc prefers
    to the text) beside it, both built on first use. The header is in place before its
    precompiled form: a unit built in between reads the text."""
    obj_dir = _parts_dir()
    header = obj_dir / f"{toolchain.key(toolchain.prelude)}.h"
    gch = header.with_name(header.name + ".gch")
    if not gch.exists():
        with tempfile.TemporaryDirectory(dir=obj_dir) as tmp:
            tmp_header = Path(tmp) / header.name
            tmp_header.write_text(toolchain.prelude, encoding="utf-8")
            run(toolchain.header_command(tmp_header, Path(tmp) / gch.name))
            os.replace(tmp_header, header)
            os.replace(Path(tmp) / gch.name, gch)
    return header


def _part_object(text: str, toolchain: Toolchain, run: Callable[[list[str]], None]) -> Path:
    """The object of one prebuilt part, compiled on first use."""
    obj_dir = _parts_dir()
    obj = obj_dir / f"{toolchain.key(text)}.o"
    if not obj.exists():
        with tempfile.TemporaryDirectory(dir=obj_dir) as tmp:
            c_file, tmp_obj = Path(tmp) / "part.c", Path(tmp) / "part.o"
            c_file.write_text(text, encoding="utf-8")
            run(toolchain.part_command(c_file, tmp_obj))
            os.replace(tmp_obj, obj)
    return obj


@functools.lru_cache(maxsize=None)
def _private_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="polyc-parts-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def build_shared_object(source: str, toolchain: Toolchain,
                        during: Callable[[], None] | None = None) -> Path:
    """Compile `source` (or reuse the cached object) and return the .so path; `during`
    is done while gcc runs, or first if there is no need to run it."""
    out_dir = cache_dir() / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{toolchain.key(source)}.so"
    if so.exists():
        if during is not None:
            during()
        return so
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_so = Path(tmp) / "kernels.so"
        compile_c(source, toolchain, tmp_so, during=during)
        os.replace(tmp_so, so)
    return so
