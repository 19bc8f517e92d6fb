"""HEAD on GET routes, encoded slashes in key paths, and integers beyond 64 bits: each
once answered wrongly (405, the source served, a float in the message)."""
from __future__ import annotations

import warnings

import pytest

from polyc.server import Settings, create_app
from polyc.server.body import long_integer

with warnings.catch_warnings():  # starlette's notice about its httpx dependency
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HUGE = "18446744073709551616"  # 2^64


def graph_text(shape: str = "[4, 8]", attrs: str = "") -> str:
    op = ('{"op": "exp", "inputs": ["x"], "outputs": ["y"]}' if not attrs else
          '{"op": "reduce_sum", "inputs": ["x"], "outputs": ["y"], "attrs": %s}' % attrs)
    return ('{"graph": {"name": "g", "inputs": [{"name": "x", "shape": %s}], "nodes": [%s], '
            '"outputs": ["y"]}}' % (shape, op))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    app = create_app(Settings(cache_url=f"sqlite:///{tmp}/cache.sqlite3", workers=1))
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def key(client):
    r = client.post("/v1/compile", content=graph_text(),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()["key"]


def test_head_is_answered_on_get_routes(client, key):
    for path in ("/healthz", "/metrics", f"/v1/kernels/{key}", f"/v1/kernels/{key}/source"):
        get, head = client.get(path), client.head(path)
        assert head.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
        if path != "/metrics":  # the metrics change between the two requests
            assert head.headers["content-length"] == str(len(get.content))
    assert client.head(f"/v1/kernels/{'a' * 64}").status_code == 404
    post_only = client.head("/v1/compile")
    assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"


@pytest.mark.parametrize("slash", ["%2F", "%2f"])
def test_encoded_slash_does_not_separate_segments(client, key, slash):
    r = client.get(f"/v1/kernels/{key}{slash}source")
    assert r.status_code == 404 and "%2F" in r.json()["detail"]
    assert "#include" not in r.text
    assert client.get(f"/v1/kernels/{key}/source").status_code == 200


@pytest.mark.parametrize("number, text, where", [
    (HUGE, graph_text(shape=f"[{HUGE}, 8]"), "/graph/inputs/0/shape/0"),
    ("-" + HUGE, graph_text(shape=f"[-{HUGE}, 8]"), "/graph/inputs/0/shape/0"),
    ("9" * 30, graph_text(attrs='{"axes": [%s]}' % ("9" * 30)), "/graph/nodes/0/attrs/axes/0"),
])
def test_integers_beyond_64_bits_are_named_as_sent(client, number, text, where):
    r = client.post("/v1/compile", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["detail"].startswith(f"{where}: the integer {number} is outside")
    assert "e+19" not in problem["detail"] and "e+29" not in problem["detail"]
    assert problem["errors"][0]["pointer"] == where


def test_largest_64_bit_integers_still_reach_the_loader(client):
    # 2^64 - 1 is an integer to orjson too: the loader words it (a dim over the limit)
    r = client.post("/v1/compile", content=graph_text(shape=f"[{int(HUGE) - 1}, 8]"),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and str(int(HUGE) - 1) in r.json()["detail"]


@pytest.mark.parametrize("text, integer", [
    (b"[0.0018177080200985074]", False),  # a float32 weight as a double: 19 digits
    (b"[1234567890123456789.5, 1.5e1234567890123456789]", False),
    (b"[1e-0000000000000000000001, 1E+0000000000000000000001]", False),
    (b"[123456789012345678]", False),  # 18 digits: orjson holds it
    (b"[1234567890123456789]", True),
    (b"[1.0,-" + HUGE.encode() + b"]", True),
    (b'{"a":\n' + HUGE.encode() + b"}", True),
    (HUGE.encode(), True),
    (b"", False),
])
def test_only_integer_literals_of_19_digits_take_the_exact_parse(text, integer):
    """The exact parse (and its walk of the document) is for integers orjson may not
    hold; a float's digits sent every request with weights through it (1.3 s of a
    ResNet layer's 590K weights)."""
    assert long_integer(text) is integer
