"""A real `polyc serve` process on loopback, driven over HTTP: compile, hit, fetch the
source and trees, metrics, and a restart after which the cached result is still served."""
from __future__ import annotations

import re

import httpx
import pytest

from polyc.server.testing import ServerProcess

GRAPH = {"name": "live", "inputs": [{"name": "x", "shape": [8, 16]},
                                    {"name": "g", "shape": [16]}],
         "nodes": [{"op": "rms_norm", "inputs": ["x", "g"], "outputs": ["y"]}],
         "outputs": ["y"]}


def counter(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics").text
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def cache(tmp_path_factory, seeded_cache):
    tmp = tmp_path_factory.mktemp("live")
    return tmp, f"sqlite:///{tmp}/cache.sqlite3", seeded_cache(tmp)


def test_compile_hit_fetch_metrics_and_restart(cache):
    tmp, url, cache_dir = cache
    env = {"POLYC_CACHE_DIR": cache_dir}
    with ServerProcess(url, workers=1, log_dir=tmp, env=env) as server:
        base = server.url
        assert httpx.get(base + "/healthz").json()["status"] == "ok"
        first = httpx.post(base + "/v1/compile", json={"graph": GRAPH}, timeout=60)
        assert first.status_code == 200, first.text
        a = first.json()
        assert a["cache_hit"] is False and len(a["kernels"]) >= 1
        assert counter(base, "polyc_cache_misses_total") == 1

        b = httpx.post(base + "/v1/compile", json={"graph": GRAPH}).json()
        assert b["cache_hit"] is True and b["key"] == a["key"]
        assert counter(base, "polyc_cache_hits_total") == 1
        assert counter(base, "polyc_compile_seconds_count") == 1

        src = httpx.get(f"{base}/v1/kernels/{a['key']}/source")
        assert src.headers["content-type"].startswith("text/x-c") and src.text == a["c_source"]
        trees = httpx.get(f"{base}/v1/kernels/{a['key']}/schedule").json()
        assert [k["name"] for k in trees["kernels"]] == [k["name"] for k in a["kernels"]]
        bad = httpx.post(base + "/v1/compile", content=b'{"graph": NaN}',
                         headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "NaN" in bad.json()["detail"]

    # a new process on the same cache: served from disk, nothing compiled
    with ServerProcess(url, workers=1, log_dir=tmp, env=env) as server:
        base = server.url
        assert counter(base, "polyc_cache_hits_total") == 0
        c = httpx.post(base + "/v1/compile", json={"graph": GRAPH}).json()
        assert c["cache_hit"] is True and c["c_source"] == a["c_source"]
        rec = httpx.get(f"{base}/v1/kernels/{a['key']}").json()
        assert rec["key"] == a["key"]
        assert counter(base, "polyc_cache_hits_total") == 1
        assert 'polyc_compiles_total{outcome="ok"}' not in httpx.get(base + "/metrics").text
        assert "Traceback" not in server.log


def test_bad_cache_url_is_refused_at_start(tmp_path):
    server = ServerProcess("mysql://nowhere", log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="unsupported cache URL"):
        server.start(timeout=30)
