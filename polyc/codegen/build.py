"""Building generated C into a shared object with gcc, cached on disk by content.

The cache key covers the source, the compiler command and flags and the compiler's
version, so a toolchain upgrade never serves a stale object. Objects are written to a
temporary name and renamed into place, so concurrent builds of the same source are safe.
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError
from ..target import CC, Target, cpu_target

# reassociation lets gcc vectorise sums; infinities and NaN keep their IEEE meaning
# (no -ffinite-math-only: reductions start from -inf, causal masks hold -inf)
BASE_CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
               "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
               "-fno-signed-zeros", "-Wall", "-Werror=implicit-function-declaration")
BUILD_TIMEOUT_S = 120


def cflags(target: Target | None = None) -> tuple[str, ...]:
    """The flags generated code for `target` is built with: its -march and the rest."""
    return (*BASE_CFLAGS, f"-march={(target or cpu_target()).arch}")


def cache_dir() -> Path:
    """POLYC_CACHE_DIR, else the user's cache directory."""
    root = os.environ.get("POLYC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyc")
    return Path(root)


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    try:
        out = subprocess.run([CC, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise BuildError(f"cannot run the C compiler {CC!r}: {e.strerror}") from None
    return out.stdout.splitlines()[0] if out.stdout else CC


def build_key(source: str, target: Target | None = None) -> str:
    h = hashlib.sha256()
    for part in (source, CC, " ".join(cflags(target)), compiler_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def gcc_command(c_file: Path | str, so_file: Path | str, target: Target | None = None) -> list[str]:
    """The one command line that turns generated C into a shared object."""
    return [CC, *cflags(target), "-o", str(so_file), str(c_file), "-lm"]


def build_shared_object(source: str, target: Target | None = None) -> Path:
    """Compile `source` for `target` (or reuse the cached object); the .so path."""
    out_dir = cache_dir() / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{build_key(source, target)}.so"
    if so.exists():
        return so
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        c_file = Path(tmp) / "kernels.c"
        c_file.write_text(source)
        tmp_so = Path(tmp) / "kernels.so"
        try:
            proc = subprocess.run(gcc_command(c_file, tmp_so, target), capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{CC} took longer than {BUILD_TIMEOUT_S} s") from None
        except OSError as e:
            raise BuildError(f"cannot run the C compiler {CC!r}: {e.strerror}") from None
        if proc.returncode != 0:
            raise BuildError(f"{CC} failed on generated code (a polyc bug):\n{proc.stderr[-4000:]}")
        os.replace(tmp_so, so)
    return so
