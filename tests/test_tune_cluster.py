"""Tuning shared between machines: `polyc tune --cluster` on a Ray cluster the test
starts on this machine, `--cache redis://` keeping the results where replicas find
them, and a replica of `polyc serve` compiling with them.

The driver reaches the cluster by its GCS address (HOST:PORT), as a driver on a machine
of the cluster does: through Ray Client (`ray://`) the same code runs, but Ray Client
starts a server per driver that, on a loaded two-core CI machine, now and then fails to
start in Ray's own time limit.

The Ray and Redis tests need ray (the test extra installs it) and redis-server (`.ci/run`
installs it); without them they skip locally, but fail under CI (env CI set).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from polyc import GraphBuilder
from polyc.cli import main
from polyc.compiler import Options, compile
from polyc.graph.reference import random_inputs, run_reference
from polyc.schedule_tree import marks
from polyc.server.testing import RayHeadProcess, RedisProcess, ServerProcess, redis_server_path
from polyc.tune import shared

ROOT = Path(__file__).resolve().parent.parent


def _needed(what: str, missing: bool) -> None:
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not installed, and CI must run the tuning cluster tests")
        pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    _needed("redis-server", redis_server_path() is None)
    with RedisProcess(tmp_path_factory.mktemp("redis")) as redis:
        yield redis.url


@pytest.fixture
def table(redis_url):
    """The Redis URL, its shared tuning table emptied (the tests share one redis-server)."""
    import redis
    client = redis.Redis.from_url(redis_url)
    client.delete(shared.TABLE)
    client.close()
    return redis_url


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory, seeded_cache):
    try:
        import ray  # noqa: F401
    except ImportError:
        _needed("ray", True)
    # a short folder: Ray's sockets live under it, and a socket path has ~107 bytes
    dir = tempfile.mkdtemp(prefix="ray-")
    try:
        with RayHeadProcess(dir, cpus=2, pythonpath=str(ROOT), env={
                "POLYC_CACHE_DIR": seeded_cache(tmp_path_factory.mktemp("ray-workers"))}) as head:
            yield head
    finally:
        shutil.rmtree(dir, ignore_errors=True)


def matmul_graph(path: Path) -> Path:
    b = GraphBuilder("tune_cluster")
    y = b.relu(b.matmul(b.input("a", (96, 72)), b.input("w", (72, 80))))
    path.write_text(json.dumps(b.to_json([y])))
    return path


def gemm_choice(graph_path: Path) -> tuple[str, dict[str, int]]:
    """The microkernel and tiles a compile (one thread) picks for the graph's matmul."""
    compiled = compile(str(graph_path), options=Options(threads=1), build=False)
    [mark] = [line.split('"')[1] for k in compiled.kernels
              for line in k.to_json()["schedule_text"].splitlines() if 'mark: "gemm ' in line]
    plan = marks.parse(mark)
    return plan.kernel, {"kc": plan.tiles.kc, "mc": plan.tiles.mc, "nc": plan.tiles.nc}


def best_of(out: str) -> tuple[str, dict[str, int]]:
    """(microkernel, tiles) of a tune report's 'best: ' line."""
    words = out.split(": best: ")[1].split(" (")[0].split()
    return words[0], {k: int(v) for k, v in (w.split("=") for w in words[1:])}


def test_tune_on_a_ray_cluster_is_shared_and_used(ray_cluster, table, tmp_path,
                                                  monkeypatch, capsys, seeded_cache):
    graph = matmul_graph(tmp_path / "g.json")
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path / "driver"))
    untuned = gemm_choice(graph)
    assert main(["tune", str(graph), "--cluster", ray_cluster.address, "--cache", table,
                 "--budget", "4", "--repeat", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "measured on 1 node(s) of the Ray cluster" in out
    assert sum(line.endswith(" ms") and ": best: " not in line
               for line in out.splitlines()) == 4
    assert f"shared through {table}" in out
    best = best_of(out)
    assert gemm_choice(graph) == best  # the driver keeps it, as local tuning does

    # a replica on another machine of the kind: an empty tuning file, then a pull
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path / "replica"))
    assert gemm_choice(graph) == untuned
    assert shared.pull(table) == 1
    assert gemm_choice(graph) == best
    compiled = compile(str(graph), options=Options(threads=1))
    inputs = random_inputs(compiled.graph, seed=3)
    got, want = compiled(**inputs), run_reference(compiled.graph, inputs)
    for name in compiled.graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


def test_nodes_of_another_cpu_kind_are_left_out(ray_cluster, tmp_path, monkeypatch, capsys):
    from polyc.tune import cluster
    graph = matmul_graph(tmp_path / "g.json")
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "driver"))
    # this driver claims another CPU: the node (the real one) no longer matches it
    monkeypatch.setattr(cluster, "machine_id", lambda machine: "Another CPU|64|znver9|0")
    assert main(["tune", str(graph), "--cluster", ray_cluster.address, "--budget", "2",
                 "--repeat", "1", "--threads", "1"]) == 3
    err = capsys.readouterr().err
    assert "no node of the Ray cluster" in err
    assert "left out, its CPU kind" in err and "is not this machine's (Another CPU" in err
    assert not (tmp_path / "driver" / "tuning.json").exists()


def test_an_unreachable_cluster_is_one_line(tmp_path, capsys):
    pytest.importorskip("ray")
    from polyc.server.testing import free_port
    graph = matmul_graph(tmp_path / "g.json")
    for address in (f"ray://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"):
        assert main(["tune", str(graph), "--cluster", address, "--budget", "1",
                     "--repeat", "1"]) == 3
        err = capsys.readouterr().err
        assert err.startswith(f"polyc: cannot reach the Ray cluster at {address}: ") and \
            err.count("\n") == 1, err


