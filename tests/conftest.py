"""Session-wide test setup."""
from __future__ import annotations

import os
import shutil
import tempfile

# Built objects go to a fresh cache for each test session, never the user's: a test must
# build what it checks, and an object cached by an older polyc must not hide a bug. Set at
# import, before any test module (or its collection-time code) can build anything.
_CACHE_DIR = tempfile.mkdtemp(prefix="polyc-test-cache-")
os.environ["POLYC_CACHE_DIR"] = _CACHE_DIR


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
