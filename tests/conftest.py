"""Session-wide test setup.

- Built objects, the tuning file and the kernel calibration go to a fresh cache for each
  test run (shared by its xdist workers), never the user's: a test must build what it
  checks, and an object cached by an older polyc must not hide a bug.
- The instruction set is the target's: `POLYC_CPU_ARCH` (a gcc -march value) is read
  by `polyc.targets.cpu.cpu_machine`, so `POLYC_CPU_ARCH=x86-64-v3 pytest` runs the suite as
  on a host without AVX-512 (tests about one ISA skip, with the reason, what it lacks).
- Hypothesis does not shrink a failing example (the `polyc` profile): the examples are
  small graphs already, and shrinking one through gcc builds took minutes.
  `HYPOTHESIS_PROFILE=shrink pytest ...` shrinks, to study a failure.
- `-m "not slow"` leaves out the tests marked slow (a few seconds or more each); CI
  runs them all.
- A cache of a test's own (for a tuning file of its own, a server, a replica) comes
  from `seeded_cache`: the run's prebuilt parts, precompiled prelude and calibration, which
  every compile of the run shares, are copied in (a fresh cache made them again: 5-10 s
  of gcc and timing per server); its built kernels and tunings stay its own. The first
  test to ask makes them, by compiling the examples in the run's cache.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
from hypothesis import Phase, settings

# Set at import, before any test module (or its collection-time code) can build anything.
# xdist's workers inherit the cache of the process that started them (one cache for the
# run: the prebuilt parts, the precompiled prelude and the calibration made once, not
# once per worker); that process removes it at the end.
_INHERITED = os.environ.get("POLYC_TEST_RUN_CACHE")
_CACHE_DIR = _INHERITED or tempfile.mkdtemp(prefix="polyc-test-cache-")
os.environ["POLYC_TEST_RUN_CACHE"] = os.environ["POLYC_CACHE_DIR"] = _CACHE_DIR

settings.register_profile("polyc", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.register_profile("shrink", phases=list(Phase))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "polyc"))


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _warm(run: Path) -> None:
    """The examples compiled in the run's cache, once in the run (the other processes
    that ask meanwhile wait on the lock): the parts every compile shares are then there."""
    from polyc import load_graph
    from polyc.compiler import compile
    with open(run / "warm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (run / "warm").exists():
            return
        with mock.patch.dict(os.environ, {"POLYC_CACHE_DIR": str(run)}):
            for example in sorted(EXAMPLES.glob("*.json")):
                compile(load_graph(example))
        (run / "warm").touch()


@pytest.fixture(scope="session")
def seeded_cache() -> Callable[[Path], str]:
    """`path` made a cache directory holding the run's shared parts (every file there is
    complete: each is written aside and renamed in)."""
    def seed(path: Path) -> str:
        run = Path(_CACHE_DIR)
        _warm(run)
        (path / "parts").mkdir(parents=True, exist_ok=True)
        for f in [run / "calibration.json", *(run / "parts").glob("*")]:
            if f.is_file():
                shutil.copy2(f, path / f.relative_to(run))
        return str(path)
    return seed


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes several seconds; -m 'not slow' skips it")


def pytest_sessionfinish(session, exitstatus):
    if not _INHERITED:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