def test_a_replica_pulls_the_shared_tunings(table, tmp_path, monkeypatch, capsys,
                                            seeded_cache):
    """`polyc tune --cache` here, measured locally; a `polyc serve` replica on the same
    Redis, with a tuning file of its own, compiles with the shared choice."""
    graph = matmul_graph(tmp_path / "g.json")
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path / "tuner"))
    assert main(["tune", str(graph), "--cache", table, "--budget", "2", "--repeat", "1",
                 "--threads", "1"]) == 0
    best = best_of(capsys.readouterr().out)
    body = {"graph": json.loads(graph.read_text()), "options": {"threads": 1}}
    with ServerProcess(table, log_dir=tmp_path,
                       env={"POLYC_CACHE_DIR": seeded_cache(tmp_path / "replica")}) as replica:
        answer = httpx.post(replica.url + "/v1/compile", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    report = [line for k in answer.json()["kernels"] for line in k["fusion_report"]]
    assert any(f"on {best[0]}: measured fastest by polyc tune" in line for line in report), report
    assert json.loads((tmp_path / "replica" / "tuning.json").read_text()) == \
        json.loads((tmp_path / "tuner" / "tuning.json").read_text())


def test_malformed_shared_tunings_are_ignored(table, tmp_path, monkeypatch):
    import redis
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    good = {"kernel": "k", "microkernel": "sgemm_avx2_6x16", "seconds": 1e-3,
            "tiles": {"kc": 64, "mc": 48, "nc": 64}, "machine": "m", "threads": 1}
    client = redis.Redis.from_url(table)
    client.hset(shared.TABLE, mapping={
        "good": json.dumps(good),
        "not-json": b"\xff{",
        "unknown-kernel": json.dumps({**good, "microkernel": "system('rm -rf /')"}),
        "huge-tiles": json.dumps({**good, "tiles": {"kc": 1 << 30, "mc": 48, "nc": 64}}),
        "float-tiles": json.dumps({**good, "tiles": {"kc": 64.5, "mc": 48, "nc": 64}}),
        "no-tiles": json.dumps({k: v for k, v in good.items() if k != "tiles"}),
        # a 3x3 convolution's: a Winograd tile's products' kernel, or the direct one's
        "winograd": json.dumps({**good, "tiles": {}, "winograd": 4}),
        "direct": json.dumps({**good, "winograd": 0}),
        "winograd-3x3": json.dumps({**good, "tiles": {}, "winograd": 3}),
        "winograd-tiles": json.dumps({**good, "winograd": 4}),
        "winograd-text": json.dumps({**good, "tiles": {}, "winograd": "4"}),
        "direct-no-tiles": json.dumps({**good, "tiles": {}, "winograd": 0}),
    })
    client.close()
    assert shared.pull(table) == 3
    assert json.loads((tmp_path / "tuning.json").read_text()) == {
        "good": good, "winograd": {**good, "tiles": {}, "winograd": 4},
        "direct": {**good, "winograd": 0}}
    assert shared.pull(table) == 0  # nothing new: the file is left alone


def test_cache_that_cannot_share_is_refused(tmp_path, capsys):
    graph = matmul_graph(tmp_path / "g.json")
    assert main(["tune", str(graph), "--cache", f"sqlite:///{tmp_path}/c.db"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"polyc: --cache sqlite:///{tmp_path}/c.db: tunings are shared "
                          "through a Redis cache"), err


def test_without_ray_cluster_tuning_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    graph = matmul_graph(tmp_path / "g.json")
    assert main(["tune", str(graph), "--cluster", "auto"]) == 3
    assert capsys.readouterr().err == ("polyc: polyc tune --cluster needs Ray on this machine: "
                                       "pip install 'polyc[cluster]'\n")


def test_redis_down_keeps_the_tuning_here_and_says_so(tmp_path, monkeypatch, capsys,
                                                      seeded_cache):
    from polyc.server.testing import free_port
    monkeypatch.setenv("POLYC_CACHE_DIR", seeded_cache(tmp_path))
    graph = matmul_graph(tmp_path / "g.json")
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert main(["tune", str(graph), "--cache", url, "--budget", "1", "--repeat", "1",
                 "--threads", "1"]) == 3
    err = capsys.readouterr().err
    assert f"polyc: kept in this machine's tuning file, but not shared: the cache {url} " \
           "cannot be written" in err
    assert len(json.loads((tmp_path / "tuning.json").read_text())) == 1


def test_a_candidate_is_timed_once_its_calls_run_at_speed(monkeypatch):
    """After a candidate's gcc run the team's cores sleep and take calls to wake: a
    kernel whose first calls are slow is timed at its steady speed, not theirs. (On a
    clock of its own: a loaded host once slept one 4 ms call past the whole warm-up.)"""
    from polyc import tune

    calls, now = [], [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])  # tune's and warm_up's

    def kernel():
        calls.append(None)
        now[0] += 0.004 if len(calls) <= 6 else 0.001

    program = SimpleNamespace(bind=lambda inputs, out: (out, [kernel]))
    compiled = SimpleNamespace(program=program, graph=SimpleNamespace(outputs=(), types={}))
    seconds = tune._time_kernel(compiled, 0, {}, repeat=5)
    assert seconds < 0.002 and len(calls) > 6 + 5
