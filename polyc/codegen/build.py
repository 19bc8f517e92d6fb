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
"""
from __future__ import annotations

import errno
import functools
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BuildError, BuildInterrupted
from ..paths import cache_dir

BUILD_TIMEOUT_S = 120


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

    def command(self, c_file: Path | str, out: Path | str) -> list[str]:
        """The one command line that turns generated C into a shared object."""
        return [self.cc, *self.flags, "-o", str(out), str(c_file), "-lm"]

    def headers_digest(self) -> str:
        """sha256 of the headers' contents: a simulator's runtime that changes changes
        every object built against it."""
        h = hashlib.sha256()
        for path in self.headers:
            h.update(path.read_bytes())
        return h.hexdigest()

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, self.cc, " ".join(self.flags), compiler_version(self.cc),
                     self.headers_digest()):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def compile_c(source: str, toolchain: Toolchain, out: Path, *, timeout_s: float = BUILD_TIMEOUT_S,
              new_session: bool = True, preexec_fn: Callable[[], None] | None = None) -> None:
    """Build `source` into `out` (see the module docstring for the failures)."""
    with tempfile.TemporaryDirectory(prefix="polyc-build-") as tmp:
        c_file = Path(tmp) / "kernels.c"
        c_file.write_text(source, encoding="utf-8")
        try:
            proc = subprocess.Popen(toolchain.command(c_file, out), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    encoding="utf-8", errors="replace",
                                    start_new_session=new_session, preexec_fn=preexec_fn)
        except OSError as e:
            raise BuildError(f"cannot run the C compiler {toolchain.cc!r}: {e.strerror}") from None
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise BuildError(f"{toolchain.cc} took longer than {timeout_s:g} s") from None
    if proc.returncode < 0:
        raise BuildInterrupted(f"{toolchain.cc} was killed by signal {-proc.returncode}")
    if "signal terminated program" in stderr:  # the driver outlived its cc1 or as
        raise BuildInterrupted(f"{toolchain.cc}: {stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        if "No space left on device" in stderr:
            raise OSError(errno.ENOSPC, f"{toolchain.cc}: no space left on device")
        if "memory exhausted" in stderr or "out of memory" in stderr.lower():
            raise MemoryError()
        raise BuildError(f"{toolchain.cc} failed on generated code (a polyc bug):\n"
                         f"{stderr[-4000:]}")


def build_shared_object(source: str, toolchain: Toolchain) -> Path:
    """Compile `source` (or reuse the cached object) and return the .so path."""
    out_dir = cache_dir() / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{toolchain.key(source)}.so"
    if so.exists():
        return so
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_so = Path(tmp) / "kernels.so"
        compile_c(source, toolchain, tmp_so)
        os.replace(tmp_so, so)
    return so
