"""A SQLite cache that cannot be written, or whose file is deleted while the service
runs: reported once at start, on /healthz?detail=1 and in /metrics, and results are
still kept in memory (a repeat is not compiled again)."""
from __future__ import annotations

import logging
import os
import sqlite3
import subprocess

import pytest
from fastapi.testclient import TestClient

from polyc.server import Settings, create_app


def graph(name: str) -> dict:
    return {"name": name, "inputs": [{"name": "x", "shape": [4, 8]}],
            "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


def gauge(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def make_read_only(path) -> None:
    """The file cannot be written, by root too where the file system allows it."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"running as root, and chattr +i is refused here: {done.stderr!r}")


def undo_read_only(path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    else:
        path.parent.chmod(0o755)
        path.chmod(0o644)


def served_from_memory(url: str, caplog) -> dict:
    """Start on `url`, compile twice; the health the service reports."""
    with caplog.at_level(logging.WARNING, logger="polyc.server"):
        app = create_app(Settings(cache_url=url, workers=1))
        with TestClient(app) as c:
            warnings = [r.getMessage() for r in caplog.records if "cannot be written" in
                        r.getMessage()]
            assert len(warnings) == 1, warnings
            first = c.post("/v1/compile", json={"graph": graph("ro")})
            assert first.status_code == 200 and first.json()["cache_hit"] is False
            again = c.post("/v1/compile", json={"graph": graph("ro")}).json()
            assert again["cache_hit"] is True  # kept in memory
            assert c.get(f"/v1/kernels/{again['key']}/source").status_code == 200
            metrics = c.get("/metrics").text
            assert gauge(metrics, "polyc_cache_writable") == 0
            assert gauge(metrics, "polyc_cache_ok") == 0
            assert c.get("/healthz").json()["status"] == "ok"  # liveness is unchanged
            return c.get("/healthz", params={"detail": "1"}).json()


def test_read_only_cache_file_is_reported_and_results_kept_in_memory(tmp_path, caplog):
    path = tmp_path / "cache" / "c.sqlite3"
    path.parent.mkdir()
    with sqlite3.connect(path) as db:  # an existing cache, as a previous run left it
        db.execute("CREATE TABLE bundles (key TEXT PRIMARY KEY, bundle BLOB NOT NULL, "
                   "created REAL NOT NULL)")
    make_read_only(path)
    try:
        health = served_from_memory(f"sqlite:///{path}", caplog)
    finally:
        undo_read_only(path)
    assert health["status"] == "degraded"
    assert health["cache"]["writable"] is False and health["cache"]["memory_entries"] == 1
    assert "its entries are read" in health["cache"]["problem"]


def test_cache_in_a_folder_that_cannot_be_made_is_reported(tmp_path, caplog):
    (tmp_path / "not-a-folder").write_text("")
    health = served_from_memory(f"sqlite:///{tmp_path}/not-a-folder/c.sqlite3", caplog)
    assert "nothing can be read" in health["cache"]["problem"]


def test_cache_file_deleted_while_running_is_noticed_and_created_again(tmp_path, caplog):
    path = tmp_path / "c.sqlite3"
    app = create_app(Settings(cache_url=f"sqlite:///{path}", workers=1))
    with TestClient(app) as c:
        first = c.post("/v1/compile", json={"graph": graph("kept")}).json()
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        with caplog.at_level(logging.WARNING, logger="polyc.server"):
            health = c.get("/healthz", params={"detail": "1"}).json()
        assert health["status"] == "degraded" and "deleted" in health["cache"]["problem"]
        assert health["cache"]["writable"] is True
        assert sum("deleted or replaced" in r.getMessage() for r in caplog.records) == 1
        assert gauge(c.get("/metrics").text, "polyc_cache_ok") == 0
        second = c.post("/v1/compile", json={"graph": graph("after")}).json()
        assert c.post("/v1/compile", json={"graph": graph("kept")}).json()["cache_hit"]
    with sqlite3.connect(path) as db:  # the new file took the later result
        keys = {k for (k,) in db.execute("SELECT key FROM bundles")}
    assert keys == {second["key"]}, (keys, first["key"])
